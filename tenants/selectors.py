"""Reads, always scoped to the user asking. Objects outside a user's tenants do not exist for them."""

from __future__ import annotations

import hashlib
import re

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from portal.errors import NotFoundError

from .choices import ROLE_RANK, Role
from .models import Membership, Project, Tenant

User = get_user_model()


def is_platform_admin(user) -> bool:
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


def tenants_visible_to(user) -> QuerySet[Tenant]:
    if is_platform_admin(user):
        return Tenant.objects.all()
    if not user or not user.is_authenticated:
        return Tenant.objects.none()
    return Tenant.objects.filter(memberships__user=user, active=True).distinct()


def tenant_get(user, slug: str) -> Tenant:
    tenant = tenants_visible_to(user).filter(slug=slug).first()
    if tenant is None:
        raise NotFoundError("Tenant not found.")
    return tenant


def projects_visible_to(user) -> QuerySet[Project]:
    qs = Project.objects.select_related("tenant")
    if is_platform_admin(user):
        return qs
    if not user or not user.is_authenticated:
        return qs.none()
    return qs.filter(tenant__memberships__user=user, tenant__active=True)


def project_get_visible(user, project_id: int) -> Project | None:
    """``projects_visible_to(user).filter(pk=project_id).first()``, cheaper for one id: the
    user's tenants come from the roles cached on the user (``role_in``; the submission's
    checks read them anyway) instead of a join on the memberships, and no ordering."""
    qs = Project.objects.select_related("tenant").filter(pk=project_id)
    if not is_platform_admin(user):
        if not user or not user.is_authenticated:
            return None
        tenant_ids = member_tenant_ids(user)
        if not tenant_ids:
            return None
        qs = qs.filter(tenant_id__in=tenant_ids, tenant__active=True)
    rows = list(qs.order_by()[:1])
    return rows[0] if rows else None


def memberships_of_tenant(user, tenant: Tenant) -> QuerySet[Membership]:
    if not (is_platform_admin(user) or role_in(user, tenant)):
        return Membership.objects.none()
    return Membership.objects.filter(tenant=tenant).select_related("user", "tenant")


def role_in(user, tenant: Tenant) -> str | None:
    """The user's role in the tenant, or None. Cached per request on the user object."""
    if not user or not user.is_authenticated:
        return None
    return _roles(user).get(tenant.pk if isinstance(tenant, Tenant) else tenant)


def member_tenant_ids(user) -> list[int]:
    """The ids of the tenants the user is a member of (any role; active or not), from the
    roles cached on the user; none for an anonymous user."""
    if not user or not user.is_authenticated:
        return []
    return list(_roles(user))


def _roles(user) -> dict[int, str]:
    """{tenant id: role} of the user's memberships, read once per request (cached on the
    user object, which each request loads afresh)."""
    cache = getattr(user, "_sluice_roles", None)
    if cache is None:
        cache = dict(Membership.objects.filter(user=user).values_list("tenant_id", "role"))
        user._sluice_roles = cache
    return cache


def has_role(user, tenant: Tenant | int, role: str) -> bool:
    """Platform admins have every role; others need a membership of at least ``role``."""
    if is_platform_admin(user):
        return True
    actual = role_in(user, tenant)
    return actual is not None and ROLE_RANK[Role(actual)] >= ROLE_RANK[Role(role)]


def can_submit_to_project(user, project: Project) -> bool:
    """Members may submit to open projects; restricted projects need the guardian permission."""
    if not has_role(user, project.tenant_id, Role.MEMBER):
        return False
    if not project.active:
        return False
    if not project.restricted or has_role(user, project.tenant_id, Role.ADMIN):
        return True
    return user.has_perm("tenants.submit_project", project)


def users_visible_to(user) -> QuerySet:
    """Platform admins see all users; others see the users of their own tenants."""
    if is_platform_admin(user):
        return User.objects.all().order_by("username")
    if not user or not user.is_authenticated:
        return User.objects.none()
    tenant_ids = Membership.objects.filter(user=user).values("tenant_id")
    return (
        User.objects.filter(memberships__tenant_id__in=tenant_ids).distinct().order_by("username")
    )


def administered_tenants(user) -> QuerySet[Tenant]:
    """The active tenants ``user`` is an admin of (by membership; platform rights aside),
    in slug order."""
    if not user or not user.is_authenticated:
        return Tenant.objects.none()
    return Tenant.objects.filter(
        active=True, memberships__user=user, memberships__role=Role.ADMIN
    ).order_by("slug")


def administers_any_tenant(user) -> bool:
    """Platform admins, and admins of at least one active tenant (approvals inbox, audit log)."""
    return is_platform_admin(user) or administered_tenants(user).exists()


#: What a Unix account name may be (useradd's portable set, at most 32 characters).
UNIX_ACCOUNT_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def job_unix_account(*, tenant: Tenant, username: str) -> str:
    """The Unix account a job of ``tenant`` submitted by ``username`` runs as on the nodes.

    The tenant's own ``unix_account`` when set, else ``settings.SLUICE_JOB_ACCOUNT``
    filled in. A tenant slug too long for a Unix name is shortened with a digest of it,
    so two tenants never map to the same account. Returns "" when the mapping gives no
    valid account name (``{user}`` with a user name Unix does not allow): such a job is
    refused at submission.
    """
    if tenant.unix_account:
        return tenant.unix_account
    template = settings.SLUICE_JOB_ACCOUNT
    name = template.replace("{tenant}", tenant.slug).replace("{user}", username)
    if len(name) > 32 and "{tenant}" in template:
        digest = hashlib.sha256(tenant.slug.encode()).hexdigest()[:8]
        short = f"{tenant.slug[: max(1, 32 - len(name) + len(tenant.slug) - 9)]}-{digest}"
        name = template.replace("{tenant}", short).replace("{user}", username)
    return name if UNIX_ACCOUNT_RE.match(name) else ""
