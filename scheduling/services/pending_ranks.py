"""Sort keys for the scheduling order that change only where the order changed.

Each cycle the engine returns the waiting jobs in scheduling order. Stored as positions
(1, 2, 3 …), every job behind one that starts would move up and be rewritten: a drain
would cost the square of the backlog. Stored as sort keys, the keys of jobs whose order
relative to each other did not change can stay: the largest such set is the longest
increasing subsequence of the old keys taken in the new order; only the other jobs (new
ones, and those that moved) get new keys, between their kept neighbours.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

#: Distance between consecutive keys when they are (re)numbered.
SPACING = 1024.0
#: Below this distance between two kept neighbours, new keys would run out of float
#: precision after a few halvings: the whole order is renumbered instead (rare).
MIN_GAP = 1e-6


def ranks_after(order: Sequence[int], old: dict[int, float | None]) -> dict[int, float]:
    """New sort keys for the jobs in ``order`` (scheduling order) given their ``old`` keys
    (None or absent: no key yet); returns only the keys that change."""
    kept = _kept(order, old)
    changed: dict[int, float] = {}
    run: list[int] = []
    previous: float | None = None
    for job_id in order:
        if job_id not in kept:
            run.append(job_id)
            continue
        key = old[job_id]
        assert key is not None
        if run and not _fill(run, previous, key, changed):
            return _renumber(order, old)
        run, previous = [], key
    if run:
        _fill(run, previous, None, changed)
    return changed


def _kept(order: Sequence[int], old: dict[int, float | None]) -> set[int]:
    """The longest run of jobs, in ``order``, whose old keys increase (patience sorting)."""
    tails: list[float] = []  # smallest last key of an increasing run of each length
    tail_ids: list[int] = []
    parent: dict[int, int | None] = {}
    for job_id in order:
        key = old.get(job_id)
        if key is None:
            continue
        at = bisect_left(tails, key)
        parent[job_id] = tail_ids[at - 1] if at else None
        if at == len(tails):
            tails.append(key)
            tail_ids.append(job_id)
        else:
            tails[at], tail_ids[at] = key, job_id
    kept: set[int] = set()
    current: int | None = tail_ids[-1] if tail_ids else None
    while current is not None:
        kept.add(current)
        current = parent[current]
    return kept


def _fill(run: list[int], low: float | None, high: float | None, changed: dict[int, float]) -> bool:
    """Evenly spaced keys for ``run`` strictly between ``low`` and ``high`` (either may be
    open); False when the gap is too narrow."""
    count = len(run)
    if low is None and high is None:
        low, step = 0.0, SPACING
    elif low is None:
        assert high is not None
        low, step = high - SPACING * (count + 1), SPACING
    elif high is None:
        step = SPACING
    else:
        step = (high - low) / (count + 1)
        if step < MIN_GAP:
            return False
    for i, job_id in enumerate(run, start=1):
        changed[job_id] = low + step * i
    return True


def _renumber(order: Sequence[int], old: dict[int, float | None]) -> dict[int, float]:
    new = {job_id: SPACING * (i + 1) for i, job_id in enumerate(order)}
    return {job_id: key for job_id, key in new.items() if old.get(job_id) != key}
