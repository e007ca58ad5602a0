"""Benchmark: one run of the rollup writer (insights.services.rollups.rollup_write) on a
large cluster.

    .venv/bin/python bench/rollup_writer.py [--database-url sqlite:////tmp/sluice-bench-writer.sqlite3]
                                            [--database-url postgres://postgres@127.0.0.1:5432/sluice_bench_writer]
                                            [--nodes 1000] [--series-points 360] [--runs 5]
                                            [--ended 100000]

Creates a scratch database (dropped at the end) with ``--nodes`` nodes × 8 GPUs in 3 pools ×
3 GPU models, 20 tenants, 60 queues; about 3,250 running jobs of 1, 2, 4 and 8 GPUs holding
~94 % of the GPUs, every GPU sampled a few seconds ago, 5,000 pending jobs, and each running
job's GPU series already ``--series-points`` long (a job in mid-life: the series holds 360 to
720 points). Then runs the writer once a minute (simulated clock): the first run (it
creates every GPU's activity row), ``--runs`` steady runs, and one run in which every series
passes SLUICE_JOB_SERIES_POINTS at once and is merged (the worst case; a real cluster
spreads the merges over time). ``--ended N`` first stores N ended 2-GPU jobs of the past
days with their released allocations (the history a run filters by ``released_at``).

Prints one JSON line per measurement: seconds and queries of a run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._scratch import drop_database, setup_database  # noqa: E402
from bench.rollups_size import build_world, world_job  # noqa: E402

DEFAULT_URL = "sqlite:////tmp/sluice-bench-writer.sqlite3"
PATTERNS = [[8], [4, 4], [2, 2, 2, 2], [1, 1, 1, 1, 1, 1]]


def place_jobs(world, now, *, pending: int = 5000) -> int:
    """Running jobs filling the nodes (patterns of job sizes), sampled GPUs, pending jobs."""
    import random

    from scheduling.models import Allocation, Gpu, Job, Node

    rng = random.Random(3)
    owners = world["owners"]
    queues_of = {}
    for queue in world["queues"]:
        queues_of.setdefault((queue.tenant_id, queue.pool_id), queue)
    gpus_of: dict[int, list] = {}
    for gpu in Gpu.objects.order_by("node_id", "index").only("id", "node_id"):
        gpus_of.setdefault(gpu.node_id, []).append(gpu)
    plan = []  # (job, [gpus], node_id)
    for i, node in enumerate(Node.objects.order_by("id").only("id", "pool_id")):
        free = list(gpus_of[node.pk])
        for size in PATTERNS[i % len(PATTERNS)]:
            tenant, projects, users = owners[rng.randrange(len(owners))]
            queue = queues_of.get((tenant.pk, node.pool_id)) or next(
                q for q in world["queues"] if q.tenant_id == tenant.pk
            )
            job = world_job(
                world,
                tenant,
                project=rng.choice(projects),
                user=rng.choice(users),
                queue=queue,
                name=f"run-{i}-{len(free)}",
                workload_type=rng.choice(["training", "fine_tuning", "evaluation"]),
                state="RUNNING",
                command=("python", "train.py"),
                gpus_per_node=size,
                max_runtime_seconds=86400,
                submitted_at=now - timedelta(hours=3),
                admitted_at=now - timedelta(hours=2),
                started_at=now - timedelta(hours=2),
            )
            plan.append((job, free[:size], node.pk))
            free = free[size:]
    Job.objects.bulk_create([job for job, _, _ in plan], batch_size=2000)
    Allocation.objects.bulk_create(
        [
            Allocation(job=job, gpu=gpu, node_id=node_id, granted_at=job.admitted_at)
            for job, gpus, node_id in plan
            for gpu in gpus
        ],
        batch_size=5000,
    )
    tenant, projects, users = owners[0]
    Job.objects.bulk_create(
        [
            world_job(
                world,
                tenant,
                project=projects[0],
                user=users[0],
                queue=world["queues"][k % 3],
                name=f"wait-{k}",
                state="PENDING",
                gpus_per_node=rng.choice([1, 2, 4, 8]),
                max_runtime_seconds=3600,
                submitted_at=now - timedelta(minutes=rng.randint(1, 600)),
            )
            for k in range(pending)
        ],
        batch_size=2000,
    )
    return len(plan)


def ended_history(world, now, count: int) -> None:
    """``count`` ended 2-GPU jobs of the last 30 days, with their released allocations."""
    import random

    from scheduling.models import Allocation, Gpu, Job

    rng = random.Random(5)
    gpus = list(Gpu.objects.values_list("id", "node_id"))
    tenant, projects, users = world["owners"][1]
    queue = next(q for q in world["queues"] if q.tenant_id == tenant.pk)
    for first in range(0, count, 5000):
        jobs = []
        for k in range(first, min(first + 5000, count)):
            end = now - timedelta(minutes=rng.randint(10, 30 * 1440))
            jobs.append(
                world_job(
                    world,
                    tenant,
                    project=projects[0],
                    user=users[0],
                    queue=queue,
                    name=f"old-{k}",
                    state="SUCCEEDED",
                    gpus_per_node=2,
                    max_runtime_seconds=86400,
                    submitted_at=end - timedelta(hours=2),
                    admitted_at=end - timedelta(hours=1),
                    started_at=end - timedelta(hours=1),
                    finished_at=end,
                )
            )
        Job.objects.bulk_create(jobs, batch_size=2000)
        Allocation.objects.bulk_create(
            [
                Allocation(
                    job=job,
                    gpu_id=gpu_id,
                    node_id=node_id,
                    granted_at=job.admitted_at,
                    released_at=job.finished_at,
                )
                for job in jobs
                for gpu_id, node_id in rng.sample(gpus, 2)
            ],
            batch_size=5000,
        )


def sample_all(moment) -> None:
    """Every GPU sampled a few seconds before ``moment``: GPU i of each node at 13 × i %
    (one UPDATE per index; GPU 0 is idle)."""
    from scheduling.models import Gpu

    for index in range(8):
        Gpu.objects.filter(index=index).update(
            utilization=float(13 * index),
            memory_used_mb=5000 * index,
            sampled_at=moment - timedelta(seconds=5),
        )


def prefill_series(now, points: int) -> int:
    """Each running job's series already ``points`` long (same values for jobs of a size)."""
    from insights.models import JobGpuSeries
    from scheduling.models import Allocation

    held: dict[int, int] = {}
    for job_id in Allocation.objects.filter(released_at__isnull=True).values_list(
        "job_id", flat=True
    ):
        held[job_id] = held.get(job_id, 0) + 1
    start = int(now.timestamp()) - 60 * points
    by_size = {
        size: [[start + 60 * p, [55.5] * size, [40000] * size] for p in range(points)]
        for size in set(held.values())
    }
    JobGpuSeries.objects.bulk_create(
        [
            JobGpuSeries(
                job_id=job_id,
                gpus=[f"n:{g}" for g in range(size)],
                points=by_size[size],
                allocated_gpu_seconds=size * 60.0 * points,
                used_gpu_seconds=size * 30.0 * points,
            )
            for job_id, size in held.items()
        ],
        batch_size=200,
    )
    return len(held)


