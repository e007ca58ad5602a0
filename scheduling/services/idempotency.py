"""``Idempotency-Key`` on job submission: a client that retries a submission with the same
key gets the first answer again, and no second job.

As Stripe and the IETF draft (draft-ietf-httpapi-idempotency-key-header) do it:

- the key is the client's (one per user; another user's same key is another key), 1 to
  255 printable ASCII characters, kept :data:`IDEMPOTENCY_KEY_TTL` (24 h);
- a retry with the same key and the same request answers the stored status (201) and
  body, with the header ``Idempotent-Replayed: true``;
- the same key with another request (another body or the other submission endpoint) is
  refused with 422: the key would otherwise hide a request the client did not mean to drop;
- only a submission that succeeded is stored: the key row is written in the transaction
  that creates the jobs, so a refused submission (bad input, quota, rights) leaves nothing
  and its retry is handled afresh;
- concurrent requests with one key: the unique constraint lets one create the jobs; the
  other waits on it (PostgreSQL) and then answers the stored response.

Expired keys are deleted when the same key comes again, and all of them at most once an
hour by whichever submission comes first (:func:`idempotency_keys_expire`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.errors import BusinessError

from ..models import IdempotencyKey

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
IDEMPOTENCY_KEY_TTL = timedelta(hours=24)
MAX_KEY_LENGTH = 255
#: Printable ASCII, no space at either end (HTTP strips them anyway).
_KEY_RE = re.compile(r"^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$")
_EXPIRE_KEY = "sluice:idempotency-keys-expire"
_EXPIRE_EVERY_SECONDS = 3600


class IdempotencyKeyReused(BusinessError):
    """The key was used for another request (422, as the IETF draft says)."""

    status_code = 422

    def __init__(self, message: str) -> None:
        super().__init__(message, code="idempotency_key_reused", field=HEADER)


class IdempotencyKeyInFlight(BusinessError):
    """A request with this key is still being handled (409: retry it a little later)."""

    status_code = 409

    def __init__(self) -> None:
        super().__init__(
            "A request with this Idempotency-Key is being handled; retry it shortly.",
            code="idempotency_key_in_flight",
            field=HEADER,
        )


@dataclass(frozen=True)
class Answer:
    """What a submission answers: status, body, and whether it is a stored answer."""

    status_code: int
    body: Any
    replayed: bool = False


def idempotency_key_parse(value: str | None) -> str | None:
    """The header's key, or None without one; a key that cannot be one is a 400."""
    if value is None:
        return None
    if len(value) > MAX_KEY_LENGTH:
        raise BusinessError(
            f"{HEADER} must be at most {MAX_KEY_LENGTH} characters.",
            code="invalid_idempotency_key",
            field=HEADER,
        )
    if not _KEY_RE.match(value):
        raise BusinessError(
            f"{HEADER} must be 1 to {MAX_KEY_LENGTH} printable ASCII characters.",
            code="invalid_idempotency_key",
            field=HEADER,
        )
    return value


def request_fingerprint(endpoint: str, data: Any) -> str:
    """SHA-256 of the endpoint and the request body (keys sorted: the same JSON object
    written in another order is the same request)."""
    if hasattr(data, "lists"):  # a QueryDict (form input)
        data = dict(data.lists())
    text = json.dumps(
        [endpoint, data], sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False
    )
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


def job_submit_idempotent(
    *, user, key: str | None, endpoint: str, data: Any, submit: Callable[[], Answer]
) -> Answer:
    """Run ``submit`` once per (user, key): the first time, store its answer with the
    jobs it created (one transaction); afterwards answer the stored one (see the module)."""
    if key is None:
        return submit()
    now = timezone.now()
    _expire_now_and_then(now)
    fingerprint = request_fingerprint(endpoint, data)
    stored = _stored(user, key, now)
    if stored is not None:
        return _replay(stored, endpoint, fingerprint)
    with transaction.atomic():
        IdempotencyKey.objects.filter(user=user, key=key, expires_at__lte=now).delete()
        try:
            with transaction.atomic():
                # Claimed before the work: a concurrent request with the key waits here.
                row = IdempotencyKey.objects.create(
                    user=user,
                    key=key,
                    endpoint=endpoint,
                    request_hash=fingerprint,
                    status_code=0,
                    response={},
                    created_at=now,
                    expires_at=now + IDEMPOTENCY_KEY_TTL,
                )
        except IntegrityError:
            stored = _stored(user, key, now)
            if stored is None:
                raise IdempotencyKeyInFlight() from None
            return _replay(stored, endpoint, fingerprint)
        answer = submit()
        # As it will be read back (JSON), so that the first answer and a replay are alike.
        body = json.loads(json.dumps(answer.body, cls=DjangoJSONEncoder))
        row.status_code, row.response = answer.status_code, body
        row.save(update_fields=["status_code", "response"])
    return Answer(answer.status_code, body)


def _stored(user, key: str, now: datetime) -> IdempotencyKey | None:
    return IdempotencyKey.objects.filter(user=user, key=key, expires_at__gt=now).first()


def _replay(stored: IdempotencyKey, endpoint: str, fingerprint: str) -> Answer:
    if stored.endpoint != endpoint or stored.request_hash != fingerprint:
        raise IdempotencyKeyReused(
            f"This {HEADER} was used for another request "
            f"({stored.created_at:%Y-%m-%d %H:%M:%S} UTC); use a new key for a new request."
        )
    if not stored.status_code:
        raise IdempotencyKeyInFlight()
    return Answer(stored.status_code, stored.response, replayed=True)


def idempotency_keys_expire(now: datetime | None = None) -> int:
    """Delete the keys past their expiry; returns how many."""
    now = now or timezone.now()
    deleted, _ = IdempotencyKey.objects.filter(expires_at__lte=now).delete()
    return deleted


def _expire_now_and_then(now: datetime) -> None:
    if cache.add(_EXPIRE_KEY, 1, timeout=_EXPIRE_EVERY_SECONDS):
        idempotency_keys_expire(now)
