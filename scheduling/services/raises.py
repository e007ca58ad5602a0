"""Priority raises (DESIGN §7): request, approve, reject, revoke, cancel and expire.

An approved raise is a grant: while it lasts, the jobs it covers run at its class (their
``priority_class``); when it ends they go back to their ``base_priority_class``, or to the
highest other grant still active. Every step writes one ``AuditEvent`` and the jobs'
``JobEvent`` rows in its transaction; notification mail and dispatch requests leave on commit.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from audit.services import audit_record
from portal.errors import BusinessError, PermissionDeniedError
from tenants.choices import Role
from tenants.models import Project, Tenant
from tenants.selectors import is_platform_admin, require_role

from ..choices import FINAL_STATES, LIVE_STATES, RAISABLE_STATES, NotificationKind, RaiseState
from ..models import Job, JobEvent, PriorityClass, PriorityRaise, TenantRaiseCeiling
from ..selectors import can_manage_job, raise_approvers, raise_refusal
from .enqueue import dispatch_on_commit, waiting_changed_on_commit
from .notifications import notification_send

log = logging.getLogger(__name__)

_SQLITE_CHUNK = 900  # SQLite allows about 1000 variables a statement


def _fail(field: str, message: str, code: str = "invalid") -> None:
    raise BusinessError(message, code=code, field=field)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _raise_state(raise_: PriorityRaise) -> dict:
    """The raise as the audit log's before/after shows it (JSON-safe, stable key order)."""
    return {
        "state": raise_.state,
        "job": raise_.job_id,
        "project": raise_.project_id,
        "from_class": raise_.from_class.name if raise_.from_class_id else None,
        "to_class": raise_.to_class.name,
        "hours": raise_.hours,
        "window_start": _iso(raise_.window_start),
        "window_end": _iso(raise_.window_end),
        "expires_at": _iso(raise_.expires_at),
        "decided_by": raise_.decided_by.get_username() if raise_.decided_by_id else None,
        "comment": raise_.comment,
        "ended_at": _iso(raise_.ended_at),
        "ended_by": raise_.ended_by.get_username() if raise_.ended_by_id else None,
    }


def _scope_label(raise_: PriorityRaise) -> str:
    if raise_.job_id:
        return f"job {raise_.job_id}"
    return f"project {raise_.project}"


def _link(raise_: PriorityRaise) -> str:
    if raise_.job_id:
        return reverse("job-detail", args=[raise_.job_id])
    return reverse("project-detail", args=[raise_.project_id])


# --- which class a job runs at ---------------------------------------------------------------


def higher_class(base: PriorityClass, granted: PriorityClass | None) -> PriorityClass:
    """The higher of two classes (``granted`` may be None)."""
    return granted if granted is not None and granted.value > base.value else base


def _active_grants(now: datetime) -> QuerySet[PriorityRaise]:
    return PriorityRaise.objects.filter(state=RaiseState.APPROVED, expires_at__gt=now).filter(
        Q(window_start__isnull=True) | Q(window_start__lte=now)
    )


def _highest_by(rows: Iterable[tuple[int, PriorityClass]]) -> dict[int, PriorityClass]:
    best: dict[int, PriorityClass] = {}
    for key, cls in rows:
        best[key] = higher_class(best[key], cls) if key in best else cls
    return best


def project_grant_classes(project_ids: Iterable[int], now: datetime) -> dict[int, PriorityClass]:
    """The highest class granted now to each project's jobs (projects without a grant absent)."""
    ids = list(set(project_ids))
    if not ids:
        return {}
    grants = _active_grants(now).filter(project_id__in=ids).select_related("to_class")
    return _highest_by((g.project_id, g.to_class) for g in grants)


def effective_class_for(
    project: Project, base_class: PriorityClass, now: datetime
) -> PriorityClass:
    """The class a job submitted now to ``project`` at ``base_class`` runs at (submit's hook)."""
    return higher_class(base_class, project_grant_classes([project.pk], now).get(project.pk))


