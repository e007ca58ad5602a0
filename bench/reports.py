"""Benchmark: what handling agent reports costs per job, in process.

    .venv/bin/python bench/reports.py [--database-url postgres://postgres@127.0.0.1:5432/sluice_bench_reports]
                                      [--jobs 400] [--batches 1,8,50] [--shape split,mixed,heartbeat]
                                      [--nodes 100] [--profile FILE]

Creates a scratch database (dropped at the end): PostgreSQL at ``--database-url``; without
it, on the server of ``DATABASE_URL`` when that names PostgreSQL (in a database of its own,
``sluice_bench_reports``: the database ``DATABASE_URL`` names is never touched), else a
SQLite file in a temporary folder. Four nodes with a GPU for each of their jobs; for each
batch size B, ``--jobs`` ADMITTED one-GPU jobs with their allocations, then what the agents
would send about them through ``scheduling.services.reports.agent_reports_process``, B
reports a batch, one node's jobs per batch:

* ``split``: a batch of B ``started`` reports, then a batch of B ``exited`` reports of
  the same jobs (the agent's shape for jobs that run a while);
* ``mixed``: each job's ``started`` and ``exited`` in the same batch (B/2 jobs a batch; the
  shape of the end-to-end benchmark's ``true`` jobs);
* ``heartbeat``: ``--nodes`` more nodes of 8 GPUs, each running four two-GPU jobs (six GPUs
  busy at 95 %, two idle), beat three times each as the fleet benchmark's nodes beat: GPU
  samples and the running jobs listed; B heartbeats of B nodes a batch (1: what one agent
  sends; more: a runtime that serves many nodes). Figures are per heartbeat
  (``*_per_heartbeat``); every job's last active time is checked to be the newest beat's.

Every job ends SUCCEEDED (checked). The dispatch request a batch makes is counted, not sent.
Each figure runs on fresh jobs ``--repeat`` times timed (the median is printed), then once
counting queries. ``DEBUG`` is off, as in production (no query log).

Prints one JSON line per figure: ``cpu_ms_per_job`` (this process: Python and the driver),
``db_cpu_ms_per_job`` (the PostgreSQL backend serving it, from /proc; null where it cannot
be read), ``wall_ms_per_job`` and ``queries_per_job``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._scratch import backend_cpu_seconds, drop_database, setup_in_var  # noqa: E402

NODES = 4
SCRATCH_NAME = "sluice_bench_reports"


def _database_url(given: str | None) -> str | None:
    """The scratch database: ``given``, else one beside DATABASE_URL's (PostgreSQL), else None."""
    if given:
        return given
    env = os.environ.get("DATABASE_URL", "")
    if env.startswith(("postgres://", "postgresql://")):
        return env.rpartition("/")[0] + "/" + SCRATCH_NAME
    return None


def build_world(gpus_per_node: int):
    """A pool of NODES nodes × ``gpus_per_node`` GPUs, one tenant, project, queue and user
    (bench/dispatch.py's world)."""
    from bench.dispatch import _world
    from scheduling.models import Node

    user, project, queue = _world(NODES, gpus_per_node)
    nodes = list(Node.objects.filter(pool=queue.pool).order_by("name"))
    return {"user": user, "project": project, "queue": queue, "nodes": nodes}


