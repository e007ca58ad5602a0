"""The rollup writer: the history of the embedded default (no Prometheus needed). What the
figures mean (buckets, waits, billing overlap, guarantees, series) is ``insights.rollups``.

A beat task (``insights.rollup``, every ``SLUICE_ROLLUP_INTERVAL`` seconds) calls
:func:`rollup_write`. Each run samples the present into the rows of the current minute
bucket and bills the time since the previous run:

- ``QueueRollup`` (minute) for every queue: the PENDING jobs and GPUs now (HELD jobs are
  not counted: nobody can schedule them), and the jobs admitted in the minute with their
  waits (p50, p95, max). A wait is the one that ended at the admission, as
  :mod:`scheduling.waits` defines it: from the attempt's start (``queued_at``, else
  ``submitted_at``) to ``admitted_at``; time held counts, as it does on every page. The
  previous minute's admissions are completed by the next run.
- ``UsageRollup`` (minute) per pool × GPU model (tenant empty: capacity = schedulable GPUs,
  healthy on ready nodes) and per pool × GPU model × tenant (capacity = the tenant's
  guarantee): GPUs allocated (open allocations), used (their utilization / 100) and idle
  (held below the job's policy threshold).
- ``GpuActivity`` per GPU: when it was last seen busy, since when it is idle.
- ``JobGpuSeries`` per running job: one point a minute, merged two by two when it
  reaches ``SLUICE_JOB_SERIES_POINTS`` (up to 64 points earlier, by job id, so that jobs
  started together do not all merge in the same run); allocated and used GPU-seconds.
- ``UsageDay``: allocated and used GPU-hours per day, tenant, project, user, workload type,
  pool and GPU model.

A GPU sample (``Gpu.utilization``, ``memory_used_mb``, ``sampled_at``, written by the
agents' heartbeats) older than :func:`stale_after` is *unknown*: it counts as neither used
nor idle, and the job series stores ``null`` for it.

Billing is exact for allocations: each run bills the minutes ``[previous bucket, current
bucket)`` as the overlap of every allocation (``granted_at``, ``released_at``) with them, so
a job shorter than a minute is billed too. Used GPU-seconds are that overlap × the GPU's
present utilization (0 for an allocation already released, or an unknown sample). The
window is capped (:func:`window_cap`): a writer that was down does not bill its outage at
one sample.

When an hour has ended its hour rows are written from the minute rows (means; admitted
counts summed; waits recomputed from the jobs admitted in that hour), and rows past their
retention are deleted. A run reads and writes in bulk: its query count does not grow with
the number of jobs, GPUs or queues. Two overlapping runs cannot both write: the run holds
a lock (a PostgreSQL advisory lock, a file lock on SQLite) and one that cannot take it
does nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import (
    BigIntegerField,
    Count,
    F,
    Func,
    IntegerField,
    Max,
    Min,
    Q,
    Sum,
)
from django.utils import timezone

from scheduling.choices import DEFAULT_IDLE_THRESHOLD, JobState, NodeState
from scheduling.models import Allocation, Gpu, Job, Queue, Quota, WorkloadPolicy
from scheduling.services.leader import file_leader_lock

from ..choices import Resolution
from ..models import GpuActivity, JobGpuSeries, QueueRollup, UsageDay, UsageRollup
from ..rollups import (
    HOUR,
    MINUTE,
    SERIES_STATES,
    admission_wait,
    day_segments,
    floor_hour,
    floor_minute,
    guarantees,
    hour_spread,
    overlap_seconds,
    series_merge,
    series_utilization,
    stale_after,
    wait_figures,
    window_cap,
)

_LOCK_KEY = 0x5_1CE_2011


# --- JSON expressions (the series grow in the database, not read back) ------------------------


class _JsonLength(Func):
    """Number of elements of a JSON array column."""

    function = "json_array_length"
    arity = 1
    output_field = IntegerField()

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, function="jsonb_array_length", **extra)


class _JsonLastTime(Func):
    """The time (first element) of the last point of a series' ``points``."""

    arity = 1
    output_field = BigIntegerField()

    def as_sqlite(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"json_extract({sql}, '$[#-1][0]')", params

    def as_postgresql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"((({sql}) -> -1) ->> 0)::bigint", params


# --- the writer -------------------------------------------------------------------------------


@dataclass
class RollupRun:
    """What one run did (the task returns it as a dict, for the worker's log)."""

    bucket: datetime
    billed_seconds: float
    queue_rows: int = 0
    usage_rows: int = 0
    series: int = 0
    usage_days: int = 0
    hours_compacted: int = 0
    deleted: int = 0
    unknown_gpus: int = 0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "bucket": self.bucket.isoformat(),
            "billed_seconds": self.billed_seconds,
            "queue_rows": self.queue_rows,
            "usage_rows": self.usage_rows,
            "series": self.series,
            "usage_days": self.usage_days,
            "hours_compacted": self.hours_compacted,
            "deleted": self.deleted,
            "unknown_gpus": self.unknown_gpus,
        }


@contextlib.contextmanager
def _writer_lock():
    """A transaction in which this process is the only rollup writer; yields False (and
    no transaction) when another run holds the lock."""
    if connection.vendor == "postgresql":
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_LOCK_KEY])
                acquired = bool(cursor.fetchone()[0])
            yield acquired
        return
    settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
    with file_leader_lock("rollups") as held:
        if not held:
            yield False
            return
        with transaction.atomic():
            yield True


