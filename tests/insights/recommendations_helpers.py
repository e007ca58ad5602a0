"""Hand-made history for the recommendation rules: rollup rows, failed jobs, GPU activity,
reclaims and raises, each with the numbers a test states."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from insights.models import GpuActivity, QueueRollup, UsageRollup
from insights.rollups import floor_hour
from scheduling.choices import JobState, RaiseState, ReclaimKind, WorkloadType
from scheduling.models import JobEvent, PriorityRaise, ReclaimRecord
from tests import factories as f
from tests.insights.insights_helpers import queue_row, usage_row

MODEL = "H100-80GB"


def hour_start(now: datetime | None = None) -> datetime:
    return floor_hour(now or timezone.now())


def usage_hours(pool, tenant_allocations: dict, *, hours: int, now=None) -> list[datetime]:
    """``hours`` hourly buckets ending before ``now``: a pool row for each (16 GPUs), and for
    each tenant a row whose allocation is ``values[i]`` (a list) or a constant."""
    end = hour_start(now)
    buckets = [end - timedelta(hours=hours - i) for i in range(hours)]
    rows = []
    for i, bucket in enumerate(buckets):
        rows.append(usage_row(bucket, pool, None, model=MODEL, capacity=16))
        for tenant, values in tenant_allocations.items():
            value = values[i] if isinstance(values, list) else values
            rows.append(
                usage_row(
                    bucket, pool, tenant, model=MODEL, capacity=8, allocated=value, used=value * 0.5
                )
            )
    UsageRollup.objects.bulk_create(rows)
    return buckets


def queue_hours(queue, rows: list[tuple[int, float | None, float]], *, now=None) -> None:
    """One hour row per ``(admitted jobs, p95 wait seconds, pending GPUs)``, the last one
    ending before ``now``."""
    end = hour_start(now)
    QueueRollup.objects.bulk_create(
        queue_row(
            end - timedelta(hours=len(rows) - i),
            queue,
            pending_jobs=pending,
            pending_gpus=pending,
            admitted=admitted,
            p50=p95 / 2 if p95 is not None else None,
            p95=p95,
        )
        for i, (admitted, p95, pending) in enumerate(rows)
    )


def failed_jobs(world, exit_codes: list[int], *, user=None, command=None, hours_ago=2):
    """Failed jobs of ``user`` (the member) in the world's project, one per exit code, each
    having run 30 minutes on 2 GPUs."""
    now = timezone.now()
    jobs = []
    for number, code in enumerate(exit_codes):
        finished = now - timedelta(hours=hours_ago, minutes=number)
        jobs.append(
            f.JobFactory(
                queue=world.queue,
                project=world.project,
                submitted_by=user or world.member,
                state=JobState.FAILED,
                exit_code=code,
                gpus_per_node=2,
                command=command or ["python", "train.py", "--lr", "3e-4"],
                failure_message=f"exited with code {code}",
                submitted_at=finished - timedelta(minutes=40),
                admitted_at=finished - timedelta(minutes=30),
                started_at=finished - timedelta(minutes=30),
                finished_at=finished,
            )
        )
    return jobs


def gpu_activity(node, *, busy_ago: timedelta) -> None:
    """Every GPU of ``node`` last busy ``busy_ago``."""
    now = timezone.now()
    for gpu in node.gpus.all():
        GpuActivity.objects.update_or_create(
            gpu=gpu,
            defaults={"busy_at": now - busy_ago, "idle_since": now - busy_ago, "sampled_at": now},
        )


def idle_reclaims(world, count: int, *, workload_type=WorkloadType.INTERACTIVE, gpus=1) -> None:
    now = timezone.now()
    for number in range(count):
        job = f.JobFactory(
            queue=world.queue,
            project=world.project,
            submitted_by=world.member,
            workload_type=workload_type,
            state=JobState.RECLAIMED,
            submitted_at=now - timedelta(hours=number + 3),
        )
        ReclaimRecord.objects.create(
            created_at=now - timedelta(hours=number + 1),
            kind=ReclaimKind.IDLE_RECLAIM,
            tenant=world.tenant,
            workload_type=workload_type,
            job=job,
            gpus=gpus,
            gpu_hours_freed=gpus * 1.0,
        )


def job_raises(world, count: int, *, to_class=None) -> list[PriorityRaise]:
    """Approved raises of ``count`` jobs of the member in the world's queue."""
    now = timezone.now()
    raises = []
    for number in range(count):
        job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
        raises.append(
            PriorityRaise.objects.create(
                tenant=world.tenant,
                job=job,
                from_class=world.normal,
                to_class=to_class or world.high,
                reason="release",
                requested_by=world.member,
                state=RaiseState.APPROVED,
                decided_by=world.tenant_admin,
                decided_at=now,
                created_at=now - timedelta(days=number + 1),
            )
        )
    return raises


def idle_exemptions(world, count: int) -> None:
    now = timezone.now()
    for number in range(count):
        job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
        JobEvent.objects.create(
            job=job, created_at=now - timedelta(days=number + 1), kind="idle_exempt"
        )


def history_jobs(world, count: int = 12) -> list:
    """Finished jobs of both tenants over the last hours: what a what-if replays."""
    now = timezone.now()
    jobs = []
    for number in range(count):
        other = number % 3 == 0
        submitted = now - timedelta(hours=10) + timedelta(minutes=5 * number)
        started = submitted + timedelta(minutes=1)
        jobs.append(
            f.JobFactory(
                queue=world.other_queue if other else world.queue,
                project=world.other_project if other else world.project,
                submitted_by=world.outsider if other else world.member,
                state=JobState.SUCCEEDED,
                gpus_per_node=4,
                submitted_at=submitted,
                admitted_at=started,
                started_at=started,
                finished_at=started + timedelta(minutes=40),
                max_runtime_seconds=3600,
            )
        )
    return jobs
