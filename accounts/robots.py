"""Robot accounts: services and selectors.

A robot is a user of one tenant with a member or viewer membership and API tokens made for
it by a tenant admin; it never signs in to the pages (``backends.LocalAccountBackend``).
These functions need tenants' roles, so they live here rather than in ``services.py``,
which ``tenants`` itself imports.
"""

from __future__ import annotations

import re
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from audit.services import audit_record
from portal.errors import BusinessError, NotFoundError, PermissionDeniedError
from tenants.choices import Role
from tenants.models import Membership, Tenant
from tenants.selectors import has_role, is_platform_admin, role_in

from .constants import token_default_days, token_max_days
from .models import ApiToken, RobotAccount

User = get_user_model()

ACTION_ROBOT_CREATE = "robot.create"
ACTION_ROBOT_UPDATE = "robot.update"
ACTION_ROBOT_DELETE = "robot.delete"
ACTION_ROBOT_TOKEN_CREATE = "robot.token_create"
ACTION_ROBOT_TOKEN_REVOKE = "robot.token_revoke"

#: The roles a robot may hold: never tenant admin (a robot manages nothing).
ROBOT_ROLES = (Role.MEMBER, Role.VIEWER)
#: The same as choices, for serializers and the OpenAPI schema's RobotRoleEnum.
ROBOT_ROLE_CHOICES = [(r.value, r.label) for r in ROBOT_ROLES]
ROBOT_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$")
TOKEN_NAME_MAX = ApiToken._meta.get_field("name").max_length
DESCRIPTION_MAX = RobotAccount._meta.get_field("description").max_length


def robot_username(tenant: Tenant, name: str) -> str:
    """The robot's user name: ``robot.<tenant>.<name>`` (a dot never appears in a tenant
    slug or a robot name, so two robots never share one)."""
    return f"robot.{tenant.slug}.{name}"


def is_robot(user) -> bool:
    """Whether ``user`` is a robot account (one query unless the relation is loaded)."""
    if not user or not getattr(user, "pk", None):
        return False
    return RobotAccount.objects.filter(user_id=user.pk).exists()


# --- selectors -------------------------------------------------------------------------------


def robots_of_tenant(user, tenant: Tenant, *, include_deleted: bool = False) -> QuerySet:
    """The tenant's robots, for its members and platform admins (none for anyone else),
    each with its ``role`` (None once deleted)."""
    if not (is_platform_admin(user) or role_in(user, tenant)):
        return RobotAccount.objects.none()
    role = Membership.objects.filter(user_id=OuterRef("user_id"), tenant_id=tenant.pk)
    qs = (
        RobotAccount.objects.filter(tenant=tenant)
        .select_related("user", "tenant", "created_by")
        .annotate(role=Subquery(role.values("role")[:1]))
    )
    if not include_deleted:
        qs = qs.filter(user__is_active=True)
    return qs


def robot_get(user, tenant: Tenant, name: str) -> RobotAccount:
    """One robot of ``tenant`` the user may see; otherwise "not found" (404)."""
    robot = robots_of_tenant(user, tenant).filter(name=name).first()
    if robot is None:
        raise NotFoundError("Robot account not found.")
    return robot


def robot_tokens(user, robot: RobotAccount) -> QuerySet[ApiToken]:
    """The robot's tokens that still work, newest first (never their keys)."""
    if not (is_platform_admin(user) or role_in(user, robot.tenant_id)):
        return ApiToken.objects.none()
    return ApiToken.objects.select_related("user").filter(
        Q(expiry__isnull=True) | Q(expiry__gt=timezone.now()), user_id=robot.user_id
    )


def robot_token_get(user, robot: RobotAccount, pk) -> ApiToken:
    try:
        return robot_tokens(user, robot).get(pk=pk)
    except (ApiToken.DoesNotExist, ValueError, TypeError):
        raise NotFoundError("API token not found.") from None


# --- services --------------------------------------------------------------------------------


def _require_tenant_admin(actor, tenant: Tenant) -> None:
    if not has_role(actor, tenant, Role.ADMIN):
        raise PermissionDeniedError("Only the tenant's admins manage its robot accounts.")


def _check_role(role: str) -> None:
    if role not in ROBOT_ROLES:
        raise BusinessError(
            f"A robot's role is {' or '.join(ROBOT_ROLES)}, not {role!r}.", field="role"
        )


def _snapshot(robot: RobotAccount, role: str | None) -> dict:
    return {
        "name": robot.name,
        "username": robot.user.username,
        "role": role,
        "description": robot.description,
    }