def _effective_classes(jobs: list[Job], now: datetime) -> dict[int, PriorityClass]:
    """Each job's class now: its base class, or the highest grant (its own or its project's)."""
    job_ids = [j.pk for j in jobs]
    job_grants: dict[int, PriorityClass] = {}
    for start in range(0, len(job_ids), _SQLITE_CHUNK):
        chunk = job_ids[start : start + _SQLITE_CHUNK]
        grants = _active_grants(now).filter(job_id__in=chunk).select_related("to_class")
        for job_id, cls in _highest_by((g.job_id, g.to_class) for g in grants).items():
            job_grants[job_id] = cls
    project_grants = project_grant_classes({j.project_id for j in jobs}, now)
    return {
        j.pk: higher_class(
            higher_class(j.base_priority_class, job_grants.get(j.pk)),
            project_grants.get(j.project_id),
        )
        for j in jobs
    }


def _covered_jobs(raise_: PriorityRaise, *, raising: bool) -> list[Job]:
    """The jobs a step of this raise may change: to raise, or to bring back down."""
    qs = Job.objects.select_related("priority_class", "base_priority_class")
    if raise_.job_id:
        return list(qs.filter(pk=raise_.job_id, state__in=LIVE_STATES))
    qs = qs.filter(project_id=raise_.project_id)
    if raising:
        return list(
            qs.filter(state__in=RAISABLE_STATES, priority_class__value__lt=raise_.to_class.value)
        )
    return list(qs.filter(state__in=LIVE_STATES).exclude(priority_class=F("base_priority_class")))


def _sync_classes(
    raise_: PriorityRaise, *, raising: bool, step: str, message: str, actor, now: datetime
) -> list[dict]:
    """Set the covered jobs' effective classes; one JobEvent per job whose class changes.

    A job raise always gets its one JobEvent for the step, changed or not.
    Returns the changes as ``[{"job": id, "from": name, "to": name}]`` for the audit row.
    """
    jobs = _covered_jobs(raise_, raising=raising)
    target = _effective_classes(jobs, now)
    changes, events = [], []
    by_class: dict[int, list[int]] = defaultdict(list)
    actor = actor if getattr(actor, "is_authenticated", False) else None
    for job in jobs:
        new, old = target[job.pk], job.priority_class
        if new.pk == old.pk:
            continue
        changes.append({"job": job.pk, "from": old.name, "to": new.name})
        by_class[new.pk].append(job.pk)
        events.append(
            JobEvent(
                job=job,
                created_at=now,
                kind=f"raise_{step}",
                actor=actor,
                message=f"{message} Class {old.name} → {new.name}.",
                data={"raise": raise_.pk, "from": old.name, "to": new.name},
            )
        )
    for class_id, ids in by_class.items():
        for start in range(0, len(ids), _SQLITE_CHUNK):
            Job.objects.filter(pk__in=ids[start : start + _SQLITE_CHUNK]).update(
                priority_class_id=class_id
            )
    if by_class:
        waiting_changed_on_commit()
    if raise_.job_id and not changes:
        events.append(
            JobEvent(
                job_id=raise_.job_id,
                created_at=now,
                kind=f"raise_{step}",
                actor=actor,
                message=message,
                data={"raise": raise_.pk, "to": raise_.to_class.name},
            )
        )
    JobEvent.objects.bulk_create(events, batch_size=1000)
    return changes


def _job_step_event(raise_: PriorityRaise, step: str, message: str, actor, now) -> None:
    """The timeline line of a job raise's step that changes no class (request, reject, cancel)."""
    if raise_.job_id:
        JobEvent.objects.create(
            job_id=raise_.job_id,
            created_at=now,
            kind=f"raise_{step}",
            actor=actor if getattr(actor, "is_authenticated", False) else None,
            message=message,
            data={"raise": raise_.pk, "to": raise_.to_class.name},
        )


# --- request ---------------------------------------------------------------------------------


