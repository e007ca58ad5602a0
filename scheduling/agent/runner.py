"""Starting, signalling and remembering one job on this node.

Every job attempt has a directory ``<work>/jobs/<job_id>-<attempt>/`` (the agent's, mode
0711: the job may pass through to its workspace but not list it) holding:

``launch.json``  the launch message, only for a launch deferred while GPUs drain (so that it
                 survives a restart)
``state.json``   the agent's record of the job (:class:`JobRecord`), rewritten on each change
``exit.json``    written by the wrapper when the command ends (see ``wrapper.py``)
``output.log``   the command's stdout and stderr
``workspace/``   the job's own directory (its account's, 0700): its cwd and ``HOME``, with
                 ``checkpoints/``, the default ``SLUICE_CHECKPOINT_DIR``

The agent's files are 0600: they hold the job's secrets (its environment) and what the
agent knows, and the job writes its output through the descriptor it inherits, so it never
needs to open them. Once the job has ended and its exit is reported, everything but
``state.json`` and the checkpoint directory is removed (:func:`clean_workspace`); the rest
goes when the job's retention is over (:func:`remove_job_dir`). Only what lies under the job
directory is ever removed: a ``working_dir`` or ``checkpoint_dir`` under an allowed root
belongs to the user.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import Any

from scheduling.agent import procfs, wrapper
from scheduling.agent.protocol import is_reserved_env_name

logger = logging.getLogger(__name__)

WRAPPER_PATH = Path(wrapper.__file__).resolve()
#: The compiled wrapper (``make native`` builds it from wrapper.c): the same contract as
#: wrapper.py at a fraction of its cost (the Python one spends ~30 ms of CPU per job on
#: starting its interpreter). Used when present, unless ``SLUICE_AGENT_WRAPPER=python``.
NATIVE_WRAPPER_PATH = WRAPPER_PATH.with_name("sluice-job-wrapper")
WRAPPER_ENV_VAR = "SLUICE_AGENT_WRAPPER"
STATE_FILE = "state.json"
LAUNCH_FILE = "launch.json"
EXIT_FILE = "exit.json"
LOG_FILE = "output.log"
ENV_FILE = "env"
WORKSPACE_DIR = "workspace"
CHECKPOINT_DIR = "checkpoints"
#: Modes of what the agent makes: directories the job passes through, the agent's files.
TRAVERSE_ONLY = 0o711
PRIVATE_FILE = 0o600
#: The PATH of the wrapper itself (it runs with the agent's rights, so nothing of the job's
#: environment reaches it; the job's environment is handed over in a file).
WRAPPER_PATH_ENV = "/usr/sbin:/usr/bin:/sbin:/bin"

#: The PATH of jobs that run as their own account (unless the agent says otherwise): the
#: node's system directories.
SYSTEM_JOB_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

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
    #: Output shipped at most (bytes); the rest stays on the node (see the protocol).
    log_cap_bytes: int | None = None
    #: The truncation marker was delivered: nothing more of the log is ever shipped.
    log_truncated: bool = False
    #: How the job is kept apart (the ``isolation`` of its ``started`` report).
    isolation: dict[str, Any] | None = None
    #: The job's cgroup, until it is removed after the job ended.
    cgroup_path: str | None = None
    #: A serving job's paths (the launch's ``serve``; None: not a serving job) and the
    #: port it was given (``PORT``), scraped while it runs.
    serve: dict[str, str] | None = None
    port: int | None = None

    # Runtime only (not persisted): the wrapper if this agent started it, the wrapper while
    # its answer is awaited, the log read position (sent or queued), when to ship the log
    # next, whether `exited` is queued, whether the truncation marker is queued.
    process: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    starting: Starting | None = field(default=None, repr=False, compare=False)
    log_read_offset: int = field(default=0, repr=False, compare=False)
    next_log_ship: float = field(default=0.0, repr=False, compare=False)
    exit_queued: bool = field(default=False, repr=False, compare=False)
    log_marker_queued: bool = field(default=False, repr=False, compare=False)

    _RUNTIME = (
        "process",
        "starting",
        "log_read_offset",
        "next_log_ship",
        "exit_queued",
        "log_marker_queued",
    )

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
    def env(self) -> Path:
        return self.root / ENV_FILE

    @property
    def workspace(self) -> Path:
        return self.root / WORKSPACE_DIR

    @property
    def checkpoints(self) -> Path:
        return self.workspace / CHECKPOINT_DIR


# --- persistence -------------------------------------------------------------------------------


def ensure_dir(path: Path, mode: int = TRAVERSE_ONLY) -> None:
    """Make ``path`` (and missing parents) with ``mode`` whatever the umask, and set
    ``mode`` on ``path`` if it existed: parents made with the agent's umask 077 would
    keep job accounts out of their workspaces."""
    missing = [p for p in [path, *path.parents] if not p.exists()]
    for directory in reversed(missing):
        try:
            directory.mkdir(mode)
        except FileExistsError:
            continue
        os.chmod(directory, mode)
    os.chmod(path, mode)


def open_private(path: Path, flags: int) -> int:
    """Open (creating) a file only the agent can read, whatever the umask, without
    following a link put in its place."""
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (write a temporary file, then rename), so a crash mid-write
    leaves the previous version; the file is the agent's alone (0600). Compact: with an
    indent, ``json`` encodes in Python instead of its C encoder, and a job's record is
    written at each step of its life (a tenth of an agent's CPU in a burst of launches)."""
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
        f.write(json.dumps(data, separators=(",", ":")))
    os.replace(tmp, path)


