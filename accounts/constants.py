"""Audit actions and the token lifetime settings, read in one place."""

from datetime import timedelta

from django.conf import settings

ACTION_TOKEN_CREATE = "token.create"
ACTION_TOKEN_REVOKE = "token.revoke"
ACTION_LOCKOUT = "auth.lockout"

# last_used_at is written at most this often per token, so that a busy client does not
# turn every API call into a database write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def token_default_days() -> int:
    return settings.SLUICE_API_TOKEN_DAYS


def token_max_days() -> int:
    return settings.SLUICE_API_TOKEN_MAX_DAYS