def rollup_write(*, now: datetime | None = None) -> RollupRun | None:
    """Write the rollups of the minute bucket of ``now`` (default: the present) and bill
    the time since the previous run. Idempotent per minute bucket: a second run in the same
    minute refreshes that minute's rows and bills nothing. Returns None when another run
    holds the writer's lock."""
    now = now or timezone.now()
    with _writer_lock() as acquired:
        if not acquired:
            return None
        return _Writer(now).run()


@dataclass
class _GpuNow:
    id: int
    name: str
    model: str
    pool_id: int
    schedulable: bool
    utilization: float | None  # None: unknown (never sampled, or stale)
    memory_used_mb: int | None


@dataclass
class _Held:
    """An allocation overlapping the run (open now, or released inside the billed window)."""

    gpu_id: int
    job_id: int
    granted_at: datetime
    released_at: datetime | None
    tenant_id: int
    project_id: int | None
    user_id: int | None
    workload_type: str
    job_state: str


class _Writer:
    def __init__(self, now: datetime):
        self.now = now
        self.bucket = floor_minute(now)
        self.interval = settings.SLUICE_ROLLUP_INTERVAL

    def run(self) -> RollupRun:
        last = (
            UsageRollup.objects.filter(resolution=Resolution.MINUTE)
            .aggregate(m=Max("bucket"))
            .get("m")
        )
        self.last = last
        cap = window_cap()
        if last is None:
            start = self.bucket - timedelta(seconds=max(self.interval, 60))
        else:
            start = max(min(last, self.bucket), self.bucket - cap)
        self.window = (start, self.bucket)
        self.billed = (self.bucket - start).total_seconds()
        result = RollupRun(bucket=self.bucket, billed_seconds=self.billed)

        self.thresholds = dict(
            WorkloadPolicy.objects.values_list("workload_type", "idle_utilization_threshold")
        )
        self._load_gpus()
        self._load_allocations()
        result.unknown_gpus = sum(1 for g in self.open_by_gpu if self.gpus[g].utilization is None)
        result.queue_rows = self._write_queue_rows()
        result.usage_rows = self._write_usage_rows()
        self._write_gpu_activity()
        if self.billed > 0:
            result.series = self._write_series()
            result.usage_days = self._write_usage_days()
        if last is None or floor_hour(last) < floor_hour(self.bucket):
            result.hours_compacted = _compact_hours(self.now)
            result.deleted = _apply_retention(self.now)
        return result

    # --- reads ---

    def _load_gpus(self) -> None:
        fresh_after = self.now - stale_after()
        self.gpus: dict[int, _GpuNow] = {}
        rows = Gpu.objects.values_list(
            "id",
            "index",
            "model",
            "utilization",
            "memory_used_mb",
            "sampled_at",
            "health",
            "node__name",
            "node__pool_id",
            "node__state",
        )
        for gid, index, model, util, mem, sampled, health, node, pool_id, node_state in rows:
            fresh = sampled is not None and sampled >= fresh_after
            self.gpus[gid] = _GpuNow(
                id=gid,
                name=f"{node}:{index}",
                model=model,
                pool_id=pool_id,
                schedulable=node_state == NodeState.READY and health == "healthy",
                utilization=util if fresh and util is not None else None,
                memory_used_mb=mem if fresh else None,
            )

    def _load_allocations(self) -> None:
        start, _ = self.window
        rows = Allocation.objects.filter(
            Q(released_at__isnull=True) | Q(released_at__gt=start)
        ).values_list(
            "gpu_id",
            "job_id",
            "granted_at",
            "released_at",
            "job__tenant_id",
            "job__project_id",
            "job__submitted_by_id",
            "job__workload_type",
            "job__state",
        )
        self.held = [_Held(*row) for row in rows]
        self.open_by_gpu = {h.gpu_id: h for h in self.held if h.released_at is None}

    def _threshold(self, workload_type: str) -> float:
        return self.thresholds.get(workload_type, DEFAULT_IDLE_THRESHOLD)

    # --- queues ---

    def _write_queue_rows(self) -> int:
        queues = _queue_owners()
        pending = {
            row["queue_id"]: row
            for row in Job.objects.filter(state=JobState.PENDING)
            .values("queue_id")
            .annotate(jobs=Count("id"), gpus=Sum(F("gpus_per_node") * F("nodes")))
        }
        # The previous run's minute is completed (its admissions after that run), if recent.
        previous = (
            self.last
            if self.last is not None and self.window[0] == self.last < self.bucket
            else None
        )
        since = previous or self.bucket
        waits = _admission_waits(since, self.bucket + MINUTE, floor_minute)
        buckets = [self.bucket] if previous is None else [previous, self.bucket]
        existing = {
            (row.bucket, row.queue_id): row
            for row in QueueRollup.objects.filter(resolution=Resolution.MINUTE, bucket__in=buckets)
        }
        wanted: dict[tuple[datetime, int], QueueRollup] = {}
        for queue_id, (pool_id, tenant_id) in queues.items():
            key = (self.bucket, queue_id)
            row = existing.get(key) or QueueRollup(
                resolution=Resolution.MINUTE,
                bucket=self.bucket,
                queue_id=queue_id,
                pool_id=pool_id,
                tenant_id=tenant_id,
            )
            counts = pending.get(queue_id)
            row.pending_jobs = float(counts["jobs"]) if counts else 0.0
            row.pending_gpus = float(counts["gpus"] or 0) if counts else 0.0
            wanted[key] = row
        for bucket, queue_id in waits:
            key = (bucket, queue_id)
            row = wanted.get(key) or existing.get(key)
            if row is None:
                if queue_id not in queues:
                    continue
                pool_id, tenant_id = queues[queue_id]
                row = QueueRollup(
                    resolution=Resolution.MINUTE,
                    bucket=bucket,
                    queue_id=queue_id,
                    pool_id=pool_id,
                    tenant_id=tenant_id,
                )
            wanted[key] = row
        for key, row in wanted.items():
            values = waits.get(key, [])
            row.admitted_jobs = len(values)
            row.wait_p50_seconds, row.wait_p95_seconds, row.wait_max_seconds = wait_figures(values)
        _save(
            QueueRollup,
            wanted.values(),
            [
                "pending_jobs",
                "pending_gpus",
                "admitted_jobs",
                "wait_p50_seconds",
                "wait_p95_seconds",
                "wait_max_seconds",
            ],
        )
        return len(wanted)

    # --- pools and tenants ---

    def _write_usage_rows(self) -> int:
        totals: dict[tuple[int, str, int | None], list[float]] = {}
        models: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))

        def add(key, capacity=0.0, allocated=0.0, used=0.0, idle=0.0):
            row = totals.setdefault(key, [0.0, 0.0, 0.0, 0.0])
            row[0] += capacity
            row[1] += allocated
            row[2] += used
            row[3] += idle

        for gpu in self.gpus.values():
            models[gpu.pool_id][gpu.model] += 1
            add((gpu.pool_id, gpu.model, None), capacity=1.0 if gpu.schedulable else 0.0)
            held = self.open_by_gpu.get(gpu.id)
            if held is None:
                continue
            used = gpu.utilization / 100.0 if gpu.utilization is not None else 0.0
            idle = (
                1.0
                if gpu.utilization is not None
                and gpu.utilization < self._threshold(held.workload_type)
                else 0.0
            )
            for tenant in (None, held.tenant_id):
                add((gpu.pool_id, gpu.model, tenant), allocated=1.0, used=used, idle=idle)
        quotas = list(
            Quota.objects.values_list("tenant_id", "pool_id", "gpu_model", "guaranteed_gpus")
        )
        for (pool_id, model, tenant_id), guaranteed in guarantees(quotas, models).items():
            if model in models.get(pool_id, {}):
                add((pool_id, model, tenant_id))
                totals[(pool_id, model, tenant_id)][0] = guaranteed
        existing = {
            (row.pool_id, row.gpu_model, row.tenant_id): row
            for row in UsageRollup.objects.filter(resolution=Resolution.MINUTE, bucket=self.bucket)
        }
        rows = []
        for key, (capacity, allocated, used, idle) in totals.items():
            pool_id, model, tenant_id = key
            row = existing.get(key) or UsageRollup(
                resolution=Resolution.MINUTE,
                bucket=self.bucket,
                pool_id=pool_id,
                gpu_model=model,
                tenant_id=tenant_id,
            )
            row.capacity_gpus = capacity
            row.allocated_gpus = allocated
            row.used_gpus = round(used, 4)
            row.idle_gpus = idle
            rows.append(row)
        _save(UsageRollup, rows, ["capacity_gpus", "allocated_gpus", "used_gpus", "idle_gpus"])
        return len(rows)

    # --- GPUs ---

    def _write_gpu_activity(self) -> None:
        known = dict(GpuActivity.objects.values_list("gpu_id", "idle_since"))
        busy, idle = [], []
        for gpu in self.gpus.values():
            held = self.open_by_gpu.get(gpu.id)
            if held is None:
                idle.append(gpu.id)  # nobody holds it
            elif gpu.utilization is None:
                continue  # held, sample unknown: neither busy nor idle
            elif gpu.utilization >= self._threshold(held.workload_type):
                busy.append(gpu.id)
            else:
                idle.append(gpu.id)
        busy_set, idle_set = set(busy), set(idle)
        GpuActivity.objects.bulk_create(
            [
                GpuActivity(
                    gpu_id=gid,
                    busy_at=self.now if gid in busy_set else None,
                    idle_since=self.now if gid in idle_set else None,
                    sampled_at=self.now,
                )
                for gid in self.gpus
                if gid not in known
            ],
            ignore_conflicts=True,
        )
        if busy:
            GpuActivity.objects.filter(gpu_id__in=busy).update(busy_at=self.now, idle_since=None)
        newly_idle = [gid for gid in idle if gid in known and known[gid] is None]
        if newly_idle:
            GpuActivity.objects.filter(gpu_id__in=newly_idle).update(idle_since=self.now)
        GpuActivity.objects.update(sampled_at=self.now)

    # --- jobs' series ---

    def _billed(self) -> dict[int, list[float]]:
        """{job id: [allocated GPU-seconds, used GPU-seconds]} over the billed window."""
        lo, hi = self.window
        out: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for held in self.held:
            seconds = overlap_seconds(held.granted_at, held.released_at, lo, hi)
            if seconds <= 0:
                continue
            entry = out[held.job_id]
            entry[0] += seconds
            util = self.gpus[held.gpu_id].utilization if held.gpu_id in self.gpus else None
            if held.released_at is None and util is not None:
                entry[1] += seconds * util / 100.0
        return out

    def _write_series(self) -> int:
        billed = self._billed()
        running: dict[int, list[_GpuNow]] = defaultdict(list)
        for held in self.open_by_gpu.values():
            if held.job_state in SERIES_STATES and held.gpu_id in self.gpus:
                running[held.job_id].append(self.gpus[held.gpu_id])
        stamp = int(self.now.timestamp())
        points = {}
        names = {}
        for job_id, gpus in running.items():
            gpus.sort(key=lambda g: g.name)
            names[job_id] = [g.name for g in gpus]
            points[job_id] = [
                stamp,
                [None if g.utilization is None else round(g.utilization, 1) for g in gpus],
                [g.memory_used_mb for g in gpus],
            ]
        ids = set(billed) | set(running)
        if not ids:
            return 0
        existing = {
            job_id: (gpus, step, count, last)
            for job_id, gpus, step, count, last in JobGpuSeries.objects.filter(job_id__in=ids)
            .annotate(count=_JsonLength("points"), last=_JsonLastTime("points"))
            .values_list("job_id", "gpus", "step_seconds", "count", "last")
        }
        limit = settings.SLUICE_JOB_SERIES_POINTS
        tolerance = max(self.interval, 60) / 2
        spread = max(1, min(64, limit // 4))
        created, updated, to_merge = [], [], {}
        for job_id in ids:
            allocated, used = billed.get(job_id, (0.0, 0.0))
            point = points.get(job_id)
            if job_id not in existing:
                if point is None:
                    continue  # billed after its end, never charted: no series
                created.append(
                    JobGpuSeries(
                        job_id=job_id,
                        gpus=names[job_id],
                        points=[point],
                        step_seconds=60,
                        allocated_gpu_seconds=allocated,
                        used_gpu_seconds=used,
                    )
                )
                continue
            gpus, step, count, last = existing[job_id]
            # (job, gpus, step, replace, append, allocated, used)
            row = [job_id, json.dumps(names.get(job_id, gpus)), step, None, None, allocated, used]
            due = point is not None and (
                not count or last is None or stamp - last >= step - tolerance
            )
            # Jobs started together would all merge in the same run: each merges up to
            # ``spread`` points early, by its id, so that their merges spread over minutes.
            if due and (count or 0) + 1 > limit - job_id % spread:
                to_merge[job_id] = (row, point)
            elif due:
                row[4] = json.dumps(point)
            updated.append(row)
        if to_merge:
            for job_id, stored in JobGpuSeries.objects.filter(
                job_id__in=list(to_merge)
            ).values_list("job_id", "points"):
                row, point = to_merge[job_id]
                row[3] = json.dumps(series_merge([*stored, point]))
                row[2] = row[2] * 2
        JobGpuSeries.objects.bulk_create(created, ignore_conflicts=True)
        _series_update(updated)
        return len(created) + len(updated)

    # --- chargeback ---

    def _write_usage_days(self) -> int:
        lo, hi = self.window
        totals: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for held in self.held:
            gpu = self.gpus.get(held.gpu_id)
            if gpu is None:
                continue
            for day, start, end in day_segments(lo, hi):
                seconds = overlap_seconds(held.granted_at, held.released_at, start, end)
                if seconds <= 0:
                    continue
                key = (
                    day,
                    held.tenant_id,
                    held.project_id,
                    held.user_id,
                    held.workload_type,
                    gpu.pool_id,
                    gpu.model,
                )
                entry = totals[key]
                entry[0] += seconds / 3600.0
                if held.released_at is None and gpu.utilization is not None:
                    entry[1] += seconds * gpu.utilization / 100.0 / 3600.0
                    entry[2] += seconds / 3600.0
        return usage_days_add(totals)


def usage_days_add(totals: dict[tuple, list[float]], *, replace_allocated: bool = False) -> int:
    """Add ``[allocated, used, sampled]`` GPU-hours (sampled: allocated with a known
    utilization sample; absent: 0) to the ``UsageDay`` rows of their keys (day, tenant,
    project, user, workload type, pool, GPU model), found then updated (nulls match
    nulls); ``replace_allocated``: set allocated instead (the backfill)."""
    if not totals:
        return 0
    days = {key[0] for key in totals}
    existing = {
        (
            row.day,
            row.tenant_id,
            row.project_id,
            row.user_id,
            row.workload_type,
            row.pool_id,
            row.gpu_model,
        ): row.pk
        for row in UsageDay.objects.filter(day__in=days).only(
            "id",
            "day",
            "tenant_id",
            "project_id",
            "user_id",
            "workload_type",
            "pool_id",
            "gpu_model",
        )
    }
    created, updated = [], []
    for key, figures in totals.items():
        allocated, used = figures[0], figures[1]
        sampled = figures[2] if len(figures) > 2 else 0.0
        day, tenant_id, project_id, user_id, workload_type, pool_id, model = key
        pk = existing.get(key)
        if pk is None:
            created.append(
                UsageDay(
                    day=day,
                    tenant_id=tenant_id,
                    project_id=project_id,
                    user_id=user_id,
                    workload_type=workload_type,
                    pool_id=pool_id,
                    gpu_model=model,
                    allocated_gpu_hours=allocated,
                    used_gpu_hours=used,
                    sampled_gpu_hours=sampled,
                )
            )
        else:
            updated.append([pk, allocated, used, sampled, 1 if replace_allocated else 0])
    UsageDay.objects.bulk_create(created, batch_size=1000)
    _update_from_values(
        UsageDay,
        updated,
        columns=[
            ("id", "bigint"),
            ("alloc", "float8"),
            ("used", "float8"),
            ("sampled", "float8"),
            ("replace", "int"),
        ],
        assignments={
            "allocated_gpu_hours": "CASE WHEN {replace} = 1 THEN {alloc} "
            "ELSE allocated_gpu_hours + {alloc} END",
            # The backfill (replace) fills in used and sampled hours only where the row has
            # none sampled: the writer's samples stay, a second backfill adds nothing.
            "used_gpu_hours": "CASE WHEN {replace} = 0 THEN used_gpu_hours + {used} "
            "WHEN sampled_gpu_hours = 0 THEN {used} ELSE used_gpu_hours END",
            "sampled_gpu_hours": "CASE WHEN {replace} = 0 THEN sampled_gpu_hours + {sampled} "
            "WHEN sampled_gpu_hours = 0 THEN {sampled} ELSE sampled_gpu_hours END",
        },
    )
    return len(created) + len(updated)


#: Rows per UPDATE ... FROM (VALUES ...) statement.
UPDATE_CHUNK = 1000


def _update_from_values(
    model, rows: list[list], *, columns: list[tuple[str, str]], assignments: dict[str, str]
) -> int:
    """Update many rows of ``model`` in one statement per UPDATE_CHUNK rows:
    ``UPDATE t SET ... FROM (VALUES ...) AS v WHERE t.<key> = v.<key>``; ``columns`` name
    the values of each row (the first: the key column of ``t``) with their PostgreSQL type,
    ``assignments`` give each column's new value as SQL with ``{name}`` for a value.
    (Django's bulk_update builds a CASE per row and column: seconds of Python for
    thousands of rows, where the database needs milliseconds.)"""
    if not rows:
        return 0
    table = connection.ops.quote_name(model._meta.db_table)
    key = columns[0][0]
    postgres = connection.vendor == "postgresql"
    if postgres:
        one = "(" + ", ".join(f"%s::{kind}" for _, kind in columns) + ")"
        alias = "v(" + ", ".join(f"v_{name}" for name, _ in columns) + ")"
        refs = {name: f"v.v_{name}" for name, _ in columns}
    else:
        one = "(" + ", ".join("%s" for _ in columns) + ")"
        alias = "v"
        refs = {name: f"v.column{i + 1}" for i, (name, _) in enumerate(columns)}
    sets = ", ".join(
        f"{connection.ops.quote_name(column)} = {template.format(**refs)}"
        for column, template in assignments.items()
    )
    with connection.cursor() as cursor:
        for i in range(0, len(rows), UPDATE_CHUNK):
            chunk = rows[i : i + UPDATE_CHUNK]
            values = ", ".join([one] * len(chunk))
            cursor.execute(
                f"UPDATE {table} SET {sets} FROM (VALUES {values}) AS {alias} "
                f"WHERE {table}.{connection.ops.quote_name(key)} = {refs[key]}",
                [value for row in chunk for value in row],
            )
    return len(rows)


def _series_update(rows: list[list]) -> int:
    """Rows ``[job id, gpus (JSON), step, points (JSON) to replace or None, point (JSON) to
    append or None, GPU-seconds allocated to add, used to add]``: the point is appended in
    the database (the stored points are not read back)."""
    if connection.vendor == "postgresql":
        points = (
            "CASE WHEN {replace} IS NOT NULL THEN {replace} "
            "WHEN {append} IS NOT NULL THEN COALESCE(points, '[]'::jsonb) || "
            "jsonb_build_array({append}) ELSE points END"
        )
        gpus = "{gpus}"
    else:
        points = (
            "CASE WHEN {replace} IS NOT NULL THEN json({replace}) "
            "WHEN {append} IS NOT NULL THEN json_insert(COALESCE(points, '[]'), '$[#]', "
            "json({append})) ELSE points END"
        )
        gpus = "json({gpus})"
    return _update_from_values(
        JobGpuSeries,
        rows,
        columns=[
            ("job_id", "bigint"),
            ("gpus", "jsonb"),
            ("step", "int"),
            ("replace", "jsonb"),
            ("append", "jsonb"),
            ("alloc", "float8"),
            ("used", "float8"),
        ],
        assignments={
            "gpus": gpus,
            "step_seconds": "{step}",
            "points": points,
            "allocated_gpu_seconds": "allocated_gpu_seconds + {alloc}",
            "used_gpu_seconds": "used_gpu_seconds + {used}",
        },
    )


def _save(model, rows, fields: list[str]) -> None:
    """Insert the new rows, update the stored ones (in bulk)."""
    rows = list(rows)
    new = [r for r in rows if r.pk is None]
    old = [r for r in rows if r.pk is not None]
    if new:
        model.objects.bulk_create(new, ignore_conflicts=True)
    if old:
        model.objects.bulk_update(old, fields)


# --- hours: compaction and retention ----------------------------------------------------------


def _compact_hours(now: datetime) -> int:
    """Write the hour rows of the ended hours that have minute rows and no hour rows yet."""
    end = floor_hour(now)
    newest = (
        UsageRollup.objects.filter(resolution=Resolution.HOUR).aggregate(m=Max("bucket")).get("m")
    )
    if newest is not None:
        start = newest + HOUR
    else:
        oldest = (
            UsageRollup.objects.filter(resolution=Resolution.MINUTE)
            .aggregate(m=Min("bucket"))
            .get("m")
        )
        if oldest is None:
            return 0
        start = floor_hour(oldest)
    start = max(start, floor_hour(now - timedelta(days=settings.SLUICE_ROLLUP_MINUTE_DAYS)))
    if start >= end:
        return 0
    return hours_from_minutes(start, end)


def _queue_owners() -> dict[int, tuple[int, int]]:
    """Each queue's pool and tenant, by queue id."""
    return {
        qid: (pool, tenant)
        for qid, pool, tenant in Queue.objects.values_list("id", "pool_id", "tenant_id")
    }


def _admission_waits(since: datetime, until: datetime, floor) -> dict[tuple[datetime, int], list]:
    """The admission waits of the jobs admitted in ``[since, until)``, by (``floor`` of the
    admission, queue id)."""
    waits: dict[tuple[datetime, int], list[float]] = defaultdict(list)
    for queue_id, admitted, queued, submitted in Job.objects.filter(
        admitted_at__gte=since, admitted_at__lt=until
    ).values_list("queue_id", "admitted_at", "queued_at", "submitted_at"):
        waits[(floor(admitted), queue_id)].append(admission_wait(admitted, queued, submitted))
    return waits


def _queue_hour_row(
    hour, queue_id, pool_id, tenant_id, pending_jobs, pending_gpus, admitted_jobs, waits
) -> QueueRollup:
    """An hour row of a queue, its wait figures from ``waits``."""
    p50, p95, top = wait_figures(waits)
    return QueueRollup(
        resolution=Resolution.HOUR,
        bucket=hour,
        queue_id=queue_id,
        pool_id=pool_id,
        tenant_id=tenant_id,
        pending_jobs=pending_jobs,
        pending_gpus=pending_gpus,
        admitted_jobs=admitted_jobs,
        wait_p50_seconds=p50,
        wait_p95_seconds=p95,
        wait_max_seconds=top,
    )


def _usage_hour_row(
    hour, pool_id, model, tenant_id, capacity, allocated, used=0.0, idle=0.0
) -> UsageRollup:
    """An hour row of a pool and GPU model (``tenant_id`` None) or of a tenant in them."""
    return UsageRollup(
        resolution=Resolution.HOUR,
        bucket=hour,
        pool_id=pool_id,
        gpu_model=model,
        tenant_id=tenant_id,
        capacity_gpus=capacity,
        allocated_gpus=allocated,
        used_gpus=used,
        idle_gpus=idle,
    )


def hours_from_minutes(start: datetime, end: datetime) -> int:
    """Hour rows of the hours in ``[start, end)`` from their minute rows: pending and GPU
    figures are means over the minutes sampled in the hour (a minute without a tenant's row
    counts as 0 for it), admitted jobs the sum of the minutes (or the jobs recorded as
    admitted in the hour, if more: a minute the writer missed), waits recomputed from the
    jobs admitted in the hour. Existing hour rows are kept (conflicts ignored)."""
    queue_minutes: dict[datetime, set] = defaultdict(set)
    queue_sums: dict[tuple[datetime, int], list] = {}
    for bucket, queue_id, pool_id, tenant_id, jobs, gpus, admitted in QueueRollup.objects.filter(
        resolution=Resolution.MINUTE, bucket__gte=start, bucket__lt=end
    ).values_list(
        "bucket",
        "queue_id",
        "pool_id",
        "tenant_id",
        "pending_jobs",
        "pending_gpus",
        "admitted_jobs",
    ):
        hour = floor_hour(bucket)
        queue_minutes[hour].add(bucket)
        sums = queue_sums.setdefault((hour, queue_id), [pool_id, tenant_id, 0.0, 0.0, 0])
        sums[2] += jobs
        sums[3] += gpus
        sums[4] += admitted
    waits = _admission_waits(start, end, floor_hour)
    queue_rows = []
    for (hour, queue_id), (pool_id, tenant_id, jobs, gpus, admitted) in queue_sums.items():
        minutes = len(queue_minutes[hour])
        values = waits.get((hour, queue_id), [])
        queue_rows.append(
            _queue_hour_row(
                hour,
                queue_id,
                pool_id,
                tenant_id,
                jobs / minutes,
                gpus / minutes,
                max(admitted, len(values)),
                values,
            )
        )
    QueueRollup.objects.bulk_create(queue_rows, ignore_conflicts=True)

    pool_minutes: dict[tuple[datetime, int, str], int] = defaultdict(int)
    usage_sums: dict[tuple, list[float]] = {}
    for bucket, pool_id, tenant_id, model, cap, alloc, used, idle in UsageRollup.objects.filter(
        resolution=Resolution.MINUTE, bucket__gte=start, bucket__lt=end
    ).values_list(
        "bucket",
        "pool_id",
        "tenant_id",
        "gpu_model",
        "capacity_gpus",
        "allocated_gpus",
        "used_gpus",
        "idle_gpus",
    ):
        hour = floor_hour(bucket)
        if tenant_id is None:
            pool_minutes[(hour, pool_id, model)] += 1
        sums = usage_sums.setdefault((hour, pool_id, model, tenant_id), [0.0, 0.0, 0.0, 0.0])
        sums[0] += cap
        sums[1] += alloc
        sums[2] += used
        sums[3] += idle
    usage_rows = []
    for (hour, pool_id, model, tenant_id), sums in usage_sums.items():
        minutes = pool_minutes.get((hour, pool_id, model)) or 1
        usage_rows.append(
            _usage_hour_row(hour, pool_id, model, tenant_id, *(total / minutes for total in sums))
        )
    UsageRollup.objects.bulk_create(usage_rows, ignore_conflicts=True)
    return len({row.bucket for row in usage_rows} | {row.bucket for row in queue_rows})


def _apply_retention(now: datetime) -> int:
    """Delete minute rows older than SLUICE_ROLLUP_MINUTE_DAYS, hour rows older than
    SLUICE_ROLLUP_HOUR_DAYS."""
    minute_edge = now - timedelta(days=settings.SLUICE_ROLLUP_MINUTE_DAYS)
    hour_edge = now - timedelta(days=settings.SLUICE_ROLLUP_HOUR_DAYS)
    deleted = 0
    for model in (QueueRollup, UsageRollup):
        deleted += model.objects.filter(
            resolution=Resolution.MINUTE, bucket__lt=minute_edge
        ).delete()[0]
        deleted += model.objects.filter(resolution=Resolution.HOUR, bucket__lt=hour_edge).delete()[
            0
        ]
    return deleted


# --- backfill -------------------------------------------------------------------------------


@dataclass
class _HourSums:
    pending: dict = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))
    waits: dict = field(default_factory=lambda: defaultdict(list))
    usage: dict = field(default_factory=lambda: defaultdict(float))
    used: dict = field(default_factory=lambda: defaultdict(float))
    days: dict = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0, 0.0]))


