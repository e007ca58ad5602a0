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
dropped again. The node whose set disturbs least wins (fewest guaranteed victims, lowest
highest class, fewest victims, fewest GPUs freed beyond need).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import NodeSlot, SliceIndex
from .snapshot import PendingJob, RunningJob

# Training-like work never preempts inference (DESIGN.md §1, §6).
TRAINING_WORKLOADS = frozenset({"training", "fine_tuning"})
INFERENCE_WORKLOAD = "inference"


class RunningRecord:
    """A running job as the planner tracks it during one cycle."""

    __slots__ = ("job", "end", "placement", "stopping", "gpus", "order_key")

    def __init__(self, job: RunningJob, end: float) -> None:
        self.job = job
        self.end = end
        # [(slice, slot, positions)] of the job's GPUs known to the cluster index.
        self.placement: list[tuple[SliceIndex, NodeSlot, list[int]]] = []
        self.stopping = job.stopping
        self.gpus = len(job.gpu_ids)
        # Victim order: borrowed first, then lowest class, then most recently started.
        self.order_key = (not job.borrowed, job.priority, -job.started_at, job.id)


@dataclass(slots=True)
class VictimChoice:
    """The victims chosen for a job and the node slots it will use."""

    cost: tuple
    slots: list[NodeSlot]
    victims: list[RunningRecord]


@dataclass(frozen=True, slots=True)
class Preemptor:
    """What the victim rules need to know about the job that wants GPUs."""

    job: PendingJob
    within_guarantee: bool

    def may_preempt(self, record: RunningRecord, now: float) -> bool:
        """Whether ``record`` may be stopped for this job (ignoring where its GPUs are)."""
        victim = record.job
        if record.stopping:
            return False
        if now - victim.started_at < victim.min_runtime_before_preemption:
            return False
        job = self.job
        if victim.workload_type == INFERENCE_WORKLOAD and job.workload_type in TRAINING_WORKLOADS:
            return False
        return self.is_reclaim(record) or self.is_priority(record)

    def is_reclaim(self, record: RunningRecord) -> bool:
        """Reclaim: the job is inside its guarantee, the victim borrows (another tenant)."""
        victim = record.job
        return self.within_guarantee and victim.borrowed and victim.tenant != self.job.tenant

    def is_priority(self, record: RunningRecord) -> bool:
        """Priority preemption of a lower, preemptible class."""
        victim = record.job
        job = self.job
        return (
            job.can_preempt
            and victim.preemptible
            and victim.priority < job.priority
            and (self.within_guarantee or victim.borrowed)
        )

    def cache_key(self, slice_: SliceIndex) -> tuple:
        """Jobs with the same key find the same victims (searches only get harder)."""
        job = self.job
        return (
            slice_.key,
            job.gpus_per_node,
            job.nodes,
            job.priority if job.can_preempt else None,
            job.workload_type in TRAINING_WORKLOADS,
            job.tenant if self.within_guarantee else None,
            self.within_guarantee,
        )


def _victim_stats(slice_: SliceIndex, now: float) -> tuple[float, frozenset[str]]:
    """Lowest preemptible class and tenants borrowing in the slice (quick rejection)."""
    if slice_.victim_stats is None:
        lowest = float("inf")
        borrowers = set()
        for slot in slice_.slots:
            for record in slot.running:
                victim = record.job
                if record.stopping:
                    continue
                if now - victim.started_at < victim.min_runtime_before_preemption:
                    continue
                if victim.preemptible:
                    lowest = min(lowest, victim.priority)
                if victim.borrowed:
                    borrowers.add(victim.tenant)
        slice_.victim_stats = (lowest, frozenset(borrowers))
    return slice_.victim_stats


def might_have_victims(slice_: SliceIndex, preemptor: Preemptor, now: float) -> bool:
    """Cheap check that a search in ``slice_`` is not hopeless."""
    lowest, borrowers = _victim_stats(slice_, now)
    job = preemptor.job
    if job.can_preempt and lowest < job.priority:
        return True
    return preemptor.within_guarantee and bool(borrowers - {job.tenant})


def _slot_choice(
    slot: NodeSlot, preemptor: Preemptor, gpus: int, now: float
) -> tuple[tuple, list[RunningRecord]] | None:
    """The cheapest victim set on ``slot`` that frees ``gpus`` GPUs (None if none)."""
    if len(slot.gpu_ids) < gpus:
        return None
    need = gpus - slot.idle_unreserved(now)
    if need <= 0:
        return (0, float("-inf"), 0, -need, slot.idx), []
    candidates = []
    reserved = slot.reserved
    for record in slot.running:
        if not preemptor.may_preempt(record, now):
            continue
        held = _positions_on(record, slot)
        if any(reserved[pos] for pos in held):
            continue  # promised to an earlier waiting job: taking it would delay that job
        candidates.append((record.order_key, record, len(held)))
    candidates.sort(key=lambda item: item[0])
    chosen = []
    freed = 0
    for _, record, held in candidates:
        chosen.append((record, held))
        freed += held
        if freed >= need:
            break
    if freed < need:
        return None
    # Drop victims that are not needed after all, most protected first.
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


def _positions_on(record: RunningRecord, slot: NodeSlot) -> list[int]:
    for _, held_slot, positions in record.placement:
        if held_slot is slot:
            return positions
    return []


def find_victims(slice_: SliceIndex, preemptor: Preemptor, now: float) -> VictimChoice | None:
    """The best victim set in ``slice_`` for the preemptor's job, or None."""
    job = preemptor.job
    gpus, nodes = job.gpus_per_node, job.nodes
    choices = []
    for slot in slice_.slots:
        found = _slot_choice(slot, preemptor, gpus, now)
        if found is not None:
            choices.append((found[0], slot, found[1]))
    if len(choices) < nodes:
        return None
    choices.sort(key=lambda item: item[0])
    picked = choices[:nodes]
    victims: dict[int, RunningRecord] = {}
    for _, _, slot_victims in picked:
        for record in slot_victims:
            victims.setdefault(record.job.id, record)
    if not victims:
        return None  # enough idle GPUs after all: nothing to preempt
    cost = tuple(max(item[0][i] for item in picked) for i in range(4))
    return VictimChoice(cost, [slot for _, slot, _ in picked], list(victims.values()))
