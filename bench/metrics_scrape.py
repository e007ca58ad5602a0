"""Benchmark: one ``GET /metrics`` scrape with 1,000 nodes × 8 GPUs and 100,000 jobs stored
(target: ≤ 200 ms), and ``GET /api/v1/metrics/summary`` on the same data.

    .venv/bin/python bench/metrics_scrape.py                       # SQLite in a tmp dir
    .venv/bin/python bench/metrics_scrape.py \\
        --database-url postgres://postgres@127.0.0.1:5432/sluice_bench_metrics

Builds (bulk_create) a throwaway database and removes it at the end: 4 pools, 20 tenants
with 3 queues each, 1,000 nodes × 8 GPUs with fresh utilization samples, ~6,000 GPUs
allocated to ~2,000 placed jobs, 10,000 pending and 500 held jobs with reasons, the rest
ended with mixed outcomes (some preempted before), 5,000 reclaim records, and admission
waits and dispatch cycles observed into the multiprocess directory. Then times
``--scrapes`` scrapes through the Django test client (the whole stack: middleware, access
check, database reads, text rendering; gzip as Prometheus asks for it) after two warm-up
scrapes, and prints one JSON line per measurement: median, p95, queries, size.
"""

from __future__ import annotations

import argparse
import json
import os
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

POOLS = (("training", "H100-80GB", 81559, 500), ("inference", "A100-40GB", 40960, 200))
POOLS += (("interactive", "L4-24GB", 23034, 100), ("general", "A100-80GB", 81920, 200))
TENANTS = 20
QUEUES_PER_TENANT = 3
REASONS = (
    "WAITING_FOR_QUOTA",
    "WAITING_FOR_GPUS",
    "RESERVED_FOR_HIGHER_PRIORITY",
    "BLOCKED_BY_QUEUE_HEAD",
    "EXCEEDS_QUOTA_LIMIT",
    "",
)
OUTCOMES = (
    ("SUCCEEDED", "", 0, None, 60),
    ("FAILED", "", 1, None, 12),
    ("FAILED", "", None, 9, 3),
    ("CANCELLED", "cancelled", None, 15, 8),
    ("CANCELLED", "", None, None, 5),
    ("TIMED_OUT", "timed_out", None, 15, 5),
    ("RECLAIMED", "reclaimed", None, 15, 4),
    ("PREEMPTED", "preempted", None, 15, 2),
    ("LOST", "lost", None, None, 1),
)


