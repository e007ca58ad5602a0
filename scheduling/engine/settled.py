"""When a cycle may stop early: no job left to consider could start or preempt.

A snapshot with ``decisions_only`` asks the planner for its decisions (placements and
preemptions) and not for the explanation of every waiting job. The simulator asks that
way: it replays hundreds of thousands of cycles and reads only their decisions, while in
a long queue most jobs can neither start nor preempt and considering each of them (its
estimate, its reservation, its reason) is nearly all of a cycle's cost.

:func:`nothing_more_can_happen` is a *sufficient* condition, checked against the state
the cycle has reached: if it holds, considering the remaining jobs in order would place
none of them and stop nothing, so the plan's decisions are exactly those of a full cycle.
The argument, for the jobs not considered yet (``Remaining``):

- no GPU is idle and unpromised now, none is promised only by an old reservation held
  for a remaining job (given back at its turn, it could be idle again), no GPU kept for
  a remaining job by an earlier preemption is idle already (the others are busy until
  their victims stop), and no idle GPU promised from later
  ("a hole") stays idle long enough for the shortest remaining job: a job starts now
  only on such GPUs (a pool blocked without backfill starts nothing at all);
- no node can make room for a remaining job by preemption: on each node, the GPUs idle
  and unpromised plus those of its possible victims there fall short of the fewest GPUs
  per node any remaining job of the tenant needs. A possible victim of a tenant's job is
  seasoned, not stopping, holds no GPU on that node promised to a job considered before (such
  promises are never taken back during a cycle, not even when a held reservation is
  given back), and is either of a lower preemptible class than a remaining job whose
  class may preempt (the tenant having such a job), or borrowed (and not at its stop
  limit: such a job is reclaimed by nobody) by another tenant while
  the tenant is still inside its guarantee somewhere, counting its stopping jobs as gone
  (and the quota of jobs stopped for a remaining job, given back at its turn), or has a
  job whose class may preempt (it may stop lower jobs of its own first to get back inside
  its guarantee, then reclaim). Training work never preempts inference. A pool without
  backfill whose blocked job starts (its *floor*) after the longest grace of a stop now,
  or never, is left out: a job behind the floor preempts only for victims still
  stopping when the floor comes (:mod:`.preempting`), and a stop now is over by then.
  Without backfill the cycle also goes on while a remaining job has GPUs kept for it by
  an earlier preemption, or a pool with remaining jobs has no blocked job yet: without
  backfill only the jobs up to a pool's blocked job and those with GPUs kept for them
  hand a reservation on to the next cycle (:mod:`.explaining`), so a cycle that stops
  early then hands on exactly what a full one does, and a replay of such cycles (which
  drops the older reservations of the jobs a cycle did not reach) is a replay of full
  cycles.

While the remaining jobs place nothing and stop nothing, the cycle's state only gets
tighter as they are considered (more GPUs and quota promised), so what holds now holds at
each of their turns. Quota is not looked at for placements: that only makes the
condition hold less often, never wrongly.

The check reads the cycle through a :class:`.cycle.CycleView`: it changes nothing.
"""

from __future__ import annotations

import math
from collections import Counter
from heapq import heapify, heappop
from typing import TYPE_CHECKING, Final

from .order import sharing_floor
from .preemption import TRAINING_WORKLOADS, slice_stats
from .snapshot import PendingJob

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import NodeSlot
    from .cycle import CycleView
    from .quota import Account

INF: Final = math.inf


