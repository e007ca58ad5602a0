"""The one tenant-scoping rule: which rows of a tenant-owned model a user may read.

Every ``*_visible_to`` selector narrows its queryset with :func:`restrict` (NetBox's
``restrict(user, action)``), so the rule is written once:

- an anonymous or deactivated user sees nothing;
- a platform admin (an active staff user) sees every row, of every tenant, active or not;
- anyone else sees the rows of the *active* tenants they hold a membership in, with at
  least the role the action needs (``view``: viewer, ``change``: member, ``admin``: admin).
  Rows of no tenant (platform objects such as a zombie's reclaim record) are the
  platform's: only platform admins see them.

The check is a subquery on the memberships, so a scoped list costs no extra query.
"""

from __future__ import annotations

from django.db.models import QuerySet

from portal.errors import NotFoundError, PermissionDeniedError

from .choices import ROLE_RANK, Role

#: The least role each action needs.
ACTION_ROLE = {"view": Role.VIEWER, "change": Role.MEMBER, "admin": Role.ADMIN}


def is_active_user(user) -> bool:
    """A signed-in, active account (anonymous and deactivated users read nothing)."""
    return bool(user and user.is_authenticated and user.is_active)


def is_platform_admin(user) -> bool:
    """Platform admins are active staff users: they read every tenant's rows."""
    return is_active_user(user) and bool(user.is_staff)


def roles_for(action: str) -> list[str]:
    """The roles that may take ``action`` (every role at least as high as it needs)."""
    least = ROLE_RANK[ACTION_ROLE[action]]
    return [role.value for role in Role if ROLE_RANK[role] >= least]


def _roles(user) -> dict[int, str]:
    """{tenant id: role} of the user's memberships (active tenants or not), read once per
    request (cached on the user object, which each request loads afresh)."""
    cache = getattr(user, "_sluice_roles", None)
    if cache is None:
        from .models import Membership

        cache = dict(Membership.objects.filter(user=user).values_list("tenant_id", "role"))
        user._sluice_roles = cache
    return cache


def role_in(user, tenant) -> str | None:
    """The user's role in the tenant (an instance or an id), or None."""
    if not user or not user.is_authenticated:
        return None
    return _roles(user).get(getattr(tenant, "pk", tenant))


def member_tenant_ids(user) -> list[int]:
    """The ids of the tenants the user is a member of (any role; active or not), from the
    roles cached on the user; none for an anonymous user."""
    if not user or not user.is_authenticated:
        return []
    return list(_roles(user))


def has_role(user, tenant, role: str) -> bool:
    """Platform admins have every role; others need a membership of at least ``role``."""
    if is_platform_admin(user):
        return True
    actual = role_in(user, tenant)
    return actual is not None and ROLE_RANK[Role(actual)] >= ROLE_RANK[Role(role)]


def require_role(user, tenant, role: str, *, not_found: str, denied: str = "") -> None:
    """The rule of a write on a tenant's object: someone who cannot read the tenant's rows
    is told the object does not exist (``NotFoundError(not_found)``: 404, as the reads
    hide it); a member below ``role`` is refused (``PermissionDeniedError(denied)``: 403)."""
    if not has_role(user, tenant, Role.VIEWER):
        raise NotFoundError(not_found)
    if not has_role(user, tenant, role):
        raise PermissionDeniedError(denied)


def tenant_ids_for(user, action: str = "view") -> QuerySet:
    """The ids of the active tenants ``user`` holds a membership in that allows ``action``,
    as a subquery (``values("tenant_id")``). By membership only: platform rights aside."""
    from .models import Membership

    if not is_active_user(user):
        return Membership.objects.none().values("tenant_id")
    return Membership.objects.filter(
        user=user, role__in=roles_for(action), tenant__active=True
    ).values("tenant_id")


def administers_any_tenant(user) -> bool:
    """Platform admins, and admins of at least one active tenant: who reads the audit log,
    the approvals inbox and the recommendations (each then scoped to their tenants)."""
    return is_platform_admin(user) or tenant_ids_for(user, "admin").exists()


def restrict(
    qs: QuerySet,
    user,
    action: str = "view",
    tenant_field: str | None = "tenant",
    *,
    cached_roles: bool = False,
    tenants_named: bool = False,
) -> QuerySet:
    """``qs`` narrowed to the rows ``user`` may ``action`` (see the module's docstring).

    ``tenant_field`` is the path from the model to its tenant (``"job__tenant"`` for a row
    owned through its job); ``None`` when ``qs`` is of tenants themselves.

    ``cached_roles``: take the user's tenants from the roles cached on the user (one query
    per request, shared with the permission checks that read them anyway) instead of a
    subquery, for the reads of one row on a path whose query count is fixed.

    ``tenants_named``: read the user's tenants first (one query) and name them in the
    query, with no subquery and no join: for lists of a table with a million rows, where
    PostgreSQL then reads one tenant's rows in index order (a subquery's tenants are not
    known when it plans; a join on the tenants for ``active`` costs a loop per row).
    """
    if action not in ACTION_ROLE:
        raise ValueError(f"Unknown action {action!r}: one of {', '.join(ACTION_ROLE)}.")
    if is_platform_admin(user):
        return qs
    if not is_active_user(user):
        return qs.none()
    prefix = "" if tenant_field is None else f"{tenant_field}__"
    key = "pk" if tenant_field is None else f"{tenant_field}_id"
    if tenants_named:
        named = sorted(row["tenant_id"] for row in tenant_ids_for(user, action))
        return qs.filter(**{f"{key}__in": named}) if named else qs.none()
    if not cached_roles:
        return qs.filter(**{f"{key}__in": tenant_ids_for(user, action)})
    allowed = set(roles_for(action))
    ids = [tenant_id for tenant_id, role in _roles(user).items() if role in allowed]
    if not ids:
        return qs.none()
    return qs.filter(**{f"{key}__in": ids, f"{prefix}active": True})
