"""Helpers of the node agent tests: a harness around an agent, message builders, jobs."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduling.agent.agent import Agent, LocalMessageSource
from scheduling.agent.isolation import create_account, unreachable_parent
from scheduling.agent.ledger import ledger_from_env
from scheduling.agent.protocol import launch_message, stop_message
from scheduling.agent.runner import JobPaths

#: The agent switches users only as root; the isolation tests need that.
IS_ROOT = os.geteuid() == 0


def _runnable_by_others(path: str) -> bool:
    real = Path(os.path.realpath(path))
    return (
        real.is_file()
        and bool(real.stat().st_mode & stat.S_IXOTH)
        and unreachable_parent(real.parent) is None
    )


def _job_python() -> str:
    """A Python the job accounts can run: the test's own may live under a private home
    (pyenv in /root, or a virtual environment in a clone under /root whose ``python`` is a
    link to /usr/bin/python3.11), which only the agent (the wrapper) may use. The path is
    the resolved one: the link's own directory may be closed to the job accounts."""
    if not IS_ROOT:
        return sys.executable
    candidates = (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3")
    found = next((p for p in candidates if _runnable_by_others(p)), sys.executable)
    return os.path.realpath(found)


#: The Python of test jobs (standard library only).
PYTHON = _job_python()
NOT_ROOT_REASON = "jobs run as their own account only when the agent runs as root"
#: Accounts the tests run jobs as (made once per session, see ensure_test_accounts).
ACCOUNT_A = "sluice-test-a"
ACCOUNT_B = "sluice-test-b"


def ensure_test_accounts() -> dict[str, int]:
    """Create the test accounts (as root; tolerates another test worker doing the same at
    the same time) and return their uids; nothing when not root."""
    if not IS_ROOT:
        return {}
    # Recorded where the run says (tests/conftest.py), to be removed when it ends.
    created = ledger_from_env()
    return {
        name: create_account(name, created_ledger=created).pw_uid for name in (ACCOUNT_A, ACCOUNT_B)
    }


def traversable_temp_dir() -> Iterator[Path]:
    """A temporary directory job accounts can pass through (0711, under /tmp): pytest's
    own lies under a 0700 directory, where a job running as another user could not reach
    its workspace (nor a trigger file of the test)."""
    path = Path(tempfile.mkdtemp(prefix="sluice-agent-test-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class Harness:
    """An agent, the messages it reads and the reports it sent."""

    agent: Agent
    source: LocalMessageSource
    reports: list[dict[str, Any]] = field(default_factory=list)

    def send(self, message: dict[str, Any]) -> None:
        self.source.put(message)

    def of_type(self, kind: str, job_id: int | None = None, **match: Any) -> list[dict]:
        return [
            r
            for r in self.reports
            if r["type"] == kind
            and (job_id is None or r.get("job_id") == job_id)
            and all(r.get(k) == v for k, v in match.items())
        ]

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
        """Run the agent's loop until ``predicate()`` is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            self.agent.tick(0.02)
        raise AssertionError(f"timed out; reports: {[r['type'] for r in self.reports]}")

    def wait_report(self, kind: str, job_id: int | None = None, **match: Any) -> dict:
        return self.wait_for(lambda: (self.of_type(kind, job_id, **match) or [None])[0])

    def paths(self, job_id: int, attempt: int = 1) -> JobPaths:
        return JobPaths.for_job(self.agent.config.work_dir, job_id, attempt)

    def workspace(self, job_id: int, attempt: int = 1) -> Path:
        return self.paths(job_id, attempt).workspace

    def log_text(self, job_id: int, attempt: int = 1) -> str:
        """The job's output as received through ``log`` reports, in offset order."""
        chunks = sorted(
            (r["offset"], r["data"]) for r in self.of_type("log", job_id, attempt=attempt)
        )
        return "".join(data for _, data in chunks)

    def wait_file_contains(self, path: Path, text: str, timeout: float = 15.0) -> None:
        self.wait_for(lambda: path.exists() and text in path.read_text(), timeout)


def wait_until(predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Poll ``predicate`` without running any agent (e.g. while no agent is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


def launch(job_id: int, command: list[str], **fields: Any) -> dict[str, Any]:
    """A launch message with test defaults: attempt 1, GPU 0, a short grace period."""
    fields.setdefault("attempt", 1)
    fields.setdefault("name", f"job-{job_id}")
    fields.setdefault("gpu_indices", [0])
    fields.setdefault("grace_seconds", 5)
    fields.setdefault("run_as", ACCOUNT_A)  # ignored by an agent that is not root
    return launch_message(job_id=job_id, command=command, **fields)


def stop(job_id: int, reason: str = "cancelled", **fields: Any) -> dict[str, Any]:
    fields.setdefault("attempt", 1)
    fields.setdefault("grace_seconds", 5)
    return stop_message(job_id=job_id, reason=reason, **fields)


def python_job(code: str) -> list[str]:
    return [PYTHON, "-c", code]


#: A job that waits until a file appears, then exits with the code written in it.
WAIT_FOR_FILE = """
import os, sys, time
path = sys.argv[1]
print("waiting", flush=True)
while not os.path.exists(path):
    time.sleep(0.02)
sys.exit(int(open(path).read() or 0))
"""


def waiting_job(trigger: Path) -> list[str]:
    return [PYTHON, "-c", WAIT_FOR_FILE, str(trigger)]


def release(trigger: Path, exit_code: str = "0") -> None:
    """Let a :func:`waiting_job` end with ``exit_code``. The file appears whole (written
    beside it, then renamed): written in place, the job may find it still empty and exit 0."""
    written = trigger.with_name(trigger.name + ".part")
    written.write_text(exit_code)
    written.replace(trigger)


#: A job that ignores SIGTERM and says so once the handler is in place.
IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(600)"
)
