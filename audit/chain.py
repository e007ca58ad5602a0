"""How an audit event is hashed, and the server key that makes the hash unforgeable.

Two hash versions live in one chain:

- ``PLAIN`` (1): SHA-256 of the canonical payload. Events written before the keyed hash
  existed. Anyone who can write the database can recompute it, so a chain of plain hashes
  shows accidents, not forgery.
- ``KEYED`` (2): HMAC-SHA256 of the canonical payload (which also names the version), keyed
  with the audit key. The key is a setting, never stored in the database, so write access to
  the database alone cannot produce a valid event.

Plain events may only come first, and the first keyed event after them (the seal written by
migration 0004) covers the last plain hash, so the plain prefix cannot be rewritten either.

These functions take any object with the event's fields (the model, or the historical model
in a migration), so the migration that writes the seal hashes exactly as the app does.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from django.conf import settings

PLAIN = 1
KEYED = 2
HASH_VERSIONS = (PLAIN, KEYED)
GENESIS_HASH = "0" * 64
# Domain separation: the key derived from SECRET_KEY is used for nothing else.
_KEY_DERIVATION_LABEL = b"sluice.audit.chain-key.v1"


def audit_key() -> bytes:
    """The audit chain's key: ``SLUICE_AUDIT_KEY``, else derived from ``SECRET_KEY``."""
    configured = getattr(settings, "SLUICE_AUDIT_KEY", "")
    if configured:
        return configured.encode()
    return hmac.new(settings.SECRET_KEY.encode(), _KEY_DERIVATION_LABEL, hashlib.sha256).digest()


def canonical_payload(event: Any) -> str:
    """The exact text the hash covers (stable key order, ISO time, ids not objects).

    The plain version's payload is the one events were always hashed with; the keyed version
    adds ``hash_version`` so an event cannot be relabelled from one version to the other.
    """
    data = {
        "created_at": event.created_at.isoformat(timespec="microseconds"),
        "actor": event.actor_id,
        "actor_label": event.actor_label,
        "action": event.action,
        "target_type": event.target_type,
        "target_id": event.target_id,
        "target_label": event.target_label,
        "tenant": event.tenant_id,
        "before": event.before,
        "after": event.after,
        "reason": event.reason,
        "source_address": event.source_address,
        "request_id": event.request_id,
        "prev_hash": event.prev_hash,
    }
    if event.hash_version != PLAIN:
        data["hash_version"] = event.hash_version
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


def event_hash(event: Any) -> str:
    """The hash ``event`` must carry, by its ``hash_version``."""
    payload = canonical_payload(event).encode()
    if event.hash_version == PLAIN:
        return hashlib.sha256(payload).hexdigest()
    if event.hash_version == KEYED:
        return hmac.new(audit_key(), payload, hashlib.sha256).hexdigest()
    raise ValueError(f"unknown audit hash version {event.hash_version!r}")


def sign(label: str, data: dict) -> str:
    """An HMAC with the audit key over ``data`` (for things kept outside the database)."""
    message = label.encode() + b"\n" + json.dumps(data, sort_keys=True).encode()
    return hmac.new(audit_key(), message, hashlib.sha256).hexdigest()


def signature_matches(label: str, data: dict, signature: str) -> bool:
    return hmac.compare_digest(sign(label, data), signature)
