"""One scheduling cycle: the pending jobs in order, each placed, reserved or explained.

Every pending job is considered once, in scheduling order (see :mod:`.ordering`):

1. jobs that can never start as things are (closed queue, held, no node can ever hold
   them, bigger than their quota) are explained and get no estimate;
2. jobs behind the unplaced head of a strict-FIFO queue wait for it;
3. the others are admitted against their quota (guaranteed, or borrowed on idle GPUs) and
   placed now if GPUs are idle and taking them delays no earlier reservation;
4. a job that fits its guarantee but finds no GPUs gets a reservation on the timeline at
   its earliest start (conservative backfill: every such job is protected, the first
   blocked job of a pool being the one DESIGN.md calls "the reservation"), unless
   preempting victims gets it running sooner;
5. jobs waiting for quota (or to borrow idle GPUs) get an estimate from the same
   timeline but reserve no GPUs, unless a job whose class may preempt gets running
   sooner by stopping lower, preemptible jobs of its own tenant (see :mod:`.preemption`).

Quota held by stopping jobs counts as freed at their stop time: a job that fits once
they are gone is handled as in 4 (a borrower reserves only when that quota is all it
waits for). The GPUs and the quota of jobs stopped for a pending job stay with that job
until its turn.

A ``decisions_only`` snapshot (the simulator) stops the cycle once no job left could
start or preempt (see :mod:`.settled`): same placements and preemptions, fewer jobs
explained.

Estimates are the reservation times, computed with one query per job: an upper bound as
long as running jobs end by their limits, no more important work arrives, and the
dispatch loop hands each reservation back to the next cycle (see :mod:`.reservations`;
without that, every cycle plans afresh and greedy choices may move an estimate later).
Without backfill (the simulator's FIFO and no-backfill policies; the dispatch loop always
backfills) only the reservations of the jobs up to each pool's first blocked job are
handed on (see :meth:`.explaining.Explaining.wait`): the estimates of the jobs behind it
may move.

The planner is the orchestrator: it decides, for each job in turn, which of the cycle's
extension points to call, in this order (kube-scheduler's are alike):

- ordering (:mod:`.ordering`): the next job, and the strict-FIFO head it waits behind;
- placement (:mod:`.placing`): where the job could ever run, its earliest start, and
  taking idle GPUs now;
- reservation (:mod:`.reserving`): GPUs and quota held for a job that must wait, old
  reservations kept or given back, claims released at a job's turn;
- preemption (:mod:`.preempting`): victims stopped where that pays;
- explanation (:mod:`.explaining`): the reason, positions and estimate of every job
  that stays pending.

They share the cycle's state (:mod:`.cycle`), built from the snapshot's cluster state
and its frozen policy; none of them imports this module.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterable
from typing import Final

from . import messages, reasons
from .cluster import NodeSlot
from .cycle import CycleState, CycleView
from .explaining import Explaining
from .order import age_classes, overdue
from .ordering import Ordering
from .placing import Option, Placing, Slot, block_patience
from .preempting import Preempting
from .preemption import Preemptor, at_preemption_limit
from .quota import BORROWED, GUARANTEED
from .reserving import Reserving
from .results import Plan
from .settled import Remaining, nothing_more_can_happen
from .snapshot import PendingJob, Snapshot

INF: Final = math.inf


class Planner:
    """Plans one cycle for a snapshot; use :func:`scheduling.engine.plan`."""

    def __init__(self, snapshot: Snapshot) -> None:
        policy = snapshot.policy()
        cluster = age_classes(snapshot.cluster_state(), policy)
        self.policy = policy
        self.now = cluster.now
        self.state = state = CycleState(cluster, policy, snapshot.kept_cluster)
        self.ordering = Ordering(state)
        self.placing = placing = Placing(state)
        self.explaining = explaining = Explaining(state, placing)
        self.reserving = reserving = Reserving(state, placing)
        self.preempting = Preempting(state, reserving, explaining)
        self.view = CycleView(state)

    @property
    def result(self) -> Plan:
        """The plan, as far as the cycle has got."""
        return self.state.result

    @property
    def longest_grace(self) -> int:
        """How late victims stopped now are gone at the latest (seconds after now)."""
        return self.state.longest_grace

    @property
    def always_give_back(self) -> bool:
        """Give the holds back and take them again even where that cannot help a job:
        the plain way, which the tests compare with (see :mod:`.reserving`)."""
        return self.reserving.always_give_back

    @always_give_back.setter
    def always_give_back(self, value: bool) -> None:
        self.reserving.always_give_back = value

    @property
    def always_search(self) -> bool:
        """Search for victims even where no preemption could pay: the plain way, which
        the tests compare with (see :mod:`.preempting`)."""
        return self.preempting.always_search

    @always_search.setter
    def always_search(self, value: bool) -> None:
        self.preempting.always_search = value

    # -- the cycle ---------------------------------------------------------------------------

    def run(self) -> Plan:
        """Consider every pending job once, in order, and return the plan."""
        if self.policy.decisions_only:
            self._run_until_settled()
        else:
            for job in self.order():
                self.consider(job)
        self.explaining.estimate_past_claims()
        self.placing.label_within_guarantee()
        self._break_cycles()
        return self.state.result

    def order(self) -> Iterable[PendingJob]:
        """The pending jobs in the order they are considered (see :mod:`.ordering`)."""
        return self.ordering.order()

    def _run_until_settled(self) -> None:
        """Consider jobs in order until none of those left could start or preempt.

        The check is made before each job (it mostly re-reads the answer of the last
        one, see :mod:`.settled`), and not at all when there are at most eight jobs."""
        pending = self.state.cluster.pending
        if len(pending) <= 8:
            for job in self.order():
                self.consider(job)
            return
        remaining = Remaining(pending)
        view = self.view
        for considered, job in enumerate(self.order()):
            if nothing_more_can_happen(view, remaining):
                self.state.result.skipped = len(pending) - considered
                return
            self.consider(job)
            remaining.remove(job)

    def _break_cycles(self) -> None:
        """Node slots and running-job records point at each other; unlinking them lets
        the cycle's state be freed at once rather than by a later garbage collection."""
        kept = self.state.kept_running is not None  # a reset gives the slots' records back
        for slice_ in self.state.slices.values():
            for slot in slice_.slots:
                if not kept:
                    slot.running = []
                slot.victim_view = None

    def consider(self, job: PendingJob) -> None:
        """Place the job, or reserve for it, preempt for it, or explain why it waits."""
        self.reserving.turn(job)
        explaining = self.explaining
        queue = self.state.queues.get(job.queue_id)
        if queue is not None and not queue.open:
            explaining.wait(job, reasons.QUEUE_CLOSED, messages.queue_closed(queue.name), None)
            return
        if job.held:
            explaining.wait(job, reasons.HELD, messages.held(), None)
            return
        if job.preemptible and at_preemption_limit(job):
            job = self.placing.inside_guarantee(job)
        slices, options = self.placing.options_for(job)
        if not slices:
            known = bool(self.state.pool_slices.get(job.pool))
            message = messages.no_matching_nodes(job, known)
            explaining.wait(job, reasons.NO_MATCHING_NODES, message, None)
            return
        if not options:
            account = self.state.quotas.account(job.tenant, job.pool, slices[0].model)
            message = messages.exceeds_quota(job, account)
            explaining.wait(job, reasons.EXCEEDS_QUOTA_LIMIT, message, None)
            return
        if self.ordering.heads_known:
            found = self.ordering.head_before(queue)
            if found is not None:
                explaining.blocked_by_head(job, found[1], options, found[0])
                return
        outcome = self._schedule(job, options)
        if outcome is not None and (
            self.policy.global_fifo or (queue is not None and queue.strict_fifo)
        ):
            self.ordering.remember_head(job, queue, *outcome)

    # -- scheduling one job --------------------------------------------------------------------

    def _schedule(self, job: PendingJob, options: list[Option]) -> tuple[str, float | None] | None:
        """Place the job now, or record why it waits; returns (code, estimate) if it waits."""
        gpus, nodes, total = job.gpus_per_node, job.nodes, job.gpus
        runtime = job.max_runtime_seconds if job.max_runtime_seconds > 0 else INF
        end = self.now + runtime
        state = self.state
        floor = state.pool_floor.get(job.pool) if state.pool_floor else None
        preemptible = job.preemptible
        patience = block_patience(job, self.now)
        guaranteed: list[Option] = []
        borrowing: list[Option] = []
        # Options whose quota is held by stopping jobs: the job fits once they are gone.
        soon_guaranteed: list[Option] = []
        soon_borrowing: list[Option] = []
        for option in options:
            account = option.account
            mode = account.mode(total, preemptible)
            if mode == GUARANTEED:
                guaranteed.append(option)
            elif mode is not None:
                borrowing.append(option)
            elif account.leaving:
                mode = account.mode(total, preemptible, after_stops=True)
                if mode == GUARANTEED:
                    soon_guaranteed.append(option)
                elif mode is not None:
                    soon_borrowing.append(option)
        quota_promised = gpus_promised = False
        for option in guaranteed + borrowing if borrowing else guaranteed:
            if floor is None:
                mode = GUARANTEED if option in guaranteed else BORROWED
                if not option.account.fits_now(total, mode, end):
                    quota_promised = True
                    continue
                if state.has_previous:
                    kept = self.reserving.kept_now(job, option, end)
                    if kept is not None:
                        self._place(job, option, kept[0], mode, end, kept[1])
                        return None
                chosen = option.slice.find_now(gpus, nodes, end, patience)
                if chosen is None and state.hold_previous:
                    # GPUs held for jobs behind it (see .reservations).
                    chosen = self.reserving.start_past_holds(job, option, options, end)
                if chosen is not None:
                    self._place(job, option, chosen, mode, end)
                    return None
            gpus_promised |= option.slice.fits_ignoring_reservations(gpus, nodes)
        if not guaranteed and not soon_guaranteed and job.id in state.bounded:
            bound = self._keep_bound(
                job, options, runtime, floor, bool(borrowing or soon_borrowing)
            )
            if bound is not None:
                return bound
        if guaranteed or soon_guaranteed:
            return self._wait_for_gpus(
                job,
                guaranteed + soon_guaranteed,
                runtime,
                floor,
                quota_promised,
                gpus_promised,
                soon_guaranteed,
            )
        if borrowing or soon_borrowing:
            return self._wait_to_borrow(
                job,
                borrowing + soon_borrowing,
                runtime,
                floor,
                quota_promised,
                gpus_promised,
                soon_borrowing,
            )
        return self._wait_for_quota(job, options, runtime, floor)

    def _overdue(self, job: PendingJob) -> bool:
        """Whether the job has waited its maximum wait (see :mod:`.order`): a reservation
        it makes is then bounded (see :mod:`.reservations`)."""
        return overdue(job, self.now, self.policy)

    def _keep_bound(
        self,
        job: PendingJob,
        options: list[Option],
        runtime: float,
        floor: float | None,
        borrows: bool,
    ) -> tuple[str, float] | None:
        """A bounded job (see :mod:`.ordering`) that its guarantee does not admit now keeps
        its reservation if its GPUs and the quota are free by its start (the quota its
        tenant's own work took since is free by then); None: it is planned as any job."""
        slot = self.reserving.previous_slot(job, options, floor)
        if slot is None or slot.start <= self.now:
            return None
        reserved = self.reserving.reserve(job, slot, runtime)
        option = slot.option
        if borrows:
            code, message = reasons.WAITING_FOR_GPUS, self.explaining.gpus_message(job, option)
        else:
            code = reasons.WAITING_FOR_QUOTA
            message = self.explaining.quota_message(job, option.account, option.slice)
        self.explaining.wait(job, code, message, slot.start, reserved, True)
        return code, slot.start

    def _gang_waited_enough(self, job: PendingJob) -> bool:
        """Whether a job of several nodes has waited long enough to reserve GPUs as a
        borrower (``Snapshot.gang_borrower_reserve_seconds``; 0: never before its
        maximum wait)."""
        after = self.policy.gang_borrower_reserve_seconds
        return job.nodes > 1 and after > 0 and self.now - job.submitted_at >= after

    def _place(
        self,
        job: PendingJob,
        option: Option,
        chosen: list[NodeSlot],
        mode: str,
        end: float,
        positions: list[list[int]] | None = None,
    ) -> None:
        self.placing.place(job, option, chosen, mode, end, positions)
        self.ordering.placed(job.tenant)

    def _wait_for_gpus(
        self,
        job: PendingJob,
        options: list[Option],
        runtime: float,
        floor: float | None,
        quota_promised: bool,
        gpus_promised: bool,
        soon: list[Option],
    ) -> tuple[str, float | None] | None:
        """The job fits its guarantee (``soon``: once stopping jobs are gone) but not the
        idle GPUs: preempt, or reserve (or start, when the holds it overtook were all that
        stopped it: None)."""
        # Waiting for one block while the idle GPUs would hold it spread (topology): it
        # waits for a block, stopping nobody.
        topology = (
            self.explaining.topology_blocked(job, options, self.now + runtime)
            if job.nodes > 1
            else ""
        )
        slot = self.reserving.previous_slot(job, options, floor)
        lost = slot is None  # no reservation kept: it is planned afresh
        if slot is None:
            slot = self.placing.earliest(job, options, floor, with_positions=True)
        if self.state.hold_previous:
            # Holds of jobs it overtook stand only if they do not delay it (.reservations).
            fresh = self.reserving.give_back_holds(job, options, floor, slot, lost)
            if fresh is not None:
                slot = fresh
                if fresh.start <= self.now and not fresh.releasing:
                    option = fresh.option
                    mode = (
                        GUARANTEED
                        if option.account.mode(job.gpus, job.preemptible) == GUARANTEED
                        else BORROWED
                    )
                    chosen = option.slice.find_now(
                        job.gpus_per_node,
                        job.nodes,
                        self.now + runtime,
                        block_patience(job, self.now),
                    )
                    if chosen is not None and option.account.fits_now(
                        job.gpus, mode, self.now + runtime
                    ):
                        self._place(job, option, chosen, mode, self.now + runtime)
                        return None
        if (
            self.policy.preemption
            and not topology
            and (slot is None or not slot.releasing)
            and self.preempting.may_pay(slot)
        ):
            preemptors = [
                (option, Preemptor.under(job, option.account, True)) for option in options
            ]
            outcome = self.preempting.preempt(job, preemptors, runtime, slot)
            if outcome is None and job.time_sharing:
                outcome = self.preempting.share_time(job, preemptors, runtime, slot)
            if outcome is not None:
                return outcome
            if self.preempting.topology_skipped:
                topology = self.explaining.topology_preemption(job, options[0])
        state = self.state
        if not self.policy.backfill:
            state.pool_blocker.setdefault(job.pool, job.id)
        if slot is None:
            if not self.policy.backfill:
                state.pool_floor[job.pool] = INF
            if topology:
                self.explaining.wait(job, reasons.WAITING_FOR_TOPOLOGY, topology, None)
                return reasons.WAITING_FOR_TOPOLOGY, None
            message = self.explaining.gpus_message(job, options[0]) + self.explaining.reclaim_note(
                job, options
            )
            self.explaining.wait(job, reasons.WAITING_FOR_GPUS, message, None)
            self.explaining.note_after_claims(job, options, floor)
            return reasons.WAITING_FOR_GPUS, None
        stopping_quota = self._waits_for_stopping_quota(job, slot, soon)
        reserved = self.reserving.reserve(job, slot, runtime)
        if not self.policy.backfill:
            state.pool_floor[job.pool] = max(state.pool_floor.get(job.pool, 0.0), slot.start)
        if stopping_quota and not slot.releasing:
            code = reasons.WAITING_FOR_PREEMPTION
            message = messages.stopping_quota_wait(slot.option.account, slot.start, self.now)
        elif topology and not slot.releasing:
            code, message = reasons.WAITING_FOR_TOPOLOGY, topology
        else:
            code, message = self.explaining.gpu_wait_reason(
                job, slot, quota_promised, gpus_promised
            )
            if code == reasons.WAITING_FOR_GPUS:
                message += self.explaining.reclaim_note(job, options)
        self.explaining.wait(job, code, message, slot.start, reserved, self._overdue(job))
        return code, slot.start

    def _wait_to_borrow(
        self,
        job: PendingJob,
        options: list[Option],
        runtime: float,
        floor: float | None,
        quota_promised: bool,
        gpus_promised: bool,
        soon: list[Option],
    ) -> tuple[str, float | None]:
        """Beyond its guarantee a job only borrows idle GPUs: it reserves none, except
        GPUs being freed for it by a preemption (or a lower class it preempts), and GPUs
        it only waits to use for quota that stopping jobs of its tenant are freeing (and,
        past its maximum wait or while it waits for one topology block, the GPUs it
        waits for)."""
        topology = (
            self.explaining.topology_blocked(job, options, self.now + runtime)
            if job.nodes > 1
            else ""
        )
        found = self.placing.earliest_start(job, options, floor)
        slot = None if found is None else Slot(found[0], found[1], found[2], [], False)
        if slot is not None and (
            self.placing.uses_releasing(job, slot)
            or self._waits_for_stopping_quota(job, slot, soon)
        ):
            if not slot.positions:
                self.placing.choose_positions(job, slot)
            if slot.releasing:
                message = messages.releasing_wait(slot.start, self.now)
            else:
                message = messages.stopping_quota_wait(slot.option.account, slot.start, self.now)
            reserved = self.reserving.reserve(job, slot, runtime)
            self.explaining.wait(
                job,
                reasons.WAITING_FOR_PREEMPTION,
                message,
                slot.start,
                reserved,
                self._overdue(job),
            )
            return reasons.WAITING_FOR_PREEMPTION, slot.start
        if (
            self.policy.preemption
            and (job.can_preempt or job.time_sharing)
            and not topology
            and self.preempting.may_pay(slot)
        ):
            preemptors = [
                (option, Preemptor.under(job, option.account, False)) for option in options
            ]
            outcome = None
            if job.can_preempt:
                outcome = self.preempting.preempt(job, preemptors, runtime, slot)
            if outcome is None and job.time_sharing:
                outcome = self.preempting.share_time(job, preemptors, runtime, slot)
            if outcome is not None:
                return outcome
            if self.preempting.topology_skipped:
                topology = self.explaining.topology_preemption(job, options[0])
        if (
            slot is not None
            and not slot.releasing
            and (self._overdue(job) or self._gang_waited_enough(job) or topology)
        ):
            # Past its maximum wait a borrower reserves GPUs like guaranteed work does:
            # otherwise smaller work keeps taking the idle GPUs it waits for, and a job
            # bigger than its guarantee would never find enough of them idle at once.
            # A job of several whole nodes may reserve sooner (see Snapshot), and one
            # that waits for one topology block (the idle GPUs would hold it spread)
            # reserves inside a block, so that the block drains for it while it waits.
            if not slot.positions:
                self.placing.choose_positions(job, slot)
            reserved = self.reserving.reserve(job, slot, runtime)
            code, message = reasons.WAITING_FOR_TOPOLOGY, topology
            if not topology:
                code, message = (
                    reasons.WAITING_FOR_GPUS,
                    self.explaining.gpus_message(job, slot.option),
                )
            self.explaining.wait(job, code, message, slot.start, reserved, self._overdue(job))
            return code, slot.start
        if topology:
            code, message = reasons.WAITING_FOR_TOPOLOGY, topology
        elif gpus_promised or quota_promised:
            code = reasons.RESERVED_FOR_HIGHER_PRIORITY
            message = self.explaining.reserved_message(job, options[0], quota_promised)
        else:
            code = reasons.WAITING_FOR_QUOTA
            message = self.explaining.quota_message(job, options[0].account, options[0].slice)
        start = self.explaining.estimate_without_gpus(job, options, floor, slot)
        self.explaining.wait(job, code, message, start)
        return code, start

    def _wait_for_quota(
        self, job: PendingJob, options: list[Option], runtime: float, floor: float | None
    ) -> tuple[str, float | None]:
        """No option's quota admits the job: a job whose class may preempt stops lower,
        preemptible jobs of its own tenant to free quota (and GPUs), and a time-sharing
        job those of its class in a higher level, if that gets it running sooner;
        otherwise it waits for quota."""
        found = self.placing.earliest_start(job, options, floor)
        slot = None if found is None else Slot(found[0], found[1], found[2], [], False)
        if (
            self.policy.preemption
            and (job.can_preempt or job.time_sharing)
            and self.preempting.may_pay(slot)
        ):
            preemptors = []
            for option in options:
                account = option.account
                # Non-preemptible work must fit the guarantee; other work may borrow.
                within = account.cap(job.preemptible) == account.guaranteed
                preemptors.append((option, Preemptor.under(job, account, within)))
            outcome = None
            if job.can_preempt:
                outcome = self.preempting.preempt(job, preemptors, runtime, slot)
            if outcome is None and job.time_sharing:
                # Its tenant's own jobs of a higher level free the quota (and GPUs).
                outcome = self.preempting.share_time(job, preemptors, runtime, slot)
            if outcome is not None:
                return outcome
        account = options[0].account
        message = self.explaining.quota_message(job, account, options[0].slice)
        if slot is not None and slot.start < INF and self._overdue(job):
            # Past its maximum wait a job waiting for quota reserves GPUs and quota from
            # when both are free, like a borrower: otherwise its tenant's later work keeps
            # taking the quota its own jobs free (a job at its stop limit waits inside
            # the guarantee), and its wait has no bound.
            self.placing.choose_positions(job, slot)
            reserved = self.reserving.reserve(job, slot, runtime)
            self.explaining.wait(
                job, reasons.WAITING_FOR_QUOTA, message, slot.start, reserved, True
            )
            return reasons.WAITING_FOR_QUOTA, slot.start
        start = self.explaining.estimate_without_gpus(job, options, floor, slot)
        self.explaining.wait(job, reasons.WAITING_FOR_QUOTA, message, start)
        return reasons.WAITING_FOR_QUOTA, start

    def _waits_for_stopping_quota(self, job: PendingJob, slot: Slot, soon: list[Option]) -> bool:
        """Whether the slot's start is set by quota that stopping jobs of the tenant are
        freeing (the job fits only once they are gone, and its GPUs are ready by then)."""
        if not soon or slot.option not in soon:
            return False
        return slot.start <= slot.option.account.earliest(job.gpus, job.preemptible)


def plan(snapshot: Snapshot) -> Plan:
    """Decide what starts now, what is preempted, and why every other pending job waits.

    Pure function of the snapshot (no I/O, no clock): see DESIGN.md §6 and
    :mod:`scheduling.engine.planner` for the rules.

    The cyclic garbage collector is paused while planning: a cycle allocates some 10^5
    small, short-lived objects next to the 10^5 objects of the snapshot; with the
    collector on, full collections traverse all of them several times per cycle, which
    costs up to a third of the run. Nothing here needs collecting before the cycle
    ends, and the previous state is restored afterwards (inline rather than a
    ``contextmanager``, whose generator and frames cost a replay's short cycles about
    1 %).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return Planner(snapshot).run()
    finally:
        if was_enabled:
            gc.enable()
