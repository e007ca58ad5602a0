"""What the rollups mean, as plain computations: minute and hour buckets, the wait that ended
at an admission and its percentiles, the overlap an allocation bills, UTC days, each tenant's
guarantee per pool and GPU model, and a job's GPU series (merged, summed up). The writer that
stores the rollups (``rollup_write``, ``rollups_backfill``) is ``insights.services.rollups``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta

from django.conf import settings

from scheduling.choices import JobState

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
#: States in which a job's GPUs are charted (an ADMITTED job is still launching).
SERIES_STATES = (JobState.RUNNING, JobState.STOPPING)


def floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def floor_hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def window_cap() -> timedelta:
    """The most one run bills (and the age past which a GPU sample is unknown): three
    intervals, at least three minutes."""
    return timedelta(seconds=3 * max(settings.SLUICE_ROLLUP_INTERVAL, 60))


def stale_after() -> timedelta:
    return window_cap()


def admission_wait(admitted_at: datetime, queued_at: datetime | None, submitted_at) -> float:
    """The wait that ended at an admission (scheduling.waits: the attempt's wait)."""
    return max((admitted_at - (queued_at or submitted_at)).total_seconds(), 0.0)


def percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of sorted values."""
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def wait_figures(waits: list[float]) -> tuple[float | None, float | None, float | None]:
    """(p50, p95, max) of waits in seconds; Nones when there are none."""
    if not waits:
        return None, None, None
    ordered = sorted(waits)
    return percentile(ordered, 0.5), percentile(ordered, 0.95), ordered[-1]


def overlap_seconds(start: datetime, end: datetime | None, lo: datetime, hi: datetime) -> float:
    """Seconds of ``[start, end)`` (end None: open) inside ``[lo, hi)``."""
    right = hi if end is None else min(end, hi)
    return max((right - max(start, lo)).total_seconds(), 0.0)


def day_segments(lo: datetime, hi: datetime) -> list[tuple[date, datetime, datetime]]:
    """``[lo, hi)`` cut at UTC midnights: (day, start, end) pieces."""
    pieces = []
    start = lo
    while start < hi:
        midnight = datetime.combine(start.astimezone(UTC).date(), datetime.min.time(), UTC)
        end = min(midnight + timedelta(days=1), hi)
        pieces.append((midnight.date(), start, end))
        start = end
    return pieces


def guarantees(
    quotas: list[tuple[int, int, str, int]], models: dict[int, dict[str, int]]
) -> dict[tuple[int, str, int], float]:
    """Each tenant's guarantee per (pool, GPU model, tenant).

    A quota for a model is that model's; a quota for any model (blank) is one budget for
    the pool's models the tenant has no quota of its own for (as the engine reads it): it
    is split among them in proportion to their GPUs (all of it when there is one)."""
    out: dict[tuple[int, str, int], float] = {}
    explicit: dict[tuple[int, int], set[str]] = defaultdict(set)
    for tenant_id, pool_id, model, guaranteed in quotas:
        if model:
            explicit[(tenant_id, pool_id)].add(model)
            out[(pool_id, model, tenant_id)] = float(guaranteed)
    for tenant_id, pool_id, model, guaranteed in quotas:
        if model or not guaranteed:
            continue
        shared = {
            m: n
            for m, n in models.get(pool_id, {}).items()
            if m not in explicit[(tenant_id, pool_id)]
        }
        total = sum(shared.values())
        for m, n in shared.items():
            share = guaranteed * n / total if total else guaranteed / len(shared)
            out[(pool_id, m, tenant_id)] = out.get((pool_id, m, tenant_id), 0.0) + share
    return out


def series_merge(points: list) -> list:
    """Neighbours merged two by two: the first one's time, the mean of each GPU's values
    (of those known; null when neither is)."""
    merged = []
    for i in range(0, len(points), 2):
        pair = points[i : i + 2]
        merged.append(
            [
                pair[0][0],
                _mean_columns([p[1] for p in pair]),
                _mean_columns([p[2] for p in pair]),
            ]
        )
    return merged


def _mean_columns(rows: list[list]) -> list:
    width = max(len(r) for r in rows)
    out = []
    for i in range(width):
        known = [r[i] for r in rows if i < len(r) and r[i] is not None]
        out.append(round(sum(known) / len(known), 1) if known else None)
    return out


def series_utilization(points: list) -> tuple[float, float] | None:
    """(mean utilization %, share of the samples known) of a job's series points; ``None``
    when it holds no known sample."""
    known = total = 0
    summed = 0.0
    for point in points or ():
        for value in point[1] or ():
            total += 1
            if value is not None:
                known += 1
                summed += float(value)
    if not known:
        return None
    return summed / known, known / total


def hour_spread(start: datetime, end: datetime, lo: datetime, hi: datetime):
    """(hour, seconds) of ``[start, end)`` inside ``[lo, hi)``, hour by hour."""
    start, end = max(start, lo), min(end, hi)
    hour = floor_hour(start)
    while hour < end:
        seconds = (min(end, hour + HOUR) - max(start, hour)).total_seconds()
        if seconds > 0:
            yield hour, seconds
        hour += HOUR
