"""Reads of API tokens, always scoped to the user asking.

``accounts`` sits below ``tenants`` (DESIGN §3): it imports nothing of ``tenants``
when loaded; who is a platform admin is read from ``tenants.scoping`` when a read runs.
"""

from __future__ import annotations

from django.db.models import Q, QuerySet
from django.utils import timezone

from portal.errors import NotFoundError

from .models import ApiToken


def is_platform_admin(user) -> bool:
    """The one rule (``tenants.scoping``), imported where it runs: this package loads below
    ``tenants``."""
    from tenants.scoping import is_platform_admin as rule

    return rule(user)


def api_tokens_visible_to(user) -> QuerySet[ApiToken]:
    """Everyone sees their own tokens; platform admins see every user's. Expired tokens
    no longer count (knox deletes them when they are next presented)."""
    qs = ApiToken.objects.select_related("user").filter(
        Q(expiry__isnull=True) | Q(expiry__gt=timezone.now())
    )
    if is_platform_admin(user):
        return qs
    if not user or not user.is_authenticated or not user.is_active:
        return qs.none()
    return qs.filter(user=user)


def api_tokens_of(user) -> QuerySet[ApiToken]:
    """The user's own tokens, newest first (the token page and ``GET /auth/tokens``)."""
    if not user or not user.is_authenticated:
        return ApiToken.objects.none()
    return api_tokens_visible_to(user).filter(user=user)


def api_token_get(user, pk) -> ApiToken:
    """One token the user may see; another user's token is "not found" (404)."""
    try:
        return api_tokens_visible_to(user).get(pk=pk)
    except (ApiToken.DoesNotExist, ValueError, TypeError):
        raise NotFoundError("API token not found.") from None
