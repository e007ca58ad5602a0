"""Reservations handed back from the previous cycle (optional input).

The engine is a pure function of its snapshot, so on its own it plans every cycle afresh:
greedy choices then shift as jobs start, and a job can lose the slot its estimate was
based on to an earlier job that picks differently this time. When the dispatch loop hands
back each job's reservation (``PendingJob.reserved_gpu_ids`` / ``reserved_start``, taken
from the previous ``PendingInfo``), a reservation is kept while it still holds: the GPUs
are *held* for the job from the moment its priority class is considered.

Reservations follow the current order, though. The order changes from one cycle to the
next (fair share moves, a smaller job arrives, a job ages past its maximum wait), and a
job that is now ahead of a held reservation's owner must not wait for it: that is how
position, estimate and actual start came to disagree. The dispatch loop hands back each
job's previous pool position (``PendingJob.previous_position``), and a hold stands only
against the jobs that were already behind its owner when it was made:

- a job that *overtook* an owner (it was behind it last cycle, or is new) and must
  reserve has the owner's hold given back when that gets it an earlier reservation: it
  is then planned as if the jobs now behind it were not there;
- a job that could start now on held GPUs starts there if it overtook their owner from
  behind, or if the owner's reservation starts no later than the job would start with
  the hold in place: otherwise that owner, behind it, would start first on GPUs it
  could use now;
- otherwise the holds stay (:meth:`PreviousReservations.rehold`): keeping them costs the
  job nothing, or the job was ahead of the owner already and planned first last cycle
  too, the hold made around its reservation, which it keeps. So estimates stay upper
  bounds while the order does not change, and a job that passes on held GPUs now is not
  passed by a later job taking them.

Each owner whose hold was given back still gets its old reservation at its own turn if
nobody ahead took those GPUs (:meth:`PreviousReservations.slot_for`).

A strictly higher class ignores holds altogether (they are only taken when the owner's
class is reached), except *bounded* ones.

**Bounded reservations** (DESIGN.md §6: every wait has a bound). The reservation of a
job past its maximum wait (:func:`.order.overdue`) is held from the start of the cycle,
before any class is considered, and it is never given back to a job that overtook its
owner or would start first on its GPUs; its owner is considered before every job but
those of a strictly higher class that may preempt (:func:`.ordering.bounded_first`). So
backfill may use its GPUs only where it ends before the reservation starts, and later
arrivals of every class wait for it, except a job of a strictly higher class that may
preempt (DESIGN.md §6 lets such a job stop lower work anyway: for it a bounded hold is
given back like any other). The job keeps its reservation while its GPUs and quota are
free by its start, so its estimate only moves earlier: the engine reports it as
``PendingInfo.guaranteed_start``. A GPU that a bounded reservation shares with earlier
reservations is held for it all the same: before the reservations that are not bounded
(they would hold it only from their class's turn, and a bounded job considered before
could start there now and run past the bound), and after the earlier bounded ones, from
the moment their jobs have been considered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from heapq import heappop, heappush
from typing import Final

from .cluster import INF, Locator, NodeSlot, SliceIndex
from .snapshot import PendingJob

# The state before a hold of a GPU promised to nobody (most held GPUs): one tuple for all.
_UNPROMISED: Final = (False, 0.0, 0, False)


class Previous:
    """A job's reservation of the previous cycle, on one slice."""

    __slots__ = (
        "job_id",
        "pool",
        "position",
        "slice",
        "slots",
        "positions",
        "start",
        "end",
        "held_number",
        "held_pos",
        "held_ready",
        "held_before",
        "kept",
        "idle_held",
        "priority",
        "bounded",
    )

    def __init__(
        self,
        job: PendingJob,
        slice_: SliceIndex,
        slots: list[NodeSlot],
        positions: list[list[int]],
        start: float,
    ) -> None:
        self.job_id = job.id
        self.pool = job.pool
        self.position = job.previous_position
        self.slice = slice_
        self.slots = slots
        self.positions = positions
        self.start = start
        self.end = start + job.max_runtime_seconds
        # The held GPUs, one entry each in these parallel lists (plain lists rather than
        # a dict keyed by (slot number, position): a cycle holds and gives back
        # thousands): slot number, position, free-from time before the hold, and
        # (reserved, hole, hole owner, releasing) before the hold (a GPU may already be
        # promised to a job considered earlier in the cycle, and that promise outlives
        # the hold). Their order does not matter.
        self.held_number: list[int] = []
        self.held_pos: list[int] = []
        self.held_ready: list[float] = []
        self.held_before: list[tuple[bool, float, int, bool]] = []
        # (slot number, position) of held GPUs that an earlier job planned to use right
        # after: they stay held
        self.kept: set[tuple[int, int]] = set()
        self.idle_held = 0  # held GPUs that were idle before the hold
        self.priority = job.priority
        self.bounded = False  # held from the cycle's start, given back to few jobs

    def held_ready_of(self, number: int, pos: int) -> float:
        """The free-from time before the hold of a held GPU (KeyError if not held)."""
        numbers, held = self.held_number, self.held_pos
        for i in range(len(held)):
            if held[i] == pos and numbers[i] == number:
                return self.held_ready[i]
        raise KeyError((number, pos))


