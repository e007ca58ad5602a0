"""Hand-made history for the insights page tests: rollup rows, failed jobs, reclaim records
and idle GPUs, written directly (the rollup writer is tested elsewhere)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from insights.choices import Resolution
from insights.models import GpuActivity, QueueRollup, UsageRollup
from insights.rollups import floor_hour
from scheduling.choices import JobState, ReclaimKind
from scheduling.models import Allocation, Job, JobEvent, ReclaimRecord
from tests import factories as f


def hour(now: datetime, hours_ago: int) -> datetime:
    """The start of the hour ``hours_ago`` hours before ``now``'s hour."""
    return floor_hour(now) - timedelta(hours=hours_ago)


def queue_row(
    bucket,
    queue,
    *,
    pending_jobs,
    pending_gpus,
    admitted,
    p50,
    p95,
    wait_max=None,
    resolution=Resolution.HOUR,
) -> QueueRollup:
    """An unsaved rollup row of ``queue`` (an hour's unless ``resolution`` says otherwise)."""
    return QueueRollup(
        resolution=resolution,
        bucket=bucket,
        queue=queue,
        pool=queue.pool,
        tenant=queue.tenant,
        pending_jobs=pending_jobs,
        pending_gpus=pending_gpus,
        admitted_jobs=admitted,
        wait_p50_seconds=p50,
        wait_p95_seconds=p95,
        wait_max_seconds=wait_max,
    )


def usage_row(
    bucket, pool, tenant, *, model="H100-80GB", capacity, allocated=0.0, used=0.0, idle=0.0
) -> UsageRollup:
    """An unsaved hour row of a pool (``tenant`` None) or of a tenant in it."""
    return UsageRollup(
        resolution=Resolution.HOUR,
        bucket=bucket,
        pool=pool,
        tenant=tenant,
        gpu_model=model,
        capacity_gpus=capacity,
        allocated_gpus=allocated,
        used_gpus=used,
        idle_gpus=idle,
    )


def queue_hours(queue, now, hours, *, p50, p95, admitted=2, depth=3.0, wait_max=None):
    """Hour rows of one queue for the last ``hours`` hours, all with the same figures."""
    QueueRollup.objects.bulk_create(
        queue_row(
            hour(now, h + 1),
            queue,
            pending_jobs=depth,
            pending_gpus=depth,
            admitted=admitted,
            p50=p50,
            p95=p95,
            wait_max=wait_max if wait_max is not None else p95,
        )
        for h in range(hours)
    )


def queue_minutes(queue, now, minutes, *, p95, admitted=1, depth=1.0):
    """Minute rows of one queue for the last ``minutes`` minutes."""
    base = now.replace(second=0, microsecond=0)
    QueueRollup.objects.bulk_create(
        queue_row(
            base - timedelta(minutes=m + 1),
            queue,
            pending_jobs=depth,
            pending_gpus=depth,
            admitted=admitted,
            p50=p95 / 2,
            p95=p95,
            wait_max=p95,
            resolution=Resolution.MINUTE,
        )
        for m in range(minutes)
    )


