"""Keeping jobs apart on a node: Unix accounts, directories, cgroups (DESIGN §12).

The agent is the only privileged process on a GPU node. Each job runs as an unprivileged
account (the portal's ``run_as``), in a workspace only that account can enter, in its own
cgroup v2 where the node allows one, with only its GPUs in ``CUDA_VISIBLE_DEVICES``. What
a node cannot enforce it must not pretend to: :func:`isolation_report` says, once at start,
what holds and what does not, and the agent sends that to the portal.

Standard library only, as the rest of the agent (GPU nodes have no Django).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from scheduling.agent import ledger
from scheduling.agent.protocol import ACCOUNT_NAME_RE, LIMIT_NAMES, TENANT_RE
from scheduling.agent.runner import LaunchError

logger = logging.getLogger(__name__)

#: An account name is ``sluice-<tenant>`` when the launch names none (as the portal's
#: default mapping does), and this one when it has no tenant either.
ACCOUNT_PREFIX = "sluice-"
FALLBACK_ACCOUNT = "sluice-job"
#: The only PATH of the programs the agent itself runs as root (useradd).
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
USERADD_ARGS = (
    "--system",
    "--no-create-home",
    "--home-dir",
    "/nonexistent",
    "--shell",
    "/usr/sbin/nologin",
    "--user-group",
)
#: useradd's statuses worth another try: passwd/group file locked or being updated by a
#: concurrent useradd (1, 10), or the name taken meanwhile (9: look it up again).
_USERADD_RETRY = (1, 9, 10)
_USERADD_ATTEMPTS = 6

#: Controllers a job's cgroup uses for its limits.
CGROUP_CONTROLLERS = ("cpu", "memory", "pids")
CGROUP_SLICE = "sluice.slice"
CPU_PERIOD_US = 100_000
CPU_MIN_QUOTA_US = 1_000  # the kernel refuses less
MOUNTS_FILE = "/proc/self/mounts"

_account_lock = threading.Lock()


# --- accounts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobAccount:
    """Who a job runs as. ``switched`` is False when the agent cannot change user (it is
    not root) and the job runs as the agent's own user."""

    name: str
    uid: int
    gid: int
    switched: bool


def agent_is_root() -> bool:
    return os.geteuid() == 0


def default_account_name(tenant: str) -> str:
    """``sluice-<tenant>``, or ``sluice-job`` for a launch without a tenant."""
    return f"{ACCOUNT_PREFIX}{tenant}" if tenant else FALLBACK_ACCOUNT


def job_account(
    *, run_as: str, tenant: str, create: bool, created_ledger: Path | None = None
) -> JobAccount:
    """The account a launch runs as; raises LaunchError (the message names ``run_as``)
    when it does not exist (and may not be created) or would be privileged.

    A non-root agent cannot switch users: its jobs run as itself, whatever ``run_as``
    says, and :func:`isolation_report` tells the portal so.
    """
    if not agent_is_root():
        uid = os.geteuid()
        return JobAccount(_user_name(uid), uid, os.getegid(), switched=False)
    name = run_as or default_account_name(tenant)
    if not ACCOUNT_NAME_RE.match(name):
        raise LaunchError(
            f"run_as: {name!r} is not an account name this node accepts "
            f"({ACCOUNT_NAME_RE.pattern}); set the tenant's Unix account in the portal"
        )
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        if not create:
            raise LaunchError(
                f"run_as: account {name!r} does not exist on this node (create it, or start "
                "the agent with --create-accounts)"
            ) from None
        entry = create_account(name, created_ledger=created_ledger)
    if entry.pw_uid == 0 or entry.pw_gid == 0 or entry.pw_uid == os.geteuid():
        raise LaunchError(
            f"run_as: account {name!r} is uid {entry.pw_uid} / gid {entry.pw_gid}: jobs never "
            "run as root or as the agent"
        )
    return JobAccount(name, entry.pw_uid, entry.pw_gid, switched=True)


