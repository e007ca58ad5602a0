"""Reference schedulers: what a kind of scheduler can reach on a scenario, for scale.

None of these is Sluice's engine or a policy a platform team could pick. Each knows every
job's real runtime (Sluice knows only the declared limit and what it learnt from finished
jobs), ignores tenants, quotas and fair share, starts a job the moment a dispatch tick
finds it room (no reservations, so nothing keeps a big job from starving) and, where it
preempts, stops a job at once, without a grace period. They answer one question about a
target such as "the average wait 10x below FIFO's": can any scheduler of this kind reach
it on these jobs and this cluster, and at what cost to big jobs and to lost work?

- ``sjf``: non-preemptive; the waiting jobs, smallest GPU-time (GPUs x runtime) first,
  start wherever they fit on the nodes as they are (best fit: the node with the fewest
  GPUs free that still fit). The order Sluice's size key approximates (``log2(GPUs) +
  log2(runtime)`` inside a class and fair-share band), with the true runtimes.
- ``sjf-classes``: the same, a higher priority class first.
- ``srtf``: preemptive shortest-remaining-GPU-time first, the kind of scheduler the
  literature's 10-50x come from (Tiresias, SRTF on Philly-like traces): at every tick the
  running and the waiting jobs are laid out again, in that order, over the GPUs as if
  any job could move to any node for free; a running job left out is stopped and loses
  nothing. An upper bound for preemptive schedulers, not a schedule one could run.
- ``srtf-limited``: ``srtf`` with Sluice's costs and limits: a higher class first, a job
  runs 5 minutes before it may be stopped, stopped at most 3 times (then it runs to its
  end), and a stop loses the work since its last checkpoint (every 30 minutes of a run).

A job runs its trace duration, cut at its declared limit as in the replay (each stop
counts its elapsed run against that total). Waits count every re-wait after a stop, as
:func:`scheduling.simulator.metrics.summarize` does. The dispatch tick is the replay's
(5 s): arrivals and ends are acted on at the next multiple of it.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

from .model import Scenario, SimJob

BIG_JOB_GPUS = 8  # "jobs over 8 GPUs", as in metrics.summarize
DAY = 86400.0


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


class _State:
    """Per-job state of one reference run, in lists indexed like the sorted jobs."""

    def __init__(self, scenario: Scenario, reference: Reference) -> None:
        pools = {node.pool for node in scenario.nodes}
        if len(pools) != 1 or len({node.model for node in scenario.nodes}) != 1:
            raise ValueError(
                "reference schedulers take a scenario of one pool and one GPU model "
                "(bench/simulate.py --one-pool or --deep)"
            )
        self.reference = reference
        self.jobs: list[SimJob] = sorted(scenario.jobs, key=lambda job: (job.submit, job.id))
        ranks = {
            name: rank
            for rank, name in enumerate(
                sorted(scenario.classes, key=lambda name: -scenario.classes[name].value)
            )
        }
        self.rank = [ranks.get(job.priority_class, len(ranks)) for job in self.jobs]
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
        self.lost_gpu_seconds = 0.0

    def start(self, index: int, now: float, ends: list[tuple[float, int, int]]) -> None:
        """``index`` starts (or starts again) at ``now``; its end goes on the heap."""
        self.waited[index] += now - self.waiting_since[index]
        if self.first_wait[index] is None:
            self.first_wait[index] = self.waited[index]
        self.started[index] = now
        self.end[index] = now + self.remaining[index]
        heapq.heappush(ends, (self.end[index], self.stops[index], index))

    def stop(self, index: int, now: float) -> None:
        """``index`` is stopped at ``now``: it keeps the work up to its last checkpoint."""
        elapsed = now - self.started[index]
        interval = self.reference.checkpoint_seconds
        kept = elapsed if interval is None else elapsed // interval * interval
        self.remaining[index] -= kept
        self.lost_gpu_seconds += (elapsed - kept) * self.gpus[index]
        self.stops[index] += 1
        self.waiting_since[index] = now

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


class _Nodes:
    """Free GPUs per node, with the nodes grouped by how many they have free (best fit)."""

    def __init__(self, sizes: list[int]) -> None:
        self.free = list(sizes)
        self.largest = max(sizes, default=0)
        self.by_free: list[set[int]] = [set() for _ in range(self.largest + 1)]
        for node, size in enumerate(sizes):
            self.by_free[size].add(node)

    def find(self, per_node: int, nodes: int) -> list[int] | None:
        """``nodes`` nodes with ``per_node`` GPUs free each, the fullest first; None if
        there are not that many."""
        chosen: list[int] = []
        for free in range(per_node, self.largest + 1):
            group = self.by_free[free]
            if group:
                chosen.extend(sorted(group)[: nodes - len(chosen)])
                if len(chosen) == nodes:
                    return chosen
        return None

    def take(self, node: int, gpus: int) -> None:
        """``gpus`` GPUs of ``node`` are taken (``-gpus``: given back)."""
        self.by_free[self.free[node]].discard(node)
        self.free[node] -= gpus
        self.by_free[self.free[node]].add(node)


def run_reference(scenario: Scenario, reference: Reference, tick: float = 5.0) -> ReferenceResult:
    """Replay ``scenario`` under ``reference``; see the module docstring."""
    began = time.perf_counter()
    state = _State(scenario, reference)
    sizes = [node.gpus for node in scenario.nodes]
    if reference.preemptive:
        _run_preemptive(state, sizes, tick)
    else:
        _run_greedy(state, sizes, tick)
    return state.result(time.perf_counter() - began)


def _next_tick(when: float, tick: float) -> float:
    return math.ceil(when / tick) * tick if tick > 0 else when


def _run_greedy(state: _State, sizes: list[int], tick: float) -> None:
    """Non-preemptive: at each tick the waiting jobs, in order, start where they fit."""
    jobs, rank, work, classes = state.jobs, state.rank, state.work, state.reference.classes
    nodes = _Nodes(sizes)
    placed: dict[int, list[int]] = {}
    ends: list[tuple[float, int, int]] = []
    waiting: list[int] = []
    arrived = 0
    total_free = sum(sizes)

    def order(index: int) -> tuple[int, float, int]:
        area = work[index] * jobs[index].gpus
        return (rank[index] if classes else 0, area, index)

    while arrived < len(jobs) or ends:
        upcoming = min(
            jobs[arrived].submit if arrived < len(jobs) else math.inf,
            ends[0][0] if ends else math.inf,
        )
        now = _next_tick(upcoming, tick)
        while ends and ends[0][0] <= now:
            _, _, index = heapq.heappop(ends)
            for node in placed.pop(index):
                nodes.take(node, -jobs[index].gpus_per_node)
            total_free += jobs[index].gpus
        while arrived < len(jobs) and jobs[arrived].submit <= now:
            waiting.append(arrived)
            arrived += 1
        if not waiting:
            continue
        waiting.sort(key=order)
        still: list[int] = []
        for index in waiting:
            job = jobs[index]
            found = nodes.find(job.gpus_per_node, job.nodes) if job.gpus <= total_free else None
            if found is None:
                still.append(index)
                continue
            for node in found:
                nodes.take(node, job.gpus_per_node)
            total_free -= job.gpus
            placed[index] = found
            state.start(index, now, ends)
        waiting = still


def _run_preemptive(state: _State, sizes: list[int], tick: float) -> None:
    """Preemptive, free migration: at each tick where a job waits, the running and the
    waiting jobs are laid out afresh over the nodes' GPUs (only how many GPUs each node
    has free matters then), protected jobs first (biggest per node first, so that they
    fit again), then by class and remaining GPU-time; running jobs left out stop."""
    reference = state.reference
    jobs, rank, remaining, gpus = state.jobs, state.rank, state.remaining, state.gpus
    largest = max(sizes, default=0)
    empty = [0] * (largest + 1)
    for size in sizes:
        empty[size] += 1
    ends: list[tuple[float, int, int]] = []
    running: set[int] = set()
    waiting: set[int] = set()
    arrived = 0
    limit = reference.max_preemptions

    def protected(index: int, now: float) -> bool:
        if index not in running:
            return False
        if limit and state.stops[index] >= limit:
            return True
        return now - state.started[index] < reference.min_runtime_seconds

    # When a running job's minimum runtime is over: it may be stopped from then on, so
    # a waiting job is looked at again then (as the replay wakes for it).
    wakes: list[float] = []
    while arrived < len(jobs) or ends:
        upcoming = min(
            jobs[arrived].submit if arrived < len(jobs) else math.inf,
            ends[0][0] if ends else math.inf,
            wakes[0] if wakes else math.inf,
        )
        now = _next_tick(upcoming, tick)
        while wakes and wakes[0] <= now:
            heapq.heappop(wakes)
        while ends and ends[0][0] <= now:
            _, stops, index = heapq.heappop(ends)
            if index in running and stops == state.stops[index]:
                running.discard(index)
        while arrived < len(jobs) and jobs[arrived].submit <= now:
            waiting.add(arrived)
            arrived += 1
        if not waiting:
            continue
        kept = [i for i in running if protected(i, now)]
        kept.sort(key=lambda i: -jobs[i].gpus_per_node)
        others = [i for i in running if not protected(i, now)] + list(waiting)
        others.sort(
            key=lambda i: (
                rank[i] if reference.classes else 0,
                (state.end[i] - now if i in running else remaining[i]) * gpus[i],
                i,
            )
        )
        counts = list(empty)  # counts[f]: nodes with f GPUs free
        free = sum(sizes)
        chosen: set[int] = set()
        for index in kept + others:
            job = jobs[index]
            if job.gpus > free:
                continue
            if _fit(counts, job.gpus_per_node, job.nodes):
                chosen.add(index)
                free -= job.gpus
        for index in [i for i in running if i not in chosen]:
            running.discard(index)
            state.stop(index, now)
            waiting.add(index)
        for index in [i for i in waiting if i in chosen]:
            waiting.discard(index)
            running.add(index)
            state.start(index, now, ends)
            if reference.min_runtime_seconds > 0:
                heapq.heappush(wakes, now + reference.min_runtime_seconds)


def _fit(counts: list[int], per_node: int, nodes: int) -> bool:
    """Take ``nodes`` x ``per_node`` GPUs from the fullest nodes that have them (counts
    of nodes by GPUs free, changed in place); False, and nothing taken, if they lack."""
    have = sum(counts[per_node:])
    if have < nodes:
        return False
    needed = nodes
    for free in range(per_node, len(counts)):
        take = min(counts[free], needed)
        if take:
            counts[free] -= take
            counts[free - per_node] += take
            needed -= take
            if not needed:
                break
    return True
