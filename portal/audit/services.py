"""Writing audit events. Call inside the transaction that makes the audited change."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from portal.middleware import current_request_context

from .models import AuditEvent

GENESIS_HASH = "0" * 64
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


@transaction.atomic
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
) -> AuditEvent:
    """Append one audit event; ``target`` (a model instance) fills type, id and label."""
    if target is not None:
        target_type = target_type or target._meta.label_lower
        target_id = target_id or target.pk
        target_label = target_label or str(target)
    context = current_request_context()
    _lock_chain()
    last = AuditEvent.objects.order_by("-id").values_list("hash", flat=True).first()
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
    )
    event.hash = event.compute_hash()
    event.save()
    return event


def audit_verify_chain() -> tuple[int, AuditEvent | None, str]:
    """Recompute the chain. Returns (events checked, first broken event or None, what broke)."""
    prev = GENESIS_HASH
    checked = 0
    for event in AuditEvent.objects.order_by("id").iterator(chunk_size=2000):
        checked += 1
        if event.prev_hash != prev:
            return (
                checked,
                event,
                "prev_hash does not match the previous event's hash (deleted or reordered)",
            )
        if event.compute_hash() != event.hash:
            return checked, event, "content does not match its hash (changed after it was written)"
        prev = event.hash
    return checked, None, ""


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