def create_account(name: str, *, created_ledger: Path | None = None) -> pwd.struct_passwd:
    """Create a system account for jobs (no home, no login shell, its own group), and
    record it in ``created_ledger`` when this call made it (see ledger.py).

    Serialized in this process by a lock; against other processes (another agent, a
    test worker) useradd locks the passwd files itself, and a name created meanwhile
    counts as created (by the other process: only that one records it).
    """
    if not ACCOUNT_NAME_RE.match(name):
        raise LaunchError(f"run_as: {name!r} is not an account name this node accepts")
    useradd = shutil.which("useradd", path=SAFE_PATH)
    if useradd is None:
        raise LaunchError(f"run_as: cannot create account {name!r}: useradd not found")
    with _account_lock:
        error = ""
        for attempt in range(_USERADD_ATTEMPTS):
            try:
                return pwd.getpwnam(name)
            except KeyError:
                pass
            result = subprocess.run(
                [useradd, *USERADD_ARGS, name],
                capture_output=True,
                text=True,
                env={"PATH": SAFE_PATH},
                timeout=60,
                check=False,
            )
            if result.returncode == 0:
                logger.info("created account %s for jobs", name)
                entry = pwd.getpwnam(name)
                ledger.record(
                    created_ledger, ledger.ACCOUNT, name=name, uid=entry.pw_uid, gid=entry.pw_gid
                )
                return entry
            error = (result.stderr or result.stdout).strip() or f"status {result.returncode}"
            if result.returncode not in _USERADD_RETRY:
                break
            time.sleep(0.1 * (attempt + 1))
        try:
            return pwd.getpwnam(name)
        except KeyError:
            raise LaunchError(f"run_as: cannot create account {name!r}: {error}") from None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


# --- directories ----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobDir:
    """A directory of a launch: under the workspace (``relative`` to it, made by the agent)
    or an existing one under an allowed root (``relative`` None, never made)."""

    path: Path
    relative: PurePosixPath | None


def allowed_roots_for(roots: Iterable[str], tenant: str) -> list[PurePosixPath]:
    """The agent's ``--allowed-root`` directories with ``{tenant}`` filled in. A root that
    needs a tenant is skipped for a launch without a (valid) one: ``/data/{tenant}`` must
    never become ``/data/``."""
    expanded = []
    for root in roots:
        if "{tenant}" in root:
            if not tenant or not TENANT_RE.match(tenant):
                continue
            root = root.replace("{tenant}", tenant)
        path = PurePosixPath(root)
        if path.is_absolute() and ".." not in path.parts and path != PurePosixPath("/"):
            expanded.append(path)
    return expanded


