"""Writes for directory users: just-in-time creation, roles synced from directory groups,
leavers. Every change is audited with the group and the directory it came from."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.db import transaction
from django.utils import timezone

from accounts.services import api_tokens_revoke_all
from audit.services import audit_record
from portal.errors import BusinessError
from tenants.choices import ROLE_RANK, MembershipSource
from tenants.models import Membership, Tenant

from . import choices
from .choices import DirectorySource, GrantedRole, MappingSource
from .models import DirectoryGroupRole, DirectoryIdentity

log = logging.getLogger(__name__)
User = get_user_model()

_UNIX_ACCOUNT = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class Grants:
    """What a user's directory groups grant: the role per tenant (the highest of its
    groups') with the groups that grant it, and the groups granting platform admin."""

    tenant_roles: dict[int, tuple[str, list[str]]]
    platform_admin_groups: list[str]

    @property
    def anything(self) -> bool:
        return bool(self.tenant_roles or self.platform_admin_groups)


def _group_key(group: str, source: str) -> str:
    # LDAP DNs compare case-insensitively; OIDC group names are matched as sent.
    return group.strip().lower() if source == DirectorySource.LDAP else group


def directory_grants(*, groups: list[str], source: str) -> Grants:
    """The roles ``groups`` (from ``source``) grant through the directory group mapping."""
    wanted = {_group_key(g, source) for g in groups}
    rows = DirectoryGroupRole.objects.filter(source__in=[source, MappingSource.ANY])
    tenant_roles: dict[int, tuple[str, list[str]]] = {}
    platform: list[str] = []
    for row in rows.order_by("pk"):
        if _group_key(row.group, source) not in wanted:
            continue
        if row.role == GrantedRole.PLATFORM_ADMIN:
            platform.append(row.group)
            continue
        if row.tenant_id is None:
            continue
        role, via = tenant_roles.get(row.tenant_id, ("", []))
        if not role or ROLE_RANK[row.role] > ROLE_RANK[role]:
            tenant_roles[row.tenant_id] = (row.role, [row.group])
        elif row.role == role:
            via.append(row.group)
    return Grants(tenant_roles=tenant_roles, platform_admin_groups=platform)


def _valid_unix_account(unix_account: str | None) -> str:
    if not unix_account:
        return ""
    if not _UNIX_ACCOUNT.match(unix_account):
        raise BusinessError(
            f"The directory gives the Unix account {unix_account!r}, which is not a valid "
            "Unix account name; ask an administrator to fix it in the directory.",
            field="unix_account",
            code="bad_unix_account",
        )
    return unix_account


def _identity_for(*, username: str, source: str, subject: str) -> DirectoryIdentity | None:
    """The identity of ``subject``; a local user of the same name is linked to it (audited)
    unless that user already has a directory identity of another subject."""
    identity = (
        DirectoryIdentity.objects.select_for_update()
        .select_related("user")
        .filter(source=source, subject=subject)
        .first()
    )
    if identity is not None:
        return identity
    user = User.objects.filter(username=username).first()
    if user is None:
        return None
    if DirectoryIdentity.objects.filter(user=user).exists():
        raise BusinessError(
            f"The user name {username} already belongs to another directory identity.",
            field="username",
            code="identity_conflict",
        )
    identity = DirectoryIdentity.objects.create(user=user, source=source, subject=subject)
    audit_record(
        action=choices.ACTION_USER_LINKED,
        target=user,
        target_label=user.get_username(),
        after={"source": source, "subject": subject},
        reason=f"Signed in through {source} with the name of an existing user",
    )
    return identity


def _create_user(*, username: str, email: str, name: str, source: str, subject: str):
    first, _, last = name.strip().partition(" ")
    user = User(username=username, email=email, first_name=first[:150], last_name=last[:150])
    user.set_unusable_password()  # signs in through the directory only
    user.save()
    identity = DirectoryIdentity.objects.create(user=user, source=source, subject=subject)
    audit_record(
        action=choices.ACTION_USER_CREATED,
        target=user,
        target_label=username,
        after={"username": username, "email": email, "source": source, "subject": subject},
    )
    return identity