def _check_requester(user, job: Job | None, project: Project | None) -> None:
    tenant_id = job.tenant_id if job is not None else project.tenant_id
    require_role(
        user,
        tenant_id,
        Role.MEMBER,
        not_found="Job not found." if job is not None else "Project not found.",
        denied="Viewers cannot request priority raises.",
    )
    if job is not None and not can_manage_job(user, job):
        raise PermissionDeniedError(
            "Only the job's owner or a tenant admin may request a raise for it."
        )


def _check_job_raise(job: Job, to_class: PriorityClass, window_start, window_end) -> None:
    if window_start is not None or window_end is not None:
        _fail("window_start", "A window applies to project raises; a job raise lasts `hours`.")
    if job.state not in RAISABLE_STATES:
        _fail(
            "job",
            f"Job {job.pk} is {job.state}: only pending, held, admitted or running jobs can be raised.",
            code="job_not_raisable",
        )
    if to_class.value <= job.priority_class.value:
        _fail(
            "to_class",
            f"Class {to_class.name} ({to_class.value}) is not above the job's current class "
            f"{job.priority_class.name} ({job.priority_class.value}).",
            code="not_above",
        )
    waiting = job.priority_raises.filter(state=RaiseState.PENDING).first()
    if waiting is not None:
        _fail(
            "job",
            f"Job {job.pk} already has a pending raise request (#{waiting.pk}); cancel it first.",
            code="duplicate",
        )


def _check_window(now: datetime, window_start, window_end) -> tuple[datetime, datetime]:
    if window_end is None:
        _fail("window_end", "A project raise needs the end of its window (window_end).")
    window_start = window_start or now
    if window_end <= window_start:
        _fail("window_end", "The window must end after it starts.")
    if window_end <= now:
        _fail("window_end", "The window has already ended.")
    return window_start, window_end


@transaction.atomic
def priority_raise_request(
    *,
    user,
    job: Job | None = None,
    project: Project | None = None,
    to_class: PriorityClass,
    reason: str,
    window_start: datetime | None = None,
    window_end: datetime | None = None,
    hours: float | None = None,
) -> PriorityRaise:
    """Ask for a higher class for one job, or for a project's jobs during a window.

    The requester must be a member of the tenant who may manage the job (its owner or a
    tenant admin). The approvers are notified.
    """
    if (job is None) == (project is None):
        _fail("job", "Give either a job or a project to raise.")
    _check_requester(user, job, project)
    reason = (reason or "").strip()
    if not reason:
        _fail("reason", "Say why the raise is needed.")
    if hours is not None and hours <= 0:
        _fail("hours", "hours must be more than 0.")
    now = timezone.now()
    if job is not None:
        _check_job_raise(job, to_class, window_start, window_end)
    else:
        window_start, window_end = _check_window(now, window_start, window_end)
    raise_ = PriorityRaise.objects.create(
        tenant_id=job.tenant_id if job is not None else project.tenant_id,
        job=job,
        project=project,
        from_class=job.priority_class if job is not None else None,
        to_class=to_class,
        reason=reason,
        hours=hours,
        window_start=window_start,
        window_end=window_end,
        requested_by=user,
        created_at=now,
    )
    audit_record(
        action="priority_raise.request",
        target=raise_,
        actor=user,
        tenant=raise_.tenant,
        after=_raise_state(raise_),
        reason=reason,
    )
    message = (
        f"{user.get_username()} asks for class {to_class.name} for {_scope_label(raise_)}: {reason}"
    )
    _job_step_event(raise_, "requested", message, user, now)
    notification_send(
        users=raise_approvers(raise_),
        kind=NotificationKind.RAISE_REQUESTED,
        message=message,
        link=reverse("approvals"),
        job=job,
        priority_raise=raise_,
    )
    return raise_


# --- decisions -------------------------------------------------------------------------------