class Remaining:
    """What the cycle still has to consider, summed up for :func:`nothing_more_can_happen`
    (built on first use: most checks are answered before they are needed)."""

    _preemptors: Counter[tuple[int, bool]]
    _tenants: Counter[str]
    _preempting: Counter[str]
    _pools: Counter[str]

    __slots__ = (
        "_pending",
        "_done",
        "_runtimes",
        "_preemptors",
        "_tenants",
        "_preempting",
        "_pools",
        "_summarized",
        "_jobs",
        "_by_gpus",
        "_by_node_gpus",
        "_non_training",
        "witness",
        "_witness_kept",
        "_sharing",
        "_sharing_kinds",
    )

    def __init__(self, pending: list[PendingJob]) -> None:
        self._pending = pending
        self._done: set[int] = set()  # ids of the jobs considered
        self._runtimes: list[tuple[float, int]] | None = None
        # _preemptors (class, training), _tenants and _preempting (remaining jobs that
        # may preempt by class) are set by _summarize, on first use.
        self._summarized = False
        # tenant -> heaps of (GPUs, id) and (GPUs per node, id) of its jobs not considered
        # (entries of considered jobs are dropped when they reach the top)
        self._by_gpus: dict[str, list[tuple[int, int]]] = {}
        self._by_node_gpus: dict[str, list[tuple[int, int]]] = {}
        self._jobs: dict[str, list[PendingJob]] = {}  # tenant -> its jobs at the summary
        # tenant -> its remaining jobs that may preempt inference (not training-like)
        self._non_training: dict[str, int] = {}
        # (tenant, node, node version, stamp, the node's pool) where the last check found
        # room for a preemption, and whether the jobs considered since could not have
        # changed that
        self.witness: tuple[str, NodeSlot, tuple[int, int], tuple, str] | None = None
        self._witness_kept = False
        # Time-sharing jobs not considered: id -> (class, the GPU-seconds from which a
        # running time-sharing job of that class is in a higher level), and how many of
        # them of each such kind; built on first use
        self._sharing: dict[int, tuple[int, float]] | None = None
        self._sharing_kinds: Counter[tuple[int, float]] = Counter()

    def remove(self, job: PendingJob) -> None:
        """``job`` has been considered."""
        self._done.add(job.id)
        if self._sharing:
            kind = self._sharing.pop(job.id, None)
            if kind is not None:
                self._sharing_kinds[kind] -= 1
        if job.tenant in self._non_training and job.workload_type not in TRAINING_WORKLOADS:
            self._non_training[job.tenant] -= 1
        witness = self.witness
        if (
            self._witness_kept
            and witness is not None
            and (job.tenant == witness[0] or job.can_preempt)
        ):
            self._witness_kept = False
        if self._summarized:
            if job.can_preempt:
                self._preemptors[(job.priority, job.workload_type in TRAINING_WORKLOADS)] -= 1
                self._preempting[job.tenant] -= 1
            self._tenants[job.tenant] -= 1
            self._pools[job.pool] -= 1

    def remember(self, tenant: str, slot: NodeSlot, stamp: tuple, pool: str) -> None:
        """The last check found room on ``slot`` (of ``pool``) for a remaining job of
        ``tenant``."""
        self.witness = (tenant, slot, (slot.version, slot.marks), stamp, pool)
        self._witness_kept = True

    def forget(self) -> None:
        """The last check found no room for a preemption."""
        self.witness = None
        self._witness_kept = False

    def witness_holds(self, stamp: tuple) -> bool:
        """Whether the room remembered is certainly still there: what it was worked out
        from has not changed since. That is the node's GPUs and the jobs on them (any
        change re-indexes the node, bumping its version), the tenant's remaining jobs
        and quota (only its own jobs, a placement, or quota kept for a job given back
        change those: the stamp), and the classes that may preempt (a job whose class
        may preempt has been considered)."""
        witness = self.witness
        if not self._witness_kept or witness is None:
            return False
        _, slot, version, known, _ = witness
        return (slot.version, slot.marks) == version and known == stamp

    def may_share_time(self, cycle: CycleView) -> bool:
        """Whether a remaining time-sharing job might stop a running one of its class in
        a higher level (:mod:`.preemption`; any such job of any slice counts)."""
        sharing = self._sharing
        if sharing is None:
            sharing = self._sharing = {}
            now, policy = cycle.now, cycle.policy
            for job in self._pending:
                if job.time_sharing and job.id not in self._done:
                    floor = sharing_floor(job, now, policy)
                    if floor < INF:
                        kind = (job.priority, floor)
                        sharing[job.id] = kind
                        self._sharing_kinds[kind] += 1
        if not sharing:
            return False
        most: dict[int, float] = {}
        for slice_ in cycle.slices():
            for priority, attained in slice_stats(slice_).sharing:
                if attained > most.get(priority, -INF):
                    most[priority] = attained
        if not most:
            return False
        return any(
            count > 0 and most.get(kind[0], -INF) >= kind[1]
            for kind, count in self._sharing_kinds.items()
        )

    def shortest_runtime(self) -> float:
        """The shortest runtime limit among the remaining jobs (INF: none left)."""
        runtimes, done = self._runtimes, self._done
        if runtimes is None:
            runtimes = self._runtimes = [
                (job.max_runtime_seconds if job.max_runtime_seconds > 0 else INF, job.id)
                for job in self._pending
                if job.id not in done
            ]
            heapify(runtimes)
        while runtimes and runtimes[0][1] in done:
            heappop(runtimes)
        return runtimes[0][0] if runtimes else INF

    def preemptors(self) -> Counter[tuple[int, bool]]:
        """(class, training-like) of the remaining jobs whose class may preempt, counted."""
        self._summarize()
        return self._preemptors

    def tenants(self) -> Counter[str]:
        """The remaining jobs per tenant."""
        self._summarize()
        return self._tenants

    def pools(self) -> Counter[str]:
        """The remaining jobs per pool."""
        self._summarize()
        return self._pools

    def fewest_gpus(self, tenant: str) -> int:
        """The fewest GPUs a remaining job of ``tenant`` needs (it has one left)."""
        return self._smallest(self._by_gpus, tenant, False)

    def fewest_per_node(self, tenant: str) -> int:
        """The fewest GPUs per node a remaining job of ``tenant`` needs."""
        return self._smallest(self._by_node_gpus, tenant, True)

    def _smallest(
        self, heaps: dict[str, list[tuple[int, int]]], tenant: str, per_node: bool
    ) -> int:
        """The smallest size in the tenant's heap of ``heaps`` (GPUs per node, or in
        all), the heap built on first use and cleared of considered jobs on the way."""
        heap = heaps.get(tenant)
        if heap is None:
            self._summarize()
            jobs = self._jobs[tenant]
            heap = [(job.gpus_per_node if per_node else job.gpus, job.id) for job in jobs]
            heapify(heap)
            heaps[tenant] = heap
        done = self._done
        while heap[0][1] in done:
            heappop(heap)
        return heap[0][0]

    def non_training(self, tenant: str) -> bool:
        """Whether ``tenant`` has a remaining job that may preempt inference."""
        found = self._non_training.get(tenant)
        if found is None:
            self._summarize()
            done = self._done
            found = self._non_training[tenant] = sum(
                1
                for job in self._jobs[tenant]
                if job.workload_type not in TRAINING_WORKLOADS and job.id not in done
            )
        return found > 0

    def preempting_tenants(self) -> Counter[str]:
        """The remaining jobs whose class may preempt, per tenant."""
        self._summarize()
        return self._preempting

    def _summarize(self) -> None:
        if self._summarized:
            return
        self._summarized = True
        done = self._done
        # Grouped in one pass (a sort by tenant would cost O(n log n) on a long queue),
        # tenants in name order, each tenant's jobs in the order given.
        by_tenant: dict[str, list[PendingJob]] = {}
        preemptors: Counter[tuple[int, bool]] = Counter()
        preempting: Counter[str] = Counter()
        pools: Counter[str] = Counter()
        for job in self._pending:
            if done and job.id in done:
                continue
            pools[job.pool] += 1
            group = by_tenant.get(job.tenant)
            if group is None:
                by_tenant[job.tenant] = [job]
            else:
                group.append(job)
            if job.can_preempt:
                preemptors[(job.priority, job.workload_type in TRAINING_WORKLOADS)] += 1
                preempting[job.tenant] += 1
        self._jobs = {tenant: by_tenant[tenant] for tenant in sorted(by_tenant)}
        self._tenants = Counter({tenant: len(group) for tenant, group in self._jobs.items()})
        self._preemptors = preemptors
        self._preempting = preempting
        self._pools = pools


