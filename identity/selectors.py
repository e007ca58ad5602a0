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


def unix_user_names(user_ids) -> dict[int, str]:
    """The name ``{user}`` stands for in ``SLUICE_JOB_ACCOUNT``, per user: the Unix account
    the directory gives them (a claim, LDAP ``uid``), else their Sluice user name. Never
    anything a user typed: directory users cannot change either."""
    from django.contrib.auth import get_user_model

    ids = list(user_ids)
    names = dict(get_user_model().objects.filter(pk__in=ids).values_list("pk", "username"))
    names.update(unix_accounts_of(ids))
    return names


def unix_user_name(user) -> str:
    """``unix_user_names`` for one user already read (one query)."""
    return unix_accounts_of([user.pk]).get(user.pk, user.get_username())