def write_env_file(path: Path, env: dict[str, str]) -> None:
    """The job's environment for its wrapper: ``KEY=VALUE`` entries each ended by a NUL
    byte (the form ``execve`` takes, so the compiled wrapper needs no parser), 0600."""
    data = b"".join(f"{k}={v}".encode("utf-8", "surrogateescape") + b"\0" for k, v in env.items())
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def wrapper_command() -> list[str]:
    """How to start the job wrapper: the compiled one when it was built and is not
    turned off (``SLUICE_AGENT_WRAPPER=python``), else wrapper.py under this Python."""
    choice = os.environ.get(WRAPPER_ENV_VAR, "auto")
    if choice != "python" and os.access(NATIVE_WRAPPER_PATH, os.X_OK):
        return [str(NATIVE_WRAPPER_PATH)]
    if choice == "native":
        raise LaunchError(
            f"{WRAPPER_ENV_VAR}=native but {NATIVE_WRAPPER_PATH} is missing: run make native"
        )
    # -S: no site-packages (the wrapper is standard library only; it starts faster).
    return [sys.executable, "-I", "-S", str(WRAPPER_PATH)]


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


def reserved_env_names(env: dict[str, str]) -> list[str]:
    """The names of ``env`` only Sluice may set (see the protocol's reserved names)."""
    return sorted(name for name in env if is_reserved_env_name(name))


def job_environment(
    message: dict[str, Any],
    *,
    node: str,
    checkpoint_dir: Path,
    home: Path,
    user: str,
    base: dict[str, str],
    port: int | None = None,
) -> dict[str, str]:
    """The job's environment: a few variables of the node, the user's, then Sluice's own.
    A serving job's ``port`` is ``PORT`` (over the user's) and ``SLUICE_SERVE_PORT``.

    The user's reserved names are dropped (the portal refuses them already; this is the
    second line) and Sluice's variables come last, so that a user can neither widen
    ``CUDA_VISIBLE_DEVICES`` nor preload a library into the job's programs.
    ``NVIDIA_VISIBLE_DEVICES`` says the same GPUs to container runtimes;
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA number the GPUs as NVML does.
    """
    env = {
        k: v for k, v in base.items() if k in INHERITED_ENV or k.startswith(INHERITED_ENV_PREFIXES)
    }
    env.update(DEFAULT_JOB_ENV)
    env.update({k: v for k, v in message["env"].items() if not is_reserved_env_name(k)})
    gpus = ",".join(str(i) for i in message["gpu_indices"])
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": gpus,
            "NVIDIA_VISIBLE_DEVICES": gpus or "none",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "HOME": str(home),
            "USER": user,
            "LOGNAME": user,
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
    if port is not None:
        env["PORT"] = env["SLUICE_SERVE_PORT"] = str(port)
    return env