def _inside_guarantee(quota: Account, gpus: int, kept: dict[int, int], victims_gone: float) -> bool:
    """Whether a job of ``gpus`` GPUs whose class may not preempt could reclaim under
    ``quota``: inside the guarantee, counting stopping jobs (and quota kept for a
    remaining job, given back at its turn) as gone, and the guaranteed quota due by the
    time its victims are gone (promised to earlier jobs of its tenant until later
    otherwise; the promises only grow during the cycle, unless kept quota is given back)."""
    given_back = kept.get(id(quota), 0)
    if quota.used - quota.leaving - given_back + gpus > quota.guaranteed:
        return False
    return bool(given_back) or quota.earliest(gpus, True, within_guarantee=True) <= max(
        victims_gone, quota.leaving_until
    )


def nothing_more_can_happen(cycle: CycleView, remaining: Remaining) -> bool:
    """Whether no remaining job can start now or preempt (see the module doc)."""
    now = cycle.now
    policy = cycle.policy
    blocked = cycle.pool_floors()
    if not policy.backfill:
        # Each job with GPUs kept for it, and each pool's blocked job, is considered
        # (see the module doc).
        if cycle.has_claims():
            return False
        for pool, count in remaining.pools().items():
            if count > 0 and pool not in blocked:
                return False
    # GPUs kept for a remaining job by an earlier preemption come back at its turn: idle
    # then if its victims are gone already, busy until they are otherwise.
    if cycle.claim_free_by(now):
        return False
    # GPUs held for old reservations of remaining jobs are given back at their turn.
    if cycle.idle_held():
        return False
    latest_end = None
    for pool, slices in cycle.pool_slices().items():
        if pool in blocked:
            continue  # without backfill nothing starts behind the pool's blocked job
        for slice_ in slices:
            if not slice_.idle:
                continue  # no GPU idle now, promised or not
            if latest_end is None:
                latest_end = now + remaining.shortest_runtime()
            # A GPU idle and unpromised, or idle long enough for the shortest job.
            for slot in slice_.slots:
                if slot.free_total:
                    hole = slot.hole
                    for pos, free_from in enumerate(slot.af):
                        if free_from <= now or hole[pos] >= latest_end:
                            return False
    if not policy.preemption:
        return True
    if remaining.may_share_time(cycle):
        return False
    return not _victims_left(cycle, remaining)


