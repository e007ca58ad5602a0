"""Runtime limits (DESIGN §4 step 4): warnings, the stop at the limit, and extensions.

Every job has a runtime limit (``max_runtime_seconds``: its spec, capped by its workload
policy at submit), counted from ``started_at`` (or ``admitted_at`` while it has not started).
At each fraction of ``SLUICE_RUNTIME_WARNINGS`` (0.8 and 0.95 by default) the owner is
warned once (``runtime_warnings_sent``), at the last control sweep before that moment; at
the limit the job is stopped with reason ``timed_out`` and ends ``TIMED_OUT`` when its node
reports the exit.

Before the limit the owner (or a tenant admin) may ask for more time: granted at once while
the job's granted extensions stay within the policy's ``extension_cap_seconds``, otherwise
a pending ``RuntimeExtension`` that a tenant admin or platform admin approves or rejects.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from audit.services import audit_record
from portal.errors import BusinessError, PermissionDeniedError
from scheduling.agent.protocol import extend_message
from tenants.choices import Role
from tenants.selectors import require_role

from ..choices import (
    RAISABLE_STATES,
    ExtensionState,
    JobState,
    NotificationKind,
    ReclaimKind,
    StopReason,
)
from ..limits.selectors import (
    extension_approvers,
    extension_refusal,
    granted_extension_seconds,
    launch_runtime_limit,
)
from ..models import Job, RuntimeExtension, WorkloadPolicy
from ..selectors import can_manage_job
from .enqueue import waiting_changed_on_commit
from .lifecycle import job_event
from .messaging import send_node_messages
from .notifications import notification_send
from .stopping import grace_seconds_for, job_stop
from .waste import (
    active_gpu_count,
    human_duration,
    notify_owner,
    reclaim_record_add,
    runtime_elapsed,
    runtime_origin,
)

log = logging.getLogger(__name__)

#: States whose runtime limit can still be extended (not yet stopping or ended).
EXTENDABLE_STATES = RAISABLE_STATES
#: The most one request may add (the policy's cap decides what needs an approval).
MAX_EXTENSION_SECONDS = 7 * 24 * 3600


def _fail(field: str, message: str, code: str = "invalid") -> None:
    raise BusinessError(message, code=code, field=field)


def warning_fractions() -> list[float]:
    """The configured warning fractions, sorted, each strictly between 0 and 1."""
    return sorted({f for f in settings.SLUICE_RUNTIME_WARNINGS if 0 < f < 1})


def _ends_at(job: Job) -> datetime | None:
    origin = runtime_origin(job)
    return origin + timedelta(seconds=job.max_runtime_seconds) if origin else None


def warning_reached(elapsed: float, fraction: float, limit: int) -> bool:
    """Whether the warning at ``fraction`` of ``limit`` is due after ``elapsed`` seconds.

    It is due at the last control sweep before its moment (at most one control interval
    early), so that no warning is skipped when two fall between two sweeps (95 % of a
    short limit is less than an interval before its end).
    """
    return elapsed + settings.SLUICE_CONTROL_INTERVAL >= fraction * limit


def _due(job: Job, now: datetime, fractions: list[float]) -> tuple[bool, list[float]]:
    """(limit reached, warning fractions due and not yet sent)."""
    elapsed = runtime_elapsed(job, now)
    if elapsed is None:
        return False, []
    limit = job.max_runtime_seconds
    sent = set(job.runtime_warnings_sent or [])
    warn = [f for f in fractions if f not in sent and warning_reached(elapsed, f, limit)]
    return elapsed >= limit, warn


# --- the periodic check (sweeps.CHECKS) ------------------------------------------------------


def runtime_limits_check(now: datetime | None = None) -> dict:
    """Warn the jobs that reached a warning fraction and stop those at their limit.

    Reads the placed jobs in one query, then handles each due job in its own transaction
    under a row lock, re-checking what it read: safe to run twice or beside report handling.
    """
    now = now or timezone.now()
    fractions = warning_fractions()
    result = {"warned": 0, "timed_out": 0}
    placed = Job.objects.filter(state__in=(JobState.ADMITTED, JobState.RUNNING)).only(
        "pk", "state", "started_at", "admitted_at", "max_runtime_seconds", "runtime_warnings_sent"
    )
    for job in placed:
        over, warn = _due(job, now, fractions)
        if over or warn:
            outcome = _guarded(_enforce_one, job.pk, now, fractions)
            if outcome:
                result[outcome] += 1
    return result


def _guarded(step, *args) -> str | None:
    """One job failing must not stop the others; it is tried again on the next sweep."""
    try:
        return step(*args)
    except Exception:
        log.exception("%s failed for %s", step.__name__, args[0])
        return None


@transaction.atomic
def _enforce_one(pk: int, now: datetime, fractions: list[float]) -> str | None:
    job = (
        Job.objects.select_for_update(of=("self",))
        .select_related("tenant", "submitted_by")
        .filter(pk=pk, state__in=(JobState.ADMITTED, JobState.RUNNING))
        .first()
    )
    if job is None:
        return None
    over, warn = _due(job, now, fractions)
    if over:
        _time_out(job, now)
        return "timed_out"
    if warn:
        _warn(job, warn, now)
        return "warned"
    return None


def _warn(job: Job, fractions: list[float], now: datetime) -> None:
    """One timeline line and one notification per fraction reached (normally one)."""
    sent = sorted({*(job.runtime_warnings_sent or []), *fractions})
    Job.objects.filter(pk=job.pk).update(runtime_warnings_sent=sent)
    job.runtime_warnings_sent = sent
    ends_at = _ends_at(job)
    for fraction in fractions:
        message = (
            f"Job {job.pk} ({job.name}) reaches {fraction:.0%} of its runtime limit of "
            f"{human_duration(job.max_runtime_seconds)}: it will be stopped at "
            f"{ends_at:%Y-%m-%d %H:%M:%S} UTC unless its runtime is extended."
        )
        job_event(
            job,
            "runtime_warning",
            message,
            data={"fraction": fraction, "ends_at": ends_at.isoformat()},
            now=now,
        )
        notify_owner(job, NotificationKind.RUNTIME_WARNING, message)


def _time_out(job: Job, now: datetime) -> None:
    """Stop the job (reason timed_out), audit it, count it and tell the owner."""
    limit = job.max_runtime_seconds
    before = job.state
    gpus = active_gpu_count(job)
    message = f"Runtime limit of {human_duration(limit)} reached."
    job_stop(job=job, reason=StopReason.TIMED_OUT, message=message, data={"limit_seconds": limit})
    audit_record(
        action="job.timeout",
        target=job,
        tenant=job.tenant,
        before={"state": before},
        after={"state": job.state, "max_runtime_seconds": limit, "gpus": gpus},
        reason=message,
    )
    reclaim_record_add(
        kind=ReclaimKind.TIMEOUT,
        job=job,
        now=now,
        gpus=gpus,
        gpu_hours=0.0,
        detail={"limit_seconds": limit},
    )
    notify_owner(
        job,
        NotificationKind.JOB_TIMED_OUT,
        f"Job {job.pk} ({job.name}) reached its runtime limit of {human_duration(limit)} "
        "and is being stopped; it ends as TIMED_OUT.",
    )


# --- extensions ------------------------------------------------------------------------------


def _policy(job: Job) -> WorkloadPolicy | None:
    return WorkloadPolicy.objects.filter(workload_type=job.workload_type).first()


def _check_requester(user, job: Job) -> None:
    require_role(
        user,
        job.tenant_id,
        Role.MEMBER,
        not_found="Job not found.",
        denied="Viewers cannot ask for more runtime.",
    )
    if not can_manage_job(user, job):
        raise PermissionDeniedError(
            "Only the job's owner or a tenant admin may ask for more runtime for it."
        )


def _check_extendable(job: Job, seconds: int, now: datetime) -> None:
    if job.state not in EXTENDABLE_STATES:
        _fail(
            "job",
            f"Job {job.pk} is {job.state}: only waiting or running jobs can get more runtime.",
            code="job_not_extendable",
        )
    if not 1 <= seconds <= MAX_EXTENSION_SECONDS:
        _fail(
            "seconds",
            f"Ask for between 1 s and {human_duration(MAX_EXTENSION_SECONDS)} at a time.",
        )
    elapsed = runtime_elapsed(job, now)
    if elapsed is not None and elapsed >= job.max_runtime_seconds:
        _fail(
            "job",
            f"Job {job.pk} has reached its runtime limit; it is being stopped.",
            code="limit_reached",
        )
    waiting = job.runtime_extensions.filter(state=ExtensionState.PENDING).first()
    if waiting is not None:
        _fail(
            "job",
            f"Job {job.pk} already has a pending extension request (#{waiting.pk}).",
            code="duplicate",
        )


def _extension_state(extension: RuntimeExtension) -> dict:
    """The extension as the audit log's before/after shows it."""
    return {
        "state": extension.state,
        "job": extension.job_id,
        "seconds": extension.seconds,
        "decided_by": extension.decided_by.get_username() if extension.decided_by_id else None,
        "comment": extension.comment,
    }


