"""The demo's GPU utilization: the jobs ``seed_demo`` stores directly (its recorded week and
its recent jobs) never ran on an agent, so no sample was taken of them. Each gets a
``JobGpuSeries`` of plausible samples (one point an hour of its run), which the job page
charts and the backfill (``rollups_backfill``) bills as used GPU-hours: without them the
demo's usage read 0 GPU-hours used against a thousand allocated."""

from __future__ import annotations

import random

from scheduling.choices import JobState, WorkloadType

from .models import JobGpuSeries

#: Mean utilization (%) a demo job of each type runs at, as a range a job's mean is drawn
#: from; each hour's sample varies around it.
TYPE_UTILIZATION = {
    WorkloadType.TRAINING: (60.0, 95.0),
    WorkloadType.FINE_TUNING: (55.0, 90.0),
    WorkloadType.EVALUATION: (30.0, 70.0),
    WorkloadType.BATCH_INFERENCE: (40.0, 80.0),
    WorkloadType.INTERACTIVE: (2.0, 25.0),
}
#: Failed and reclaimed jobs sat lower (a crash loop, an idle notebook).
LOW_UTILIZATION = (3.0, 30.0)
STEP_SECONDS = 3600


def demo_utilization_series(jobs, *, seed: int = 2026) -> int:
    """A series of samples for each of ``jobs`` (ended, with ``started_at`` and
    ``finished_at``) that has none yet; returns how many were written. Deterministic for a
    seed and the jobs' ids."""
    have = set(
        JobGpuSeries.objects.filter(job_id__in=[j.pk for j in jobs]).values_list(
            "job_id", flat=True
        )
    )
    created = []
    for job in jobs:
        if job.pk in have or job.started_at is None or job.finished_at is None:
            continue
        rng = random.Random(seed * 1_000_003 + job.pk)
        low, high = (
            LOW_UTILIZATION
            if job.state in (JobState.FAILED, JobState.RECLAIMED)
            else TYPE_UTILIZATION.get(job.workload_type, (40.0, 80.0))
        )
        mean = rng.uniform(low, high)
        gpus = job.gpus_per_node * job.nodes
        seconds = max((job.finished_at - job.started_at).total_seconds(), 0.0)
        start = int(job.started_at.timestamp())
        points = []
        for step in range(max(1, int(seconds // STEP_SECONDS) + 1)):
            stamp = start + step * STEP_SECONDS
            if stamp > start + seconds:
                break
            utilization = [
                round(min(max(rng.gauss(mean, 6.0), 0.0), 100.0), 1) for _ in range(gpus)
            ]
            memory = [int(rng.uniform(0.4, 0.9) * 80_000) for _ in range(gpus)]
            points.append([stamp, utilization, memory])
        sampled = [u for point in points for u in point[1]]
        created.append(
            JobGpuSeries(
                job_id=job.pk,
                gpus=[f"gpu{i}" for i in range(gpus)],
                points=points,
                step_seconds=STEP_SECONDS,
                allocated_gpu_seconds=gpus * seconds,
                used_gpu_seconds=gpus * seconds * (sum(sampled) / len(sampled)) / 100.0,
            )
        )
    JobGpuSeries.objects.bulk_create(created, ignore_conflicts=True)
    return len(created)
