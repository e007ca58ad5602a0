"""Reference schedulers: how far a kind of scheduler gets on a scenario, for scale.

None of these is Sluice's engine or a policy a platform team could pick. Each knows every
job's real runtime (Sluice knows only the declared limit and what it learnt from finished
jobs), ignores tenants, quotas and fair share, starts a job the moment a dispatch tick
finds it room (no reservations, so nothing keeps a big job from starving) and, where it
preempts, stops a job at once, without a grace period. Each is one strong heuristic of its
kind, not an optimum (greedy list scheduling with multi-GPU jobs is not optimal for the
average wait). They answer a question about a target such as "the average wait 10x below
FIFO's": how near does a scheduler of this kind, freed of what Sluice does not know and
of the rules it keeps, get on these jobs and this cluster, and at what cost to big jobs
and to lost work?

- ``sjf``: non-preemptive; the waiting jobs, smallest GPU-time (GPUs x runtime) first,
  start wherever they fit on the nodes as they are (best fit: a node with the fewest GPUs
  free that still fit). The order Sluice's size key approximates (``log2(GPUs) +
  log2(runtime)`` inside a class and fair-share band), with the true runtimes.
- ``sjf-classes``: the same, a higher priority class first.
- ``srtf``: preemptive shortest-remaining-GPU-time first, the kind of scheduler the
  literature's 10-50x come from (Tiresias, SRTF on Philly-like traces): at every tick the
  running and the waiting jobs are laid out again, in that order, as if any job could move
  to any node for free; a running job left out is stopped and loses nothing. Not a
  schedule one could run.
- ``srtf-limited``: ``srtf`` with costs and limits like Sluice's defaults: a higher class
  first, a job runs 5 minutes before it may be stopped and is stopped at most 3 times (a
  job it may not stop stays on its nodes, the others are laid out around it), and a stop
  loses the work since the job's last checkpoint (every 30 minutes of a run).

A job's work is its trace duration cut at its declared limit (the replay kills each run at
the limit; here the limit caps the job's total work, and work lost at a stop is done
again). Waits count every re-wait after a stop, as
:func:`scheduling.simulator.metrics.summarize` does. The dispatch tick is the replay's
(5 s): arrivals and ends are acted on at the next multiple of it.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass
from itertools import islice

from .metrics import BIG_JOB_GPUS, DAY
from .model import Scenario, SimJob


@dataclass(frozen=True, slots=True)
class Reference:
    """One reference scheduler (see the module docstring for what each assumes)."""

    name: str
    description: str
    preemptive: bool
    classes: bool
    max_preemptions: int = 0  # 0: no limit
    min_runtime_seconds: float = 0.0
    checkpoint_seconds: float | None = None  # None: a stop loses nothing


REFERENCES: dict[str, Reference] = {
    ref.name: ref
    for ref in (
        Reference(
            "sjf",
            "non-preemptive, smallest real GPU-time first, best fit, no reservations, "
            "no classes or quotas",
            preemptive=False,
            classes=False,
        ),
        Reference(
            "sjf-classes",
            "sjf with a higher priority class first",
            preemptive=False,
            classes=True,
        ),
        Reference(
            "srtf",
            "preemptive shortest remaining real GPU-time first, GPUs laid out afresh at "
            "every tick (free migration), stops cost nothing, no classes or quotas",
            preemptive=True,
            classes=False,
        ),
        Reference(
            "srtf-limited",
            "srtf with a higher class first, 5 min before a job may be stopped, at most 3 "
            "stops per job, work since the last 30 min checkpoint lost",
            preemptive=True,
            classes=True,
            max_preemptions=3,
            min_runtime_seconds=300.0,
            checkpoint_seconds=1800.0,
        ),
    )
}


@dataclass(frozen=True, slots=True)
class ReferenceResult:
    """What a reference scheduler gave on a scenario (waits in seconds)."""

    reference: Reference
    jobs: int
    wait_avg_s: float  # re-waits after a stop counted
    wait_first_avg_s: float
    wait_big_avg_s: float  # jobs over 8 GPUs
    wait_max_s: float
    big_waited_over_day: int
    preemptions: int
    max_preemptions: int
    lost_share: float  # GPU-time lost at stops over the GPU-time jobs held
    wall_seconds: float


def parse_references(text: str) -> list[Reference]:
    """References from a comma-separated list of names; raises ValueError on an unknown one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in REFERENCES]
    if unknown:
        raise ValueError(f"unknown reference {', '.join(unknown)} (known: {', '.join(REFERENCES)})")
    return [REFERENCES[name] for name in dict.fromkeys(names)]


def run_reference(scenario: Scenario, reference: Reference, tick: float = 5.0) -> ReferenceResult:
    """Replay ``scenario`` under ``reference``; see the module docstring. Raises
    ValueError for a scenario of several pools or GPU models, or a job no node set fits."""
    began = time.perf_counter()
    runner = _Preemptive if reference.preemptive else _Greedy
    run = runner(scenario, reference, tick)
    run.loop()
    return run.result(time.perf_counter() - began)


