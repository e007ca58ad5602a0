"""Reads, always scoped to the user asking. Objects outside a user's tenants do not exist for them."""

from __future__ import annotations

import hashlib
import re

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from portal.errors import NotFoundError

from .choices import Role
from .models import Membership, Project, Tenant
from .scoping import (  # noqa: F401  (read from here by callers)
    administers_any_tenant,
    has_role,
    is_platform_admin,
    member_tenant_ids,
    require_role,
    restrict,
    role_in,
    tenant_ids_for,
)

User = get_user_model()


def tenants_visible_to(user) -> QuerySet[Tenant]:
    return restrict(Tenant.objects.all(), user, tenant_field=None)


def tenant_get(user, slug: str) -> Tenant:
    tenant = tenants_visible_to(user).filter(slug=slug).first()
    if tenant is None:
        raise NotFoundError("Tenant not found.")
    return tenant


def projects_visible_to(user) -> QuerySet[Project]:
    return restrict(Project.objects.select_related("tenant"), user)


def project_get_visible(user, project_id: int) -> Project | None:
    """``projects_visible_to(user).filter(pk=project_id).first()``, cheaper for one id: the
    user's tenants come from the roles cached on the user (the submission's checks read
    them anyway) instead of a join on the memberships, and no ordering."""
    qs = restrict(
        Project.objects.select_related("tenant").filter(pk=project_id), user, cached_roles=True
    )
    rows = list(qs.order_by()[:1])
    return rows[0] if rows else None


def memberships_of_tenant(user, tenant: Tenant) -> QuerySet[Membership]:
    if not (is_platform_admin(user) or role_in(user, tenant)):
        return Membership.objects.none()
    # user__robot: whether a member is a robot account (accounts), read without a
    # query per row and without importing an app above this one.
    return Membership.objects.filter(tenant=tenant).select_related("user__robot", "tenant")


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
    """Platform admins see all users; others see the users of their own (active) tenants."""
    users = restrict(User.objects.all(), user, tenant_field="memberships__tenant")
    if not is_platform_admin(user):
        users = users.distinct()
    return users.order_by("username")


def administered_tenants(user) -> QuerySet[Tenant]:
    """The active tenants ``user`` is an admin of (by membership; platform rights aside),
    in slug order."""
    return Tenant.objects.filter(pk__in=tenant_ids_for(user, "admin")).order_by("slug")


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
