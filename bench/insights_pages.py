"""Benchmark: ``GET /insights/`` (24 h, 7 d, 30 d) with 100,000 jobs and 90 days of hour
rollups (2 days of minute rollups) for ~1,000 nodes × 8 GPUs (target: ≤ 300 ms),
as a platform admin and as a tenant admin; and ``GET /nodes/`` with its per-pool summary.

    .venv/bin/python bench/insights_pages.py                       # SQLite in a tmp dir
    .venv/bin/python bench/insights_pages.py \\
        --database-url postgres://postgres@127.0.0.1:5432/sluice_bench_insights

Builds (bulk_create) a throwaway database and removes it at the end: 4 pools, 20 tenants with
3 queues each, 1,000 nodes × 8 GPUs with samples and a ``GpuActivity`` row each, ~2,000
placed jobs, 100,000 jobs in all (ended over 90 days with mixed outcomes, failures with a
few commands and exit codes), 5,000 reclaim records, 2,000 preemption events, and the
rollups the writer keeps: ``QueueRollup`` and ``UsageRollup`` hour rows for 90 days and
minute rows for 2 days (per queue; per pool and per pool × tenant). Then times
``--requests`` requests of each page through the Django test client after two warm-ups and
prints one JSON line per measurement: median, p95, queries, size.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._scratch import drop_database, setup_in_var  # noqa: E402

POOLS = (("training", "H100-80GB", 500), ("inference", "A100-40GB", 200))
POOLS += (("interactive", "L4-24GB", 100), ("general", "A100-80GB", 200))
TENANTS = 20
QUEUES_PER_TENANT = 3
DAYS = 90
MINUTE_DAYS = 2
OUTCOMES = (("SUCCEEDED", 0, 70), ("FAILED", 1, 10), ("FAILED", 137, 4), ("FAILED", 2, 3))
OUTCOMES += (("CANCELLED", None, 8), ("TIMED_OUT", None, 5))
COMMANDS = (["python", "train.py"], ["python", "eval.py", "--fast"], ["bash", "run.sh"])


def _build(jobs_total: int, rng: random.Random) -> dict:  # noqa: C901 (one linear builder)
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from insights.choices import Resolution
    from insights.models import GpuActivity, QueueRollup, UsageRollup
    from scheduling.models import (
        Allocation,
        Gpu,
        Job,
        JobEvent,
        Node,
        PriorityClass,
        Queue,
        Quota,
        ReclaimRecord,
        ResourcePool,
        WorkloadPolicy,
    )
    from tenants.models import Membership, Project, Tenant

    now = timezone.now()
    users = get_user_model()
    root = users.objects.create_user("root", password="x", is_staff=True, is_superuser=True)
    admin = users.objects.create_user("t0-admin", password="x")
    member = users.objects.create_user("member", password="x")
    normal = PriorityClass.objects.create(name="normal", value=400)
    for wt in ("training", "fine_tuning", "evaluation", "inference", "batch_inference"):
        WorkloadPolicy.objects.create(workload_type=wt, max_runtime_seconds=86400)
    WorkloadPolicy.objects.create(workload_type="interactive", max_runtime_seconds=86400)
    pools, gpus = [], []
    for name, model, nodes in POOLS:
        pool = ResourcePool.objects.create(
            name=name, purpose=name if name != "general" else "general"
        )
        pools.append((pool, model, nodes))
        made = Node.objects.bulk_create(
            Node(name=f"{name}-{i:04d}", pool=pool, last_heartbeat=now) for i in range(nodes)
        )
        gpus += Gpu.objects.bulk_create(
            Gpu(
                node=node,
                index=i,
                uuid=f"GPU-{node.name}-{i}",
                model=model,
                memory_mb=81920,
                utilization=rng.choice((0.0, 2.0, 45.0, 90.0)),
                memory_used_mb=1000,
                sampled_at=now,
            )
            for node in made
            for i in range(8)
        )
    tenants, queues, projects = [], [], []
    for t in range(TENANTS):
        tenant = Tenant.objects.create(slug=f"t{t}", name=f"Tenant {t}")
        tenants.append(tenant)
        Membership.objects.create(user=member, tenant=tenant, role="member")
        if t == 0:
            Membership.objects.create(user=admin, tenant=tenant, role="admin")
        project = Project.objects.create(tenant=tenant, slug=f"p{t}", name=f"P{t}")
        projects.append(project)
        for pool, model, nodes in pools:
            Quota.objects.create(
                tenant=tenant, pool=pool, gpu_model=model, guaranteed_gpus=nodes * 8 // TENANTS
            )
        for q in range(QUEUES_PER_TENANT):
            pool = pools[(t + q) % len(pools)][0]
            queues.append(
                Queue.objects.create(
                    tenant=tenant,
                    project=project,
                    name=f"q{q}",
                    pool=pool,
                    default_priority_class=normal,
                    max_self_service_class=normal,
                    allowed_workload_types=["inference"] if pool.name == "inference" else [],
                )
            )
    # jobs: ~2,000 running holding GPUs, the rest ended over 90 days
    weights = [o[2] for o in OUTCOMES]
    batch = []
    running = 2000
    for k in range(jobs_total):
        queue = rng.choice(queues)
        tenant_index = int(queue.tenant.slug[1:])
        if k < running:
            state, code, finished = "RUNNING", None, None
        else:
            state, code, _ = rng.choices(OUTCOMES, weights)[0]
            finished = now - timedelta(seconds=rng.uniform(0, DAYS * 86400))
        submitted = (finished or now) - timedelta(hours=rng.uniform(0.2, 8))
        batch.append(
            Job(
                tenant_id=queue.tenant_id,
                project=projects[tenant_index],
                queue=queue,
                submitted_by=member,
                name=f"job{k}",
                workload_type="inference" if queue.pool.name == "inference" else "training",
                base_priority_class=normal,
                priority_class=normal,
                state=state,
                command=rng.choice(COMMANDS),
                max_runtime_seconds=86400,
                submitted_at=submitted,
                admitted_at=submitted + timedelta(minutes=5),
                started_at=submitted + timedelta(minutes=6),
                finished_at=finished,
                exit_code=code,
                failure_message="Failed." if state == "FAILED" else "",
            )
        )
        if len(batch) == 5000:
            Job.objects.bulk_create(batch)
            batch = []
    Job.objects.bulk_create(batch)
    running_jobs = list(Job.objects.filter(state="RUNNING").order_by("id"))
    allocations, g = [], 0
    for job in running_jobs:
        for _ in range(3):
            if g >= len(gpus):
                break
            allocations.append(
                Allocation(job=job, gpu=gpus[g], node_id=gpus[g].node_id, granted_at=now)
            )
            g += 1
    Allocation.objects.bulk_create(allocations, batch_size=5000)
    GpuActivity.objects.bulk_create(
        (
            GpuActivity(
                gpu=gpu,
                busy_at=now - timedelta(hours=rng.uniform(0, 200)),
                idle_since=now - timedelta(hours=rng.uniform(0, 100)) if i % 3 else None,
                sampled_at=now,
            )
            for i, gpu in enumerate(gpus)
        ),
        batch_size=5000,
    )
    ReclaimRecord.objects.bulk_create(
        (
            ReclaimRecord(
                created_at=now - timedelta(seconds=rng.uniform(0, DAYS * 86400)),
                kind=rng.choice(("idle_reclaim", "timeout", "preemption_requeue")),
                tenant=rng.choice(tenants),
                gpus=1,
                gpu_hours_freed=rng.uniform(0, 5),
            )
            for _ in range(5000)
        ),
        batch_size=5000,
    )
    ended = list(Job.objects.exclude(state="RUNNING").values_list("id", flat=True)[:2000])
    JobEvent.objects.bulk_create(
        (
            JobEvent(
                job_id=jid,
                created_at=now - timedelta(seconds=rng.uniform(0, DAYS * 86400)),
                kind="stop_preempted",
            )
            for jid in ended
        ),
        batch_size=5000,
    )
    rows = 0
    for resolution, step, count in (
        (Resolution.HOUR, timedelta(hours=1), DAYS * 24),
        (Resolution.MINUTE, timedelta(minutes=1), MINUTE_DAYS * 1440),
    ):
        start = now.replace(minute=0, second=0, microsecond=0)
        if resolution == Resolution.MINUTE:
            start = now.replace(second=0, microsecond=0)
        queue_rows, usage_rows = [], []
        for i in range(1, count + 1):
            bucket = start - step * i
            for queue in queues:
                queue_rows.append(
                    QueueRollup(
                        resolution=resolution,
                        bucket=bucket,
                        queue=queue,
                        pool_id=queue.pool_id,
                        tenant_id=queue.tenant_id,
                        pending_jobs=rng.uniform(0, 20),
                        pending_gpus=rng.uniform(0, 40),
                        admitted_jobs=rng.randint(0, 6),
                        wait_p50_seconds=rng.uniform(10, 600),
                        wait_p95_seconds=rng.uniform(600, 7200),
                        wait_max_seconds=rng.uniform(7200, 9000),
                    )
                )
            for pool, model, nodes in pools:
                usage_rows.append(
                    UsageRollup(
                        resolution=resolution,
                        bucket=bucket,
                        pool=pool,
                        tenant=None,
                        gpu_model=model,
                        capacity_gpus=nodes * 8,
                        allocated_gpus=nodes * 6,
                        used_gpus=nodes * 3.5,
                        idle_gpus=nodes * 1.2,
                    )
                )
                for tenant in tenants:
                    usage_rows.append(
                        UsageRollup(
                            resolution=resolution,
                            bucket=bucket,
                            pool=pool,
                            tenant=tenant,
                            gpu_model=model,
                            capacity_gpus=nodes * 8 // TENANTS,
                            allocated_gpus=rng.uniform(0, nodes * 0.6),
                            used_gpus=rng.uniform(0, nodes * 0.3),
                            idle_gpus=rng.uniform(0, nodes * 0.1),
                        )
                    )
            if len(queue_rows) + len(usage_rows) > 20000:
                QueueRollup.objects.bulk_create(queue_rows, batch_size=5000)
                UsageRollup.objects.bulk_create(usage_rows, batch_size=5000)
                rows += len(queue_rows) + len(usage_rows)
                queue_rows, usage_rows = [], []
        QueueRollup.objects.bulk_create(queue_rows, batch_size=5000)
        UsageRollup.objects.bulk_create(usage_rows, batch_size=5000)
        rows += len(queue_rows) + len(usage_rows)
    return {"root": root, "admin": admin, "jobs": Job.objects.count(), "rollup_rows": rows}


def _slowest_queries(client, url: str, n: int = 6) -> list:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        client.get(url)
    ranked = sorted(ctx.captured_queries, key=lambda q: float(q["time"]), reverse=True)
    return [(round(float(q["time"]) * 1000, 1), q["sql"][:160]) for q in ranked[:n]]


def _time(client, url: str, requests: int) -> dict:
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    for _ in range(2):
        assert client.get(url).status_code == 200, url
    times = []
    for _ in range(requests):
        reset_queries()
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200
    with CaptureQueriesContext(connection) as ctx:
        size = len(client.get(url).content)
    times.sort()
    return {
        "median_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[max(0, int(len(times) * 0.95) - 1)], 1),
        "queries": len(ctx.captured_queries),
        "bytes": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=None, help="PostgreSQL URL (default: SQLite)")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=15)
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument(
        "--profile", action="store_true", help="also print each page's slowest queries"
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="SQLite only: build the database in this folder once and reuse it on the next run",
    )
    args = parser.parse_args()
    var = args.keep or Path(tempfile.mkdtemp(prefix="sluice-bench-insights-"))
    reuse = bool(args.keep and (var / "bench.sqlite3").exists() and not args.database_url)
    var.mkdir(parents=True, exist_ok=True)
    try:
        vendor = setup_in_var(args.database_url, var)
        from django.contrib.auth import get_user_model
        from django.test import Client

        started = time.perf_counter()
        if reuse:
            users = get_user_model().objects
            built = {"root": users.get(username="root"), "admin": users.get(username="t0-admin")}
            built |= {"jobs": 0, "rollup_rows": 0}
        else:
            built = _build(args.jobs, random.Random(args.seed))
        if vendor == "postgresql":
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
        print(
            json.dumps(
                {
                    "built": {
                        "jobs": built["jobs"],
                        "rollup_rows": built["rollup_rows"],
                        "seconds": round(time.perf_counter() - started, 1),
                    },
                    "database": vendor,
                }
            ),
            flush=True,
        )
        for who in ("root", "admin"):
            client = Client()
            client.force_login(built[who])
            urls = [f"/insights/?period={p}" for p in ("24h", "7d", "30d")]
            if who == "root":
                urls.append("/nodes/")
            for url in urls:
                figures = _time(client, url, args.requests)
                print(
                    json.dumps(
                        {
                            "page": url,
                            "as": "platform admin" if who == "root" else "tenant admin",
                            "database": vendor,
                            **figures,
                            "target_ms": 300 if url.startswith("/insights") else 150,
                        }
                    ),
                    flush=True,
                )
                if args.profile:
                    for ms, sql in _slowest_queries(client, url):
                        print(f"    {ms:8.1f} ms  {sql}", flush=True)
    finally:
        drop_database(args.database_url)
        if not args.keep:
            shutil.rmtree(var, ignore_errors=True)


if __name__ == "__main__":
    main()