class _Nodes:
    """Free GPUs per node, with the nodes grouped by how many they have free (best fit)."""

    def __init__(self, sizes: list[int]) -> None:
        self.free = list(sizes)
        self.idle = sum(sizes)
        self.largest = max(sizes, default=0)
        self.by_free: list[set[int]] = [set() for _ in range(self.largest + 1)]
        for node, size in enumerate(sizes):
            self.by_free[size].add(node)

    def find(self, per_node: int, nodes: int) -> list[int] | None:
        """``nodes`` nodes with ``per_node`` GPUs free each, those with the fewest free
        first; None if there are not that many."""
        chosen: list[int] = []
        for free in range(per_node, self.largest + 1):
            group = self.by_free[free]
            if group:
                chosen.extend(islice(group, nodes - len(chosen)))
                if len(chosen) == nodes:
                    return chosen
        return None

    def place(self, per_node: int, nodes: int) -> list[int] | None:
        """Take ``per_node`` GPUs on each of ``nodes`` nodes found by :meth:`find`; the
        nodes, or None (nothing taken) if they are not there."""
        if per_node * nodes > self.idle:
            return None
        found = self.find(per_node, nodes)
        if found is not None:
            for node in found:
                self.take(node, per_node)
        return found

    def take(self, node: int, gpus: int) -> None:
        """``gpus`` GPUs of ``node`` are taken (``-gpus``: given back)."""
        self.by_free[self.free[node]].discard(node)
        self.free[node] -= gpus
        self.idle -= gpus
        self.by_free[self.free[node]].add(node)


class _Run:
    """One replay under a reference: the jobs' state in lists indexed like the jobs sorted
    by submit time, and the event loop; the subclasses decide at each tick."""

    def __init__(self, scenario: Scenario, reference: Reference, tick: float) -> None:
        if len({node.pool for node in scenario.nodes}) != 1 or (
            len({node.model for node in scenario.nodes}) != 1
        ):
            raise ValueError(
                "reference schedulers take a scenario of one pool and one GPU model "
                "(bench/simulate.py --one-pool or --deep)"
            )
        self.reference = reference
        self.tick = tick
        self.sizes = [node.gpus for node in scenario.nodes]
        self.jobs: list[SimJob] = sorted(scenario.jobs, key=lambda job: (job.submit, job.id))
        for job in self.jobs:
            if sum(1 for size in self.sizes if size >= job.gpus_per_node) < job.nodes:
                raise ValueError(f"job {job.name} needs more nodes than the scenario has")
        # A higher class ranks first (a lower rank); a class the scenario does not name, last.
        values = {name: spec.value for name, spec in scenario.classes.items()}
        lowest = min(values.values(), default=0) - 1
        self.rank = [-values.get(job.priority_class, lowest) for job in self.jobs]
        self.work = [
            float(min(job.duration, job.limit) if job.limit > 0 else job.duration)
            for job in self.jobs
        ]
        self.remaining = list(self.work)
        self.gpus = [job.gpus for job in self.jobs]
        count = len(self.jobs)
        self.waited = [0.0] * count
        self.first_wait: list[float | None] = [None] * count
        self.waiting_since = [job.submit for job in self.jobs]
        self.started = [0.0] * count
        self.end = [0.0] * count
        self.stops = [0] * count
        self.placed: dict[int, list[int]] = {}  # running job -> its nodes
        self.waiting: list[int] = []
        self.lost_gpu_seconds = 0.0
        self._ends: list[tuple[float, int, int]] = []  # (end, stops then, job)
        self._wakes: list[float] = []
        self._arrived = 0

    def loop(self) -> None:
        """Every event (arrival, end, wake-up), acted on at the next tick."""
        jobs, ends, wakes = self.jobs, self._ends, self._wakes
        while self._arrived < len(jobs) or ends:
            upcoming = min(
                jobs[self._arrived].submit if self._arrived < len(jobs) else math.inf,
                ends[0][0] if ends else math.inf,
                wakes[0] if wakes else math.inf,
            )
            now = math.ceil(upcoming / self.tick) * self.tick if self.tick > 0 else upcoming
            while wakes and wakes[0] <= now:
                heapq.heappop(wakes)
            while ends and ends[0][0] <= now:
                _, stops, index = heapq.heappop(ends)
                if index in self.placed and stops == self.stops[index]:
                    self.ended(index)
            while self._arrived < len(jobs) and jobs[self._arrived].submit <= now:
                self.waiting.append(self._arrived)
                self._arrived += 1
            if self.waiting:
                self.dispatch(now)

    def dispatch(self, now: float) -> None:
        """Start (and, where the reference preempts, stop) jobs at tick ``now``."""
        raise NotImplementedError

    def ended(self, index: int) -> None:
        """Job ``index`` ended: its GPUs are free."""
        del self.placed[index]

    def start(self, index: int, now: float, nodes: list[int]) -> None:
        """``index`` starts (or starts again) at ``now`` on ``nodes``."""
        self.waited[index] += now - self.waiting_since[index]
        if self.first_wait[index] is None:
            self.first_wait[index] = self.waited[index]
        self.started[index] = now
        self.end[index] = now + self.remaining[index]
        self.placed[index] = nodes
        heapq.heappush(self._ends, (self.end[index], self.stops[index], index))
        if self.reference.min_runtime_seconds > 0:
            heapq.heappush(self._wakes, now + self.reference.min_runtime_seconds)

    def stop(self, index: int, now: float) -> None:
        """``index`` is stopped at ``now``: it keeps the work up to its last checkpoint
        and waits again."""
        elapsed = now - self.started[index]
        interval = self.reference.checkpoint_seconds
        kept = elapsed if interval is None else elapsed // interval * interval
        self.remaining[index] -= kept
        self.lost_gpu_seconds += (elapsed - kept) * self.gpus[index]
        self.stops[index] += 1
        self.waiting_since[index] = now
        del self.placed[index]
        self.waiting.append(index)

    def result(self, wall: float) -> ReferenceResult:
        """The figures of the run."""
        count = len(self.jobs)
        big = [i for i in range(count) if self.gpus[i] > BIG_JOB_GPUS]
        held = sum(self.work[i] * self.gpus[i] for i in range(count)) + self.lost_gpu_seconds
        first = [wait for wait in self.first_wait if wait is not None]
        return ReferenceResult(
            reference=self.reference,
            jobs=count,
            wait_avg_s=sum(self.waited) / count if count else 0.0,
            wait_first_avg_s=sum(first) / len(first) if first else 0.0,
            wait_big_avg_s=sum(self.waited[i] for i in big) / len(big) if big else 0.0,
            wait_max_s=max(self.waited, default=0.0),
            big_waited_over_day=sum(1 for i in big if self.waited[i] > DAY),
            preemptions=sum(self.stops),
            max_preemptions=max(self.stops, default=0),
            lost_share=self.lost_gpu_seconds / held if held else 0.0,
            wall_seconds=wall,
        )