def _locked(raise_: PriorityRaise) -> PriorityRaise:
    return (
        PriorityRaise.objects.select_for_update(of=("self",))
        .select_related(
            "tenant",
            "job",
            "project",
            "project__tenant",
            "to_class",
            "from_class",
            "requested_by",
            "decided_by",
        )
        .get(pk=raise_.pk)
    )


_PAST = {"approve": "approved", "reject": "rejected", "revoke": "revoked", "cancel": "cancelled"}


def _require(user, raise_: PriorityRaise, step: str, state: str) -> None:
    """403 when the user may not take the step; 400 when the raise is not in ``state``."""
    refusal = raise_refusal(user, raise_, step)
    if refusal:
        raise PermissionDeniedError(refusal)
    if raise_.state != state:
        _fail(
            "state",
            f"Raise #{raise_.pk} is {raise_.state}; only {state} raises can be {_PAST[step]}.",
            code="wrong_state",
        )


def _grant_end(raise_: PriorityRaise, now: datetime) -> datetime:
    """A grant lasts the requested hours, at most the class's ``max_grant_hours``; a project
    grant counts from the start of its window and ends with it at the latest."""
    max_hours = raise_.to_class.max_grant_hours
    hours = min(raise_.hours or max_hours, max_hours)
    start = max(now, raise_.window_start) if raise_.window_start else now
    end = start + timedelta(hours=hours)
    return min(end, raise_.window_end) if raise_.window_end else end


def _notify_requester(raise_: PriorityRaise, kind: str, message: str, actor=None) -> None:
    if actor is not None and actor.pk == raise_.requested_by_id:
        return
    notification_send(
        users=[raise_.requested_by],
        kind=kind,
        message=message,
        link=_link(raise_),
        job=raise_.job,
        priority_raise=raise_,
    )


@transaction.atomic
def priority_raise_approve(*, raise_: PriorityRaise, user, comment: str = "") -> PriorityRaise:
    """Grant the raise: the covered jobs run at its class until ``expires_at``; dispatch now."""
    raise_ = _locked(raise_)
    _require(user, raise_, "approve", RaiseState.PENDING)
    if raise_.job_id and raise_.job.state not in RAISABLE_STATES:
        _fail("job", f"Job {raise_.job_id} is {raise_.job.state}: it can no longer be raised.")
    now = timezone.now()
    expires_at = _grant_end(raise_, now)
    if expires_at <= now:
        _fail("window_end", "The raise's window has already ended.")
    before = _raise_state(raise_)
    raise_.state, raise_.decided_by, raise_.decided_at = RaiseState.APPROVED, user, now
    raise_.comment, raise_.expires_at = comment, expires_at
    raise_.save(update_fields=["state", "decided_by", "decided_at", "comment", "expires_at"])
    message = (
        f"Raise #{raise_.pk} to {raise_.to_class.name} approved by {user.get_username()} "
        f"until {expires_at:%Y-%m-%d %H:%M} UTC."
    )
    changes = _sync_classes(
        raise_, raising=True, step="approved", message=message, actor=user, now=now
    )
    audit_record(
        action="priority_raise.approve",
        target=raise_,
        actor=user,
        tenant=raise_.tenant,
        before=before,
        after={**_raise_state(raise_), "jobs": changes},
        reason=comment,
    )
    _notify_requester(raise_, NotificationKind.RAISE_APPROVED, message + _comment(comment))
    dispatch_on_commit()
    return raise_


def _comment(comment: str) -> str:
    return f" Comment: {comment}" if comment else ""


@transaction.atomic
def priority_raise_reject(*, raise_: PriorityRaise, user, comment: str = "") -> PriorityRaise:
    """Refuse a pending raise; the requester is told why (the comment)."""
    raise_ = _locked(raise_)
    _require(user, raise_, "reject", RaiseState.PENDING)
    now = timezone.now()
    before = _raise_state(raise_)
    raise_.state, raise_.decided_by, raise_.decided_at = RaiseState.REJECTED, user, now
    raise_.comment = comment
    raise_.save(update_fields=["state", "decided_by", "decided_at", "comment"])
    message = f"Raise #{raise_.pk} to {raise_.to_class.name} for {_scope_label(raise_)} rejected by {user.get_username()}."
    audit_record(
        action="priority_raise.reject",
        target=raise_,
        actor=user,
        tenant=raise_.tenant,
        before=before,
        after=_raise_state(raise_),
        reason=comment,
    )
    _job_step_event(raise_, "rejected", message + _comment(comment), user, now)
    _notify_requester(raise_, NotificationKind.RAISE_REJECTED, message + _comment(comment))
    return raise_


