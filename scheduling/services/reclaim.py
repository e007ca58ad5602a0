"""Idle-session reclaim and the maximum age of sessions (DESIGN §4 step 4).

Idle reclaim applies to running jobs whose workload policy has ``idle_reclaim_enabled`` (the
interactive policy, normally). A job is idle while every GPU it holds stays below the
policy's ``idle_utilization_threshold``: heartbeats move ``last_active_at`` whenever any of
its GPUs is at or above it (``nodes._mark_active_jobs``), so a job that keeps its GPUs busy
is never idle, whether it prints anything or not. Idle time counts from ``idle_since``: the
latest of its start, its last active sample and the end of an exemption.

- at ``idle_window_seconds - idle_warning_lead_seconds`` of idle time: one warning (event and
  notification; ``idle_warning_sent_at``, cleared when the job is active again);
- at ``idle_window_seconds``: stopped with reason ``reclaimed`` (end state ``RECLAIMED``),
  audited as ``job.reclaim``;
- while ``idle_exempt_until`` is in the future (set by a tenant or platform admin with
  :func:`job_idle_exempt`): neither.

A policy's ``max_session_age_seconds`` ends its sessions (interactive jobs, where the demo
sets it) that old, whether busy or not, with reason ``reclaimed`` and a message that says so.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from audit.services import audit_record
from portal.errors import BusinessError
from tenants.choices import Role
from tenants.selectors import require_role

from ..choices import RAISABLE_STATES, JobState, NotificationKind, ReclaimKind, StopReason
from ..models import Job, WorkloadPolicy
from .lifecycle import job_event
from .stopping import job_stop
from .waste import (
    active_gpu_count,
    gpu_hours_left,
    human_duration,
    idle_exempt,
    idle_since,
    notify_owner,
    reclaim_record_add,
    runtime_elapsed,
)

log = logging.getLogger(__name__)

#: The longest an admin may exempt a job from idle reclaim at once.
MAX_IDLE_EXEMPTION = timedelta(days=7)

_PLACED = (JobState.ADMITTED, JobState.RUNNING)


def _guarded(step, pk: int, *args) -> str | None:
    """One job failing must not stop the others; it is tried again on the next sweep."""
    try:
        return step(pk, *args)
    except Exception:
        log.exception("%s failed for job %s", step.__name__, pk)
        return None


def _locked(pk: int, states) -> Job | None:
    return (
        Job.objects.select_for_update(of=("self",))
        .select_related("tenant", "submitted_by")
        .filter(pk=pk, state__in=states)
        .first()
    )


# --- idle reclaim ------------------------------------------------------------------------------


def idle_action(job: Job, policy: WorkloadPolicy, now: datetime) -> str | None:
    """What idle reclaim does to a running job now: "reclaim", "warn" or nothing."""
    if idle_exempt(job, now):
        return None
    since = idle_since(job, now)
    if since is None:
        return None
    idle = (now - since).total_seconds()
    if idle >= policy.idle_window_seconds:
        return "reclaim"
    warn_at = max(policy.idle_window_seconds - policy.idle_warning_lead_seconds, 0)
    if job.idle_warning_sent_at is None and idle >= warn_at:
        return "warn"
    return None


def _idle_policies() -> dict[str, WorkloadPolicy]:
    return {p.workload_type: p for p in WorkloadPolicy.objects.filter(idle_reclaim_enabled=True)}


def idle_warnings_clear() -> int:
    """Forget the warning of jobs that used their GPUs since it was sent."""
    return Job.objects.filter(
        state=JobState.RUNNING,
        idle_warning_sent_at__isnull=False,
        last_active_at__gt=F("idle_warning_sent_at"),
    ).update(idle_warning_sent_at=None)


def idle_reclaim_check(now: datetime | None = None) -> dict:
    """Warn, then reclaim, the running jobs whose GPUs stayed idle (see the module)."""
    now = now or timezone.now()
    result = {"cleared": idle_warnings_clear(), "warn": 0, "reclaim": 0}
    policies = _idle_policies()
    if not policies:
        return result
    running = Job.objects.filter(state=JobState.RUNNING, workload_type__in=policies).only(
        "pk",
        "workload_type",
        "started_at",
        "last_active_at",
        "idle_exempt_until",
        "idle_warning_sent_at",
    )
    for job in running:
        if idle_action(job, policies[job.workload_type], now):
            outcome = _guarded(_idle_one, job.pk, policies, now)
            if outcome:
                result[outcome] += 1
    return result


@transaction.atomic
def _idle_one(pk: int, policies: dict[str, WorkloadPolicy], now: datetime) -> str | None:
    job = _locked(pk, [JobState.RUNNING])
    if job is None or job.workload_type not in policies:
        return None
    policy = policies[job.workload_type]
    action = idle_action(job, policy, now)
    if action == "warn":
        _idle_warn(job, policy, now)
    elif action == "reclaim":
        _idle_reclaim(job, policy, now)
    return action


def _idle_warn(job: Job, policy: WorkloadPolicy, now: datetime) -> None:
    since = idle_since(job, now)
    reclaim_at = since + timedelta(seconds=policy.idle_window_seconds)
    Job.objects.filter(pk=job.pk, idle_warning_sent_at__isnull=True).update(
        idle_warning_sent_at=now
    )
    message = (
        f"Job {job.pk} ({job.name}) has not used its GPUs (all below "
        f"{policy.idle_utilization_threshold:g} %) for {human_duration((now - since).total_seconds())}: "
        f"it will be reclaimed at {reclaim_at:%Y-%m-%d %H:%M:%S} UTC unless it uses them again."
    )
    job_event(job, "idle_warning", message, data={"reclaim_at": reclaim_at.isoformat()}, now=now)
    notify_owner(job, NotificationKind.IDLE_WARNING, message)


def _idle_reclaim(job: Job, policy: WorkloadPolicy, now: datetime) -> None:
    idle = (now - idle_since(job, now)).total_seconds()
    gpus = active_gpu_count(job)
    message = (
        f"Reclaimed: its GPUs stayed below {policy.idle_utilization_threshold:g} % for "
        f"{human_duration(idle)} (idle window {human_duration(policy.idle_window_seconds)})."
    )
    _reclaim(
        job,
        kind=ReclaimKind.IDLE_RECLAIM,
        message=message,
        gpus=gpus,
        gpu_hours=gpus * idle / 3600,
        detail={"idle_seconds": round(idle), "threshold": policy.idle_utilization_threshold},
        now=now,
    )


def _reclaim(job: Job, *, kind: str, message: str, gpus: int, gpu_hours: float, detail, now):
    """Stop with reason reclaimed, audit ``job.reclaim``, count it, tell the owner."""
    before = job.state
    job_stop(job=job, reason=StopReason.RECLAIMED, message=message, data={"kind": kind, **detail})
    audit_record(
        action="job.reclaim",
        target=job,
        tenant=job.tenant,
        before={"state": before},
        after={"state": job.state, "kind": kind, "gpus": gpus, **detail},
        reason=message,
    )
    reclaim_record_add(kind=kind, job=job, now=now, gpus=gpus, gpu_hours=gpu_hours, detail=detail)
    notify_owner(job, NotificationKind.JOB_RECLAIMED, f"Job {job.pk} ({job.name}): {message}")


# --- maximum session age -----------------------------------------------------------------------


def session_age_check(now: datetime | None = None) -> dict:
    """Stop the placed jobs older than their policy's ``max_session_age_seconds``."""
    now = now or timezone.now()
    policies = {
        p.workload_type: p
        for p in WorkloadPolicy.objects.filter(max_session_age_seconds__isnull=False)
    }
    result = {"reclaimed": 0}
    if not policies:
        return result
    placed = Job.objects.filter(state__in=_PLACED, workload_type__in=policies).only(
        "pk", "workload_type", "started_at", "admitted_at"
    )
    for job in placed:
        if _too_old(job, policies[job.workload_type], now):
            result["reclaimed"] += bool(_guarded(_end_session, job.pk, policies, now))
    return result


