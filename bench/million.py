"""Benchmark: the job list page, the queue pages and ``GET /api/v1/jobs`` with 1,000,000 jobs
in PostgreSQL (target: p95 ≤ 200 ms each), and what the jobs and their timelines weigh.

    .venv/bin/python bench/million.py                      # or: make bench-million
    .venv/bin/python bench/million.py --jobs 200000 --no-record --explain

Creates a scratch PostgreSQL database (``--database-url``, dropped at the end unless
``--keep``), migrates it, runs ``seed_demo`` (users ``admin``, ``nlp-member``, ...), adds
six more tenants with their projects, queues and members, then loads ``--jobs`` jobs with
``INSERT ... SELECT generate_series`` (server side: no rows travel through Python):
submitted over 90 days, ids in submission order; 95 % of them ended (succeeded 76 %,
failed 12 %, cancelled 6 %, timed out 3 %, preempted 1.5 %, reclaimed 1.5 %), the newest
5 % a mix of running, pending (ranked), held and ended. The demo tenant ``nlp`` holds
30 % of them, ``nlp-member`` submitted a third of those. Each job gets its timeline:
``submitted``, ``admitted``, ``started`` and its end (4 events for an ended job, fewer
for one that waits or runs). Then ``VACUUM ANALYZE`` (what autovacuum leaves).

Times ``--requests`` requests per route through Django's test client after two warm-ups,
signed in as the platform admin ``admin`` and as the tenant member ``nlp-member``, and
prints one JSON line per route (p50, p95, queries). With ``--explain``, the slowest
queries of each route are printed with their ``EXPLAIN ANALYZE``. Appends the p95s and
the sizes to ``bench/results/million.jsonl`` unless ``--no-record``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._scratch import drop_database, setup_in_var  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/sluice_bench_million"
RESULTS = ROOT / "bench" / "results" / "million.jsonl"
TARGET_MS = 200
BENCH_TENANTS = 6
TABLES = ("scheduling_job", "scheduling_jobevent")
# Ended states and their shares (cumulative bounds on one random number).
ENDED = (
    ("SUCCEEDED", 0.76, 0),
    ("FAILED", 0.88, 1),
    ("CANCELLED", 0.94, None),
    ("TIMED_OUT", 0.97, None),
    ("PREEMPTED", 0.985, None),
    ("RECLAIMED", 1.0, None),
)
# The newest 5 %: running, pending, held, the rest ended.
ACTIVE = (("RUNNING", 0.3), ("PENDING", 0.55), ("HELD", 0.6))
ACTIVE_FROM = 0.95


def _world() -> dict:
    """The demo (seed_demo) and six more tenants; the slots jobs are drawn from."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from scheduling.models import PriorityClass, Queue, ResourcePool
    from tenants.models import Membership, Project, Tenant

    call_command("seed_demo", verbosity=0)
    users = get_user_model().objects
    normal = PriorityClass.objects.get(name="normal")
    pools = {p.name: p for p in ResourcePool.objects.all()}
    for t in range(BENCH_TENANTS):
        tenant = Tenant.objects.create(slug=f"bench{t}", name=f"Bench tenant {t}")
        for u in range(3):
            user = users.create_user(f"bench{t}-u{u}", password="x")
            Membership.objects.create(user=user, tenant=tenant, role="member")
        for p in range(2):
            Project.objects.create(tenant=tenant, slug=f"p{p}", name=f"Project {p}")
        for name, pool in (("train", "training"), ("eval", "training"), ("dev", "interactive")):
            Queue.objects.create(
                tenant=tenant,
                name=name,
                pool=pools[pool],
                default_priority_class=normal,
                max_self_service_class=normal,
                allowed_workload_types=["interactive"] if pool == "interactive" else [],
            )
    # One slot: (tenant, project, queue, submitter, workload type); a job draws one.
    # Weights: nlp 30 % (a third of it nlp-member's), vision 10 %, the six others 60 %.
    slots: list[tuple] = []

    def add(tenant: Tenant, weight: int, submitters: list) -> None:
        queues = [q for q in Queue.objects.filter(tenant=tenant) if "inference" not in q.pool.name]
        projects = list(Project.objects.filter(tenant=tenant))
        for i in range(weight):
            queue = queues[i % len(queues)]
            kind = "interactive" if queue.pool.name == "interactive" else "training"
            slots.append(
                (
                    tenant.pk,
                    projects[i % len(projects)].pk,
                    queue.pk,
                    submitters[i % len(submitters)].pk,
                    kind,
                )
            )

    nlp = Tenant.objects.get(slug="nlp")
    colleague = users.create_user("nlp-colleague", password="x")
    Membership.objects.create(user=colleague, tenant=nlp, role="member")
    add(nlp, 30, [users.get(username=n) for n in ("nlp-member", "nlp-admin", "nlp-colleague")])
    vision = Tenant.objects.get(slug="vision")
    add(vision, 10, [users.get(username="vision-member"), users.get(username="vision-admin")])
    for t in range(BENCH_TENANTS):
        tenant = Tenant.objects.get(slug=f"bench{t}")
        add(tenant, 10, list(users.filter(username__startswith=f"bench{t}-")))
    return {"slots": slots, "class": normal.pk}


