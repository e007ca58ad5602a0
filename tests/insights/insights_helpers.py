"""Hand-made history for the insights page tests: rollup rows, failed jobs, reclaim records
and idle GPUs, written directly (the rollup writer is tested elsewhere)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from insights.choices import Resolution
from insights.models import GpuActivity, QueueRollup, UsageRollup
from scheduling.choices import JobState, ReclaimKind
from scheduling.models import JobEvent, ReclaimRecord
from tests import factories as f


def hour(now: datetime, hours_ago: int) -> datetime:
    """The start of the hour ``hours_ago`` hours before ``now``'s hour."""
    return now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours_ago)


def queue_hours(queue, now, hours, *, p50, p95, admitted=2, depth=3.0, wait_max=None):
    """Hour rows of one queue for the last ``hours`` hours, all with the same figures."""
    QueueRollup.objects.bulk_create(
        QueueRollup(
            resolution=Resolution.HOUR,
            bucket=hour(now, h + 1),
            queue=queue,
            pool=queue.pool,
            tenant=queue.tenant,
            pending_jobs=depth,
            pending_gpus=depth,
            admitted_jobs=admitted,
            wait_p50_seconds=p50,
            wait_p95_seconds=p95,
            wait_max_seconds=wait_max if wait_max is not None else p95,
        )
        for h in range(hours)
    )


def queue_minutes(queue, now, minutes, *, p95, admitted=1, depth=1.0):
    """Minute rows of one queue for the last ``minutes`` minutes."""
    base = now.replace(second=0, microsecond=0)
    QueueRollup.objects.bulk_create(
        QueueRollup(
            resolution=Resolution.MINUTE,
            bucket=base - timedelta(minutes=m + 1),
            queue=queue,
            pool=queue.pool,
            tenant=queue.tenant,
            pending_jobs=depth,
            pending_gpus=depth,
            admitted_jobs=admitted,
            wait_p50_seconds=p95 / 2,
            wait_p95_seconds=p95,
            wait_max_seconds=p95,
        )
        for m in range(minutes)
    )


def usage_hours(
    pool, now, hours, *, tenant=None, model="H100-80GB", capacity, allocated, used, idle
):
    """Hour rows of a pool (``tenant`` None) or of a tenant in it."""
    UsageRollup.objects.bulk_create(
        UsageRollup(
            resolution=Resolution.HOUR,
            bucket=hour(now, h + 1),
            pool=pool,
            tenant=tenant,
            gpu_model=model,
            capacity_gpus=capacity,
            allocated_gpus=allocated,
            used_gpus=used,
            idle_gpus=idle,
        )
        for h in range(hours)
    )


def ended_job(
    queue,
    project,
    user,
    *,
    state=JobState.FAILED,
    exit_code=1,
    command=None,
    finished_ago=timedelta(hours=2),
    workload_type="training",
    now=None,
):
    now = now or timezone.now()
    finished = now - finished_ago
    return f.JobFactory(
        queue=queue,
        project=project,
        submitted_by=user,
        state=state,
        exit_code=exit_code,
        command=command or ["python", "train.py"],
        workload_type=workload_type,
        submitted_at=finished - timedelta(hours=1),
        started_at=finished - timedelta(minutes=50),
        finished_at=finished,
        failure_message=f"Failed with exit code {exit_code}." if state == JobState.FAILED else "",
    )


def reclaim(tenant, now, *, kind=ReclaimKind.IDLE_RECLAIM, gpu_hours, ago=timedelta(hours=3)):
    return ReclaimRecord.objects.create(
        created_at=now - ago, kind=kind, tenant=tenant, gpus=1, gpu_hours_freed=gpu_hours
    )


def preemption_event(job, now, ago=timedelta(hours=1)):
    return JobEvent.objects.create(
        job=job, created_at=now - ago, kind="stop_preempted", data={"preemptor": 0}
    )


def idle_gpu(gpu, now, *, idle_for: timedelta, busy=True):
    """``gpu`` idle for ``idle_for`` (last busy then, or never busy since then)."""
    since = now - idle_for
    return GpuActivity.objects.create(
        gpu=gpu, busy_at=since if busy else None, idle_since=since, sampled_at=now
    )
