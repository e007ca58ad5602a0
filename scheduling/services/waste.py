"""What runtime limits, idle reclaim and recovery share: how much time a job has used and has
left, the ``ReclaimRecord`` rows behind the recovery metrics, and telling a job's owner.

``gpu_hours_freed`` of a ``ReclaimRecord`` (see the model): GPUs × idle time for an idle
reclaim, 1 × time seen for a zombie kill, GPUs × time left until the runtime limit for the
other kinds (0 for a timeout).
"""

from __future__ import annotations

from datetime import datetime

from django.urls import reverse

from ..models import Job, Node, ReclaimRecord
from .notifications import notification_send


def runtime_origin(job: Job) -> datetime | None:
    """Where a job's runtime is counted from: its start, or its admission while not started."""
    return job.started_at or job.admitted_at


def runtime_elapsed(job: Job, now: datetime) -> float | None:
    """Seconds of runtime used so far (None for a job that was never admitted)."""
    origin = runtime_origin(job)
    return None if origin is None else max((now - origin).total_seconds(), 0.0)


def runtime_left(job: Job, now: datetime) -> float | None:
    """Seconds until the job's runtime limit (0 once it is reached; None if never admitted)."""
    elapsed = runtime_elapsed(job, now)
    return None if elapsed is None else max(job.max_runtime_seconds - elapsed, 0.0)


def idle_since(job: Job, now: datetime) -> datetime | None:
    """Since when the job's GPUs have all been idle: its last GPU sample at or above the idle
    threshold, its start, or the end of an idle-reclaim exemption, whichever is latest (an
    exemption that ended restarts the idle clock, so the owner is warned before a reclaim)."""
    marks = [t for t in (job.started_at, job.last_active_at) if t is not None]
    if job.idle_exempt_until is not None and job.idle_exempt_until <= now:
        marks.append(job.idle_exempt_until)
    return max(marks) if marks else None


def idle_exempt(job: Job, now: datetime) -> bool:
    return job.idle_exempt_until is not None and job.idle_exempt_until > now


def active_gpu_count(job: Job) -> int:
    """The GPUs the job holds now."""
    return job.allocations.filter(released_at__isnull=True).count()


def gpu_hours_left(job: Job, gpus: int, now: datetime) -> float:
    """``gpus`` × the time left until the job's runtime limit, in hours."""
    return gpus * (runtime_left(job, now) or 0.0) / 3600


def human_duration(seconds: float) -> str:
    """``90`` → ``"1 min 30 s"``, ``7200`` → ``"2 h"``: durations in messages."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    parts = []
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    for value, unit in ((days, "d"), (hours, "h"), (minutes, "min")):
        if value:
            parts.append(f"{value} {unit}")
    if secs and not days and not hours:
        parts.append(f"{secs} s")
    return " ".join(parts)


def notify_owner(job: Job, kind: str, message: str) -> None:
    """A notification to the job's owner (in the portal, and by mail when mail is on)."""
    notification_send(
        users=[job.submitted_by],
        kind=kind,
        message=message,
        link=reverse("job-detail", args=[job.pk]),
        job=job,
    )


def reclaim_record_add(
    *,
    kind: str,
    now: datetime,
    gpus: int,
    gpu_hours: float,
    job: Job | None = None,
    tenant=None,
    workload_type: str = "",
    node: Node | None = None,
    detail: dict | None = None,
) -> ReclaimRecord:
    """Count one recovery; call it in the transaction of the stop it counts."""
    return ReclaimRecord.objects.create(
        created_at=now,
        kind=kind,
        tenant=tenant if tenant is not None else (job.tenant if job else None),
        workload_type=workload_type or (job.workload_type if job else ""),
        job=job,
        node=node,
        gpus=gpus,
        gpu_hours_freed=round(max(gpu_hours, 0.0), 6),
        detail=detail or {},
    )
