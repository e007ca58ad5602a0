"""One scheduling cycle: the pending jobs in order, each placed, reserved or explained.

Every pending job is considered once, in scheduling order (see :mod:`.order`):

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
handed on (see :meth:`Planner._wait`): the estimates of the jobs behind it may move.
"""

from __future__ import annotations

import gc
import math
from bisect import bisect_left, bisect_right, insort
from collections import defaultdict
from collections.abc import Iterable
from typing import Final

from . import messages, reasons
from .cluster import Locator, NodeSlot, SliceIndex
from .order import SizeOrder, age_classes, class_order, fair_share_order, fifo_order
from .preemption import (
    Preemptor,
    RunningRecord,
    VictimChoice,
    VictimFinder,
    at_preemption_limit,
    protected_borrowers,
)
from .quota import BORROWED, GUARANTEED, Account, PlacedJob, Quotas, placed_within_guarantee
from .reservations import PreviousReservations
from .results import _SET_PENDING, PendingInfo, Placement, Plan, Preemption
from .settled import Remaining, nothing_more_can_happen
from .snapshot import PendingJob, QueueInfo, RunningJob, Snapshot

INF: Final = math.inf
_new_object: Final = object.__new__


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


class _KeptGroup:
    """The kept running jobs of one (tenant, pool, GPU model): what they count against
    its quota account in every cycle."""

    __slots__ = ("gpus", "gpu_ends", "job_ends", "records")

    def __init__(self) -> None:
        self.gpus = 0
        self.gpu_ends: list[float] = []  # sorted, one per GPU
        self.job_ends: list[float] = []  # sorted, one per job
        self.records: dict[int, RunningRecord] = {}  # id(job) -> record


class KeptRunning:
    """The running jobs kept marked on a cluster index kept between cycles
    (``KeptCluster.running``), so that a cycle's cost follows the running jobs that
    changed since the cycle before, not how many run.

    A running job is kept while each snapshot hands the very same record (the same
    ``RunningJob`` object: a caller that keeps an index hands a new record when a job
    changes, as the simulator does, and never changes one it handed), it is not stopping,
    and its end by its limit (or none) is after ``now``: its GPUs stay busy until that
    end in the slots' ``base_af`` (the state a reset gives back), its
    :class:`RunningRecord` is kept and renewed for each cycle, and what it counts against
    its quota is summed per (tenant, pool, model). Stopping jobs and jobs past their limit
    depend on ``now``: they are marked in each cycle as on a new index, after the kept
    ones. The cycle's state is then what marking every running job would give (the order
    in which jobs are marked is not part of it: the victim search and the settled check
    order or sum the records of a node slot, the quota timelines sort their ends)."""

    __slots__ = ("records", "groups", "tenants", "graces", "cycle")

    def __init__(self) -> None:
        self.records: dict[int, RunningRecord] = {}  # id(job) -> record
        self.groups: dict[tuple[str, str, str], _KeptGroup] = {}
        self.tenants: dict[str, int] = {}  # GPUs held by the tenant's kept jobs
        self.graces: dict[int, int] = {}  # grace period (at least 1 s) -> kept jobs
        self.cycle = 0

    def longest_grace(self) -> int:
        """The longest grace period of the kept jobs (1 without any)."""
        return max(self.graces, default=1)

    def update(self, planner: Planner) -> list[RunningJob]:
        """Bring the kept jobs in line with the snapshot's running jobs (the index was
        just reset to them) and count them in the planner's quota accounts and GPUs per
        tenant; returns the running jobs that are not kept, to be marked."""
        self.cycle += 1
        cycle = self.cycle
        now = planner.now
        records = self.records
        others: list[RunningJob] = []
        added: list[tuple[RunningJob, float]] = []
        seen = 0
        for job in planner.snapshot.running:
            record = job.kept  # the record kept for it (ours if kept_by says so)
            if record is None or record.kept_by is not self:
                record = records.get(id(job))
                if record is not None and record.job is not job:
                    record = None
            if record is not None:
                # Kept: not stopping and the same end as when it was added (a record
                # handed is never changed), so only its end is compared with now.
                if record.mark != cycle and record.base_end > now:
                    record.mark = cycle
                    seen += 1
                else:
                    others.append(job)  # past its limit, or handed twice
                continue
            if job.stopping:
                others.append(job)
                continue
            limit = job.max_runtime_seconds
            end = job.started_at + limit if limit > 0 else INF
            if end <= now:
                others.append(job)  # past its limit: stopped with its grace from now
                continue
            added.append((job, end))
        if seen < len(records):
            gone = [record for record in records.values() if record.mark != cycle]
            for record in gone:
                self._drop(record, now)
        placement_of = planner._locator.placement
        for job, end in added:
            self._add(job, end, now, placement_of)
        account_of = planner.quotas.account
        gain = planner.snapshot.preemption_min_gain_seconds
        for key, group in self.groups.items():
            account = account_of(key[0], key[1], key[2])
            account.add_kept(group.gpus, len(group.records), group.gpu_ends, group.job_ends)
            for record in group.records.values():
                record.renew(now, account, gain)
        running_gpus = planner.running_gpus
        for tenant, gpus in self.tenants.items():
            running_gpus[tenant] += gpus
        return others

    def _add(self, job: RunningJob, end: float, now: float, placement_of) -> None:
        record = RunningRecord(job, end, now)
        record.mark = self.cycle
        record.kept_by = self
        job.kept = record
        record.placement = placement = placement_of(job, job.gpu_ids)
        for _, slot, positions in placement:
            base_af, af = slot.base_af, slot.af
            for pos in positions:
                base_af[pos] = end
                af[pos] = end
            slot.base_running.append(record)
            slot.running.append(record)
            slot.base_idle = None
            slot.touched = True
            slot.state = None
        key = (job.tenant, job.pool, job.gpu_model)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _KeptGroup()
        gpus = record.gpus
        group.gpus += gpus
        at = bisect_right(group.gpu_ends, end)
        group.gpu_ends[at:at] = [end] * gpus
        insort(group.job_ends, end)
        group.records[id(job)] = record
        self.records[id(job)] = record
        self.tenants[job.tenant] = self.tenants.get(job.tenant, 0) + gpus
        grace = max(job.grace_seconds, 1)
        self.graces[grace] = self.graces.get(grace, 0) + 1

    def _drop(self, record: RunningRecord, now: float) -> None:
        job = record.job
        record.kept_by = None
        for _, slot, positions in record.placement:
            base_af, af = slot.base_af, slot.af
            for pos in positions:
                base_af[pos] = -INF
                af[pos] = now
            slot.base_running.remove(record)
            slot.running.remove(record)
            slot.base_idle = None
            slot.touched = True
            slot.state = None
        key = (job.tenant, job.pool, job.gpu_model)
        group = self.groups[key]
        end, gpus = record.base_end, record.gpus
        group.gpus -= gpus
        at = bisect_left(group.gpu_ends, end)
        del group.gpu_ends[at : at + gpus]
        del group.job_ends[bisect_left(group.job_ends, end)]
        del group.records[id(job)]
        if not group.records:
            del self.groups[key]
        del self.records[id(job)]
        left = self.tenants[job.tenant] - gpus
        if left:
            self.tenants[job.tenant] = left
        else:
            del self.tenants[job.tenant]
        grace = max(job.grace_seconds, 1)
        count = self.graces[grace] - 1
        if count:
            self.graces[grace] = count
        else:
            del self.graces[grace]


