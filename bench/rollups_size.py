"""Benchmark: on-disk size of the insights' rollups for 1,000 GPUs over 90 days (target:
target ≤ 200 MB).

    .venv/bin/python bench/rollups_size.py [--database-url sqlite:////tmp/sluice-bench-rollups.sqlite3]
                                           [--database-url postgres://postgres@127.0.0.1:5432/sluice_bench_rollups]

Creates a scratch database (a SQLite file, or a PostgreSQL database, dropped at the end)
with a cluster of 125 nodes × 8 GPUs in 3 pools × 3 GPU models, 20 tenants (5 guarantees
each), 60 queues, 100 users and 60 projects, then writes what the rollup writer keeps at
the default retention:

* minute rows for 2 days (SLUICE_ROLLUP_MINUTE_DAYS): ``QueueRollup`` per queue and
  ``UsageRollup`` per pool × model and per tenant × pool × model with a guarantee;
* hour rows for 90 days (SLUICE_ROLLUP_HOUR_DAYS), the same keys;
* ``UsageDay`` for 90 days (480 owner × workload type × pool × model rows a day);
* ``GpuActivity`` for the 1,000 GPUs;

and measures each table with its indexes (SQLite ``dbstat``, PostgreSQL
``pg_total_relation_size``). A job's GPU series (``JobGpuSeries``, kept as long as the job)
is measured apart, per job: an 8-GPU job at its full 720 points.

Prints one JSON line per table and a total.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._scratch import drop_database, setup_database  # noqa: E402

DEFAULT_URL = "sqlite:////tmp/sluice-bench-rollups.sqlite3"
MODELS = ["H100-80GB", "A100-40GB", "L4-24GB"]
TABLES = [
    "insights_queuerollup",
    "insights_usagerollup",
    "insights_usageday",
    "insights_gpuactivity",
    "insights_jobgpuseries",
]


def world_job(
    world,
    tenant,
    *,
    project,
    user,
    queue,
    name: str,
    state: str,
    gpus_per_node: int,
    max_runtime_seconds: int,
    workload_type: str = "training",
    command: tuple[str, ...] = ("true",),
    **fields,
):
    """An unsaved job of ``tenant`` in ``build_world``'s world, at its normal priority."""
    from scheduling.models import Job

    return Job(
        tenant=tenant,
        project=project,
        queue=queue,
        submitted_by=user,
        name=name,
        workload_type=workload_type,
        base_priority_class=world["normal"],
        priority_class=world["normal"],
        state=state,
        command=list(command),
        gpus_per_node=gpus_per_node,
        max_runtime_seconds=max_runtime_seconds,
        **fields,
    )