def _load_jobs(world: dict, total: int) -> float:
    """``total`` jobs written by the database itself; returns the seconds it took."""
    from django.db import connection

    from scheduling.models import Job

    slots = world["slots"]
    ended_case = (
        " ".join(f"WHEN s.r < {bound} THEN '{state}'" for state, bound, _ in ENDED[:-1])
        + f" ELSE '{ENDED[-1][0]}'"
    )
    active_case = " ".join(f"WHEN s.r < {bound} THEN '{state}'" for state, bound in ACTIVE)
    state = (
        f"CASE WHEN s.g <= {int(total * ACTIVE_FROM)} THEN (CASE {ended_case} END) "
        f"ELSE (CASE {active_case} ELSE (CASE {ended_case} END) END) END"
    )
    # The SQL of each column that is not its field's default (s: the draw, t: state and times).
    submitted = f"now() - interval '90 days' + (s.g::float / {total}) * interval '90 days'"
    columns = {
        "tenant_id": "(%(tenants)s::int[])[s.k]",
        "project_id": "(%(projects)s::int[])[s.k]",
        "queue_id": "(%(queues)s::int[])[s.k]",
        "submitted_by_id": "(%(users)s::int[])[s.k]",
        "workload_type": "(%(kinds)s::text[])[s.k]",
        "base_priority_class_id": "%(class)s",
        "priority_class_id": "%(class)s",
        "name": "'job-' || s.g",
        "command": '\'["python", "train.py", "--epochs", "3"]\'::jsonb',
        "gpus_per_node": "(ARRAY[1, 1, 2, 4, 8])[1 + (s.g %% 5)]",
        "max_runtime_seconds": "86400",
        "state": "t.state",
        "submitted_at": "t.submitted_at",
        "admitted_at": "CASE WHEN t.state NOT IN ('PENDING', 'HELD') THEN t.started_at END",
        "started_at": "CASE WHEN t.state NOT IN ('PENDING', 'HELD') THEN t.started_at END",
        "finished_at": (
            "CASE WHEN t.state NOT IN ('PENDING', 'HELD', 'RUNNING') "
            "THEN LEAST(now(), t.started_at + s.r3 * interval '8 hours') END"
        ),
        "pending_rank": "CASE WHEN t.state IN ('PENDING', 'HELD') THEN s.g::float END",
        "exit_code": ("CASE t.state WHEN 'SUCCEEDED' THEN 0 WHEN 'FAILED' THEN 1 + (s.g %% 3) END"),
        "failure_message": "CASE WHEN t.state = 'FAILED' THEN 'exit code 1' ELSE '' END",
    }
    names, values, params = [], [], {}
    for field in Job._meta.concrete_fields:
        if field.primary_key:
            continue
        names.append(connection.ops.quote_name(field.column))
        if field.column in columns:
            values.append(columns[field.column])
        elif field.null and not field.has_default():
            values.append("NULL")
        else:
            key = f"default_{field.column}"
            params[key] = field.get_db_prep_save(field.get_default(), connection)
            values.append(f"%({key})s")
    params |= {
        "tenants": [s[0] for s in slots],
        "projects": [s[1] for s in slots],
        "queues": [s[2] for s in slots],
        "users": [s[3] for s in slots],
        "kinds": [s[4] for s in slots],
        "class": world["class"],
    }
    sql = f"""
        INSERT INTO scheduling_job ({", ".join(names)})
        SELECT {", ".join(values)}
        FROM (
            SELECT g, 1 + floor(random() * {len(slots)})::int AS k, random() AS r,
                   random() AS r2, random() AS r3
            FROM generate_series(1, {total}) AS g
        ) s
        CROSS JOIN LATERAL (
            SELECT {state} AS state, {submitted} AS submitted_at,
                   {submitted} + s.r2 * interval '2 hours' AS started_at
        ) t
    """
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(0.42)")
        cursor.execute(sql, params)
    return time.perf_counter() - started


