"""Placement: where a job could ever run, when it could start, and taking GPUs now.

The fit-and-score point of a cycle. A job's *options* are the slices of GPUs of its
pool that could ever hold it (its models, memory and shape; preferred models first),
each with the quota account it would count against, where that quota could ever admit
it. Its earliest start over those options is the latest of the GPUs' and the quota's
(the slices' timelines, :mod:`.cluster`; the accounts' timelines, :mod:`.quota`) and of
the pool's floor; placing a job takes the GPUs and the quota now. Which jobs get placed
is for the planner (:mod:`.planner`) to decide.
"""

from __future__ import annotations

import math
from typing import Final

from .cluster import NO_TOPOLOGY, NodeSlot, SliceIndex
from .cycle import CycleState
from .quota import BORROWED, Account, PlacedJob, placed_within_guarantee
from .results import Placement
from .snapshot import PendingJob

INF: Final = math.inf


def block_patience(job: PendingJob, now: float) -> float:
    """What is left at ``now`` of the topology wait of a job of several nodes (see
    :mod:`.cluster`, topology): its whole wait until it first waits for a block
    (``PendingJob.topology_since``), then less as it waits, 0 at least; ``NO_TOPOLOGY``
    for a job of one node."""
    if job.nodes <= 1:
        return NO_TOPOLOGY
    wait = job.topology_wait_seconds
    if wait <= 0:
        return 0.0
    since = job.topology_since
    left = wait if since is None else wait - (now - since)
    return left if left > 0 else 0.0


# Option and Slot are plain classes, not dataclasses: compiled, a dataclass keeps the
# ``__init__`` that ``dataclasses`` generates, interpreted Python (cycles make millions).


class Option:
    """One way to run a job: a slice of GPUs and the quota account it counts against.
    Two options are equal when they are of the same slice and account."""

    __slots__ = ("slice", "account")

    def __init__(self, slice: SliceIndex, account: Account) -> None:
        self.slice = slice
        self.account = account

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Option):
            return NotImplemented
        return self.slice is other.slice and self.account is other.account

    def __hash__(self) -> int:
        return hash((id(self.slice), id(self.account)))


class Slot:
    """The earliest start of a job on the timeline, and where."""

    __slots__ = ("start", "option", "nodes", "positions", "releasing", "preheld")

    def __init__(
        self,
        start: float,
        option: Option,
        nodes: list[NodeSlot],
        positions: list[list[int]],
        releasing: bool,  # uses GPUs of jobs being stopped
        preheld: bool = False,  # partly promised in the timeline already (a kept reservation)
    ) -> None:
        self.start = start
        self.option = option
        self.nodes = nodes
        self.positions = positions
        self.releasing = releasing
        self.preheld = preheld


