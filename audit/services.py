"""Writing audit events (call inside the transaction that makes the audited change), and
verifying the log: the hash chain, the anchor outside the database, the append-only guard."""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from portal.middleware import current_request_context
from portal.sqlrows import ModelInsert

from . import chain
from .anchor import (
    Anchor,
    AnchorError,
    anchor_copy_path,
    anchor_path,
    anchor_read,
    anchor_write,
)
from .db import append_only_guard_missing, highest_id_ever_used
from .models import AuditEvent

log = logging.getLogger(__name__)

GENESIS_HASH = chain.GENESIS_HASH
# The last verification's outcome, for the audit page (derived state: losing it loses nothing).
LAST_VERIFICATION_CACHE_KEY = "audit:last-verification"
# Any constant works; it only has to be the same for every writer of the chain.
_CHAIN_LOCK_KEY = 0x5_1C_E_A0D1


def _lock_chain() -> None:
    """Serialize appends so two writers never chain onto the same previous event.

    PostgreSQL: a transaction-scoped advisory lock. SQLite: transactions are IMMEDIATE
    (see settings), so a writer already holds the database write lock.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CHAIN_LOCK_KEY])


def audit_chain_head_locked_sql() -> str:
    """PostgreSQL: an SQL expression that locks the chain until the transaction ends and
    answers its newest hash (NULL when there is none), for a caller that appends an event
    in this transaction and reads the head inside a statement it runs anyway (a
    submission's insert), then hands it to ``audit_record(chain_head=...)``. The function
    behind it (migration 0006) reads with a fresh snapshot once it holds the lock, so it
    sees every event appended before, as ``audit_record``'s own lock and read do."""
    return f"audit_chain_head_locked({_CHAIN_LOCK_KEY})"


#: ``audit_record`` reads the chain's head itself (no ``chain_head`` given).
_READ_HEAD: Any = object()


# No savepoint of its own: the event belongs to its caller's transaction (a failure here
# fails the audited change too), and a savepoint cost two statements inside the chain lock.
@transaction.atomic(savepoint=False)
def audit_record(
    *,
    action: str,
    target: Any = None,
    target_type: str = "",
    target_id: str | int = "",
    target_label: str = "",
    actor=None,
    tenant=None,
    before: dict | None = None,
    after: dict | None = None,
    reason: str = "",
    chain_head: str | None = _READ_HEAD,
) -> AuditEvent:
    """Append one audit event; ``target`` (a model instance) fills type, id and label.

    ``chain_head``: the chain's newest hash as the caller read it, and the chain locked,
    in this transaction with ``audit_chain_head_locked_sql``: the lock and the read are
    then not made again."""
    if target is not None:
        target_type = target_type or target._meta.label_lower
        target_id = target_id or target.pk
        target_label = target_label or str(target)
    context = current_request_context()
    if chain_head is _READ_HEAD:
        _lock_chain()
        last = _chain_head_hash()
    else:
        last = chain_head
    actor_obj = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    event = AuditEvent(
        created_at=timezone.now(),
        actor=actor_obj,
        actor_label=actor_obj.get_username() if actor_obj else "system",
        action=action,
        target_type=target_type,
        target_id=str(target_id),
        target_label=str(target_label)[:255],
        tenant=tenant,
        before=before,
        after=after,
        reason=reason,
        source_address=context["source_address"],
        request_id=context["request_id"],
        prev_hash=last or GENESIS_HASH,
        hash_version=chain.KEYED,
    )
    event.hash = event.compute_hash()
    _INSERT.insert(event)
    return event


@dataclass(frozen=True)
class AuditInsertSql:
    """An audit event's insert as the tail of a statement that makes the audited change:
    ``sql`` is ``INSERT INTO <audit table> (...) SELECT ...`` and the caller appends the
    ``FROM`` that names ``id_sql`` and ``head_sql`` (see ``audit_insert_sql``)."""

    sql: str
    params: list


def audit_insert_sql(
    *,
    action: str,
    target_type: str,
    id_sql: str,
    target_label: tuple[str, str],
    head_sql: str,
    actor=None,
    tenant=None,
    after: dict | None = None,
) -> AuditInsertSql:
    """PostgreSQL: append one audit event in the same statement that creates its target,
    whose key only that statement knows. ``id_sql``: the SQL expression of the target's
    key (e.g. ``j.id``); ``target_label``: the label's text before and after the key;
    ``head_sql``: the chain's head read by ``audit_chain_head_locked_sql`` in that
    statement (NULL when the chain is empty). The event is hashed as ``audit_record``
    hashes it (``chain.event_hash``, the keyed version): the canonical payload is made
    here with markers where the key and the previous hash go, and the database fills
    them in and computes the HMAC-SHA256 with the audit key's pads (RFC 2104), so a
    submission needs no statement between its insert and its audit row."""
    label_head, label_tail = target_label
    if (
        len(label_head) + len(label_tail) + 20
        > AuditEvent._meta.get_field("target_label").max_length
    ):
        raise ValueError("the label could be cut short; use audit_record")
    context = current_request_context()
    actor_obj = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    marker = secrets.token_hex(16)
    key_marker, head_marker = f"<key {marker}>", f"<head {marker}>"
    event = AuditEvent(
        created_at=timezone.now(),
        actor=actor_obj,
        actor_label=actor_obj.get_username() if actor_obj else "system",
        action=action,
        target_type=target_type,
        target_id=key_marker,
        target_label=f"{label_head}{key_marker}{label_tail}",
        tenant=tenant,
        after=after,
        source_address=context["source_address"],
        request_id=context["request_id"],
        prev_hash=head_marker,
        hash_version=chain.KEYED,
    )
    # The payload is JSON text: the markers (ASCII, no character JSON escapes) appear in
    # it as they are, once for the previous hash and twice for the key.
    head_value = f"COALESCE({head_sql}, %s)"
    id_text = f"({id_sql})::text"
    pieces = re.split(
        f"({re.escape(key_marker)}|{re.escape(head_marker)})", chain.canonical_payload(event)
    )
    message_sql, message_params = [], []
    for piece in pieces:
        if piece == key_marker:
            message_sql.append(id_text)
        elif piece == head_marker:
            message_sql.append(head_value)
            message_params.append(GENESIS_HASH)
        elif piece:
            message_sql.append("%s")
            message_params.append(piece)
    inner_pad, outer_pad = _hmac_pads(chain.audit_key())
    message = f"convert_to({' || '.join(message_sql)}, 'UTF8')"
    hash_sql = f"encode(sha256(%s::bytea || sha256(%s::bytea || {message})), 'hex')"
    late = ("target_id", "target_label", "prev_hash", "hash")
    columns, values = _INSERT.columns_and_values(event, leave_out=late)
    quote = connection.ops.quote_name
    meta = AuditEvent._meta
    columns = [*columns, *(quote(meta.get_field(name).column) for name in late)]
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(columns)}) "
        f"SELECT {', '.join(['%s'] * len(values))}, {id_text}, %s || {id_text} || %s, "
        f"{head_value}, {hash_sql}"
    )
    params = [*values, label_head, label_tail, GENESIS_HASH, outer_pad, inner_pad, *message_params]
    return AuditInsertSql(sql, params)