def _load_events(first_id: int) -> tuple[float, int]:
    """Each new job's timeline: submitted, then as far as its state went."""
    from django.db import connection

    sql = """
        INSERT INTO scheduling_jobevent (job_id, created_at, kind, message, actor_id, data)
        SELECT j.id,
               CASE e.n WHEN 1 THEN j.submitted_at WHEN 2 THEN COALESCE(j.admitted_at, now())
                        WHEN 3 THEN j.started_at ELSE j.finished_at END,
               CASE e.n WHEN 1 THEN 'submitted' WHEN 2 THEN
                        CASE WHEN j.state = 'HELD' THEN 'held' ELSE 'admitted' END
                        WHEN 3 THEN 'started' ELSE lower(j.state) END,
               CASE e.n WHEN 4 THEN j.failure_message ELSE '' END,
               NULL,
               CASE e.n
                   WHEN 1 THEN '{}'::jsonb
                   WHEN 2 THEN jsonb_build_object('from', 'PENDING', 'to',
                        CASE WHEN j.state = 'HELD' THEN 'HELD' ELSE 'ADMITTED' END)
                   WHEN 3 THEN jsonb_build_object('from', 'ADMITTED', 'to', 'RUNNING',
                        'node', 'gpu-train-01')
                   ELSE jsonb_build_object('from', 'RUNNING', 'to', j.state, 'exit_code',
                        j.exit_code)
               END
        FROM scheduling_job j
        CROSS JOIN generate_series(1, 4) AS e(n)
        WHERE j.id >= %s AND e.n <= CASE j.state WHEN 'PENDING' THEN 1 WHEN 'HELD' THEN 2
                                                  WHEN 'RUNNING' THEN 3 ELSE 4 END
    """
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(sql, [first_id])
        count = cursor.rowcount
    return time.perf_counter() - started, count


def _sizes() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        return {
            table: _one(cursor, "SELECT pg_total_relation_size(%s)", [table]) for table in TABLES
        }


def _one(cursor, sql: str, params=()):
    cursor.execute(sql, params)
    return cursor.fetchone()[0]


def _routes(users: dict) -> list[tuple[str, str, str]]:
    """(route, who, URL) to time."""
    from django.db.models import Count

    from scheduling.models import Job, Queue

    busiest = (
        Queue.objects.filter(tenant__slug="nlp", jobs__state="PENDING")
        .annotate(waiting=Count("jobs"))
        .order_by("-waiting")
        .first()
    )
    ids = Job.objects.filter(tenant__slug="nlp").order_by("id").values_list("id", flat=True)
    middle = Job.objects.get(pk=ids[ids.count() // 2])
    routes = []
    for who in ("admin", "nlp-member"):
        routes += [
            ("page/jobs-mine", who, "/jobs/"),
            ("page/jobs-all", who, "/jobs/?state="),
            ("page/jobs-failed", who, "/jobs/?state=FAILED&sort=-gpus"),
            ("page/jobs-deep", who, "/jobs/?state=&page=400"),
            ("page/queues", who, "/queues/"),
            ("page/queue", who, f"/queues/{busiest.pk}/"),
            ("api/jobs-first", who, "/api/v1/jobs/"),
            ("api/jobs-filtered", who, f"/api/v1/jobs/?state=FAILED&queue={busiest.pk}"),
            ("api/jobs-deep", who, "/api/v1/jobs/?page=2000"),
            ("api/jobs-cursor-first", who, "/api/v1/jobs/?cursor="),
            ("api/jobs-cursor-deep", who, f"/api/v1/jobs/?cursor={_cursor_at(middle)}"),
            (
                "api/jobs-cursor-deep-by-time",
                who,
                "/api/v1/jobs/?ordering=-submitted_at&cursor="
                + _cursor_at(middle, "-submitted_at"),
            ),
        ]
    return routes


def _cursor_at(job, ordering: str = "-id") -> str:
    """The cursor of the page after ``job`` in ``ordering`` (newest first by default)."""
    try:
        from portal.api.pagination import cursor_encode
    except ImportError:  # code without cursors: the route answers what it answers
        return "none"
    position = {"o": ordering, "id": job.pk}
    if ordering != "-id":
        position["v"] = job.submitted_at.isoformat()
    return cursor_encode(position, reverse=False)


def _time(client, url: str, requests: int) -> dict:
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    first = client.get(url)
    if first.status_code != 200:
        return {"status": first.status_code}
    client.get(url)
    times = []
    for _ in range(requests):
        reset_queries()
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    with CaptureQueriesContext(connection) as ctx:
        client.get(url)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[max(0, round(len(times) * 0.95) - 1)], 1),
        "queries": len(ctx.captured_queries),
        "slowest": sorted(ctx.captured_queries, key=lambda q: float(q["time"]), reverse=True)[:3],
    }