def _victims_left(cycle: CycleView, remaining: Remaining) -> bool:
    """Whether some node may still make room for a remaining job by preemption: its GPUs
    idle and unpromised plus those of the running jobs there that the job may stop must
    cover the job's GPUs per node (checked for the fewest GPUs per node of each tenant
    that may preempt, with every victim any of its jobs may stop: never fewer than the
    engine's own victim search finds for one job).

    The cycle asks before every job, so the (tenant, node) that answered yes is
    remembered (see :meth:`Remaining.remember`) and asked first."""
    room = None
    closed = _closed_pools(cycle)
    witness = remaining.witness
    if witness is not None and witness[4] not in closed:
        if remaining.witness_holds(_stamp(cycle)):
            return True
        room = _Room(cycle, remaining, closed)
        if room.has_room(witness[0], witness[1]):
            remaining.remember(witness[0], witness[1], _stamp(cycle), witness[4])
            return True
    found = (room or _Room(cycle, remaining, closed)).find()
    if found is None:
        remaining.forget()
        return False
    remaining.remember(found[0], found[1], _stamp(cycle), found[2])
    return True


def _closed_pools(cycle: CycleView) -> frozenset[str]:
    """Pools without backfill where no remaining job can stop anyone: their blocked job
    starts after the longest grace of a stop now, or never (see the module doc)."""
    floors = cycle.pool_floors()
    if not floors:
        return _NONE_CLOSED
    after = cycle.now + cycle.longest_grace
    return frozenset([pool for pool, floor in floors.items() if floor > after])


_NONE_CLOSED: Final[frozenset[str]] = frozenset()


def _stamp(cycle: CycleView) -> tuple[int, int]:
    """Changes whenever the cycle decides something or gives quota kept for a job back."""
    return cycle.decisions(), cycle.quota_claims_left()