@transaction.atomic
def rollups_backfill(*, days: int, now: datetime | None = None, replace: bool = False) -> dict:
    """Rebuild the hour rows of the last ``days`` days (ended hours) and the allocated
    GPU-hours of ``UsageDay`` from the recorded jobs and allocations, so that a fresh
    install (the demo, a benchmark) has history.

    - Queue depth: each job counts as pending over its recorded waits (the first attempt's,
      from ``submitted_at`` for ``first_wait_seconds``, and the current one's, from
      ``queued_at``/``submitted_at`` to its admission or end); time held counts as
      pending (holds are not recorded as intervals), earlier re-waits of a job requeued
      more than once are not counted.
    - Waits: the admissions recorded (the current one, and the first of a requeued job).
    - Allocations per pool, GPU model and tenant from the ``Allocation`` rows; a job
      without any (stored directly, like the demo's history) counts its GPUs from
      ``admitted_at`` to its end, in its queue's pool, on its first acceptable GPU model
      (else the pool's most common one).
    - Capacity: the pool's schedulable GPUs and the tenants' guarantees as they are now
      (their past values are not recorded).
    - Used GPUs: from the job's recorded GPU series (``JobGpuSeries``: its mean
      utilization over its known samples, on the share of its samples that are known), 0
      for a job without one (utilization is not recorded otherwise). Idle GPUs: 0.

    Hours that already have rows are kept unless ``replace``. ``UsageDay``: the allocated
    GPU-hours of each day from the first day to the last minute the writer billed are
    set; used and sampled GPU-hours are set from the series where the row has no sampled
    hours yet (the writer's own samples are kept, a second backfill adds nothing)."""
    now = now or timezone.now()
    end = floor_hour(now)
    start = end - timedelta(days=days)
    day_start = datetime.combine(start.astimezone(UTC).date(), datetime.min.time(), UTC)
    last_billed = (
        UsageRollup.objects.filter(resolution=Resolution.MINUTE).aggregate(m=Max("bucket")).get("m")
    )
    day_end = last_billed if last_billed and last_billed > day_start else floor_minute(now)

    queues = _queue_owners()
    models: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    capacity: dict[tuple[int, str], int] = defaultdict(int)
    for pool_id, model, health, node_state in Gpu.objects.values_list(
        "node__pool_id", "model", "health", "node__state"
    ):
        models[pool_id][model] += 1
        capacity[(pool_id, model)] += node_state == NodeState.READY and health == "healthy"
    dominant = {pool: max(counts, key=counts.get) for pool, counts in models.items()}
    guaranteed = guarantees(
        list(Quota.objects.values_list("tenant_id", "pool_id", "gpu_model", "guaranteed_gpus")),
        models,
    )
    sums = _HourSums()
    lo = min(start, day_start)

    allocations = Allocation.objects.filter(granted_at__lt=now).filter(
        Q(released_at__isnull=True) | Q(released_at__gt=lo)
    )
    with_allocations: set[int] = set()
    jobs = {
        row[0]: row
        for row in Job.objects.filter(submitted_at__lt=now)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=lo))
        .values_list(
            "id",
            "queue_id",
            "tenant_id",
            "project_id",
            "submitted_by_id",
            "workload_type",
            "state",
            "gpus_per_node",
            "nodes",
            "gpu_models",
            "submitted_at",
            "queued_at",
            "admitted_at",
            "finished_at",
            "requeue_count",
            "first_wait_seconds",
        )
    }
    owners = {
        job_id: (tenant, project, user, wtype)
        for job_id, tenant, project, user, wtype in Job.objects.filter(
            pk__in=allocations.values("job_id")
        ).values_list("id", "tenant_id", "project_id", "submitted_by_id", "workload_type")
    }
    held_jobs = set(jobs) | set(owners)
    utilization = {
        job_id: series_utilization(points)
        for job_id, points in JobGpuSeries.objects.filter(job_id__in=held_jobs)
        .values_list("job_id", "points")
        .iterator(500)
    }
    for job_id, granted, released, pool_id, model in allocations.values_list(
        "job_id", "granted_at", "released_at", "gpu__node__pool_id", "gpu__model"
    ):
        with_allocations.add(job_id)
        _add_held(
            sums,
            owners[job_id],
            pool_id,
            model,
            1,
            granted,
            released or now,
            start,
            end,
            day_start,
            day_end,
            utilization.get(job_id),
        )

    for row in jobs.values():
        (job_id, queue_id, tenant, project, user, wtype, state, per_node, nodes, wanted, submitted,
         queued, admitted_at, finished, requeues, first_wait) = row  # fmt: skip
        gpus = per_node * nodes
        waits: list[tuple[datetime, datetime | None]] = []
        if requeues and first_wait is not None:
            waits.append((submitted, submitted + timedelta(seconds=first_wait)))
            _admission(
                sums, queue_id, submitted + timedelta(seconds=first_wait), first_wait, start, end
            )
        wait_end = (
            admitted_at or finished or (now if state in (JobState.PENDING, JobState.HELD) else None)
        )
        if wait_end is not None:
            waits.append((queued or submitted, wait_end))
        for begin, finish in waits:
            for hour, seconds in hour_spread(begin, finish, start, end):
                entry = sums.pending[(hour, queue_id)]
                entry[0] += seconds / 3600
                entry[1] += gpus * seconds / 3600
        if admitted_at is not None:
            _admission(
                sums,
                queue_id,
                admitted_at,
                admission_wait(admitted_at, queued, submitted),
                start,
                end,
            )
            if job_id not in with_allocations and queue_id in queues:
                pool_id = queues[queue_id][0]
                model = (wanted or [None])[0] or dominant.get(pool_id, "")
                held_end = finished or (
                    now if state not in (JobState.PENDING, JobState.HELD) else None
                )
                if held_end is not None:
                    _add_held(
                        sums,
                        (tenant, project, user, wtype),
                        pool_id,
                        model,
                        gpus,
                        admitted_at,
                        held_end,
                        start,
                        end,
                        day_start,
                        day_end,
                        utilization.get(job_id),
                    )

    hours = [start + i * HOUR for i in range(days * 24)]
    if replace:
        for model_ in (QueueRollup, UsageRollup):
            model_.objects.filter(
                resolution=Resolution.HOUR, bucket__gte=start, bucket__lt=end
            ).delete()
    done_queue = set(
        QueueRollup.objects.filter(resolution=Resolution.HOUR, bucket__gte=start, bucket__lt=end)
        .values_list("bucket", flat=True)
        .distinct()
    )
    done_usage = set(
        UsageRollup.objects.filter(resolution=Resolution.HOUR, bucket__gte=start, bucket__lt=end)
        .values_list("bucket", flat=True)
        .distinct()
    )
    queue_rows = []
    for hour in hours:
        if hour in done_queue:
            continue
        for queue_id, (pool_id, tenant_id) in queues.items():
            depth = sums.pending.get((hour, queue_id), (0.0, 0.0))
            values = sums.waits.get((hour, queue_id), [])
            queue_rows.append(
                _queue_hour_row(
                    hour, queue_id, pool_id, tenant_id, depth[0], depth[1], len(values), values
                )
            )
    keys = {(pool, model, None) for pool, model in capacity}
    keys |= {key for key, g in guaranteed.items() if g and (key[0], key[1]) in capacity}
    keys |= {(pool, model, tenant) for (_, pool, model, tenant) in sums.usage}
    usage_rows = []
    for hour in hours:
        if hour in done_usage:
            continue
        for pool_id, model, tenant_id in keys:
            allocated = sums.usage.get((hour, pool_id, model, tenant_id), 0.0)
            cap = (
                capacity.get((pool_id, model), 0)
                if tenant_id is None
                else guaranteed.get((pool_id, model, tenant_id), 0.0)
            )
            if tenant_id is not None and not allocated and not cap:
                continue
            used = sums.used.get((hour, pool_id, model, tenant_id), 0.0)
            usage_rows.append(
                _usage_hour_row(hour, pool_id, model, tenant_id, float(cap), allocated, used)
            )
    QueueRollup.objects.bulk_create(queue_rows, batch_size=2000, ignore_conflicts=True)
    UsageRollup.objects.bulk_create(usage_rows, batch_size=2000, ignore_conflicts=True)
    day_rows = usage_days_add(dict(sums.days), replace_allocated=True)
    return {
        "hours": len(hours),
        "queue_rows": len(queue_rows),
        "usage_rows": len(usage_rows),
        "usage_days": day_rows,
        "jobs": len(jobs),
    }