def _end_grant(raise_: PriorityRaise, *, state: str, step: str, message: str, actor, now) -> list:
    """Close the raise and bring its jobs back to their base class (or another active grant)."""
    was_active = raise_.state == RaiseState.APPROVED
    raise_.state, raise_.ended_at = state, now
    raise_.ended_by = actor if getattr(actor, "is_authenticated", False) else None
    raise_.save(update_fields=["state", "ended_at", "ended_by"])
    if not was_active:
        _job_step_event(raise_, step, message, actor, now)
        return []
    changes = _sync_classes(raise_, raising=False, step=step, message=message, actor=actor, now=now)
    if changes:
        dispatch_on_commit()
    return changes


@transaction.atomic
def priority_raise_revoke(*, raise_: PriorityRaise, user, comment: str = "") -> PriorityRaise:
    """End an active grant early (an approver, or the requester giving it back)."""
    raise_ = _locked(raise_)
    _require(user, raise_, "revoke", RaiseState.APPROVED)
    now = timezone.now()
    before = _raise_state(raise_)
    message = f"Raise #{raise_.pk} to {raise_.to_class.name} revoked by {user.get_username()}.{_comment(comment)}"
    changes = _end_grant(
        raise_,
        state=RaiseState.REVOKED,
        step="revoked",
        message=message,
        actor=user,
        now=now,
    )
    audit_record(
        action="priority_raise.revoke",
        target=raise_,
        actor=user,
        tenant=raise_.tenant,
        before=before,
        after={**_raise_state(raise_), "jobs": changes},
        reason=comment,
    )
    _notify_requester(raise_, NotificationKind.RAISE_REVOKED, message, user)
    return raise_


@transaction.atomic
def priority_raise_cancel(*, raise_: PriorityRaise, user, comment: str = "") -> PriorityRaise:
    """The requester withdraws a pending request."""
    raise_ = _locked(raise_)
    _require(user, raise_, "cancel", RaiseState.PENDING)
    now = timezone.now()
    before = _raise_state(raise_)
    message = f"Raise request #{raise_.pk} cancelled by {user.get_username()}.{_comment(comment)}"
    _end_grant(
        raise_,
        state=RaiseState.CANCELLED,
        step="cancelled",
        message=message,
        actor=user,
        now=now,
    )
    audit_record(
        action="priority_raise.cancel",
        target=raise_,
        actor=user,
        tenant=raise_.tenant,
        before=before,
        after=_raise_state(raise_),
        reason=comment,
    )
    return raise_


# --- time: grants that end, windows that begin (beat, via sweeps.CHECKS) --------------------


def _expire_one(pk: int, now: datetime) -> bool:
    with transaction.atomic():
        raise_ = _locked(PriorityRaise(pk=pk))
        if raise_.state == RaiseState.APPROVED and raise_.expires_at <= now:
            why = f"its grant ended at {raise_.expires_at:%Y-%m-%d %H:%M} UTC"
        elif raise_.state == RaiseState.PENDING and _stale(raise_, now):
            why = "it was not decided before " + (
                "the job ended" if raise_.job_id else "its window ended"
            )
        else:
            return False
        before = _raise_state(raise_)
        message = f"Raise #{raise_.pk} to {raise_.to_class.name} for {_scope_label(raise_)} expired: {why}."
        changes = _end_grant(
            raise_, state=RaiseState.EXPIRED, step="expired", message=message, actor=None, now=now
        )
        audit_record(
            action="priority_raise.expire",
            target=raise_,
            tenant=raise_.tenant,
            before=before,
            after={**_raise_state(raise_), "jobs": changes},
            reason=why,
        )
        _notify_requester(raise_, NotificationKind.RAISE_EXPIRED, message)
        return True