def _apply(job: Job, seconds: int, now: datetime) -> tuple[int, int]:
    """Add ``seconds`` to the (locked) job's limit; forget warnings that no longer apply."""
    old = job.max_runtime_seconds
    new = old + seconds
    elapsed = runtime_elapsed(job, now)
    still = [
        f
        for f in (job.runtime_warnings_sent or [])
        if elapsed is not None and warning_reached(elapsed, f, new)
    ]
    Job.objects.filter(pk=job.pk).update(max_runtime_seconds=new, runtime_warnings_sent=still)
    waiting_changed_on_commit()  # a waiting job's limit is part of what the dispatcher reads
    job.max_runtime_seconds, job.runtime_warnings_sent = new, still
    return old, new


def _raise_executor_limits(job: Job) -> None:
    """Tell the nodes of a job that holds GPUs its new limit (``extend``), once committed:
    an executor with a time limit of its own (Slurm's ``--time``) must not end the job
    before Sluice's own timeout would."""
    nodes = sorted(
        set(job.allocations.filter(released_at__isnull=True).values_list("node__name", flat=True))
    )
    if not nodes:
        return
    message = extend_message(
        job_id=job.pk,
        attempt=job.attempt,
        runtime_limit_seconds=launch_runtime_limit(job, _policy(job)),
        grace_seconds=grace_seconds_for(job),
    )
    transaction.on_commit(lambda: send_node_messages([(node, message) for node in nodes]))


