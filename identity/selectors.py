"""Reads for directory identities."""

from __future__ import annotations

from .models import DirectoryIdentity


def unix_accounts_of(user_ids) -> dict[int, str]:
    """The Unix account the directory gives each of these users (those that have one)."""
    return dict(
        DirectoryIdentity.objects.filter(user_id__in=list(user_ids))
        .exclude(unix_account="")
        .values_list("user_id", "unix_account")
    )


def directory_identity_of(user) -> DirectoryIdentity | None:
    if user is None or not getattr(user, "pk", None):
        return None
    return DirectoryIdentity.objects.filter(user=user).first()