def _sync_memberships(*, user, grants: Grants, source: str, groups: list[str]) -> None:
    """Make the user's directory memberships match ``grants``; local ones are left alone."""
    current = {
        m.tenant_id: m for m in Membership.objects.select_related("tenant").filter(user=user)
    }
    tenants = Tenant.objects.in_bulk(list(grants.tenant_roles))
    for tenant_id, (role, via) in grants.tenant_roles.items():
        membership = current.get(tenant_id)
        tenant = tenants[tenant_id]
        event = {"user": user.username, "role": role, "groups": via, "source": source}
        if membership is None:
            membership = Membership.objects.create(
                user=user, tenant=tenant, role=role, source=MembershipSource.DIRECTORY
            )
            audit_record(
                action=choices.ACTION_ROLE_GRANTED, target=membership, tenant=tenant, after=event
            )
        elif membership.source == MembershipSource.DIRECTORY and membership.role != role:
            before = {"user": user.username, "role": membership.role}
            membership.role = role
            membership.save(update_fields=["role"])
            audit_record(
                action=choices.ACTION_ROLE_CHANGED,
                target=membership,
                tenant=tenant,
                before=before,
                after=event,
            )
    for tenant_id, membership in current.items():
        if tenant_id in grants.tenant_roles or membership.source != MembershipSource.DIRECTORY:
            continue
        audit_record(
            action=choices.ACTION_ROLE_REMOVED,
            target=membership,
            tenant=membership.tenant,
            before={"user": user.username, "role": membership.role},
            after={"groups": groups, "source": source},
            reason=f"No {source} group of the user grants a role in {membership.tenant.slug}",
        )
        membership.delete()
    if hasattr(user, "_sluice_roles"):
        del user._sluice_roles


def _sync_platform_admin(*, user, identity: DirectoryIdentity, grants: Grants, source: str):
    """Platform admin from the mapping; a staff flag given by hand (a break-glass admin)
    is never taken away by the directory, only one the directory granted."""
    if grants.platform_admin_groups and not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
        identity.granted_platform_admin = True
        audit_record(
            action=choices.ACTION_PLATFORM_ADMIN_GRANTED,
            target=user,
            target_label=user.get_username(),
            after={"groups": grants.platform_admin_groups, "source": source},
        )
    elif not grants.platform_admin_groups and user.is_staff and identity.granted_platform_admin:
        user.is_staff = False
        user.save(update_fields=["is_staff"])
        identity.granted_platform_admin = False
        audit_record(
            action=choices.ACTION_PLATFORM_ADMIN_REMOVED,
            target=user,
            target_label=user.get_username(),
            after={"source": source},
            reason=f"No {source} group of the user grants platform admin",
        )


@transaction.atomic
def directory_sync_user(
    *,
    username: str,
    email: str = "",
    name: str = "",
    groups: list[str],
    source: str,
    subject: str | None = None,
    unix_account: str | None = None,
    unix_uid: int | None = None,
    active: bool = True,
    sign_in: bool = False,
):
    """Create or update the user a directory (``source``: oidc or ldap) describes, and sync
    their roles from ``groups`` through the directory group mapping.

    A new user gets no usable password. Directory memberships are added, changed and
    removed to match the groups; local memberships are never touched. ``active=False``
    (disabled in the directory) deactivates the user (see ``directory_user_disable``). A
    user the directory had disabled and now lists as active is reactivated; one
    deactivated by hand in Sluice stays deactivated. ``sign_in`` records the sign-in time
    (the OIDC session age check uses it).
    """
    if source not in DirectorySource.values:
        raise BusinessError(f"Unknown directory source {source!r}.", field="source")
    subject = subject or username
    unix_account = _valid_unix_account(unix_account)
    identity = _identity_for(username=username, source=source, subject=subject)
    if identity is None:
        if not active:
            return None  # never created, nothing to disable
        identity = _create_user(
            username=username, email=email, name=name, source=source, subject=subject
        )
    user = identity.user
    if email and user.email != email:
        user.email = email
        user.save(update_fields=["email"])
    now = timezone.now()
    identity.unix_account = unix_account
    identity.unix_uid = unix_uid
    identity.groups = list(groups)
    identity.last_sync_at = now
    if sign_in:
        identity.last_sign_in_at = now
    if not active:
        identity.save()
        if identity.active or user.is_active:
            directory_user_disable(user=user, source=source, reason="Disabled in the directory")
        return user
    if not identity.active and not user.is_active:
        user.is_active = True
        user.save(update_fields=["is_active"])
        audit_record(
            action=choices.ACTION_USER_REACTIVATED,
            target=user,
            target_label=user.get_username(),
            after={"source": source},
            reason="Active again in the directory",
        )
    identity.active = True
    grants = directory_grants(groups=groups, source=source)
    _sync_memberships(user=user, grants=grants, source=source, groups=list(groups))
    _sync_platform_admin(user=user, identity=identity, grants=grants, source=source)
    identity.save()
    return user