def resolve_job_dir(
    field_name: str,
    value: str,
    *,
    workspace: Path,
    default: str,
    allowed_roots: Sequence[str],
    tenant: str,
) -> JobDir:
    """Where ``working_dir`` or ``checkpoint_dir`` points, or LaunchError naming the field.

    Relative paths are inside the job's workspace (no ``..``, so they cannot climb out;
    the workspace is new, so no link inside it leads out either). Absolute paths must lie
    under an allowed root, also once links are resolved, and exist already: the agent
    creates nothing outside the job's directory.
    """
    value = value or default
    if "\x00" in value:
        raise LaunchError(f"{field_name}: the path contains a NUL byte")
    path = PurePosixPath(value)
    if ".." in path.parts:
        raise LaunchError(f"{field_name} {value!r} must not contain '..'")
    if not path.is_absolute():
        return JobDir(workspace / path, path)
    roots = allowed_roots_for(allowed_roots, tenant)
    for root in roots:
        if path != root and root not in path.parents:
            continue
        real_root, real = Path(os.path.realpath(root)), Path(os.path.realpath(path))
        if real != real_root and real_root not in real.parents:
            raise LaunchError(f"{field_name} {value!r} leads outside {root} through a link")
        if not real.is_dir():
            raise LaunchError(
                f"{field_name} {value!r} does not exist on this node (directories under an "
                "allowed root are not created by the agent)"
            )
        return JobDir(real, None)
    where = f"under {', '.join(map(str, roots))}" if roots else "under no allowed root (none)"
    raise LaunchError(
        f"{field_name} {value!r} is outside the job's workspace and {where}: give a path "
        "relative to the workspace"
    )


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make_workspace(workspace: Path, subdirs: Iterable[PurePosixPath], account: JobAccount) -> None:
    """Create the workspace (0700) and ``subdirs`` in it, and give them to the job's account.

    Every step goes through directory descriptors opened without following links, so a
    link (from an earlier run of the same attempt) is never followed. The workspace is
    handed over last: until then only the agent can enter it, so the account never holds
    a directory whose contents are still being made.
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(workspace, 0o700)
    top = os.open(workspace, _DIR_FLAGS)
    try:
        for subdir in subdirs:
            _make_dirs_at(top, subdir.parts, account)
        _hand_over(top, account)
    finally:
        os.close(top)


def _make_dirs_at(dir_fd: int, parts: Sequence[str], account: JobAccount) -> None:
    fd = os.dup(dir_fd)
    try:
        for part in parts:
            if part in ("", "."):
                continue
            made = True
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                made = False
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise LaunchError(f"cannot use {part!r} in the workspace: {exc.strerror}") from exc
            os.close(fd)
            fd = child
            if made:
                _hand_over(fd, account)
    finally:
        os.close(fd)


def _hand_over(fd: int, account: JobAccount) -> None:
    if account.switched:
        os.fchown(fd, account.uid, account.gid)
    os.fchmod(fd, 0o700)


def unreachable_parent(path: Path) -> Path | None:
    """The first directory on the way to ``path`` (itself included) that other users
    cannot traverse (no ``o+x``), or None. Jobs run as other users and get absolute paths
    into their workspaces, so every directory on the way must let them pass."""
    for directory in [path, *path.parents]:
        try:
            mode = os.stat(directory).st_mode
        except OSError:
            return directory
        if not mode & stat.S_IXOTH:
            return directory
    return None


# --- cgroups --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupSupport:
    """Where job cgroups go (``slice``, None when they cannot be made) and which
    controllers they get; ``note`` says why there is none or what is missing."""

    slice: Path | None
    controllers: tuple[str, ...] = ()
    note: str | None = None


def cgroup2_mounts(mounts_file: str = MOUNTS_FILE) -> list[Path]:
    """cgroup v2 mount points, ``/sys/fs/cgroup`` (the unified layout) first."""
    try:
        with open(mounts_file) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            # /proc/mounts escapes spaces and the like as octal (\040).
            mounts.append(Path(fields[1].encode().decode("unicode_escape")))
    return sorted(mounts, key=lambda p: p != Path("/sys/fs/cgroup"))


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _enable_controllers(cgroup: Path, controllers: Iterable[str]) -> tuple[str, ...]:
    """Enable ``controllers`` for the children of ``cgroup``; return those that took."""
    enabled = []
    for name in controllers:
        try:
            _write(cgroup / "cgroup.subtree_control", f"+{name}")
        except OSError as exc:
            logger.warning("cannot enable the %s controller in %s: %s", name, cgroup, exc)
        else:
            enabled.append(name)
    return tuple(enabled)


def prepare_cgroups(root: Path | None = None, *, mounts_file: str = MOUNTS_FILE) -> CgroupSupport:
    """Find a writable cgroup v2 hierarchy with the cpu, memory or pids controller, make
    ``sluice.slice`` in it and enable the controllers for job cgroups below.

    ``root`` is the agent's ``--cgroup-root`` (a delegated subtree, say); without it the
    cgroup2 mounts are tried. A mount without those controllers (a hybrid node, where
    cgroup v1 holds them) or one the agent cannot write is no use: limits would not hold.
    """
    candidates = [root] if root is not None else cgroup2_mounts(mounts_file)
    if not candidates:
        return CgroupSupport(None, note="no cgroup v2 hierarchy mounted")
    problems = []
    for candidate in candidates:
        if not (candidate / "cgroup.controllers").exists():
            problems.append(f"{candidate} is not a cgroup v2 directory")
            continue
        available = [
            c for c in CGROUP_CONTROLLERS if c in _read_words(candidate / "cgroup.controllers")
        ]
        if not available:
            problems.append(
                f"the cgroup v2 hierarchy at {candidate} has no cpu, memory or pids controller "
                "(a cgroup v1 hierarchy holds them)"
            )
            continue
        if not os.access(candidate, os.W_OK):
            problems.append(f"the cgroup v2 hierarchy at {candidate} is not writable")
            continue
        enabled = _enable_controllers(candidate, available)
        slice_dir = candidate / CGROUP_SLICE
        try:
            slice_dir.mkdir(mode=0o755, exist_ok=True)
        except OSError as exc:
            problems.append(f"cannot create {slice_dir}: {exc.strerror or exc}")
            continue
        enabled = _enable_controllers(slice_dir, enabled)
        if not enabled:
            problems.append(f"no controller could be enabled in {slice_dir}")
            continue
        missing = [c for c in CGROUP_CONTROLLERS if c not in enabled]
        note = f"cgroup controllers not available: {', '.join(missing)}" if missing else None
        return CgroupSupport(slice_dir, enabled, note)
    return CgroupSupport(None, note="; ".join(problems))


def job_cgroup_name(job_id: int, attempt: int) -> str:
    return f"job-{job_id}-{attempt}"


def create_job_cgroup(
    support: CgroupSupport, name: str, limits: Mapping[str, Any]
) -> tuple[Path, dict[str, Any]]:
    """Make the job's cgroup and write its limits; return its path and the limits it
    enforces. Raises LaunchError (after removing it again) if a limit cannot be set: a
    node that says it enforces limits must not start a job without them."""
    assert support.slice is not None
    path = support.slice / name
    try:
        path.mkdir(mode=0o755, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"cannot create the job's cgroup {path}: {exc.strerror}") from exc
    enforced: dict[str, Any] = {}
    try:
        cpus, memory_mb, pids = (limits.get(n) for n in LIMIT_NAMES)
        if cpus and "cpu" in support.controllers:
            quota = max(CPU_MIN_QUOTA_US, round(cpus * CPU_PERIOD_US))
            _write(path / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            enforced["cpus"] = cpus
        if memory_mb and "memory" in support.controllers:
            _write(path / "memory.max", str(int(memory_mb) * 1024 * 1024))
            if (path / "memory.swap.max").exists():
                _write(path / "memory.swap.max", "0")  # or the limit is only on RAM
            enforced["memory_mb"] = memory_mb
        if pids and "pids" in support.controllers:
            _write(path / "pids.max", str(int(pids)))
            enforced["pids"] = pids
    except OSError as exc:
        remove_job_cgroup(path)
        raise LaunchError(f"cannot set the limits of cgroup {path}: {exc}") from exc
    return path, enforced


def remove_job_cgroup(path: Path) -> bool:
    """Kill what is left in a job's cgroup (a process that escaped its session too) and
    remove it; False while it cannot be removed yet (processes still dying)."""
    kill = path / "cgroup.kill"
    if kill.exists():
        try:
            _write(kill, "1")
        except OSError as exc:
            logger.warning("cannot kill the processes of cgroup %s: %s", path, exc)
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


# --- what this node enforces ----------------------------------------------------------------


def proc_hidden(mounts_file: str = MOUNTS_FILE) -> bool:
    """True when /proc hides other users' processes (mounted with hidepid=2/invisible)."""
    try:
        with open(mounts_file) as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "/proc" and fields[2] == "proc":
            options = fields[3].split(",")
            return "hidepid=2" in options or "hidepid=invisible" in options
    return False


