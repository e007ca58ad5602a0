"""Launching, stopping and reaping the jobs of this node (part of the node agent's
:class:`~scheduling.agent.executor.LocalProcessExecutor`).

A launch starts the job's wrapper and moves on (the wrapper's answer is awaited like any
other event): a burst of launches starts at once. A launch whose GPUs are still held by a
job in its stop grace period waits (across a restart too) until that job's exit is queued.
A stop sends SIGTERM to the job's process group and SIGKILL when the grace period is over;
an ended job gets its exit record (the wrapper's exit file is the best witness).

Jobs are kept apart as :mod:`scheduling.agent.isolation` describes: each runs as its
account, in its own workspace and cgroup.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scheduling.agent import procfs
from scheduling.agent.config import AgentConfig
from scheduling.agent.gpus import GpuInfo
from scheduling.agent.isolation import (
    Isolation,
    create_job_cgroup,
    job_account,
    job_cgroup_name,
    make_workspace,
    remove_job_cgroup,
    resolve_job_dir,
)
from scheduling.agent.jobstore import JobStore
from scheduling.agent.protocol import LAUNCH_FAILED, NOT_RUNNING_MESSAGE, SUPERSEDED
from scheduling.agent.runner import (
    CHECKPOINT_DIR,
    SYSTEM_JOB_PATH,
    TRAVERSE_ONLY,
    JobRecord,
    LaunchError,
    describe_exit,
    ensure_dir,
    job_argv,
    job_environment,
    kill_leftovers,
    open_private,
    read_json,
    reserved_env_names,
    signal_group,
    spawn_finish,
    spawn_start,
    write_json,
)
from scheduling.agent.scraping import ServingScrapes
from scheduling.agent.wakeups import LoopWaiter
from scheduling.executors.base import Event, Exited, Started

logger = logging.getLogger(__name__)

#: Queues an event for the runtime, with what to do once its report is delivered.
Emit = Callable[[Event, Callable[[], None] | None], None]


class Launcher:
    """Starts, watches and stops the job processes of one node; emits their starts and
    (through :meth:`exited`) their exits."""

    def __init__(
        self,
        config: AgentConfig,
        store: JobStore,
        serving: ServingScrapes,
        emit: Emit,
        *,
        gpus: list[GpuInfo],
        base_env: dict[str, str],
    ) -> None:
        self.config = config
        self.store = store
        self.serving = serving
        self.emit = emit
        self.gpu_list = gpus
        self._base_env = base_env
        #: The runtime's waiter (wrapper answers and job exits wake the loop through it).
        self.waiter: LoopWaiter | None = None
        #: What this node enforces; decided when the executor starts.
        self.isolation: Isolation | None = None

    # --- events ---

    def _send_started(self, record: JobRecord) -> None:
        self.emit(
            Started(
                job_id=record.job_id,
                attempt=record.attempt,
                node=self.config.node,
                pid=record.pid or 0,
                started_at=record.started_at or time.time(),
                isolation=record.isolation,
                port=record.port,
            ),
            None,
        )

    def exited(self, record: JobRecord) -> Exited:
        return Exited(
            job_id=record.job_id,
            attempt=record.attempt,
            node=self.config.node,
            exit_code=record.exit_code,
            signal=record.signal,
            reason=record.stop_reason or "",
            message=record.message,
            finished_at=record.finished_at or time.time(),
        )

    def _send_exited(self, record: JobRecord) -> None:
        self.emit(self.exited(record), None)

    def _send_exited_now(self, job_id: int, attempt: int, stop_reason: str, message: str) -> None:
        """An ``exited`` answer for a job attempt this node never ran."""
        self.emit(
            Exited(
                job_id=job_id,
                attempt=attempt,
                node=self.config.node,
                exit_code=None,
                signal=None,
                reason=stop_reason,
                message=message,
                finished_at=time.time(),
            ),
            None,
        )

    # --- launch ---

    def launch(self, message: dict[str, Any]) -> None:
        job_id, attempt = message["job_id"], message["attempt"]
        existing = self.store.jobs.get((job_id, attempt)) or self.store.load_forgotten(
            job_id, attempt
        )
        if existing is not None:
            self._answer_duplicate_launch(existing)
            return
        newest = self.store.newest_attempt.get(job_id)
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
        self.store.track(record)
        ensure_dir(self.store.paths(record).root, TRAVERSE_ONLY)
        self.store.save_soon(record)  # mostly written with its pid by _start, just below
        problem = self._gpu_problem(message) or self._image_problem(message)
        if problem:
            self._fail_launch(record, problem)
            return
        self._supersede_older_attempts(record, message["grace_seconds"])
        blockers = self._blockers(record)
        if blockers:
            # Kept for _start_waiting, across a restart too: only a deferred launch needs
            # its message (the user's environment) on disk.
            write_json(self.store.paths(record).launch, message)
            logger.info(
                "job %s attempt %s waits for %s to release its GPUs",
                job_id,
                attempt,
                ", ".join(f"{r.job_id}-{r.attempt}" for r in blockers),
            )
            return
        self._start(record, message)

    def _answer_duplicate_launch(self, record: JobRecord) -> None:
        """A launch seen before: repeat the answer, in case the first one was lost."""
        if record.running and record.starting is None:
            self._send_started(record)
        elif record.finished and record.exit_reported:
            self._send_exited(record)
        # Waiting, starting, or ended with its report still queued: the answer is on its way.

    def _gpu_problem(self, message: dict[str, Any]) -> str | None:
        """Why the launch's GPUs do not match this node, or None if they do."""
        gpus = {gpu.index: gpu for gpu in self.gpu_list}
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

    @staticmethod
    def _image_problem(message: dict[str, Any]) -> str | None:
        """A container job cannot run here: the agent runs bare host processes."""
        if message.get("image"):
            return (
                f"this node runs jobs as host processes and cannot run the container image "
                f"{message['image']}; submit it to a pool whose executor runs images"
            )
        return None

    def _supersede_older_attempts(self, record: JobRecord, grace: float) -> None:
        """A newer attempt means the control side gave up on the older ones here."""
        for older in self.store.active_records():
            if older.job_id != record.job_id or older.attempt >= record.attempt:
                continue
            if older.waiting:
                self.finish(older, None, None, "superseded before it started", SUPERSEDED)
            elif older.running:
                self.begin_stop(older, SUPERSEDED, grace)

    def _blockers(self, record: JobRecord) -> list[JobRecord]:
        """Jobs that must end before ``record`` starts: its older attempts, and jobs in
        their stop grace period on its GPUs (a preempted job checkpointing). A blocker that
        ended blocks until its ``exited`` report is queued, so the control side hears of
        the GPUs' release before it hears of their next job."""
        gpus = set(record.gpu_indices)
        return [
            other
            for other in self.store.active_records()
            if other.pid is not None
            and not other.exit_queued
            and not other.exit_reported
            and other.stop_reason is not None
            and (
                (other.job_id == record.job_id and other.attempt < record.attempt)
                or gpus & set(other.gpu_indices)
            )
        ]

    def start_waiting(self) -> None:
        for record in [r for r in self.store.active_records() if r.waiting]:
            if self._blockers(record):
                continue
            message = read_json(self.store.paths(record).launch)
            if message is None:
                self._fail_launch(record, "the launch message was lost")
            else:
                self._start(record, message)

    def _start(self, record: JobRecord, message: dict[str, Any]) -> None:
        """Start the job as its account, in its workspace and cgroup; a launch that cannot
        be started so fails (``launch_failed``) rather than running with less isolation."""
        paths = self.store.paths(record)
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
                record.port = self.serving.pick_port(record)
            env = job_environment(
                message,
                node=self.config.node,
                checkpoint_dir=checkpoints,
                home=paths.workspace,
                user=account.name,
                base=self.job_base_env(account.switched),
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
        self.store.save(record)
        self.waiter.add_reader(starting.status_fd, record.key)
        self.waiter.watch_process(record.key, starting.pid)
        logger.debug(
            "job %s attempt %s: wrapper %s started", record.job_id, record.attempt, starting.pid
        )

    def check_starting(self) -> None:
        """Hear the answers of the wrappers still starting: ``started`` for the jobs whose
        command runs, ``launch_failed`` for the others (or those that did not answer within
        ``launch_timeout_seconds``)."""
        now = time.monotonic()
        for record in [r for r in self.store.active_records() if r.starting is not None]:
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
            self.finish(
                record, None, None, f"stopped ({record.stop_reason}) before it started", None
            )
        else:
            self._fail_launch(record, words)

    def _started(self, record: JobRecord) -> None:
        """The job's command runs: record it, report it, and pass on a stop that came
        while the wrapper was starting (only now is it sure to survive the SIGTERM)."""
        record.started_at = time.time()
        self.store.save(record)
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

    def job_base_env(self, switched: bool) -> dict[str, str]:
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

    def release_cgroup(self, record: JobRecord) -> None:
        """Remove an ended job's cgroup (killing what is left in it); tried again on
        later passes while processes are still dying."""
        if record.cgroup_path and remove_job_cgroup(Path(record.cgroup_path)):
            record.cgroup_path = None

    def _warn_if_gpus_busy(self, record: JobRecord) -> None:
        # The control side owns allocation; a clash means its view is stale. Start anyway
        # (refusing would strand the job) but leave a trace.
        gpus = set(record.gpu_indices)
        for other in self.store.running():
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
            fd = open_private(self.store.paths(record).log, os.O_WRONLY | os.O_APPEND)
            with os.fdopen(fd, "a") as log:
                log.write(f"[sluice] launch failed: {message}\n")
        except OSError:
            pass  # the report below still carries the message
        self.finish(record, None, None, message, LAUNCH_FAILED)

    # --- stop ---

    def stop(self, message: dict[str, Any]) -> None:
        reason, job_id, attempt = message["reason"], message["job_id"], message["attempt"]
        record = self.store.jobs.get((job_id, attempt)) or self.store.load_forgotten(
            job_id, attempt
        )
        if record is None:
            self._send_exited_now(job_id, attempt, reason, NOT_RUNNING_MESSAGE)
        elif record.waiting:
            self.finish(record, None, None, f"stopped ({reason}) before it started", reason)
        elif record.finished:
            if record.exit_reported:
                self._send_exited(record)
        else:
            self.begin_stop(record, reason, message["grace_seconds"])

    def begin_stop(self, record: JobRecord, reason: str, grace: float) -> None:
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
        self.store.save(record)

    def enforce_deadlines(self) -> None:
        now = time.time()
        for record in self.store.running():
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
                self.store.save(record)

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

    def reap(self) -> None:
        for record in self.store.running():
            if record.starting is not None:
                continue  # its answer comes first (read on the next pass), then its end
            outcome = self._exit_outcome(record)
            if outcome is None:
                continue
            exit_code, signum, message = outcome
            left = kill_leftovers(record.pid, record.pid_start_ticks) if record.pid else 0
            if left:
                message += f"; killed {left} process(es) it left behind"
            self.finish(record, exit_code, signum, message)
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
        info = read_json(self.store.paths(record).exit)
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

    def finish(
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
        self.release_cgroup(record)
        # Written at the end of the pass, mostly with its exit reported (_exit_sent): a
        # crash before leaves the job running with its pid on disk, and the next agent
        # finds it gone and reports its exit from the wrapper's exit file.
        self.store.save_soon(record)

    def confirm_adopted_starts(self) -> None:
        """Jobs whose previous agent stopped before their wrapper answered: a wrapper still
        alive runs the command (one that cannot start it exits at once, and is then reaped
        with its exit file's reason), so its ``started`` goes now, after ``register``."""
        for record in self.store.running():
            if record.started_at is None and procfs.is_same_process(
                record.pid, record.pid_start_ticks
            ):
                record.started_at = time.time()
                self.store.save(record)
                self._send_started(record)