def build_world(
    *, nodes: int = 125, gpus_per_node: int = 8, tenants: int = 20, queues_per_tenant: int = 3
):
    """Pools, models, nodes and GPUs, tenants with guarantees, queues, users, projects."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from scheduling.choices import WorkloadType
    from scheduling.models import (
        Gpu,
        Node,
        PriorityClass,
        Queue,
        Quota,
        ResourcePool,
        WorkloadPolicy,
    )
    from tenants.models import Membership, Project, Tenant

    rng = random.Random(20)
    now = timezone.now()
    pools = [ResourcePool.objects.create(name=f"pool{i}") for i in range(3)]
    normal = PriorityClass.objects.create(name="normal", value=400)
    for wt in WorkloadType.values:
        WorkloadPolicy.objects.create(workload_type=wt, max_runtime_seconds=86400)
    combos = [(pool, model) for pool in pools for model in MODELS]
    node_rows = Node.objects.bulk_create(
        [
            Node(name=f"node-{i:04d}", pool=combos[i % len(combos)][0], last_heartbeat=now)
            for i in range(nodes)
        ]
    )
    Gpu.objects.bulk_create(
        [
            Gpu(
                node=node,
                index=g,
                uuid=f"GPU-{node.name}-{g}",
                model=combos[i % len(combos)][1],
                memory_mb=81559,
            )
            for i, node in enumerate(node_rows)
            for g in range(gpus_per_node)
        ]
    )
    User = get_user_model()
    world = {"pools": pools, "combos": combos, "tenants": [], "queues": [], "owners": []}
    for t in range(tenants):
        tenant = Tenant.objects.create(slug=f"team{t:02d}", name=f"Team {t}")
        users = [User.objects.create(username=f"u{t:02d}-{u}") for u in range(5)]
        Membership.objects.bulk_create(
            [Membership(user=u, tenant=tenant, role="member") for u in users]
        )
        projects = [
            Project.objects.create(tenant=tenant, slug=f"p{p}", name=f"P{p}") for p in range(3)
        ]
        for pool, model in rng.sample(combos, 5):
            Quota.objects.create(
                tenant=tenant, pool=pool, gpu_model=model, guaranteed_gpus=rng.choice([8, 16, 32])
            )
        for q in range(queues_per_tenant):
            world["queues"].append(
                Queue.objects.create(
                    tenant=tenant,
                    name=f"q{q}",
                    pool=pools[q % len(pools)],
                    default_priority_class=normal,
                    max_self_service_class=normal,
                )
            )
        world["tenants"].append(tenant)
        world["owners"].append((tenant, projects, users))
    world["normal"] = normal
    return world


def _minutes(days: int, step: timedelta, end: datetime) -> list[datetime]:
    count = int(timedelta(days=days) / step)
    return [end - step * (count - i) for i in range(count)]


def _store(model, rows) -> int:
    """Store ``rows`` (an iterable) in bulk, 20,000 at a time; returns how many."""
    count, batch = 0, []
    for row in rows:
        batch.append(row)
        if len(batch) >= 20000:
            model.objects.bulk_create(batch, batch_size=5000)
            count, batch = count + len(batch), []
    model.objects.bulk_create(batch, batch_size=5000)
    return count + len(batch)


def _queue_rows(world, rng, resolution, buckets):
    from insights.models import QueueRollup

    for bucket in buckets:
        for queue in world["queues"]:
            depth = rng.choice([0, 0, 0, 1, 2, 5, 12])
            admitted = rng.choice([0, 0, 1, 2])
            waits = sorted(rng.uniform(5, 3600) for _ in range(admitted))
            yield QueueRollup(
                resolution=resolution,
                bucket=bucket,
                queue_id=queue.pk,
                pool_id=queue.pool_id,
                tenant_id=queue.tenant_id,
                pending_jobs=float(depth),
                pending_gpus=float(depth * 2),
                admitted_jobs=admitted,
                wait_p50_seconds=waits[len(waits) // 2] if waits else None,
                wait_p95_seconds=waits[-1] if waits else None,
                wait_max_seconds=waits[-1] if waits else None,
            )


def _usage_rows(rng, resolution, buckets, pool_keys, quota_keys):
    from insights.models import UsageRollup

    for bucket in buckets:
        for pool_id, model in pool_keys:
            alloc = rng.uniform(60, 110)
            yield UsageRollup(
                resolution=resolution,
                bucket=bucket,
                pool_id=pool_id,
                gpu_model=model,
                capacity_gpus=111.0,
                allocated_gpus=alloc,
                used_gpus=alloc * rng.uniform(0.3, 0.9),
                idle_gpus=rng.uniform(0, 10),
            )
        for pool_id, model, tenant_id, guaranteed in quota_keys:
            alloc = rng.uniform(0, guaranteed * 1.5)
            yield UsageRollup(
                resolution=resolution,
                bucket=bucket,
                pool_id=pool_id,
                gpu_model=model,
                tenant_id=tenant_id,
                capacity_gpus=float(guaranteed),
                allocated_gpus=alloc,
                used_gpus=alloc * rng.uniform(0.2, 0.9),
                idle_gpus=rng.uniform(0, 2),
            )


def fill_rollups(world, *, minute_days: int = 2, hour_days: int = 90) -> dict:
    """The rows the writer keeps at the default retention (random but plausible values)."""
    from insights.choices import Resolution
    from insights.models import GpuActivity, QueueRollup, UsageDay, UsageRollup
    from scheduling.models import Gpu, Quota

    rng = random.Random(90)
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    quota_keys = list(
        Quota.objects.values_list("pool_id", "gpu_model", "tenant_id", "guaranteed_gpus")
    )
    pool_keys = sorted({(pool.pk, model) for pool, model in world["combos"]})
    counts = {}
    for resolution, step, days in (
        (Resolution.MINUTE, timedelta(minutes=1), minute_days),
        (Resolution.HOUR, timedelta(hours=1), hour_days),
    ):
        buckets = _minutes(
            days, step, end.replace(minute=0) if resolution == Resolution.HOUR else end
        )
        counts[f"queue_{resolution}"] = _store(
            QueueRollup, _queue_rows(world, rng, resolution, buckets)
        )
        counts[f"usage_{resolution}"] = _store(
            UsageRollup, _usage_rows(rng, resolution, buckets, pool_keys, quota_keys)
        )
    days = [(end - timedelta(days=d)).date() for d in range(hour_days)]
    batch = []
    for day in days:
        for tenant, projects, users in world["owners"]:
            for project in projects:
                for user in users[:2]:
                    for wt in ("training", "evaluation"):
                        for pool, model in world["combos"][:2]:
                            hours = rng.uniform(0, 200)
                            batch.append(
                                UsageDay(
                                    day=day,
                                    tenant=tenant,
                                    project=project,
                                    user=user,
                                    workload_type=wt,
                                    pool=pool,
                                    gpu_model=model,
                                    allocated_gpu_hours=hours,
                                    used_gpu_hours=hours * rng.uniform(0.2, 0.9),
                                )
                            )
    UsageDay.objects.bulk_create(batch, batch_size=5000)
    counts["usage_day"] = len(batch)
    GpuActivity.objects.bulk_create(
        [
            GpuActivity(gpu_id=gid, busy_at=end, idle_since=None, sampled_at=end)
            for gid in Gpu.objects.values_list("id", flat=True)
        ]
    )
    counts["gpu_activity"] = Gpu.objects.count()
    return counts


def fill_series(world, *, jobs: int = 100, gpus: int = 8, points: int = 720) -> int:
    """``jobs`` 8-GPU jobs, each with a full GPU series."""
    from django.utils import timezone

    from insights.models import JobGpuSeries
    from scheduling.models import Job

    rng = random.Random(7)
    tenant, projects, users = world["owners"][0]
    queue = next(q for q in world["queues"] if q.tenant_id == tenant.pk)
    now = timezone.now()
    rows = Job.objects.bulk_create(
        [
            world_job(
                world,
                tenant,
                project=projects[0],
                user=users[0],
                queue=queue,
                name=f"series-{i}",
                state="SUCCEEDED",
                gpus_per_node=gpus,
                max_runtime_seconds=86400,
                submitted_at=now,
            )
            for i in range(jobs)
        ]
    )
    start = int(now.timestamp()) - 60 * points
    JobGpuSeries.objects.bulk_create(
        [
            JobGpuSeries(
                job=job,
                gpus=[f"node-0001:{g}" for g in range(gpus)],
                points=[
                    [
                        start + 60 * p,
                        [round(rng.uniform(0, 100), 1) for _ in range(gpus)],
                        [rng.randint(1000, 81000) for _ in range(gpus)],
                    ]
                    for p in range(points)
                ],
                allocated_gpu_seconds=gpus * 60.0 * points,
                used_gpu_seconds=gpus * 30.0 * points,
            )
            for job in rows
        ],
        batch_size=50,
    )
    return jobs


def table_sizes() -> dict[str, int]:
    """Bytes per table, its indexes included."""
    from django.db import connection

    sizes = {}
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                "SELECT m.tbl_name, SUM(s.pgsize) FROM dbstat s JOIN sqlite_master m "
                "ON s.name = m.name GROUP BY m.tbl_name"
            )
            found = dict(cursor.fetchall())
            sizes = {t: int(found.get(t, 0)) for t in TABLES}
        else:
            for table in TABLES:
                cursor.execute("SELECT pg_total_relation_size(%s)", [table])
                sizes[table] = int(cursor.fetchone()[0])
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    setup_database(args.database_url)
    try:
        from django.db import connection

        world = build_world()
        started = time.perf_counter()
        counts = fill_rollups(world)
        fill_series(world)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE")  # what autovacuum would leave
        sizes = table_sizes()
        mb = 1024 * 1024
        rollups = sum(v for k, v in sizes.items() if k != "insights_jobgpuseries")
        for table, size in sizes.items():
            print(json.dumps({"bench": "rollups_size", "table": table, "mb": round(size / mb, 1)}))
        print(
            json.dumps(
                {
                    "bench": "rollups_size",
                    "database": connection.vendor,
                    "gpus": 1000,
                    "rows": counts,
                    "rollups_mb": round(rollups / mb, 1),
                    "target_mb": 200,
                    "series_kb_per_8_gpu_job_720_points": round(
                        sizes["insights_jobgpuseries"] / 100 / 1024, 1
                    ),
                    "fill_seconds": round(time.perf_counter() - started, 1),
                }
            ),
            flush=True,
        )
    finally:
        if not args.keep:
            drop_database(args.database_url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