def _admission(sums: _HourSums, queue_id, moment: datetime, wait: float, start, end) -> None:
    if start <= moment < end:
        sums.waits[(floor_hour(moment), queue_id)].append(wait)


def _add_held(
    sums, owner, pool_id, model, gpus, begin, finish, start, end, day_start, day_end, util=None
):
    """GPUs held from ``begin`` to ``finish``: hour sums (pool and tenant) and days; ``util``
    (mean %, share sampled) of the job's series, when it has one, bills used GPU-hours."""
    tenant, project, user, wtype = owner
    mean, share = util if util is not None else (0.0, 0.0)
    for hour, seconds in hour_spread(begin, finish, start, end):
        held = gpus * seconds / 3600
        sums.usage[(hour, pool_id, model, None)] += held
        sums.usage[(hour, pool_id, model, tenant)] += held
        sums.used[(hour, pool_id, model, None)] += held * share * mean / 100.0
        sums.used[(hour, pool_id, model, tenant)] += held * share * mean / 100.0
    for day, lo, hi in day_segments(max(begin, day_start), min(finish, day_end)):
        seconds = overlap_seconds(begin, finish, lo, hi)
        if seconds > 0:
            entry = sums.days[(day, tenant, project, user, wtype, pool_id, model)]
            held = gpus * seconds / 3600
            entry[0] += held
            entry[1] += held * share * mean / 100.0
            entry[2] += held * share
