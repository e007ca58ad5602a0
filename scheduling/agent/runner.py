"""Starting, signalling and remembering one job on this node.

Every job attempt has a directory ``<work>/jobs/<job_id>-<attempt>/`` holding:

``launch.json``  the launch message (so a launch deferred while GPUs drain survives a restart)
``state.json``   the agent's record of the job (:class:`JobRecord`), rewritten on each change
``exit.json``    written by the wrapper when the command ends (see ``wrapper.py``)
``output.log``   the command's stdout and stderr
``checkpoints/`` the default ``SLUICE_CHECKPOINT_DIR``

Once the job has ended and its exit is reported, everything in it but ``state.json`` and the
checkpoint directory is removed (:func:`clean_workspace`); the rest goes when the job's
retention is over (:func:`remove_job_dir`). Only what lies under the job directory is ever
removed: a ``working_dir`` or ``checkpoint_dir`` elsewhere belongs to the user.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from scheduling.agent import procfs, wrapper

logger = logging.getLogger(__name__)

WRAPPER_PATH = Path(wrapper.__file__).resolve()
STATE_FILE = "state.json"
LAUNCH_FILE = "launch.json"
EXIT_FILE = "exit.json"
LOG_FILE = "output.log"
CHECKPOINT_DIR = "checkpoints"

#: Variables of the agent's own environment that jobs inherit; the rest (broker URL,
#: credentials, Django settings) stays with the agent.
INHERITED_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "LD_LIBRARY_PATH",
        "CUDA_HOME",
        "CUDA_PATH",
    }
)
INHERITED_ENV_PREFIXES = ("LC_", "NCCL_")
#: Defaults a job may override.
DEFAULT_JOB_ENV = {"PYTHONUNBUFFERED": "1"}


class LaunchError(Exception):
    """The job's command could not be started; the message says why."""


@dataclass
class JobRecord:
    """What the agent knows about one attempt of one job; persisted as ``state.json``.

    ``pid`` is the wrapper's pid, which is also the job's process-group id. A record with
    no pid and not finished is a launch waiting for its GPUs to be released.
    """

    job_id: int
    attempt: int
    name: str = ""
    gpu_indices: list[int] = field(default_factory=list)
    pid: int | None = None
    pid_start_ticks: int | None = None
    command_pid: int | None = None
    started_at: float | None = None
    stop_reason: str | None = None
    kill_deadline: float | None = None
    killed: bool = False
    finished: bool = False
    exit_code: int | None = None
    signal: int | None = None
    message: str = ""
    finished_at: float | None = None
    exit_reported: bool = False
    #: Bytes of output.log the control side has confirmed receiving (sent successfully).
    log_offset: int = 0
    #: The job's checkpoint directory (resolved at start), kept when the workspace is cleaned.
    checkpoint_path: str | None = None
    #: Days the job's directory is kept after the job ended (None: the agent's default).
    retention_days: float | None = None
    #: Everything but the state and the checkpoints was removed after the job ended.
    workspace_cleaned: bool = False

    # Runtime only (not persisted): the wrapper if this agent started it, the log read
    # position (sent or queued), when to ship the log next, whether `exited` is queued.
    process: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    log_read_offset: int = field(default=0, repr=False, compare=False)
    next_log_ship: float = field(default=0.0, repr=False, compare=False)
    exit_queued: bool = field(default=False, repr=False, compare=False)

    _RUNTIME = ("process", "log_read_offset", "next_log_ship", "exit_queued")

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)

    @property
    def waiting(self) -> bool:
        """Launch accepted but deferred until its GPUs are free."""
        return self.pid is None and not self.finished

    @property
    def running(self) -> bool:
        return self.pid is not None and not self.finished

    @property
    def stopping(self) -> bool:
        return self.running and self.stop_reason is not None

    def to_json(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it would deep-copy the Popen object.
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self._RUNTIME}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobRecord:
        known = {f.name for f in fields(cls)} - set(cls._RUNTIME)
        record = cls(**{k: v for k, v in data.items() if k in known})
        record.log_read_offset = record.log_offset
        return record


