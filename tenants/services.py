"""Writes for tenants, projects, memberships and users. Each audited in its own transaction."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from guardian.shortcuts import assign_perm, remove_perm

from accounts.services import api_tokens_revoke_all
from audit.services import audit_record, snapshot_fields
from portal.errors import BusinessError, PermissionDeniedError

from .choices import MembershipSource, Role
from .models import Membership, Project, Tenant
from .selectors import has_role, is_platform_admin

User = get_user_model()

_TENANT_FIELDS = ["slug", "name", "description", "active", "unix_account"]
_PROJECT_FIELDS = ["slug", "name", "description", "active", "restricted"]
_USER_FIELDS = ["username", "email", "first_name", "last_name", "is_active", "is_staff"]


def _require_platform_admin(user) -> None:
    if not is_platform_admin(user):
        raise PermissionDeniedError("Only platform admins may do this.")


def _require_tenant_admin(user, tenant: Tenant) -> None:
    if not has_role(user, tenant, Role.ADMIN):
        raise PermissionDeniedError(f"Only admins of tenant {tenant.slug} may do this.")


def _clean(instance, exclude: list[str] | None = None) -> None:
    try:
        instance.full_clean(exclude=exclude)
    except ValidationError as exc:
        raise BusinessError("Invalid input.", errors=exc.message_dict) from None


# --- users ---------------------------------------------------------------------------------


@transaction.atomic
def user_create(
    *,
    actor,
    username: str,
    password: str,
    email: str = "",
    first_name: str = "",
    last_name: str = "",
    is_staff: bool = False,
) -> User:
    """Create a user (platform admins only); the password must pass the validators."""
    _require_platform_admin(actor)
    if User.objects.filter(username__iexact=username).exists():
        raise BusinessError("A user with that username already exists.", field="username")
    user = User(
        username=username,
        email=email,
        first_name=first_name,
        last_name=last_name,
        is_staff=is_staff,
    )
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise BusinessError(
            "The password is too weak.", errors={"password": exc.messages}
        ) from None
    user.set_password(password)
    _clean(user, exclude=["password"])
    user.save()
    audit_record(
        action="user.create", target=user, actor=actor, after=snapshot_fields(user, _USER_FIELDS)
    )
    return user


@transaction.atomic
def user_update(*, actor, user: User, **changes) -> User:
    """Change a user's names, e-mail, staff flag or active flag (platform admins only)."""
    _require_platform_admin(actor)
    before = snapshot_fields(user, _USER_FIELDS)
    for key, value in changes.items():
        if key not in {"email", "first_name", "last_name", "is_staff", "is_active"}:
            raise BusinessError(f"Field {key} cannot be changed here.", field=key)
        setattr(user, key, value)
    if user.pk == actor.pk and (not user.is_active or not user.is_staff):
        raise BusinessError("You cannot deactivate or demote yourself.", field="is_active")
    _clean(user, exclude=["password"])
    user.save()
    if changes.get("is_active") is False:
        api_tokens_revoke_all(actor=actor, user=user, reason="User deactivated")
    action = "user.deactivate" if before["is_active"] and not user.is_active else "user.update"
    audit_record(
        action=action,
        target=user,
        actor=actor,
        before=before,
        after=snapshot_fields(user, _USER_FIELDS),
    )
    return user


def user_deactivate(*, actor, user: User) -> User:
    """Deactivated users cannot log in, and their API tokens are revoked (audited)."""
    return user_update(actor=actor, user=user, is_active=False)


# --- tenants -------------------------------------------------------------------------------


@transaction.atomic
def tenant_create(
    *, actor, slug: str, name: str, description: str = "", active: bool = True
) -> Tenant:
    _require_platform_admin(actor)
    if Tenant.objects.filter(slug=slug).exists():
        raise BusinessError("A tenant with this slug already exists.", field="slug")
    tenant = Tenant(slug=slug, name=name, description=description, active=active)
    _clean(tenant)
    tenant.save()
    audit_record(
        action="tenant.create",
        target=tenant,
        actor=actor,
        tenant=tenant,
        after=snapshot_fields(tenant, _TENANT_FIELDS),
    )
    return tenant


@transaction.atomic
def tenant_update(*, actor, tenant: Tenant, **changes) -> Tenant:
    """Tenant admins change name and description; platform admins also slug, active and the
    Unix account its jobs run as."""
    admin_fields = {"name", "description"}
    platform_fields = admin_fields | {"slug", "active", "unix_account"}
    allowed = platform_fields if is_platform_admin(actor) else admin_fields
    _require_tenant_admin(actor, tenant)
    before = snapshot_fields(tenant, _TENANT_FIELDS)
    for key, value in changes.items():
        if key not in allowed:
            raise PermissionDeniedError(f"You may not change {key}.")
        setattr(tenant, key, value)
    if "slug" in changes and Tenant.objects.exclude(pk=tenant.pk).filter(slug=tenant.slug).exists():
        raise BusinessError("A tenant with this slug already exists.", field="slug")
    _clean(tenant)
    tenant.save()
    audit_record(
        action="tenant.update",
        target=tenant,
        actor=actor,
        tenant=tenant,
        before=before,
        after=snapshot_fields(tenant, _TENANT_FIELDS),
    )
    return tenant


# --- projects ------------------------------------------------------------------------------


