"""Reads of the insights page and of the recommendations, always scoped to the user asking.

Platform admins see everything; a tenant admin sees the queues, projects, jobs and usage of
the tenants they administer, and pool-level totals (capacity, allocated, used, idle) of every
pool; members and viewers get no insights (see ``insights_scope``).

Every function here runs a fixed number of queries whatever the amount of history: the
rollup tables are aggregated in SQL over ``(resolution, bucket)`` ranges (their index), the
series fetched for a handful of queues and pools only, and grouped into chart points here.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db.models import (
    Avg,
    Count,
    DateTimeField,
    F,
    FloatField,
    Func,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Floor, Greatest, TruncDate, TruncHour
from django.utils import timezone

from inference.choices import BlockedReason
from inference.models import ScaleDecision, Service
from inference.selectors import services_near_capacity, with_replica_counts
from portal.errors import NotFoundError, PermissionDeniedError
from scheduling.choices import FINAL_STATES, JobState, PoolPurpose, WorkloadType
from scheduling.models import (
    Allocation,
    Job,
    JobEvent,
    Queue,
    Quota,
    ReclaimRecord,
    ResourcePool,
    WorkloadPolicy,
)
from tenants.models import Tenant
from tenants.scoping import restrict
from tenants.selectors import administered_tenants, administers_any_tenant, is_platform_admin

from .choices import Resolution
from .models import GpuActivity, QueueRollup, Recommendation, UsageRollup

# --- periods --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Period:
    """What ``?period=`` may be: how far back, which rollup rows, how wide a chart point."""

    key: str
    label: str
    length: timedelta
    resolution: str
    step_seconds: int

    @property
    def bucket_hours(self) -> float:
        return 1 / 60 if self.resolution == Resolution.MINUTE else 1.0


PERIODS = {
    "24h": Period("24h", "24 hours", timedelta(hours=24), Resolution.MINUTE, 15 * 60),
    "7d": Period("7d", "7 days", timedelta(days=7), Resolution.HOUR, 3 * 3600),
    "30d": Period("30d", "30 days", timedelta(days=30), Resolution.HOUR, 12 * 3600),
}
DEFAULT_PERIOD = "7d"
#: The 24 h view on hour rows, when the minute rows do not reach back 24 h yet (a fresh
#: install whose history was backfilled, a writer that was stopped).
HOURLY_DAY = Period("24h", "24 hours", timedelta(hours=24), Resolution.HOUR, 3600)

#: How many queues the wait and depth charts draw (the ones that wait longest / are deepest).
CHART_QUEUES = 5
#: How many pools get their own utilization chart.
CHART_POOLS = 6
#: Rows of each ranked table.
TABLE_ROWS = 10
#: A team's allocation is "abnormal" when this share of it is idle, or when it is this far
#: above or below its guarantee.
IDLE_SHARE_FLAG = 0.30
OVER_GUARANTEE_FLAG = 1.5
UNDER_GUARANTEE_FLAG = 0.5
#: An inference pool or quota is "near capacity" at this share of its limit at its peak.
NEAR_CAPACITY = 0.8


def period_from(value: str | None) -> tuple[Period, str | None]:
    """The period asked for, or the default and an error message for a value it is not."""
    if not value:
        return PERIODS[DEFAULT_PERIOD], None
    period = PERIODS.get(value)
    if period is None:
        choices = ", ".join(PERIODS)
        return PERIODS[DEFAULT_PERIOD], (
            f"Unknown period {value[:20]!r}: choose one of {choices}. Showing "
            f"{PERIODS[DEFAULT_PERIOD].label}."
        )
    return period, None


# --- who sees what --------------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """What one user's insights cover: everything (platform) or some tenants."""

    platform: bool
    tenant_ids: tuple[int, ...] = ()

    def filter(self, qs: QuerySet, field: str = "tenant_id") -> QuerySet:
        return qs if self.platform else qs.filter(**{f"{field}__in": self.tenant_ids})

    def covers(self, tenant_id: int | None) -> bool:
        return self.platform or tenant_id in self.tenant_ids


def insights_scope(user) -> Scope | None:
    """Platform admins: everything; tenant admins: their tenants; anyone else: ``None``
    (no access: the page answers 403)."""
    if is_platform_admin(user):
        return Scope(platform=True)
    if not user or not user.is_authenticated or not user.is_active:
        return None
    ids = tuple(sorted(administered_tenants(user).values_list("id", flat=True)))
    return Scope(platform=False, tenant_ids=ids) if ids else None


