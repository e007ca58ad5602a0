"""Choosing victims for a job that cannot start on idle GPUs (DESIGN.md §6).

A running job may be a victim of job J when it is not already stopping, has run at least
its ``min_runtime_before_preemption``, is not inference work facing training work, holds
no GPU promised to an earlier waiting job, and either

- *priority*: J's class may preempt, the victim's class is lower and preemptible, and J
  runs inside its guarantee or the victim is borrowed (a borrower never takes guaranteed
  GPUs of others), or
- *reclaim*: J fits inside its tenant's guarantee and the victim, of another tenant,
  runs on borrowed GPUs (whatever its class).

On each node the victims are taken in the order borrowed first, lowest class, most
recently started, until enough GPUs would be free; victims that turn out unnecessary are
dropped again. The node whose set disturbs least wins: fewest guaranteed victims, then
the lowest highest class, fewest victims, fewest GPUs freed beyond need.

Searching every node for every preemptor would cost O(pending x nodes). Instead each kind
of preemptor (slice, size, class, training or not, inside its guarantee or not) keeps a
heap of node costs; a node is re-evaluated only when it changed since (lazy deletion).
The heap ignores the preemptor's tenant (only "reclaim from another tenant" depends on
it), so its costs are lower bounds and the few best nodes are re-evaluated exactly.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from heapq import heapify, heappop, heappush

from .cluster import NodeSlot, SliceIndex
from .snapshot import PendingJob, RunningJob

# Training-like work never preempts inference (DESIGN.md §1, §6).
TRAINING_WORKLOADS = frozenset({"training", "fine_tuning"})
INFERENCE_WORKLOAD = "inference"


class RunningRecord:
    """A running job as the planner tracks it during one cycle."""

    __slots__ = ("job", "end", "placement", "stopping", "order_key", "seasoned", "inference")

    def __init__(self, job: RunningJob, end: float, now: float) -> None:
        self.job = job
        self.end = end
        # [(slice, slot, positions)] of the job's GPUs known to the cluster index.
        self.placement: list[tuple[SliceIndex, NodeSlot, list[int]]] = []
        self.stopping = job.stopping
        # Victim order: borrowed first, then lowest class, then most recently started.
        self.order_key = (not job.borrowed, job.priority, -job.started_at, job.id)
        self.seasoned = now - job.started_at >= job.min_runtime_before_preemption
        self.inference = job.workload_type == INFERENCE_WORKLOAD

    def positions_on(self, slot: NodeSlot) -> list[int]:
        """The positions of this job's GPUs on ``slot``."""
        for _, held_slot, positions in self.placement:
            if held_slot is slot:
                return positions
        return []


@dataclass(frozen=True, slots=True)
class Rule:
    """Which running jobs a preemptor may stop. ``tenant`` None: any borrower may be
    reclaimed (the tenant-blind lower bound used by the heaps)."""

    priority: int | None  # victims must be below this class; None: no priority preemption
    training: bool
    within_guarantee: bool
    tenant: str | None

    def allows(self, record: RunningRecord) -> bool:
        """Whether ``record`` may be stopped (its age and GPUs are checked elsewhere)."""
        if record.inference and self.training:
            return False
        victim = record.job
        if self.within_guarantee and victim.borrowed and victim.tenant != self.tenant:
            return True
        return (
            self.priority is not None
            and victim.preemptible
            and victim.priority < self.priority
            and (self.within_guarantee or victim.borrowed)
        )


@dataclass(frozen=True, slots=True)
class Preemptor:
    """The job that wants GPUs, and whether it runs inside its tenant's guarantee."""

    job: PendingJob
    within_guarantee: bool

    def rule(self, slice_: SliceIndex, exact: bool = True) -> Rule:
        """The victim rule in ``slice_``; ``exact=False`` ignores the tenant.

        The class threshold and the training flag are normalised to what makes a
        difference among the slice's running jobs, so that more preemptors share a heap.
        """
        job = self.job
        stats = slice_stats(slice_)
        threshold = None
        if job.can_preempt:
            below = bisect_left(stats.priorities, job.priority)
            if below:
                threshold = stats.priorities[below - 1] + 1
        training = job.workload_type in TRAINING_WORKLOADS and stats.has_inference
        return Rule(threshold, training, self.within_guarantee, job.tenant if exact else None)

    def is_reclaim(self, record: RunningRecord) -> bool:
        """Reclaim: the job is inside its guarantee, the victim borrows (another tenant)."""
        victim = record.job
        return self.within_guarantee and victim.borrowed and victim.tenant != self.job.tenant

    def might_find_victims(self, slice_: SliceIndex) -> bool:
        """Cheap check that a search in ``slice_`` is not hopeless."""
        stats = slice_stats(slice_)
        job = self.job
        if job.can_preempt and stats.priorities and stats.priorities[0] < job.priority:
            return True
        return self.within_guarantee and bool(stats.borrowers - {job.tenant})


@dataclass(frozen=True, slots=True)
class SliceStats:
    """Possible victims of a slice at the start of the cycle (only shrinks afterwards)."""

    priorities: list[int]  # distinct classes of preemptible jobs, ascending
    borrowers: frozenset[str]
    has_inference: bool


