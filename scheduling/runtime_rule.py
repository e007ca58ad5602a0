"""The runtime prediction's rule, without Django: what the dispatch loop's predictions
(:mod:`scheduling.runtime_prediction`, read from ``RuntimeHistory`` rows) and the
simulator's (learnt from the replayed jobs' ends) have in common.

A job's prediction is its declared runtime limit times the :data:`PERCENTILE`-th
percentile of the ``runtime / limit`` ratios of the last :data:`HISTORY_JOBS` comparable
finished jobs (a timed-out one counts 1), given at least :data:`MIN_JOBS` of them; never
above the limit, never below a second. Why: see :mod:`scheduling.runtime_prediction`.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Finished jobs kept per submitter (or project) and workload type, newest first.
HISTORY_JOBS = 20
#: Fewer finished jobs than this: no prediction from them.
MIN_JOBS = 3
#: The percentile of the runtime/limit ratios a prediction uses.
PERCENTILE = 75


def percentile(values: Sequence[float], q: float = PERCENTILE) -> float:
    """The ``q``-th percentile, linear between the two nearest ranks (as numpy's default)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def ratio_statistic(ratios: Sequence[float] | None) -> tuple[float, int] | None:
    """(the ratio a prediction uses, how many jobs it comes from); None under MIN_JOBS."""
    if not ratios or len(ratios) < MIN_JOBS:
        return None
    return percentile(ratios), len(ratios)


def predicted_seconds(declared: float, ratio: float) -> float:
    """The prediction for a job declaring ``declared`` seconds, from the ratio."""
    return max(min(declared * ratio, float(declared)), 1.0)