# --- chart points ---------------------------------------------------------------------------


class Epoch(Func):
    """Seconds since 1970 of a datetime column, on SQLite and PostgreSQL."""

    output_field = FloatField()

    def as_sqlite(self, compiler, connection, **extra):
        template = "((julianday(%(expressions)s) - 2440587.5) * 86400.0)"
        return self.as_sql(compiler, connection, template=template, **extra)

    def as_postgresql(self, compiler, connection, **extra):
        template = "EXTRACT(EPOCH FROM %(expressions)s)::double precision"
        return self.as_sql(compiler, connection, template=template, **extra)


@dataclass
class Window:
    """The period's time range and its chart points."""

    period: Period
    end: datetime
    start: datetime = field(init=False)
    points: int = field(init=False)

    def __post_init__(self) -> None:
        step = self.period.step_seconds
        end_ts = (int(self.end.timestamp()) // step + 1) * step
        self.points = int(self.period.length.total_seconds()) // step
        self.start = datetime.fromtimestamp(end_ts - self.points * step, tz=self.end.tzinfo)

    def index(self, bucket: datetime) -> int | None:
        i = int((bucket - self.start).total_seconds()) // self.period.step_seconds
        return i if 0 <= i < self.points else None

    def labels(self) -> list[str]:
        fmt = "%H:%M" if self.period.length <= timedelta(days=1) else "%d %b %H:%M"
        step = timedelta(seconds=self.period.step_seconds)
        return [(self.start + step * i).strftime(fmt) for i in range(self.points)]

    def point(self):
        """The chart point of a row's bucket, computed by the database."""
        start = self.start.timestamp() - 0.5  # buckets sit on whole minutes: no float edge
        return Floor((Epoch("bucket") - Value(start)) / Value(float(self.period.step_seconds)))

    def rollups(self, model) -> QuerySet:
        return model.objects.filter(
            resolution=self.period.resolution, bucket__gte=self.start, bucket__lt=self.end
        )


def window_for(period: Period, now: datetime | None = None) -> Window:
    window = Window(period=period, end=now or timezone.now())
    if period.resolution == Resolution.MINUTE:
        first = (
            UsageRollup.objects.filter(resolution=Resolution.MINUTE)
            .order_by("bucket")
            .values_list("bucket", flat=True)
            .first()
        )
        has_hours = UsageRollup.objects.filter(
            resolution=Resolution.HOUR, bucket__gte=window.start
        ).exists()
        if has_hours and (first is None or first > window.start + timedelta(hours=1)):
            return Window(period=HOURLY_DAY, end=window.end)
    return window


def _mean(total: float, n: int) -> float:
    return total / n if n else 0.0


# --- 1. which queues wait long --------------------------------------------------------------


def _queue_targets(queues) -> dict[int, int | None]:
    """A queue's wait target: the smallest ``max_wait_seconds`` of the workload policies of
    the types it accepts (all types when it names none)."""
    limits = dict(WorkloadPolicy.objects.values_list("workload_type", "max_wait_seconds"))
    targets = {}
    for queue in queues:
        types = queue.allowed_workload_types or list(WorkloadType.values)
        found = [limits[t] for t in types if t in limits]
        targets[queue.pk] = min(found) if found else None
    return targets


def queue_waits(scope: Scope, window: Window) -> list[dict]:
    """Queues ranked by their p95 wait over the period (the admissions-weighted mean of the
    buckets' p95), with p50, the longest wait, admissions, mean depth and the target."""
    rows = (
        scope.filter(window.rollups(QueueRollup))
        .values("queue_id")
        .annotate(
            admitted=Sum("admitted_jobs"),
            p50_weighted=Sum(F("wait_p50_seconds") * F("admitted_jobs")),
            p95_weighted=Sum(F("wait_p95_seconds") * F("admitted_jobs")),
            wait_max=Max("wait_max_seconds"),
            depth_sum=Sum("pending_jobs"),
            depth_max=Max("pending_jobs"),
            buckets=Count("id"),
        )
    )
    rows = list(rows)
    queues = Queue.objects.select_related("tenant", "pool", "project").in_bulk(
        [r["queue_id"] for r in rows]
    )
    targets = _queue_targets(queues.values())
    ranked = []
    for r in rows:
        queue = queues.get(r["queue_id"])
        if queue is None:
            continue
        admitted = r["admitted"] or 0
        p95 = _mean(r["p95_weighted"] or 0.0, admitted) if admitted else None
        p50 = _mean(r["p50_weighted"] or 0.0, admitted) if admitted else None
        target = targets.get(queue.pk)
        ranked.append(
            {
                "queue": queue,
                "admitted": admitted,
                "p50": p50,
                "p95": p95,
                "wait_max": r["wait_max"],
                "depth_mean": _mean(r["depth_sum"] or 0.0, r["buckets"]),
                "depth_max": r["depth_max"] or 0.0,
                "target": target,
                "over_target": (p95 / target) if (p95 is not None and target) else None,
            }
        )
    ranked.sort(key=lambda r: (r["p95"] or 0.0, r["depth_mean"]), reverse=True)
    return ranked


def queue_series(window: Window, queue_ids: list[int]) -> dict[int, dict[str, list]]:
    """Per queue: p50, p95 (admissions-weighted per point) and mean depth per chart point,
    grouped in SQL (a few hundred rows back, whatever the number of buckets)."""
    n = window.points
    series = {qid: {"p50": [None] * n, "p95": [None] * n, "depth": [None] * n} for qid in queue_ids}
    if not queue_ids:
        return series
    with_wait = Q(wait_p95_seconds__isnull=False)
    rows = (
        window.rollups(QueueRollup)
        .filter(queue_id__in=queue_ids)
        .annotate(point=window.point())
        .values("queue_id", "point")
        .annotate(
            admitted=Sum("admitted_jobs", filter=with_wait),
            p50_weighted=Sum(F("wait_p50_seconds") * F("admitted_jobs"), filter=with_wait),
            p95_weighted=Sum(F("wait_p95_seconds") * F("admitted_jobs"), filter=with_wait),
            depth=Avg("pending_jobs"),
        )
        .order_by()
    )
    for r in rows:
        i = int(r["point"])
        if not 0 <= i < n:
            continue
        s = series[r["queue_id"]]
        if r["admitted"]:
            s["p50"][i] = round((r["p50_weighted"] or 0.0) / r["admitted"], 1)
            s["p95"][i] = round((r["p95_weighted"] or 0.0) / r["admitted"], 1)
        if r["depth"] is not None:
            s["depth"][i] = round(r["depth"], 2)
    return series


# --- 2. which teams use GPUs abnormally; utilization vs allocation ---------------------------


@dataclass(frozen=True)
class Coverage:
    """How much of the period the pool rows cover.

    ``recorded``: the buckets that hold pool rows (a bucket where a tenant held nothing may
    have no row for it); ``span``: the buckets from the period's start to the last recorded
    one, the divisor of the period's means of GPUs allocated, used and idle. A mean over 30
    days is the GPU-hours of the 30 days over their hours: before the first record nothing
    was held (the backfill rebuilds every hour a recorded job held GPUs), so those hours
    count, as 0. The buckets after the last record (the hour not rolled up yet, a writer
    that stopped) are not known yet and do not count. Capacity is a mean over the recorded
    buckets: a pool's GPUs do not drop to 0 where nothing was recorded."""

    recorded: int = 0
    span: int = 0

    def covered_share(self) -> float | None:
        return self.recorded / self.span if self.span else None


def bucket_coverage(window: Window) -> Coverage:
    """The period's :class:`Coverage`, in one query."""
    found = (
        window.rollups(UsageRollup)
        .filter(tenant__isnull=True)
        .aggregate(n=Count("bucket", distinct=True), last=Max("bucket"))
    )
    if not found["n"]:
        return Coverage()
    bucket_seconds = window.period.bucket_hours * 3600
    span = int((found["last"] - window.start).total_seconds() // bucket_seconds) + 1
    return Coverage(recorded=found["n"], span=max(span, found["n"]))


def bucket_count(window: Window) -> int:
    """How many buckets of the period hold pool rows."""
    return bucket_coverage(window).recorded


def usage_totals(scope: Scope, window: Window) -> list[dict]:
    """Per pool, GPU model and tenant (``tenant_id`` None: the pool's totals), summed over
    the period: one aggregate query. Tenants outside the scope are left out."""
    qs = window.rollups(UsageRollup)
    if not scope.platform:
        qs = qs.filter(Q(tenant__isnull=True) | Q(tenant_id__in=scope.tenant_ids))
    return list(
        qs.values("pool_id", "gpu_model", "tenant_id").annotate(
            capacity=Sum("capacity_gpus"),
            allocated=Sum("allocated_gpus"),
            used=Sum("used_gpus"),
            idle=Sum("idle_gpus"),
            allocated_peak=Max("allocated_gpus"),
            capacity_peak=Max("capacity_gpus"),
        )
    )


def guarantees_of(scope: Scope) -> dict[tuple[int, int], dict]:
    """Per (tenant, pool): guaranteed and borrowable GPUs, all GPU models together."""
    found: dict[tuple[int, int], dict] = defaultdict(lambda: {"guaranteed": 0, "borrow": 0})
    for tenant_id, pool_id, guaranteed, borrow in scope.filter(Quota.objects.all()).values_list(
        "tenant_id", "pool_id", "guaranteed_gpus", "borrow_limit_gpus"
    ):
        found[(tenant_id, pool_id)]["guaranteed"] += guaranteed
        found[(tenant_id, pool_id)]["borrow"] += borrow
    return found


def team_usage(
    scope: Scope, window: Window, totals: list[dict], buckets: int, guarantees: dict
) -> dict:
    """Mean GPUs per tenant and pool over the period (``buckets``: its span, see
    :class:`Coverage`) against the guarantee, and the ranked list of those that look
    abnormal (idle while held, or far from their guarantee)."""
    if not buckets:
        # No pool history: nothing to judge a team by (not "0 % of its guarantee used").
        return {"rows": [], "per_tenant": [], "abnormal": []}
    hours = buckets * window.period.bucket_hours
    per: dict[tuple[int, int], dict] = defaultdict(
        lambda: {"allocated": 0.0, "used": 0.0, "idle": 0.0, "models": set()}
    )
    for row in totals:
        if row["tenant_id"] is None:
            continue
        entry = per[(row["tenant_id"], row["pool_id"])]
        entry["allocated"] += row["allocated"] or 0.0
        entry["used"] += row["used"] or 0.0
        entry["idle"] += row["idle"] or 0.0
        entry["models"].add(row["gpu_model"])
    keys = set(per) | {k for k, g in guarantees.items() if g["guaranteed"]}
    tenants = Tenant.objects.in_bulk({k[0] for k in keys})
    pools = ResourcePool.objects.in_bulk({k[1] for k in keys})
    rows = []
    for tenant_id, pool_id in keys:
        if tenant_id not in tenants or pool_id not in pools:
            continue
        e = per.get((tenant_id, pool_id), {"allocated": 0.0, "used": 0.0, "idle": 0.0})
        guaranteed = guarantees.get((tenant_id, pool_id), {}).get("guaranteed", 0)
        allocated = _mean(e["allocated"], buckets)
        used = _mean(e["used"], buckets)
        idle = _mean(e["idle"], buckets)
        findings = []
        if allocated and idle / allocated >= IDLE_SHARE_FLAG:
            findings.append(f"{idle / allocated:.0%} of its GPUs held idle")
        if guaranteed and allocated >= guaranteed * OVER_GUARANTEE_FLAG:
            findings.append(f"{allocated / guaranteed:.1f}× its guarantee")
        if guaranteed and allocated <= guaranteed * UNDER_GUARANTEE_FLAG:
            findings.append(f"uses {allocated / guaranteed:.0%} of its guarantee")
        off = idle + abs(allocated - guaranteed) if guaranteed else idle + allocated
        rows.append(
            {
                "tenant": tenants[tenant_id],
                "pool": pools[pool_id],
                "allocated": allocated,
                "used": used,
                "idle": idle,
                "guaranteed": guaranteed,
                "used_share": used / allocated if allocated else None,
                "idle_gpu_hours": idle * hours,
                "unused_guarantee_gpu_hours": max(guaranteed - allocated, 0.0) * hours,
                "findings": findings,
                "score": off * hours,
            }
        )
    rows.sort(key=lambda r: (r["tenant"].slug, r["pool"].name))
    per_tenant: dict[int, dict] = {}
    for r in rows:
        t = per_tenant.setdefault(
            r["tenant"].pk,
            {"tenant": r["tenant"], "allocated": 0.0, "used": 0.0, "idle": 0.0, "guaranteed": 0},
        )
        for key in ("allocated", "used", "idle", "guaranteed"):
            t[key] += r[key]
    abnormal = sorted((r for r in rows if r["findings"]), key=lambda r: r["score"], reverse=True)
    return {"rows": rows, "per_tenant": list(per_tenant.values()), "abnormal": abnormal}


def pool_series(window: Window, pool_ids: list[int]) -> dict[int, dict[str, list]]:
    """Per pool (all GPU models together): mean capacity, allocated, used and idle GPUs per
    chart point, from the pool rows (tenant null), grouped in SQL."""
    n = window.points
    names = ("cap", "alloc", "used", "idle")
    series = {pid: {name: [None] * n for name in names} for pid in pool_ids}
    if not pool_ids:
        return series
    rows = (
        window.rollups(UsageRollup)
        .filter(tenant__isnull=True, pool_id__in=pool_ids)
        .annotate(point=window.point())
        .values("pool_id", "point")
        .annotate(
            buckets=Count("bucket", distinct=True),
            cap=Sum("capacity_gpus"),
            alloc=Sum("allocated_gpus"),
            used=Sum("used_gpus"),
            idle=Sum("idle_gpus"),
        )
        .order_by()
    )
    for r in rows:
        i = int(r["point"])
        if not 0 <= i < n or not r["buckets"]:
            continue
        for name in names:
            series[r["pool_id"]][name][i] = round((r[name] or 0.0) / r["buckets"], 2)
    return series


def pool_summaries(totals: list[dict], coverage: Coverage) -> list[dict]:
    """Per pool: mean capacity (over the recorded buckets), allocated, used and idle GPUs
    (over the period: see :class:`Coverage`)."""
    per: dict[int, dict] = defaultdict(
        lambda: {"capacity": 0.0, "allocated": 0.0, "used": 0.0, "idle": 0.0}
    )
    for row in totals:
        if row["tenant_id"] is not None:
            continue
        p = per[row["pool_id"]]
        p["capacity"] += row["capacity"] or 0.0
        p["allocated"] += row["allocated"] or 0.0
        p["used"] += row["used"] or 0.0
        p["idle"] += row["idle"] or 0.0
    pools = ResourcePool.objects.in_bulk(list(per))
    out = []
    for pid, p in per.items():
        if pid not in pools:
            continue
        mean = {k: _mean(v, coverage.span) for k, v in p.items()}
        mean["capacity"] = _mean(p["capacity"], coverage.recorded)
        mean["pool"] = pools[pid]
        mean["allocated_share"] = mean["allocated"] / mean["capacity"] if mean["capacity"] else None
        mean["used_share"] = mean["used"] / mean["capacity"] if mean["capacity"] else None
        out.append(mean)
    out.sort(key=lambda p: p["capacity"], reverse=True)
    return out


# --- 3. which jobs fail often ---------------------------------------------------------------


def _ended_jobs(scope: Scope, window: Window) -> QuerySet:
    """Jobs that ended in the period in a final state (index ``job_state_finished``)."""
    return scope.filter(
        Job.objects.filter(
            state__in=FINAL_STATES, finished_at__gte=window.start, finished_at__lt=window.end
        )
    )


def failures(scope: Scope, window: Window) -> dict:
    """Failure rates by project and workload type, and the top failing commands and exits,
    from the jobs that ended in the period (rate: FAILED over every final state)."""
    ended = _ended_jobs(scope, window)
    failed_q = Q(state=JobState.FAILED)
    # One read of the ended jobs, grouped by project and type; the two rankings are sums of it.
    groups = ended.values("project_id", "project__slug", "tenant__slug", "workload_type").annotate(
        total=Count("id"), failed=Count("id", filter=failed_q)
    )
    projects: dict[int, dict] = {}
    types: dict[str, dict] = {}
    for g in groups:
        p = projects.setdefault(
            g["project_id"],
            {
                "project_id": g["project_id"],
                "project__slug": g["project__slug"],
                "tenant__slug": g["tenant__slug"],
                "total": 0,
                "failed": 0,
            },
        )
        t = types.setdefault(
            g["workload_type"], {"workload_type": g["workload_type"], "total": 0, "failed": 0}
        )
        for entry in (p, t):
            entry["total"] += g["total"]
            entry["failed"] += g["failed"]
    by_project = sorted(
        projects.values(), key=lambda r: (-r["failed"], -r["total"], r["project__slug"])
    )
    by_type = sorted(types.values(), key=lambda r: (-r["failed"], r["workload_type"]))
    failed = ended.filter(failed_q)
    commands = list(
        failed.values("project_id", "project__slug", "tenant__slug", "command", "exit_code")
        .annotate(n=Count("id"), last=Max("finished_at"), last_id=Max("id"))
        .order_by("-n", "-last")[:TABLE_ROWS]
    )
    exits = list(
        failed.values("exit_code", "exit_signal")
        .annotate(n=Count("id"), projects=Count("project_id", distinct=True))
        .order_by("-n")[:TABLE_ROWS]
    )
    for rows in (by_project, by_type):
        for r in rows:
            r["rate"] = r["failed"] / r["total"] if r["total"] else 0.0
    labels = dict(WorkloadType.choices)
    for r in by_type:
        r["label"] = labels.get(r["workload_type"], r["workload_type"])
    for r in commands:
        command = r["command"]
        r["command_text"] = (
            " ".join(str(c) for c in command) if isinstance(command, list) else str(command)
        )
    return {
        "by_project": by_project,
        "by_type": by_type,
        "commands": commands,
        "exits": exits,
        "ended": sum(r["total"] for r in by_type),
        "failed": sum(r["failed"] for r in by_type),
    }


# --- 4. which GPUs sit idle long ------------------------------------------------------------


def idle_gpus(scope: Scope, now: datetime) -> list[dict]:
    """The GPUs idle now, longest first. A GPU is idle since its last busy sample (or since
    it was first seen idle), but never since before the job that holds it started: a job's
    GPUs cannot have been idle in its hands before it had them. A tenant admin sees the idle
    GPUs their tenants' jobs hold; a platform admin every idle GPU, held or not."""
    qs = GpuActivity.objects.filter(idle_since__isnull=False).select_related(
        "gpu", "gpu__node", "gpu__node__pool"
    )
    if not scope.platform:
        qs = qs.filter(
            gpu__allocations__released_at__isnull=True,
            gpu__allocations__job__tenant_id__in=scope.tenant_ids,
        )
    # When the holding job started (its allocation's grant while it is still launching).
    held_since = Subquery(
        Allocation.objects.filter(gpu_id=OuterRef("gpu_id"), released_at__isnull=True)
        .annotate(start=Coalesce("job__started_at", "granted_at"))
        .order_by("-granted_at")
        .values("start")[:1]
    )
    activities = list(
        qs.annotate(seen=Coalesce("busy_at", "idle_since"), held_since=held_since)
        .annotate(since=Greatest("seen", Coalesce("held_since", "seen")))
        .order_by("since", "gpu_id")[:TABLE_ROWS]
    )
    holders = {
        a.gpu_id: a
        for a in Allocation.objects.filter(
            released_at__isnull=True, gpu_id__in=[a.gpu_id for a in activities]
        ).select_related("job", "job__tenant")
    }
    rows = []
    for a in activities:
        held = holders.get(a.gpu_id)
        rows.append(
            {
                "gpu": a.gpu,
                "since": a.since,
                "idle_seconds": max((now - a.since).total_seconds(), 0.0),
                # No busy sample in the holder's hands (or ever, for a GPU nobody holds).
                "never_busy": a.busy_at is None
                or (a.held_since is not None and a.busy_at < a.held_since),
                "held_since": a.held_since,
                "allocation": held,
                "job_visible": held is not None and scope.covers(held.job.tenant_id),
            }
        )
    return rows


# --- reclaimed and preempted GPU-hours ------------------------------------------------------


def recoveries(scope: Scope, window: Window) -> dict:
    """GPU-hours taken back (reclaim records) by kind and over time, and the preemptions
    started in the period."""
    records = scope.filter(
        ReclaimRecord.objects.filter(created_at__gte=window.start, created_at__lt=window.end)
    )
    by_kind = list(
        records.values("kind")
        .annotate(n=Count("id"), gpu_hours=Sum("gpu_hours_freed"))
        .order_by("-gpu_hours")
    )
    # UTC hours and days, as every other figure of the page (the database would otherwise
    # cut them in TIME_ZONE, a setting of the installation).
    trunc = (
        TruncHour("created_at", tzinfo=UTC)
        if window.period.length <= timedelta(days=1)
        else TruncDate("created_at", tzinfo=UTC)
    )
    over_time = list(
        records.annotate(at=trunc)
        .values("at", "kind")
        .annotate(gpu_hours=Sum("gpu_hours_freed"))
        .order_by("at")
    )
    preemptions = scope.filter(
        JobEvent.objects.filter(
            kind="stop_preempted", created_at__gte=window.start, created_at__lt=window.end
        ),
        "job__tenant_id",
    ).count()
    return {"by_kind": by_kind, "over_time": over_time, "preemptions": preemptions}


# --- 5. which inference capacity is near its limit ------------------------------------------


def inference_capacity(totals: list[dict], buckets: int, guarantees: dict) -> list[dict]:
    """Pools that serve inference (purpose inference, or a queue that accepts it) and the
    tenants' quotas there, ranked by their peak allocation against their limit (capacity
    for a pool, guarantee + borrow limit for a quota)."""
    inference = WorkloadType.INFERENCE.value
    pool_ids = set(
        ResourcePool.objects.filter(purpose=PoolPurpose.INFERENCE).values_list("pk", flat=True)
    )
    for pool_id, types in Queue.objects.values_list("pool_id", "allowed_workload_types"):
        if types and inference in types:
            pool_ids.add(pool_id)
    if not pool_ids:
        return []
    pools = ResourcePool.objects.in_bulk(pool_ids)
    per: dict[tuple[int, int | None], dict] = defaultdict(
        lambda: {"allocated": 0.0, "peak": 0.0, "capacity": 0.0}
    )
    for row in totals:
        if row["pool_id"] not in pool_ids:
            continue
        e = per[(row["pool_id"], row["tenant_id"])]
        e["allocated"] += row["allocated"] or 0.0
        # Peaks of models are summed: an upper bound when the models peak at different times.
        e["peak"] += row["allocated_peak"] or 0.0
        e["capacity"] = max(e["capacity"], row["capacity_peak"] or 0.0)
    tenant_ids = {t for (_, t) in per if t is not None}
    tenants = Tenant.objects.in_bulk(tenant_ids)
    rows = []
    for (pool_id, tenant_id), e in per.items():
        if tenant_id is None:
            limit = e["capacity"]
            tenant = None
        else:
            g = guarantees.get((tenant_id, pool_id), {"guaranteed": 0, "borrow": 0})
            limit = g["guaranteed"] + g["borrow"]
            tenant = tenants.get(tenant_id)
        share = e["peak"] / limit if limit else None
        rows.append(
            {
                "pool": pools[pool_id],
                "tenant": tenant,
                "mean": _mean(e["allocated"], buckets),
                "peak": e["peak"],
                "limit": limit,
                "share": share,
                "near": share is not None and share >= NEAR_CAPACITY,
            }
        )
    rows.sort(key=lambda r: (r["share"] or 0.0, r["peak"]), reverse=True)
    return rows[:TABLE_ROWS]


#: What made a service near capacity (``Service.near_capacity``), as the page names it.
NEAR_CAPACITY_WHY = {"max_replicas": "max replicas", "quota": "quota"}
#: Before any timeline line: the "since" of a service near capacity on every line it kept.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def services_near_capacity_for(user, scope: Scope | None = None) -> list[Service]:
    """The inference services near capacity now (at their max replicas or their tenant's
    quota while the load asks for more; the flag the service tick keeps) the user sees, of
    the tenants of ``scope`` when given, each with ``live_replicas``, ``ready_replicas``,
    ``why_codes`` (what holds it: keys of ``NEAR_CAPACITY_WHY``), ``why`` (their words) and
    ``near_since``: the first line of its timeline in the last
    run of near-capacity lines (``None`` when no line says so: pruned or not yet written).
    One query whatever the number of services."""
    timeline = ScaleDecision.objects.filter(service=OuterRef("pk"))
    last_clear = timeline.exclude(inputs__near_capacity=True).order_by("-at", "-id")
    first_near = timeline.filter(inputs__near_capacity=True, at__gt=OuterRef("clear_at"))
    latest = timeline.order_by("-at", "-id")
    services = (
        with_replica_counts(
            services_near_capacity(user)
            if scope is None
            else scope.filter(services_near_capacity(user))
        )
        .annotate(
            clear_at=Coalesce(
                Subquery(last_clear.values("at")[:1]), Value(_EPOCH, DateTimeField())
            ),
            near_since=Subquery(first_near.order_by("at", "id").values("at")[:1]),
            recommended=Subquery(
                latest.annotate(
                    n=Cast(KeyTextTransform("recommended", "inputs"), FloatField())
                ).values("n")[:1]
            ),
        )
        .order_by("tenant__slug", "project__slug", "name", "id")
    )
    out = list(services)
    for service in out:
        at_quota = service.blocked_reason_code == BlockedReason.AT_QUOTA
        if service.recommended is not None:
            at_max = service.recommended > service.max_replicas
        else:  # no line to read the load's wish from: at max unless the quota holds it
            at_max = not at_quota and service.desired_replicas >= service.max_replicas
        service.why_codes = [w for w, yes in (("max_replicas", at_max), ("quota", at_quota)) if yes]
        service.why = [NEAR_CAPACITY_WHY[w] for w in service.why_codes]
    return out


# --- the page -------------------------------------------------------------------------------


def insights_for(scope: Scope, period: Period, now: datetime | None = None) -> dict:
    """Everything the insights page shows, in a fixed number of queries."""
    window = window_for(period, now)
    now = window.end
    waits = queue_waits(scope, window)
    chart_wait_ids = [r["queue"].pk for r in waits if r["p95"]][:CHART_QUEUES]
    depth_ranked = sorted(waits, key=lambda r: r["depth_mean"], reverse=True)
    chart_depth_ids = [r["queue"].pk for r in depth_ranked if r["depth_mean"]][:CHART_QUEUES]
    series = queue_series(window, list(dict.fromkeys(chart_wait_ids + chart_depth_ids)))
    coverage = bucket_coverage(window)
    buckets = coverage.span
    totals = usage_totals(scope, window)
    pools = pool_summaries(totals, coverage)
    chart_pool_ids = [p["pool"].pk for p in pools][:CHART_POOLS]
    guarantees = guarantees_of(scope)
    return {
        "window": window,
        "now": now,
        "buckets": coverage.recorded,
        "coverage": coverage,
        "queue_waits": waits,
        "wait_chart_queues": [r for r in waits if r["queue"].pk in chart_wait_ids],
        "depth_chart_queues": [r for r in depth_ranked if r["queue"].pk in chart_depth_ids],
        "queue_series": series,
        "pools": pools,
        "pool_series": pool_series(window, chart_pool_ids),
        "teams": team_usage(scope, window, totals, buckets, guarantees),
        "failures": failures(scope, window),
        "idle_gpus": idle_gpus(scope, now),
        "recoveries": recoveries(scope, window),
        "inference": inference_capacity(totals, buckets, guarantees),
    }


# --- the dashboard's glance ------------------------------------------------------------------


#: Queues the dashboard's glance lists: those waiting longest now.
GLANCE_QUEUES = 5


def dashboard_glance(user) -> dict | None:
    """For tenant and platform admins: each pool's GPUs now (busy, idle while held, free,
    unavailable) and the queues waiting longest (theirs), from the metrics summary (five
    queries; not in the polled part)."""
    from scheduling.selectors import queues_visible_to

    from .metrics import metrics_summary

    if not administers_any_tenant(user):
        return None
    platform = is_platform_admin(user)
    queue_ids = None if platform else set(queues_visible_to(user).values_list("id", flat=True))
    summary = metrics_summary(queue_ids=queue_ids)
    pools = []
    for pool in summary["pools"]:
        gpus = pool["gpus"]
        total = gpus["total"] or 1
        busy = gpus["allocated"] - gpus["idle"]
        pools.append(
            {
                **pool,
                "busy": busy,
                "pct_busy": 100 * busy / total,
                "pct_idle": 100 * gpus["idle"] / total,
                "pct_free": 100 * gpus["free"] / total,
                "pct_down": 100 * gpus["unavailable"] / total,
            }
        )
    waiting = sorted(
        (q for q in summary["queues"] if q["depth"]),
        key=lambda q: q["longest_wait_seconds"],
        reverse=True,
    )[:GLANCE_QUEUES]
    return {"pools": pools, "queues": waiting}


# -- recommendations -----------------------------------------------------------------------------


def recommendations_check_access(user) -> None:
    """Platform admins and tenant admins read recommendations; everybody else gets 403."""
    if not administers_any_tenant(user):
        raise PermissionDeniedError("Only platform admins and tenant admins see recommendations.")


def recommendations_visible_to(user) -> QuerySet[Recommendation]:
    """Platform admins: every recommendation; tenant admins: their tenants' (those about a
    pool or a policy, which no tenant owns, are the platform's); others: none."""
    recs = Recommendation.objects.select_related("tenant", "decided_by", "simulation")
    return restrict(recs, user, "admin")


def recommendation_get(user, pk) -> Recommendation:
    """One recommendation: 403 for who reads none, 404 when it is not this user's to see."""
    recommendations_check_access(user)
    rec = recommendations_visible_to(user).filter(pk=pk).first()
    if rec is None:
        raise NotFoundError("Recommendation not found.")
    return rec
