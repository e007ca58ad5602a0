"""Reservation: GPUs and quota held for jobs that cannot start now.

The reserve point of a cycle. A job that fits its guarantee but finds no idle GPUs gets
a reservation on the timeline at its earliest start (conservative backfill: every such
job is protected; see :mod:`.planner` for who reserves). A reservation handed back by
the previous cycle is kept while its GPUs and the quota are still free by the previous
estimate, and the GPUs held for old reservations of jobs now behind a job are given
back when that lets it start now or sooner (the rules are in :mod:`.reservations`). The
GPUs and quota kept for a job by an earlier preemption (claims, see :mod:`.cycle`) are
released at its turn.
"""

from __future__ import annotations

import math
from typing import Final

from .cluster import NodeSlot
from .cycle import CycleState
from .placing import Option, Placing, Slot, any_releasing, block_patience
from .snapshot import PendingJob

INF: Final = math.inf


class Reserving:
    """Holds GPUs and quota for jobs (see the module doc)."""

    def __init__(self, state: CycleState, placing: Placing) -> None:
        self.state = state
        self.placing = placing
        self._class: int | None = None  # priority class being considered
        # Give the holds back and take them again even where that cannot help a job
        # (see _holds_cannot_help): the plain way, which the tests compare with.
        self.always_give_back = False

    def turn(self, job: PendingJob) -> None:
        """It is ``job``'s turn: the GPUs and quota kept for it are its own again, and the
        old reservations of its class are held (see :mod:`.reservations`)."""
        state = self.state
        if state.claims:
            self._release_claims(job.id)
        if state.hold_previous:
            if (
                job.priority != self._class
                and not state.policy.global_fifo
                and job.id not in state.bounded  # considered ahead of its class (.ordering)
            ):
                self._class = job.priority
                state.previous.hold_class(job.priority)
            state.previous.turn(job.id)

    def kept_now(
        self, job: PendingJob, option: Option, end: float
    ) -> tuple[list[NodeSlot], list[list[int]]] | None:
        """The job's previous reservation on the option's slice, if it can start there now
        and run until ``end``: (node slots, positions)."""
        if not self.state.has_previous:
            return None
        return self.state.previous.usable_now(job, option.slice, end)

    def start_past_holds(
        self, job: PendingJob, option: Option, options: list[Option], end: float
    ) -> list[NodeSlot] | None:
        """Node slots where the job starts now on the option's slice once GPUs held for
        jobs behind it are given back (see :mod:`.reservations`), or None (the holds then
        stand)."""
        state = self.state
        gpus, nodes = job.gpus_per_node, job.nodes
        if not (
            state.hold_previous
            and state.previous.holds_for(job)
            and option.slice.fits_ignoring_reservations(gpus, nodes)
        ):
            return None
        previous = state.previous
        own_start = self._own_start(job, options)
        if not previous.idle_held and not self.always_give_back:
            # Given back, a held GPU is idle now only if it was idle before the hold:
            # without any, giving them back cannot make room now.
            previous.release_and_rehold(job, own_start)
            return None
        released = previous.release_for(job, own_start)
        if not released:
            return None
        chosen = option.slice.find_now(gpus, nodes, end, block_patience(job, state.now))
        if chosen is None:
            previous.rehold(released)
        return chosen

    def give_back_holds(
        self,
        job: PendingJob,
        options: list[Option],
        floor: float | None,
        slot: Slot | None,
        lost: bool,
    ) -> Slot | None:
        """For a job that must reserve (``slot``: its kept reservation, or with ``lost``
        its earliest start with the holds in place): give back the holds of jobs it
        overtook where that gets it an earlier start, returned (with positions); None
        if the holds stand (they do not delay it)."""
        state = self.state
        if not (state.hold_previous and state.previous.holds_for(job)):
            return None
        previous = state.previous
        if self._holds_cannot_help(job, options, floor, slot, lost):
            previous.release_and_rehold(job, everyone=lost)
            return None
        released = previous.release_for(job, everyone=lost)
        if not released:
            return None
        fresh = self.placing.earliest(job, options, floor, with_positions=True)
        if fresh is not None and (slot is None or fresh.start < slot.start):
            return fresh
        previous.rehold(released)
        return None

    def _own_start(self, job: PendingJob, options: list[Option]) -> float:
        """When the job would start with the holds in place: its kept reservation's
        start, else its earliest start now."""
        if job.reserved_gpu_ids and job.reserved_start is not None:
            return job.reserved_start
        found = self.placing.earliest_start(job, options, None)
        return INF if found is None else found[0]

    def _holds_cannot_help(
        self,
        job: PendingJob,
        options: list[Option],
        floor: float | None,
        slot: Slot | None,
        lost: bool,
    ) -> bool:
        """Whether giving back the holds of the job's pool (:meth:`PreviousReservations.
        release_for`) cannot get it a start earlier than ``slot`` (its kept reservation,
        or with ``lost`` its earliest start with the holds in place): then they would
        only be taken again, and the round trip is skipped (what it leaves behind all
        the same is done by :meth:`PreviousReservations.release_and_rehold`).

        A GPU given back is free from no earlier than ``earliest_release``, and GPUs
        only becoming free later cannot bring the earliest start (the latest of the
        nodes' g-th free-from times, and the quota's) below the smaller of that time and
        the earliest start without giving anything back."""
        if (
            self.always_give_back
            or slot is None
            or slot.start > self.state.previous.earliest_release(job.pool)
        ):
            return False
        if lost:
            return True  # slot is the earliest start without giving anything back
        found = self.placing.earliest_start(job, options, floor)
        return found is None or found[0] >= slot.start

    def previous_slot(
        self, job: PendingJob, options: list[Option], floor: float | None
    ) -> Slot | None:
        """The previous reservation, kept if its GPUs and the quota are still free by
        the previous estimate (whatever the greedy choice would be now)."""
        state = self.state
        if not state.has_previous:
            return None
        previous = state.previous
        for option in options:
            found = previous.slot_for(job, option.slice)
            if found is None:
                continue
            ready, nodes, positions, preheld = found
            # The latest of the GPUs, the floor and the quota (as max(), without the
            # builtin's generic call in the compiled engine).
            start = ready
            lowest = state.now if floor is None else floor
            if lowest > start:
                start = lowest
            due = option.account.earliest(job.gpus, job.preemptible)
            if due > start:
                start = due
            previous_start = previous.previous_start(job)
            if previous_start is None or start > previous_start:
                return None
            releasing = any_releasing(nodes, positions)
            return Slot(start, option, nodes, positions, releasing, preheld)
        return None

    def reserve(self, job: PendingJob, slot: Slot, runtime: float) -> tuple[int, ...]:
        """Promise the slot's GPUs and quota to the job; returns the GPU ids."""
        end = slot.start + runtime
        slice_ = slot.option.slice
        gpu_ids: list[int] = []
        kept = self.state.previous.kept_positions(job.id) if slot.preheld else None
        nodes, chosen = slot.nodes, slot.positions
        if len(nodes) != len(chosen):
            raise ValueError("a slot's node slots and positions differ in length")
        for number in range(len(nodes)):  # indexed: zip() is a generic call, compiled
            node_slot, positions = nodes[number], chosen[number]
            # GPUs that stayed held for the job are in the timeline already.
            fresh = [pos for pos in positions if (number, pos) not in kept] if kept else positions
            if fresh:
                slice_.reserve(node_slot, fresh, slot.start, end, job.id)
            ids = node_slot.gpu_ids
            for pos in positions:
                gpu_ids.append(ids[pos])
        account = slot.option.account
        account.reserve(job.gpus, slot.start, end)
        if account.leaving:
            account.take_leaving(job.gpus)  # it starts later: on quota being freed first
        return tuple(gpu_ids)

    def _release_claims(self, job_id: int) -> None:
        """GPUs and quota kept for this job by an earlier preemption become usable when it
        is its turn (by itself first, since it is considered right now)."""
        state = self.state
        claims = state.claims.pop(job_id, None)
        if claims is None:
            return
        for slice_, slot, positions, when, releasing in claims:
            slice_.release_at(slot, positions, when, releasing)
        for account, gpus, when in state.quota_claims.pop(job_id, ()):
            account.release_claim(gpus, when)