def _stale(raise_: PriorityRaise, now: datetime) -> bool:
    if raise_.job_id:
        return raise_.job.state in FINAL_STATES
    return raise_.window_end <= now


def _activate_one(pk: int, now: datetime) -> bool:
    """A project grant whose window has begun: raise the project's jobs that are still below."""
    with transaction.atomic():
        raise_ = _locked(PriorityRaise(pk=pk))
        if raise_.state != RaiseState.APPROVED or raise_.expires_at <= now:
            return False
        before = _raise_state(raise_)
        message = f"Raise #{raise_.pk} to {raise_.to_class.name}: the window of project {raise_.project} began."
        changes = _sync_classes(
            raise_, raising=True, step="activated", message=message, actor=None, now=now
        )
        if not changes:
            return False
        audit_record(
            action="priority_raise.activate",
            target=raise_,
            tenant=raise_.tenant,
            before=before,
            after={**_raise_state(raise_), "jobs": changes},
            reason="window began",
        )
        dispatch_on_commit()
        return True


def _due_for_activation(now: datetime) -> QuerySet[PriorityRaise]:
    below = Job.objects.filter(
        project_id=OuterRef("project_id"),
        state__in=RAISABLE_STATES,
        priority_class__value__lt=OuterRef("to_class__value"),
    )
    return _active_grants(now).filter(project__isnull=False).filter(Exists(below))


def priority_raises_expire(now: datetime | None = None) -> dict:
    """End the grants whose time is up, expire requests that can no longer be decided, and
    apply project grants whose window has begun. Idempotent; each raise in its own transaction."""
    now = now or timezone.now()
    ended = PriorityRaise.objects.filter(state=RaiseState.APPROVED, expires_at__lte=now)
    stale = PriorityRaise.objects.filter(state=RaiseState.PENDING).filter(
        Q(job__state__in=FINAL_STATES) | Q(project__isnull=False, window_end__lte=now)
    )
    result = {"expired": 0, "activated": 0}
    for pk in [*ended.values_list("pk", flat=True), *stale.values_list("pk", flat=True)]:
        result["expired"] += _guarded(_expire_one, pk, now)
    for pk in _due_for_activation(now).values_list("pk", flat=True):
        result["activated"] += _guarded(_activate_one, pk, now)
    return result


def _guarded(step, pk: int, now: datetime) -> int:
    """One raise failing must not stop the others; it is retried on the next sweep."""
    try:
        return int(step(pk, now))
    except Exception:
        log.exception("priority raise %s: %s failed", pk, step.__name__)
        return 0


# --- the ceiling ----------------------------------------------------------------------------


@transaction.atomic
def tenant_raise_ceiling_set(
    *, actor, tenant: Tenant, ceiling: PriorityClass | None
) -> TenantRaiseCeiling | None:
    """Set (or clear, with None) the highest class the tenant's admins may approve."""
    if not is_platform_admin(actor):
        raise PermissionDeniedError("Only platform admins may set a tenant's raise ceiling.")
    row = TenantRaiseCeiling.objects.filter(tenant=tenant).select_related("ceiling").first()
    before = {"ceiling": row.ceiling.name if row else None}
    if ceiling is None:
        if row is not None:
            row.delete()
        row = None
    elif row is None:
        row = TenantRaiseCeiling.objects.create(tenant=tenant, ceiling=ceiling)
    else:
        row.ceiling = ceiling
        row.save(update_fields=["ceiling"])
    audit_record(
        action="tenant.raise_ceiling",
        target=tenant,
        actor=actor,
        tenant=tenant,
        before=before,
        after={"ceiling": ceiling.name if ceiling else None},
    )
    return row
