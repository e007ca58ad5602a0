"""Benchmark: what handling agent reports costs per job, in process.

    .venv/bin/python bench/reports.py [--database-url postgres://postgres@127.0.0.1:5432/sluice_bench_reports]
                                      [--jobs 400] [--batches 1,8,50] [--shape split,mixed]

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
  shape of the end-to-end benchmark's ``true`` jobs).

Every job ends SUCCEEDED (checked). The dispatch request a batch makes is counted, not sent.
Each figure runs on fresh jobs ``--repeat`` times timed (the median is printed), then once
counting queries. ``DEBUG`` is off, as in production (no query log).

Prints one JSON line per figure: ``cpu_ms_per_job`` (this process: Python and the driver),
``db_cpu_ms_per_job`` (the PostgreSQL backend serving it, from /proc; null where it cannot
be read), ``wall_ms_per_job`` and ``queries_per_job``.
"""

from __future__ import annotations

import argparse
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
    from scheduling.services.reports import agent_reports_process

    per_node = size if shape == "split" else max(size // 2, 1)
    placed = admitted_jobs(world, jobs, per_node)
    work = batches(placed, size, shape)
    queries = [0]

    def count(execute, sql, params, many, context):
        queries[0] += 1
        return execute(sql, params, many, context)

    db_before = backend_cpu_seconds()
    cpu, wall = time.process_time(), time.perf_counter()
    failed = 0
    if count_queries:
        with connection.execute_wrapper(count):
            for batch in work:
                failed += agent_reports_process(reports=batch)["failed"]
    else:
        for batch in work:
            failed += agent_reports_process(reports=batch)["failed"]
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    db_after = backend_cpu_seconds()
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


def _median(timings: list[dict]) -> dict:
    """The figure of several timed runs, each measure their median."""
    figure = dict(timings[0])
    for name in ("cpu_ms_per_job", "db_cpu_ms_per_job", "wall_ms_per_job"):
        values = [t[name] for t in timings if t[name] is not None]
        figure[name] = round(statistics.median(values), 3) if values else None
    figure["runs"] = len(timings)
    return figure


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None, help="PostgreSQL URL (see above)")
    parser.add_argument("--jobs", type=int, default=400, help="jobs per figure (default 400)")
    parser.add_argument("--batches", default="1,8,50", help="batch sizes (default 1,8,50)")
    parser.add_argument("--shape", default="split", help="split, mixed or both (split,mixed)")
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
                        timings.append(run(world, args.jobs, size, shape, count_queries=False))
                        if profiler:
                            profiler.disable()
                    timed = _median(timings)
                    counted = run(world, args.jobs, size, shape, count_queries=True)
                    print(json.dumps({**timed, **counted}), flush=True)
            if profiler:
                profiler.dump_stats(args.profile)
        finally:
            drop_database(database_url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
