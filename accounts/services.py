"""Writes of API tokens and sign-in lockouts. Each audited in its own transaction."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import transaction

from audit.services import audit_record
from portal.errors import BusinessError, PermissionDeniedError

from .constants import (
    ACTION_LOCKOUT,
    ACTION_TOKEN_CREATE,
    ACTION_TOKEN_REVOKE,
    token_default_days,
    token_max_days,
)
from .models import ApiToken
from .selectors import is_platform_admin

log = logging.getLogger(__name__)

NAME_MAX_LENGTH = ApiToken._meta.get_field("name").max_length


def _token_snapshot(token: ApiToken) -> dict:
    return {
        "id": token.pk,
        "user": token.user.get_username(),
        "name": token.name,
        "prefix": token.prefix,
        "created": token.created.isoformat() if token.created else None,
        "expiry": token.expiry.isoformat() if token.expiry else None,
    }


@transaction.atomic
def api_token_create(
    *, user, name: str, expires_in_days: int | None = None
) -> tuple[ApiToken, str]:
    """Make an API token for ``user``; returns the row and the key, which is never stored.

    The token expires after ``expires_in_days`` (default ``SLUICE_API_TOKEN_DAYS``, at most
    ``SLUICE_API_TOKEN_MAX_DAYS``). Tokens are personal: nobody makes one for someone else.
    """
    if not user or not user.is_authenticated or not user.is_active:
        raise PermissionDeniedError("Only active users may have API tokens.")
    name = (name or "").strip()
    if not name:
        raise BusinessError("Give the token a name, e.g. where it is used.", field="name")
    if len(name) > NAME_MAX_LENGTH:
        raise BusinessError(f"The name is at most {NAME_MAX_LENGTH} characters long.", field="name")
    days = token_default_days() if expires_in_days is None else expires_in_days
    if not 1 <= days <= token_max_days():
        raise BusinessError(
            f"A token lasts between 1 and {token_max_days()} days.", field="expires_in_days"
        )
    token, key = ApiToken.objects.create(user=user, expiry=timedelta(days=days), name=name)
    audit_record(
        action=ACTION_TOKEN_CREATE,
        target=token,
        target_label=f"{name} ({token.prefix}…)",
        actor=user,
        after=_token_snapshot(token),
    )
    return token, key


@transaction.atomic
def api_token_revoke(*, actor, token: ApiToken, reason: str = "") -> None:
    """Revoke a token: it stops working at once. Its owner or a platform admin may do this;
    ``actor=None`` is the system itself (a directory sync disabling a leaver)."""
    if (
        actor is not None
        and token.user_id != getattr(actor, "pk", None)
        and not is_platform_admin(actor)
    ):
        raise PermissionDeniedError("Only the token's owner or a platform admin may revoke it.")
    before = _token_snapshot(token)
    label = f"{token.name} ({token.prefix}…)"
    token_id = token.pk
    token.delete()
    audit_record(
        action=ACTION_TOKEN_REVOKE,
        target_type=ApiToken._meta.label_lower,
        target_id=token_id,
        target_label=label,
        actor=actor,
        before=before,
        reason=reason,
    )


@transaction.atomic
def api_tokens_revoke_all(*, actor, user, reason: str) -> int:
    """Revoke every token of ``user`` (deactivation); one audit event per token."""
    tokens = list(ApiToken.objects.select_related("user").filter(user=user).order_by("id"))
    for token in tokens:
        api_token_revoke(actor=actor, token=token, reason=reason)
    return len(tokens)


@transaction.atomic
def sign_in_lockout_record(*, username: str, failures: int, locked_until: datetime | None) -> None:
    """Audit that an account was locked after too many failed sign-ins.

    Only the lockout is audited, not each failure (those are in axes' own table): a row
    per failure would let anyone flood the audit log. Names that are no account are
    logged, not audited, for the same reason.
    """
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        log.warning("Sign-in lockout for %r, which is no account", username)
        return
    audit_record(
        action=ACTION_LOCKOUT,
        target=user,
        target_label=user.get_username(),
        after={
            "failures": failures,
            "locked_until": locked_until.isoformat() if locked_until else None,
        },
        reason="Too many failed sign-ins",
    )


def api_tokens_expired_delete(*, now: datetime) -> int:
    """Delete the tokens past their expiry (refused already; the hourly sweep's tidy-up)."""
    deleted, _ = ApiToken.objects.filter(expiry__lt=now).delete()
    return deleted
