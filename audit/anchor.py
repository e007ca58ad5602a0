"""The audit chain's head, kept outside the database (``SLUICE_AUDIT_ANCHOR``).

A hash chain shows a changed or removed event in the middle, but not the newest events
removed: what is left is still a valid chain. ``audit_verify`` therefore writes the head it
verified (last id, number of events, that event's hash) to a file outside the database,
signed with the audit key, and on the next run checks that the anchored event is still there
unchanged and that the log did not shrink.

The file is written atomically (a temporary file in the same folder, then a rename) and is
readable by its owner only. Put it where the database's users cannot write (another volume,
another host's mount); the default under ``var/`` suits a demo.

``SLUICE_AUDIT_ANCHOR_COPY`` names a second file with the same content, meant for a place
that whoever can change the database and the first file still cannot write: another
host's share, or a root-owned file that a verification run as root keeps (see
docs/operator/security.md). Verification checks the log against both; one missing while
the other is there, or one the log no longer matches, is reported.

An empty log that never held an event is anchored at its start (``Anchor.genesis``), after
``migrate`` and by ``audit_verify``; from then on a missing anchor is a problem.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from django.conf import settings

from . import chain

_SIGNATURE_LABEL = "sluice.audit.anchor.v1"


class AnchorError(Exception):
    """The anchor file exists but cannot be trusted (unreadable, malformed, bad signature)."""


@dataclass(frozen=True)
class Anchor:
    """The last verified head of the chain."""

    last_id: int
    count: int
    hash: str
    verified_at: str  # ISO 8601, UTC

    @classmethod
    def genesis(cls, verified_at: str) -> Anchor:
        """The anchor of an empty log: nothing before it, every later log extends it."""
        return cls(last_id=0, count=0, hash=chain.GENESIS_HASH, verified_at=verified_at)

    def describe(self) -> str:
        if self.count == 0:
            return f"the empty log's start (verified {self.verified_at})"
        return f"event {self.last_id} ({self.count} events, verified {self.verified_at})"


def anchor_path() -> Path:
    return Path(settings.SLUICE_AUDIT_ANCHOR)


def anchor_copy_path() -> Path | None:
    """``SLUICE_AUDIT_ANCHOR_COPY``, or None when no copy is kept."""
    configured = getattr(settings, "SLUICE_AUDIT_ANCHOR_COPY", None)
    return Path(configured) if configured else None


def anchor_read(path: Path | None = None) -> Anchor | None:
    """The anchor in ``path``; None when there is no file yet."""
    path = path or anchor_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AnchorError(f"cannot read the anchor file {path}: {exc}") from exc
    try:
        stored = json.loads(text)
        data = stored["anchor"]
        anchor = Anchor(
            last_id=int(data["last_id"]),
            count=int(data["count"]),
            hash=str(data["hash"]),
            verified_at=str(data["verified_at"]),
        )
        signature = str(stored["signature"])
    except (ValueError, KeyError, TypeError) as exc:
        raise AnchorError(f"the anchor file {path} is malformed: {exc!r}") from exc
    if not chain.signature_matches(_SIGNATURE_LABEL, asdict(anchor), signature):
        raise AnchorError(
            f"the anchor file {path} does not carry a valid signature "
            "(changed by hand, or written with another audit key)"
        )
    return anchor


def anchor_write(anchor: Anchor, path: Path | None = None) -> None:
    """Replace the anchor file atomically; the file is mode 0600."""
    path = path or anchor_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(anchor)
    body = json.dumps(
        {"anchor": data, "signature": chain.sign(_SIGNATURE_LABEL, data)}, indent=2, sort_keys=True
    )
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(body + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every filesystem allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