class Placing:
    """Fits jobs to slices and places them now (see the module doc)."""

    def __init__(self, state: CycleState) -> None:
        self.state = state
        self._shape_cache: dict[tuple, list[SliceIndex]] = {}
        self._option_cache: dict[tuple, tuple[list[SliceIndex], list[Option]]] = {}
        self._placed: list[PlacedJob] = []  # see label_within_guarantee

    def inside_guarantee(self, job: PendingJob) -> PendingJob:
        """A job at its preemption limit, admitted like non-preemptible work: inside its
        tenant's guarantee, where no reclaim stops it again, unless no guarantee of the
        tenant could ever hold it (then it may still borrow; see :mod:`.preemption`)."""
        inside = job.not_preemptible()
        return inside if self.options_for(inside)[1] else job

    def options_for(self, job: PendingJob) -> tuple[list[SliceIndex], list[Option]]:
        """Slices of the job's pool where it could ever fit (preferred first), and those
        of them whose quota could ever admit it, with their accounts."""
        shape = (job.pool, job.gpu_models, job.min_gpu_memory_mb, job.gpus_per_node, job.nodes)
        key = (job.tenant, job.preemptible, shape)
        cached = self._option_cache.get(key)
        if cached is None:
            slices = self._shape_cache.get(shape)
            if slices is None:
                slices = self._shape_cache[shape] = self._slices_for(job)
            options = []
            for slice_ in slices:
                account = self.state.quotas.account(job.tenant, slice_.pool, slice_.model)
                if account.could_ever_fit(job.gpus, job.preemptible):
                    options.append(Option(slice_, account))
            cached = self._option_cache[key] = (slices, options)
        return cached

    def _slices_for(self, job: PendingJob) -> list[SliceIndex]:
        found = []
        if job.gpus_per_node >= 1 and job.nodes >= 1:
            wanted = {model: rank for rank, model in enumerate(job.gpu_models)}
            for slice_ in self.state.pool_slices.get(job.pool, ()):
                if wanted and slice_.model not in wanted:
                    continue
                if slice_.memory_mb < job.min_gpu_memory_mb:
                    continue
                if slice_.nodes_with_at_least(job.gpus_per_node) < job.nodes:
                    continue
                found.append((wanted.get(slice_.model, 0), slice_.model, slice_.memory_mb, slice_))
        found.sort(key=lambda item: item[:3])
        return [item[3] for item in found]

    def earliest(
        self, job: PendingJob, options: list[Option], floor: float | None, with_positions: bool
    ) -> Slot | None:
        """The earliest start over the job's options (GPUs and quota), or None if never."""
        found = self.earliest_start(job, options, floor)
        if found is None:
            return None
        slot = Slot(found[0], found[1], found[2], [], False)
        if with_positions:
            self.choose_positions(job, slot)
        return slot

    def earliest_start(
        self, job: PendingJob, options: list[Option], floor: float | None
    ) -> tuple[float, Option, list[NodeSlot]] | None:
        """(start, option, node slots) of the job's earliest start, or None if never."""
        best = None
        best_start = INF
        lowest = self.state.now if floor is None else floor
        gpus, nodes = job.gpus_per_node, job.nodes
        total, preemptible = gpus * nodes, job.preemptible
        patience = block_patience(job, self.state.now)
        for option in options:
            found = option.slice.earliest(gpus, nodes, patience)
            if found is None or found[0] >= best_start:
                continue
            start = option.account.earliest(total, preemptible)
            # max(start, found[0], lowest), without the builtin's generic call (compiled)
            if found[0] > start:
                start = found[0]
            if lowest > start:
                start = lowest
            if start < best_start:
                best_start = start
                best = (option, found[1])
        if best is None:
            return None
        return best_start, best[0], best[1]

    def choose_positions(self, job: PendingJob, slot: Slot) -> None:
        """Choose the GPUs of each of the slot's node slots (best fit from its start),
        and mark the slot releasing if one of them is held by a stopping job."""
        slice_ = slot.option.slice
        for node in slot.nodes:
            positions = slice_.choose_reserved(node, job.gpus_per_node, slot.start)
            slot.positions.append(positions)
            slot.releasing |= any(node.releasing[pos] for pos in positions)

    def uses_releasing(self, job: PendingJob, slot: Slot) -> bool:
        """Whether the slot relies on GPUs of stopping jobs (positions chosen if so)."""
        if not any(True in node.releasing for node in slot.nodes):
            return False
        if not slot.positions:
            self.choose_positions(job, slot)
        return slot.releasing

    def place(
        self,
        job: PendingJob,
        option: Option,
        chosen: list[NodeSlot],
        mode: str,
        end: float,
        positions: list[list[int]] | None = None,
    ) -> None:
        """Start the job now on ``chosen`` (``positions``: the GPUs of each node slot, if
        already chosen) until ``end``, under the option's quota account."""
        state = self.state
        gpu_ids: list[int] = []
        for number, slot in enumerate(chosen):
            wanted = positions[number] if positions is not None else None
            taken = option.slice.take_now(slot, job.gpus_per_node, end, wanted)
            gpu_ids.extend(slot.gpu_ids[pos] for pos in taken)
        option.account.start(job.gpus, end)
        borrowed = mode == BORROWED
        self._placed.append((job.id, job.tenant, job.pool, option.slice.model, job.gpus, borrowed))
        state.running_gpus[job.tenant] += job.gpus
        state.result.placements.append(
            Placement(
                job_id=job.id,
                gpu_ids=tuple(gpu_ids),
                node_ids=tuple(slot.node_id for slot in chosen),
                borrowed=borrowed,
                gpu_model=option.slice.model,
            )
        )

    def label_within_guarantee(self) -> None:
        """Jobs placed as borrowed that fit their tenant's guarantee start on it (see
        :func:`.quota.placed_within_guarantee`): labelled so, they are not reclaimable
        from their first cycle on (the labels only matter from the next cycle: nothing
        placed in this one is a victim in it)."""
        if not self._placed:
            return
        cluster, result = self.state.cluster, self.state.result
        inside = placed_within_guarantee(cluster.running, self._placed, cluster.quotas)
        if not inside:
            return
        ids = set(inside)
        result.placements = [
            Placement(p.job_id, p.gpu_ids, p.node_ids, False, p.gpu_model) if p.job_id in ids else p
            for p in result.placements
        ]


def any_releasing(nodes: list[NodeSlot], positions: list[list[int]]) -> bool:
    """Whether any of the GPUs (``positions`` per node slot) is held by a stopping job
    (loops: any() of a generator, and zip(), are generic calls in the compiled engine)."""
    if len(nodes) != len(positions):
        raise ValueError("a reservation's node slots and positions differ in length")
    for number in range(len(nodes)):
        flags = nodes[number].releasing
        for pos in positions[number]:
            if flags[pos]:
                return True
    return False
