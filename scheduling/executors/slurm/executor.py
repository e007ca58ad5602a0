"""The Slurm executor: Sluice decides who runs where; a Slurm controller runs it.

A placed job becomes one Slurm batch job pinned to the chosen node (``--nodelist``) with the
chosen GPU count (``--gres=gpu:<n>``; Slurm binds the GPUs and sets ``CUDA_VISIBLE_DEVICES``),
named ``sluice-<job>-<attempt>`` with the comment ``sluice:<job>:<attempt>`` (how it is
found again after a restart). State, exit code and signal come from the controller
(``squeue --Format``); output from the ``--output`` file, which the bridge reads (the jobs'
folder must be shared with the nodes, or the bridge run on the node). A stop is
``scancel --full --signal=TERM``, then ``scancel`` after the grace period (Slurm then kills
what is left after its ``KillWait``). Jobs of the partition that are not Sluice's are
reported as capacity in use "outside Sluice" (``outside_jobs``).
See docs/operator/executor-slurm.md.

Pure standard library: the bridge runs where Slurm's client commands are, without Django.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import pwd
import shlex
import signal
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from scheduling.agent import protocol
from scheduling.executors.base import (
    SLURM,
    TOPOLOGY_LABEL,
    Capabilities,
    Event,
    Executor,
    Exited,
    GpuSample,
    LogChunk,
    NodeInfo,
    Running,
    Started,
)
from scheduling.executors.capabilities import static_capabilities
from scheduling.executors.slurm.client import (
    SlurmClient,
    SlurmError,
    SlurmJob,
    SlurmJobGone,
    decode_wait_status,
    end_message,
)

logger = logging.getLogger(__name__)

#: The PATH a job starts with (the node's usual directories).
JOB_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: How often the controller is asked for the jobs' states, at most (seconds).
DEFAULT_REFRESH_SECONDS = 0.25
#: How often (in seconds of waiting) a bridge waiting for the controller at start says so.
ADOPT_WARN_EVERY = 30
#: A tracked job the controller no longer lists is ended after this many refreshes.
MISSING_REFRESHES = 3
#: How many ended attempts the bridge remembers (their exit, answered again to a repeated
#: launch or stop), and how many jobs' newest attempt.
ENDED_MEMORY = 20_000
#: How long an ended attempt stays in the heartbeats' job list, with its exit (as the node
#: agent keeps finished jobs): a control side that missed the ``exited`` report ends it
#: from there.
ENDED_SUMMARY_SECONDS = 60.0
SUPERSEDED_MESSAGE = "a newer attempt of this job was launched already"
GPU_MEMORY_MB = 81559  # an H100 80GB; Slurm's Gres does not say a GPU's memory
NO_PYXIS_MESSAGE = (
    "this Slurm pool cannot run container images (no pyxis/enroot declared): "
    "run the job without an image or on a pool that has them"
)


def time_limit_minutes(runtime_seconds: float, grace_seconds: float) -> int:
    """Slurm's time limit of a job that Sluice stops after ``runtime_seconds`` (with its
    warnings and grace): the backstop, a grace period and a minute later, in minutes."""
    return math.ceil((runtime_seconds + float(grace_seconds)) / 60) + 1


def job_name(job_id: int, attempt: int) -> str:
    return f"sluice-{job_id}-{attempt}"


def job_comment(job_id: int, attempt: int) -> str:
    return f"sluice:{job_id}:{attempt}"


@dataclasses.dataclass
class _Tracked:
    """A Sluice job this executor submitted (or adopted after a restart)."""

    job_id: int
    attempt: int
    node: str
    slurm_id: str
    output: Path
    log_cap: int
    started: bool = False
    ended: bool = False
    shipped: int = 0  # bytes of output shipped (the next chunk's offset)
    capped: bool = False
    stop_reason: str = ""
    kill_at: float | None = None
    killed: bool = False
    missing: int = 0
    gpu_indices: tuple[int, ...] = ()
    started_at: float | None = None  # Slurm's start time, once started
    exited: Exited | None = None  # the exit reported, once ended


class SlurmExecutor(Executor):
    """Runs Sluice's placed jobs as Slurm batch jobs of one partition."""

    kind = SLURM

    def __init__(
        self,
        *,
        client: SlurmClient,
        work_dir: Path | str,
        pyxis: bool = False,
        refresh_seconds: float = DEFAULT_REFRESH_SECONDS,
        default_log_cap: int = protocol.DEFAULT_LOG_CAP_BYTES,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.client = client
        self.work_dir = Path(work_dir)
        self.pyxis = pyxis
        self.refresh_seconds = refresh_seconds
        self.default_log_cap = default_log_cap
        self.clock = clock
        self._sleep = sleep
        self._tracked: dict[tuple[int, int], _Tracked] = {}
        self._events: list[Event] = []
        self._jobs: list[SlurmJob] = []
        self._refreshed_at = -math.inf
        self._adopted = False
        #: Attempts that ended here (or in the controller's records), with their exit.
        self._ended: OrderedDict[tuple[int, int], Exited] = OrderedDict()
        #: When the bridge saw each of them end (its clock), in the same order.
        self._ended_seen: dict[tuple[int, int], float] = {}
        #: The newest attempt of each job this bridge was asked to launch or saw in Slurm.
        self._newest: OrderedDict[int, int] = OrderedDict()

    # --- what it offers ---------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        caps = static_capabilities(SLURM, container_runtime="pyxis" if self.pyxis else "")
        return dataclasses.replace(
            caps,
            notes=(
                *caps.notes,
                "Slurm chooses which GPU indices of the chosen node a job gets; the count "
                "and the node are Sluice's",
                "jobs of the partition that are not Sluice's are reported as capacity in use "
                "outside Sluice",
                "the pids limit is not enforced",
            ),
        )

    def nodes(self) -> list[NodeInfo]:
        result = []
        blocks = self.client.topology()
        for node in self.client.nodes():
            gpus = [
                {
                    "index": i,
                    "uuid": f"slurm-{node.name}-gpu{i}",
                    "model": node.gpu_type.upper() or "GPU",
                    "name": node.gpu_type or "gpu",
                    "memory_mb": GPU_MEMORY_MB,
                }
                for i in range(node.gpus)
            ]
            labels = {"slurm.partition": self.client.partition, "slurm.state": node.state}
            if node.name in blocks:
                labels[TOPOLOGY_LABEL] = blocks[node.name]
            result.append(NodeInfo(name=node.name, gpus=gpus, labels=labels))
        return result

    def register_fields(self, node: str) -> dict[str, Any]:
        fields = super().register_fields(node)
        info = next((n for n in self.client.nodes() if n.name == node), None)
        if info is not None:
            fields.update(hostname=info.hostname, cpus=info.cpus, memory_mb=info.memory_mb)
        return fields

    def heartbeat_fields(self, node: str) -> tuple[dict[str, Any], Callable[[], None] | None]:
        fields, after = super().heartbeat_fields(node)
        fields["outside_jobs"] = self.outside_jobs(node)
        # Zombies (and GPU samples) are the node's observe-only sampler's to report.
        del fields["zombies"]
        return fields, after

    def outside_jobs(self, node: str | None = None) -> list[dict[str, Any]]:
        """Jobs of the partition that are not Sluice's and hold GPUs now: capacity in use,
        labelled "outside Sluice" (one entry per Slurm job and node)."""
        self._refresh()
        result = []
        for job in self._jobs:
            if job.sluice is not None or job.state not in ("RUNNING", "COMPLETING", "SUSPENDED"):
                continue
            if node is not None and job.nodes != node:
                continue
            result.append(
                {
                    "slurm_job_id": job.job_id,
                    "node": job.nodes,
                    "user": job.user,
                    "name": job.name,
                    "gpu_indices": list(job.gpu_indices),
                    "gpus": len(job.gpu_indices) or job.gpus_requested,
                    "label": "outside Sluice",
                }
            )
        return result

    def job_summaries(self, node: str) -> list[dict[str, Any]]:
        """The node's jobs for ``register`` and ``heartbeat``, as this bridge has reported
        them, never ahead of its ``started`` and ``exited`` events: attempts it saw start
        (running until it reported their end), and attempts that ended in the last
        ``ENDED_SUMMARY_SECONDS`` with how they ended. A job still pending in Slurm is not
        listed (it has not started), and a job that ended in Slurm since the bridge last
        looked is listed as running until its exit is reported with it: the control side
        must never read a job missing from a heartbeat as lost while its end is on the way."""
        summaries = [
            {
                "job_id": t.job_id,
                "attempt": t.attempt,
                "pid": 0,
                "running": True,
                "stop_reason": t.stop_reason or None,
                **({"started_at": t.started_at} if t.started_at else {}),
            }
            for t in self._tracked.values()
            if t.node == node and t.started and not t.ended
        ]
        horizon = self.clock() - ENDED_SUMMARY_SECONDS
        for key, exited in reversed(self._ended.items()):
            if self._ended_seen.get(key, 0.0) < horizon:
                break  # kept in the order they were seen to end: the rest are older
            if exited.node != node or exited.reason == protocol.SUPERSEDED:
                continue
            summaries.append(
                {
                    "job_id": exited.job_id,
                    "attempt": exited.attempt,
                    "pid": 0,
                    "running": False,
                    "stop_reason": exited.reason or None,
                    "exit_code": exited.exit_code,
                    "signal": exited.signal,
                    "finished_at": exited.finished_at,
                    "message": exited.message,
                }
            )
        return summaries

    # --- launch -----------------------------------------------------------------------

    def launch(self, node: str, message: Mapping[str, Any]) -> None:
        key = (message["job_id"], message["attempt"])
        tracked = self._tracked.get(key)
        if tracked is not None:
            # A repeated launch: say again what is known; the next poll says the rest.
            if tracked.started and not tracked.ended:
                self._events.append(self._started(tracked))
            return
        if self._answer_known_launch(node, key):
            return
        self._saw_attempt(*key)
        if message.get("image") and not self.pyxis:
            self._launch_failed(node, message, NO_PYXIS_MESSAGE)
            return
        try:
            script, options, output = self._submission(node, message)
            slurm_id = self.client.submit(script, options)
        except (SlurmError, LaunchRefused) as exc:
            self._launch_failed(node, message, str(exc))
            return
        logger.info("job %s attempt %s: Slurm job %s on %s", *key, slurm_id, node)
        cap = message.get("log_cap_bytes") or self.default_log_cap
        self._tracked[key] = _Tracked(
            job_id=key[0], attempt=key[1], node=node, slurm_id=slurm_id, output=output, log_cap=cap
        )
        # A newer attempt supersedes an older one of the same job still running.
        for other in list(self._tracked.values()):
            if other.job_id == key[0] and other.attempt < key[1] and not other.ended:
                self._stop(other, protocol.SUPERSEDED, float(message["grace_seconds"]))
        self._refreshed_at = -math.inf

    def _answer_known_launch(self, node: str, key: tuple[int, int]) -> bool:
        """Answer a launch of an attempt that is not to be submitted (again): one that ended
        here already (its exit is sent again), one older than an attempt of the same job
        already launched (``superseded``), or one the controller has a Slurm job of (after
        a restart of the bridge: taken over, or its end reported). True when answered."""
        ended = self._ended.get(key)
        if ended is not None:
            self._events.append(ended)
            return True
        newest = self._newest.get(key[0])
        if newest is not None and key[1] < newest:
            self._events.append(
                Exited(
                    job_id=key[0],
                    attempt=key[1],
                    node=node,
                    exit_code=None,
                    signal=None,
                    reason=protocol.SUPERSEDED,
                    message=SUPERSEDED_MESSAGE,
                )
            )
            return True
        record = next((j for j in self._jobs if j.sluice == key), None)
        if record is None:
            return False
        self._saw_attempt(*key)
        tracked = self._tracked_from(record, key)
        self._tracked[key] = tracked
        if not record.active:
            self._end(tracked, record, end_message(record))
        return True

    def _saw_attempt(self, job_id: int, attempt: int) -> None:
        if attempt >= self._newest.get(job_id, -1):
            self._newest[job_id] = attempt
            self._newest.move_to_end(job_id)
        while len(self._newest) > ENDED_MEMORY:
            self._newest.popitem(last=False)

    def _launch_failed(self, node: str, message: Mapping[str, Any], text: str) -> None:
        self._events.append(
            Exited(
                job_id=message["job_id"],
                attempt=message["attempt"],
                node=node,
                exit_code=None,
                signal=None,
                reason=protocol.LAUNCH_FAILED,
                message=text,
            )
        )

    def _account(self, message: Mapping[str, Any]) -> pwd.struct_passwd | None:
        """The Unix account the job runs as: its ``run_as``, else ``sluice-<tenant>``; None
        when the bridge is not root (jobs then run as the bridge's user)."""
        if os.geteuid() != 0:
            return None
        tenant = message.get("tenant", "")
        name = message.get("run_as") or (f"sluice-{tenant}" if tenant else "")
        if not name:
            raise LaunchRefused("the job names no account to run as (no tenant, no run_as)")
        try:
            return pwd.getpwnam(name)
        except KeyError:
            raise LaunchRefused(
                f"the account {name!r} does not exist on the bridge's host; Slurm pools run "
                "jobs as the tenants' existing Unix accounts (the same on every node)"
            ) from None

    def _submission(self, node: str, message: Mapping[str, Any]) -> tuple[str, list[str], Path]:
        job_id, attempt = message["job_id"], message["attempt"]
        account = self._account(message)
        job_dir = self.work_dir / "jobs" / f"{job_id}-{attempt}"
        workspace = job_dir / "workspace"
        job_dir.mkdir(parents=True, exist_ok=True)
        # The job's account passes through to its workspace and output file (umask aside).
        os.chmod(job_dir.parent, 0o711)
        os.chmod(job_dir, 0o711)
        workspace.mkdir(exist_ok=True)
        output = job_dir / "output.log"
        # The job writes its output file but cannot replace it with a link (the folder is
        # the bridge's), so reading it never reads another file.
        fd = os.open(output, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        if account is not None:
            os.chown(workspace, account.pw_uid, account.pw_gid)
            os.chown(output, account.pw_uid, account.pw_gid)
        os.chmod(workspace, 0o700)
        cwd = self._job_path(workspace, message["working_dir"], "working_dir")
        checkpoints = self._job_path(
            workspace, message["checkpoint_dir"] or "checkpoints", "checkpoint_dir"
        )
        user = account.pw_name if account else pwd.getpwuid(os.geteuid()).pw_name
        env = self._environment(
            message, node=node, home=workspace, user=user, checkpoints=checkpoints
        )
        gpus = len(message["gpu_indices"])
        options = [
            f"--job-name={job_name(job_id, attempt)}",
            f"--comment={job_comment(job_id, attempt)}",
            f"--partition={self.client.partition}",
            f"--nodelist={node}",
            "--nodes=1",
            "--ntasks=1",
            "--no-requeue",
            f"--output={output}",
            f"--chdir={workspace}",
        ]
        if gpus:
            options.append(f"--gres=gpu:{gpus}")
        limits = message.get("limits") or {}
        if limits.get("cpus"):
            options.append(f"--cpus-per-task={math.ceil(limits['cpus'])}")
        if limits.get("memory_mb"):
            options.append(f"--mem={int(limits['memory_mb'])}M")
        runtime = message.get("runtime_limit_seconds")
        if runtime:
            options.append(f"--time={time_limit_minutes(runtime, message['grace_seconds'])}")
        if account is not None:
            options += [f"--uid={account.pw_uid}", f"--gid={account.pw_gid}"]
        if message.get("image"):
            options.append(f"--container-image={message['image']}")
        script = self._script(message, env, cwd=cwd, checkpoints=checkpoints, account=account)
        return script, options, output

    @staticmethod
    def _job_path(workspace: Path, path: str, field: str) -> Path:
        if not path:
            return workspace
        candidate = Path(path)
        if candidate.is_absolute():
            return candidate
        if ".." in candidate.parts:
            raise LaunchRefused(f"{field} must not contain '..'")
        return workspace / candidate

    def _environment(
        self, message: Mapping[str, Any], *, node: str, home: Path, user: str, checkpoints: Path
    ) -> dict[str, str]:
        env = {"PATH": JOB_PATH, "PYTHONUNBUFFERED": "1"}
        env.update(
            {k: v for k, v in message["env"].items() if not protocol.is_reserved_env_name(k)}
        )
        env.update(
            {
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "HOME": str(home),
                "USER": user,
                "LOGNAME": user,
                "SLUICE_JOB_ID": str(message["job_id"]),
                "SLUICE_ATTEMPT": str(message["attempt"]),
                "SLUICE_JOB_NAME": message["name"],
                "SLUICE_NODE": node,
                "SLUICE_CHECKPOINT_DIR": str(checkpoints),
            }
        )
        if message.get("array_index") is not None:
            env["SLUICE_ARRAY_INDEX"] = str(message["array_index"])
        return env

    @staticmethod
    def _script(
        message: Mapping[str, Any],
        env: Mapping[str, str],
        *,
        cwd: Path,
        checkpoints: Path,
        account: pwd.struct_passwd | None,
    ) -> str:
        lines = ["#!/bin/sh", f"# {job_name(message['job_id'], message['attempt'])}"]
        lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]
        # CUDA_VISIBLE_DEVICES is Slurm's (GRES binding); container runtimes read this name.
        lines.append('export NVIDIA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-none}"')
        lines.append(f"mkdir -p {shlex.quote(str(checkpoints))} {shlex.quote(str(cwd))}")
        lines.append(f"cd {shlex.quote(str(cwd))} || exit 126")
        command = list(message["command"])
        if message["shell"]:
            command = ["/bin/sh", "-c", command[0], message["name"], *command[1:]]
        # exec: the command is the batch step's process, so Slurm's signals reach it.
        lines.append("exec " + " ".join(shlex.quote(arg) for arg in command))
        return "\n".join(lines) + "\n"

    # --- extend -----------------------------------------------------------------------

    def extend(self, node: str, message: Mapping[str, Any]) -> None:
        """Raise the Slurm job's time limit to the job's new runtime limit (the backstop)."""
        key = (message["job_id"], message["attempt"])
        tracked = self._tracked.get(key) or self._adopt_one(key)
        if tracked is None or tracked.ended:
            return  # ended, or not this bridge's: nothing to raise
        minutes = time_limit_minutes(message["runtime_limit_seconds"], message["grace_seconds"])
        try:
            self.client.set_time_limit(tracked.slurm_id, minutes)
        except SlurmJobGone:
            return  # it ended meanwhile; the refreshes report how
        except SlurmError as exc:
            # Sluice's own timeout still applies; only the backstop stays where it was.
            logger.warning(
                "raising the time limit of Slurm job %s to %s min: %s",
                tracked.slurm_id,
                minutes,
                exc,
            )

    # --- stop -------------------------------------------------------------------------

    def stop(self, node: str, message: Mapping[str, Any]) -> None:
        key = (message["job_id"], message["attempt"])
        ended = self._ended.get(key)
        if ended is not None and key not in self._tracked:
            self._events.append(ended)  # it ended here: its exit again, as it was
            return
        tracked = self._tracked.get(key) or self._adopt_one(key)
        if tracked is None or tracked.ended:
            if tracked is None:
                self._events.append(
                    Exited(
                        job_id=key[0],
                        attempt=key[1],
                        node=node,
                        exit_code=None,
                        signal=None,
                        reason=message["reason"],
                        message=protocol.NOT_RUNNING_MESSAGE,
                    )
                )
            return
        if tracked.stop_reason:
            return  # stopping already
        self._stop(tracked, message["reason"], float(message["grace_seconds"]))

    def _stop(self, tracked: _Tracked, reason: str, grace: float) -> None:
        logger.info(
            "job %s attempt %s: stopping Slurm job %s (%s, grace %s s)",
            tracked.job_id,
            tracked.attempt,
            tracked.slurm_id,
            reason,
            grace,
        )
        tracked.stop_reason = reason
        try:
            if not tracked.started:
                self._refresh(force=True)
                job = self._job_of(tracked)
                if job is None or not job.started:
                    self.client.cancel(tracked.slurm_id)  # never started: nothing to warn
                    tracked.killed = True
                    return
                self._mark_started(tracked, job)
            self.client.signal(tracked.slurm_id, "TERM")
        except SlurmJobGone:
            # Ended and purged, or never there: nothing to stop; the next refreshes end
            # the attempt with what the controller says (or that it no longer knows it).
            tracked.killed = True
            return
        except SlurmError as exc:
            logger.warning(
                "stopping Slurm job %s: %s (retried at the deadline)", tracked.slurm_id, exc
            )
        tracked.kill_at = self.clock() + grace

    # --- the loop ---------------------------------------------------------------------

    def start(self) -> None:
        """Take over what the controller runs and ran before the nodes register, waiting
        for the controller while it does not answer (a restart): a ``register`` listing no
        jobs because the controller was away would end the running ones as lost."""
        waited = 0
        while not self._adopt():
            if waited % ADOPT_WARN_EVERY == 0:
                logger.warning(
                    "waiting for the Slurm controller before registering the nodes (%d s)",
                    waited,
                )
            self._sleep(1.0)
            waited += 1

    def work(self) -> None:
        now = self.clock()
        for tracked in self._tracked.values():
            if tracked.ended or tracked.killed or tracked.kill_at is None or now < tracked.kill_at:
                continue
            # scancel sends SIGTERM again and SIGKILL after the cluster's KillWait (Slurm
            # turns a SIGKILL sent with scancel into the same cancel): keep KillWait short.
            try:
                self.client.cancel(tracked.slurm_id)
                tracked.killed = True
            except SlurmJobGone:
                tracked.killed = True  # nothing left to cancel
            except SlurmError as exc:
                logger.warning("cancelling Slurm job %s: %s", tracked.slurm_id, exc)

    def due_in(self) -> float:
        return min(self.refresh_seconds, 1.0)

    def poll(self) -> Iterable[Event]:
        if not self._adopted:
            self._adopt()
        self.work()
        if self._refresh():
            self._observe()
        for tracked in self._tracked.values():
            if tracked.started and not tracked.ended:
                self._ship_output(tracked)
        self._forget_ended()
        events, self._events = self._events, []
        return events

    def _refresh(self, *, force: bool = False) -> bool:
        """Ask the controller for the partition's jobs (at most every ``refresh_seconds``);
        False when it did not answer (then nothing is concluded from silence)."""
        if not force and self.clock() - self._refreshed_at < self.refresh_seconds:
            return False
        try:
            self._jobs = self.client.jobs()
        except SlurmError as exc:
            logger.warning("the Slurm controller did not answer: %s", exc)
            return False
        self._refreshed_at = self.clock()
        return True

    def _job_of(self, tracked: _Tracked) -> SlurmJob | None:
        return next((j for j in self._jobs if j.job_id == tracked.slurm_id), None)

    def _observe(self) -> None:
        for tracked in self._tracked.values():
            if tracked.ended:
                continue
            job = self._job_of(tracked)
            if job is None:
                tracked.missing += 1
                if tracked.missing >= MISSING_REFRESHES:
                    self._end(tracked, None, f"Slurm no longer knows job {tracked.slurm_id}")
                continue
            tracked.missing = 0
            if job.started and not tracked.started:
                self._mark_started(tracked, job)
            if not job.active:
                self._end(tracked, job, end_message(job))

    def _end(self, tracked: _Tracked, job: SlurmJob | None, message: str) -> None:
        if job is not None and job.started and not tracked.started:
            self._mark_started(tracked, job)
        if tracked.started:
            self._ship_output(tracked, final=True)
        exit_code, sig = decode_wait_status(job.exit_status if job else None)
        if job is not None and not job.started:
            exit_code = sig = None  # it never ran (cancelled while pending)
        elif job is not None and job.state == "CANCELLED" and sig is None and not exit_code:
            # scancel ends a running job with signals (SIGTERM, SIGKILL after KillWait), but
            # the controller may record the job's exit as 0 before the batch step's status
            # arrives (or keep it so): a cancelled job never succeeded.
            exit_code, sig = None, signal.SIGKILL if tracked.killed else signal.SIGTERM
            sig = int(sig)
        elif job is not None and job.state == "CANCELLED" and sig is None and exit_code > 128:
            # Or the batch step's shell reported its command killed by a signal the way
            # shells do (128 + the signal): the job was ended by that signal.
            exit_code, sig = None, exit_code - 128
        if job is not None and job.state == "CANCELLED" and not tracked.stop_reason:
            message = "cancelled in Slurm, not by Sluice (scancel behind Sluice's back)"
        if tracked.stop_reason and job is not None and job.state == "CANCELLED":
            message = ""  # Sluice's own stop: the reason says it
        tracked.ended = True
        logger.info(
            "job %s attempt %s: Slurm job %s ended %s (exit %s, signal %s) %s",
            tracked.job_id,
            tracked.attempt,
            tracked.slurm_id,
            job.state if job is not None else "(unknown to Slurm)",
            exit_code,
            sig,
            message,
        )
        tracked.exited = Exited(
            job_id=tracked.job_id,
            attempt=tracked.attempt,
            node=tracked.node,
            exit_code=exit_code,
            signal=sig,
            reason=tracked.stop_reason,
            message=message,
            finished_at=float(job.end_time) if job is not None and job.end_time else self.clock(),
        )
        self._events.append(tracked.exited)

    def _mark_started(self, tracked: _Tracked, job: SlurmJob) -> None:
        logger.info(
            "job %s attempt %s: Slurm job %s started", tracked.job_id, tracked.attempt, job.job_id
        )
        tracked.started = True
        tracked.gpu_indices = job.gpu_indices
        tracked.started_at = float(job.start_time) or None
        self._events.append(self._started(tracked))

    def _started(self, tracked: _Tracked) -> Started:
        return Started(
            job_id=tracked.job_id,
            attempt=tracked.attempt,
            node=tracked.node,
            pid=None,
            external_id=tracked.slurm_id,
            started_at=tracked.started_at,
        )

    def _ship_output(self, tracked: _Tracked, *, final: bool = False) -> None:
        if tracked.capped:
            return
        try:
            fd = os.open(tracked.output, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return
        with os.fdopen(fd, "rb") as handle:
            handle.seek(tracked.shipped)
            while not tracked.capped:
                want = min(protocol.LOG_CHUNK_BYTES, tracked.log_cap - tracked.shipped)
                data = handle.read(want) if want > 0 else b""
                if data:
                    self._events.append(
                        LogChunk(
                            tracked.job_id, tracked.attempt, tracked.node, tracked.shipped, data
                        )
                    )
                    tracked.shipped += len(data)
                if tracked.shipped >= tracked.log_cap and handle.read(1):
                    marker = protocol.log_truncated_marker(tracked.log_cap).encode()
                    self._events.append(
                        LogChunk(
                            tracked.job_id, tracked.attempt, tracked.node, tracked.log_cap, marker
                        )
                    )
                    tracked.capped = True
                if len(data) < want or not data:
                    break

    def _forget_ended(self) -> None:
        for key in [k for k, t in self._tracked.items() if t.ended]:
            tracked = self._tracked.pop(key)
            if tracked.exited is not None:
                self._remember_end(key, tracked.exited)

    def _remember_end(self, key: tuple[int, int], exited: Exited) -> None:
        self._ended[key] = exited
        self._ended.move_to_end(key)
        self._ended_seen[key] = self.clock()
        while len(self._ended) > ENDED_MEMORY:
            oldest, _ = self._ended.popitem(last=False)
            self._ended_seen.pop(oldest, None)

    # --- reconciliation ---------------------------------------------------------------

    def _adopt(self) -> bool:
        """Take over the Sluice jobs the controller runs, and report again how those it
        still remembers (``MinJobAge``) ended: a job that ended while no bridge watched
        has its exit and output sent, not read as lost. False when the controller did not
        answer."""
        if not self._refresh(force=True):
            return False
        self._adopted = True
        for job in self._jobs:
            ids = job.sluice
            if ids is None or ids in self._tracked or ids in self._ended:
                continue
            self._saw_attempt(*ids)
            tracked = self._tracked[ids] = self._tracked_from(job, ids)
            if not job.active:
                self._end(tracked, job, end_message(job))
            elif job.started:
                self._mark_started(tracked, job)  # listed as running from the first register
        return True

    def _adopt_one(self, key: tuple[int, int]) -> _Tracked | None:
        if not self._refresh(force=True):
            return None
        for job in self._jobs:
            if job.sluice == key:
                self._saw_attempt(*key)
                tracked = self._tracked[key] = self._tracked_from(job, key)
                if not job.active:  # it ended while no bridge watched: its exit, from Slurm
                    self._end(tracked, job, end_message(job))
                return tracked
        return None

    def _tracked_from(self, job: SlurmJob, ids: tuple[int, int]) -> _Tracked:
        output = Path(job.standard_output.replace("%j", job.job_id))
        return _Tracked(
            job_id=ids[0],
            attempt=ids[1],
            node=job.node,
            slurm_id=job.job_id,
            output=output,
            log_cap=self.default_log_cap,
        )

    def running(self) -> list[Running]:
        if not self._refresh(force=True):
            # The controller is away: what this bridge knows is the best answer.
            return [
                Running(t.job_id, t.attempt, t.node, t.slurm_id)
                for t in self._tracked.values()
                if not t.ended
            ]
        return [
            Running(job.sluice[0], job.sluice[1], job.node, job.job_id)
            for job in self._jobs
            if job.sluice is not None and job.active
        ]

    def gpu_samples(self) -> list[GpuSample]:
        # Slurm has no per-GPU utilisation: the observe-only sampler on each node reports
        # it to the control side itself (``samples``; scheduling/agent/observe.py).
        return []


class LaunchRefused(Exception):
    """A launch this executor cannot submit; the message says why."""
