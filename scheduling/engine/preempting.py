"""Preemption: stopping running jobs for a waiting one, when that pays.

The preempt point of a cycle. For a job that cannot start now, the planner asks whether
stopping victims would get it running at least ``Policy.preemption_min_gain_seconds``
sooner than waiting; the victims are chosen by :class:`.preemption.VictimFinder` (the
rules of who may stop whom are in :mod:`.preemption`). A job that preempts reserves the
victims' GPUs from when they are gone, and its tenant's quota; the victims' stops are
the plan's preemptions.
"""

from __future__ import annotations

import math
from typing import Final

from . import messages, reasons
from .cycle import CycleState
from .explaining import Explaining
from .order import sharing_floor
from .placing import Option, Slot, block_patience
from .preemption import Preemptor, RunningRecord, VictimChoice, VictimFinder
from .quota import Account
from .reserving import Reserving
from .results import Preemption
from .snapshot import PendingJob

INF: Final = math.inf


class Preempting:
    """Stops victims for jobs where that pays (see the module doc)."""

    def __init__(self, state: CycleState, reserving: Reserving, explaining: Explaining) -> None:
        self.state = state
        self.reserving = reserving
        self.explaining = explaining
        self.victims = VictimFinder(state.now)
        self._hopeless: set[tuple] = set()  # preemption searches known to fail
        # Search for victims even where no preemption could pay (see may_pay): the
        # plain way, which the tests compare with.
        self.always_search = False
        # The last search found victims only spread over topology blocks for a job with
        # topology wait left (see :mod:`.cluster`): it then waits for a block instead.
        self.topology_skipped = False

    def may_pay(self, slot: Slot | None) -> bool:
        """Whether a preemption could get the job running at least the minimum gain
        sooner than ``slot`` (its earliest start without preempting, None if never).
        A job that preempts starts once its victims are gone, at ``now`` + their grace
        (at least 1 s) or later, so where waiting starts it by ``now`` + 1 s + the gain,
        :meth:`preempt` would stop nobody whatever victims it found: the search (the
        costliest part of a cycle after the holds) is not made. Nothing a search leaves
        behind changes a decision: its heaps and the slices' victim statistics are
        worked out again on first use, and a search skipped is not known hopeless."""
        if slot is None or self.always_search:
            return True
        state = self.state
        return slot.start > state.now + 1 + state.policy.preemption_min_gain_seconds

    def preempt(
        self,
        job: PendingJob,
        preemptors: list[tuple[Option, Preemptor]],
        runtime: float,
        slot: Slot | None,
        sharing: bool = False,
    ) -> tuple[str, float] | None:
        """Stop victims for the job if that gets it running at least the snapshot's
        ``preemption_min_gain_seconds`` sooner than waiting (``slot``: its earliest start
        without preempting, None if never; see :mod:`.preemption`).

        Without backfill a job behind the pool's first blocked job starts after it (the
        pool's floor): stopping victims before then would cost their work for nothing,
        so such a job preempts only if its victims are still stopping by then: where the
        floor is past the longest grace of a stop now, no search is made."""
        state = self.state
        now = state.now
        floor = state.pool_floor.get(job.pool) if state.pool_floor else None
        if floor is not None and (
            floor == INF or (floor > now + state.longest_grace and not self.always_search)
        ):
            return None
        gain = state.policy.preemption_min_gain_seconds
        if not job.can_preempt and not sharing:
            # Its victims can only be reclaimed (borrowed, of other tenants): it starts no
            # sooner than a victim's stop and its guaranteed quota allow, whoever stops.
            due = [
                option.account.earliest(job.gpus, job.preemptible, within_guarantee=True)
                for option, _ in preemptors
            ]
            if slot is not None and slot.start <= max(now + 1, min(due)) + gain:
                return None  # waiting is (nearly) as fast as any preemption: no search
            victims_gone = now + state.longest_grace
            preemptors = [
                item
                for item, soonest in zip(preemptors, due, strict=True)
                if soonest <= max(victims_gone, item[0].account.leaving_until)
            ]
            if not preemptors:
                return None  # its quota is not due when victims would be gone: no search
        best: tuple[VictimChoice, Option, Preemptor] | None = None
        self.topology_skipped = False
        patience = block_patience(job, now)
        for option, preemptor in preemptors:
            # Searches only get harder during a cycle: a failed one stays failed.
            key = (
                option.slice.key,
                option.slice.epoch,
                job.gpus_per_node,
                job.nodes,
                preemptor.rule(option.slice),
                preemptor.quota_need,
                preemptor.jobs_need,
            )
            if key in self._hopeless:
                continue
            choice = None
            if preemptor.might_find_victims(option.slice):
                choice = self.victims.find(option.slice, preemptor)
            if choice is None:
                self._hopeless.add(key)
            elif not choice.victims:
                continue  # idle GPUs enough: nothing to stop (a later search may be)
            elif patience > 0 and not option.slice.in_one_block(choice.slots, job):
                self.topology_skipped = True  # it waits for one block (topology)
            elif best is None or choice.cost < best[0].cost:
                best = (choice, option, preemptor)
        if best is None:
            return None
        choice, option, preemptor = best
        account = option.account
        release = {
            record.job.id: now + max(record.job.grace_seconds, 1) for record in choice.victims
        }
        # The quota of the tenant's own victims is free once they have stopped.
        stops = [
            (record.gpus, record.end, release[record.job.id])
            for record in choice.victims
            if record.account is account
        ]
        latest = max(release.values())
        if floor is not None and floor > latest:
            return None  # it could not start on the GPUs freed before the floor
        # Reclaiming is a right of the guarantee: the job must fit it when it starts
        # (its guaranteed quota may be promised to earlier jobs of its tenant).
        reclaims = any(preemptor.is_reclaim(record) for record in choice.victims)
        start = max(latest, account.earliest(job.gpus, job.preemptible, stops, reclaims))
        if start > max(latest, account.leaving_until):
            # Its quota is promised to earlier jobs of its tenant until after the victims
            # are gone (and its own stopping jobs): their GPUs would sit idle until then.
            # It stops nobody now, and preempts once its quota is due.
            return None
        if slot is not None and slot.start <= start + gain:
            return None  # waiting is (nearly) as fast as preempting
        if gain > 0 and _expected_gone_by(choice.victims, now, start + gain):
            return None  # its victims are expected to end by then anyway
        claimed = state.claimed_ids.setdefault(job.id, set())
        for record in choice.victims:
            self._stop(record, job, release[record.job.id], preemptor, account)
            claimed.update(record.job.gpu_ids)
        positions = [
            option.slice.choose_reserved(node_slot, job.gpus_per_node, start)
            for node_slot in choice.slots
        ]
        reservation = Slot(start, option, choice.slots, positions, True)
        reserved = self.reserving.reserve(job, reservation, runtime)
        frees_quota = account if preemptor.short_of_quota else None
        message = messages.preemption_wait(release, start, now, frees_quota)
        self.explaining.wait(job, reasons.WAITING_FOR_PREEMPTION, message, start, reserved)
        return reasons.WAITING_FOR_PREEMPTION, start

    def share_time(
        self,
        job: PendingJob,
        preemptors: list[tuple[Option, Preemptor]],
        runtime: float,
        slot: Slot | None,
    ) -> tuple[str, float] | None:
        """Time-sharing (see :mod:`.order`): stop running time-sharing jobs of the job's
        class in a higher level (more GPU-time used) for it, if that gets it running
        sooner, as :meth:`preempt` does for a higher class. Nothing for a job that does
        not time-share."""
        floor = sharing_floor(job, self.state.now, self.state.policy)
        if floor == INF:
            return None
        sharing = [(option, preemptor.with_sharing(floor)) for option, preemptor in preemptors]
        return self.preempt(job, sharing, runtime, slot, sharing=True)

    def _stop(
        self,
        record: RunningRecord,
        job: PendingJob,
        when: float,
        preemptor: Preemptor,
        account: Account,
    ) -> None:
        """Stop ``record`` by ``when`` for ``job``: its GPUs and its quota are free then."""
        end = record.end
        record.stopping = True
        record.end = when
        for slice_, slot, positions in record.placement:
            slice_.release_at(slot, positions, when)
        if record.account is not None:
            record.account.stop(record.gpus, end, when)
        victim = record.job
        if preemptor.is_reclaim(record):
            reason, message = reasons.PREEMPT_RECLAIM, messages.reclaimed(job, account)
        elif preemptor.shares_time(record):
            reason = reasons.PREEMPT_TIME_SHARING
            message = messages.stopped_for_time_sharing(job, record.attained)
        else:
            reason = reasons.PREEMPT_PRIORITY
            message = messages.preempted_for_priority(job, victim.priority_class)
        self.state.result.preemptions.append(
            Preemption(victim_id=victim.id, preemptor_id=job.id, reason=reason, message=message)
        )


def _expected_gone_by(victims: list[RunningRecord], now: float, when: float) -> bool:
    """Every victim is expected to end (its prediction, from its start) after ``now`` and
    by ``when``: waiting for them is about as fast as stopping them. A victim without a
    prediction, or already past it (it runs longer than predicted), is not expected to end
    by any time."""
    for record in victims:
        job = record.job
        expected = job.expected_runtime_seconds
        if expected <= 0:
            return False
        end = job.started_at + expected
        if end <= now or end > when:
            return False
    return True