@transaction.atomic
def project_create(
    *, actor, tenant: Tenant, slug: str, name: str, description: str = "", restricted: bool = False
) -> Project:
    _require_tenant_admin(actor, tenant)
    if Project.objects.filter(tenant=tenant, slug=slug).exists():
        raise BusinessError(
            f"Tenant {tenant.slug} already has a project with this slug.", field="slug"
        )
    project = Project(
        tenant=tenant, slug=slug, name=name, description=description, restricted=restricted
    )
    _clean(project)
    project.save()
    audit_record(
        action="project.create",
        target=project,
        actor=actor,
        tenant=tenant,
        after=snapshot_fields(project, _PROJECT_FIELDS),
    )
    return project


@transaction.atomic
def project_update(*, actor, project: Project, **changes) -> Project:
    _require_tenant_admin(actor, project.tenant)
    before = snapshot_fields(project, _PROJECT_FIELDS)
    for key, value in changes.items():
        if key not in {"slug", "name", "description", "active", "restricted"}:
            raise BusinessError(f"Field {key} cannot be changed.", field=key)
        setattr(project, key, value)
    if (
        "slug" in changes
        and Project.objects.exclude(pk=project.pk)
        .filter(tenant=project.tenant, slug=project.slug)
        .exists()
    ):
        raise BusinessError(
            f"Tenant {project.tenant.slug} already has a project with this slug.", field="slug"
        )
    _clean(project)
    project.save()
    audit_record(
        action="project.update",
        target=project,
        actor=actor,
        tenant=project.tenant,
        before=before,
        after=snapshot_fields(project, _PROJECT_FIELDS),
    )
    return project


@transaction.atomic
def project_set_submitter(*, actor, project: Project, user: User, allowed: bool) -> None:
    """Grant or revoke a member's right to submit to a restricted project (django-guardian)."""
    _require_tenant_admin(actor, project.tenant)
    if not Membership.objects.filter(tenant=project.tenant, user=user).exists():
        raise BusinessError(
            f"{user.username} is not a member of {project.tenant.slug}.", field="user"
        )
    if allowed:
        assign_perm("tenants.submit_project", user, project)
    else:
        remove_perm("tenants.submit_project", user, project)
    audit_record(
        action="project.submitter_grant" if allowed else "project.submitter_revoke",
        target=project,
        actor=actor,
        tenant=project.tenant,
        after={"user": user.username},
    )


# --- memberships ---------------------------------------------------------------------------


def _forget_roles(user) -> None:
    if hasattr(user, "_sluice_roles"):
        del user._sluice_roles


def _check_role(role: str) -> None:
    if role not in Role.values:
        raise BusinessError(
            f"Unknown role {role!r}; use one of {', '.join(Role.values)}.", field="role"
        )


def _require_local(membership: Membership) -> None:
    if (
        membership.user_id
        and type(membership.user)
        .objects.filter(pk=membership.user_id, robot__isnull=False)
        .exists()
    ):
        raise BusinessError(
            f"{membership.user.username} is a robot account: change its role or delete it on "
            f"the tenant's Robot accounts page.",
            field="role",
            code="robot_membership",
        )
    if membership.source == MembershipSource.DIRECTORY:
        raise BusinessError(
            f"{membership.user.username}'s role in {membership.tenant.slug} comes from the "
            "directory's groups and is synced at each sign-in; change the groups in the "
            "directory, or the group mapping.",
            field="role",
            code="directory_membership",
        )


def _keeps_an_admin(tenant: Tenant, excluding: Membership) -> bool:
    return (
        Membership.objects.filter(tenant=tenant, role=Role.ADMIN).exclude(pk=excluding.pk).exists()
    )


@transaction.atomic
def membership_add(*, actor, tenant: Tenant, user: User, role: str) -> Membership:
    """Add a user to a tenant with a role (tenant admins and platform admins)."""
    _require_tenant_admin(actor, tenant)
    _check_role(role)
    if not user.is_active:
        raise BusinessError(f"{user.username} is deactivated.", field="username")
    if Membership.objects.filter(tenant=tenant, user=user).exists():
        raise BusinessError(
            f"{user.username} is already a member of {tenant.slug}.", field="username"
        )
    membership = Membership.objects.create(tenant=tenant, user=user, role=role)
    _forget_roles(user)
    audit_record(
        action="membership.add",
        target=membership,
        actor=actor,
        tenant=tenant,
        after={"user": user.username, "role": role},
    )
    return membership


@transaction.atomic
def membership_change_role(*, actor, membership: Membership, role: str) -> Membership:
    _require_tenant_admin(actor, membership.tenant)
    _require_local(membership)
    _check_role(role)
    before = {"user": membership.user.username, "role": membership.role}
    if (
        membership.role == Role.ADMIN
        and role != Role.ADMIN
        and not _keeps_an_admin(membership.tenant, membership)
    ):
        raise BusinessError("A tenant must keep at least one admin.", field="role")
    membership.role = role
    membership.save(update_fields=["role"])
    _forget_roles(membership.user)
    audit_record(
        action="membership.change_role",
        target=membership,
        actor=actor,
        tenant=membership.tenant,
        before=before,
        after={"user": membership.user.username, "role": role},
    )
    return membership


@transaction.atomic
def membership_remove(*, actor, membership: Membership) -> None:
    _require_tenant_admin(actor, membership.tenant)
    _require_local(membership)
    if membership.role == Role.ADMIN and not _keeps_an_admin(membership.tenant, membership):
        raise BusinessError("A tenant must keep at least one admin.", field="role")
    before = {"user": membership.user.username, "role": membership.role}
    audit_record(
        action="membership.remove",
        target=membership,
        actor=actor,
        tenant=membership.tenant,
        before=before,
    )
    membership.delete()
    _forget_roles(membership.user)
