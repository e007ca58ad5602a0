"""The node agent: a single-threaded loop that turns messages into processes and
processes into reports.

The agent is the runtime (:mod:`scheduling.executors.runtime`: messages in, reports out,
heartbeats) driving a :class:`~scheduling.agent.executor.LocalProcessExecutor` for one node.
Each pass of :meth:`Agent.tick` takes the waiting messages (``launch``, ``stop``,
``kill_process``), hears the answers of job wrappers that were starting, notices jobs that
ended, SIGKILLs jobs whose stop grace is over, starts launches that waited for their GPUs,
ships new log output, reports exits, sends a heartbeat when one is due and flushes the
report outbox (in batches). Nothing blocks for long: a launch starts its wrapper and moves
on (the wrapper's answer is awaited like any other event), so a burst of launches starts
at once and a grace period is enforced on time while other jobs start and stop.

Between passes the loop sleeps in one ``select`` (:mod:`scheduling.agent.wakeups`) until a
message arrives, a job process ends (its pidfd), a wrapper answers, or something is due
(heartbeat, SIGKILL deadline, log shipping, report retry): an exit is reported within
milliseconds, and an idle agent's loop sleeps until its next heartbeat.

The message source and the report sender are injected: the CLI wires them to the broker
(:mod:`scheduling.agent.transport`), tests to a local queue and a list.

The parts of the agent, each in its module: the job store (:mod:`~scheduling.agent.jobstore`),
the launcher and reaper (:mod:`~scheduling.agent.launcher`), the log shipper
(:mod:`~scheduling.agent.logship`), the serving scraper (:mod:`~scheduling.agent.scraping`)
and the GPU sampling (:mod:`~scheduling.agent.gpuwatch`).

Jobs are kept apart as :mod:`scheduling.agent.isolation` describes: each runs as its
account, in its own workspace and cgroup; what the node cannot enforce is said at start and
in the ``register`` report.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from scheduling.agent.config import AgentConfig, AgentStartError
from scheduling.agent.executor import LocalProcessExecutor
from scheduling.agent.gpus import GpuBackend
from scheduling.agent.isolation import Isolation
from scheduling.agent.logship import utf8_complete_length
from scheduling.agent.protocol import validate_node_name
from scheduling.agent.runner import JobRecord
from scheduling.agent.serving import ServeScraper
from scheduling.executors.runtime import (
    BatchReportSender,
    IncomingMessage,
    LocalMessage,
    LocalMessageSource,
    MessageSource,
    Outbox,
    Runtime,
    RuntimeConfig,
    RuntimeNode,
    SendReport,
    SendReports,
)

logger = logging.getLogger(__name__)

__all__ = [
    "Agent",
    "AgentConfig",
    "AgentStartError",
    "BatchReportSender",
    "IncomingMessage",
    "LocalMessage",
    "LocalMessageSource",
    "MessageSource",
    "Outbox",
    "SendReport",
    "SendReports",
    "utf8_complete_length",
]


class Agent(Runtime):
    """Runs, watches and stops the jobs of one node and reports on them."""

    executor: LocalProcessExecutor

    def __init__(
        self,
        config: AgentConfig,
        backend: GpuBackend,
        send_report: SendReport | BatchReportSender,
        messages: MessageSource | None = None,
        *,
        base_env: dict[str, str] | None = None,
    ) -> None:
        validate_node_name(config.node)
        # Absolute, because jobs run in their own directories and get these paths.
        config = replace(config, work_dir=Path(config.work_dir).resolve())
        super().__init__(
            LocalProcessExecutor(config, backend, base_env=base_env),
            [RuntimeNode(name=config.node, messages=messages, pool=config.pool)],
            send_report,
            RuntimeConfig(
                heartbeat_seconds=config.heartbeat_seconds,
                max_messages_per_pass=config.max_messages_per_pass,
                max_receive_seconds=config.max_receive_seconds,
                max_batch_reports=config.max_batch_reports,
                max_batch_bytes=config.max_batch_bytes,
                poll_seconds=config.poll_seconds,
            ),
        )
        self.messages = messages
        self.backend = backend

    # --- what the agent's parts hold, under the agent's names ---

    @property
    def config(self) -> AgentConfig:
        """The agent's configuration (its work dir may have moved at start)."""
        return self.executor.config

    @property
    def jobs(self) -> dict[tuple[int, int], JobRecord]:
        return self.executor.store.jobs

    @property
    def jobs_dir(self) -> Path:
        return self.executor.store.jobs_dir

    @property
    def gpus(self) -> list[Any]:
        return self.executor.gpus

    @property
    def isolation(self) -> Isolation | None:
        return self.executor.isolation

    @property
    def _scraper(self) -> ServeScraper:
        return self.executor.serving.scraper

    def _active_records(self) -> list[JobRecord]:
        return self.executor.store.active_records()

    def _job_base_env(self, switched: bool) -> dict[str, str]:
        return self.executor.launcher.job_base_env(switched)

    def _prepare_work_dir(self) -> None:
        self.executor.prepare_work_dir()

    # --- stopping ---

    def before_exit(self) -> None:
        if self.config.stop_jobs_on_exit:
            self.stop_all_jobs()

    def stop_all_jobs(self) -> None:
        """Stop every job of this node as if it was lost (SIGTERM to each job's process
        group, SIGKILL after ``exit_stop_grace_seconds``), wait for them to end and report
        their exits; used on the way out by an agent whose jobs must not outlive it."""
        grace = self.config.exit_stop_grace_seconds
        records = self.executor.stop_everything(grace)
        deadline = time.monotonic() + grace + 2.0
        while any(r.running for r in records) and time.monotonic() < deadline:
            self.tick(0.05)
        for record in records:
            if record.running:
                logger.warning(
                    "job %s attempt %s did not end after SIGKILL", record.job_id, record.attempt
                )
        self.executor.report_finished()
        self._drain()
        self.executor.settle(end_of_pass=False)