class _Room:
    """What :func:`_victims_left` asks of the cycle's state, worked out on demand."""

    __slots__ = (
        "cycle",
        "remaining",
        "now",
        "highest",
        "by_class",
        "_kept",
        "_reclaims",
        "_temporary",
        "closed",
    )

    def __init__(self, cycle: CycleView, remaining: Remaining, closed: frozenset[str]) -> None:
        self.cycle = cycle
        self.remaining = remaining
        self.closed = closed  # pools whose nodes no remaining job may preempt on
        self.now = cycle.now
        # Per kind of victim (0: not inference, 1: inference), the highest class of a
        # remaining job that may preempt (training work never preempts inference).
        self.highest = [-INF, -INF]
        for (priority, training), count in remaining.preemptors().items():
            if count > 0:
                self.highest[0] = max(self.highest[0], priority)
                if not training:
                    self.highest[1] = max(self.highest[1], priority)
        self.by_class = remaining.preempting_tenants()
        self._kept: dict[int, int] | None = None
        self._reclaims: dict[str, tuple[bool, bool]] = {}
        self._temporary: set[tuple[int, int]] | None = None

    def kept(self) -> dict[int, int]:
        """Quota kept for a remaining job, per account: it leaves its victims' tenants at
        that job's turn."""
        if self._kept is None:
            self._kept = self.cycle.kept_quota()
        return self._kept

    def reclaims(self, tenant: str) -> tuple[bool, bool]:
        """Whether ``tenant`` may reclaim borrowed GPUs (not inference, inference): it
        is still inside its guarantee somewhere, counting its stopping jobs as gone, or
        it has a job whose class may preempt (which may first stop lower jobs of its own
        tenant to get back inside its guarantee)."""
        found = self._reclaims.get(tenant)
        if found is not None:
            return found
        cycle, remaining = self.cycle, self.remaining
        if self.by_class.get(tenant, 0) > 0:
            found = self._reclaims[tenant] = (True, remaining.non_training(tenant))
            return found
        gpus = remaining.fewest_gpus(tenant)
        account = cycle.account
        kept = self.kept()
        victims_gone = self.now + cycle.longest_grace
        answer = any(
            _inside_guarantee(account(tenant, slice_.pool, slice_.model), gpus, kept, victims_gone)
            for slice_ in cycle.slices()
        )
        found = (answer, answer and remaining.non_training(tenant))
        self._reclaims[tenant] = found
        return found

    def need(self, tenant: str) -> int | None:
        """The fewest GPUs per node a remaining job of ``tenant`` needs, if the tenant
        may preempt at all (None otherwise)."""
        if self.remaining.tenants()[tenant] <= 0:
            return None
        if self.by_class.get(tenant, 0) <= 0 and not self.reclaims(tenant)[0]:
            return None
        return self.remaining.fewest_per_node(tenant)

    def victims(self, slot: NodeSlot, anyone: tuple[bool, bool]) -> list[tuple]:
        """The possible victims on ``slot``: (GPUs here, tenant, kind, lower class,
        borrowed); ``anyone``: whether some tenant may reclaim, per kind of victim."""
        found = []
        highest = self.highest
        for record in slot.running:
            if record.stopping or not record.seasoned or record.ending:
                continue
            kind = int(record.inference)
            lower = record.preemptible and record.priority < highest[kind]
            # A borrower at its stop limit is reclaimed by nobody (every stop counts).
            reclaimable = record.borrowed and not record.protected
            if not (lower or (reclaimable and anyone[kind])):
                continue
            positions = record.positions_on(slot)
            if self._promised(slot, positions):
                continue  # the engine never stops a job holding GPUs promised here
            found.append((len(positions), record.tenant, kind, lower, reclaimable))
        return found

    def _promised(self, slot: NodeSlot, positions: list[int]) -> bool:
        """Whether one of ``positions`` of ``slot`` is promised to a job considered
        already (GPUs promised only by old reservations held for remaining jobs are
        given back at their turn: they do not protect a victim)."""
        reserved = slot.reserved
        if not any(reserved[pos] for pos in positions):
            return False
        temporary = self._temporary
        if temporary is None:
            holds = self.cycle.waiting_holds()
            temporary = self._temporary = {(id(held), pos) for held, pos in holds}
        return any(reserved[pos] and (id(slot), pos) not in temporary for pos in positions)

    def freed(self, slot: NodeSlot, victims: list[tuple], tenant: str) -> int:
        """GPUs of ``slot`` a job of ``tenant`` could have: idle and unpromised, or
        held by victims it may stop."""
        class_ok = self.by_class.get(tenant, 0) > 0
        reclaims = self.reclaims(tenant)
        freed = slot.idle_unreserved(self.now)
        for gpus, owner, kind, lower, borrowed in victims:
            if (class_ok and lower) or (borrowed and owner != tenant and reclaims[kind]):
                freed += gpus
        return freed

    def has_room(self, tenant: str, slot: NodeSlot) -> bool:
        """Whether ``slot`` may make room for a remaining job of ``tenant``."""
        need = self.need(tenant)
        if need is None or need > len(slot.gpu_ids):
            return False
        reclaims = self.reclaims(tenant)
        victims = self.victims(slot, reclaims)
        return bool(victims) and self.freed(slot, victims, tenant) >= need

    def find(self) -> tuple[str, NodeSlot, str] | None:
        """A (tenant, node, its pool) with room for a remaining job of the tenant, if any."""
        needs = {}
        for tenant in self.remaining.tenants():
            need = self.need(tenant)
            if need is not None:
                needs[tenant] = need
        if not needs:
            return None
        reclaims = [self.reclaims(tenant) for tenant in needs]
        anyone = (any(r[0] for r in reclaims), any(r[1] for r in reclaims))
        closed = self.closed
        for slice_ in self.cycle.slices():
            if closed and slice_.pool in closed:
                continue
            for slot in slice_.slots:
                victims = self.victims(slot, anyone)
                if not victims:
                    continue
                for tenant, need in needs.items():
                    if need <= len(slot.gpu_ids) and self.freed(slot, victims, tenant) >= need:
                        return tenant, slot, slice_.pool
        return None
