"""What an agent created on the host outside its work dir, and how to remove exactly that.

An agent started with ``--create-accounts`` adds Unix accounts (``useradd --system``), and
a root agent whose work dir the job accounts cannot reach makes one under
:data:`scheduling.agent.workdir.FALLBACK_WORK_ROOT`. With a ledger (``--created-ledger
FILE``, or ``$SLUICE_CREATED_LEDGER``) it appends one JSON line per thing it made itself;
:func:`remove_created` undoes those and nothing else: an account that existed before, or
one that was replaced since (another uid), is never touched.

``make demo-reset`` and the test suite use it. Standard library only, as the agent.
"""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import os
import pwd
import shutil
import subprocess
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: The environment variable that names the ledger when ``--created-ledger`` does not.
LEDGER_ENV = "SLUICE_CREATED_LEDGER"
#: Kinds of entries: an account (and its own group), a directory removed with all it holds,
#: and a directory removed only once empty (shared by several agents).
ACCOUNT = "account"
TREE = "tree"
EMPTY_DIR = "dir"
#: Only accounts with this home are ever removed (what ``create_account`` makes).
ACCOUNT_HOME = "/nonexistent"
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
#: A directory recorded as a tree is removed only if it holds this file (written when it
#: was made), so that a ledger naming another directory cannot have it deleted.
TREE_MARKER = ".made-by-sluice-agent"


def ledger_from_env() -> Path | None:
    value = os.environ.get(LEDGER_ENV, "")
    return Path(value) if value else None


def record(ledger: Path | None, kind: str, **fields: Any) -> None:
    """Append an entry (one line, one write: agents sharing a ledger do not interleave)."""
    if ledger is None:
        return
    line = json.dumps({"kind": kind, **fields}, sort_keys=True) + "\n"
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def entries(ledger: Path) -> list[dict[str, Any]]:
    """The ledger's entries in the order written; unreadable lines are skipped."""
    try:
        lines = ledger.read_text().splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and isinstance(entry.get("kind"), str):
                found.append(entry)
    return found


def remove_created(ledger: Path) -> list[str]:
    """Remove what the ledger lists (newest first), rewrite it with what is left, and
    return a line per thing that could not be removed (empty: all gone, ledger removed)."""
    left: list[dict[str, Any]] = []
    problems: list[str] = []
    for entry in reversed(entries(ledger)):
        try:
            problem = _remove(entry)
        except OSError as exc:
            problem = f"{entry}: {exc}"
        if problem:
            problems.append(problem)
            left.append(entry)
    if left:
        tmp = ledger.with_name(ledger.name + ".tmp")
        tmp.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in reversed(left)))
        tmp.replace(ledger)
    else:
        ledger.unlink(missing_ok=True)
    return problems


def _remove(entry: dict[str, Any]) -> str | None:
    kind = entry["kind"]
    if kind == ACCOUNT:
        return _remove_account(str(entry.get("name", "")), entry.get("uid"), entry.get("gid"))
    path = Path(str(entry.get("path", "")))
    if not path.is_absolute() or path == Path("/"):
        return f"not removing {path}: not an absolute directory"
    if kind == TREE:
        if not path.is_dir():
            return None
        if not (path / TREE_MARKER).is_file():
            return f"not removing {path}: it has no {TREE_MARKER} (not made by an agent)"
        shutil.rmtree(path)
        return None
    if kind == EMPTY_DIR:
        with contextlib.suppress(FileNotFoundError):
            try:
                path.rmdir()
            except OSError:
                logger.info("keeping %s: not empty", path)
        return None
    return f"unknown entry {entry}"


def _remove_account(name: str, uid: Any, gid: Any) -> str | None:
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        user = None
    if user is not None:
        if user.pw_uid != uid or user.pw_uid == 0:
            return None  # replaced since: not the account that was created, so not ours
        if user.pw_dir != ACCOUNT_HOME:
            return None
        problem = _run("userdel", name)
        if problem:
            return f"cannot remove account {name}: {problem}"
    # useradd --user-group made a group of the same name; userdel removes it unless
    # another user has it as primary group. Remove it if it is still the one made.
    try:
        group = grp.getgrnam(name)
    except KeyError:
        return None
    if group.gr_gid == gid and not group.gr_mem:
        if any(p.pw_gid == gid for p in pwd.getpwall()):
            return None
        problem = _run("groupdel", name)
        if problem:
            return f"cannot remove group {name}: {problem}"
    return None


def _run(program: str, name: str) -> str | None:
    path = shutil.which(program, path=SAFE_PATH)
    if path is None:
        return f"{program} not found"
    result = subprocess.run(
        [path, name],
        capture_output=True,
        text=True,
        env={"PATH": SAFE_PATH},
        timeout=60,
        check=False,
    )
    if result.returncode == 0:
        return None
    return (result.stderr or result.stdout).strip() or f"{program} exited {result.returncode}"
