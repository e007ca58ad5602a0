"""A timeline of interchangeable units (quota GPUs, running-job slots) over one cycle.

The engine plans the future pessimistically and simply, the way ``squeue --start`` does:
every unit has a time from which it is free *for good* (no idle gaps in the future are
reused), except for gaps that start now ("holes"): a unit that is free now but reserved
for a job that starts later may be lent to a job that ends before that start.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from typing import Final

INF: Final = math.inf


class UnitTimeline:
    """Units of one budget (e.g. a tenant's GPUs under one quota) as seen at ``now``.

    ``used`` counts units busy now or promised to a reserved job; ``releases`` holds, sorted,
    the time each of those units is free for good; ``holes`` holds, sorted, the start time
    of the reservation of each promised unit that is still idle now. ``pencilled`` counts
    idle units counted on by estimates only: later estimates see them taken, but they
    do not stop anybody from starting now.
    """

    __slots__ = ("now", "used", "pencilled", "releases", "holes")

    def __init__(self, now: float, releases: list[float]) -> None:
        self.now = now
        self.used = len(releases)
        self.pencilled = 0
        self.releases = sorted(releases)
        self.holes: list[float] = []

    def free_now(self, cap: int, end: float) -> int:
        """Units a job ending at ``end`` may take now without delaying any reservation."""
        usable_holes = len(self.holes) - bisect_left(self.holes, end) if self.holes else 0
        return cap - self.used + usable_holes

    def take_now(self, count: int, end: float) -> None:
        """Start a job of ``count`` units now until ``end`` (``free_now`` was checked)."""
        holes = self.holes
        if holes:
            # Fill the shortest holes that are long enough first: they are the least
            # useful to anyone else.
            first = bisect_left(holes, end)
            taken = min(count, len(holes) - first)
            del holes[first : first + taken]
            count -= taken
        if count > 0:
            self.used += count
            _insert(self.releases, end, count)

    def earliest(self, count: int, cap: int) -> float:
        """Earliest time at which ``count`` units fit under ``cap`` (INF if never)."""
        need = count - (cap - self.used - self.pencilled)
        if need <= 0:
            return self.now
        if need > len(self.releases):
            return INF
        return self.releases[need - 1]

    def move(self, count: int, old: float, new: float) -> None:
        """Units of a job that was to free them at ``old`` are freed at ``new`` instead
        (the job is being stopped). Units a reservation already took over stay with it."""
        releases = self.releases
        first = bisect_left(releases, old)
        moved = min(count, bisect_right(releases, old) - first)
        if moved > 0:
            del releases[first : first + moved]
            _insert(releases, new, moved)

    def copy(self) -> UnitTimeline:
        """An independent copy (to try a change without making it)."""
        twin = UnitTimeline(self.now, [])
        twin.now = self.now
        twin.used = self.used
        twin.pencilled = self.pencilled
        twin.releases = list(self.releases)
        twin.holes = list(self.holes)
        return twin

    def reserve(self, count: int, start: float, end: float, hold_now: bool = True) -> None:
        """Promise ``count`` units from ``start`` (>= ``earliest``) until ``end``.

        The units released last before ``start`` are taken first, so that units free now
        stay free now; units that must come from the free pool become holes until start.
        With ``hold_now=False`` (an estimate, not a reservation) those are only pencilled.
        """
        releases = self.releases
        upto = bisect_right(releases, start)
        reused = min(count, upto)
        del releases[upto - reused : upto]
        fresh = count - reused
        if fresh > 0 and not hold_now:
            self.pencilled += fresh
        elif fresh > 0:
            self.used += fresh
            if start > self.now:
                _insert(self.holes, start, fresh)
        _insert(releases, end, count)


def _insert(ordered: list[float], value: float, count: int) -> None:
    """Insert ``count`` copies of ``value`` into the sorted list ``ordered``."""
    if count == 1:
        insort(ordered, value)
    else:
        at = bisect_right(ordered, value)
        ordered[at:at] = [value] * count
