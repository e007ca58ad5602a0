"""One leader at a time on the embedded default: a file lock in the var folder (on
PostgreSQL the loops take advisory locks instead)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator

from django.conf import settings


@contextlib.contextmanager
def file_leader_lock(name: str) -> Iterator[bool]:
    """Yield True if this process holds ``VAR_DIR/<name>.lock`` for the block, False at
    once if another one does."""
    with open(settings.VAR_DIR / f"{name}.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
