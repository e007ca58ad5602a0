"""Fixtures for the node agent tests: agents wired to an in-memory queue and report list.

Nothing here needs Django or a broker; jobs are real processes, killed after each test.
Run as root, the agent starts jobs as unprivileged accounts: the session makes the test
accounts, and ``tmp_path`` is a directory those accounts can pass through.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Without pytest-django (``-p no:django``) nothing puts the repository root on sys.path.
ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scheduling.agent.agent import Agent, AgentConfig, LocalMessageSource  # noqa: E402
from scheduling.agent.gpus import SimulatedBackend  # noqa: E402
from scheduling.agent.ledger import ledger_from_env  # noqa: E402
from scheduling.agent.runner import signal_group  # noqa: E402
from tests.scheduling.agent.helpers import (  # noqa: E402
    Harness,
    ensure_test_accounts,
    traversable_temp_dir,
)


@pytest.fixture(scope="session", autouse=True)
def job_accounts() -> dict[str, int]:
    """The accounts test jobs run as (root only), by name: their uids."""
    return ensure_test_accounts()


@pytest.fixture(autouse=True)
def readable_test_files() -> Iterator[None]:
    """The portal's settings set umask 077 in this process (its var/ is private); files
    the tests write for jobs to read (triggers) must be readable by the job accounts. The
    agent gives its own files their modes explicitly, whatever the umask."""
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """pytest's ``tmp_path`` lies under a 0700 directory; jobs running as another account
    must reach their workspaces and the tests' trigger files."""
    yield from traversable_temp_dir()


@pytest.fixture
def make_agent(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    """Build and start agents; every job process they started is killed afterwards."""
    harnesses: list[Harness] = []

    def factory(
        *,
        node: str = "node-a",
        spec: str = "4xH100-80GB",
        backend: Any = None,
        work_dir: Path | None = None,
        send_report: Callable[[dict], None] | None = None,
        base_env: dict[str, str] | None = None,
        start: bool = True,
        **config: Any,
    ) -> Harness:
        config.setdefault("heartbeat_seconds", 60.0)
        # The real mounts would have a root agent make cgroups on the test machine.
        config.setdefault("mounts_file", "/dev/null")
        config.setdefault("poll_seconds", 0.05)
        config.setdefault("log_interval_seconds", 0.1)
        # Accounts an agent creates are removed when the test run ends (tests/conftest.py).
        config.setdefault("created_ledger", ledger_from_env())
        source = LocalMessageSource()
        reports: list[dict[str, Any]] = []
        agent = Agent(
            AgentConfig(node=node, work_dir=work_dir or tmp_path / "work", **config),
            backend or SimulatedBackend(spec, node),
            send_report or reports.append,
            source,
            base_env=base_env,
        )
        harness = Harness(agent=agent, source=source, reports=reports)
        harnesses.append(harness)
        if start:
            agent.start()
        return harness

    yield factory
    for harness in harnesses:
        for record in harness.agent.jobs.values():
            if record.pid and not record.finished:
                signal_group(record.pid, signal.SIGKILL)
            if record.process is not None:
                record.process.wait(timeout=5)
        # Its descriptors (wake-up pipes, pidfds, the selector), and SIGCHLD if it took it.
        harness.agent.close()