def job_argv(message: dict[str, Any]) -> list[str]:
    """The argv to run: the command itself, or ``/bin/sh -c command[0] name command[1:]``
    for a shell command (the extra words become ``$1``...; ``$0`` is the job's name)."""
    command = message["command"]
    if message["shell"]:
        return ["/bin/sh", "-c", command[0], message["name"] or "sluice-job", *command[1:]]
    return list(command)


@dataclass(frozen=True)
class Spawned:
    process: subprocess.Popen
    pid: int
    pid_start_ticks: int | None
    command_pid: int


@dataclass
class Starting:
    """A job wrapper started but not yet heard from: it answers on ``status_fd`` (``ok
    <pid>`` once the command runs, ``error <message>`` if it cannot start) in a few tens of
    milliseconds. The agent watches the descriptor instead of waiting for the answer, so a
    burst of launches starts all their wrappers at once."""

    process: subprocess.Popen
    status_fd: int
    paths: JobPaths
    #: time.monotonic() after which the launch is given up.
    deadline: float
    timeout: float
    pid_start_ticks: int | None = None
    buffer: bytes = b""
    closed: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def read_status(self) -> str | None:
        """The wrapper's answer once it is complete: the line, "" if the wrapper closed the
        pipe without one (it died), None while it is still to come. Never blocks."""
        if self.closed:
            return ""
        while b"\n" not in self.buffer:
            try:
                chunk = os.read(self.status_fd, 4096)
            except BlockingIOError:
                return None
            if not chunk:
                break
            self.buffer += chunk
        line = self.buffer.split(b"\n", 1)[0] if b"\n" in self.buffer else b""
        return line.decode("utf-8", "replace").strip()

    def close(self, *, keep_env: bool = False) -> None:
        """Close the status pipe and remove the environment file (the wrapper removed it
        once read, normally), unless ``keep_env``: the wrapper may not have read it yet."""
        if not self.closed:
            self.closed = True
            os.close(self.status_fd)
        if not keep_env:
            self.paths.env.unlink(missing_ok=True)


def open_log(paths: JobPaths) -> int:
    """The job's log for appending (0600): the job writes through this descriptor and
    can neither reopen nor read the file. Appending, so that the agent may cut the file
    back to the log cap while the job writes (see ``Agent._ship_log``)."""
    return open_private(paths.log, os.O_WRONLY | os.O_APPEND)