class Planner:
    """Plans one cycle for a snapshot; use :func:`scheduling.engine.plan`."""

    def __init__(self, snapshot: Snapshot) -> None:
        snapshot = age_classes(snapshot)
        self.snapshot = snapshot
        self.now = snapshot.now
        self.result = Plan()
        self.queues: dict[int, QueueInfo] = {queue.id: queue for queue in snapshot.queues}
        self.quotas = Quotas(snapshot.quotas, self.now)
        self.running_gpus: dict[str, int] = defaultdict(int)
        self.slices: dict[tuple[str, str, int], SliceIndex] = {}
        self.pool_slices: dict[str, list[SliceIndex]] = defaultdict(list)
        self._locator = Locator()
        self._kept_running: KeptRunning | None = None  # see _build_cluster
        # Stopping jobs preempted for a pending job: their GPUs and their quota wait for
        # that job (every such job has an entry in _claims, if only an empty one).
        # Each claim: (slice, slot, positions, free from, "releasing" mark once released).
        self._claims: dict[int, list[tuple[SliceIndex, NodeSlot, list[int], float, bool]]] = {}
        self._quota_claims: dict[int, list[tuple[Account, int, float]]] = {}
        # GPU ids claimed for a pending job (its stopping victims', those it was handed
        # back): the part of its reservation it reports as claimed for the next cycle.
        self._claimed_ids: dict[int, set[int]] = {}
        # Jobs that found no start because GPUs are kept for a job ordered after them
        # (busy without end until that job's turn): their estimates are worked out once
        # every job has been considered (see _estimate_past_claims), with the jobs the
        # GPUs are kept for (for the message).
        self._after_claims: list[tuple[PendingJob, list[Option], float | None, list[int]]] = []
        self._class: int | None = None  # priority class being considered
        self._shares: dict[str, float] = {}  # fair share per tenant, kept current
        self._queue_positions: dict[int, int] = defaultdict(int)
        self._pool_positions: dict[str, int] = defaultdict(int)
        self._shape_cache: dict[tuple, list[SliceIndex]] = {}
        self._option_cache: dict[tuple, tuple[list[SliceIndex], list[Option]]] = {}
        self._message_cache: dict[tuple, str] = {}
        self._victims = VictimFinder(self.now)
        self._hopeless: set[tuple] = set()  # preemption searches known to fail
        self._placed: list[PlacedJob] = []  # see _label_within_guarantee
        # Victims stopped now are gone by now + their grace: this is the latest they can
        # be gone, and a preemptor whose quota is not due by then stops nobody (set by
        # _build_running).
        self.longest_grace = 1
        self._queue_heads: dict[int, tuple[int, str, float]] = {}
        self._fifo_head: tuple[int, str, float] | None = None
        self._heads_known = False  # any strict-FIFO head recorded yet
        self._pool_floor: dict[str, float] = {}  # no-backfill pools: nothing starts before
        self._pool_blocker: dict[str, int] = {}
        # Give the holds back and take them again even where that cannot help a job
        # (see _holds_cannot_help): the plain way, which the tests compare with.
        self.always_give_back = False
        # Search for victims even where no preemption could pay (see
        # _preemption_may_pay): the plain way, which the tests compare with.
        self.always_search = False
        self._build_cluster()
        self._build_running()
        self._build_claims()
        for slice_ in self.slices.values():
            slice_.build()
        self._previous = PreviousReservations(snapshot.pending, self._locator, self.now)
        self._has_previous = bool(self._previous)
        # Without backfill jobs start strictly in order, the pool's first blocked job
        # holding back everything behind it: GPUs held for a later job's old reservation
        # would only delay the jobs before it, the first blocked one, and with it the
        # whole pool. A job still gets its old reservation back at its turn if free;
        # only the jobs up to the pool's first blocked job (and those for which a
        # preemption keeps GPUs) have one handed on (see _wait).
        self._hold_previous = self._has_previous and snapshot.backfill
        if snapshot.global_fifo and self._hold_previous:
            self._previous.hold_class(None)  # one queue: no class may ignore a hold

    # -- building the cycle's state ---------------------------------------------------------

    def _build_cluster(self) -> None:
        """Group every node's GPUs into slices (pool, model, memory), or reset the index
        the caller keeps between cycles (see :class:`.cluster.KeptCluster`)."""
        now = self.now
        kept = self.snapshot.kept_cluster
        if kept is not None and kept.reuse(self.snapshot.nodes, now):
            self.slices = kept.slices
            self.pool_slices = kept.pool_slices
            self._locator = kept.locator
            self._kept_running = kept.running
            return
        for node in self.snapshot.nodes:
            for model, memory, gpu_ids in node.kinds():
                key = (node.pool, model, memory)
                slice_ = self.slices.get(key)
                if slice_ is None:
                    slice_ = self.slices[key] = SliceIndex(node.pool, model, memory, now)
                    self.pool_slices[node.pool].append(slice_)
                self._locator.add(slice_, slice_.add_slot(node.id, node.name, gpu_ids))
        if kept is not None:
            kept.keep(self.snapshot.nodes, self.slices, self.pool_slices, self._locator)
            kept.running = self._kept_running = KeptRunning()

    def _end_of(self, job: RunningJob) -> float:
        """When a running job's GPUs are free at the latest (always after now)."""
        grace = max(job.grace_seconds, 1)
        if job.stopping:
            return self.now + grace
        if job.max_runtime_seconds <= 0:
            return INF
        end = job.started_at + job.max_runtime_seconds
        # Past its limit: the runtime control stops it with its grace period.
        return end if end > self.now else self.now + grace

    def _build_running(self) -> None:
        """Mark the GPUs of running jobs busy until their end, count them against their
        tenant's quota, and keep the GPUs and the quota of jobs stopped for a pending job
        for it. On a kept cluster index the running jobs that stay the same from one
        cycle to the next are kept marked (see :class:`KeptRunning`): only the others
        are marked here."""
        kept = self._kept_running
        if kept is None:
            running: list[RunningJob] = self.snapshot.running
            self.longest_grace = max(
                (max(job.grace_seconds, 1) for job in running if not job.stopping), default=1
            )
        else:
            running = kept.update(self)
            # Jobs stopping already are nobody's victims (as above): not counted.
            self.longest_grace = max(
                [
                    kept.longest_grace(),
                    *(max(job.grace_seconds, 1) for job in running if not job.stopping),
                ]
            )
        self._mark_running(running)

    def _mark_running(self, running: list[RunningJob]) -> None:
        pending_ids: set[int] | None = None  # worked out for the first stopping job only
        now = self.now
        account_of = self.quotas.account
        placement_of = self._locator.placement
        running_gpus = self.running_gpus
        gain = self.snapshot.preemption_min_gain_seconds
        for job in running:
            if job.stopping or job.max_runtime_seconds <= 0:
                end = self._end_of(job)
            else:  # the common case of _end_of, inline
                end = job.started_at + job.max_runtime_seconds
                if end <= now:
                    end = now + max(job.grace_seconds, 1)
            # A stopping job preempted for a pending job: its GPUs and quota are claimed.
            claimant = job.preempted_by if job.stopping else None
            if claimant is not None:
                if pending_ids is None:
                    pending_ids = {waiting.id for waiting in self.snapshot.pending}
                if claimant not in pending_ids:
                    claimant = None
            account = account_of(job.tenant, job.pool, job.gpu_model)
            if claimant is not None:
                account.add_running(len(job.gpu_ids), INF)
                self._claims.setdefault(claimant, [])
                self._claimed_ids.setdefault(claimant, set()).update(job.gpu_ids)
                self._quota_claims.setdefault(claimant, []).append((account, len(job.gpu_ids), end))
            else:
                account.add_running(len(job.gpu_ids), end, job.stopping)
            record = RunningRecord(job, end, now, account, gain)
            running_gpus[job.tenant] += len(job.gpu_ids)
            busy_until = INF if claimant is not None else end
            stopping = job.stopping
            # GPUs not in the index (unhealthy, node out of service) are left out: they
            # are not schedulable anyway.
            record.placement = placement = placement_of(job, job.gpu_ids)
            for slice_, slot, positions in placement:
                af = slot.af
                releasing = slot.releasing
                for pos in positions:
                    af[pos] = busy_until
                    releasing[pos] = stopping
                slot.running.append(record)
                slot.touched = True
                slot.state = None
                if claimant is not None:
                    self._claims[claimant].append((slice_, slot, positions, end, True))

    def _build_claims(self) -> None:
        """Keep the idle GPUs that victims freed for a pending job (handed back as its
        ``claimed_gpu_ids``) for that job until its turn, like those still stopping.

        A GPU someone else holds now is not claimed (the claim is stale); at the job's
        turn its claimed GPUs are idle again, without the "releasing" mark, so that a job
        that still cannot start on them reports its real reason and drops the claim."""
        now = self.now
        for job in self.snapshot.pending:
            if not job.claimed_gpu_ids:
                continue
            by_slot: dict[int, tuple[SliceIndex, NodeSlot, list[int]]] = {}
            for gpu_id in job.claimed_gpu_ids:
                location = self._locator.locate(gpu_id)
                if location is None:
                    continue
                slice_, slot, pos = location
                if slot.af[pos] > now:
                    continue  # busy, or already claimed (by a stopping victim or a job)
                slot.af[pos] = INF
                slot.touched = True
                slot.state = None
                by_slot.setdefault(id(slot), (slice_, slot, []))[2].append(pos)
            if not by_slot:
                continue
            claims = self._claims.setdefault(job.id, [])
            self._quota_claims.setdefault(job.id, [])
            ids = self._claimed_ids.setdefault(job.id, set())
            for slice_, slot, positions in by_slot.values():
                claims.append((slice_, slot, positions, now, False))
                ids.update(slot.gpu_ids[pos] for pos in positions)

    # -- the cycle ---------------------------------------------------------------------------

    def run(self) -> Plan:
        """Consider every pending job once, in order, and return the plan."""
        if self.snapshot.decisions_only:
            self._run_until_settled()
        else:
            for job in self._order():
                self._consider(job)
        if self._after_claims:
            self._estimate_past_claims()
        if self._placed:
            self._label_within_guarantee()
        self._break_cycles()
        return self.result

    def _label_within_guarantee(self) -> None:
        """Jobs placed as borrowed that fit their tenant's guarantee start on it (see
        :func:`.quota.placed_within_guarantee`): labelled so, they are not reclaimable
        from their first cycle on (the labels only matter from the next cycle: nothing
        placed in this one is a victim in it)."""
        inside = placed_within_guarantee(self.snapshot.running, self._placed, self.snapshot.quotas)
        if not inside:
            return
        ids = set(inside)
        self.result.placements = [
            Placement(p.job_id, p.gpu_ids, p.node_ids, False, p.gpu_model) if p.job_id in ids else p
            for p in self.result.placements
        ]

    def _run_until_settled(self) -> None:
        """Consider jobs in order until none of those left could start or preempt.

        The check is made before each job (it mostly re-reads the answer of the last
        one, see :mod:`.settled`), and not at all when there are at most eight jobs."""
        pending = self.snapshot.pending
        if len(pending) <= 8:
            for job in self._order():
                self._consider(job)
            return
        remaining = Remaining(pending)
        for considered, job in enumerate(self._order()):
            if nothing_more_can_happen(self, remaining):
                self.result.skipped = len(pending) - considered
                return
            self._consider(job)
            remaining.remove(job)

    def _break_cycles(self) -> None:
        """Node slots and running-job records point at each other; unlinking them lets
        the cycle's state be freed at once rather than by a later garbage collection."""
        kept = self._kept_running is not None  # a reset gives the slots' records back
        for slice_ in self.slices.values():
            for slot in slice_.slots:
                if not kept:
                    slot.running = []
                slot.victim_view = None

    def _order(self) -> Iterable[PendingJob]:
        snapshot = self.snapshot
        if snapshot.global_fifo:
            return fifo_order(snapshot.pending)
        sizes = SizeOrder(snapshot) if snapshot.size_order else None
        if snapshot.fair_share:
            tenants = {job.tenant for job in snapshot.pending}
            self._shares = {tenant: self._share(tenant) for tenant in tenants}
            return fair_share_order(snapshot.pending, self._shares, sizes, snapshot.fair_share_band)
        return class_order(snapshot.pending, sizes)

    def _share(self, tenant: str) -> float:
        """Weighted fair share: usage history plus GPUs held now, per guaranteed GPU."""
        usage = self.snapshot.usage.get(tenant, 0.0) + self.running_gpus.get(tenant, 0)
        return usage / max(1, self.quotas.guaranteed_total.get(tenant, 0))

    def _consider(self, job: PendingJob) -> None:
        if self._claims:
            self._release_claims(job.id)
        if self._hold_previous:
            if job.priority != self._class and not self.snapshot.global_fifo:
                self._class = job.priority
                self._previous.hold_class(job.priority)
            self._previous.turn(job.id)
        queue = self.queues.get(job.queue_id)
        if queue is not None and not queue.open:
            self._wait(job, reasons.QUEUE_CLOSED, messages.queue_closed(queue.name), None)
            return
        if job.held:
            self._wait(job, reasons.HELD, messages.held(), None)
            return
        if job.preemptible and at_preemption_limit(job):
            job = self._inside_guarantee(job)
        slices, options = self._options_for(job)
        if not slices:
            known = bool(self.pool_slices.get(job.pool))
            message = messages.no_matching_nodes(job, known)
            self._wait(job, reasons.NO_MATCHING_NODES, message, None)
            return
        if not options:
            account = self.quotas.account(job.tenant, job.pool, slices[0].model)
            message = messages.exceeds_quota(job, account)
            self._wait(job, reasons.EXCEEDS_QUOTA_LIMIT, message, None)
            return
        if (
            self._heads_known
            and (
                self._fifo_head is not None or (queue is not None and queue.id in self._queue_heads)
            )
            and self._blocked_by_head(job, queue, options)
        ):
            return
        outcome = self._schedule(job, options)
        if outcome is not None and (
            self.snapshot.global_fifo or (queue is not None and queue.strict_fifo)
        ):
            self._remember_head(job, queue, *outcome)

    def _wait(
        self,
        job: PendingJob,
        code: str,
        message: str,
        start: float | None,
        reserved: tuple[int, ...] = (),
    ) -> None:
        """Record why ``job`` stays pending. Jobs are recorded in scheduling order, so the
        positions are counted among the jobs that stay pending as they come."""
        if start == INF:
            start = None
        claimed: tuple[int, ...] = ()
        if reserved and code == reasons.WAITING_FOR_PREEMPTION and self._claimed_ids:
            mine = self._claimed_ids.get(job.id)
            if mine:
                claimed = tuple(gpu_id for gpu_id in reserved if gpu_id in mine)
        queue_id, pool, job_id = job.queue_id, job.pool, job.id  # read once (uncompiled record)
        if (
            reserved
            and self._pool_blocker
            and self._pool_blocker.get(pool, job_id) != job_id
            and job_id not in self._claimed_ids
        ):
            # Without backfill the jobs behind the pool's first blocked job start after
            # it, so their reservations only make their estimates: they are not handed
            # on to the next cycle, which plans them afresh (unless a preemption keeps
            # GPUs for the job: those jobs are considered in every cycle until their
            # turn, see .settled). That keeps a cycle that stops early behind the
            # blocked job exactly like a full one, what it hands on included.
            reserved = ()
        queue_position = self._queue_positions.get(queue_id, 0) + 1
        self._queue_positions[queue_id] = queue_position
        pool_position = self._pool_positions.get(pool, 0) + 1
        self._pool_positions[pool] = pool_position
        self.result.pending[job_id] = _pending_info(
            job_id, code, message, queue_position, pool_position, start, reserved, claimed
        )

    # -- what could ever run the job ----------------------------------------------------------

    def _inside_guarantee(self, job: PendingJob) -> PendingJob:
        """A job at its preemption limit, admitted like non-preemptible work: inside its
        tenant's guarantee, where no reclaim stops it again, unless no guarantee of the
        tenant could ever hold it (then it may still borrow; see :mod:`.preemption`)."""
        inside = job.not_preemptible()
        return inside if self._options_for(inside)[1] else job

    def _options_for(self, job: PendingJob) -> tuple[list[SliceIndex], list[Option]]:
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
                account = self.quotas.account(job.tenant, slice_.pool, slice_.model)
                if account.could_ever_fit(job.gpus, job.preemptible):
                    options.append(Option(slice_, account))
            cached = self._option_cache[key] = (slices, options)
        return cached

    def _slices_for(self, job: PendingJob) -> list[SliceIndex]:
        found = []
        if job.gpus_per_node >= 1 and job.nodes >= 1:
            wanted = {model: rank for rank, model in enumerate(job.gpu_models)}
            for slice_ in self.pool_slices.get(job.pool, ()):
                if wanted and slice_.model not in wanted:
                    continue
                if slice_.memory_mb < job.min_gpu_memory_mb:
                    continue
                if slice_.nodes_with_at_least(job.gpus_per_node) < job.nodes:
                    continue
                found.append((wanted.get(slice_.model, 0), slice_.model, slice_.memory_mb, slice_))
        found.sort(key=lambda item: item[:3])
        return [item[3] for item in found]

    # -- strict FIFO ------------------------------------------------------------------------

    def _blocked_by_head(
        self, job: PendingJob, queue: QueueInfo | None, options: list[Option]
    ) -> bool:
        head = self._fifo_head if self.snapshot.global_fifo else None
        if head is not None:
            message = messages.fifo_head(head[0], head[1])
        elif queue is not None and queue.strict_fifo and queue.id in self._queue_heads:
            head = self._queue_heads[queue.id]
            message = messages.queue_head(queue.name, head[0], head[1])
        else:
            return False
        start = self._estimate_without_gpus(job, options, head[2])
        self._wait(job, reasons.BLOCKED_BY_QUEUE_HEAD, message, start)
        return True

    def _remember_head(
        self, job: PendingJob, queue: QueueInfo | None, code: str, start: float | None
    ) -> None:
        """An unplaced job that could run blocks the rest of a strict-FIFO queue."""
        floor = INF if start is None else start
        if self.snapshot.global_fifo and self._fifo_head is None:
            self._fifo_head = (job.id, code, floor)
            self._heads_known = True
        if queue is not None and queue.strict_fifo and queue.id not in self._queue_heads:
            self._queue_heads[queue.id] = (job.id, code, floor)
            self._heads_known = True

    # -- scheduling one job --------------------------------------------------------------------

    def _schedule(self, job: PendingJob, options: list[Option]) -> tuple[str, float | None] | None:
        """Place the job now, or record why it waits; returns (code, estimate) if it waits."""
        gpus, nodes, total = job.gpus_per_node, job.nodes, job.gpus
        runtime = job.max_runtime_seconds if job.max_runtime_seconds > 0 else INF
        end = self.now + runtime
        floor = self._pool_floor.get(job.pool) if self._pool_floor else None
        preemptible = job.preemptible
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
                if self._has_previous:
                    previous = self._previous.usable_now(job, option.slice, end)
                    if previous is not None:
                        self._place(job, option, previous[0], mode, end, previous[1])
                        return None
                chosen = option.slice.find_now(gpus, nodes, end)
                if (
                    chosen is None
                    and self._hold_previous
                    and self._previous.holds_in(job.pool)
                    and option.slice.fits_ignoring_reservations(gpus, nodes)
                ):
                    # GPUs held for jobs behind it (see .reservations).
                    own_start = self._own_start(job, options)
                    if not self._previous.idle_held and not self.always_give_back:
                        # Given back, a held GPU is idle now only if it was idle before
                        # the hold: without any, giving them back cannot make room now.
                        self._previous.release_and_rehold(job, own_start)
                    else:
                        released = self._previous.release_for(job, own_start)
                        if released:
                            chosen = option.slice.find_now(gpus, nodes, end)
                            if chosen is None:
                                self._previous.rehold(released)
                if chosen is not None:
                    self._place(job, option, chosen, mode, end)
                    return None
            gpus_promised |= option.slice.fits_ignoring_reservations(gpus, nodes)
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
        """Whether the job has waited its maximum wait (see :mod:`.order`)."""
        snapshot = self.snapshot
        if not snapshot.size_order:
            return False
        limit = job.max_wait_seconds if job.max_wait_seconds > 0 else snapshot.max_wait_seconds
        return limit > 0 and self.now - job.submitted_at >= limit

    def _gang_waited_enough(self, job: PendingJob) -> bool:
        """Whether a job of several nodes has waited long enough to reserve GPUs as a
        borrower (``Snapshot.gang_borrower_reserve_seconds``; 0: never before its
        maximum wait)."""
        after = self.snapshot.gang_borrower_reserve_seconds
        return job.nodes > 1 and after > 0 and self.now - job.submitted_at >= after

    def _own_start(self, job: PendingJob, options: list[Option]) -> float:
        """When the job would start with the holds in place: its kept reservation's
        start, else its earliest start now."""
        if job.reserved_gpu_ids and job.reserved_start is not None:
            return job.reserved_start
        found = self._earliest_start(job, options, None)
        return INF if found is None else found[0]

    def _place(
        self,
        job: PendingJob,
        option: Option,
        chosen: list[NodeSlot],
        mode: str,
        end: float,
        positions: list[list[int]] | None = None,
    ) -> None:
        gpu_ids: list[int] = []
        for number, slot in enumerate(chosen):
            wanted = positions[number] if positions is not None else None
            taken = option.slice.take_now(slot, job.gpus_per_node, end, wanted)
            gpu_ids.extend(slot.gpu_ids[pos] for pos in taken)
        option.account.start(job.gpus, end)
        borrowed = mode == BORROWED
        self._placed.append((job.id, job.tenant, job.pool, option.slice.model, job.gpus, borrowed))
        self.running_gpus[job.tenant] += job.gpus
        if job.tenant in self._shares:
            self._shares[job.tenant] = self._share(job.tenant)
        self.result.placements.append(
            Placement(
                job_id=job.id,
                gpu_ids=tuple(gpu_ids),
                node_ids=tuple(slot.node_id for slot in chosen),
                borrowed=borrowed,
                gpu_model=option.slice.model,
            )
        )

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
        slot = self._previous_slot(job, options, floor)
        lost = slot is None  # no reservation kept: it is planned afresh
        if slot is None:
            slot = self._earliest(job, options, floor, with_positions=True)
        if self._hold_previous and self._previous.holds_in(job.pool):
            if self._holds_cannot_help(job, options, floor, slot, lost):
                self._previous.release_and_rehold(job, everyone=lost)
            else:
                # Holds of jobs it overtook stand only if they do not delay it (.reservations).
                released = self._previous.release_for(job, everyone=lost)
                if released:
                    fresh = self._earliest(job, options, floor, with_positions=True)
                    if fresh is not None and (slot is None or fresh.start < slot.start):
                        slot = fresh
                        if fresh.start <= self.now and not fresh.releasing:
                            option = fresh.option
                            mode = (
                                GUARANTEED
                                if option.account.mode(job.gpus, job.preemptible) == GUARANTEED
                                else BORROWED
                            )
                            chosen = option.slice.find_now(
                                job.gpus_per_node, job.nodes, self.now + runtime
                            )
                            if chosen is not None and option.account.fits_now(
                                job.gpus, mode, self.now + runtime
                            ):
                                self._place(job, option, chosen, mode, self.now + runtime)
                                return None
                    else:
                        self._previous.rehold(released)
        if (
            self.snapshot.preemption
            and (slot is None or not slot.releasing)
            and self._preemption_may_pay(slot)
        ):
            preemptors = [
                (option, Preemptor.under(job, option.account, True)) for option in options
            ]
            outcome = self._preempt(job, preemptors, runtime, slot)
            if outcome is not None:
                return outcome
        if not self.snapshot.backfill:
            self._pool_blocker.setdefault(job.pool, job.id)
        if slot is None:
            if not self.snapshot.backfill:
                self._pool_floor[job.pool] = INF
            message = self._gpus_message(job, options[0]) + self._reclaim_note(job, options)
            self._wait(job, reasons.WAITING_FOR_GPUS, message, None)
            if self._claims:
                claimants = self._claimants_in_the_way(job, options)
                if claimants:
                    self._after_claims.append((job, options, floor, claimants))
            return reasons.WAITING_FOR_GPUS, None
        stopping_quota = self._waits_for_stopping_quota(job, slot, soon)
        reserved = self._reserve(job, slot, runtime)
        if not self.snapshot.backfill:
            self._pool_floor[job.pool] = max(self._pool_floor.get(job.pool, 0.0), slot.start)
        if stopping_quota and not slot.releasing:
            code = reasons.WAITING_FOR_PREEMPTION
            message = messages.stopping_quota_wait(slot.option.account, slot.start, self.now)
        else:
            code, message = self._gpu_wait_reason(job, slot, quota_promised, gpus_promised)
            if code == reasons.WAITING_FOR_GPUS:
                message += self._reclaim_note(job, options)
        self._wait(job, code, message, slot.start, reserved)
        return code, slot.start

    def _reclaim_note(self, job: PendingJob, options: list[Option]) -> str:
        """For a job inside its guarantee that found no victims: the borrowers of other
        tenants that no reclaim stops, being at their stop limit ("" if none)."""
        if not self.snapshot.preemption:
            return ""
        found: set[int] = set()
        for option in options:
            found.update(protected_borrowers(option.slice, job.tenant))
        if not found:
            return ""
        return "; " + messages.protected_borrowers(sorted(found))

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
            or slot.start > self._previous.earliest_release(job.pool)
        ):
            return False
        if lost:
            return True  # slot is the earliest start without giving anything back
        found = self._earliest_start(job, options, floor)
        return found is None or found[0] >= slot.start

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
        it only waits to use for quota that stopping jobs of its tenant are freeing."""
        found = self._earliest_start(job, options, floor)
        slot = None if found is None else Slot(found[0], found[1], found[2], [], False)
        if slot is not None and (
            self._uses_releasing(job, slot) or self._waits_for_stopping_quota(job, slot, soon)
        ):
            if not slot.positions:
                self._choose_positions(job, slot)
            if slot.releasing:
                message = messages.releasing_wait(slot.start, self.now)
            else:
                message = messages.stopping_quota_wait(slot.option.account, slot.start, self.now)
            reserved = self._reserve(job, slot, runtime)
            self._wait(job, reasons.WAITING_FOR_PREEMPTION, message, slot.start, reserved)
            return reasons.WAITING_FOR_PREEMPTION, slot.start
        if self.snapshot.preemption and job.can_preempt and self._preemption_may_pay(slot):
            preemptors = [
                (option, Preemptor.under(job, option.account, False)) for option in options
            ]
            outcome = self._preempt(job, preemptors, runtime, slot)
            if outcome is not None:
                return outcome
        if (
            slot is not None
            and not slot.releasing
            and (self._overdue(job) or self._gang_waited_enough(job))
        ):
            # Past its maximum wait a borrower reserves GPUs like guaranteed work does:
            # otherwise smaller work keeps taking the idle GPUs it waits for, and a job
            # bigger than its guarantee would never find enough of them idle at once.
            # A job of several whole nodes may reserve sooner (see Snapshot).
            if not slot.positions:
                self._choose_positions(job, slot)
            reserved = self._reserve(job, slot, runtime)
            message = self._gpus_message(job, slot.option)
            self._wait(job, reasons.WAITING_FOR_GPUS, message, slot.start, reserved)
            return reasons.WAITING_FOR_GPUS, slot.start
        if gpus_promised or quota_promised:
            code = reasons.RESERVED_FOR_HIGHER_PRIORITY
            message = self._reserved_message(job, options[0], quota_promised)
        else:
            code = reasons.WAITING_FOR_QUOTA
            message = self._quota_message(job, options[0].account, options[0].slice)
        start = self._estimate_without_gpus(job, options, floor, slot)
        self._wait(job, code, message, start)
        return code, start

    def _wait_for_quota(
        self, job: PendingJob, options: list[Option], runtime: float, floor: float | None
    ) -> tuple[str, float | None]:
        """No option's quota admits the job: a job whose class may preempt stops lower,
        preemptible jobs of its own tenant to free quota (and GPUs), if that gets it
        running sooner; otherwise it waits for quota."""
        found = self._earliest_start(job, options, floor)
        slot = None if found is None else Slot(found[0], found[1], found[2], [], False)
        if self.snapshot.preemption and job.can_preempt and self._preemption_may_pay(slot):
            preemptors = []
            for option in options:
                account = option.account
                # Non-preemptible work must fit the guarantee; other work may borrow.
                within = account.cap(job.preemptible) == account.guaranteed
                preemptors.append((option, Preemptor.under(job, account, within)))
            outcome = self._preempt(job, preemptors, runtime, slot)
            if outcome is not None:
                return outcome
        account = options[0].account
        message = self._quota_message(job, account, options[0].slice)
        start = self._estimate_without_gpus(job, options, floor, slot)
        self._wait(job, reasons.WAITING_FOR_QUOTA, message, start)
        return reasons.WAITING_FOR_QUOTA, start

    def _waits_for_stopping_quota(self, job: PendingJob, slot: Slot, soon: list[Option]) -> bool:
        """Whether the slot's start is set by quota that stopping jobs of the tenant are
        freeing (the job fits only once they are gone, and its GPUs are ready by then)."""
        if not soon or slot.option not in soon:
            return False
        return slot.start <= slot.option.account.earliest(job.gpus, job.preemptible)

    def _gpu_wait_reason(
        self, job: PendingJob, slot: Slot, quota_promised: bool, gpus_promised: bool
    ) -> tuple[str, str]:
        if slot.releasing:
            return reasons.WAITING_FOR_PREEMPTION, messages.releasing_wait(slot.start, self.now)
        if gpus_promised or quota_promised:
            message = self._reserved_message(job, slot.option, quota_promised)
            return reasons.RESERVED_FOR_HIGHER_PRIORITY, message
        return reasons.WAITING_FOR_GPUS, self._gpus_message(job, slot.option)

    # Messages are cached: thousands of waiting jobs share a few situations, and building
    # each string again is a noticeable part of a cycle.

    def _quota_message(self, job: PendingJob, account: Account, slice_: SliceIndex) -> str:
        key = (
            id(account),
            account.used,
            account.jobs,
            slice_.idle,
            job.gpus,
            job.preemptible,
            at_preemption_limit(job),
        )
        message = self._message_cache.get(key)
        if message is None:
            message = messages.quota_wait(job, account, slice_.idle)
            self._message_cache[key] = message
        return message

    def _reserved_message(self, job: PendingJob, option: Option, quota_promised: bool) -> str:
        blocker = self._pool_blocker.get(job.pool)
        if not self.snapshot.backfill and blocker is not None and blocker != job.id:
            return messages.pool_blocked(job, blocker)
        if quota_promised:
            return messages.reserved_quota(option.account)
        owners = option.slice.hole_owners
        key = (job.pool, owners[0] if owners else None)
        message = self._message_cache.get(key)
        if message is None:
            message = messages.reserved_gpus(job, owners, self.now)
            self._message_cache[key] = message
        return message

    def _gpus_message(self, job: PendingJob, option: Option) -> str:
        slice_ = option.slice
        return messages.gpus_wait(job, slice_.model, slice_.idle, slice_.largest_idle_block())

    # -- the timeline -----------------------------------------------------------------------

    def _earliest(
        self, job: PendingJob, options: list[Option], floor: float | None, with_positions: bool
    ) -> Slot | None:
        """The earliest start over the job's options (GPUs and quota), or None if never."""
        found = self._earliest_start(job, options, floor)
        if found is None:
            return None
        slot = Slot(found[0], found[1], found[2], [], False)
        if with_positions:
            self._choose_positions(job, slot)
        return slot

    def _earliest_start(
        self, job: PendingJob, options: list[Option], floor: float | None
    ) -> tuple[float, Option, list[NodeSlot]] | None:
        """(start, option, node slots) of the job's earliest start, or None if never."""
        best = None
        best_start = INF
        lowest = self.now if floor is None else floor
        gpus, nodes = job.gpus_per_node, job.nodes
        total, preemptible = gpus * nodes, job.preemptible
        for option in options:
            found = option.slice.earliest(gpus, nodes)
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

    def _choose_positions(self, job: PendingJob, slot: Slot) -> None:
        slice_ = slot.option.slice
        for node in slot.nodes:
            positions = slice_.choose_reserved(node, job.gpus_per_node, slot.start)
            slot.positions.append(positions)
            slot.releasing |= any(node.releasing[pos] for pos in positions)

    def _uses_releasing(self, job: PendingJob, slot: Slot) -> bool:
        """Whether the slot relies on GPUs of stopping jobs (positions chosen if so)."""
        if not any(True in node.releasing for node in slot.nodes):
            return False
        if not slot.positions:
            self._choose_positions(job, slot)
        return slot.releasing

    def _previous_slot(
        self, job: PendingJob, options: list[Option], floor: float | None
    ) -> Slot | None:
        """The previous reservation, kept if its GPUs and the quota are still free by
        the previous estimate (whatever the greedy choice would be now)."""
        if not self._has_previous:
            return None
        for option in options:
            found = self._previous.slot_for(job, option.slice)
            if found is None:
                continue
            ready, nodes, positions, preheld = found
            # The latest of the GPUs, the floor and the quota (as max(), without the
            # builtin's generic call in the compiled engine).
            start = ready
            lowest = self.now if floor is None else floor
            if lowest > start:
                start = lowest
            due = option.account.earliest(job.gpus, job.preemptible)
            if due > start:
                start = due
            previous_start = self._previous.previous_start(job)
            if previous_start is None or start > previous_start:
                return None
            releasing = _any_releasing(nodes, positions)
            return Slot(start, option, nodes, positions, releasing, preheld)
        return None

    def _reserve(self, job: PendingJob, slot: Slot, runtime: float) -> tuple[int, ...]:
        """Promise the slot's GPUs and quota to the job; returns the GPU ids."""
        end = slot.start + runtime
        slice_ = slot.option.slice
        gpu_ids: list[int] = []
        kept = self._previous.kept_positions(job.id) if slot.preheld else None
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

    def _estimate_without_gpus(
        self,
        job: PendingJob,
        options: list[Option],
        floor: float | None,
        slot: Slot | None = None,
    ) -> float | None:
        """Estimate for a job that reserves nothing (it waits for quota, to borrow, or for
        its queue's head): later estimates of its tenant count its quota, but it stops
        nobody from starting now. ``slot``: its earliest slot if already computed."""
        if slot is not None:
            start, option = slot.start, slot.option
        else:
            found = self._earliest_start(job, options, floor)
            if found is None:
                return None
            start, option = found[0], found[1]
        runtime = job.max_runtime_seconds if job.max_runtime_seconds > 0 else INF
        option.account.reserve(job.gpus, start, start + runtime, hold_now=False)
        return start

    def _claimants_in_the_way(self, job: PendingJob, options: list[Option]) -> list[int]:
        """The other jobs for which GPUs or quota are kept (see :meth:`_build_claims`) on
        the slices or quota accounts the job could use."""
        slices = {id(option.slice) for option in options}
        accounts = {id(option.account) for option in options}
        found: list[int] = []
        for other, claims in self._claims.items():
            if other == job.id:
                continue
            if any(id(claim[0]) in slices for claim in claims) or any(
                id(kept[0]) in accounts for kept in self._quota_claims.get(other, ())
            ):
                found.append(other)
        return found

    def _estimate_past_claims(self) -> None:
        """Estimates for the jobs that found no start because GPUs being freed by a
        preemption are kept for a job ordered after them (see :meth:`_build_claims`):
        until that job's turn those GPUs count as busy without end. Now that every job
        has been considered, the kept GPUs are the preemptor's, reserved or started up to
        its limit, so the earliest start over the index as the cycle leaves it is an
        upper bound for such a job. Only the estimate is given: the job holds nothing
        (the cycle's decisions are made; the next one, once the preemptor has started,
        reserves for it as for any job)."""
        pending = self.result.pending
        for job, options, floor, claimants in self._after_claims:
            found = self._earliest_start(job, options, floor)
            info = pending.get(job.id)
            if found is None or info is None or info.estimated_start is not None:
                continue
            pending[job.id] = _pending_info(
                job.id,
                info.code,
                f"{info.message}; {messages.kept_for_preemptors(claimants)}",
                info.queue_position,
                info.pool_position,
                found[0],
                (),
                (),
            )

    def _release_claims(self, job_id: int) -> None:
        """GPUs and quota kept for this job by an earlier preemption become usable when it
        is its turn (by itself first, since it is considered right now)."""
        claims = self._claims.pop(job_id, None)
        if claims is None:
            return
        for slice_, slot, positions, when, releasing in claims:
            slice_.release_at(slot, positions, when, releasing)
        for account, gpus, when in self._quota_claims.pop(job_id, ()):
            account.release_claim(gpus, when)

    # -- preemption ------------------------------------------------------------------------

    def _preemption_may_pay(self, slot: Slot | None) -> bool:
        """Whether a preemption could get the job running at least the minimum gain
        sooner than ``slot`` (its earliest start without preempting, None if never).
        A job that preempts starts once its victims are gone, at ``now`` + their grace
        (at least 1 s) or later, so where waiting starts it by ``now`` + 1 s + the gain,
        :meth:`_preempt` would stop nobody whatever victims it found: the search (the
        costliest part of a cycle after the holds) is not made. Nothing a search leaves
        behind changes a decision: its heaps and the slices' victim statistics are
        worked out again on first use, and a search skipped is not known hopeless."""
        if slot is None or self.always_search:
            return True
        return slot.start > self.now + 1 + self.snapshot.preemption_min_gain_seconds

    def _preempt(
        self,
        job: PendingJob,
        preemptors: list[tuple[Option, Preemptor]],
        runtime: float,
        slot: Slot | None,
    ) -> tuple[str, float] | None:
        """Stop victims for the job if that gets it running at least the snapshot's
        ``preemption_min_gain_seconds`` sooner than waiting (``slot``: its earliest start
        without preempting, None if never; see :mod:`.preemption`).

        Without backfill a job behind the pool's first blocked job starts after it (the
        pool's floor): stopping victims before then would cost their work for nothing,
        so such a job preempts only if its victims are still stopping by then: where the
        floor is past the longest grace of a stop now, no search is made."""
        floor = self._pool_floor.get(job.pool) if self._pool_floor else None
        if floor is not None and (
            floor == INF or (floor > self.now + self.longest_grace and not self.always_search)
        ):
            return None
        gain = self.snapshot.preemption_min_gain_seconds
        if not job.can_preempt:
            # Its victims can only be reclaimed (borrowed, of other tenants): it starts no
            # sooner than a victim's stop and its guaranteed quota allow, whoever stops.
            due = [
                option.account.earliest(job.gpus, job.preemptible, within_guarantee=True)
                for option, _ in preemptors
            ]
            if slot is not None and slot.start <= max(self.now + 1, min(due)) + gain:
                return None  # waiting is (nearly) as fast as any preemption: no search
            victims_gone = self.now + self.longest_grace
            preemptors = [
                item
                for item, soonest in zip(preemptors, due, strict=True)
                if soonest <= max(victims_gone, item[0].account.leaving_until)
            ]
            if not preemptors:
                return None  # its quota is not due when victims would be gone: no search
        best: tuple[VictimChoice, Option, Preemptor] | None = None
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
                choice = self._victims.find(option.slice, preemptor)
            if choice is None:
                self._hopeless.add(key)
            elif not choice.victims:
                continue  # idle GPUs enough: nothing to stop (a later search may be)
            elif best is None or choice.cost < best[0].cost:
                best = (choice, option, preemptor)
        if best is None:
            return None
        choice, option, preemptor = best
        account = option.account
        release = {
            record.job.id: self.now + max(record.job.grace_seconds, 1) for record in choice.victims
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
        if gain > 0 and _expected_gone_by(choice.victims, self.now, start + gain):
            return None  # its victims are expected to end by then anyway
        claimed = self._claimed_ids.setdefault(job.id, set())
        for record in choice.victims:
            self._stop(record, job, release[record.job.id], preemptor, account)
            claimed.update(record.job.gpu_ids)
        positions = [
            option.slice.choose_reserved(node_slot, job.gpus_per_node, start)
            for node_slot in choice.slots
        ]
        reserved = self._reserve(job, Slot(start, option, choice.slots, positions, True), runtime)
        frees_quota = account if preemptor.short_of_quota else None
        message = messages.preemption_wait(release, start, self.now, frees_quota)
        self._wait(job, reasons.WAITING_FOR_PREEMPTION, message, start, reserved)
        return reasons.WAITING_FOR_PREEMPTION, start

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
        else:
            reason = reasons.PREEMPT_PRIORITY
            message = messages.preempted_for_priority(job, victim.priority_class)
        self.result.preemptions.append(
            Preemption(victim_id=victim.id, preemptor_id=job.id, reason=reason, message=message)
        )


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


def _pending_info(
    job_id: int,
    code: str,
    message: str,
    queue_position: int,
    pool_position: int,
    estimated_start: float | None,
    reserved_gpu_ids: tuple[int, ...],
    claimed_gpu_ids: tuple[int, ...],
) -> PendingInfo:
    """``PendingInfo(...)``, faster: the same object, its slots filled directly instead of
    through the frozen dataclass's ``__init__`` (one per waiting job per cycle; here, in
    the compiled engine, it runs no interpreted frame)."""
    info = _new_object(PendingInfo)
    _set = _SET_PENDING
    _set[0](info, job_id)
    _set[1](info, code)
    _set[2](info, message)
    _set[3](info, queue_position)
    _set[4](info, pool_position)
    _set[5](info, estimated_start)
    _set[6](info, reserved_gpu_ids)
    _set[7](info, claimed_gpu_ids)
    return info


def _any_releasing(nodes: list[NodeSlot], positions: list[list[int]]) -> bool:
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
