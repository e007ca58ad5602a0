"""``make run`` checks what would stop the demo before starting it, and says so last.

Each problem is one line, printed after everything else (pip, migrations, the demo data),
and ``make run`` stops there. What it checks:

- the web port (127.0.0.1:8000) is free: another ``make run`` still running, say;
- run as root, the agents can run jobs as their own accounts: ``useradd`` exists (they
  create the tenants' accounts), and each agent's job folder is one the job accounts can
  reach (in a checkout under a 0700 home, the folder under /var/lib/sluice it will use
  is made now, and recorded for ``make demo-reset``).

Standard library only.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scheduling.agent.ledger import SAFE_PATH  # noqa: E402
from scheduling.agent.workdir import FALLBACK_WORK_ROOT, WorkDirError, reachable_work_dir  # noqa: E402

WEB_ADDRESS = ("127.0.0.1", 8000)


def agent_options(procfile: Path) -> list[dict[str, str]]:
    """The options of each agent line of the Procfile (``--node``, ``--work-dir``...)."""
    agents = []
    for line in procfile.read_text().splitlines():
        if "scheduling.agent" not in line:
            continue
        words = shlex.split(line.split(":", 1)[1])
        words = words[words.index("scheduling.agent") + 1 :]
        options = {}
        for i, word in enumerate(words):
            if word.startswith("--"):
                nxt = words[i + 1] if i + 1 < len(words) else ""
                options[word] = "" if nxt.startswith("--") else nxt
        agents.append(options)
    return agents


def port_problem(address: tuple[str, int] = WEB_ADDRESS) -> str | None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            return (
                f"{address[0]}:{address[1]} is in use ({exc.strerror}): stop what holds it "
                "(another `make run`?) and try again"
            )
    return None


def agent_problems(
    agents: list[dict[str, str]], *, root: Path = ROOT, fallback_root: Path = FALLBACK_WORK_ROOT
) -> list[str]:
    if os.geteuid() != 0:
        return []  # jobs run as the agents' own user: nothing to reach
    problems = []
    if any("--create-accounts" in a for a in agents) and not shutil.which(
        "useradd", path=SAFE_PATH
    ):
        problems.append(
            "the demo's agents create job accounts with useradd, which is not installed: "
            "install it (the passwd package) and try again"
        )
    for options in agents:
        node = options.get("--node", "")
        chosen = options.get("--work-dir")
        work_dir = (root / (chosen or Path("var") / "agent" / node)).resolve()
        ledger = options.get("--created-ledger")
        try:
            reachable_work_dir(
                work_dir,
                fallback_root=None if chosen else fallback_root,
                created_ledger=(root / ledger) if ledger else None,
            )
        except (WorkDirError, OSError) as exc:
            problems.append(f"agent {node}: {exc}")
    return problems


def main() -> int:
    problems = []
    problem = port_problem()
    if problem:
        problems.append(problem)
    problems += agent_problems(agent_options(ROOT / "Procfile"))
    for problem in problems:
        print(f"make run: cannot start: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