def usage_hours(
    pool, now, hours, *, tenant=None, model="H100-80GB", capacity, allocated, used, idle
):
    """Hour rows of a pool (``tenant`` None) or of a tenant in it."""
    UsageRollup.objects.bulk_create(
        usage_row(
            hour(now, h + 1),
            pool,
            tenant,
            model=model,
            capacity=capacity,
            allocated=allocated,
            used=used,
            idle=idle,
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


def rich_history(world, now: datetime, hours: int = 24 * 7) -> None:
    """A week of varied history for the browser test and the screenshots: queues of both
    tenants waiting more by day, pools filling and emptying, failed jobs, reclaims and idle
    GPUs, and an inference pool near its limit."""
    import math

    from scheduling.choices import PoolPurpose, WorkloadType

    serving = f.PoolFactory(name="serving", purpose=PoolPurpose.INFERENCE)
    node = f.NodeFactory(name="srv-01", pool=serving)
    for i in range(4):
        f.GpuFactory(node=node, index=i, uuid=f"GPU-srv-{i}", model="L40S")
    f.QuotaFactory(
        tenant=world.tenant, pool=serving, gpu_model="L40S", guaranteed_gpus=2, borrow_limit_gpus=1
    )
    serve = f.QueueFactory(
        tenant=world.tenant,
        name="serve",
        pool=serving,
        allowed_workload_types=[WorkloadType.INFERENCE],
        default_priority_class=world.normal,
        max_self_service_class=world.normal,
    )
    eval_q = f.QueueFactory(
        tenant=world.other,
        name="eval",
        pool=world.pool,
        default_priority_class=world.normal,
        max_self_service_class=world.normal,
    )
    queues = [
        (world.queue, 1800, 3.0),
        (world.other_queue, 600, 1.0),
        (eval_q, 300, 0.5),
        (serve, 60, 0.2),
    ]
    queue_rows, usage_rows = [], []
    for h_ago in range(1, hours + 1):
        bucket = hour(now, h_ago)
        day = 0.5 + 0.5 * math.sin((bucket.hour - 6) / 24 * 2 * math.pi)
        for queue, wait, depth in queues:
            queue_rows.append(
                queue_row(
                    bucket,
                    queue,
                    pending_jobs=round(depth * (0.3 + 2 * day), 2),
                    pending_gpus=round(depth * 4 * day, 2),
                    admitted=2 + int(4 * day),
                    p50=wait * (0.2 + day) / 2,
                    p95=wait * (0.3 + 1.5 * day),
                    wait_max=wait * (0.5 + 2 * day),
                )
            )
        alloc_nlp, alloc_vis = round(6 + 6 * day, 1), round(1 + 2 * day, 1)
        for tenant, alloc, use, idle, cap in (
            (None, alloc_nlp + alloc_vis, 0.5 * alloc_nlp + 0.9 * alloc_vis, 0.4 * alloc_nlp, 16),
            (world.tenant, alloc_nlp, 0.5 * alloc_nlp, 0.4 * alloc_nlp, 8),
            (world.other, alloc_vis, 0.9 * alloc_vis, 0.0, 8),
        ):
            usage_rows.append(
                usage_row(
                    bucket, world.pool, tenant, capacity=cap, allocated=alloc, used=use, idle=idle
                )
            )
        serve_alloc = round(2 + 1.0 * day, 1)
        for tenant, cap in ((None, 4), (world.tenant, 2)):
            usage_rows.append(
                usage_row(
                    bucket,
                    serving,
                    tenant,
                    model="L40S",
                    capacity=cap,
                    allocated=serve_alloc,
                    used=serve_alloc * 0.8,
                )
            )
    QueueRollup.objects.bulk_create(queue_rows)
    UsageRollup.objects.bulk_create(usage_rows)
    for i in range(12):
        ago = timedelta(hours=3 + 11 * i)
        ended_job(
            world.queue,
            world.project,
            world.member,
            exit_code=1 if i % 3 else 137,
            command=["python", "train.py", "--config", "big.yaml" if i % 3 else "oom.yaml"],
            finished_ago=ago,
            now=now,
        )
        ended_job(
            world.queue,
            world.project,
            world.member,
            state=JobState.SUCCEEDED,
            exit_code=0,
            finished_ago=ago,
            now=now,
        )
        ended_job(
            world.other_queue,
            world.other_project,
            world.outsider,
            state=JobState.FAILED if i % 4 == 0 else JobState.SUCCEEDED,
            exit_code=2 if i % 4 == 0 else 0,
            workload_type="evaluation",
            command=["python", "eval.py"],
            finished_ago=ago,
            now=now,
        )
        reclaim(
            world.tenant if i % 2 else world.other,
            now,
            gpu_hours=1.5 + i % 4,
            ago=timedelta(hours=5 + 13 * i),
            kind=ReclaimKind.IDLE_RECLAIM if i % 3 else ReclaimKind.PREEMPTION_REQUEUE,
        )
    gpus = list(world.nodes[0].gpus.order_by("index")[:4])
    notebook = f.placed_job(
        gpus=gpus[:2],
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        name="notebook",
    )
    vision_eval = f.placed_job(
        gpus=gpus[2:3],
        queue=world.other_queue,
        project=world.other_project,
        submitted_by=world.outsider,
        name="vision-eval",
    )
    # The jobs holding them started two days ago: a held GPU is idle at most since its job
    # started, so the idle hours charted are the samples' own.
    long_ago = now - timedelta(days=2)
    for job in (notebook, vision_eval):
        Job.objects.filter(pk=job.pk).update(admitted_at=long_ago, started_at=long_ago)
        Allocation.objects.filter(job=job).update(granted_at=long_ago)
    for i, gpu in enumerate(gpus):
        idle_gpu(gpu, now, idle_for=timedelta(hours=30 - 7 * i), busy=i != 3)
    busy = list(world.nodes[1].gpus.order_by("index")[:6])
    for i, gpu in enumerate(busy):
        gpu.utilization = 60.0 + 6 * i
        gpu.save(update_fields=["utilization"])
    trainer = f.placed_job(
        gpus=busy,
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        name="llm-pretrain",
    )
    for i in range(3):
        preemption_event(trainer, now, ago=timedelta(hours=4 + 20 * i))
