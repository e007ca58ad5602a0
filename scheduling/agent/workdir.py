"""Where a root agent keeps its jobs' directories: a place the job accounts can reach.

Jobs run as their own accounts and get absolute paths into their workspaces, so every
directory on the way to the work dir must let other users pass (``o+x``). A checkout in a
private home (``/root`` is 0700 on most systems) fails that. When the work dir was not
chosen (the default ``var/agent/<node>``), a root agent moves it to
``/var/lib/sluice/<node>-<hash of the configured path>``: root-owned, 0711 (the job
accounts pass through but list nothing), the workspaces in it 0700 and the job's own, as
everywhere. The same checkout and node always get the same directory, so a restarted
agent finds and adopts its jobs. A work dir given with ``--work-dir`` is never moved: the
agent refuses to start, in one line that says what to do.

Standard library only, as the rest of the agent.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from scheduling.agent import ledger
from scheduling.agent.isolation import unreachable_parent
from scheduling.agent.runner import TRAVERSE_ONLY, ensure_dir

#: Where work dirs the job accounts can reach are made (``/var/lib`` is 0755 everywhere).
FALLBACK_WORK_ROOT = Path("/var/lib/sluice")
#: Where programs of the checkout that jobs run (the demo's sample model server) are
#: copied when the job accounts cannot read them where they are.
PROGRAMS_DIR_NAME = "programs"


class WorkDirError(RuntimeError):
    """No work dir the job accounts can reach; the message (one line) says what to do."""


def fallback_work_dir(configured: Path, root: Path = FALLBACK_WORK_ROOT) -> Path:
    """The reachable work dir of ``configured`` (an absolute path): stable per path."""
    digest = hashlib.sha256(os.fsencode(configured)).hexdigest()[:12]
    return root / f"{configured.name}-{digest}"


def reachable_work_dir(
    configured: Path, *, fallback_root: Path | None, created_ledger: Path | None = None
) -> Path:
    """``configured`` if the job accounts can reach it, else its fallback under
    ``fallback_root`` (made if missing, recorded in ``created_ledger``); raises
    WorkDirError when neither will do (``fallback_root`` None: the work dir was chosen)."""
    blocked = unreachable_parent(_existing(configured))
    if blocked is None:
        return configured
    why = f"{blocked} is not searchable by other users"
    if fallback_root is None:
        raise WorkDirError(
            f"job accounts cannot reach the work dir {configured}: {why}; give it o+x "
            f"(chmod o+x {blocked}) or choose a --work-dir they can reach (e.g. under /var/lib)"
        )
    target = fallback_work_dir(configured, fallback_root)
    try:
        _make_reachable(target, created_ledger)
    except (OSError, WorkDirError) as exc:
        raise WorkDirError(
            f"job accounts cannot reach the work dir {configured} ({why}), and {target} "
            f"cannot be used instead: {exc}; give --work-dir a directory they can reach"
        ) from None
    return target


def blocking_dir(path: Path) -> Path | None:
    """The directory that keeps other users from ``path`` (or the part of it that
    exists), or None."""
    return unreachable_parent(_existing(path))


def reachable_copy(
    source: Path, *, created_ledger: Path | None = None, root: Path = FALLBACK_WORK_ROOT
) -> Path:
    """``source`` if the job accounts can read it, else (as root) a copy of it under
    ``root`` (root-owned, world-readable), recorded in ``created_ledger``: the
    demo's jobs run a script of the checkout, which a 0700 home hides from them. The
    folder is per checkout (``programs-<hash of the source's folder>``). Without
    root the jobs run as the same user, who can read it."""
    readable = blocking_dir(source.parent) is None and os.stat(source).st_mode & stat.S_IROTH
    if readable or os.geteuid() != 0:
        return source
    # One folder per checkout: another checkout's demo-reset must not take this copy away.
    digest = hashlib.sha256(os.fsencode(source.parent)).hexdigest()[:12]
    folder = root / f"{PROGRAMS_DIR_NAME}-{digest}"
    if not root.exists():
        ensure_dir(root, TRAVERSE_ONLY)
        ledger.record(created_ledger, ledger.EMPTY_DIR, path=str(root))
    _check_private(root)
    if not folder.exists():
        ensure_dir(folder, 0o755)
        (folder / ledger.TREE_MARKER).write_text("programs of a Sluice checkout jobs run\n")
        ledger.record(created_ledger, ledger.TREE, path=str(folder))
    _check_private(folder)
    target = folder / source.name
    tmp = folder / f".{source.name}.tmp"
    tmp.write_bytes(source.read_bytes())
    tmp.chmod(0o644)
    tmp.replace(target)
    return target


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (a work dir not made yet is checked on the
    way to it; ensure_dir makes the missing part 0711)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _make_reachable(target: Path, created_ledger: Path | None) -> None:
    root = target.parent
    if not root.exists():
        ensure_dir(root, TRAVERSE_ONLY)
        ledger.record(created_ledger, ledger.EMPTY_DIR, path=str(root))
    _check_private(root)
    if not target.exists():
        ensure_dir(target, TRAVERSE_ONLY)
        (target / ledger.TREE_MARKER).write_text(
            "job directories of a Sluice agent whose own work dir the job accounts could "
            "not reach\n"
        )
        ledger.record(created_ledger, ledger.TREE, path=str(target))
    _check_private(target)
    blocked = unreachable_parent(target)
    if blocked is not None:
        raise WorkDirError(f"{blocked} is not searchable by other users")


def _check_private(directory: Path) -> None:
    """Only root may change what is in ``directory`` (job accounts must not swap a
    workspace for a link)."""
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
        raise WorkDirError(f"{directory} is not a directory owned by root")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise WorkDirError(f"{directory} is writable by other users")