@transaction.atomic
def robot_create(
    *, actor, tenant: Tenant, name: str, role: str, description: str = ""
) -> RobotAccount:
    """Make a robot account of ``tenant`` with ``role`` (tenant admins and platform admins).

    Its user has no usable password; it works through the tokens made for it.
    """
    _require_tenant_admin(actor, tenant)
    name = (name or "").strip()
    if not ROBOT_NAME.match(name):
        raise BusinessError(
            "A robot's name is 1 to 40 lower-case letters, digits and dashes, e.g. “ci”.",
            field="name",
        )
    _check_role(role)
    description = (description or "").strip()
    if len(description) > DESCRIPTION_MAX:
        raise BusinessError(
            f"The description is at most {DESCRIPTION_MAX} characters.", field="description"
        )
    username = robot_username(tenant, name)
    if (
        RobotAccount.objects.filter(tenant=tenant, name=name).exists()
        or User.objects.filter(username=username).exists()
    ):
        raise BusinessError(
            f"{tenant.slug} already has (or had) a robot named {name}.", field="name"
        )
    user = User(username=username, first_name="Robot", last_name=name)
    user.set_unusable_password()
    user.save()
    robot = RobotAccount.objects.create(
        user=user, tenant=tenant, name=name, description=description, created_by=actor
    )
    Membership.objects.create(user=user, tenant=tenant, role=role)
    audit_record(
        action=ACTION_ROBOT_CREATE,
        target=robot,
        target_label=username,
        actor=actor,
        tenant=tenant,
        after=_snapshot(robot, role),
    )
    return robot


@transaction.atomic
def robot_update(
    *, actor, robot: RobotAccount, role: str | None = None, description: str | None = None
) -> RobotAccount:
    """Change a robot's role (member or viewer) or description."""
    _require_tenant_admin(actor, robot.tenant)
    membership = Membership.objects.select_for_update().get(user=robot.user, tenant=robot.tenant)
    before = _snapshot(robot, membership.role)
    if role is not None:
        _check_role(role)
        membership.role = role
        membership.save(update_fields=["role"])
    if description is not None:
        description = description.strip()
        if len(description) > DESCRIPTION_MAX:
            raise BusinessError(
                f"The description is at most {DESCRIPTION_MAX} characters.", field="description"
            )
        robot.description = description
        robot.save(update_fields=["description"])
    robot.role = membership.role
    audit_record(
        action=ACTION_ROBOT_UPDATE,
        target=robot,
        target_label=robot.user.username,
        actor=actor,
        tenant=robot.tenant,
        before=before,
        after=_snapshot(robot, membership.role),
    )
    return robot


def _token_snapshot(token: ApiToken) -> dict:
    return {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "expiry": token.expiry.isoformat() if token.expiry else None,
    }


@transaction.atomic
def robot_token_create(
    *, actor, robot: RobotAccount, name: str, expires_in_days: int | None = None
) -> tuple[ApiToken, str]:
    """Make an API token for the robot; returns the row and the key (shown once, never
    stored). The token expires like a person's (``SLUICE_API_TOKEN_DAYS`` by default, at
    most ``SLUICE_API_TOKEN_MAX_DAYS``)."""
    _require_tenant_admin(actor, robot.tenant)
    if not robot.user.is_active:
        raise BusinessError("This robot account is deleted.", code="robot_deleted")
    name = (name or "").strip()
    if not name:
        raise BusinessError("Give the token a name, e.g. where it is used.", field="name")
    if len(name) > TOKEN_NAME_MAX:
        raise BusinessError(f"The name is at most {TOKEN_NAME_MAX} characters long.", field="name")
    days = token_default_days() if expires_in_days is None else expires_in_days
    if not 1 <= days <= token_max_days():
        raise BusinessError(
            f"A token lasts between 1 and {token_max_days()} days.", field="expires_in_days"
        )
    token, key = ApiToken.objects.create(user=robot.user, expiry=timedelta(days=days), name=name)
    audit_record(
        action=ACTION_ROBOT_TOKEN_CREATE,
        target=robot,
        target_label=robot.user.username,
        actor=actor,
        tenant=robot.tenant,
        after=_token_snapshot(token),
    )
    return token, key


@transaction.atomic
def robot_token_revoke(*, actor, robot: RobotAccount, token: ApiToken, reason: str = "") -> None:
    """Revoke one of the robot's tokens: it stops working at once."""
    _require_tenant_admin(actor, robot.tenant)
    if token.user_id != robot.user_id:
        raise NotFoundError("API token not found.")
    before = _token_snapshot(token)
    token.delete()
    audit_record(
        action=ACTION_ROBOT_TOKEN_REVOKE,
        target=robot,
        target_label=robot.user.username,
        actor=actor,
        tenant=robot.tenant,
        before=before,
        reason=reason,
    )


@transaction.atomic
def robot_delete(*, actor, robot: RobotAccount) -> None:
    """Delete a robot: its tokens are revoked, its membership ends and its user is
    deactivated (kept, so that its jobs keep their submitter; its name is not reused)."""
    _require_tenant_admin(actor, robot.tenant)
    membership = Membership.objects.filter(user=robot.user, tenant=robot.tenant).first()
    before = _snapshot(robot, membership.role if membership else None)
    for token in ApiToken.objects.filter(user=robot.user).order_by("id"):
        robot_token_revoke(actor=actor, robot=robot, token=token, reason="robot deleted")
    if membership is not None:
        membership.delete()
    robot.user.is_active = False
    robot.user.save(update_fields=["is_active"])
    audit_record(
        action=ACTION_ROBOT_DELETE,
        target=robot,
        target_label=robot.user.username,
        actor=actor,
        tenant=robot.tenant,
        before=before,
    )
