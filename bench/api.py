"""Benchmark: what the job API costs the web process, in process, per call.

    .venv/bin/python bench/api.py                          # SQLite in a tmp dir
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/sluice .venv/bin/python bench/api.py
    .venv/bin/python bench/api.py --profile post_one       # and a cProfile of that figure

With ``DATABASE_URL`` (or ``--database-url``) set, a scratch database named after it with
``_bench_api`` added is created on that server and dropped at the end; the database the
URL names is not touched. Without one, a SQLite file in a temporary directory.

Production-like settings (``DEBUG=0``, no eager Celery: the dispatch request after a
submission goes to an in-memory broker). With ``REDIS_URL`` set, the cache is that Redis,
as in production (a submission's dispatch request is then one round trip to it; give a
database no running Sluice uses, e.g. ``redis://127.0.0.1:6379/15``); without, files in
the temporary directory, whose writes cost a submission about a millisecond more.

The world: one pool of 16 nodes × 8 GPUs, 5 tenants with a quota and a queue each, and
``--jobs`` jobs stored in the bench user's tenant (ended, running with their GPUs, and
waiting with ranks), runtime history for the predictions. The bench user is a member of its
tenant and authenticates with an API token (``Authorization: Token ...``), through the
Django test client: the whole stack but the socket and the WSGI server.

Figures (one JSON line each): ``post_one`` (``POST /api/v1/jobs/``, one job),
``post_bulk_100`` (``POST /api/v1/jobs/bulk``, 100 jobs), ``get_list``
(``GET /api/v1/jobs/``, the default page of 50), ``get_one`` (``GET /api/v1/jobs/ID/``):
``cpu_ms`` (process CPU time per call, averaged over ``--calls`` calls after warm-ups; the
database server's own CPU is not in it), ``db_cpu_ms`` (the PostgreSQL backend's CPU per
call, from /proc; null on SQLite) and ``queries`` (SQL statements of one call).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._scratch import _postgres, backend_cpu_seconds, django_start  # noqa: E402

NODES = 16
GPUS_PER_NODE = 8
MODEL = "H100-80GB"
TENANTS = 5
FIGURES = ("post_one", "post_bulk_100", "get_list", "get_one")


def _scratch_url(database_url: str) -> str:
    base, _, name = database_url.rpartition("/")
    return f"{base}/{name.split('?')[0]}_bench_api"


def _setup(database_url: str | None, var: Path) -> str:
    env = {
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "testserver",
        "SECURE_SSL_REDIRECT": "0",
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "CELERY_BROKER_URL": "memory://",
        "SLUICE_NODE_TRANSPORT": "memory",
        "SLUICE_VAR_DIR": str(var),
        "SLUICE_LOG_DIR": str(var / "logs"),
        "SLUICE_AUDIT_ANCHOR": str(var / "audit-anchor.json"),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
    }
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if database_url:
        _postgres(
            database_url,
            'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
            'CREATE DATABASE "{name}"',
        )
        env["DATABASE_URL"] = database_url
    else:
        env["DATABASE_URL"] = f"sqlite:///{var / 'bench.sqlite3'}"
    return django_start(env)


def _world(jobs_total: int) -> dict:  # noqa: C901 (one linear builder)
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from accounts.services import api_token_create
    from scheduling.choices import WorkloadType
    from scheduling.models import (
        Allocation,
        Gpu,
        Job,
        Node,
        PoolEstimates,
        PriorityClass,
        Queue,
        Quota,
        ResourcePool,
        RuntimeHistory,
        WorkloadPolicy,
    )
    from tenants.models import Membership, Project, Tenant

    now = timezone.now()
    users = get_user_model()
    user = users.objects.create_user("bench", password=secrets.token_urlsafe(16))
    others = [users.objects.create_user(f"bench-{i}", password="x") for i in range(4)]
    normal = PriorityClass.objects.create(name="normal", value=400)
    PriorityClass.objects.create(name="low", value=200, preemptible=True)
    pool = ResourcePool.objects.create(name="training")
    for wt in WorkloadType.values:
        policy = WorkloadPolicy.objects.create(
            workload_type=wt, default_runtime_seconds=3600, max_runtime_seconds=86400
        )
        policy.allowed_pools.add(pool)
    gpus = []
    for n in range(NODES):
        node = Node.objects.create(name=f"gpu-{n:02d}", pool=pool, last_heartbeat=now)
        gpus += Gpu.objects.bulk_create(
            Gpu(node=node, index=i, uuid=f"GPU-{n}-{i}", model=MODEL, memory_mb=81920)
            for i in range(GPUS_PER_NODE)
        )
    tenants = []
    for t in range(TENANTS):
        tenant = Tenant.objects.create(slug=f"t{t}", name=f"Tenant {t}")
        tenants.append(tenant)
        Quota.objects.create(tenant=tenant, pool=pool, guaranteed_gpus=64, borrow_limit_gpus=64)
        Membership.objects.create(user=others[t % 4], tenant=tenant, role="member")
    tenant = tenants[0]
    Membership.objects.create(user=user, tenant=tenant, role="member")
    projects = [
        Project.objects.create(tenant=tenant, slug=f"p{i}", name=f"Project {i}") for i in range(3)
    ]
    queue = Queue.objects.create(
        tenant=tenant,
        name="train",
        pool=pool,
        default_priority_class=normal,
        max_self_service_class=normal,
    )
    for p in projects:
        for submitter in (user, None):
            RuntimeHistory.objects.create(
                project=p,
                workload_type="training",
                submitted_by=submitter,
                entries=[[now.timestamp() - i, 0.3 + i / 100] for i in range(20)],
                updated_at=now,
            )

    # Ended, running (one GPU each, 32 of them) and waiting jobs, newest last.
    base = {
        "tenant": tenant,
        "queue": queue,
        "submitted_by": user,
        "workload_type": "training",
        "base_priority_class": normal,
        "priority_class": normal,
        "command": ["python", "train.py", "--epochs", "3"],
        "max_runtime_seconds": 7200,
        "env": {"EPOCHS": "3"},
        "labels": {"team": "bench"},
    }
    rows = []
    running, waiting = 32, min(500, jobs_total // 4)
    ended = max(0, jobs_total - running - waiting)
    for i in range(ended):
        start = now - timedelta(hours=2, minutes=i % 60)
        rows.append(
            Job(
                project=projects[i % 3],
                name=f"old-{i}",
                state="SUCCEEDED",
                submitted_at=start - timedelta(minutes=1),
                admitted_at=start,
                started_at=start,
                finished_at=start + timedelta(minutes=30),
                exit_code=0,
                **base,
            )
        )
    for i in range(running):
        rows.append(
            Job(
                project=projects[i % 3],
                name=f"run-{i}",
                state="RUNNING",
                submitted_at=now - timedelta(minutes=10),
                admitted_at=now - timedelta(minutes=9),
                started_at=now - timedelta(minutes=9),
                **base,
            )
        )
    for i in range(waiting):
        rows.append(
            Job(
                project=projects[i % 3],
                name=f"wait-{i}",
                state="PENDING",
                submitted_at=now - timedelta(minutes=5),
                pending_reason_code="WAITING_FOR_GPUS",
                pending_reason_message="Waiting for 1 H100-80GB in pool training.",
                pending_rank=float(i),
                **base,
            )
        )
    jobs = Job.objects.bulk_create(rows, batch_size=1000)
    if any(j.pk is None for j in jobs):
        jobs = list(Job.objects.order_by("id"))
    running_jobs = [j for j in jobs if j.state == "RUNNING"]
    Allocation.objects.bulk_create(
        Allocation(job=j, node_id=g.node_id, gpu=g, granted_at=now)
        for j, g in zip(running_jobs, gpus, strict=False)
    )
    waiting_jobs = [j for j in jobs if j.state == "PENDING"]
    PoolEstimates.objects.create(
        pool=pool,
        computed_at=now,
        starts={str(j.pk): now.timestamp() + 60 * k for k, j in enumerate(waiting_jobs)},
    )
    _, token = api_token_create(user=user, name="bench", expires_in_days=1)
    spec = {
        "project": projects[0].pk,
        "queue": queue.pk,
        "name": "bench",
        "workload_type": "training",
        "command": ["python", "train.py"],
        "gpus_per_node": 1,
        "max_runtime_seconds": 3600,
        "env": {"EPOCHS": "3"},
        "labels": {"team": "bench"},
    }
    one = (waiting_jobs or jobs)[-1].pk
    return {"token": token, "spec": spec, "job": one}


def _calls(world: dict) -> dict:
    """Each figure as a function making one call through the test client."""
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Token {world['token']}")
    spec = json.dumps(world["spec"])
    bulk = json.dumps({"jobs": [world["spec"]] * 100})

    def check(response, status):
        if response.status_code != status:
            raise SystemExit(f"{response.status_code}: {response.content[:500]!r}")

    def post_one():
        check(client.post("/api/v1/jobs/", spec, content_type="application/json"), 201)

    def post_bulk_100():
        check(client.post("/api/v1/jobs/bulk", bulk, content_type="application/json"), 201)

    def get_list():
        check(client.get("/api/v1/jobs/"), 200)

    def get_one():
        check(client.get(f"/api/v1/jobs/{world['job']}/"), 200)

    return {
        "post_one": post_one,
        "post_bulk_100": post_bulk_100,
        "get_list": get_list,
        "get_one": get_one,
    }


def _measure(name: str, call, calls: int, profile: bool, show_sql: bool) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(3):
        call()
    with CaptureQueriesContext(connection) as ctx:
        call()
    queries = len(ctx.captured_queries)
    if show_sql:
        for query in ctx.captured_queries:
            print(f"[{name}] {query['time']} {query['sql'][:300]}", file=sys.stderr)
    profiler = cProfile.Profile(time.process_time) if profile else None
    db_cpu = backend_cpu_seconds()
    wall, cpu = time.perf_counter(), time.process_time()
    if profiler:
        profiler.enable()
    for _ in range(calls):
        call()
    if profiler:
        profiler.disable()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    db_after = backend_cpu_seconds()
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(
            os.environ.get("BENCH_SORT", "cumulative")
        ).print_stats(90)
        print(out.getvalue(), file=sys.stderr)
    return {
        "figure": name,
        "cpu_ms": round(cpu * 1000 / calls, 2),
        # The PostgreSQL backend serving the calls (from /proc; null on SQLite).
        "db_cpu_ms": None if db_cpu is None else round((db_after - db_cpu) * 1000 / calls, 2),
        "wall_ms": round(wall * 1000 / calls, 2),
        "queries": queries,
        "calls": calls,
        "vendor": connection.vendor,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    parser.add_argument("--calls", type=int, default=100, help="calls per figure (bulk: / 5)")
    parser.add_argument("--jobs", type=int, default=5000, help="jobs stored before measuring")
    parser.add_argument("--only", choices=FIGURES, action="append", help="figures to run")
    parser.add_argument("--profile", choices=FIGURES, action="append", default=[])
    parser.add_argument("--sql", action="store_true", help="print each figure's SQL to stderr")
    args = parser.parse_args()

    database_url = _scratch_url(args.database_url) if args.database_url else None
    var = Path(tempfile.mkdtemp(prefix="sluice-bench-api-"))
    try:
        _setup(database_url, var)
        world = _world(args.jobs)
        from django.db import connection

        if connection.vendor == "postgresql":  # the statistics a live database has
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
        calls = _calls(world)
        for name in args.only or FIGURES:
            n = max(1, args.calls // 5) if name == "post_bulk_100" else args.calls
            result = _measure(name, calls[name], n, name in args.profile, args.sql)
            print(json.dumps(result), flush=True)
    finally:
        from django.db import connections

        connections.close_all()
        if database_url:
            _postgres(database_url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(var, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
