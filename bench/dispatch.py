"""Benchmark: full dispatch cycles and API submission on PostgreSQL (DESIGN §11).

    .venv/bin/python bench/dispatch.py [--database-url postgres://postgres@127.0.0.1:5432/sluice_bench]
                                       [--jobs 1000] [--broker redis://127.0.0.1:6379/15]

Creates (and drops at the end) a scratch database, builds a cluster of 1,000 GPUs
(125 nodes × 8), then measures:

* ``dispatch``: one full dispatch cycle placing N pending jobs onto the empty cluster —
  snapshot load, engine plan, allocations, state changes, events, pending reasons, and the
  launch messages sent on commit (to Redis when ``--broker`` is given, else validated in
  memory). Target: ≥ 1,000 placements/s.
* ``submit_bulk``: ``POST /api/v1/jobs/bulk`` with batches of 500 specs, through the whole
  Django stack (auth, validation, services, audit). Target: ≥ 500 jobs/s sustained.
* ``submit_single``: ``POST /api/v1/jobs`` one job per request, for comparison.
* ``drain`` (``--drain 1000,10000``, instead of the above): 4 nodes × 8 GPUs and N pending
  one-GPU jobs; dispatch cycles one after another, every placed job ended right after its
  cycle (its allocations released, SUCCEEDED, in SQL: no agent, no reports), until none
  waits. What a cycle costs as the backlog shrinks: the dispatch loop's share of an end
  to end drain (``bench/e2e.py`` measures the whole trip). The target: a drain of
  10,000 costs about 10× a drain of 1,000 (≤ 12×), not 100×.

Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _setup(database_url: str, broker: str | None) -> None:
    import psycopg

    base, _, name = database_url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    os.environ.update(
        {
            "DEBUG": "1",
            "DATABASE_URL": database_url,
            "CELERY_TASK_ALWAYS_EAGER": "0",
            "ALLOWED_HOSTS": "testserver,127.0.0.1,localhost",
        }
    )
    os.environ["SLUICE_NODE_TRANSPORT"] = "broker" if broker else "memory"
    if broker:
        os.environ["CELERY_BROKER_URL"] = broker
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _drop(database_url: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    base, _, name = database_url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _world(nodes: int = 125, gpus_per_node: int = 8):
    from django.contrib.auth import get_user_model
    from django.utils import timezone

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

    user = get_user_model().objects.create_user("bench", password="bench-password-123")
    tenant = Tenant.objects.create(slug="bench", name="Bench")
    Membership.objects.create(user=user, tenant=tenant, role="admin")
    project = Project.objects.create(tenant=tenant, slug="p", name="P")
    pool = ResourcePool.objects.create(name="training")
    normal = PriorityClass.objects.create(name="normal", value=400)
    WorkloadPolicy.objects.create(workload_type="training", max_runtime_seconds=86400)
    Quota.objects.create(
        tenant=tenant, pool=pool, guaranteed_gpus=nodes * gpus_per_node, borrow_limit_gpus=0
    )
    queue = Queue.objects.create(
        tenant=tenant,
        name="q",
        pool=pool,
        default_priority_class=normal,
        max_self_service_class=normal,
    )
    now = timezone.now()
    node_rows = Node.objects.bulk_create(
        [Node(name=f"bench-{i:04d}", pool=pool, last_heartbeat=now) for i in range(nodes)]
    )
    Gpu.objects.bulk_create(
        [
            Gpu(node=node, index=i, uuid=f"GPU-{node.name}-{i}", model="H100-80GB", memory_mb=81559)
            for node in node_rows
            for i in range(gpus_per_node)
        ]
    )
    return user, project, queue


def _pending_jobs(user, project, queue, count: int) -> None:
    from django.utils import timezone

    from scheduling.models import Job

    now = timezone.now()
    Job.objects.bulk_create(
        [
            Job(
                tenant_id=project.tenant_id,
                project=project,
                queue=queue,
                submitted_by=user,
                name=f"j{i}",
                workload_type="training",
                base_priority_class=queue.default_priority_class,
                priority_class=queue.default_priority_class,
                command=["true"],
                max_runtime_seconds=3600,
                submitted_at=now,
                gpus_per_node=1,
            )
            for i in range(count)
        ],
        batch_size=1000,
    )
    # As a submission does (scheduling.services.jobs): the dispatch loop's copy of the
    # waiting jobs is stale, and only then (scheduling.services.dispatch._waiting_to_read).
    from scheduling.services.enqueue import _bump_waiting_version

    _bump_waiting_version()


def bench_dispatch(user, project, queue, jobs: int) -> dict:
    from scheduling.models import Allocation, Job
    from scheduling.services.dispatch import dispatch_cycle

    _pending_jobs(user, project, queue, jobs)
    started = time.perf_counter()
    stats = dispatch_cycle()
    elapsed = time.perf_counter() - started
    placed = stats["placed"]
    assert Allocation.objects.filter(released_at__isnull=True).count() == placed
    result = {
        "bench": "dispatch",
        "jobs": jobs,
        "placed": placed,
        "seconds": round(elapsed, 3),
        "placements_per_s": round(placed / elapsed, 1),
        "target_per_s": 1000,
        **{k: stats[k] for k in ("load_ms", "plan_ms", "apply_ms")},
    }
    Allocation.objects.all().delete()
    Job.objects.all().delete()
    return result


def _end_admitted(now) -> int:
    """What the agents' reports would do, in two statements: placed jobs end at once."""
    from scheduling.choices import JobState
    from scheduling.models import Allocation, Job

    Allocation.objects.filter(released_at__isnull=True).update(released_at=now)
    return Job.objects.filter(state=JobState.ADMITTED).update(
        state=JobState.SUCCEEDED, finished_at=now, exit_code=0
    )


