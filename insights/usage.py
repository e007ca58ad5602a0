"""Usage accounting (chargeback): GPU-hours allocated and used, read from ``UsageDay``,
grouped and filtered as asked, against the tenants' guarantees. Always scoped to the user.

Who sees what: platform admins every tenant; any member of a tenant (admin, member or
viewer) the whole tenant's usage, every project and user in it. Inside a team usage is not
secret: the same people already see all of the tenant's jobs (``jobs_visible_to``), from
which the hours follow; chargeback is per team, and a member who wants only their own
hours filters by user. Another tenant's rows never appear, whatever the filters.

The guarantee of a row is the GPU-hours the tenant was guaranteed over the hours of the
range (of the day, for rows grouped by day): each hour billed against the quota in force
then, from the quota history (``scheduling.models.QuotaChange``: a change made today does
not rewrite the days before it), summed over the quotas that match the row: its tenant
(all tenants in scope when the rows are not grouped by tenant), its pool and GPU model when
grouped so. Hours stop at the present: today counts the hours gone so far, a future day
none. A quota with no history (written before the history existed, or directly) counts as
in force since the epoch. A quota for "any model" (blank ``gpu_model``) matches no model
row: grouped by GPU model it shows on a row of its own, model "any".

The cost does not follow the data: a report is one aggregate query (the database sums the
rows), one for the totals and one for the quotas, whatever the range or the number of rows.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from django.db.models import QuerySet, Sum
from django.utils import timezone

from scheduling.models import Quota, QuotaChange
from tenants.scoping import restrict

from .models import UsageDay

#: Dimensions a report may be grouped by, in the order of the columns.
GROUP_BY_CHOICES = ("day", "tenant", "project", "user", "workload_type", "pool", "gpu_model")
DEFAULT_GROUP_BY = ("tenant",)
DEFAULT_DAYS = 30
#: The longest range one report covers (three years of days).
MAX_RANGE_DAYS = 1096
#: The days a report may name: the hours of a day past the last one, or a default start
#: before the first, would leave the dates Python can represent (a 500, not a 400).
EARLIEST_DAY = dt.date(1970, 1, 1)
LATEST_DAY = dt.date(9998, 12, 31)
ANY_MODEL = "any"

# Each dimension: the UsageDay value it reads.
_SOURCE = {
    "day": "day",
    "tenant": "tenant__slug",
    "project": "project__slug",
    "user": "user__username",
    "workload_type": "workload_type",
    "pool": "pool__name",
    "gpu_model": "gpu_model",
}
# Dimensions a quota has: rows grouped only by these show their guarantees even unused.
_QUOTA_DIMENSIONS = {"tenant", "pool", "gpu_model"}


@dataclass(frozen=True)
class UsageQuery:
    """What a report covers: days ``start`` to ``end`` (UTC, both included), grouped by
    ``group_by`` (canonical order), filtered by tenant slugs, project ids, pool names and
    user names (empty: no filter)."""

    start: dt.date
    end: dt.date
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    tenants: tuple[str, ...] = ()
    projects: tuple[int, ...] = ()
    pools: tuple[str, ...] = ()
    users: tuple[str, ...] = ()

    @property
    def days(self) -> int:
        return (self.end - self.start).days + 1


@dataclass
class UsageReport:
    query: UsageQuery
    columns: tuple[str, ...]
    rows: list[dict] = field(default_factory=list)
    totals: dict = field(default_factory=dict)
    hours: float = 0.0
    guarantees: list[dict] = field(default_factory=list)

    def guaranteed_by_day(self) -> list[float]:
        """The GPU-hours guaranteed on each day of the range (whole days), as in force then."""
        out = []
        for i in range(self.query.days):
            lo = _midnight(self.query.start + dt.timedelta(days=i))
            hi = lo + dt.timedelta(days=1)
            out.append(round(sum(guaranteed_gpu_hours(g, lo, hi) for g in self.guarantees), 3))
        return out


# --- input ------------------------------------------------------------------------------------


def default_range(today: dt.date | None = None) -> tuple[dt.date, dt.date]:
    """The last 30 days, today included."""
    today = today or timezone.now().date()
    return default_start(today), today


def default_start(end: dt.date) -> dt.date:
    """The start of a range that names only its end: 30 days, today included, never before
    EARLIEST_DAY."""
    if end <= EARLIEST_DAY + dt.timedelta(days=DEFAULT_DAYS - 1):
        return EARLIEST_DAY
    return end - dt.timedelta(days=DEFAULT_DAYS - 1)


def range_errors(start: dt.date | None, end: dt.date | None) -> dict[str, list[str]]:
    """Field messages for a range that is backwards, too long or outside the days a report
    may name (empty: fine)."""
    if start is None or end is None:
        return {}
    outside = f"Pick a day from {EARLIEST_DAY:%Y-%m-%d} to {LATEST_DAY:%Y-%m-%d}."
    errors = {
        name: [outside]
        for name, day in (("start", start), ("end", end))
        if not EARLIEST_DAY <= day <= LATEST_DAY
    }
    if errors:
        return errors
    if end < start:
        return {"end": ["The end must be on or after the start."]}
    if (end - start).days + 1 > MAX_RANGE_DAYS:
        return {"end": [f"At most {MAX_RANGE_DAYS} days in one report."]}
    return {}


def split_values(values: Iterable[str]) -> list[str]:
    """``["tenant,day", "pool"]`` → ``["tenant", "day", "pool"]`` (repeated or comma-separated)."""
    out: list[str] = []
    for value in values:
        out.extend(part.strip() for part in str(value).split(",") if part.strip())
    return out


def group_by_errors(values: Iterable[str]) -> dict[str, list[str]]:
    unknown = [v for v in values if v not in GROUP_BY_CHOICES]
    if not unknown:
        return {}
    allowed = ", ".join(GROUP_BY_CHOICES)
    return {
        "group_by": [f"Unknown: {', '.join(sorted(set(unknown)))[:200]}. Use any of {allowed}."]
    }


def canonical_group_by(values: Iterable[str]) -> tuple[str, ...]:
    """Known dimensions in column order; a project names its tenant, so ``project`` brings
    ``tenant`` along (the rows are the same, the column says whose project it is)."""
    chosen = set(values)
    if "project" in chosen:
        chosen.add("tenant")
    return tuple(d for d in GROUP_BY_CHOICES if d in chosen)


# --- scope ------------------------------------------------------------------------------------


def usage_days_visible_to(user) -> QuerySet[UsageDay]:
    """Every UsageDay row the user may read (see the module's docstring)."""
    return restrict(UsageDay.objects.all(), user)


def _quotas_visible_to(user) -> QuerySet[Quota]:
    return restrict(Quota.objects.all(), user)


def _filtered(user, query: UsageQuery) -> QuerySet[UsageDay]:
    qs = usage_days_visible_to(user).filter(day__gte=query.start, day__lte=query.end)
    if query.tenants:
        qs = qs.filter(tenant__slug__in=query.tenants)
    if query.projects:
        qs = qs.filter(project_id__in=query.projects)
    if query.pools:
        qs = qs.filter(pool__name__in=query.pools)
    if query.users:
        qs = qs.filter(user__username__in=query.users)
    return qs


def _quota_changes_visible_to(user) -> QuerySet[QuotaChange]:
    return restrict(QuotaChange.objects.all(), user)


def _filtered_quotas(user, query: UsageQuery, qs: QuerySet | None = None) -> QuerySet:
    qs = _quotas_visible_to(user) if qs is None else qs
    if query.tenants:
        qs = qs.filter(tenant__slug__in=query.tenants)
    if query.projects:
        qs = qs.filter(tenant__projects__id__in=query.projects).distinct()
    if query.pools:
        qs = qs.filter(pool__name__in=query.pools)
    return qs


# --- hours ------------------------------------------------------------------------------------


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time.min, tzinfo=dt.UTC)