def slice_stats(slice_: SliceIndex) -> SliceStats:
    """The slice's :class:`SliceStats`, computed once per cycle."""
    if slice_.victim_stats is None:
        priorities = set()
        borrowers = set()
        has_inference = False
        for slot in slice_.slots:
            for record in slot.running:
                if record.stopping or not record.seasoned:
                    continue
                if record.job.preemptible:
                    priorities.add(record.job.priority)
                if record.job.borrowed:
                    borrowers.add(record.job.tenant)
                has_inference |= record.inference
        slice_.victim_stats = SliceStats(sorted(priorities), frozenset(borrowers), has_inference)
    return slice_.victim_stats


@dataclass(slots=True)
class VictimChoice:
    """The victims chosen for a job and the node slots it will use."""

    cost: tuple
    slots: list[NodeSlot]
    victims: list[RunningRecord]


def _candidates(slot: NodeSlot) -> list[tuple[RunningRecord, list[int]]]:
    """The jobs on ``slot`` that may ever be victims this cycle, in victim order, with
    their GPUs on the slot (computed once per slot; what changes is checked per use)."""
    if slot.victim_view is None:
        found = [
            (record.order_key, record, record.positions_on(slot))
            for record in slot.running
            if record.seasoned and not record.stopping
        ]
        found.sort(key=lambda item: item[0])
        slot.victim_view = [(record, held) for _, record, held in found]
    return slot.victim_view


def evaluate_slot(
    slot: NodeSlot, gpus: int, rule: Rule, now: float
) -> tuple[tuple, list[RunningRecord]] | None:
    """The cheapest victim set on ``slot`` that frees ``gpus`` GPUs, with its cost."""
    need = gpus - slot.idle_unreserved(now)
    if need <= 0:
        return (0, float("-inf"), 0, -need, slot.idx), []
    chosen: list[tuple[RunningRecord, int]] = []
    freed = 0
    reserved = slot.reserved
    for record, positions in _candidates(slot):
        if record.stopping or not rule.allows(record):
            continue
        if True in [reserved[pos] for pos in positions]:
            continue  # promised to an earlier waiting job: stopping it would delay that job
        chosen.append((record, len(positions)))
        freed += len(positions)
        if freed >= need:
            break
    if freed < need:
        return None
    # Drop victims that are not needed after all, the most protected first.
    for item in reversed(list(chosen)):
        if freed - item[1] >= need:
            chosen.remove(item)
            freed -= item[1]
    victims = [record for record, _ in chosen]
    cost = (
        sum(1 for record in victims if not record.job.borrowed),
        max(record.job.priority for record in victims),
        len(victims),
        freed - need,
        slot.idx,
    )
    return cost, victims


class VictimFinder:
    """Finds victim sets during one cycle, sharing work between similar preemptors."""

    def __init__(self, now: float) -> None:
        self.now = now
        # (slice, epoch, gpus, tenant-blind rule) -> ([(cost, slot idx, version)], {idx: version})
        self._heaps: dict[tuple, tuple[list, dict[int, int]]] = {}

    def _heap(self, slice_: SliceIndex, gpus: int, rule: Rule) -> tuple[list, dict[int, int]]:
        key = (slice_.key, slice_.epoch, gpus, rule)
        found = self._heaps.get(key)
        if found is None:
            heap = []
            pushed = {}
            for slot in slice_.slots:
                if len(slot.gpu_ids) < gpus:
                    continue
                result = evaluate_slot(slot, gpus, rule, self.now)
                if result is not None:
                    heap.append((result[0], slot.idx, slot.version))
                    pushed[slot.idx] = slot.version
            heapify(heap)
            found = self._heaps[key] = (heap, pushed)
        return found

    def find(self, slice_: SliceIndex, preemptor: Preemptor) -> VictimChoice | None:
        """The best victim set in ``slice_`` for the preemptor's job, or None."""
        job = preemptor.job
        gpus, nodes = job.gpus_per_node, job.nodes
        blind = preemptor.rule(slice_, exact=False)
        exact = preemptor.rule(slice_, exact=True)
        heap, pushed = self._heap(slice_, gpus, blind)
        slots = slice_.slots
        results: list[tuple[tuple, NodeSlot, list[RunningRecord]]] = []
        popped = []
        while heap:
            bound, idx, version = heap[0]
            slot = slots[idx]
            if slot.version != version:
                heappop(heap)
                if pushed.get(idx) != slot.version:
                    # Slots only ever lose idle GPUs and victims in a cycle, so a slot
                    # without a choice once never gets one again.
                    pushed[idx] = slot.version
                    result = evaluate_slot(slot, gpus, blind, self.now)
                    if result is not None:
                        heappush(heap, (result[0], idx, slot.version))
                continue
            if len(results) >= nodes:
                results.sort(key=lambda item: item[0])
                if bound >= results[nodes - 1][0]:
                    break
            popped.append(heappop(heap))
            result = evaluate_slot(slot, gpus, exact, self.now)
            if result is not None:
                results.append((result[0], slot, result[1]))
        for entry in popped:
            heappush(heap, entry)
        if len(results) < nodes:
            return None
        results.sort(key=lambda item: item[0])
        picked = results[:nodes]
        victims: dict[int, RunningRecord] = {}
        for _, _, slot_victims in picked:
            for record in slot_victims:
                victims.setdefault(record.job.id, record)
        if not victims:
            return None  # enough idle GPUs after all: nothing to preempt
        cost = tuple(max(item[0][i] for item in picked) for i in range(4))
        return VictimChoice(cost, [slot for _, slot, _ in picked], list(victims.values()))