class _Greedy(_Run):
    """Non-preemptive: at each tick the waiting jobs, in order, start where they fit."""

    def __init__(self, scenario: Scenario, reference: Reference, tick: float) -> None:
        super().__init__(scenario, reference, tick)
        self.nodes = _Nodes(self.sizes)

    def ended(self, index: int) -> None:
        for node in self.placed[index]:
            self.nodes.take(node, -self.jobs[index].gpus_per_node)
        super().ended(index)

    def dispatch(self, now: float) -> None:
        classes = self.reference.classes
        self.waiting.sort(
            key=lambda i: (self.rank[i] if classes else 0, self.work[i] * self.gpus[i], i)
        )
        still: list[int] = []
        for index in self.waiting:
            job = self.jobs[index]
            found = self.nodes.place(job.gpus_per_node, job.nodes)
            if found is None:
                still.append(index)
            else:
                self.start(index, now, found)
        self.waiting = still


class _Preemptive(_Run):
    """Preemptive, free migration: at each tick where a job waits, the running jobs that
    may not be stopped stay where they are and every other job, running or waiting, is
    laid out afresh around them by class (where the reference has them) and remaining
    GPU-time; running jobs left out stop."""

    def dispatch(self, now: float) -> None:
        nodes = _Nodes(self.sizes)
        movable: list[int] = []
        for index, where in self.placed.items():
            if self._protected(index, now):
                for node in where:
                    nodes.take(node, self.jobs[index].gpus_per_node)
            else:
                movable.append(index)
        movable.extend(self.waiting)
        movable.sort(key=lambda i: self._priority(i, now))
        chosen: dict[int, list[int]] = {}
        for index in movable:
            job = self.jobs[index]
            found = nodes.place(job.gpus_per_node, job.nodes)
            if found is not None:
                chosen[index] = found
        self._apply(chosen, now)

    def _protected(self, index: int, now: float) -> bool:
        """A running job this reference may not stop now (its limit, its minimum run)."""
        limit = self.reference.max_preemptions
        if limit and self.stops[index] >= limit:
            return True
        return now - self.started[index] < self.reference.min_runtime_seconds

    def _priority(self, index: int, now: float) -> tuple[int, float, int]:
        left = self.end[index] - now if index in self.placed else self.remaining[index]
        return (self.rank[index] if self.reference.classes else 0, left * self.gpus[index], index)

    def _apply(self, chosen: dict[int, list[int]], now: float) -> None:
        """Stop the movable running jobs left out, move the others (free), start the
        waiting jobs chosen."""
        for index in [i for i in self.placed if not self._protected(i, now)]:
            if index in chosen:
                self.placed[index] = chosen[index]
            else:
                self.stop(index, now)
        starting = [i for i in self.waiting if i in chosen]
        self.waiting = [i for i in self.waiting if i not in chosen]
        for index in starting:
            self.start(index, now, chosen[index])