def hours_between(start: dt.date, end: dt.date, now: dt.datetime) -> float:
    """Hours from ``start`` 00:00 UTC to the end of ``end``, stopping at ``now``."""
    begin = _midnight(start)
    stop = min(_midnight(end) + dt.timedelta(days=1), now)
    return max((stop - begin).total_seconds() / 3600.0, 0.0)


# --- the report -------------------------------------------------------------------------------


def usage_report(user, query: UsageQuery, *, now: dt.datetime | None = None) -> UsageReport:
    """The rows (all of them, in memory: see ``usage_rows_iter`` for a stream), the totals
    and the range's hours."""
    now = now or timezone.now()
    guarantees = guarantees_for(user, query)
    rows = list(usage_rows_iter(user, query, guarantees=guarantees, now=now))
    return UsageReport(
        query=query,
        columns=canonical_group_by(query.group_by),
        rows=rows,
        totals=usage_totals(user, query, guarantees=guarantees, now=now),
        hours=round(hours_between(query.start, query.end, now), 3),
        guarantees=guarantees,
    )


def usage_rows_iter(
    user, query: UsageQuery, *, guarantees: list[dict] | None = None, now: dt.datetime | None = None
) -> Iterator[dict]:
    """The report's rows, read in chunks from one aggregate query (flat memory, for CSV)."""
    now = now or timezone.now()
    group_by = canonical_group_by(query.group_by)
    if guarantees is None:
        guarantees = guarantees_for(user, query)
    if not group_by:
        yield usage_totals(user, query, guarantees=guarantees, now=now)
        return
    sources = [_SOURCE[d] for d in group_by]
    qs = (
        _filtered(user, query)
        .values(*sources)
        .annotate(
            allocated=Sum("allocated_gpu_hours"),
            used=Sum("used_gpu_hours"),
            sampled=Sum("sampled_gpu_hours"),
        )
        .order_by(*sources)
    )
    keys = (
        (tuple(r[s] for s in sources), r["allocated"], (r["used"], r["sampled"]))
        for r in qs.iterator(2000)
    )
    if set(group_by) <= _QUOTA_DIMENSIONS:
        # Few rows (at most one per quota and model used): merge in the unused guarantees.
        keys = iter(_with_unused_guarantees(list(keys), group_by, guarantees))
    # A row's guarantee: the quotas matching its tenant, pool and model, as far as grouped
    # (a project's or a user's row is measured against its tenant's guarantee).
    dims = tuple(d for d in group_by if d in _QUOTA_DIMENSIONS)
    by_key: dict[tuple, list[dict]] = defaultdict(list)
    for g in guarantees:
        by_key[tuple(g[d] for d in dims)].append(g)
    range_bounds = _range_bounds(query.start, query.end, now)
    guaranteed: dict[tuple, float] = {}  # (key, day or None): GPU-hours
    for values, allocated, (used, sampled) in keys:
        named = dict(zip(group_by, values, strict=True))
        key = tuple(named[d] for d in dims)
        day = named.get("day")
        if (key, day) not in guaranteed:
            lo, hi = range_bounds if day is None else _range_bounds(day, day, now)
            guaranteed[key, day] = sum(guaranteed_gpu_hours(g, lo, hi) for g in by_key.get(key, ()))
        if day is not None:
            named["day"] = day.isoformat()
        yield _row(named, allocated or 0.0, used or 0.0, guaranteed[key, day], sampled or 0.0)


