"""``make demo-reset``: remove what ``make run`` created, and only that.

The demo keeps its state in ``var/`` (database, broker, agents' job directories). Its
agents, run as root, also add Unix accounts for the tenants' jobs (``sluice-<tenant>``)
and, where the checkout lies in a private home, job directories under /var/lib/sluice;
they record each in ``var/created.jsonl`` (see scheduling/agent/ledger.py). This removes
those recorded things (an account only if it is still the one created: same uid, home
/nonexistent), then ``var/``. Nothing else: an account the demo did not create stays.

Run it after stopping ``make run``: an account with processes still running cannot go.
Standard library only (it runs without the virtual environment).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scheduling.agent import ledger  # noqa: E402

LEDGER_NAME = "created.jsonl"


def reset(var_dir: Path) -> list[str]:
    """Remove what the ledger in ``var_dir`` lists, then ``var_dir``; the problems, one
    line each (``var_dir`` is kept while any remain, with the ledger of what is left)."""
    created = var_dir / LEDGER_NAME
    recorded = ledger.entries(created)
    accounts = [e["name"] for e in recorded if e["kind"] == ledger.ACCOUNT]
    if recorded and os.geteuid() != 0:
        what = f"accounts {', '.join(accounts)}" if accounts else "directories"
        return [
            f"the demo's agents created {what} as root: run `sudo make demo-reset` "
            f"(listed in {created})"
        ]
    problems = ledger.remove_created(created) if recorded else []
    if problems:
        return problems
    shutil.rmtree(var_dir, ignore_errors=True)
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Remove what `make run` created.")
    parser.add_argument("--var-dir", type=Path, default=ROOT / "var")
    args = parser.parse_args(argv)
    created = ledger.entries(args.var_dir / LEDGER_NAME)
    problems = reset(args.var_dir)
    if problems:
        for problem in problems:
            print(f"demo-reset: {problem}", file=sys.stderr)
        return 1
    accounts = [e["name"] for e in created if e["kind"] == ledger.ACCOUNT]
    folders = [e["path"] for e in created if e["kind"] == ledger.TREE]
    if accounts:
        print(f"demo-reset: removed the accounts {', '.join(accounts)}")
    if folders:
        print(f"demo-reset: removed the job folders {', '.join(folders)}")
    print(f"demo-reset: removed {args.var_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