def _grant(extension: RuntimeExtension, job: Job, *, state: str, user, comment: str, now) -> None:
    """Mark the extension granted and add its time to the job; timeline and audit rows."""
    before = _extension_state(extension)
    extension.state, extension.decided_at, extension.comment = state, now, comment
    extension.decided_by = user if state == ExtensionState.APPROVED else None
    extension.save(update_fields=["state", "decided_at", "decided_by", "comment"])
    old, new = _apply(job, extension.seconds, now)
    _raise_executor_limits(job)
    automatic = state == ExtensionState.AUTO_GRANTED
    how = "granted within the policy's cap" if automatic else f"approved by {user.get_username()}"
    job_event(
        job,
        "runtime_extended",
        f"Runtime extended by {human_duration(extension.seconds)}, {how}: limit "
        f"{human_duration(old)} → {human_duration(new)}.",
        actor=user,
        data={"extension": extension.pk, "from": old, "to": new},
        now=now,
    )
    audit_record(
        action="runtime_extension.auto_grant" if automatic else "runtime_extension.approve",
        target=extension,
        actor=user,
        tenant=extension.tenant,
        before=before,
        after={**_extension_state(extension), "max_runtime_seconds": new},
        reason=comment or extension.reason,
    )


@transaction.atomic
def runtime_extension_request(*, user, job: Job, seconds: int, reason: str) -> RuntimeExtension:
    """Ask for ``seconds`` more runtime for a job.

    Granted at once while the job's granted extensions, this one included, stay within its
    policy's ``extension_cap_seconds``; otherwise it waits for an approver, who is notified.
    """
    _check_requester(user, job)
    reason = (reason or "").strip()
    if not reason:
        _fail("reason", "Say why the job needs more time.")
    job = Job.objects.select_for_update().select_related("tenant", "submitted_by").get(pk=job.pk)
    now = timezone.now()
    _check_extendable(job, seconds, now)
    policy = _policy(job)
    cap = policy.extension_cap_seconds if policy else 0
    within_cap = granted_extension_seconds(job) + seconds <= cap
    extension = RuntimeExtension.objects.create(
        job=job,
        tenant=job.tenant,
        seconds=seconds,
        reason=reason,
        requested_by=user,
        created_at=now,
    )
    if within_cap:
        _grant(extension, job, state=ExtensionState.AUTO_GRANTED, user=user, comment="", now=now)
        if user.pk != job.submitted_by_id:
            notify_owner(
                job,
                NotificationKind.EXTENSION_APPROVED,
                f"{user.get_username()} extended the runtime of job {job.pk} by "
                f"{human_duration(seconds)}.",
            )
        return extension
    _ask_approvers(extension, job, user, cap, now)
    return extension


