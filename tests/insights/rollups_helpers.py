"""Hand-made state for the rollup writer's tests: GPU samples and jobs placed at known times."""

from __future__ import annotations

from datetime import UTC, datetime

from scheduling.choices import JobState
from scheduling.models import Gpu, Job
from tests import factories as f

T0 = datetime(2026, 3, 2, 10, 5, 30, tzinfo=UTC)


def at(hour: int, minute: int, second: int = 0, *, day: int = 2) -> datetime:
    """A moment of March 2026 (UTC)."""
    return datetime(2026, 3, day, hour, minute, second, tzinfo=UTC)


def gpus_of(node) -> list[Gpu]:
    return list(Gpu.objects.filter(node=node).order_by("index"))


def sample(
    gpu: Gpu, utilization: float | None, memory_mb: int | None = 1000, *, sampled_at
) -> None:
    """What a heartbeat stores for one GPU."""
    Gpu.objects.filter(pk=gpu.pk).update(
        utilization=utilization, memory_used_mb=memory_mb, sampled_at=sampled_at
    )


def placed(
    world,
    gpus: list[Gpu],
    *,
    granted_at: datetime,
    queue=None,
    project=None,
    user=None,
    state: str = JobState.RUNNING,
    released_at: datetime | None = None,
    **fields,
) -> Job:
    """A job holding ``gpus`` since ``granted_at`` (released at ``released_at`` if given)."""
    queue = queue or world.queue
    job = f.JobFactory(
        queue=queue,
        project=project
        or (world.project if queue.tenant_id == world.tenant.pk else world.other_project),
        submitted_by=user or world.member,
        state=state,
        gpus_per_node=len(gpus),
        submitted_at=fields.pop("submitted_at", granted_at),
        admitted_at=granted_at,
        started_at=granted_at,
        finished_at=released_at,
        **fields,
    )
    for gpu in gpus:
        f.AllocationFactory(
            job=job, gpu=gpu, node=gpu.node, granted_at=granted_at, released_at=released_at
        )
    return job


def pending(world, *, gpus: int = 1, queue=None, state: str = JobState.PENDING, **fields) -> Job:
    queue = queue or world.queue
    return f.JobFactory(
        queue=queue,
        project=world.project if queue.tenant_id == world.tenant.pk else world.other_project,
        submitted_by=world.member,
        state=state,
        gpus_per_node=gpus,
        **fields,
    )


def admitted(world, *, submitted_at, admitted_at, queued_at=None, queue=None, **fields) -> Job:
    """A job admitted at ``admitted_at`` (no allocation: only its times matter)."""
    return pending(
        world,
        queue=queue,
        state=JobState.ADMITTED,
        submitted_at=submitted_at,
        admitted_at=admitted_at,
        queued_at=queued_at,
        **fields,
    )


def without_backfilled_history() -> None:
    """Drop the history seed_demo rolled up, for a test that writes its own."""
    from insights.models import QueueRollup, UsageDay, UsageRollup

    for model in (QueueRollup, UsageDay, UsageRollup):
        model.objects.all().delete()