@dataclass
class Isolation:
    """What the agent enforces on this node, decided once at start."""

    run_as_user: bool
    cgroups: CgroupSupport
    proc_hidden: bool
    notes: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        """The ``isolation`` of the ``register`` report (see the protocol)."""
        return {
            "run_as_user": self.run_as_user,
            "cgroup": self.cgroups.slice is not None,
            "cgroup_controllers": list(self.cgroups.controllers),
            "device_isolation": False,
            "proc_hidden": self.proc_hidden,
            "notes": list(self.notes),
        }


def isolation_report(
    *, cgroup_root: Path | None = None, mounts_file: str = MOUNTS_FILE
) -> Isolation:
    """Work out (and prepare, where that needs doing: the cgroup slice) what this node can
    enforce, with a note in words for everything it cannot."""
    root = agent_is_root()
    # A non-root agent may still own a delegated subtree (``--cgroup-root``); elsewhere it
    # finds the hierarchy not writable.
    cgroups = prepare_cgroups(cgroup_root, mounts_file=mounts_file)
    hidden = proc_hidden(mounts_file)
    notes = []
    if not root:
        notes.append(
            "jobs run as the agent's user (agent not root): they can read each other's files "
            "and the agent's, and signal each other"
        )
    if cgroups.slice is None:
        notes.append(
            f"no cgroup v2 hierarchy writable ({cgroups.note}): CPU, memory and pids limits "
            "not enforced"
        )
    elif cgroups.note:
        notes.append(f"{cgroups.note}: those limits not enforced")
    notes.append(
        "GPU device isolation not enforced: CUDA_VISIBLE_DEVICES hides other GPUs from CUDA, "
        "but a job can open any /dev/nvidia* device (device control on cgroup v2 needs eBPF)"
    )
    if not hidden:
        notes.append(
            "/proc is not mounted with hidepid=invisible: jobs can list every process of the "
            "node (not read other users' environment or memory)"
        )
    return Isolation(run_as_user=root, cgroups=cgroups, proc_hidden=hidden, notes=notes)