def admitted_jobs(world, count: int, per_node: int) -> list[tuple]:
    """``count`` ADMITTED one-GPU jobs with their allocations, ``per_node`` on a node in turn
    (each group on free GPUs of one node); returns (job id, node name) in placement order."""
    from django.utils import timezone

    from scheduling.models import Allocation, Gpu, Job

    now = timezone.now()
    queue, project = world["queue"], world["project"]
    jobs = Job.objects.bulk_create(
        [
            Job(
                tenant_id=project.tenant_id,
                project=project,
                queue=queue,
                submitted_by=world["user"],
                name=f"j{i}",
                workload_type="training",
                base_priority_class=queue.default_priority_class,
                priority_class=queue.default_priority_class,
                state="ADMITTED",
                command=["true"],
                max_runtime_seconds=3600,
                submitted_at=now,
                admitted_at=now,
                gpus_per_node=1,
            )
            for i in range(count)
        ],
        batch_size=1000,
    )
    free = {
        node.pk: list(
            Gpu.objects.filter(node=node)
            .exclude(pk__in=Allocation.objects.filter(released_at__isnull=True).values("gpu_id"))
            .order_by("index")
            .values_list("pk", flat=True)
        )
        for node in world["nodes"]
    }
    placed, allocations = [], []
    for start in range(0, count, per_node):
        node = world["nodes"][(start // per_node) % len(world["nodes"])]
        for job in jobs[start : start + per_node]:
            gpu = free[node.pk].pop(0)
            allocations.append(Allocation(job=job, gpu_id=gpu, node=node, granted_at=now))
            placed.append((job.pk, node.name))
    Allocation.objects.bulk_create(allocations, batch_size=1000)
    return placed


def _started(job_id: int, node: str, now: float) -> dict:
    return {
        "type": "started",
        "node": node,
        "job_id": job_id,
        "attempt": 0,
        "sent_at": now,
        "pid": 1000 + job_id,
        "started_at": now - 0.5,
    }


def _exited(job_id: int, node: str, now: float) -> dict:
    return {
        "type": "exited",
        "node": node,
        "job_id": job_id,
        "attempt": 0,
        "sent_at": now,
        "exit_code": 0,
        "signal": None,
        "stop_reason": None,
        "message": "",
        "finished_at": now,
    }


def batches(placed: list[tuple], size: int, shape: str) -> list[list[dict]]:
    """The batches the agents would send about ``placed`` jobs (see the module)."""
    now = time.time()
    out: list[list[dict]] = []
    per_batch = size if shape == "split" else max(size // 2, 1)
    for start in range(0, len(placed), per_batch):
        group = placed[start : start + per_batch]
        if shape == "split":
            out.append([_started(j, n, now) for j, n in group])
            out.append([_exited(j, n, now + 1) for j, n in group])
        else:
            reports = [r for j, n in group for r in (_started(j, n, now), _exited(j, n, now + 1))]
            out.extend(reports[i : i + size] for i in range(0, len(reports), size))
    return out


def run(world, jobs: int, size: int, shape: str, *, count_queries: bool) -> dict:
    from django.db import connection

    from scheduling.models import Allocation, Job

    per_node = size if shape == "split" else max(size // 2, 1)
    placed = admitted_jobs(world, jobs, per_node)
    work = batches(placed, size, shape)
    failed, cpu, wall, db_before, db_after, queries = _process_timed(work, count_queries)
    ids = [job_id for job_id, _ in placed]
    states = set(Job.objects.filter(pk__in=ids).values_list("state", flat=True))
    assert states == {"SUCCEEDED"} and not failed, (states, failed)
    assert not Allocation.objects.filter(job_id__in=ids, released_at__isnull=True).exists()
    figure = {
        "bench": "reports",
        "vendor": connection.vendor,
        "shape": shape,
        "batch": size,
        "jobs": jobs,
        "batches": len(work),
    }
    if count_queries:
        return {**figure, "queries_per_job": round(queries[0] / jobs, 2)}
    db_cpu = None if db_before is None or db_after is None else (db_after - db_before)
    return {
        **figure,
        "cpu_ms_per_job": round(cpu * 1000 / jobs, 3),
        "db_cpu_ms_per_job": None if db_cpu is None else round(db_cpu * 1000 / jobs, 3),
        "wall_ms_per_job": round(wall * 1000 / jobs, 3),
    }


# --- heartbeats -------------------------------------------------------------------------------

HEARTBEAT_GPUS = 8
HEARTBEAT_JOBS_PER_NODE = 4  # of two GPUs each: six GPUs busy, two idle
HEARTBEAT_ROUNDS = 3
_beat_clock = [0.0]


def heartbeat_world(world, nodes: int) -> list[dict]:
    """``nodes`` nodes of HEARTBEAT_GPUS GPUs in the world's pool, each running
    HEARTBEAT_JOBS_PER_NODE two-GPU jobs; returns {name, gpus: {index: busy}, jobs} each."""
    from datetime import timedelta

    from django.utils import timezone

    from scheduling.models import Allocation, Gpu, Job, Node

    now = timezone.now()
    queue, project = world["queue"], world["project"]
    rows = Node.objects.bulk_create(
        [Node(name=f"beat-{i:04d}", pool=queue.pool, last_heartbeat=now) for i in range(nodes)]
    )
    gpus = Gpu.objects.bulk_create(
        [
            Gpu(node=node, index=i, uuid=f"GPU-{node.name}-{i}", model="H100-80GB", memory_mb=81559)
            for node in rows
            for i in range(HEARTBEAT_GPUS)
        ]
    )
    jobs = Job.objects.bulk_create(
        [
            Job(
                tenant_id=project.tenant_id,
                project=project,
                queue=queue,
                submitted_by=world["user"],
                name=f"{node.name}-{k}",
                workload_type="training",
                base_priority_class=queue.default_priority_class,
                priority_class=queue.default_priority_class,
                state="RUNNING",
                command=["sleep", "3600"],
                max_runtime_seconds=86400,
                submitted_at=now,
                admitted_at=now,
                started_at=now - timedelta(minutes=1),
                last_active_at=now - timedelta(minutes=1),
                gpus_per_node=2,
            )
            for node in rows
            for k in range(HEARTBEAT_JOBS_PER_NODE)
        ],
        batch_size=1000,
    )
    allocations, fleet = [], []
    for n, node in enumerate(rows):
        mine = jobs[n * HEARTBEAT_JOBS_PER_NODE : (n + 1) * HEARTBEAT_JOBS_PER_NODE]
        node_gpus = gpus[n * HEARTBEAT_GPUS : (n + 1) * HEARTBEAT_GPUS]
        for k, job in enumerate(mine):
            for gpu in node_gpus[2 * k : 2 * k + 2]:
                allocations.append(Allocation(job=job, gpu=gpu, node=node, granted_at=now))
        busy = 2 * len(mine)
        fleet.append(
            {
                "name": node.name,
                "busy": {i: i < busy for i in range(HEARTBEAT_GPUS)},
                "jobs": [job.pk for job in mine],
            }
        )
    Allocation.objects.bulk_create(allocations, batch_size=1000)
    return fleet


def _heartbeat(node: dict, sent_at: float) -> dict:
    """A heartbeat as the fleet benchmark's simulated nodes send it."""
    return {
        "type": "heartbeat",
        "node": node["name"],
        "sent_at": sent_at,
        "gpus": [
            {
                "index": i,
                "utilization": 95.0 if busy else 0.0,
                "memory_used_mb": 60000 if busy else 0,
                "processes": [],
            }
            for i, busy in node["busy"].items()
        ],
        "jobs": [
            {"job_id": j, "attempt": 0, "pid": 0, "running": True, "stop_reason": None}
            for j in node["jobs"]
        ],
        "zombies": [],
        "kills": [],
    }


def run_heartbeats(fleet: list[dict], size: int, *, count_queries: bool) -> dict:
    """Every node of ``fleet`` beats HEARTBEAT_ROUNDS times, ``size`` nodes a batch."""
    from django.db import connection

    from scheduling.models import Job

    if not _beat_clock[0]:
        _beat_clock[0] = time.time()
    work, last = [], 0.0
    for _ in range(HEARTBEAT_ROUNDS):
        _beat_clock[0] += 10.0
        last = _beat_clock[0]
        beats = [_heartbeat(node, last) for node in fleet]
        work += [beats[i : i + size] for i in range(0, len(beats), size)]
    failed, cpu, wall, db_before, db_after, queries = _process_timed(work, count_queries)
    ids = [j for node in fleet for j in node["jobs"]]
    active = set(Job.objects.filter(pk__in=ids).values_list("last_active_at", flat=True))
    assert all(abs(a.timestamp() - last) < 1e-3 for a in active) and not failed, (active, failed)
    beats = HEARTBEAT_ROUNDS * len(fleet)
    figure = {
        "bench": "reports",
        "vendor": connection.vendor,
        "shape": "heartbeat",
        "batch": size,
        "nodes": len(fleet),
        "heartbeats": beats,
        "batches": len(work),
    }
    if count_queries:
        return {**figure, "queries_per_heartbeat": round(queries[0] / beats, 2)}
    db_cpu = None if db_before is None or db_after is None else (db_after - db_before)
    return {
        **figure,
        "cpu_ms_per_heartbeat": round(cpu * 1000 / beats, 3),
        "db_cpu_ms_per_heartbeat": None if db_cpu is None else round(db_cpu * 1000 / beats, 3),
        "wall_ms_per_heartbeat": round(wall * 1000 / beats, 3),
    }


def _median(timings: list[dict]) -> dict:
    """The figure of several timed runs, each measure their median."""
    figure = dict(timings[0])
    unit = "heartbeat" if figure["shape"] == "heartbeat" else "job"
    for name in (f"cpu_ms_per_{unit}", f"db_cpu_ms_per_{unit}", f"wall_ms_per_{unit}"):
        values = [t[name] for t in timings if t[name] is not None]
        figure[name] = round(statistics.median(values), 3) if values else None
    figure["runs"] = len(timings)
    return figure


def _process_timed(work, count_queries):
    """Hand each batch of reports to the reports task's code; (failed, CPU s, wall s,
    PostgreSQL CPU before, after, [statements])."""
    from django.db import connection

    from scheduling.services.reports import agent_reports_process

    queries = [0]

    def count(execute, sql, params, many, context):
        queries[0] += 1
        return execute(sql, params, many, context)

    db_before = backend_cpu_seconds()
    cpu, wall = time.process_time(), time.perf_counter()
    failed = 0
    with connection.execute_wrapper(count) if count_queries else contextlib.nullcontext():
        for batch in work:
            failed += agent_reports_process(reports=batch)["failed"]
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return failed, cpu, wall, db_before, backend_cpu_seconds(), queries


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None, help="PostgreSQL URL (see above)")
    parser.add_argument("--jobs", type=int, default=400, help="jobs per figure (default 400)")
    parser.add_argument("--batches", default="1,8,50", help="batch sizes (default 1,8,50)")
    parser.add_argument(
        "--shape", default="split", help="split, mixed, heartbeat or several (split,heartbeat)"
    )
    parser.add_argument(
        "--nodes", type=int, default=100, help="nodes of the heartbeat shape (default 100)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per figure (median)")
    parser.add_argument("--profile", default="", help="write a cProfile of the timed runs here")
    args = parser.parse_args()
    database_url = _database_url(args.database_url)
    with tempfile.TemporaryDirectory(prefix="sluice-bench-reports-") as var:
        setup_in_var(database_url, Path(var))
        try:
            from django.conf import settings

            from scheduling.services import enqueue

            settings.DEBUG = False  # as in production: no query log

            dispatches: list[int] = []
            enqueue.request_dispatch = lambda: dispatches.append(1)  # counted, not sent
            world = build_world(args.jobs // NODES + 100)
            run(world, 50, 8, "split", count_queries=False)  # warm up: imports, caches
            fleet = heartbeat_world(world, args.nodes) if "heartbeat" in args.shape else []
            if fleet:
                run_heartbeats(fleet, 8, count_queries=False)  # warm up

            def measure(size: int, shape: str, *, count_queries: bool) -> dict:
                if shape == "heartbeat":
                    return run_heartbeats(fleet, size, count_queries=count_queries)
                return run(world, args.jobs, size, shape, count_queries=count_queries)

            profiler = None
            if args.profile:
                import cProfile

                profiler = cProfile.Profile(time.process_time)
            for shape in args.shape.split(","):
                for size in (int(s) for s in args.batches.split(",")):
                    timings = []
                    for _ in range(args.repeat):
                        if profiler:
                            profiler.enable()
                        timings.append(measure(size, shape, count_queries=False))
                        if profiler:
                            profiler.disable()
                    timed = _median(timings)
                    counted = measure(size, shape, count_queries=True)
                    print(json.dumps({**timed, **counted}), flush=True)
            if profiler:
                profiler.dump_stats(args.profile)
        finally:
            drop_database(database_url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
