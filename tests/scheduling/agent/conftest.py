"""Fixtures for the node agent tests: agents wired to an in-memory queue and report list.

Nothing here needs Django or a broker; jobs are real processes, killed after each test.
"""

from __future__ import annotations

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
from scheduling.agent.runner import signal_group  # noqa: E402
from tests.scheduling.agent.helpers import Harness  # noqa: E402


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
        config.setdefault("poll_seconds", 0.05)
        config.setdefault("log_interval_seconds", 0.1)
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