def spawn_start(
    *,
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    paths: JobPaths,
    timeout: float,
    uid: int | None = None,
    gid: int | None = None,
    cgroup: Path | None = None,
) -> Starting:
    """Start ``argv`` under the wrapper, in a new session, output appended to the log, and
    return without waiting for the wrapper's answer (see :func:`spawn_finish`).

    The wrapper keeps the agent's rights (it writes the exit file into the agent's
    directory) and starts only the command as ``uid``/``gid``, in ``cgroup`` when given.
    The job's environment goes to it in a 0600 file, not in its own environment: a root
    process must not start with variables the user chose (``LOCPATH``, ``GCONV_PATH``...).
    """
    paths.exit.unlink(missing_ok=True)
    invalid = [k for k, v in env.items() if not k or "=" in k or "\0" in k or "\0" in v]
    if invalid:
        raise LaunchError(f"invalid environment variable names or values: {invalid[:5]}")
    args = [*wrapper_command(), "--exit-file", str(paths.exit)]
    args += ["--env-file", str(paths.env), "--cwd", str(cwd)]
    if uid is not None and gid is not None:
        args += ["--uid", str(uid), "--gid", str(gid)]
    if cgroup is not None:
        args += ["--cgroup", str(cgroup)]
    write_env_file(paths.env, env)
    read_fd, write_fd = os.pipe()
    try:
        log = open_log(paths)
        try:
            process = subprocess.Popen(
                [*args, "--status-fd", str(write_fd), "--", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={"PATH": WRAPPER_PATH_ENV},
                cwd=paths.root,
                start_new_session=True,
                pass_fds=(write_fd,),
                umask=0o077,
            )
        finally:
            os.close(log)
    except OSError as exc:
        os.close(read_fd)
        paths.env.unlink(missing_ok=True)
        raise LaunchError(f"cannot start the job wrapper: {exc}") from exc
    finally:
        os.close(write_fd)
    os.set_blocking(read_fd, False)
    # Read now, while the wrapper surely exists: it names this process even if the pid is
    # recycled later, so a restarted agent adopts the job only if it is the same process.
    stat = procfs.read_stat(process.pid)
    return Starting(
        process=process,
        status_fd=read_fd,
        paths=paths,
        deadline=time.monotonic() + timeout,
        timeout=timeout,
        pid_start_ticks=stat.start_ticks if stat else None,
    )


def spawn_finish(starting: Starting, status: str | None) -> Spawned:
    """The started job from the wrapper's answer (:meth:`Starting.read_status`; None: it
    did not answer in time); raises LaunchError, with the wrapper ended, if it did not
    start. Closes the status pipe."""
    starting.close()
    process = starting.process
    if status is not None and status.startswith("ok "):
        return Spawned(
            process=process,
            pid=process.pid,
            pid_start_ticks=starting.pid_start_ticks,
            command_pid=int(status.split()[1]),
        )
    if status is not None and status.startswith("error "):
        _reap(process)
        raise LaunchError(status.removeprefix("error "))
    signal_group(process.pid, signal.SIGKILL)
    _reap(process)
    if status is None:
        raise LaunchError(f"the job wrapper did not answer within {starting.timeout:g} s")
    raise LaunchError(f"the job wrapper failed (exit status {process.returncode})")


def _reap(process: subprocess.Popen) -> None:
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        logger.warning("job wrapper %s did not exit", process.pid)


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
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return 0  # the group is empty: the usual case, told without reading all of /proc
    except PermissionError:
        pass  # members the agent may not signal: looked at below
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


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _remove_at(dir_fd: int, name: str) -> None:
    """Remove a file, a link or a whole directory in ``dir_fd`` (links are removed, never
    followed: ``shutil.rmtree`` with a descriptor resists links swapped in meanwhile)."""
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def clean_workspace(paths: JobPaths, keep: Path | None) -> int:
    """Remove what an ended job left in its directory except ``state.json`` and ``keep``
    (its checkpoint directory, when that lies under the job directory); returns how many
    entries were removed. Directories on the way to ``keep`` are cleaned, not removed.

    The workspace belongs to the job's account, whose other processes (another job of the
    same tenant) may still change it while the agent, as root, cleans: so the walk goes
    through descriptors opened without following links, and ``keep`` is compared by name,
    never resolved.
    """
    keep_parts: tuple[str, ...] = ()
    if keep is not None:
        try:
            relative = PurePosixPath(keep).relative_to(PurePosixPath(paths.root))
        except ValueError:
            relative = None  # outside the job directory: not ours to keep or remove
        if relative is not None and ".." not in relative.parts:
            keep_parts = relative.parts

    def clean(dir_fd: int, keep_parts: tuple[str, ...], top: bool) -> int:
        removed = 0
        for name in sorted(os.listdir(dir_fd)):
            if top and name == STATE_FILE:
                continue
            if keep_parts and name == keep_parts[0]:
                if len(keep_parts) == 1:
                    continue
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                except OSError:
                    pass  # not a directory (any more): removed like the rest
                else:
                    try:
                        removed += clean(child, keep_parts[1:], top=False)
                    finally:
                        os.close(child)
                    continue
            _remove_at(dir_fd, name)
            removed += 1
        return removed

    try:
        root = os.open(paths.root, _DIR_FLAGS)
    except FileNotFoundError:
        return 0
    try:
        return clean(root, keep_parts, top=True)
    finally:
        os.close(root)


def remove_job_dir(paths: JobPaths) -> None:
    """Remove a job attempt's directory with everything in it (its retention is over)."""
    shutil.rmtree(paths.root, ignore_errors=True)
