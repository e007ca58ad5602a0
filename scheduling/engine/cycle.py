"""The state of one scheduling cycle, shared by the planner's extension points.

:class:`CycleState` is what a cycle works on: the cluster index (slices of GPUs with
their timelines, see :mod:`.cluster`), the quota accounts (:mod:`.quota`), the running
jobs marked on both, the GPUs and quota kept for pending jobs by earlier preemptions
(claims), the reservations handed back by the previous cycle (:mod:`.reservations`), the
no-backfill pools' floors, and the plan being written. It is built here from the
cluster state and the policy; the extension points (:mod:`.ordering`, :mod:`.placing`,
:mod:`.reserving`, :mod:`.preempting`, :mod:`.explaining`) change it, and the planner
(:mod:`.planner`) calls them in order.

What only reads a cycle (:mod:`.settled`) gets a :class:`CycleView`: the answers it
needs, and no way to change anything.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Final

from .cluster import KeptCluster, Locator, NodeSlot, SliceIndex
from .order import overdue
from .preemption import RunningRecord
from .quota import Account, Quotas
from .reservations import PreviousReservations
from .results import Plan
from .snapshot import ClusterState, Policy, QueueInfo, RunningJob

INF: Final = math.inf


class CycleState:
    """What one cycle works on (see the module doc); built for a cluster state and a
    policy, on a new cluster index or on the one the caller keeps (``kept``)."""

    def __init__(self, cluster: ClusterState, policy: Policy, kept: KeptCluster | None) -> None:
        self.cluster = cluster
        self.policy = policy
        self.now = cluster.now
        self.result = Plan()
        self.queues: dict[int, QueueInfo] = {queue.id: queue for queue in cluster.queues}
        self.quotas = Quotas(cluster.quotas, self.now)
        self.running_gpus: dict[str, int] = defaultdict(int)
        self.slices: dict[tuple[str, str, int], SliceIndex] = {}
        self.pool_slices: dict[str, list[SliceIndex]] = defaultdict(list)
        self.locator = Locator()
        self.kept_running: KeptRunning | None = None  # see _build_cluster
        # Stopping jobs preempted for a pending job: their GPUs and their quota wait for
        # that job (every such job has an entry in claims, if only an empty one).
        # Each claim: (slice, slot, positions, free from, "releasing" mark once released).
        self.claims: dict[int, list[tuple[SliceIndex, NodeSlot, list[int], float, bool]]] = {}
        self.quota_claims: dict[int, list[tuple[Account, int, float]]] = {}
        # GPU ids claimed for a pending job (its stopping victims', those it was handed
        # back): the part of its reservation it reports as claimed for the next cycle.
        self.claimed_ids: dict[int, set[int]] = {}
        # Without backfill: nothing of a pool starts before its floor (the start of its
        # first blocked job), and that job's id.
        self.pool_floor: dict[str, float] = {}
        self.pool_blocker: dict[str, int] = {}
        # Victims stopped now are gone by now + their grace: this is the latest they can
        # be gone, and a preemptor whose quota is not due by then stops nobody (set by
        # _build_running).
        self.longest_grace = 1
        self._build_cluster(kept)
        self._build_running()
        self._build_claims()
        for slice_ in self.slices.values():
            slice_.build()
        # Jobs past their maximum wait that hold a reservation handed back: *bounded*, they
        # are considered first (see .ordering), their reservations held from the start
        # (see .reservations).
        self.bounded: frozenset[int] = frozenset()
        if policy.backfill and not policy.global_fifo:
            self.bounded = frozenset(
                job.id
                for job in cluster.pending
                if job.reserved_gpu_ids and overdue(job, self.now, policy)
            )
        self.previous = PreviousReservations(cluster.pending, self.locator, self.now, self.bounded)
        self.has_previous = bool(self.previous)
        # Without backfill jobs start strictly in order, the pool's first blocked job
        # holding back everything behind it: GPUs held for a later job's old reservation
        # would only delay the jobs before it, the first blocked one, and with it the
        # whole pool. A job still gets its old reservation back at its turn if free;
        # only the jobs up to the pool's first blocked job (and those for which a
        # preemption keeps GPUs) have one handed on (see .explaining).
        self.hold_previous = self.has_previous and policy.backfill
        if self.hold_previous:
            self.previous.hold_bounded()  # they bind every job considered before them
        if policy.global_fifo and self.hold_previous:
            self.previous.hold_class(None)  # one queue: no class may ignore a hold

    # -- building the cycle's state ---------------------------------------------------------

    def _build_cluster(self, kept: KeptCluster | None) -> None:
        """Group every node's GPUs into slices (pool, model, memory), or reset the index
        the caller keeps between cycles (see :class:`.cluster.KeptCluster`)."""
        now = self.now
        if kept is not None and kept.reuse(self.cluster.nodes, now):
            self.slices = kept.slices
            self.pool_slices = kept.pool_slices
            self.locator = kept.locator
            self.kept_running = kept.running
            return
        for node in self.cluster.nodes:
            for model, memory, gpu_ids in node.kinds():
                key = (node.pool, model, memory)
                slice_ = self.slices.get(key)
                if slice_ is None:
                    slice_ = self.slices[key] = SliceIndex(node.pool, model, memory, now)
                    self.pool_slices[node.pool].append(slice_)
                self.locator.add(slice_, slice_.add_slot(node.id, node.name, gpu_ids, node.block))
        if kept is not None:
            kept.keep(self.cluster.nodes, self.slices, self.pool_slices, self.locator)
            kept.running = self.kept_running = KeptRunning()

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
        kept = self.kept_running
        if kept is None:
            running: list[RunningJob] = self.cluster.running
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
        placement_of = self.locator.placement
        running_gpus = self.running_gpus
        gain = self.policy.preemption_min_gain_seconds
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
                    pending_ids = {waiting.id for waiting in self.cluster.pending}
                if claimant not in pending_ids:
                    claimant = None
            account = account_of(job.tenant, job.pool, job.gpu_model)
            if claimant is not None:
                account.add_running(len(job.gpu_ids), INF)
                self.claims.setdefault(claimant, [])
                self.claimed_ids.setdefault(claimant, set()).update(job.gpu_ids)
                self.quota_claims.setdefault(claimant, []).append((account, len(job.gpu_ids), end))
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
                    self.claims[claimant].append((slice_, slot, positions, end, True))

    def _build_claims(self) -> None:
        """Keep the idle GPUs that victims freed for a pending job (handed back as its
        ``claimed_gpu_ids``) for that job until its turn, like those still stopping.

        A GPU someone else holds now is not claimed (the claim is stale); at the job's
        turn its claimed GPUs are idle again, without the "releasing" mark, so that a job
        that still cannot start on them reports its real reason and drops the claim."""
        now = self.now
        for job in self.cluster.pending:
            if not job.claimed_gpu_ids:
                continue
            by_slot: dict[int, tuple[SliceIndex, NodeSlot, list[int]]] = {}
            for gpu_id in job.claimed_gpu_ids:
                location = self.locator.locate(gpu_id)
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
            claims = self.claims.setdefault(job.id, [])
            self.quota_claims.setdefault(job.id, [])
            ids = self.claimed_ids.setdefault(job.id, set())
            for slice_, slot, positions in by_slot.values():
                claims.append((slice_, slot, positions, now, False))
                ids.update(slot.gpu_ids[pos] for pos in positions)


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

    def update(self, state: CycleState) -> list[RunningJob]:
        """Bring the kept jobs in line with the snapshot's running jobs (the index was
        just reset to them) and count them in the cycle's quota accounts and GPUs per
        tenant; returns the running jobs that are not kept, to be marked."""
        self.cycle += 1
        cycle = self.cycle
        now = state.now
        records = self.records
        others: list[RunningJob] = []
        added: list[tuple[RunningJob, float]] = []
        seen = 0
        for job in state.cluster.running:
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
        placement_of = state.locator.placement
        for job, end in added:
            self._add(job, end, now, placement_of)
        account_of = state.quotas.account
        gain = state.policy.preemption_min_gain_seconds
        for key, group in self.groups.items():
            account = account_of(key[0], key[1], key[2])
            account.add_kept(group.gpus, len(group.records), group.gpu_ends, group.job_ends)
            for record in group.records.values():
                record.renew(now, account, gain)
        running_gpus = state.running_gpus
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


class CycleView:
    """A read-only view of a cycle's state, for what only looks at it (:mod:`.settled`):
    the questions it asks, answered from the state as the cycle has left it so far."""

    def __init__(self, state: CycleState) -> None:
        self._state = state

    @property
    def now(self) -> float:
        return self._state.now

    @property
    def policy(self) -> Policy:
        return self._state.policy

    @property
    def longest_grace(self) -> int:
        """How late victims stopped now are gone at the latest (seconds after now)."""
        return self._state.longest_grace

    def has_claims(self) -> bool:
        """Whether GPUs are kept for some pending job by an earlier preemption."""
        return bool(self._state.claims)

    def claim_free_by(self, when: float) -> bool:
        """Whether some GPU kept for a pending job is free by ``when`` (its victim gone)."""
        kept = self._state.claims
        if not kept:
            return False
        for claims in kept.values():
            for _, _, _, free_from, _ in claims:
                if free_from <= when:
                    return True
        return False

    def kept_quota(self) -> dict[int, int]:
        """Quota kept for pending jobs by earlier preemptions: GPUs per account (by id)."""
        kept: dict[int, int] = {}
        for claims in self._state.quota_claims.values():
            for account, gpus, _ in claims:
                kept[id(account)] = kept.get(id(account), 0) + gpus
        return kept

    def quota_claims_left(self) -> int:
        """The pending jobs quota may still be kept for (their turn gives it back)."""
        return len(self._state.quota_claims)

    def pool_floors(self) -> Mapping[str, float]:
        """Without backfill: per pool blocked so far, the start of its blocked job."""
        return self._state.pool_floor

    def idle_held(self) -> bool:
        """Whether some GPU held for an old reservation is idle now."""
        return self._state.previous.idle_held > 0

    def waiting_holds(self) -> Iterator[tuple[NodeSlot, int]]:
        """(slot, position) of each GPU held for a job not considered yet."""
        return self._state.previous.waiting_holds()

    def pool_slices(self) -> Mapping[str, list[SliceIndex]]:
        """The slices of GPUs of each pool."""
        return self._state.pool_slices

    def slices(self) -> list[SliceIndex]:
        """Every slice of GPUs."""
        return list(self._state.slices.values())

    def account(self, tenant: str, pool: str, model: str) -> Account:
        """The tenant's quota account for GPUs of ``model`` in ``pool``."""
        return self._state.quotas.account(tenant, pool, model)

    def decisions(self) -> int:
        """Placements and preemptions decided so far."""
        result = self._state.result
        return len(result.placements) + len(result.preemptions)