def _build(jobs_total: int, nodes_scale: float, rng: random.Random) -> dict:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from scheduling.models import (
        Allocation,
        Gpu,
        Job,
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
    admin = users.objects.create_user("bench-admin", password="x", is_staff=True)
    member = users.objects.create_user("bench-member", password="x")
    classes = [
        PriorityClass.objects.create(name=name, value=value, preemptible=value < 500)
        for name, value in (("low", 100), ("normal", 400), ("high", 800))
    ]
    types = ["training", "fine_tuning", "evaluation", "inference", "batch_inference", "interactive"]
    for workload_type in types:
        WorkloadPolicy.objects.create(workload_type=workload_type)
    pools = {name: ResourcePool.objects.create(name=name) for name, *_ in POOLS}
    tenants = Tenant.objects.bulk_create(
        [Tenant(slug=f"team-{i:02d}", name=f"Team {i}") for i in range(TENANTS)]
    )
    Membership.objects.create(user=member, tenant=tenants[0], role="member")
    projects = Project.objects.bulk_create(
        [Project(tenant=t, slug="main", name="Main") for t in tenants]
    )
    Quota.objects.bulk_create(
        [
            Quota(tenant=t, pool=p, guaranteed_gpus=16, borrow_limit_gpus=16)
            for t in tenants
            for p in pools.values()
        ]
    )
    queues = Queue.objects.bulk_create(
        [
            Queue(
                tenant=t,
                name=f"q{j}",
                pool=list(pools.values())[(i + j) % len(pools)],
                default_priority_class=classes[1],
                max_self_service_class=classes[1],
            )
            for i, t in enumerate(tenants)
            for j in range(QUEUES_PER_TENANT)
        ]
    )
    project_of = {p.tenant_id: p for p in projects}

    nodes, gpus = [], []
    for pool_name, _model, _memory, count in POOLS:
        for i in range(max(1, round(count * nodes_scale))):
            nodes.append(
                Node(
                    name=f"{pool_name}-{i:04d}",
                    pool=pools[pool_name],
                    state="ready" if rng.random() > 0.01 else "down",
                    last_heartbeat=now - timedelta(seconds=rng.uniform(0, 20)),
                )
            )
    nodes = Node.objects.bulk_create(nodes, batch_size=1000)
    model_of = {name: (model, memory) for name, model, memory, _ in POOLS}
    for node in nodes:
        model, memory = model_of[node.pool.name]
        for index in range(8):
            gpus.append(
                Gpu(
                    node=node,
                    index=index,
                    uuid=f"GPU-{node.pk:08x}-{index:04x}-4c1e-9b3a-{rng.getrandbits(48):012x}",
                    model=model,
                    memory_mb=memory,
                    utilization=rng.choice([0.0, 2.0, 35.0, 80.0, 97.0]),
                    memory_used_mb=rng.randrange(0, memory),
                    sampled_at=now - timedelta(seconds=rng.uniform(0, 20)),
                )
            )
    gpus = Gpu.objects.bulk_create(gpus, batch_size=2000)
    gpus_by_pool: dict[int, list] = {}
    node_pool = {n.pk: n.pool_id for n in nodes}
    for gpu in gpus:
        gpus_by_pool.setdefault(node_pool[gpu.node_id], []).append(gpu)

    def job(queue, state: str, **fields):
        tenant_id = queue.tenant_id
        return Job(
            tenant_id=tenant_id,
            project=project_of[tenant_id],
            queue=queue,
            submitted_by=member,
            name="bench",
            workload_type=rng.choice(types),
            base_priority_class=classes[1],
            priority_class=rng.choice(classes),
            state=state,
            command=["python", "train.py"],
            max_runtime_seconds=4 * 3600,
            submitted_at=now - timedelta(seconds=rng.uniform(60, 30 * 86400)),
            **fields,
        )

    # Placed jobs: 1, 2, 4 or 8 GPUs of one node, ~75 % of the GPUs.
    placed, placed_gpus = [], []
    for pool_id, pool_gpus in gpus_by_pool.items():
        pool_queues = [q for q in queues if q.pool_id == pool_id]
        by_node: dict[int, list] = {}
        for gpu in pool_gpus:
            by_node.setdefault(gpu.node_id, []).append(gpu)
        for node_gpus in by_node.values():
            free = list(node_gpus)
            while len(free) > 2:
                size = min(rng.choice([1, 2, 4, 8]), len(free) - 2 if len(free) > 2 else 1)
                taken, free = free[:size], free[size:]
                state = rng.choice(["RUNNING"] * 8 + ["ADMITTED", "STOPPING"])
                placed.append(
                    job(
                        rng.choice(pool_queues),
                        state,
                        gpus_per_node=size,
                        admitted_at=now - timedelta(seconds=rng.uniform(0, 3600)),
                        started_at=now - timedelta(seconds=rng.uniform(0, 3600)),
                    )
                )
                placed_gpus.append(taken)
    placed = Job.objects.bulk_create(placed, batch_size=1000)
    Allocation.objects.bulk_create(
        [
            Allocation(job=j, gpu=g, node_id=g.node_id, granted_at=now, borrowed=rng.random() < 0.2)
            for j, taken in zip(placed, placed_gpus, strict=True)
            for g in taken
        ],
        batch_size=2000,
    )
    waiting = []
    for i in range(10_500):
        queue = rng.choice(queues)
        if i < 500:
            waiting.append(job(queue, "HELD"))
        else:
            waiting.append(
                job(
                    queue,
                    "PENDING",
                    gpus_per_node=rng.choice([1, 2, 4, 8]),
                    pending_reason_code=rng.choice(REASONS),
                    queued_at=now - timedelta(seconds=rng.uniform(0, 86400))
                    if rng.random() < 0.1
                    else None,
                )
            )
    Job.objects.bulk_create(waiting, batch_size=1000)
    ended_total = max(jobs_total - len(placed) - len(waiting), 0)
    weights = [o[4] for o in OUTCOMES]
    batch = []
    for i in range(ended_total):
        state, stop_reason, code, signal, _w = rng.choices(OUTCOMES, weights)[0]
        batch.append(
            job(
                rng.choice(queues),
                state,
                stop_reason=stop_reason,
                exit_code=code,
                exit_signal=signal,
                preemption_count=1 if rng.random() < 0.05 else 0,
                finished_at=now - timedelta(seconds=rng.uniform(0, 30 * 86400)),
            )
        )
        if len(batch) == 5000 or i == ended_total - 1:
            Job.objects.bulk_create(batch, batch_size=1000)
            batch = []
    kinds = ["timeout", "idle_reclaim", "preemption_requeue", "lost_requeue", "zombie_kill"]
    ReclaimRecord.objects.bulk_create(
        [
            ReclaimRecord(
                created_at=now - timedelta(seconds=rng.uniform(0, 30 * 86400)),
                kind=rng.choice(kinds),
                tenant=rng.choice(tenants),
                workload_type=rng.choice(types),
                gpus=1,
                gpu_hours_freed=rng.uniform(0, 8),
            )
            for _ in range(5000)
        ],
        batch_size=1000,
    )
    return {
        "admin": admin,
        "member": member,
        "queues": queues,
        "nodes": len(nodes),
        "gpus": len(gpus),
        "jobs": Job.objects.count(),
        "placed_jobs": len(placed),
        "allocated_gpus": sum(len(t) for t in placed_gpus),
    }


_COUNTS = ("nodes", "gpus", "jobs", "placed_jobs", "allocated_gpus")


def _reload() -> dict:
    from django.contrib.auth import get_user_model

    world = json.loads((Path(os.environ["SLUICE_VAR_DIR"]) / "built").read_text())
    users = get_user_model().objects
    world["admin"] = users.get(username="bench-admin")
    world["member"] = users.get(username="bench-member")
    return world


def _observe_events(queues, rng: random.Random) -> None:
    """What the dispatch leader would have observed: admission waits in every queue for
    every class, and cycles."""
    from insights import instrument

    histogram = instrument._get().admission_wait
    for queue in queues:
        for cls in ("low", "normal", "high"):
            labels = histogram.labels(queue.pool.name, queue.tenant.slug, str(queue), cls)
            for _ in range(5):
                labels.observe(rng.uniform(0, 7200))
    for _ in range(500):
        instrument.dispatch_cycle_observe(rng.uniform(0.005, 0.5))


def _time(client, path: str, scrapes: int, **headers) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(2):
        response = client.get(path, **headers)
        assert response.status_code == 200, (response.status_code, response.content[:300])
    seconds, cpu, queries = [], [], 0
    for _ in range(scrapes):
        with CaptureQueriesContext(connection) as ctx:
            started, cpu_started = time.perf_counter(), time.process_time()
            response = client.get(path, **headers)
            seconds.append(time.perf_counter() - started)
            cpu.append(time.process_time() - cpu_started)
        assert response.status_code == 200
        queries = len(ctx.captured_queries)
    seconds.sort()
    p95 = seconds[min(len(seconds) - 1, round(0.95 * (len(seconds) - 1)))]
    return {
        "path": path,
        "scrapes": scrapes,
        "median_ms": round(statistics.median(seconds) * 1000, 1),
        "p95_ms": round(p95 * 1000, 1),
        "min_ms": round(seconds[0] * 1000, 1),
        # This process's CPU (with SQLite, the database's too): what a busy shared machine
        # does not inflate.
        "cpu_median_ms": round(statistics.median(cpu) * 1000, 1),
        "queries": queries,
        "bytes": len(response.content),
        "gzip": response.get("Content-Encoding") == "gzip",
    }


def _read_split(scrapes: int) -> dict:
    """Where a scrape's time goes: the database part read and rendered, the events merged."""
    from insights import metrics

    reads, renders, events = [], [], []
    for _ in range(scrapes):
        t0 = time.perf_counter()
        families = metrics.database_families()
        t1 = time.perf_counter()
        "".join(f.render() for f in families.values())
        t2 = time.perf_counter()
        metrics.events_text()
        t3 = time.perf_counter()
        reads.append(t1 - t0)
        renders.append(t2 - t1)
        events.append(t3 - t2)
    return {
        "split": "median ms",
        "database_read_ms": round(statistics.median(reads) * 1000, 1),
        "render_ms": round(statistics.median(renders) * 1000, 1),
        "events_merge_ms": round(statistics.median(events) * 1000, 1),
        "samples": sum(len(f.samples) for f in families.values()),
    }


def _query_split(scrapes: int) -> dict:
    """The database read, part by part (median ms)."""
    from django.utils import timezone

    from insights import metrics
    from scheduling.models import Node, Quota

    parts = {
        "queues": metrics.queue_labels,
        "waiting": metrics.waiting_by_queue,
        "gpus": lambda: metrics.gpu_state(timezone.now(), metrics.queue_labels()),
        "quotas": lambda: list(Quota.objects.values_list("tenant__slug", "pool__name")),
        "nodes": lambda: list(
            Node.objects.values_list("name", "pool__name", "state", "last_heartbeat").order_by()
        ),
    }
    background = {
        "job_totals": metrics.job_totals,
        "reclaims": metrics.reclaim_totals,
        "totals_refresh": metrics.totals_refresh,
    }
    found = {}
    for name, read in parts.items():
        seconds = []
        for _ in range(scrapes):
            t0 = time.perf_counter()
            read()
            seconds.append(time.perf_counter() - t0)
        found[f"{name}_ms"] = round(statistics.median(seconds) * 1000, 1)
    found["beat_task"] = "(outside the scrape, every SLUICE_METRICS_TOTALS_INTERVAL s)"
    for name, read in background.items():
        seconds = []
        for _ in range(3):
            t0 = time.perf_counter()
            read()
            seconds.append(time.perf_counter() - t0)
        found[f"{name}_ms"] = round(statistics.median(seconds) * 1000, 1)
    return {"split": "database read, median ms", **found}


def _refresh_samples() -> None:
    """The agents' samples and heartbeats as of now (building takes longer than the time a
    sample stays current), and the beat task's totals."""
    from django.utils import timezone

    from insights.metrics import totals_refresh
    from scheduling.models import Gpu, Node

    now = timezone.now()
    Gpu.objects.update(sampled_at=now)
    Node.objects.update(last_heartbeat=now)
    totals_refresh()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None, help="PostgreSQL URL (default: SQLite)")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--nodes-scale", type=float, default=1.0, help="1.0: 1,000 nodes")
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument(
        "--keep",
        default=None,
        help="SQLite only: keep the data in this directory and reuse it in the next run",
    )
    args = parser.parse_args()
    reuse = bool(args.keep and not args.database_url and (Path(args.keep) / "built").exists())
    var = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sluice-bench-metrics-"))
    var.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20)
    try:
        vendor = setup_in_var(args.database_url, var)
        started = time.perf_counter()
        if reuse:
            world = _reload()
        else:
            world = _build(args.jobs, args.nodes_scale, rng)
            _observe_events(world["queues"], rng)
            if args.keep:
                (var / "built").write_text(json.dumps({k: world[k] for k in _COUNTS}))
        from django.test import Client

        print(
            json.dumps(
                {
                    "bench": "metrics_setup",
                    "database": vendor,
                    "nodes": world["nodes"],
                    "gpus": world["gpus"],
                    "jobs": world["jobs"],
                    "placed_jobs": world["placed_jobs"],
                    "allocated_gpus": world["allocated_gpus"],
                    "build_s": round(time.perf_counter() - started, 1),
                }
            ),
            flush=True,
        )
        _refresh_samples()
        client = Client(REMOTE_ADDR="127.0.0.1")
        line = _time(client, "/metrics", args.scrapes, HTTP_ACCEPT_ENCODING="gzip")
        print(json.dumps({"bench": "metrics_scrape", "database": vendor, **line, "target_ms": 200}))
        line = _time(client, "/metrics", args.scrapes)
        print(json.dumps({"bench": "metrics_scrape_plain", "database": vendor, **line}))
        print(json.dumps({"bench": "metrics_split", "database": vendor, **_read_split(5)}))
        print(json.dumps({"bench": "metrics_queries", "database": vendor, **_query_split(5)}))
        for who in ("admin", "member"):
            client.force_login(world[who])
            line = _time(client, "/api/v1/metrics/summary", args.scrapes)
            print(json.dumps({"bench": f"summary_{who}", "database": vendor, **line}), flush=True)
    finally:
        if "django" in sys.modules:
            drop_database(args.database_url)
        if not args.keep:
            shutil.rmtree(var, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