def _ask_approvers(extension: RuntimeExtension, job: Job, user, cap: int, now) -> None:
    message = (
        f"{user.get_username()} asks for {human_duration(extension.seconds)} more runtime for "
        f"job {job.pk} ({job.name}), beyond the {human_duration(cap)} granted without approval: "
        f"{extension.reason}"
    )
    job_event(
        job,
        "extension_requested",
        message,
        actor=user,
        data={"extension": extension.pk, "seconds": extension.seconds},
        now=now,
    )
    audit_record(
        action="runtime_extension.request",
        target=extension,
        actor=user,
        tenant=extension.tenant,
        after=_extension_state(extension),
        reason=extension.reason,
    )
    notification_send(
        users=extension_approvers(extension),
        kind=NotificationKind.EXTENSION_REQUESTED,
        message=message,
        link=reverse("extension-approvals"),
        job=job,
    )


def _locked(extension: RuntimeExtension) -> RuntimeExtension:
    return (
        RuntimeExtension.objects.select_for_update(of=("self",))
        .select_related("tenant", "job", "requested_by", "decided_by")
        .get(pk=extension.pk)
    )


def _require_decision(user, extension: RuntimeExtension) -> None:
    refusal = extension_refusal(user, extension)
    if refusal:
        raise PermissionDeniedError(refusal)
    if extension.state != ExtensionState.PENDING:
        _fail(
            "state",
            f"Extension #{extension.pk} is {extension.state}; only pending ones can be decided.",
            code="wrong_state",
        )


def _tell_requester(extension: RuntimeExtension, kind: str, message: str) -> None:
    notification_send(
        users=[extension.requested_by],
        kind=kind,
        message=message,
        link=reverse("job-detail", args=[extension.job_id]),
        job=extension.job,
    )


@transaction.atomic
def runtime_extension_approve(
    *, extension: RuntimeExtension, user, comment: str = ""
) -> RuntimeExtension:
    """Grant a pending extension: its time is added to the job's runtime limit."""
    extension = _locked(extension)
    _require_decision(user, extension)
    job = Job.objects.select_for_update().select_related("tenant").get(pk=extension.job_id)
    if job.state not in EXTENDABLE_STATES:
        _fail("job", f"Job {job.pk} is {job.state}: it can no longer be extended.")
    now = timezone.now()
    _grant(extension, job, state=ExtensionState.APPROVED, user=user, comment=comment, now=now)
    ends_at = _ends_at(job)
    until = f"; the job now stops at {ends_at:%Y-%m-%d %H:%M:%S} UTC" if ends_at else ""
    _tell_requester(
        extension,
        NotificationKind.EXTENSION_APPROVED,
        f"Extension #{extension.pk} (+{human_duration(extension.seconds)}) for job {job.pk} "
        f"approved by {user.get_username()}{until}." + (f" Comment: {comment}" if comment else ""),
    )
    return extension


@transaction.atomic
def runtime_extension_reject(
    *, extension: RuntimeExtension, user, comment: str = ""
) -> RuntimeExtension:
    """Refuse a pending extension; the requester is told why (the comment)."""
    extension = _locked(extension)
    _require_decision(user, extension)
    now = timezone.now()
    before = _extension_state(extension)
    extension.state, extension.decided_by, extension.decided_at = (
        ExtensionState.REJECTED,
        user,
        now,
    )
    extension.comment = comment
    extension.save(update_fields=["state", "decided_by", "decided_at", "comment"])
    message = (
        f"Extension #{extension.pk} (+{human_duration(extension.seconds)}) for job "
        f"{extension.job_id} rejected by {user.get_username()}."
        + (f" Comment: {comment}" if comment else "")
    )
    job_event(extension.job, "extension_rejected", message, actor=user, now=now)
    audit_record(
        action="runtime_extension.reject",
        target=extension,
        actor=user,
        tenant=extension.tenant,
        before=before,
        after=_extension_state(extension),
        reason=comment,
    )
    _tell_requester(extension, NotificationKind.EXTENSION_REJECTED, message)
    return extension