def timed_run(moment) -> tuple[float, int, object]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from insights.services.rollups import rollup_write

    with CaptureQueriesContext(connection) as ctx:
        started = time.perf_counter()
        run = rollup_write(now=moment)
        elapsed = time.perf_counter() - started
    return elapsed, len(ctx.captured_queries), run


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--series-points", type=int, default=360)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ended", type=int, default=0, help="ended jobs stored first")
    args = parser.parse_args()
    setup_database(args.database_url)
    try:
        from django.conf import settings
        from django.db import connection
        from django.utils import timezone

        world = build_world(nodes=args.nodes)
        now = timezone.now().replace(second=10, microsecond=0)
        if args.ended:
            ended_history(world, now, args.ended)
        jobs = place_jobs(world, now)
        base = {
            "bench": "rollup_writer",
            "database": connection.vendor,
            "gpus": args.nodes * 8,
            "running_jobs": jobs,
            "ended_jobs": args.ended,
        }
        series = prefill_series(now, args.series_points) if args.series_points else 0
        sample_all(now)
        seconds, queries, run = timed_run(now)
        print(
            json.dumps({**base, "run": "first", "seconds": round(seconds, 3), "queries": queries})
        )
        steady = []
        for minute in range(1, args.runs + 1):
            moment = now + timedelta(minutes=minute)
            sample_all(moment)
            seconds, queries, run = timed_run(moment)
            steady.append(seconds)
        print(
            json.dumps(
                {
                    **base,
                    "run": "steady",
                    "series_points": args.series_points,
                    "series": series,
                    "runs": len(steady),
                    "seconds_median": round(statistics.median(steady), 3),
                    "seconds_max": round(max(steady), 3),
                    "queries": queries,
                    "result": run.as_dict(),
                }
            ),
            flush=True,
        )
        # Worst case: every series passes the limit in the same run.
        settings.SLUICE_JOB_SERIES_POINTS = args.series_points + args.runs
        moment = now + timedelta(minutes=args.runs + 1)
        sample_all(moment)
        seconds, queries, run = timed_run(moment)
        print(
            json.dumps(
                {
                    **base,
                    "run": "every_series_merges",
                    "seconds": round(seconds, 3),
                    "queries": queries,
                }
            ),
            flush=True,
        )
    finally:
        drop_database(args.database_url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