def usage_totals(
    user, query: UsageQuery, *, guarantees: list[dict] | None = None, now: dt.datetime | None = None
) -> dict:
    """Everything the filters select, summed (one query), against every matching guarantee."""
    now = now or timezone.now()
    if guarantees is None:
        guarantees = guarantees_for(user, query)
    sums = _filtered(user, query).aggregate(
        allocated=Sum("allocated_gpu_hours"),
        used=Sum("used_gpu_hours"),
        sampled=Sum("sampled_gpu_hours"),
    )
    lo, hi = _range_bounds(query.start, query.end, now)
    guaranteed = sum(guaranteed_gpu_hours(g, lo, hi) for g in guarantees)
    return _row(
        {}, sums["allocated"] or 0.0, sums["used"] or 0.0, guaranteed, sums["sampled"] or 0.0
    )


def usage_by_day(user, query: UsageQuery) -> list[dict]:
    """Allocated and used GPU-hours of each day of the range (days without usage: 0), for
    the page's chart."""
    sums = {
        r["day"]: r
        for r in _filtered(user, query)
        .values("day")
        .annotate(allocated=Sum("allocated_gpu_hours"), used=Sum("used_gpu_hours"))
        .order_by("day")
    }
    days = [query.start + dt.timedelta(days=i) for i in range(query.days)]
    return [
        {
            "day": day,
            "allocated": round((sums.get(day) or {}).get("allocated") or 0.0, 3),
            "used": round((sums.get(day) or {}).get("used") or 0.0, 3),
        }
        for day in days
    ]