def _parse(job: PendingJob, locator: Locator) -> Previous | None:
    """The job's previous reservation if it still names a valid gang of one slice."""
    start = job.reserved_start
    if not job.reserved_gpu_ids or start is None or job.max_runtime_seconds <= 0:
        return None
    grouped = locator.placement(job, job.reserved_gpu_ids)
    if len(grouped) != job.nodes or len(job.reserved_gpu_ids) != job.gpus:
        return None
    # Every GPU found (a GPU no longer schedulable voids it), on one slice, a full gang.
    slice_ = grouped[0][0]
    slots: list[NodeSlot] = []
    by_slot: list[list[int]] = []
    for location_slice, slot, positions in grouped:  # one entry per slot
        if location_slice is not slice_ or len(positions) != job.gpus_per_node:
            return None
        slots.append(slot)
        by_slot.append(positions)
    return Previous(job, slice_, slots, by_slot, start)


class PreviousReservations:
    """Holds, releases and answers questions about last cycle's reservations."""

    def __init__(
        self,
        pending: Iterable[PendingJob],
        locator: Locator,
        now: float,
        bounded: frozenset[int] = frozenset(),
    ) -> None:
        self.now = now
        self._by_job: dict[int, Previous] = {}
        # pool -> heaps of (previous position, job id) and of (reservation start, job id)
        # of the jobs holding GPUs there and not considered yet (lazy deletion)
        self._waiting_in: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self._starts_in: dict[str, list[tuple[float, int]]] = defaultdict(list)
        # pool -> heap of (earliest free-from time before the hold of any GPU held, job
        # id) of the same jobs: a lower bound of when a given-back hold frees a GPU
        self._ready_in: dict[str, list[tuple[float, int]]] = defaultdict(list)
        # class -> [(reservation, slot numbers, positions) to hold]
        self._to_hold: dict[int, list[tuple[Previous, list[int], list[int]]]] = defaultdict(list)
        self._waiting: dict[int, Previous] = {}  # held, job not considered yet
        # Bounded reservations (of the jobs in ``bounded``, past their maximum wait): held
        # before any job is considered, kept out of the heaps above (no job that overtook
        # their owner gets them back); pool -> {job id: class} of those not considered yet.
        self._bounded_to_hold: list[tuple[Previous, list[int], list[int]]] = []
        self._bounded_in: dict[str, dict[int, int]] = defaultdict(dict)
        # GPUs of a bounded reservation that an earlier bounded one holds first: held for
        # it as soon as the jobs of the earlier bounded reservations of the GPU have been
        # considered (see :meth:`turn`); (their ids, reservation, slot number, position).
        self._bounded_after: list[tuple[list[int], Previous, int, int]] = []
        self._considered: set[int] = set()  # jobs whose turn came, while any wait above
        # GPUs idle now but held for jobs not considered yet (idle again at their turn).
        self.idle_held = 0
        jobs = [job for job in pending if job.reserved_gpu_ids]
        # A GPU has a single "free from" time: it is held for its earliest reservation,
        # the bounded ones first: a GPU that a bounded reservation shares with an earlier
        # one that is not bounded is held for the bounded job (held only at its class's
        # turn, the other hold would leave it to the bounded jobs considered before, to
        # start on now and run past the bound). One shared by bounded reservations is
        # held for the earliest, then for each next one once the jobs of those before
        # have been considered (their reservations made again by then, or gone).
        jobs.sort(key=lambda job: (job.id not in bounded, job.reserved_start or 0.0, job.id))
        seen: set[int] = set()  # GPU ids (one per slot and position)
        # GPU id -> the bounded jobs whose reservations have it, earliest first
        claimed: dict[int, list[int]] = {}
        for job in jobs:
            previous = _parse(job, locator)
            if previous is None:
                continue
            self._by_job[job.id] = previous
            is_bounded = job.id in bounded
            numbers: list[int] = []
            mine: list[int] = []
            for number, slot in enumerate(previous.slots):
                gpu_ids = slot.gpu_ids
                for pos in previous.positions[number]:
                    gpu_id = gpu_ids[pos]
                    if gpu_id not in seen:
                        seen.add(gpu_id)
                        numbers.append(number)
                        mine.append(pos)
                        if is_bounded:
                            claimed[gpu_id] = [job.id]
                    elif is_bounded:
                        before = claimed[gpu_id]
                        self._bounded_after.append((list(before), previous, number, pos))
                        before.append(job.id)
            if is_bounded:
                previous.bounded = True
            if not mine:
                continue
            if is_bounded:
                self._bounded_to_hold.append((previous, numbers, mine))
            else:
                self._to_hold[job.priority].append((previous, numbers, mine))

    def __bool__(self) -> bool:
        return bool(self._by_job)

    def hold_bounded(self) -> None:
        """Hold the bounded reservations (before any job is considered)."""
        batch, self._bounded_to_hold = self._bounded_to_hold, []
        for previous, numbers, gpus in batch:
            self._hold(previous, numbers, gpus)

    def hold_class(self, priority: int | None) -> None:
        """Hold the reservations of one class (``None``: of every class)."""
        if priority is None:
            batches = list(self._to_hold.values())
            self._to_hold.clear()
        else:
            batches = [self._to_hold.pop(priority, [])]
        for batch in batches:
            for previous, numbers, gpus in batch:
                self._hold(previous, numbers, gpus)

    def _hold(self, previous: Previous, numbers: list[int], gpus: list[int]) -> None:
        """Hold the GPUs (slot numbers and positions) of ``previous`` still free by its
        start."""
        by_slot: dict[int, list[int]] = {}
        slots, start = previous.slots, previous.start
        one_node = len(slots) == 1  # most reservations: no grouping by slot
        mine: list[int] = []
        held_number, held_pos = previous.held_number, previous.held_pos
        held_ready, held_before = previous.held_ready, previous.held_before
        for i in range(len(gpus)):
            number, pos = numbers[i], gpus[i]
            slot = slots[number]
            ready = slot.af[pos]
            # Not free in time any more (given what this cycle planned so far): not held.
            if ready > start:
                continue
            held_number.append(number)
            held_pos.append(pos)
            held_ready.append(ready)
            reserved, hole = slot.reserved[pos], slot.hole[pos]
            owner, releasing = slot.hole_owner[pos], slot.releasing[pos]
            if reserved or releasing or owner or hole != 0.0:
                held_before.append((reserved, hole, owner, releasing))
            else:
                held_before.append(_UNPROMISED)
            if one_node:
                mine.append(pos)
                continue
            positions = by_slot.get(number)
            if positions is None:
                by_slot[number] = [pos]
            else:
                positions.append(pos)
        if mine:
            previous.slice.reserve(slots[0], mine, start, previous.end, previous.job_id)
        for number, positions in by_slot.items():
            previous.slice.reserve(slots[number], positions, start, previous.end, previous.job_id)
        if held_pos:
            self._await_turn(previous)

    def _await_turn(self, previous: Previous) -> None:
        """``previous`` holds GPUs until its job's turn: entered in the pool's heaps, its
        GPUs idle now counted (lazy deletion: older entries of the job may stay)."""
        pool, job_id, now = previous.pool, previous.job_id, self.now
        held_ready = previous.held_ready
        if not held_ready:
            raise ValueError("a reservation awaits its turn without a held GPU")
        # One pass for the earliest and the idle ones (the builtin min is a generic call,
        # compiled).
        earliest = held_ready[0]
        idle = 0
        for ready in held_ready:
            if ready < earliest:
                earliest = ready
            if ready <= now:
                idle += 1
        if previous.bounded:
            self._bounded_in[pool][job_id] = previous.priority
        else:
            heappush(self._waiting_in[pool], (previous.position, job_id))
            heappush(self._starts_in[pool], (previous.start, job_id))
        heappush(self._ready_in[pool], (earliest, job_id))
        self._waiting[job_id] = previous
        previous.idle_held = idle
        self.idle_held += idle

    def turn(self, job_id: int) -> None:
        """The job is being considered: its held GPUs return to the timeline, except
        those an earlier job planned to use right after the hold (they stay held, as
        part of the job's reservation; see :meth:`slot_for`)."""
        if self._bounded_after:
            self._hold_bounded_after(job_id)
        previous = self._waiting.pop(job_id, None)
        if previous is None:
            return
        self.idle_held -= previous.idle_held
        if previous.bounded:
            self._bounded_in[previous.pool].pop(job_id, None)
        slots, end = previous.slots, previous.end
        held_number, held_pos = previous.held_number, previous.held_pos
        held_ready, held_before = previous.held_ready, previous.held_before
        if len(slots) == 1:
            # One node (most reservations): its GPUs in order, without grouping by slot.
            slot = slots[0]
            af = slot.af
            positions: list[int] = []
            readies: list[float] = []
            states: list[tuple[bool, float, int, bool]] = []
            for i in range(len(held_pos)):
                pos = held_pos[i]
                if af[pos] == end:
                    positions.append(pos)
                    readies.append(held_ready[i])
                    states.append(held_before[i])
                else:
                    previous.kept.add((0, pos))
            if positions:
                previous.slice.unhold(slot, positions, readies, states)
            return
        by_slot: dict[int, tuple[list[int], list[float], list[tuple[bool, float, int, bool]]]] = {}
        for i in range(len(held_pos)):
            number, pos = held_number[i], held_pos[i]
            if slots[number].af[pos] == end:
                entry = by_slot.get(number)
                if entry is None:  # not setdefault: its default would be made every time
                    entry = by_slot[number] = ([], [], [])
                entry[0].append(pos)
                entry[1].append(held_ready[i])
                entry[2].append(held_before[i])
            else:
                previous.kept.add((number, pos))
        for number, (positions, readies, before) in by_slot.items():
            previous.slice.unhold(slots[number], positions, readies, before)

    def _hold_bounded_after(self, job_id: int) -> None:
        """Hold for its bounded reservation each GPU an earlier bounded reservation held
        first, once the jobs of the earlier bounded reservations of that GPU have been
        considered (before ``job_id``; a job of a class that may preempt may come before
        them): from now on no job takes it past the later bound."""
        considered = self._considered
        waiting: list[tuple[list[int], Previous, int, int]] = []
        ready: dict[int, tuple[Previous, list[int], list[int]]] = {}
        for entry in self._bounded_after:
            earlier, previous, number, pos = entry
            owner = previous.job_id
            if owner == job_id or owner in considered:
                continue  # its own turn: it finds the GPU as the earlier jobs left it
            if not self._all_considered(earlier, job_id):
                waiting.append(entry)
                continue
            batch = ready.get(owner)
            if batch is None:
                batch = ready[owner] = (previous, [], [])
            batch[1].append(number)
            batch[2].append(pos)
        self._bounded_after = waiting
        considered.add(job_id)
        for previous, numbers, positions in ready.values():
            if self._waiting.get(previous.job_id) is previous:
                self.idle_held -= previous.idle_held  # counted again with the new ones
            self._hold(previous, numbers, positions)

    def _all_considered(self, jobs: list[int], job_id: int) -> bool:
        """Whether every job of ``jobs`` was considered before ``job_id`` and holds
        nothing now (a hold given back at its turn may be taken again)."""
        for other in jobs:
            if other == job_id or other not in self._considered or other in self._waiting:
                return False
        return True

    def holds_in(self, pool: str) -> bool:
        """Whether GPUs of ``pool`` are held for jobs not considered yet that a job could
        have given back (bounded holds aside)."""
        return bool(self._waiting_in.get(pool))

    def holds_for(self, job: PendingJob) -> bool:
        """Whether GPUs of the job's pool are held for jobs not considered yet that
        ``job`` could have given back: bounded holds only to a job of a higher class
        that may preempt."""
        pool = job.pool
        if self._waiting_in.get(pool):
            return True
        return job.can_preempt and bool(self._passable(job))

    def _passable(self, job: PendingJob) -> list[int]:
        """The owners of bounded holds in the job's pool that it may pass: those of a
        lower class, for a job that may preempt (none for any other job)."""
        if not job.can_preempt:
            return []
        bounded = self._bounded_in.get(job.pool)
        if not bounded:
            return []
        priority = job.priority
        return [owner for owner, owner_class in bounded.items() if owner_class < priority]

    def earliest_release(self, pool: str) -> float:
        """No GPU of ``pool`` held for a job not considered yet would be free before this
        if its hold were given back (:meth:`release_for`): a GPU given back is free from
        its time before the hold, or later if a job started in its hole meanwhile.

        So a job whose earliest start with the holds in place is no later than this
        cannot start earlier without them: giving every hold back and taking them again
        (the price of an answer otherwise) would change nothing."""
        heap = self._ready_in.get(pool)
        waiting = self._waiting
        while heap:
            ready, owner = heap[0]
            if owner in waiting:
                return ready
            heappop(heap)  # given back since (an entry pushed again on a rehold stays)
        return INF

    def release_for(
        self, job: PendingJob, starting: float | None = None, everyone: bool = False
    ) -> list[tuple[Previous, list[int]]]:
        """Give back the holds that would have ``job`` wait for jobs behind it (every
        held owner is behind it: it has not been considered yet). Without ``starting``
        (it reserves): those of the owners it *overtook*, ahead of it last cycle (all of
        them, for a new job or with ``everyone``: one whose own reservation was lost to
        jobs ahead of it, so that it is planned afresh), whose reservations were made
        before its own. With
        ``starting`` (it may start now on those GPUs; the value is its own start with
        the holds in place): those of the owners it overtook from behind, and those
        whose reservation starts no later than its own, who would otherwise start first
        on GPUs it could use now.

        Returns what :meth:`rehold` needs to put them back if that did not help: each
        owner given back, with the entries (indices) of the GPUs it gave back."""
        released = []
        for owner in self._owners(job, starting, everyone):
            previous = self._waiting.get(owner)
            if previous is None:
                continue  # already given back (or its entry in the other heap)
            end, slots = previous.end, previous.slots
            held_number, held_pos = previous.held_number, previous.held_pos
            given = [
                i for i in range(len(held_pos)) if slots[held_number[i]].af[held_pos[i]] == end
            ]
            self.turn(owner)
            released.append((previous, given))
        return released

    def _owners(self, job: PendingJob, starting: float | None, everyone: bool) -> list[int]:
        """The owners :meth:`release_for` gives back, taken off the heaps (an owner may
        come twice, and one given back already may come: its entries are left behind)."""
        pool = job.pool
        owners: list[int] = []
        mine = 0 if everyone else job.previous_position
        heap = self._waiting_in.get(pool)
        if starting is None or mine > 0:
            while heap and (mine <= 0 or heap[0][0] < mine):
                owners.append(heappop(heap)[1])
        if starting is not None:
            starts = self._starts_in.get(pool)
            while starts and starts[0][0] <= starting:
                owners.append(heappop(starts)[1])
        passable = self._passable(job)
        if passable:
            bounded = self._bounded_in[pool]
            for owner in passable:
                del bounded[owner]  # back at its rehold (_await_turn)
                owners.append(owner)
        return owners

    def release_and_rehold(
        self, job: PendingJob, starting: float | None = None, everyone: bool = False
    ) -> None:
        """What :meth:`release_for` followed at once by :meth:`rehold` leaves behind, for
        a caller that knows giving the holds back cannot help ``job``, without giving
        back and taking again every GPU (each a re-index of its node slot).

        The timeline ends as it was. What the round trip changes all the same is done
        here: a GPU an earlier job planned to use right after the hold stays held as
        part of its owner's reservation (:meth:`turn`); a GPU where a job started in
        the hole meanwhile is free, before the hold taken again, only from that job's
        end; and each node slot given back and taken again counts as changed for what
        the cycle learnt from "only ever shrinks" (:meth:`SliceIndex.touch`), as the
        cycle's early end (``.settled``) does."""
        done: set[int] = set()
        for owner in self._owners(job, starting, everyone):
            previous = self._waiting.get(owner)
            if previous is None or owner in done:
                continue
            done.add(owner)
            end = previous.end
            slots = previous.slots
            held_number, held_pos, held_ready = (
                previous.held_number,
                previous.held_pos,
                previous.held_ready,
            )
            touched: set[int] = set()
            for i in range(len(held_pos)):
                number, pos = held_number[i], held_pos[i]
                slot = slots[number]
                if slot.af[pos] == end:
                    lent = slot.lent[pos]
                    if lent > held_ready[i]:
                        held_ready[i] = lent
                    touched.add(number)
                else:
                    previous.kept.add((number, pos))
            for number in sorted(touched):
                previous.slice.touch(slots[number])
            self.idle_held -= previous.idle_held
            self._await_turn(previous)

    def rehold(self, released: list[tuple[Previous, list[int]]]) -> None:
        """Put back holds given back by :meth:`release_for` (nothing changed since)."""
        for previous, given in released:
            numbers = [previous.held_number[i] for i in given]
            gpus = [previous.held_pos[i] for i in given]
            if len(given) == len(previous.held_pos):
                previous.held_number = []
                previous.held_pos = []
                previous.held_ready = []
                previous.held_before = []
            else:
                out = set(given)
                left = [i for i in range(len(previous.held_pos)) if i not in out]
                previous.held_number = [previous.held_number[i] for i in left]
                previous.held_pos = [previous.held_pos[i] for i in left]
                previous.held_ready = [previous.held_ready[i] for i in left]
                previous.held_before = [previous.held_before[i] for i in left]
            self._hold(previous, numbers, gpus)

    def waiting_holds(self):
        """(slot, position) of each GPU held for a job not considered yet and still held
        for it alone: its turn gives it back."""
        for previous in self._waiting.values():
            held_number, held_pos = previous.held_number, previous.held_pos
            for i in range(len(held_pos)):
                slot = previous.slots[held_number[i]]
                pos = held_pos[i]
                if slot.af[pos] == previous.end:
                    yield slot, pos

    def _ready(self, previous: Previous, number: int, slot: NodeSlot, pos: int) -> float:
        """When a GPU of the reservation is free for its own job."""
        if previous.kept and (number, pos) in previous.kept:
            return max(previous.held_ready_of(number, pos), slot.lent[pos])
        return slot.af[pos]

    def usable_now(
        self, job: PendingJob, slice_: SliceIndex, end: float
    ) -> tuple[list[NodeSlot], list[list[int]]] | None:
        """The previous reservation, if the job can start on it now and run until end."""
        previous = self._by_job.get(job.id)
        if previous is None or previous.slice is not slice_:
            return None
        now = self.now
        kept = previous.kept
        for number, slot in enumerate(previous.slots):
            for pos in previous.positions[number]:
                if self._ready(previous, number, slot, pos) <= now:
                    continue
                if slot.hole[pos] >= end and not (kept and (number, pos) in kept):
                    continue
                return None
        return previous.slots, previous.positions

    def slot_for(
        self, job: PendingJob, slice_: SliceIndex
    ) -> tuple[float, list[NodeSlot], list[list[int]], bool] | None:
        """(GPUs-ready time, slots, positions, partly kept in the timeline) of the
        previous reservation on ``slice_``; the caller keeps it if that is no later than
        before (re-reserving only the GPUs not kept)."""
        previous = self._by_job.get(job.id)
        if previous is None or previous.slice is not slice_:
            return None
        ready = -INF  # the latest of its GPUs (it has one at least)
        for number, slot in enumerate(previous.slots):
            for pos in previous.positions[number]:
                when = self._ready(previous, number, slot, pos)
                if when > ready:
                    ready = when
        if ready > previous.start:
            return None
        return ready, previous.slots, previous.positions, bool(previous.kept)

    def kept_positions(self, job_id: int) -> set[tuple[int, int]]:
        """(slot number, position) of GPUs that stayed held for the job."""
        previous = self._by_job.get(job_id)
        return previous.kept if previous is not None else set()

    def previous_start(self, job: PendingJob) -> float | None:
        previous = self._by_job.get(job.id)
        return previous.start if previous is not None else None