def _explain(queries: list[dict]) -> None:
    from django.db import connection

    for query in queries:
        print(f"    -- {float(query['time']) * 1000:.1f} ms: {query['sql'][:300]}", flush=True)
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + query["sql"])
            for (line,) in cursor.fetchall():
                print(f"       {line}", flush=True)


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _record(lines: list[dict], machine: str, notes: str) -> None:
    base = {
        "bench": "million",
        "commit": _commit(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": machine,
        "command": "make bench-million",
    }
    with RESULTS.open("a") as out:
        for line in lines:
            out.write(json.dumps({**base, **line, "notes": f"{line.pop('notes', '')}{notes}"}))
            out.write("\n")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE the slow queries")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument(
        "--reuse", action="store_true", help="time a database kept by --keep, without loading"
    )
    parser.add_argument("--only", default="", help="time only the routes containing this")
    parser.add_argument("--no-record", action="store_true", help="do not append to the results")
    args = parser.parse_args()
    if not args.database_url.startswith("postgres"):
        parser.error("--database-url must name a PostgreSQL database")
    var = Path(tempfile.mkdtemp(prefix="sluice-bench-million-"))
    os.environ.setdefault("LOG_LEVEL", "ERROR")  # sign-ins and 404s are not the figures
    try:
        if args.reuse:
            from bench._scratch import django_start

            django_start(
                {
                    "DEBUG": "1",
                    "SLUICE_VAR_DIR": str(var),
                    "DATABASE_URL": args.database_url,
                    "CELERY_TASK_ALWAYS_EAGER": "1",
                    "SLUICE_NODE_TRANSPORT": "memory",
                    "ALLOWED_HOSTS": "testserver",
                }
            )
        else:
            setup_in_var(args.database_url, var)
        from django.contrib.auth import get_user_model
        from django.db import connection
        from django.test import Client

        from scheduling.models import Job

        load = {}
        if not args.reuse:
            started = time.perf_counter()
            world = _world()
            load["seed_s"] = round(time.perf_counter() - started, 1)
            before = _sizes()
            jobs_before = Job.objects.count()
            first_id = (Job.objects.order_by("-id").values_list("id", flat=True).first() or 0) + 1
            load["jobs_s"] = round(_load_jobs(world, args.jobs), 1)
            seconds, events = _load_events(first_id)
            load["events_s"], load["events"] = round(seconds, 1), events
            started = time.perf_counter()
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE")
            load["vacuum_s"] = round(time.perf_counter() - started, 1)
            after = _sizes()
            added = Job.objects.count() - jobs_before
            load["jobs"] = added
            load["mb_per_100k_jobs"] = {
                t: round((after[t] - before[t]) / added * 100_000 / 2**20, 1) for t in TABLES
            }
            load["mb"] = {t: round(after[t] / 2**20) for t in TABLES}
        with connection.cursor() as cursor:
            server = _one(cursor, "SHOW server_version")
        print(json.dumps({"bench": "million", "load": load, "postgresql": server}), flush=True)
        users = {
            u.username: u
            for u in get_user_model().objects.filter(username__in=["admin", "nlp-member"])
        }
        figures = []
        for route, who, url in _routes(users):
            if args.only and args.only not in route:
                continue
            client = Client()
            client.force_login(users[who])
            measured = _time(client, url, args.requests)
            slowest = measured.pop("slowest", [])
            print(json.dumps({"route": route, "as": who, "url": url, **measured}), flush=True)
            if args.explain and slowest:
                _explain(slowest[:2])
            if "p95_ms" in measured:
                figures.append((route, who, url, measured))
        if not args.no_record:
            machine = (
                f"{os.cpu_count()}-core development machine, PostgreSQL {server}, "
                f"Python {platform.python_version()}"
            )
            lines = [
                {
                    "figure": f"pg-{args.jobs // 1000}k/{route}/{who}/p95",
                    "value": m["p95_ms"],
                    "unit": "ms",
                    "notes": f"{url}: p50 {m['p50_ms']} ms, {m['queries']} queries; ",
                }
                for route, who, url, m in figures
            ]
            for table, mb in load.get("mb_per_100k_jobs", {}).items():
                lines.append(
                    {
                        "figure": f"pg-{args.jobs // 1000}k/{table}/mb_per_100k_jobs",
                        "value": mb,
                        "unit": "MB",
                        "notes": f"{load['events']} events in all; ",
                    }
                )
            load_avg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
            _record(
                lines,
                machine,
                f"{args.requests} requests, load average {load_avg} at the end; "
                f"target p95 ≤ {TARGET_MS} ms",
            )
    finally:
        if not args.keep:
            drop_database(args.database_url)
        shutil.rmtree(var, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