@dataclass(frozen=True)
class JobPaths:
    """The files of one job attempt."""

    root: Path

    @classmethod
    def for_job(cls, work_dir: Path, job_id: int, attempt: int) -> JobPaths:
        return cls(Path(work_dir) / "jobs" / f"{job_id}-{attempt}")

    @property
    def state(self) -> Path:
        return self.root / STATE_FILE

    @property
    def launch(self) -> Path:
        return self.root / LAUNCH_FILE

    @property
    def exit(self) -> Path:
        return self.root / EXIT_FILE

    @property
    def log(self) -> Path:
        return self.root / LOG_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINT_DIR


# --- persistence -------------------------------------------------------------------------------


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (write a temporary file, then rename), so a crash mid-write
    leaves the previous version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None if it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def save_record(record: JobRecord, paths: JobPaths) -> None:
    write_json(paths.state, record.to_json())


def load_record(paths: JobPaths) -> JobRecord | None:
    data = read_json(paths.state)
    if data is None:
        return None
    try:
        return JobRecord.from_json(data)
    except TypeError:
        logger.warning("ignoring unreadable job state %s", paths.state)
        return None


# --- launching ----------------------------------------------------------------------------------


def job_environment(
    message: dict[str, Any], *, node: str, checkpoint_dir: Path, base: dict[str, str]
) -> dict[str, str]:
    """The job's environment: a few variables of the node, the user's, then Sluice's own.

    Sluice's variables come last so that a user cannot widen ``CUDA_VISIBLE_DEVICES``.
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA number the GPUs as NVML does.
    """
    env = {
        k: v for k, v in base.items() if k in INHERITED_ENV or k.startswith(INHERITED_ENV_PREFIXES)
    }
    env.update(DEFAULT_JOB_ENV)
    env.update(message["env"])
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in message["gpu_indices"]),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "SLUICE_JOB_ID": str(message["job_id"]),
            "SLUICE_ATTEMPT": str(message["attempt"]),
            "SLUICE_JOB_NAME": message["name"],
            "SLUICE_NODE": node,
            "SLUICE_CHECKPOINT_DIR": str(checkpoint_dir),
        }
    )
    if message["gpu_uuids"]:
        env["SLUICE_GPU_UUIDS"] = ",".join(message["gpu_uuids"])
    if message["array_index"] is not None:
        env["SLUICE_ARRAY_INDEX"] = str(message["array_index"])
    return env


def job_argv(message: dict[str, Any]) -> list[str]:
    """The argv to run: the command itself, or ``/bin/sh -c command[0] name command[1:]``
    for a shell command (the extra words become ``$1``...; ``$0`` is the job's name)."""
    command = message["command"]
    if message["shell"]:
        return ["/bin/sh", "-c", command[0], message["name"] or "sluice-job", *command[1:]]
    return list(command)


def resolve_dir(value: str, *, default: Path, base: Path, create: bool) -> Path:
    """A directory setting of a launch: ``default`` when empty, relative paths under
    ``base`` (the job directory). ``create`` makes it; otherwise it must exist."""
    path = Path(value) if value else default
    if not path.is_absolute():
        path = base / path
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"cannot create {path}: {exc.strerror or exc}") from exc
    if not path.is_dir():
        raise LaunchError(f"directory {path} does not exist")
    return path


@dataclass(frozen=True)
class Spawned:
    process: subprocess.Popen
    pid: int
    pid_start_ticks: int | None
    command_pid: int