_NEVER = dt.datetime.max.replace(tzinfo=dt.UTC)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def guarantees_for(user, query: UsageQuery) -> list[dict]:
    """The quotas that guaranteed GPUs at some time of the range, matching the filters:
    tenant, pool, GPU model ("any" for blank), ``gpus`` (the last value in force) and
    ``periods``: ``(from, until, GPUs)`` in force, from the quota history; a quota without
    history: its present value since the epoch."""
    fields = ("tenant__slug", "pool__name", "gpu_model")
    timelines: dict[tuple, list[list]] = {}
    for tenant, pool, model, gpus, since in (
        _filtered_quotas(user, query, _quota_changes_visible_to(user))
        .values_list(*fields, "guaranteed_gpus", "effective_from")
        .order_by(*fields, "effective_from", "id")
    ):
        periods = timelines.setdefault((tenant, pool, model), [])
        if periods and periods[-1][0] == since:
            periods[-1][2] = gpus  # two changes at the same moment: the later one holds
            continue
        if periods:
            periods[-1][1] = since
        periods.append([since, _NEVER, gpus])
    for tenant, pool, model, gpus in _filtered_quotas(user, query).values_list(
        *fields, "guaranteed_gpus"
    ):
        timelines.setdefault((tenant, pool, model), [[_EPOCH, _NEVER, gpus]])
    lo, hi = _midnight(query.start), _midnight(query.end) + dt.timedelta(days=1)
    out = []
    for (tenant, pool, model), periods in sorted(timelines.items()):
        if not any(gpus > 0 and since < hi and until > lo for since, until, gpus in periods):
            continue
        out.append(
            {
                "tenant": tenant,
                "pool": pool,
                "gpu_model": model or ANY_MODEL,
                "gpus": periods[-1][2],
                "periods": [tuple(p) for p in periods],
            }
        )
    return out


def guaranteed_gpu_hours(guarantee: dict, lo: dt.datetime, hi: dt.datetime) -> float:
    """The GPU-hours ``guarantee`` (one of :func:`guarantees_for`) guaranteed from ``lo`` to
    ``hi``: each hour at the GPUs in force then."""
    total = 0.0
    for since, until, gpus in guarantee["periods"]:
        seconds = (min(until, hi) - max(since, lo)).total_seconds()
        if gpus and seconds > 0:
            total += gpus * seconds / 3600.0
    return total


def _range_bounds(
    start: dt.date, end: dt.date, now: dt.datetime
) -> tuple[dt.datetime, dt.datetime]:
    """``start`` 00:00 UTC to the end of ``end``, stopping at ``now`` (see hours_between)."""
    begin = _midnight(start)
    return begin, max(min(_midnight(end) + dt.timedelta(days=1), now), begin)


def _with_unused_guarantees(
    keys: list[tuple], group_by: tuple[str, ...], guarantees: list[dict]
) -> list[tuple]:
    if not group_by:
        return keys
    seen = {values for values, _, _ in keys}
    for g in guarantees:
        values = tuple(g[d] for d in group_by)
        if values not in seen:
            seen.add(values)
            keys.append((values, 0.0, (0.0, 0.0)))
    return sorted(keys, key=lambda k: tuple("" if v is None else str(v) for v in k[0]))


#: ``utilization_note`` of a row whose utilization is not a number.
NO_SAMPLES = "no samples"
NOTHING_ALLOCATED = "nothing allocated"


def _row(
    named: dict, allocated: float, used: float, guaranteed: float, sampled: float = 0.0
) -> dict:
    # GPU-hours held without a single utilization sample say nothing about use: "no
    # samples", not 0 % (GPU-hours used with no sampled hours recorded: rows written before
    # the samples were counted, which had them).
    known = sampled > 0 or used > 0
    note = NOTHING_ALLOCATED if allocated <= 0 else (None if known else NO_SAMPLES)
    return {
        **named,
        "allocated_gpu_hours": round(allocated, 3),
        "used_gpu_hours": round(used, 3),
        "sampled_gpu_hours": round(sampled, 3),
        "utilization_pct": _pct(used, allocated) if known else None,
        "utilization_note": note,
        "guaranteed_gpu_hours": round(guaranteed, 3),
        "guarantee_allocated_pct": _pct(allocated, guaranteed),
        "guarantee_used_pct": _pct(used, guaranteed),
    }


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 1) if whole > 0 else None


#: Columns of a report after its group columns, in the CSV's order.
FIGURE_COLUMNS = (
    "allocated_gpu_hours",
    "used_gpu_hours",
    "utilization_pct",
    "guaranteed_gpu_hours",
    "guarantee_allocated_pct",
    "guarantee_used_pct",
    # Added later, at the end: a CSV read by position keeps its columns.
    "sampled_gpu_hours",
    "utilization_note",
)