def bench_drain(user, project, queue, jobs: int) -> dict:
    from django.utils import timezone

    from scheduling.choices import JobState
    from scheduling.models import Job
    from scheduling.services.dispatch import dispatch_cycle

    _pending_jobs(user, project, queue, jobs)
    cycles, cycle_seconds, written = 0, [], 0
    full_cycles, full_seconds = 0, 0.0
    started = time.perf_counter()
    while Job.objects.filter(state=JobState.PENDING).exists():
        t0 = time.perf_counter()
        stats = dispatch_cycle()
        cycle_seconds.append(time.perf_counter() - t0)
        if stats.get("explained"):
            full_cycles += 1
            full_seconds += cycle_seconds[-1]
        written += stats.get("pending_updated", 0)
        cycles += 1
        _end_admitted(timezone.now())
    elapsed = time.perf_counter() - started
    dispatch_s = sum(cycle_seconds)
    Job.objects.all().delete()
    return {
        "bench": "drain",
        "jobs": jobs,
        "cycles": cycles,
        "seconds": round(elapsed, 2),
        "dispatch_seconds": round(dispatch_s, 2),
        "cycle_ms_first": round(cycle_seconds[0] * 1000, 1),
        "cycle_ms_median": round(sorted(cycle_seconds)[len(cycle_seconds) // 2] * 1000, 1),
        "pending_rows_written": written,
        # Full cycles explain every waiting job (scheduling.services.dispatch._explain_now).
        "full_cycles": full_cycles,
        "full_cycles_seconds": round(full_seconds, 2),
    }


def _spec(project, queue) -> dict:
    return {
        "project": project.pk,
        "queue": queue.pk,
        "workload_type": "training",
        "command": ["true"],
        "gpus_per_node": 1,
    }


def bench_submit(user, project, queue, jobs: int) -> list[dict]:
    from rest_framework.test import APIClient

    from scheduling.models import Job

    client = APIClient()
    client.force_authenticate(user=user)
    results = []
    batch = 500
    started = time.perf_counter()
    for _ in range(max(jobs // batch, 1)):
        response = client.post(
            "/api/v1/jobs/bulk", {"jobs": [_spec(project, queue)] * batch}, format="json"
        )
        assert response.status_code == 201, response.content[:500]
    elapsed = time.perf_counter() - started
    count = Job.objects.count()
    results.append(
        {
            "bench": "submit_bulk",
            "jobs": count,
            "batch": batch,
            "seconds": round(elapsed, 3),
            "jobs_per_s": round(count / elapsed, 1),
            "target_per_s": 500,
        }
    )
    singles = 200
    started = time.perf_counter()
    for _ in range(singles):
        response = client.post("/api/v1/jobs", _spec(project, queue), format="json")
        assert response.status_code == 201, response.content[:500]
    elapsed = time.perf_counter() - started
    results.append(
        {
            "bench": "submit_single",
            "jobs": singles,
            "seconds": round(elapsed, 3),
            "jobs_per_s": round(singles / elapsed, 1),
        }
    )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/sluice_bench")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--broker", default=None, help="send launch messages to this Redis broker")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--drain",
        default="",
        help="comma-separated backlog sizes: measure drains on 4 × 8 GPUs instead (e.g. 1000,10000)",
    )
    args = parser.parse_args()
    _setup(args.database_url, args.broker)
    try:
        if args.drain:
            user, project, queue = _world(nodes=4)
            results = [bench_drain(user, project, queue, int(n)) for n in args.drain.split(",")]
            for line in results:
                print(json.dumps(line), flush=True)
            if len(results) > 1:
                first, last = results[0], results[-1]
                print(
                    json.dumps(
                        {
                            "bench": "drain_ratio",
                            "jobs": [first["jobs"], last["jobs"]],
                            "dispatch_seconds_ratio": round(
                                last["dispatch_seconds"] / first["dispatch_seconds"], 1
                            ),
                            "target": "≤ 12 for 10× the jobs",
                        }
                    ),
                    flush=True,
                )
            return 0
        user, project, queue = _world()
        for _ in range(args.repeat):
            print(json.dumps(bench_dispatch(user, project, queue, args.jobs)), flush=True)
        for line in bench_submit(user, project, queue, 5000):
            print(json.dumps(line), flush=True)
    finally:
        _drop(args.database_url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
