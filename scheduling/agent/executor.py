"""The node agent's executor: jobs run as processes of this host.

:class:`LocalProcessExecutor` implements :class:`~scheduling.executors.base.Executor` from
the node agent's parts: the job store (:mod:`scheduling.agent.jobstore`), the launcher and
reaper (:mod:`scheduling.agent.launcher`), the log shipper (:mod:`scheduling.agent.logship`),
the serving scraper (:mod:`scheduling.agent.scraping`) and the GPU sampling
(:mod:`scheduling.agent.gpuwatch`). The runtime (:mod:`scheduling.executors.runtime`)
drives it; :class:`scheduling.agent.agent.Agent` is the two for one node.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from scheduling.agent import procfs
from scheduling.agent.config import AgentConfig, AgentStartError
from scheduling.agent.gpus import GpuBackend
from scheduling.agent.gpuwatch import GpuWatch
from scheduling.agent.isolation import (
    Isolation,
    agent_is_root,
    isolation_report,
    unreachable_parent,
)
from scheduling.agent.jobstore import JobStore
from scheduling.agent.launcher import Launcher
from scheduling.agent.logship import LogShipper
from scheduling.agent.protocol import STOP_LOST
from scheduling.agent.runner import TRAVERSE_ONLY, JobRecord, ensure_dir
from scheduling.agent.scraping import ServingScrapes
from scheduling.agent.wakeups import LoopWaiter
from scheduling.agent.workdir import WorkDirError, blocking_dir, reachable_work_dir
from scheduling.executors.base import (
    AGENT,
    Capabilities,
    Event,
    Executor,
    GpuSample,
    NodeInfo,
    Running,
)
from scheduling.executors.capabilities import STATIC_CAPABILITIES

logger = logging.getLogger(__name__)

#: cgroup controllers and the launch limits they enforce.
_CONTROLLER_LIMITS = {"cpu": "cpus", "memory": "memory_mb", "pids": "pids"}


class LocalProcessExecutor(Executor):
    """Runs the jobs of one node as process groups of this host (the node agent's)."""

    kind = AGENT

    def __init__(
        self, config: AgentConfig, backend: GpuBackend, *, base_env: dict[str, str] | None = None
    ) -> None:
        self.config = config
        self.backend = backend
        self.store = JobStore(config.work_dir)
        #: Events for the runtime, in order, each with what to do once it is delivered.
        self._events: list[Event] = []
        self._on_delivered: dict[int, tuple[Event, Callable[[], None]]] = {}
        self.gpuwatch = GpuWatch(backend, self.store)
        self.serving = ServingScrapes(config, self.store, on_round_done=self._round_done)
        self.logs = LogShipper(config, self.store, self._emit)
        self.launcher = Launcher(
            config,
            self.store,
            self.serving,
            self._emit,
            gpus=self.gpuwatch.gpus,
            base_env=dict(os.environ) if base_env is None else base_env,
        )
        self.waiter: LoopWaiter | None = None
        self._backlog: Callable[[], int] = lambda: 0
        self._exits_wake = True
        #: Something the next pass must handle is known already: it must not wait.
        self._pass_due = False
        self._next_retention_check = 0.0
        #: What this node enforces; decided by :meth:`start`.
        self.isolation: Isolation | None = None

    @property
    def gpus(self) -> list[Any]:
        return self.gpuwatch.gpus

    # --- events ---

    def _emit(self, event: Event, on_delivered: Callable[[], None] | None) -> None:
        self._events.append(event)
        if on_delivered is not None:
            # Keyed by identity: the event is kept here until delivered.
            self._on_delivered[id(event)] = (event, on_delivered)

    def _round_done(self) -> None:
        if self.waiter is not None:
            self.waiter.wakeup.set()

    def poll(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def delivered(self, event: Event) -> None:
        entry = self._on_delivered.pop(id(event), None)
        if entry is not None:
            entry[1]()

    def backlog(self) -> int:
        """Reports waiting for delivery, those not yet taken by the runtime included."""
        return self._backlog() + len(self._events)

    # --- the Executor interface ---

    def capabilities(self) -> Capabilities:
        static = STATIC_CAPABILITIES[AGENT]
        if self.isolation is None:
            return static
        report = self.isolation.report()
        limits = tuple(
            limit
            for controller, limit in _CONTROLLER_LIMITS.items()
            if controller in report["cgroup_controllers"]
        )
        return replace(
            static,
            run_as=static.run_as if report["run_as_user"] else "the agent's own user",
            limits=(*limits, "runtime"),
            notes=(*static.notes, *self.isolation.notes),
        )

    def nodes(self) -> list[NodeInfo]:
        return [
            NodeInfo(
                name=self.config.node,
                gpus=[g.as_dict() for g in self.gpus],
                labels=dict(self.config.labels),
            )
        ]

    def launch(self, node: str, message: Any) -> None:
        self.launcher.launch(dict(message))

    def stop(self, node: str, message: Any) -> None:
        self.launcher.stop(dict(message))

    def kill_process(self, node: str, pid: int, gpu_index: int) -> bool:
        return self.gpuwatch.kill_process(pid, gpu_index)

    def running(self) -> list[Running]:
        return [
            Running(job_id=r.job_id, attempt=r.attempt, node=self.config.node)
            for r in self.store.running()
        ]

    def gpu_samples(self) -> list[GpuSample]:
        return [
            GpuSample(
                node=self.config.node,
                index=s.index,
                utilization=s.utilization,
                memory_used_mb=s.memory_used_mb,
                processes=s.processes,
            )
            for s in self.gpuwatch.sample()
        ]

    # --- the runtime's hooks ---

    def attach(self, waiter: Any, *, backlog: Callable[[], int], exits_wake: bool) -> None:
        self.waiter = waiter
        self.launcher.waiter = waiter
        self._backlog = backlog
        self._exits_wake = exits_wake

    def start(self) -> None:
        """Prepare the work dir and the isolation, recover the jobs of a previous run; the
        ``started`` of jobs adopted before their wrapper answered come from :meth:`poll`."""
        self.prepare_work_dir()
        self.isolation = isolation_report(
            cgroup_root=self.config.cgroup_root, mounts_file=self.config.mounts_file
        )
        self.launcher.isolation = self.isolation
        self._log_isolation(self.isolation)
        self._watch_exits()
        self.store.recover()
        self.launcher.confirm_adopted_starts()

    def work(self) -> None:
        self._pass_due = False
        self.launcher.check_starting()
        self.launcher.reap()
        self.launcher.enforce_deadlines()
        if self.backlog() < self.config.log_backlog_limit:
            self.logs.ship_due()
        self._report_finished()
        self.launcher.start_waiting()
        samples = self.serving.scrape()
        if samples is not None:
            self._emit(samples, None)

    def due_in(self) -> float:
        if self._pass_due:
            return 0.0
        exits_to_queue = any(
            r.finished and not r.exit_reported and not r.exit_queued
            for r in self.store.active_records()
        )
        if exits_to_queue and self.backlog() < self.config.log_backlog_limit:
            return 0.0  # an ended job's output is still being queued: keep going
        now, monotonic = time.time(), time.monotonic()
        waits = [float("inf")]
        scrape = self.serving.due_in()
        if scrape is not None:
            waits.append(scrape)
        for record in self.store.running():
            if record.kill_deadline and not record.killed:
                waits.append(record.kill_deadline - now)
            if record.starting is not None:
                waits.append(record.starting.deadline - monotonic)
            waits.append(record.next_log_ship - monotonic)
            if not self.exit_signalled(record):
                waits.append(self.config.poll_seconds)
        return min(waits)

    def settle(self, *, end_of_pass: bool = True) -> None:
        self.store.save_unsaved()
        if end_of_pass:
            self._sync_watches()

    def register_fields(self, node: str) -> dict[str, Any]:
        optional: dict[str, Any] = {"isolation": self.isolation.report()} if self.isolation else {}
        if self.config.labels:
            optional["labels"] = dict(self.config.labels)
        return {
            "hostname": socket.gethostname(),
            "cpus": os.cpu_count() or 1,
            "memory_mb": procfs.memory_total_mb(),
            "backend": self.backend.name,
            "gpus": [gpu.as_dict() for gpu in self.gpus],
            "jobs": self.job_summaries(node),
            **optional,
        }

    def heartbeat_fields(self, node: str) -> tuple[dict[str, Any], Callable[[], None] | None]:
        samples = self.gpuwatch.sample()
        kills = list(self.gpuwatch.kills)
        fields = {
            "gpus": [sample.as_dict() for sample in samples],
            "jobs": self.job_summaries(node),
            "zombies": self.gpuwatch.zombies(samples),
            "kills": kills,
        }
        self._clean_up()
        self.store.forget_old(self.config.forget_after_seconds)
        # Kill outcomes stay in every heartbeat until one of them is delivered (the
        # outbox keeps only the newest heartbeat while the broker is away).
        return fields, lambda: self.gpuwatch.kills_delivered(kills)

    def job_summaries(self, node: str) -> list[dict[str, Any]]:
        """The jobs this node holds, for ``register`` and ``heartbeat``: running ones, and
        ones that ended within ``finished_retention_seconds`` with how they ended (what
        their ``exited`` report says), so the control side can end a job whose ``exited``
        report it never got."""
        now = time.time()
        retention = self.config.finished_retention_seconds
        summaries = []
        for r in self.store.jobs.values():
            if r.pid is None or r.starting is not None:
                continue  # waiting, or its wrapper has not said yet that the command runs
            if not r.running and (r.finished_at is None or now - r.finished_at > retention):
                continue
            summary = {
                "job_id": r.job_id,
                "attempt": r.attempt,
                "pid": r.pid,
                "running": r.running,
                "stop_reason": r.stop_reason,
            }
            if r.port is not None:
                summary["port"] = r.port
            if r.finished:
                summary.update(
                    exit_code=r.exit_code,
                    signal=r.signal,
                    finished_at=r.finished_at,
                    message=r.message,
                )
            summaries.append(summary)
        return summaries

    def close(self) -> None:
        """Release the scraper and the GPU library; jobs are left running (adopted by the
        next agent on this node)."""
        self.serving.close()
        for record in self.store.active_records():
            if record.starting is not None:
                # Still starting: the wrapper goes on (it removes its environment file once
                # read); the next agent adopts the job.
                record.starting.close(keep_env=True)
                record.starting = None
        self.backend.close()

    # --- stopping every job on the way out ---

    def stop_everything(self, grace: float) -> list[JobRecord]:
        """Stop every job of this node as if it was lost (SIGTERM to each job's process
        group, SIGKILL after ``grace``); the records, to wait for."""
        records = list(self.store.active_records())
        for record in records:
            if record.waiting:
                self.launcher.finish(
                    record, None, None, "stopped (agent stopped) before it started", STOP_LOST
                )
            elif record.running:
                self.launcher.begin_stop(record, STOP_LOST, grace)
        return records

    def report_finished(self) -> None:
        self._report_finished()

    # --- internals ---

    def _report_finished(self) -> None:
        """Queue the ``exited`` event of each ended job, after all of its output."""
        for record in self.store.active_records():
            if not record.finished or record.exit_reported or record.exit_queued:
                continue
            if self.backlog() >= self.config.log_backlog_limit:
                return
            if not self.logs.ship(record, final=True):
                continue  # more output than one pass ships; the rest comes next pass
            record.exit_queued = True
            self._emit(self.launcher.exited(record), lambda r=record: self._exit_sent(r))

    def _exit_sent(self, record: JobRecord) -> None:
        record.exit_reported = True
        # A crash before the end of the pass sends the report again: the control side
        # handles reports idempotently.
        self.store.save_soon(record)

    def exit_signalled(self, record: JobRecord) -> bool:
        """Whether the end of the job's process wakes the loop (else it is polled for)."""
        if not self._exits_wake:
            return False  # the loop waits in the message source, not in the select
        assert self.waiter is not None
        if self.waiter.watching_process(record.key):
            return True
        return self.waiter.sigchld and record.process is not None

    def _sync_watches(self) -> None:
        """Watch the process of every running job (new ones, adopted ones), forget those
        that ended. A pidfd opened for an adopted job is checked to be the job's process:
        its pid may name another process by now."""
        waiter = self.waiter
        if waiter is None:
            return
        for record in self.store.running():
            if record.pid is None or waiter.watching_process(record.key):
                continue
            if not waiter.watch_process(record.key, record.pid):
                continue
            if record.process is None and not procfs.is_same_process(
                record.pid, record.pid_start_ticks
            ):
                waiter.forget_process(record.key)
                self._pass_due = True  # gone already: the next pass reaps it, now
        for key in waiter.process_keys():
            record = self.store.jobs.get(key)  # type: ignore[call-overload]
            if record is None or not record.running:
                waiter.forget_process(key)

    def _watch_exits(self) -> None:
        """Say how exits reach the loop: pidfds, else SIGCHLD for the jobs this agent
        starts (and polling for adopted ones), else polling."""
        assert self.waiter is not None
        if self.waiter.pidfds:
            logger.debug("job exits are watched through pidfds")
        elif self.waiter.route_sigchld():
            logger.info(
                "no pidfds on this kernel: exits of jobs started here wake the loop through "
                "SIGCHLD; adopted jobs are looked at every %g s",
                self.config.poll_seconds,
            )
        else:
            logger.info(
                "no pidfds on this kernel: job exits are looked for every %g s",
                self.config.poll_seconds,
            )

    def prepare_work_dir(self) -> None:
        """Work dir and ``jobs/`` 0711: job accounts pass through to their workspaces but
        list nothing. Where they could not pass (a checkout in a 0700 home), a root agent
        moves its work dir to one they can reach (``fallback_work_root``), or refuses to
        start: every job would fail, or run with paths it cannot use."""
        if agent_is_root():
            configured = self.config.work_dir
            try:
                work_dir = reachable_work_dir(
                    configured,
                    fallback_root=self.config.fallback_work_root,
                    created_ledger=self.config.created_ledger,
                )
            except WorkDirError as exc:
                raise AgentStartError(str(exc)) from None
            if work_dir != configured:
                logger.warning(
                    "job accounts cannot reach %s (%s is private): job directories are in %s",
                    configured,
                    blocking_dir(configured),
                    work_dir,
                )
                self._set_config(replace(self.config, work_dir=work_dir))
        jobs_dir = self.store.jobs_dir
        ensure_dir(self.config.work_dir, TRAVERSE_ONLY)
        ensure_dir(jobs_dir, TRAVERSE_ONLY)
        if not agent_is_root():
            return
        blocked = unreachable_parent(jobs_dir)
        if blocked is not None:
            raise AgentStartError(
                f"job accounts cannot reach the work dir {self.config.work_dir}: {blocked} is "
                f"not searchable by other users; give it o+x (chmod o+x {blocked}) or choose "
                "another --work-dir"
            )

    def _set_config(self, config: AgentConfig) -> None:
        self.config = config
        self.store.work_dir = config.work_dir
        for part in (self.serving, self.logs, self.launcher):
            part.config = config

    @staticmethod
    def _log_isolation(isolation: Isolation) -> None:
        report = isolation.report()
        logger.info(
            "isolation: jobs run as their own account: %s; cgroup: %s (%s); devices: not isolated",
            "yes" if report["run_as_user"] else "NO",
            "yes" if report["cgroup"] else "NO",
            ", ".join(report["cgroup_controllers"]) or "no controllers",
        )
        for note in isolation.notes:
            logger.warning("isolation: %s", note)

    def _clean_up(self) -> None:
        """Empty the directories of jobs that ended a little while ago (all but their state
        and checkpoints), and remove those past their retention."""
        now = time.time()
        for record in list(self.store.jobs.values()):
            if record.finished and record.cgroup_path:
                self.launcher.release_cgroup(record)
                if not record.cgroup_path:
                    self.store.save(record)
            if not record.workspace_cleaned and self.store.ended_before(
                record, now - self.config.workspace_grace_seconds
            ):
                self.store.clean_workspace(record)
        if now >= self._next_retention_check:
            self._next_retention_check = now + self.config.retention_check_seconds
            self.store.remove_expired(now, self.config.retention_days)