def user_sessions_end(*, user) -> int:
    """End every signed-in session of ``user`` (database sessions); the number ended."""
    ended = 0
    for session in Session.objects.filter(expire_date__gt=timezone.now()).iterator():
        if str(session.get_decoded().get("_auth_user_id")) == str(user.pk):
            session.delete()
            ended += 1
    return ended


def _cancel_jobs_of_leaver(user) -> int:
    """Cancel the leaver's live jobs in tenants whose policy says so (``Tenant.
    cancel_jobs_of_leavers``); elsewhere their jobs run to the end."""
    from scheduling.choices import JobState, StopReason
    from scheduling.models import Job
    from scheduling.services.enqueue import dispatch_on_commit
    from scheduling.services.lifecycle import job_transition
    from scheduling.services.stopping import job_stop

    message = f"Cancelled: {user.username} was disabled in the directory."
    jobs = Job.objects.select_for_update().filter(
        submitted_by=user,
        tenant__cancel_jobs_of_leavers=True,
        state__in=[JobState.PENDING, JobState.HELD, JobState.ADMITTED, JobState.RUNNING],
    )
    count = 0
    for job in jobs:
        before = job.state
        if job.state in (JobState.PENDING, JobState.HELD):
            job_transition(
                job,
                JobState.CANCELLED,
                message=message,
                finished_at=timezone.now(),
                pending_reason_code="",
            )
        else:
            job_stop(job=job, reason=StopReason.CANCELLED, message=message)
        audit_record(
            action="job.cancel",
            target=job,
            tenant=job.tenant,
            before={"state": before},
            after={"state": job.state},
            reason="The tenant cancels the jobs of users disabled in the directory",
        )
        count += 1
    if count:
        dispatch_on_commit()
    return count


@transaction.atomic
def directory_user_disable(*, user, source: str, reason: str = "Disabled in the directory"):
    """A leaver: deactivate the user, end their sessions, revoke their API tokens, and
    cancel their jobs where their tenant's policy says so (else the jobs keep running)."""
    DirectoryIdentity.objects.filter(user=user).update(active=False)
    was_active = user.is_active
    if was_active:
        user.is_active = False
        user.save(update_fields=["is_active"])
    sessions = user_sessions_end(user=user)
    tokens = api_tokens_revoke_all(actor=None, user=user, reason=reason)
    jobs = _cancel_jobs_of_leaver(user)
    audit_record(
        action=choices.ACTION_USER_DISABLED,
        target=user,
        target_label=user.get_username(),
        before={"is_active": was_active},
        after={
            "is_active": False,
            "source": source,
            "sessions_ended": sessions,
            "tokens_revoked": tokens,
            "jobs_cancelled": jobs,
        },
        reason=reason,
    )
    return user


@transaction.atomic
def oidc_stale_sessions_end(*, now: datetime, max_age: timedelta) -> int:
    """Sign out OIDC users whose last sign-in through the provider is older than
    ``max_age``: their next page asks the provider again, which refuses a disabled user.
    The number of users signed out."""
    cutoff = now - max_age
    stale = DirectoryIdentity.objects.select_related("user").filter(
        source=DirectorySource.OIDC, last_sign_in_at__lt=cutoff, user__is_active=True
    )
    count = 0
    for identity in stale:
        ended = user_sessions_end(user=identity.user)
        if not ended:
            continue
        count += 1
        audit_record(
            action=choices.ACTION_SESSIONS_EXPIRED,
            target=identity.user,
            target_label=identity.user.get_username(),
            after={"sessions_ended": ended, "source": DirectorySource.OIDC},
            reason=f"Last OIDC sign-in older than {int(max_age.total_seconds())} s",
        )
    return count