def _too_old(job: Job, policy: WorkloadPolicy, now: datetime) -> bool:
    age = runtime_elapsed(job, now)
    return age is not None and age >= policy.max_session_age_seconds


@transaction.atomic
def _end_session(pk: int, policies: dict[str, WorkloadPolicy], now: datetime) -> str | None:
    job = _locked(pk, _PLACED)
    if job is None or not _too_old(job, policies[job.workload_type], now):
        return None
    max_age = policies[job.workload_type].max_session_age_seconds
    gpus = active_gpu_count(job)
    message = (
        f"Session ended: it reached the maximum session age of {human_duration(max_age)} for "
        f"{job.get_workload_type_display().lower()} jobs. Save your work and start a new one."
    )
    _reclaim(
        job,
        kind=ReclaimKind.SESSION_AGE,
        message=message,
        gpus=gpus,
        gpu_hours=gpu_hours_left(job, gpus, now),
        detail={"max_session_age_seconds": max_age},
        now=now,
    )
    return "reclaimed"


# --- exemptions --------------------------------------------------------------------------------


@transaction.atomic
def job_idle_exempt(*, user, job: Job, until: datetime | None, reason: str) -> Job:
    """Exempt a job from idle reclaim until ``until`` (None ends an exemption now).

    Tenant admins of the job's tenant and platform admins; at most ``MAX_IDLE_EXEMPTION``
    ahead. When the exemption ends the idle clock starts again, so a warning comes first.
    """
    require_role(
        user,
        job.tenant_id,
        Role.ADMIN,
        not_found="Job not found.",
        denied="Only tenant admins and platform admins may exempt a job from idle reclaim.",
    )
    reason = (reason or "").strip()
    if not reason:
        raise BusinessError("Say why the job may stay idle.", field="reason")
    job = Job.objects.select_for_update().select_related("tenant", "submitted_by").get(pk=job.pk)
    if job.state not in RAISABLE_STATES:
        raise BusinessError(
            f"Job {job.pk} is {job.state}: only waiting or running jobs can be exempted.",
            field="job",
        )
    now = timezone.now()
    _check_until(until, now)
    before = job.idle_exempt_until
    Job.objects.filter(pk=job.pk).update(idle_exempt_until=until, idle_warning_sent_at=None)
    job.idle_exempt_until, job.idle_warning_sent_at = until, None
    message = (
        f"Exempt from idle reclaim until {until:%Y-%m-%d %H:%M:%S} UTC: {reason}"
        if until
        else f"Exemption from idle reclaim ended: {reason}"
    )
    job_event(job, "idle_exempt", message, actor=user, now=now)
    audit_record(
        action="job.idle_exempt",
        target=job,
        actor=user,
        tenant=job.tenant,
        before={"idle_exempt_until": before.isoformat() if before else None},
        after={"idle_exempt_until": until.isoformat() if until else None},
        reason=reason,
    )
    if user.pk != job.submitted_by_id:
        notify_owner(
            job,
            NotificationKind.IDLE_EXEMPTED,
            f"Job {job.pk} ({job.name}): {message} (by {user.get_username()})",
        )
    return job


def _check_until(until: datetime | None, now: datetime) -> None:
    if until is None:
        return
    if timezone.is_naive(until):
        raise BusinessError("Give the end of the exemption with a time zone.", field="until")
    if until <= now:
        raise BusinessError("The exemption must end in the future.", field="until")
    if until > now + MAX_IDLE_EXEMPTION:
        raise BusinessError(
            f"An exemption lasts at most {human_duration(MAX_IDLE_EXEMPTION.total_seconds())}.",
            field="until",
        )