@functools.lru_cache(maxsize=4)
def _hmac_pads(key: bytes) -> tuple[bytes, bytes]:
    """HMAC-SHA256's inner and outer padded keys (RFC 2104), as ``hmac.new`` makes them."""
    block = 64
    if len(key) > block:
        key = hashlib.sha256(key).digest()
    key = key.ljust(block, b"\0")
    return bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)


#: The event's insert, its statement built once (an audited submission is on the API's
#: hottest path). ``AuditEvent.save`` only refuses updates, which this is not.
_INSERT = ModelInsert(AuditEvent)


def _chain_head_hash() -> str | None:
    """The newest event's hash (read under the chain's lock)."""
    quote = connection.ops.quote_name
    table, id_, hash_ = (
        quote(AuditEvent._meta.db_table),
        quote(AuditEvent._meta.pk.column),
        quote(AuditEvent._meta.get_field("hash").column),
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {hash_} FROM {table} ORDER BY {id_} DESC LIMIT 1")
        row = cursor.fetchone()
    return row[0] if row else None


@dataclass
class _ChainWalk:
    checked: int = 0
    head: AuditEvent | None = None
    broken: AuditEvent | None = None
    why: str = ""
    # (position, hash) of each anchored event the walk met, by id.
    anchored_seen: dict[int, tuple[int, str]] = field(default_factory=dict)


def _walk_chain(anchored_ids: frozenset[int] = frozenset()) -> _ChainWalk:
    """Recompute every event's hash and link, oldest first; stop at the first broken one."""
    walk = _ChainWalk()
    prev = GENESIS_HASH
    keyed_seen = False
    last_plain = None
    for event in AuditEvent.objects.order_by("id").iterator(chunk_size=2000):
        walk.checked += 1
        if event.pk in anchored_ids:
            walk.anchored_seen[event.pk] = (walk.checked, event.hash)
        problem = ""
        if event.prev_hash != prev:
            problem = "prev_hash does not match the previous event's hash (deleted or reordered)"
        elif event.hash_version not in chain.HASH_VERSIONS:
            problem = f"unknown hash version {event.hash_version}"
        elif event.hash_version == chain.PLAIN and keyed_seen:
            problem = (
                "a plain-hash event after keyed ones (rewritten with the unkeyed hash function)"
            )
        elif event.compute_hash() != event.hash:
            problem = (
                "content does not match its hash (changed after it was written, "
                "or hashed without the server's audit key)"
            )
        if problem:
            walk.broken, walk.why = event, problem
            return walk
        if event.hash_version == chain.PLAIN:
            last_plain = event
        else:
            keyed_seen = True
        walk.head = event
        prev = event.hash
    if last_plain is not None and not keyed_seen:
        # Migration 0004 seals plain events with a keyed one; a log of plain events only
        # was written (or rewritten) by someone without the audit key.
        walk.broken = last_plain
        walk.why = (
            "the log ends with plain-hash events that no keyed event seals "
            "(rewritten with the unkeyed hash function)"
        )
    return walk


def audit_verify_chain() -> tuple[int, AuditEvent | None, str]:
    """Recompute the chain. Returns (events checked, first broken event or None, what broke)."""
    walk = _walk_chain()
    return walk.checked, walk.broken, walk.why


@dataclass
class AuditVerification:
    """The outcome of one ``audit_verify`` run."""

    verified_at: datetime
    checked: int = 0
    head: AuditEvent | None = None
    broken: AuditEvent | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    anchor_before: Anchor | None = None
    anchor_written: Anchor | None = None
    # The same for the copy (SLUICE_AUDIT_ANCHOR_COPY), when one is kept.
    anchor_copy_before: Anchor | None = None
    anchor_copy_written: Anchor | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        """A JSON-safe summary (kept in the cache for the audit page)."""
        return {
            "ok": self.ok,
            "verified_at": self.verified_at.isoformat(),
            "checked": self.checked,
            "head_id": self.head.pk if self.head else None,
            "broken_id": self.broken.pk if self.broken else None,
            "problems": list(self.problems),
            "notes": list(self.notes),
            "anchor_id": (self.anchor_written or self.anchor_before).last_id
            if (self.anchor_written or self.anchor_before)
            else None,
        }


def _anchor_problems(anchor: Anchor, walk: _ChainWalk) -> list[str]:
    """What the anchor says was there and is not any more."""
    if anchor.count == 0:
        return []  # the empty log's start: every log extends it
    head_id = walk.head.pk if walk.head else None
    seen = walk.anchored_seen.get(anchor.last_id)
    if seen is None:
        if walk.broken is not None and walk.broken.pk <= anchor.last_id:
            return []  # the walk stopped before reaching it; the chain problem says why
        if walk.broken is None and (head_id is None or head_id < anchor.last_id):
            return [
                f"events deleted after the anchor: the log now ends at "
                f"{'event ' + str(head_id) if head_id else 'nothing'} ({walk.checked} events), "
                f"but {anchor.describe()} was there"
            ]
        return [f"the anchored event {anchor.last_id} is gone: {anchor.describe()} was there"]
    position, stored_hash = seen
    problems = []
    if stored_hash != anchor.hash:
        problems.append(f"the anchored event {anchor.last_id} was replaced (its hash changed)")
    if position != anchor.count:
        problems.append(
            f"{position} events up to event {anchor.last_id}, but the anchor counted "
            f"{anchor.count}: events before it were deleted or inserted"
        )
    return problems


def _read_anchor(path: Path) -> tuple[Anchor | None, str]:
    try:
        return anchor_read(path), ""
    except AnchorError as exc:
        return None, str(exc)


def _same_head(a: Anchor, b: Anchor) -> bool:
    return (a.last_id, a.count, a.hash) == (b.last_id, b.count, b.hash)


def _missing_anchor_problems(result: AuditVerification, walk: _ChainWalk) -> list[str]:
    """A log that has events (or had: its ids were used) must have an anchor; the copy and
    the file must both be there when a copy is kept."""
    primary, copy, copy_path = result.anchor_before, result.anchor_copy_before, anchor_copy_path()
    reset_hint = (
        "look into it (restore the events and the anchor from a backup), then accept the log "
        'as it is with "manage.py audit_verify --reset-anchor REASON"'
    )
    if primary is None and copy is not None:
        return [
            f"the anchor file {anchor_path()} is missing but its copy {copy_path} holds "
            f"{copy.describe()}: the file was deleted or replaced; {reset_hint}"
        ]
    if primary is not None:
        return []
    if walk.checked:
        return [
            f"no anchor for a log of {walk.checked} events: the anchor file {anchor_path()} "
            "is missing (deleted, perhaps with the newest events, or this log was never "
            f"verified); {reset_hint}"
        ]
    used = highest_id_ever_used(connection)
    if used:
        return [
            f"the log is empty and has no anchor, but event ids up to {used} were used: "
            f"events and the anchor file {anchor_path()} were deleted; {reset_hint}"
        ]
    return []  # a new log: anchored at its start below


def audit_verify(*, update_anchor: bool = True, reset_anchor_reason: str = "") -> AuditVerification:
    """Verify the whole log and move the anchor to the verified head.

    Checks the hash chain (every event, oldest first), the anchor file and its copy (the
    anchored event is still there with the same hash and position; an anchor exists at all
    unless the log never held an event), and the database's append-only guard. The anchor
    moves only when everything passed. ``reset_anchor_reason`` accepts the current log as
    the new reference after an operator looked into a reported anchor problem; the reset is
    itself an audit event. The outcome is also kept for the audit page.
    """
    result = AuditVerification(verified_at=timezone.now())
    copy_path = anchor_copy_path()
    result.anchor_before, file_error = _read_anchor(anchor_path())
    copy_error = ""
    if copy_path is not None:
        result.anchor_copy_before, copy_error = _read_anchor(copy_path)
        copy_error = copy_error and f"the anchor copy: {copy_error}"
    if reset_anchor_reason:
        audit_record(
            action="audit.anchor_reset",
            target_type="audit.anchor",
            target_label=str(anchor_path()),  # audit_record cuts it to the label's 255
            before={
                "anchor": file_error or _anchor_dict(result.anchor_before),
                "copy": copy_error or _anchor_dict(result.anchor_copy_before),
            },
            reason=reset_anchor_reason,
        )
        result.notes.append("anchor reset: the log as it is now becomes the reference")
        result.anchor_before = result.anchor_copy_before = None
    else:
        result.problems.extend(error for error in (file_error, copy_error) if error)

    anchors = [
        (label, anchor)
        for label, anchor in (
            ("", result.anchor_before),
            ("the anchor copy: ", result.anchor_copy_before),
        )
        if anchor is not None
    ]
    walk = _walk_chain(frozenset(anchor.last_id for _, anchor in anchors))
    result.checked, result.head, result.broken = walk.checked, walk.head, walk.broken
    if walk.broken is not None:
        result.problems.append(
            f"Audit chain broken at event {walk.broken.pk} "
            f"({walk.broken.created_at:%Y-%m-%d %H:%M:%S}, {walk.broken.action}): {walk.why}"
        )
    for label, anchor in anchors:
        result.problems.extend(label + problem for problem in _anchor_problems(anchor, walk))
    primary, copy = result.anchor_before, result.anchor_copy_before
    if primary and copy and primary.last_id == copy.last_id and not _same_head(primary, copy):
        result.problems.append(
            f"the anchor file and its copy disagree: the file holds {primary.describe()}, "
            f"the copy {copy.describe()}"
        )
    if not reset_anchor_reason and not file_error and not copy_error:
        result.problems.extend(_missing_anchor_problems(result, walk))
    missing = append_only_guard_missing(connection)
    if missing:
        result.problems.append(
            "the database's append-only guard is missing or disabled "
            f"(trigger {', '.join(missing)}); run manage.py migrate to restore it, and find out "
            "who removed it"
        )

    if result.ok and (update_anchor or reset_anchor_reason):
        _anchor_move(result, reset=bool(reset_anchor_reason))
    cache.set(LAST_VERIFICATION_CACHE_KEY, result.as_dict(), timeout=None)
    return result


def _anchor_dict(anchor: Anchor | None) -> dict | None:
    if anchor is None:
        return None
    return {"last_id": anchor.last_id, "count": anchor.count, "hash": anchor.hash}


def _anchor_move(result: AuditVerification, *, reset: bool) -> None:
    verified_at = result.verified_at.isoformat(timespec="seconds")
    if result.head is None:
        if result.anchor_before is not None and not reset:
            result.notes.append("the log is empty")
            return
        anchor = Anchor.genesis(verified_at)
        result.notes.append("a new, empty log: anchored at its start")
    else:
        anchor = Anchor(
            last_id=result.head.pk,
            count=result.checked,
            hash=result.head.hash,
            verified_at=verified_at,
        )
    if _anchor_write_forward(anchor, anchor_path(), reset=reset):
        result.anchor_written = anchor
    copy_path = anchor_copy_path()
    if copy_path is None:
        return
    if result.anchor_copy_before is None and not reset:
        result.notes.append(f"no anchor copy yet: writing it to {copy_path}")
    try:
        if _anchor_write_forward(anchor, copy_path, reset=reset):
            result.anchor_copy_written = anchor
    except OSError as exc:
        # A copy that this account may not write is kept by a verification run elsewhere
        # (e.g. as root); this run still checked the log against it.
        result.notes.append(f"the anchor copy {copy_path} was not updated: {exc}")


def _anchor_write_forward(anchor: Anchor, path: Path, *, reset: bool) -> bool:
    """Write ``anchor`` to ``path`` unless another run anchored further meanwhile: an anchor
    never moves back (except on a reset)."""
    if not reset:
        try:
            current = anchor_read(path)
        except AnchorError:
            current = None
        if current is not None and current.count > anchor.count:
            return False
    anchor_write(anchor, path)
    return True


def audit_anchor_new_log() -> Anchor | None:
    """Anchor a log that never held an event at its start (after ``migrate``), so that from
    the first event on a missing anchor is reported. Does nothing where an anchor exists or
    the log has (or had) events."""
    if AuditEvent.objects.exists() or highest_id_ever_used(connection):
        return None
    try:
        if anchor_read() is not None:
            return None
    except AnchorError:
        return None
    anchor = Anchor.genesis(timezone.now().isoformat(timespec="seconds"))
    anchor_write(anchor)
    copy_path = anchor_copy_path()
    if copy_path is not None:
        try:
            if anchor_read(copy_path) is None:
                anchor_write(anchor, copy_path)
        except (AnchorError, OSError) as exc:
            log.warning("audit anchor copy %s not written: %s", copy_path, exc)
    return anchor


def audit_last_verification() -> dict | None:
    """The last ``audit_verify`` outcome (see ``AuditVerification.as_dict``), if known."""
    return cache.get(LAST_VERIFICATION_CACHE_KEY)


def snapshot_fields(obj, fields: list[str]) -> dict:
    """A JSON-safe dict of some fields of a model instance, for before/after."""
    out = {}
    for name in fields:
        value = getattr(obj, name)
        if hasattr(value, "pk"):
            value = value.pk
        elif hasattr(value, "isoformat"):
            value = value.isoformat()
        elif isinstance(value, (list, tuple)):
            value = list(value)
        out[name] = value
    return out
