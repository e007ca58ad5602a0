"""The node agent: a single-threaded loop that turns messages into processes and
processes into reports.

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

Jobs are kept apart as :mod:`scheduling.agent.isolation` describes: each runs as its
account, in its own workspace and cgroup; what the node cannot enforce is said at start and
in the ``register`` report.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from scheduling.agent import procfs
from scheduling.agent.gpus import GpuBackend, GpuSample
from scheduling.agent.isolation import (
    MOUNTS_FILE,
    Isolation,
    agent_is_root,
    create_job_cgroup,
    isolation_report,
    job_account,
    job_cgroup_name,
    make_workspace,
    remove_job_cgroup,
    resolve_job_dir,
    unreachable_parent,
)
from scheduling.agent.protocol import (
    AGENT_VERSION,
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_LOG_CAP_BYTES,
    DEFAULT_RETENTION_DAYS,
    FINISHED_JOB_RETENTION_SECONDS,
    HEARTBEAT,
    KILL_PROCESS,
    LAUNCH,
    LAUNCH_FAILED,
    LOG_CHUNK_BYTES,
    LOG_INTERVAL_SECONDS,
    NOT_RUNNING_MESSAGE,
    PROTOCOL_VERSION,
    REGISTER,
    STOP,
    STOP_LOST,
    SUPERSEDED,
    ProtocolError,
    exited_report,
    log_report,
    log_truncated_marker,
    report,
    serve_metrics_report,
    started_report,
    validate_control_message,
    validate_node_name,
)
from scheduling.agent.runner import (
    CHECKPOINT_DIR,
    SYSTEM_JOB_PATH,
    TRAVERSE_ONLY,
    JobPaths,
    JobRecord,
    LaunchError,
    clean_workspace,
    describe_exit,
    ensure_dir,
    job_argv,
    job_environment,
    kill_leftovers,
    load_record,
    open_private,
    read_json,
    remove_job_dir,
    reserved_env_names,
    save_record,
    signal_group,
    spawn_finish,
    spawn_start,
    write_json,
)
from scheduling.agent.serving import (
    DEFAULT_SCRAPE_SECONDS,
    DEFAULT_SCRAPE_TIMEOUT,
    DEFAULT_SERVE_PORTS,
    PortPicker,
    ServeScraper,
    ServeTarget,
)
from scheduling.agent.wakeups import LoopWaiter, Wakeup
from scheduling.agent.workdir import WorkDirError, blocking_dir, reachable_work_dir

logger = logging.getLogger(__name__)

#: Sends one report (tests, embedding): the outbox then sends one report at a time.
SendReport = Callable[[dict[str, Any]], None]
#: Sends a list of reports as one message, in order.
SendReports = Callable[[list[dict[str, Any]]], None]


class BatchReportSender(Protocol):
    """A report sender that can send many reports in one message (the broker's)."""

    def send_batch(self, reports: list[dict[str, Any]]) -> None: ...


@dataclass
class AgentConfig:
    """How one agent runs; the CLI fills it from its options."""

    node: str
    work_dir: Path
    pool: str | None = None
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS
    #: How often the loop looks at running jobs whose exit nothing signals: without pidfds
    #: (Linux < 5.3) the jobs adopted from a previous run (no SIGCHLD for them), or every
    #: job if neither works; and every job with a message source that offers no descriptor
    #: to select on (the loop then waits in the source).
    poll_seconds: float = 0.5
    log_interval_seconds: float = LOG_INTERVAL_SECONDS
    log_chunk_bytes: int = LOG_CHUNK_BYTES
    #: Log chunks one job may queue per pass (bounds memory and keeps passes short).
    log_chunks_per_pass: int = 16
    #: While this many reports wait (broker down), output stays on disk, not in memory.
    log_backlog_limit: int = 256
    launch_timeout_seconds: float = 10.0
    finished_retention_seconds: float = FINISHED_JOB_RETENTION_SECONDS
    #: Finished, reported jobs are forgotten after this long; a duplicate message about
    #: one is then answered as for an unknown job.
    forget_after_seconds: float = 24 * 3600.0
    #: Messages handled per pass at most, so deadlines are enforced even under a flood.
    max_messages_per_pass: int = 100
    #: Seconds a pass spends taking messages at most (at least one is taken): in a burst
    #: of launches, the first jobs' ``started`` (and any exit) go out while the rest are
    #: started, and the next pass goes on without waiting.
    max_receive_seconds: float = 0.1
    #: Reports per broker message at most, and JSON bytes per message at most (a report
    #: bigger than that goes alone).
    max_batch_reports: int = 200
    max_batch_bytes: int = 512 * 1024
    #: An ended job's directory is emptied (all but its state and checkpoints) this long
    #: after its exit was reported.
    workspace_grace_seconds: float = 60.0
    #: Days an ended job's directory, checkpoints included, is kept when its launch does
    #: not say (``retention_days``); then it is removed.
    retention_days: float = DEFAULT_RETENTION_DAYS
    #: How often the job directories are scanned for ones past their retention.
    retention_check_seconds: float = 3600.0
    #: Create a missing job account (``useradd --system``) instead of failing the launch.
    create_accounts: bool = False
    #: Absolute directories a launch's ``working_dir`` / ``checkpoint_dir`` may point into
    #: (``{tenant}`` is replaced by the launch's tenant); anything else stays in the workspace.
    allowed_roots: tuple[str, ...] = ()
    #: Output shipped per job attempt when its launch does not say (``log_cap_bytes``).
    log_cap_bytes: int = DEFAULT_LOG_CAP_BYTES
    #: cgroup v2 directory under which job cgroups go (None: the cgroup2 mount found).
    cgroup_root: Path | None = None
    #: Where the mounts are read from (cgroup2 and /proc options); tests give their own.
    mounts_file: str = MOUNTS_FILE
    #: The PATH jobs get; None: the agent's own when jobs run as the agent's user, else
    #: SYSTEM_JOB_PATH (the agent's install, a virtual environment under /root say, is
    #: neither the jobs' software nor theirs to reach).
    job_path: str | None = None
    #: Ports serving jobs are given (``PORT``), low and high included.
    serve_ports: tuple[int, int] = DEFAULT_SERVE_PORTS
    #: Seconds between scrapes of the serving jobs' health and metrics (while any runs).
    serve_scrape_seconds: float = DEFAULT_SCRAPE_SECONDS
    #: Seconds each GET of a scrape may take.
    serve_scrape_timeout: float = DEFAULT_SCRAPE_TIMEOUT
    #: Where a root agent makes a work dir the job accounts can reach when ``work_dir`` is
    #: not (a checkout in a 0700 home); None: refuse to start instead (a chosen work dir).
    fallback_work_root: Path | None = None
    #: File the agent appends the accounts and directories it creates on the host to
    #: (see ledger.py), so that they can be removed again; None: no record.
    created_ledger: Path | None = None
    #: Stop every job (SIGTERM, then SIGKILL after ``exit_stop_grace_seconds``) when the
    #: agent stops, instead of leaving them to the next agent: a demo's agents, whose jobs
    #: and serving replicas must not outlive ``make run``.
    stop_jobs_on_exit: bool = False
    exit_stop_grace_seconds: float = 2.0


class AgentStartError(RuntimeError):
    """The agent cannot run jobs safely on this node as configured; the message says why."""


# --- message sources ----------------------------------------------------------------------


class IncomingMessage(Protocol):
    """A received message: its decoded payload, acknowledged once handled."""

    @property
    def payload(self) -> Any: ...

    def ack(self) -> None: ...


class MessageSource(Protocol):
    """Where control messages come from."""

    def get(self, timeout: float) -> IncomingMessage | None:
        """The next message, waiting at most ``timeout`` seconds; None if there is none."""
        ...

    def close(self) -> None: ...


@dataclass
class LocalMessage:
    payload: Any
    acked: bool = False

    def ack(self) -> None:
        self.acked = True


class LocalMessageSource:
    """An in-process message source (tests, and embedding without a broker). Like the
    broker's, it offers a descriptor (:meth:`fileno`) that is readable when a message
    may be waiting, so the agent's loop sleeps in one select over it and its jobs."""

    def __init__(self) -> None:
        self._queue: queue.Queue[LocalMessage] = queue.Queue()
        self._wakeup = Wakeup()

    def put(self, payload: Any) -> None:
        self._queue.put(LocalMessage(payload))
        self._wakeup.set()

    def fileno(self) -> int:
        return self._wakeup.fileno()

    def get(self, timeout: float) -> LocalMessage | None:
        self._wakeup.clear()
        try:
            if timeout <= 0:
                return self._queue.get_nowait()
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._wakeup.close()


# --- outbox ---------------------------------------------------------------------------------


@dataclass
class _Queued:
    report: dict[str, Any]
    on_sent: Callable[[], None] | None
    #: Its JSON size, for the per-message byte bound.
    size: int


class Outbox:
    """Reports waiting to be sent, in order, in batches, retried with backoff while sending
    fails.

    :meth:`flush` sends everything due as few messages as the bounds allow (at most
    ``max_batch_reports`` reports and about ``max_batch_bytes`` of JSON each, never less
    than one report), in order. ``on_sent`` callbacks run once the message carrying their
    report is out, which is when the agent records it as delivered (log offset, exit
    reported) so nothing is lost if the agent stops first; when sending fails, the whole
    batch stays queued. Only the newest heartbeat is kept: an old sample is worthless once a
    newer one exists.
    """

    def __init__(
        self,
        send: SendReports,
        *,
        max_batch_reports: int = 200,
        max_batch_bytes: int = 512 * 1024,
        max_backoff: float = 30.0,
        max_size: int = 100_000,
        on_recovered: Callable[[], None] | None = None,
    ) -> None:
        self._send = send
        self._items: deque[_Queued] = deque()
        self._max_batch_reports = max(1, max_batch_reports)
        self._max_batch_bytes = max_batch_bytes
        self._max_backoff = max_backoff
        self._max_size = max_size
        self._failures = 0
        self._retry_at = 0.0
        self._on_recovered = on_recovered

    def __len__(self) -> int:
        return len(self._items)

    @property
    def healthy(self) -> bool:
        return self._failures == 0

    @property
    def retry_in(self) -> float:
        """Seconds until the next delivery attempt is due (0 when due or empty)."""
        if not self._items:
            return float("inf")
        return max(0.0, self._retry_at - time.monotonic())

    def put(self, item: dict[str, Any], on_sent: Callable[[], None] | None = None) -> None:
        if item["type"] == HEARTBEAT:
            self._items = deque(i for i in self._items if i.report["type"] != HEARTBEAT)
        size = len(json.dumps(item, default=str)) if self._max_batch_reports > 1 else 0
        self._items.append(_Queued(item, on_sent, size))
        if len(self._items) > self._max_size:
            dropped = self._items.popleft()
            logger.error("report outbox full; dropped a %s report", dropped.report["type"])

    def flush(self, *, force: bool = False) -> bool:
        """Send what is due, in order; True when the outbox is empty afterwards."""
        if self._items and not force and time.monotonic() < self._retry_at:
            return False
        while self._items:
            count = self._batch_length()
            batch = [self._items[i] for i in range(count)]
            try:
                self._send([queued.report for queued in batch])
            except Exception as exc:  # any broker or transport error: keep it, retry later
                self._failed(exc)
                return False
            for _ in range(count):
                self._items.popleft()
            if self._failures:
                logger.info("reports are delivered again after %d failures", self._failures)
                self._failures = 0
                if self._on_recovered:
                    self._on_recovered()
            for queued in batch:
                if queued.on_sent:
                    queued.on_sent()
        return True

    def _batch_length(self) -> int:
        """How many reports from the head go in the next message."""
        count, size = 0, 0
        for queued in self._items:
            if count >= self._max_batch_reports:
                break
            if count and size + queued.size > self._max_batch_bytes:
                break
            count += 1
            size += queued.size
        return count

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        backoff = min(self._max_backoff, 2.0 ** (self._failures - 1))
        self._retry_at = time.monotonic() + backoff
        logger.warning(
            "cannot send reports (%s; %d waiting); retrying in %.0f s", exc, len(self), backoff
        )


# --- log chunks -------------------------------------------------------------------------------


def utf8_complete_length(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 character.

    Log chunks are cut there so that a character split across two chunks is not turned
    into two replacement characters.
    """
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: look further back for the lead byte
            continue
        if byte < 0x80:
            return len(data)
        needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return len(data) if back >= needed else len(data) - back
    return len(data)


# --- the agent ---------------------------------------------------------------------------------


class Agent:
    """Runs, watches and stops the jobs of one node and reports on them."""

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
        self.config = replace(config, work_dir=Path(config.work_dir).resolve())
        self.backend = backend
        self.messages = messages
        self.outbox = self._make_outbox(send_report)
        #: Where the loop sleeps between passes (messages, job exits, wrapper answers).
        self.waiter = LoopWaiter()
        fileno = getattr(messages, "fileno", None)
        #: The source offers a descriptor: the loop selects on it with the jobs' pidfds.
        #: Else (a source of another kind) the loop waits in the source, as it used to.
        self._selectable_messages = callable(fileno)
        if callable(fileno):
            self.waiter.add_reader(fileno(), "messages")
        #: The last pass stopped at max_messages_per_pass: the next one must not wait.
        self._more_messages = False
        #: Something the next pass must handle is known already: it must not wait.
        self._pass_due = False
        self.gpus = backend.discover()
        self.jobs: dict[tuple[int, int], JobRecord] = {}
        #: The records the loop still works on (not ended with their exit reported): each
        #: pass looks at these only, so its work follows the jobs in flight, not the ended
        #: ones the agent keeps for a day (thousands after a burst).
        self._active: dict[tuple[int, int], JobRecord] = {}
        #: Records whose state file is written at the end of the pass (see _save_soon).
        self._unsaved: dict[tuple[int, int], JobRecord] = {}
        #: The newest attempt of each job seen here (an older attempt's launch is refused).
        self._newest_attempt: dict[int, int] = {}
        self.jobs_dir = self.config.work_dir / "jobs"
        self._base_env = dict(os.environ) if base_env is None else base_env
        self._kills: list[dict[str, Any]] = []
        self._next_heartbeat = 0.0
        self._next_retention_check = 0.0
        self._stop_requested = False
        #: What this node enforces; decided by :meth:`start`.
        self.isolation: Isolation | None = None
        #: Serving jobs: their ports, and the scrapes of their endpoints (in threads that
        #: wake the loop when a round is done).
        self._ports = PortPicker(*self.config.serve_ports)
        self._scraper = ServeScraper(
            timeout=self.config.serve_scrape_timeout, on_done=self.waiter.wakeup.set
        )
        self._next_scrape = 0.0

    def _make_outbox(self, send_report: SendReport | BatchReportSender) -> Outbox:
        """A sender with ``send_batch`` (the broker's) gets batches; a plain callable gets
        one report at a time, each confirmed on its own."""
        send_batch = getattr(send_report, "send_batch", None)
        if callable(send_batch):
            return Outbox(
                send_batch,
                max_batch_reports=self.config.max_batch_reports,
                max_batch_bytes=self.config.max_batch_bytes,
                on_recovered=self._register,
            )
        send_one = send_report
        return Outbox(
            lambda reports: send_one(reports[0]),  # type: ignore[operator]
            max_batch_reports=1,
            on_recovered=self._register,
        )

    # --- lifecycle ---

    def start(self) -> None:
        """Prepare the work dir and the isolation, recover the jobs of a previous run,
        register, send the first heartbeat."""
        self._prepare_work_dir()
        self.isolation = isolation_report(
            cgroup_root=self.config.cgroup_root, mounts_file=self.config.mounts_file
        )
        self._log_isolation(self.isolation)
        self._watch_exits()
        self._recover()
        self._register()
        self._confirm_adopted_starts()
        self._heartbeat()
        self.outbox.flush()
        self._save_unsaved()
        self._sync_watches()

    def _watch_exits(self) -> None:
        """Say how exits reach the loop: pidfds, else SIGCHLD for the jobs this agent
        starts (and polling for adopted ones), else polling."""
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

    def _prepare_work_dir(self) -> None:
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
                self.config = replace(self.config, work_dir=work_dir)
                self.jobs_dir = work_dir / "jobs"
        ensure_dir(self.config.work_dir, TRAVERSE_ONLY)
        ensure_dir(self.jobs_dir, TRAVERSE_ONLY)
        if not agent_is_root():
            return
        blocked = unreachable_parent(self.jobs_dir)
        if blocked is not None:
            raise AgentStartError(
                f"job accounts cannot reach the work dir {self.config.work_dir}: {blocked} is "
                f"not searchable by other users; give it o+x (chmod o+x {blocked}) or choose "
                "another --work-dir"
            )

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

    def run(self) -> None:
        """Start, then loop until :meth:`request_stop`; jobs keep running afterwards
        (unless ``stop_jobs_on_exit``)."""
        try:
            self.start()
            while not self._stop_requested:
                try:
                    self.tick()
                except Exception:  # e.g. a full disk: keep supervising, do not spin
                    logger.exception("error in the agent loop")
                    time.sleep(1.0)
            if self.config.stop_jobs_on_exit:
                self.stop_all_jobs()
        finally:
            self.close()

    def stop_all_jobs(self) -> None:
        """Stop every job of this node as if it was lost (SIGTERM to each job's process
        group, SIGKILL after ``exit_stop_grace_seconds``), wait for them to end and report
        their exits; used on the way out by an agent whose jobs must not outlive it."""
        grace = self.config.exit_stop_grace_seconds
        records = list(self._active_records())
        for record in records:
            if record.waiting:
                self._finish(
                    record, None, None, "stopped (agent stopped) before it started", STOP_LOST
                )
            elif record.running:
                self._begin_stop(record, STOP_LOST, grace)
        deadline = time.monotonic() + grace + 2.0
        while any(r.running for r in records) and time.monotonic() < deadline:
            self.tick(0.05)
        for record in records:
            if record.running:
                logger.warning(
                    "job %s attempt %s did not end after SIGKILL", record.job_id, record.attempt
                )
        self._report_finished()
        self._save_unsaved()

    def request_stop(self, *_: Any) -> None:
        """Ask the loop to end after the current pass (safe from a signal handler, and
        from another thread: the loop's wait is cut short)."""
        self._stop_requested = True
        self.waiter.wakeup.set()

    def close(self) -> None:
        """Deliver what can be delivered now and release the broker and the GPU library.

        Jobs are left running: they are adopted by the next agent on this node.
        """
        self.outbox.flush(force=True)
        self._save_unsaved()
        if len(self.outbox):
            logger.warning(
                "%d reports not delivered; exits and output are re-sent on restart",
                len(self.outbox),
            )
        if self.messages is not None:
            self.messages.close()
        self._scraper.close()
        for record in self._active_records():
            if record.starting is not None:
                # Still starting: the wrapper goes on (it removes its environment file once
                # read); the next agent adopts the job.
                record.starting.close(keep_env=True)
                record.starting = None
        self.waiter.close()
        self.backend.close()

    def tick(self, timeout: float | None = None) -> None:
        """One pass of the loop. It first waits, at most ``timeout`` seconds (default:
        until something is due), for a message, a job's exit or a wrapper's answer."""
        wait = self._wait_time() if timeout is None else timeout
        self._pass_due = False
        self._receive(wait)
        self._check_starting()
        self._reap()
        self._enforce_deadlines()
        self._ship_logs()
        self._report_finished()
        self._start_waiting()
        self._serve_scrape()
        if time.monotonic() >= self._next_heartbeat:
            self._heartbeat()
        self.outbox.flush()
        self._save_unsaved()
        self._sync_watches()

    def _wait_time(self) -> float:
        """How long the next pass may wait without missing anything due. Messages, exits
        watched through pidfds (or SIGCHLD) and wrappers' answers wake the wait anyway."""
        if self._more_messages or self._pass_due:
            return 0.0
        exits_to_queue = any(
            r.finished and not r.exit_reported and not r.exit_queued for r in self._active_records()
        )
        if exits_to_queue and len(self.outbox) < self.config.log_backlog_limit:
            return 0.0  # an ended job's output is still being queued: keep going
        now, monotonic = time.time(), time.monotonic()
        waits = [self._next_heartbeat - monotonic, self.outbox.retry_in]
        if self._scraper.in_flight:
            # Its end wakes the loop; this only bounds the wait should that be missed.
            waits.append(2 * self.config.serve_scrape_timeout + 0.1)
        elif self._serve_targets():
            waits.append(self._next_scrape - monotonic)
        for record in self._running():
            if record.kill_deadline and not record.killed:
                waits.append(record.kill_deadline - now)
            if record.starting is not None:
                waits.append(record.starting.deadline - monotonic)
            waits.append(record.next_log_ship - monotonic)
            if not self._exit_signalled(record):
                waits.append(self.config.poll_seconds)
        return max(0.0, min(waits))

    def _exit_signalled(self, record: JobRecord) -> bool:
        """Whether the end of the job's process wakes the loop (else it is polled for)."""
        if not self._selectable_messages and self.messages is not None:
            return False  # the loop waits in the message source, not in the select
        if self.waiter.watching_process(record.key):
            return True
        return self.waiter.sigchld and record.process is not None

    def _sync_watches(self) -> None:
        """Watch the process of every running job (new ones, adopted ones), forget those
        that ended. A pidfd opened for an adopted job is checked to be the job's process:
        its pid may name another process by now."""
        for record in self._running():
            if record.pid is None or self.waiter.watching_process(record.key):
                continue
            if not self.waiter.watch_process(record.key, record.pid):
                continue
            if record.process is None and not procfs.is_same_process(
                record.pid, record.pid_start_ticks
            ):
                self.waiter.forget_process(record.key)
                self._pass_due = True  # gone already: the next pass reaps it, now
        for key in self.waiter.process_keys():
            record = self.jobs.get(key)  # type: ignore[call-overload]
            if record is None or not record.running:
                self.waiter.forget_process(key)

    # --- messages ---

    def _receive(self, timeout: float) -> None:
        message = self._next_message(timeout)
        handled = 0
        until = time.monotonic() + self.config.max_receive_seconds
        while message is not None:
            self._handle_incoming(message)
            handled += 1
            if handled >= self.config.max_messages_per_pass or time.monotonic() >= until:
                self._more_messages = True
                return
            message = self.messages.get(0) if self.messages is not None else None
        self._more_messages = False

    def _next_message(self, timeout: float) -> IncomingMessage | None:
        """The first message of the pass, waiting for it (or for a job's exit, or a
        wrapper's answer) at most ``timeout`` seconds."""
        if self.messages is None:
            self.waiter.wait(timeout)
            return None
        if not self._selectable_messages:
            return self.messages.get(timeout)
        message = self.messages.get(0)
        if message is None and timeout > 0:
            self.waiter.wait(timeout)
            message = self.messages.get(0)
        return message

    def _handle_incoming(self, message: IncomingMessage) -> None:
        try:
            payload = message.payload
        except Exception as exc:  # undecodable body: drop it, or it would come back forever
            logger.error("dropping a message that cannot be decoded: %s", exc)
        else:
            self.handle_message(payload)
        self._save_unsaved()  # what the broker forgets once acknowledged is on disk first
        try:
            message.ack()
        except Exception as exc:  # broker gone: the message comes again, handling is idempotent
            logger.warning("cannot acknowledge a message: %s", exc)

    def handle_message(self, payload: Any) -> None:
        """Act on one control message; invalid ones are logged and dropped."""
        try:
            message = validate_control_message(payload)
        except ProtocolError as exc:
            logger.error("dropping invalid message: %s", exc)
            return
        handlers = {LAUNCH: self._launch, STOP: self._stop, KILL_PROCESS: self._kill_process}
        try:
            handlers[message["type"]](message)
        except Exception:  # a bug must not take down the agent and every job's supervision
            # Not the whole message: a launch carries the user's environment.
            what = message.get("job_id", message.get("pid"))
            logger.exception("failed to handle %s message (%s)", message["type"], what)

    # --- launch ---

    def _launch(self, message: dict[str, Any]) -> None:
        job_id, attempt = message["job_id"], message["attempt"]
        existing = self.jobs.get((job_id, attempt)) or self._load_forgotten(job_id, attempt)
        if existing is not None:
            self._answer_duplicate_launch(existing)
            return
        newest = self._newest_attempt.get(job_id)
        if newest is not None and newest > attempt:
            self._send_exited_now(
                job_id, attempt, SUPERSEDED, f"attempt {newest} of this job is newer"
            )
            return
        record = JobRecord(
            job_id=job_id,
            attempt=attempt,
            name=message["name"],
            gpu_indices=list(message["gpu_indices"]),
            retention_days=message.get("retention_days"),
            log_cap_bytes=message.get("log_cap_bytes") or self.config.log_cap_bytes,
            serve=dict(message["serve"]) if message.get("serve") else None,
        )
        self._track(record)
        ensure_dir(self._paths(record).root, TRAVERSE_ONLY)
        self._save_soon(record)  # mostly written with its pid by _start, just below
        problem = self._gpu_problem(message)
        if problem:
            self._fail_launch(record, problem)
            return
        self._supersede_older_attempts(record, message["grace_seconds"])
        blockers = self._blockers(record)
        if blockers:
            # Kept for _start_waiting, across a restart too: only a deferred launch needs
            # its message (the user's environment) on disk.
            write_json(self._paths(record).launch, message)
            logger.info(
                "job %s attempt %s waits for %s to release its GPUs",
                job_id,
                attempt,
                ", ".join(f"{r.job_id}-{r.attempt}" for r in blockers),
            )
            return
        self._start(record, message)

    def _load_forgotten(self, job_id: int, attempt: int) -> JobRecord | None:
        """A job attempt this node ran long ago, from its directory (never run it twice)."""
        record = load_record(JobPaths.for_job(self.config.work_dir, job_id, attempt))
        if record is not None and record.finished:
            self._track(record)
            return record
        return None

    def _answer_duplicate_launch(self, record: JobRecord) -> None:
        """A launch seen before: repeat the answer, in case the first one was lost."""
        if record.running and record.starting is None:
            self._send_started(record)
        elif record.finished and record.exit_reported:
            self._send_exited(record)
        # Waiting, starting, or ended with its report still queued: the answer is on its way.

    def _gpu_problem(self, message: dict[str, Any]) -> str | None:
        """Why the launch's GPUs do not match this node, or None if they do."""
        gpus = {gpu.index: gpu for gpu in self.gpus}
        indices = message["gpu_indices"]
        if len(set(indices)) != len(indices):
            return f"GPU indices {indices} repeat a GPU"
        for position, index in enumerate(indices):
            gpu = gpus.get(index)
            if gpu is None:
                return f"GPU {index} does not exist on node {self.config.node} ({len(gpus)} GPUs)"
            expected = message["gpu_uuids"][position] if message["gpu_uuids"] else gpu.uuid
            if expected != gpu.uuid:
                return f"GPU {index} of node {self.config.node} is {gpu.uuid}, not {expected}"
        return None

    def _supersede_older_attempts(self, record: JobRecord, grace: float) -> None:
        """A newer attempt means the control side gave up on the older ones here."""
        for older in self._active_records():
            if older.job_id != record.job_id or older.attempt >= record.attempt:
                continue
            if older.waiting:
                self._finish(older, None, None, "superseded before it started", SUPERSEDED)
            elif older.running:
                self._begin_stop(older, SUPERSEDED, grace)

    def _blockers(self, record: JobRecord) -> list[JobRecord]:
        """Jobs that must end before ``record`` starts: its older attempts, and jobs in
        their stop grace period on its GPUs (a preempted job checkpointing). A blocker that
        ended blocks until its ``exited`` report is queued, so the control side hears of
        the GPUs' release before it hears of their next job."""
        gpus = set(record.gpu_indices)
        return [
            other
            for other in self._active_records()
            if other.pid is not None
            and not other.exit_queued
            and not other.exit_reported
            and other.stop_reason is not None
            and (
                (other.job_id == record.job_id and other.attempt < record.attempt)
                or gpus & set(other.gpu_indices)
            )
        ]

    def _start_waiting(self) -> None:
        for record in [r for r in self._active_records() if r.waiting]:
            if self._blockers(record):
                continue
            message = read_json(self._paths(record).launch)
            if message is None:
                self._fail_launch(record, "the launch message was lost")
            else:
                self._start(record, message)

    def _start(self, record: JobRecord, message: dict[str, Any]) -> None:
        """Start the job as its account, in its workspace and cgroup; a launch that cannot
        be started so fails (``launch_failed``) rather than running with less isolation."""
        paths = self._paths(record)
        self._warn_if_gpus_busy(record)
        tenant = message.get("tenant", "")
        cgroup: Path | None = None
        try:
            account = job_account(
                run_as=message.get("run_as", ""),
                tenant=tenant,
                create=self.config.create_accounts,
                created_ledger=self.config.created_ledger,
            )
            places = {
                name: resolve_job_dir(
                    name,
                    message[name],
                    workspace=paths.workspace,
                    default=default,
                    allowed_roots=self.config.allowed_roots,
                    tenant=tenant,
                )
                for name, default in (("working_dir", ""), ("checkpoint_dir", CHECKPOINT_DIR))
            }
            make_workspace(
                paths.workspace,
                [d.relative for d in places.values() if d.relative is not None],
                account,
            )
            dropped = reserved_env_names(message["env"])
            if dropped:
                logger.warning(
                    "job %s attempt %s: dropped environment names only Sluice sets: %s",
                    record.job_id,
                    record.attempt,
                    ", ".join(dropped),
                )
            checkpoints = places["checkpoint_dir"].path
            if record.serve is not None:
                record.port = self._serve_port(record)
            env = job_environment(
                message,
                node=self.config.node,
                checkpoint_dir=checkpoints,
                home=paths.workspace,
                user=account.name,
                base=self._job_base_env(account.switched),
                port=record.port,
            )
            cgroup, limits = self._make_cgroup(record, message)
            starting = spawn_start(
                argv=job_argv(message),
                env=env,
                cwd=places["working_dir"].path,
                paths=paths,
                timeout=self.config.launch_timeout_seconds,
                uid=account.uid if account.switched else None,
                gid=account.gid if account.switched else None,
                cgroup=cgroup,
            )
        except (LaunchError, OSError) as exc:
            if cgroup is not None:
                remove_job_cgroup(cgroup)
            words = str(exc) if isinstance(exc, LaunchError) else f"cannot prepare the job: {exc}"
            self._fail_launch(record, words)
            return
        # The pid is kept at once: a restarted agent adopts the wrapper, never starts the
        # job a second time. ``started`` goes when the wrapper says the command runs.
        record.pid = starting.pid
        record.pid_start_ticks = starting.pid_start_ticks
        record.process = starting.process
        record.starting = starting
        record.checkpoint_path = str(checkpoints)
        record.cgroup_path = str(cgroup) if cgroup is not None else None
        record.isolation = {
            "run_as": account.name,
            "uid": account.uid,
            "gid": account.gid,
            "cgroup": record.cgroup_path,
            "limits": limits,
        }
        self._save(record)
        self.waiter.add_reader(starting.status_fd, record.key)
        self.waiter.watch_process(record.key, starting.pid)
        logger.debug(
            "job %s attempt %s: wrapper %s started", record.job_id, record.attempt, starting.pid
        )

    def _check_starting(self) -> None:
        """Hear the answers of the wrappers still starting: ``started`` for the jobs whose
        command runs, ``launch_failed`` for the others (or those that did not answer within
        ``launch_timeout_seconds``)."""
        now = time.monotonic()
        for record in [r for r in self._active_records() if r.starting is not None]:
            starting = record.starting
            assert starting is not None
            status = starting.read_status()
            if status is None and now < starting.deadline:
                continue
            self.waiter.remove_reader(starting.status_fd)
            record.starting = None
            try:
                spawned = spawn_finish(starting, status)
            except LaunchError as exc:
                self._start_failed(record, str(exc))
                continue
            record.command_pid = spawned.command_pid
            self._started(record)

    def _start_failed(self, record: JobRecord, words: str) -> None:
        record.process = None
        record.pid = None
        self.waiter.forget_process(record.key)
        if record.cgroup_path:
            remove_job_cgroup(Path(record.cgroup_path))
            record.cgroup_path = None
        if record.stop_reason is not None:  # stopped while starting: that is the outcome
            self._finish(
                record, None, None, f"stopped ({record.stop_reason}) before it started", None
            )
        else:
            self._fail_launch(record, words)

    def _started(self, record: JobRecord) -> None:
        """The job's command runs: record it, report it, and pass on a stop that came
        while the wrapper was starting (only now is it sure to survive the SIGTERM)."""
        record.started_at = time.time()
        self._save(record)
        account = record.isolation or {}
        cgroup = record.cgroup_path
        logger.info(
            "started job %s attempt %s as process group %s on GPUs %s, as %s (uid %s)%s",
            record.job_id,
            record.attempt,
            record.pid,
            record.gpu_indices,
            account.get("run_as"),
            account.get("uid"),
            f" in cgroup {cgroup}" if cgroup else "",
        )
        self._send_started(record)
        if record.stop_reason is not None:
            self._signal(record, signal.SIGTERM)

    def _serve_port(self, record: JobRecord) -> int:
        """A free port of ``serve_ports`` for a serving job, none of another's here."""
        taken = {r.port for r in self._running() if r.port and r is not record}
        port = self._ports.pick(taken)
        if port is None:
            low, high = self.config.serve_ports
            raise LaunchError(f"no free port for the serving job in --serve-ports {low}-{high}")
        return port

    # --- serving jobs ---

    def _serve_targets(self) -> list[ServeTarget]:
        """The serving jobs whose command runs (not those still starting, or ended)."""
        return [
            ServeTarget(
                job_id=r.job_id,
                attempt=r.attempt,
                port=r.port,
                health_path=r.serve.get("health_path", "/health"),
                metrics_path=r.serve.get("metrics_path", "/metrics"),
            )
            for r in self._running()
            if r.serve is not None and r.port is not None and r.starting is None
        ]

    def _serve_scrape(self) -> None:
        """Queue the samples of a finished scrape round (one ``serve_metrics`` report), and
        start the next round when it is due and a serving job runs. The scrapes run in the
        scraper's threads: nothing here waits on a replica."""
        samples = self._scraper.take_results()
        if samples:
            running = {r.key for r in self._running()}
            samples = [s for s in samples if (s["job_id"], s["attempt"]) in running]
        if samples:
            try:
                self.outbox.put(serve_metrics_report(node=self.config.node, samples=samples))
            except ProtocolError as exc:  # a value the protocol refuses: drop the round
                logger.warning("dropping a round of serving metrics: %s", exc)
        now = time.monotonic()
        if self._scraper.in_flight or now < self._next_scrape:
            return
        targets = self._serve_targets()
        if targets and self._scraper.start_round(targets):
            self._next_scrape = now + self.config.serve_scrape_seconds

    def _job_base_env(self, switched: bool) -> dict[str, str]:
        path = self.config.job_path
        if path is None and switched:
            path = SYSTEM_JOB_PATH
        return self._base_env if path is None else {**self._base_env, "PATH": path}

    def _make_cgroup(
        self, record: JobRecord, message: dict[str, Any]
    ) -> tuple[Path | None, dict[str, Any]]:
        """The job's cgroup with its limits, where the node has cgroup v2 (else none: the
        ``register`` report said limits are not enforced)."""
        support = self.isolation.cgroups if self.isolation else None
        if support is None or support.slice is None:
            return None, {}
        name = job_cgroup_name(record.job_id, record.attempt)
        return create_job_cgroup(support, name, message.get("limits") or {})

    def _release_cgroup(self, record: JobRecord) -> None:
        """Remove an ended job's cgroup (killing what is left in it); tried again on
        later passes while processes are still dying."""
        if record.cgroup_path and remove_job_cgroup(Path(record.cgroup_path)):
            record.cgroup_path = None

    def _warn_if_gpus_busy(self, record: JobRecord) -> None:
        # The control side owns allocation; a clash means its view is stale. Start anyway
        # (refusing would strand the job) but leave a trace.
        gpus = set(record.gpu_indices)
        for other in self._running():
            shared = gpus & set(other.gpu_indices)
            if shared and other is not record:
                logger.warning(
                    "job %s attempt %s starts on GPUs %s still used by job %s attempt %s",
                    record.job_id,
                    record.attempt,
                    sorted(shared),
                    other.job_id,
                    other.attempt,
                )

    def _fail_launch(self, record: JobRecord, message: str) -> None:
        logger.warning(
            "job %s attempt %s failed to launch: %s", record.job_id, record.attempt, message
        )
        try:
            fd = open_private(self._paths(record).log, os.O_WRONLY | os.O_APPEND)
            with os.fdopen(fd, "a") as log:
                log.write(f"[sluice] launch failed: {message}\n")
        except OSError:
            pass  # the report below still carries the message
        self._finish(record, None, None, message, LAUNCH_FAILED)

    # --- stop ---

    def _stop(self, message: dict[str, Any]) -> None:
        reason, job_id, attempt = message["reason"], message["job_id"], message["attempt"]
        record = self.jobs.get((job_id, attempt)) or self._load_forgotten(job_id, attempt)
        if record is None:
            self._send_exited_now(job_id, attempt, reason, NOT_RUNNING_MESSAGE)
        elif record.waiting:
            self._finish(record, None, None, f"stopped ({reason}) before it started", reason)
        elif record.finished:
            if record.exit_reported:
                self._send_exited(record)
        else:
            self._begin_stop(record, reason, message["grace_seconds"])

    def _begin_stop(self, record: JobRecord, reason: str, grace: float) -> None:
        """SIGTERM the job's group now, SIGKILL it when the grace period is over.

        A repeated stop keeps the first reason, and only ever brings the deadline forward.
        """
        deadline = time.time() + max(0.0, float(grace))
        if record.stop_reason is None:
            record.stop_reason = reason
            # A wrapper still starting may not ignore SIGTERM yet; it gets it once it
            # answers (see _started), or the SIGKILL at the deadline.
            if record.starting is None:
                self._signal(record, signal.SIGTERM)
            logger.info(
                "stopping job %s attempt %s (%s), SIGKILL in %g s",
                record.job_id,
                record.attempt,
                reason,
                grace,
            )
        if record.kill_deadline is None or deadline < record.kill_deadline:
            record.kill_deadline = deadline
        self._save(record)

    def _enforce_deadlines(self) -> None:
        now = time.time()
        for record in self._running():
            if (
                record.kill_deadline is not None
                and not record.killed
                and now >= record.kill_deadline
            ):
                logger.info(
                    "grace period over: killing job %s attempt %s", record.job_id, record.attempt
                )
                self._signal(record, signal.SIGKILL)
                record.killed = True
                self._save(record)

    def _signal(self, record: JobRecord, signum: int) -> None:
        # A job this agent did not start is only signalled while its leader is provably the
        # same process, so a recycled pid is never hit.
        if record.pid is None:
            return
        if record.process is None and not procfs.is_same_process(
            record.pid, record.pid_start_ticks
        ):
            return
        signal_group(record.pid, signum)

    # --- exits ---

    def _reap(self) -> None:
        for record in self._running():
            if record.starting is not None:
                continue  # its answer comes first (read on the next pass), then its end
            outcome = self._exit_outcome(record)
            if outcome is None:
                continue
            exit_code, signum, message = outcome
            left = kill_leftovers(record.pid, record.pid_start_ticks) if record.pid else 0
            if left:
                message += f"; killed {left} process(es) it left behind"
            self._finish(record, exit_code, signum, message)
            logger.info("job %s attempt %s ended: %s", record.job_id, record.attempt, message)

    def _exit_outcome(self, record: JobRecord) -> tuple[int | None, int | None, str] | None:
        """How the job ended, or None while it runs. The wrapper's exit file is the best
        witness; then the wrapper's own status; then what the agent did to it."""
        returncode = None
        if record.process is not None:
            returncode = record.process.poll()
            if returncode is None:
                return None
        elif procfs.is_same_process(record.pid, record.pid_start_ticks):
            return None
        info = read_json(self._paths(record).exit)
        if info is not None:
            exit_code, signum = info.get("exit_code"), info.get("signal")
            words = describe_exit(exit_code, signum)
            if info.get("error"):  # the command never started (seen by a restarted agent)
                words = f"launch failed: {info['error']}"
        elif returncode is not None:
            exit_code, signum = (None, -returncode) if returncode < 0 else (returncode, None)
            words = describe_exit(exit_code, signum)
        elif record.killed:
            exit_code, signum = None, int(signal.SIGKILL)
            words = describe_exit(exit_code, signum)
        else:
            exit_code, signum = None, None
            words = "ended while the agent was down; exit status unknown"
        if record.stop_reason:
            words = f"stopped ({record.stop_reason}): {words}"
            if record.killed:
                words += " at the end of the grace period"
        return exit_code, signum, words

    def _finish(
        self,
        record: JobRecord,
        exit_code: int | None,
        signum: int | None,
        message: str,
        stop_reason: str | None = None,
    ) -> None:
        record.finished = True
        record.exit_code = exit_code
        record.signal = signum
        record.message = message
        record.stop_reason = stop_reason or record.stop_reason
        record.finished_at = time.time()
        record.kill_deadline = None
        record.process = None
        self._release_cgroup(record)
        # Written at the end of the pass, mostly with its exit reported (_exit_sent): a
        # crash before leaves the job running with its pid on disk, and the next agent
        # finds it gone and reports its exit from the wrapper's exit file.
        self._save_soon(record)

    def _report_finished(self) -> None:
        """Queue the ``exited`` report of each ended job, after all of its output."""
        for record in self._active_records():
            if not record.finished or record.exit_reported or record.exit_queued:
                continue
            if len(self.outbox) >= self.config.log_backlog_limit:
                return
            if not self._ship_log(record, final=True):
                continue  # more output than one pass ships; the rest comes next pass
            record.exit_queued = True
            self.outbox.put(self._exited(record), on_sent=lambda r=record: self._exit_sent(r))

    def _exit_sent(self, record: JobRecord) -> None:
        record.exit_reported = True
        # A crash before the end of the pass sends the report again: the control side
        # handles reports idempotently.
        self._save_soon(record)

    # --- logs ---

    def _ship_logs(self) -> None:
        if len(self.outbox) >= self.config.log_backlog_limit:
            return
        now = time.monotonic()
        for record in self._running():
            if now >= record.next_log_ship:
                record.next_log_ship = now + self.config.log_interval_seconds
                self._ship_log(record, final=False)

    def _ship_log(self, record: JobRecord, *, final: bool) -> bool:
        """Queue up to one pass worth of new output; True when all output so far is queued.

        ``final`` (the job has ended) also sends a trailing partial UTF-8 character. Output
        is shipped up to the job's log cap, then a marker chunk, then nothing more (the
        job goes on; see the protocol).
        """
        path = self._paths(record).log
        cap = record.log_cap_bytes or self.config.log_cap_bytes
        if record.log_truncated or record.log_marker_queued:
            self._trim_log(record, path, cap)
            return True
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return True
        over = size > cap
        end = min(size, cap)
        if end <= record.log_read_offset and not over:
            return True
        with path.open("rb") as log:
            for _ in range(self.config.log_chunks_per_pass):
                remaining = end - record.log_read_offset
                if remaining <= 0:
                    break
                log.seek(record.log_read_offset)
                data = log.read(min(self.config.log_chunk_bytes, remaining))
                if not data:
                    return True
                # At the cap the bytes up to it go, a character split there included.
                whole = len(data) >= remaining and (final or over)
                length = len(data) if whole else utf8_complete_length(data)
                if length == 0:
                    return True
                self._queue_log(record, data[:length])
        if over and record.log_read_offset >= cap:
            self._queue_log_marker(record, cap)
            return True
        return not over and record.log_read_offset >= size

    def _queue_log_marker(self, record: JobRecord, cap: int) -> None:
        record.log_marker_queued = True
        record.log_read_offset = cap
        marker = log_report(
            node=self.config.node,
            job_id=record.job_id,
            attempt=record.attempt,
            offset=cap,
            data=log_truncated_marker(cap),
        )
        self.outbox.put(marker, on_sent=lambda: self._log_marker_sent(record, cap))
        logger.warning(
            "job %s attempt %s: output passed its log cap of %d bytes; no more of it is shipped",
            record.job_id,
            record.attempt,
            cap,
        )

    def _log_marker_sent(self, record: JobRecord, cap: int) -> None:
        """Remembered on disk: a restarted agent does not resume shipping."""
        record.log_truncated = True
        record.log_offset = max(record.log_offset, cap)
        self._save(record)

    @staticmethod
    def _trim_log(record: JobRecord, path: Path, cap: int) -> None:
        """Cut the log file back to the cap once the marker is out: nothing beyond it is
        ever read, and a job printing without end would fill the node's disk. The job
        writes in append mode, so it goes on at the new end."""
        if not record.log_truncated:
            return
        try:
            if path.stat().st_size > cap:
                os.truncate(path, cap)
        except OSError:
            pass  # gone with the workspace clean-up, or not ours to cut

    def _queue_log(self, record: JobRecord, data: bytes) -> None:
        offset = record.log_read_offset
        end = offset + len(data)
        record.log_read_offset = end
        chunk = log_report(
            node=self.config.node,
            job_id=record.job_id,
            attempt=record.attempt,
            offset=offset,
            data=data.decode("utf-8", "replace"),
        )
        self.outbox.put(chunk, on_sent=lambda: self._log_sent(record, end))

    def _log_sent(self, record: JobRecord, end: int) -> None:
        record.log_offset = max(record.log_offset, end)
        self._save(record)

    # --- zombie GPU processes ---

    def _kill_process(self, message: dict[str, Any]) -> None:
        pid, gpu_index = message["pid"], message["gpu_index"]
        killed, words = self._kill_zombie(pid, gpu_index)
        logger.info("kill_process %s on GPU %s (%s): %s", pid, gpu_index, message["reason"], words)
        self._kills.append({"pid": pid, "gpu_index": gpu_index, "killed": killed, "message": words})

    def _kill_zombie(self, pid: int, gpu_index: int) -> tuple[bool, str]:
        samples = self._sample()
        if all(pid != p["pid"] for sample in samples for p in sample.processes):
            return False, "not a GPU process (any more)"
        owner = self._job_of(pid)
        if owner is not None and all(
            pid != p["pid"] or sample.index in owner.gpu_indices
            for sample in samples
            for p in sample.processes
        ):
            return False, "belongs to a running job on its own GPUs; stop the job instead"
        if procfs.read_stat(pid) is None:
            return False, "not visible to the agent (another pid namespace?)"
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False, "already gone"
        except PermissionError:
            return False, "not permitted to kill it"
        return True, "killed with SIGKILL"

    def _job_of(self, pid: int) -> JobRecord | None:
        """The running job ``pid`` is part of: in its process group or descending from its
        leader (a job's child that started its own session is still the job's)."""
        leaders = {r.pid: r for r in self._running()}
        stat = procfs.read_stat(pid)
        for _ in range(64):  # bounded walk up the parent chain
            if stat is None:
                return None
            record = leaders.get(stat.pgid) or leaders.get(stat.pid)
            if record is not None:
                return record
            if stat.ppid <= 1:
                return None
            stat = procfs.read_stat(stat.ppid)
        return None

    def _zombies(self, samples: list[GpuSample]) -> list[dict[str, Any]]:
        """GPU processes that no job holding that GPU accounts for: leftovers of no job,
        and a job's process on a GPU it was not given (it reset CUDA_VISIBLE_DEVICES
        itself: without device isolation only this report catches it)."""
        zombies = []
        for sample in samples:
            for process in sample.processes:
                owner = self._job_of(process["pid"])
                if owner is not None and sample.index in owner.gpu_indices:
                    continue
                name = procfs.process_name(process["pid"])
                if owner is not None:
                    name = f"{name} (job {owner.job_id}, outside its GPUs)"
                    logger.warning(
                        "job %s attempt %s uses GPU %s, which it was not given (pid %s)",
                        owner.job_id,
                        owner.attempt,
                        sample.index,
                        process["pid"],
                    )
                zombies.append(
                    {
                        "gpu_index": sample.index,
                        "pid": process["pid"],
                        "memory_mb": process["memory_mb"],
                        "name": name,
                    }
                )
        return zombies

    # --- reports ---

    def _register(self) -> None:
        optional = {"isolation": self.isolation.report()} if self.isolation else {}
        self.outbox.put(
            report(
                REGISTER,
                self.config.node,
                pool=self.config.pool,
                hostname=socket.gethostname(),
                agent_version=AGENT_VERSION,
                protocol_version=PROTOCOL_VERSION,
                cpus=os.cpu_count() or 1,
                memory_mb=procfs.memory_total_mb(),
                backend=self.backend.name,
                gpus=[gpu.as_dict() for gpu in self.gpus],
                jobs=self._job_summaries(),
                **optional,
            )
        )

    def _heartbeat(self) -> None:
        self._next_heartbeat = time.monotonic() + self.config.heartbeat_seconds
        samples = self._sample()
        kills = list(self._kills)
        self.outbox.put(
            report(
                HEARTBEAT,
                self.config.node,
                gpus=[sample.as_dict() for sample in samples],
                jobs=self._job_summaries(),
                zombies=self._zombies(samples),
                kills=kills,
            ),
            # Kill outcomes stay in every heartbeat until one of them is delivered (the
            # outbox keeps only the newest heartbeat while the broker is away).
            on_sent=lambda: self._kills_delivered(kills),
        )
        self._clean_up()
        self._forget_old_jobs()

    # --- clean-up of ended jobs ---

    def _clean_up(self) -> None:
        """Empty the directories of jobs that ended a little while ago (all but their state
        and checkpoints), and remove those past their retention."""
        now = time.time()
        for record in list(self.jobs.values()):
            if record.finished and record.cgroup_path:
                self._release_cgroup(record)
                if not record.cgroup_path:
                    self._save(record)
            if not record.workspace_cleaned and self._ended_before(
                record, now - self.config.workspace_grace_seconds
            ):
                self._clean_workspace(record)
        if now >= self._next_retention_check:
            self._next_retention_check = now + self.config.retention_check_seconds
            self._remove_expired(now)

    @staticmethod
    def _ended_before(record: JobRecord, moment: float) -> bool:
        """The job ended, its exit was reported, and that was before ``moment``."""
        return (
            record.finished
            and record.exit_reported
            and record.finished_at is not None
            and record.finished_at <= moment
        )

    def _clean_workspace(self, record: JobRecord) -> None:
        paths = self._paths(record)
        keep = Path(record.checkpoint_path) if record.checkpoint_path else paths.checkpoints
        try:
            removed = clean_workspace(paths, keep)
        except OSError as exc:  # e.g. files the job made read-only: leave them, once
            logger.warning("cannot clean the directory of job %s: %s", record.job_id, exc)
            removed = 0
        record.workspace_cleaned = True
        self._save(record)
        if removed:
            logger.info(
                "job %s attempt %s: removed %d entries of its directory, kept its checkpoints",
                record.job_id,
                record.attempt,
                removed,
            )

    def _remove_expired(self, now: float) -> None:
        """Remove the directories (checkpoints included) of jobs that ended more than their
        retention ago. Reads every job directory's state: done once an hour."""
        for root in sorted(p for p in self.jobs_dir.iterdir() if p.is_dir()):
            paths = JobPaths(root)
            record = load_record(paths)
            if record is None or self._paths(record).root != root:
                continue
            days = record.retention_days
            days = self.config.retention_days if days is None else days
            if not self._ended_before(record, now - days * 86400):
                continue
            remove_job_dir(paths)
            self.jobs.pop(record.key, None)
            logger.info(
                "job %s attempt %s: removed its directory and checkpoints (kept %g days)",
                record.job_id,
                record.attempt,
                days,
            )

    def _kills_delivered(self, kills: list[dict[str, Any]]) -> None:
        self._kills = [k for k in self._kills if k not in kills]

    def _forget_old_jobs(self) -> None:
        """Drop long-finished, reported jobs from memory (their directories stay), so the
        loop's work does not grow with the node's history."""
        horizon = time.time() - self.config.forget_after_seconds
        for key, record in list(self.jobs.items()):
            if record.exit_reported and (record.finished_at or 0) < horizon:
                del self.jobs[key]

    def _sample(self) -> list[GpuSample]:
        holders = {index: r.pid for r in self._running() for index in r.gpu_indices if r.pid}
        try:
            return self.backend.sample(holders)
        except Exception as exc:  # a GPU library hiccup must not stop job supervision
            logger.warning("cannot sample GPUs: %s", exc)
            return []

    def _job_summaries(self) -> list[dict[str, Any]]:
        """The jobs this node holds, for ``register`` and ``heartbeat``: running ones, and
        ones that ended within ``finished_retention_seconds`` with how they ended (what
        their ``exited`` report says), so the control side can end a job whose ``exited``
        report it never got."""
        now = time.time()
        retention = self.config.finished_retention_seconds
        summaries = []
        for r in self.jobs.values():
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

    def _send_started(self, record: JobRecord) -> None:
        self.outbox.put(
            started_report(
                node=self.config.node,
                job_id=record.job_id,
                attempt=record.attempt,
                pid=record.pid or 0,
                started_at=record.started_at or time.time(),
                isolation=record.isolation,
                port=record.port,
            )
        )

    def _exited(self, record: JobRecord) -> dict[str, Any]:
        return exited_report(
            node=self.config.node,
            job_id=record.job_id,
            attempt=record.attempt,
            exit_code=record.exit_code,
            signal=record.signal,
            stop_reason=record.stop_reason,
            message=record.message,
            finished_at=record.finished_at or time.time(),
        )

    def _send_exited(self, record: JobRecord) -> None:
        self.outbox.put(self._exited(record))

    def _send_exited_now(self, job_id: int, attempt: int, stop_reason: str, message: str) -> None:
        """An ``exited`` answer for a job attempt this agent never ran."""
        self.outbox.put(
            exited_report(
                node=self.config.node,
                job_id=job_id,
                attempt=attempt,
                exit_code=None,
                signal=None,
                stop_reason=stop_reason,
                message=message,
                finished_at=time.time(),
            )
        )

    # --- state ---

    def _recover(self) -> None:
        """Load the jobs of a previous run. Running ones are adopted (their leader is the
        same process as recorded); the rest are found ended by the next pass and reported
        unless they were already."""
        for root in sorted(p for p in self.jobs_dir.iterdir() if p.is_dir()):
            record = load_record(JobPaths(root))
            if record is None or self._paths(record).root != root:
                continue
            self._track(record)
            if record.running and procfs.is_same_process(record.pid, record.pid_start_ticks):
                logger.info(
                    "adopted running job %s attempt %s (process group %s)",
                    record.job_id,
                    record.attempt,
                    record.pid,
                )

    def _confirm_adopted_starts(self) -> None:
        """Jobs whose previous agent stopped before their wrapper answered: a wrapper still
        alive runs the command (one that cannot start it exits at once, and is then reaped
        with its exit file's reason), so its ``started`` goes now, after ``register``."""
        for record in self._running():
            if record.started_at is None and procfs.is_same_process(
                record.pid, record.pid_start_ticks
            ):
                record.started_at = time.time()
                self._save(record)
                self._send_started(record)

    def _running(self) -> Iterator[JobRecord]:
        return (r for r in self._active_records() if r.running)

    def _track(self, record: JobRecord) -> None:
        """Keep ``record`` (new, loaded from its directory or adopted)."""
        self.jobs[record.key] = record
        self._active[record.key] = record
        if record.attempt > self._newest_attempt.get(record.job_id, -1):
            self._newest_attempt[record.job_id] = record.attempt

    def _active_records(self) -> list[JobRecord]:
        """The records still worked on, as a list (callers may change records); those
        that ended with their exit reported, or were forgotten, leave the set here."""
        for key, record in list(self._active.items()):
            if (record.finished and record.exit_reported) or self.jobs.get(key) is not record:
                del self._active[key]
        return list(self._active.values())

    def _paths(self, record: JobRecord) -> JobPaths:
        return JobPaths.for_job(self.config.work_dir, record.job_id, record.attempt)

    def _save(self, record: JobRecord) -> None:
        """Write the record's state file now (a job's pid, before anything else)."""
        self._unsaved.pop(record.key, None)
        save_record(record, self._paths(record))

    def _save_soon(self, record: JobRecord) -> None:
        """Write the record's state file at the end of this pass (or before the message
        being handled is acknowledged), once for all its changes in the pass: a job's
        launch and start, or its end and its reported exit, are one write instead of two
        (each is a new file renamed into place: a third of the agent's time in a burst)."""
        self._unsaved[record.key] = record

    def _save_unsaved(self) -> None:
        while self._unsaved:
            _, record = self._unsaved.popitem()
            save_record(record, self._paths(record))