def spawn(
    *, argv: list[str], env: dict[str, str], cwd: Path, paths: JobPaths, timeout: float
) -> Spawned:
    """Start ``argv`` under the wrapper, in a new session, output appended to the log.

    Waits (at most ``timeout`` seconds, a few tens of milliseconds normally) for the
    wrapper to say whether the command started; raises LaunchError if it did not.
    """
    paths.exit.unlink(missing_ok=True)
    read_fd, write_fd = os.pipe()
    try:
        with open(paths.log, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-I", str(WRAPPER_PATH), "--exit-file", str(paths.exit)]
                + ["--status-fd", str(write_fd), "--cwd", str(cwd), "--", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=paths.root,
                start_new_session=True,
                pass_fds=(write_fd,),
            )
    except OSError as exc:
        os.close(read_fd)
        raise LaunchError(f"cannot start the job wrapper: {exc}") from exc
    finally:
        os.close(write_fd)
    try:
        status = _read_status_line(read_fd, timeout)
    finally:
        os.close(read_fd)
    return _spawned(process, status, timeout)


def _spawned(process: subprocess.Popen, status: str | None, timeout: float) -> Spawned:
    if status is not None and status.startswith("ok "):
        stat = procfs.read_stat(process.pid)
        return Spawned(
            process=process,
            pid=process.pid,
            pid_start_ticks=stat.start_ticks if stat else None,
            command_pid=int(status.split()[1]),
        )
    if status is not None and status.startswith("error "):
        _reap(process)
        raise LaunchError(status.removeprefix("error "))
    signal_group(process.pid, signal.SIGKILL)
    _reap(process)
    if status is None:
        raise LaunchError(f"the job wrapper did not answer within {timeout:g} s")
    raise LaunchError(f"the job wrapper failed (exit status {process.returncode})")


def _reap(process: subprocess.Popen) -> None:
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        logger.warning("job wrapper %s did not exit", process.pid)


def _read_status_line(fd: int, timeout: float) -> str | None:
    """Read one line from the wrapper's status pipe; "" at end of file, None on timeout."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace").strip()


# --- signals and exits -----------------------------------------------------------------------


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to process group ``pgid``; False if the group is gone."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        logger.warning("not allowed to signal process group %s", pgid)
        return False
    return True


def kill_leftovers(pgid: int, start_ticks: int | None) -> int:
    """SIGKILL what is left of a finished job's process group; return how many were left.

    A job ends when its command ends (as under Slurm); background processes it left behind
    would otherwise keep GPUs busy as zombies. ``start_ticks`` is when the job's leader
    started: nothing is signalled if the pid now names another process, and only members
    of the job's session that started after the job are counted, so that a recycled id
    is never hit.
    """
    leader = procfs.read_stat(pgid)
    if leader is not None and leader.alive and leader.start_ticks != start_ticks:
        return 0
    members = [
        m
        for m in procfs.group_members(pgid)
        if m.session == pgid and (start_ticks is None or m.start_ticks >= start_ticks)
    ]
    if members:
        signal_group(pgid, signal.SIGKILL)
    return len(members)


def describe_exit(exit_code: int | None, signum: int | None) -> str:
    """Human words for how a process ended."""
    if signum is not None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return f"killed by {name}"
    if exit_code is not None:
        return f"exited with code {exit_code}"
    return "exit status unknown"


# --- clean-up after the job ------------------------------------------------------------------


def _remove(path: Path) -> None:
    """Remove a file, a link or a whole directory (links are removed, never followed)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def clean_workspace(paths: JobPaths, keep: Path | None) -> int:
    """Remove what an ended job left in its directory except ``state.json`` and ``keep``
    (its checkpoint directory, when that lies under the job directory); returns how many
    entries were removed. Directories on the way to ``keep`` are cleaned, not removed."""
    keep = keep.resolve() if keep is not None else None
    root = paths.root.resolve()
    if keep is not None and root not in keep.parents:
        keep = None  # outside the job directory: not ours to keep or remove

    def clean(directory: Path) -> int:
        removed = 0
        for entry in sorted(directory.iterdir()):
            if directory == root and entry.name == STATE_FILE:
                continue
            if keep is not None and entry == keep:
                continue
            if keep is not None and entry in keep.parents and not entry.is_symlink():
                removed += clean(entry)
                continue
            _remove(entry)
            removed += 1
        return removed

    try:
        return clean(root)
    except FileNotFoundError:
        return 0


def remove_job_dir(paths: JobPaths) -> None:
    """Remove a job attempt's directory with everything in it (its retention is over)."""
    shutil.rmtree(paths.root, ignore_errors=True)
