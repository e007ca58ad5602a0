"""Choosing victims for a job that cannot start on idle GPUs or within its quota
(DESIGN.md §6).

A running job may be a victim of job J when it is not already stopping, has run at least
its ``min_runtime_before_preemption`` (counted from the start of its current run), is not
inference work facing training work, holds no GPU promised to an earlier waiting job, is
not expected to end within the minimum gain (below), and either

- *priority, own tenant*: J's class may preempt and the victim, of J's tenant, is of a
  lower, preemptible class, borrowed or not (Kueue's ``withinClusterQueue:
  LowerPriority``), and not protected (below), or
- *priority, other tenant*: J's class may preempt, the victim's class is lower and
  preemptible, the victim is not protected, and J runs inside its guarantee or the
  victim is borrowed (a borrower never takes guaranteed GPUs of others), or
- *reclaim*: J runs inside its tenant's guarantee and the victim, of another tenant,
  runs on borrowed GPUs (whatever its class), and is not protected (below), or
- *time-sharing* (a queue's opt-in, see :mod:`.order`): J and the victim both time-share,
  are of the same class, the victim is preemptible, not protected, of J's tenant or
  borrowing, and has used more GPU-time (a higher level than J's); J has waited its
  minimum wait (:func:`.order.sharing_floor`). Tried only once the rules above found
  nothing (:meth:`.preempting.Preempting.share_time`).

Every stop counts (DESIGN.md §6): a stop for a higher class, a reclaim of borrowed GPUs
and a time-sharing stop alike add one to the job's preemptions. A job preempted ``max_preemptions`` times
already (> 0) is *protected* during its run: from its start for
``preemption_protection_seconds``, or for the whole run when that is 0 (the default:
:func:`protected_until`). A protected job is stopped by nobody, neither for a higher
class nor to reclaim borrowed GPUs: it runs on to its end or its runtime limit. A job at
its limit is admitted like non-preemptible work, inside its tenant's guarantee only
(:func:`at_preemption_limit`, applied by the planner), unless no guarantee of its tenant
in the pool could ever hold it (none, or a smaller one): there it may still borrow, or it
would never run again. A tenant whose reclaim would need such a borrower's GPUs takes
other borrowed work, or waits for the borrower's end, and its reason says so
(:func:`protected_borrowers`).

The victims must free enough GPUs for J's gang (with the idle GPUs) and, when J's tenant
lacks quota for J (see :meth:`Preemptor.under`: the guarantee for non-preemptible work,
guarantee + borrowing otherwise), enough of that quota: the quota held by J's tenant's
victims in the slice counts as freed at their stop time, as does that of the tenant's
jobs already stopping. "Inside its guarantee" is judged after those stops. The planner
preempts only if that gets J running at least ``Snapshot.preemption_min_gain_seconds``
sooner than waiting for GPUs that running jobs free by their limits (the *minimum gain*,
below), and only if J can start once its victims and its tenant's stopping jobs are
gone: when J's quota is promised to earlier jobs of its tenant until later, stopping the
victims now would leave their GPUs idle until then, so J waits and preempts once its
quota is due.

The minimum gain (default 0: any gain) is what a preemption must buy. A victim pays with
its work since its last checkpoint and with a second wait in the queue, and that wait
is long: it is requeued behind its tenant's use (a reclaimed borrower's tenant is above
its guarantee), and at its preemption limit it may only run inside its guarantee.
Measured on ITP's ten clusters as one pool at 85 % load (``bench/simulate.py --one-pool``,
2026-12-05): a preempted job waited 1.5 h on average before starting again (4.4 h after
a third preemption for jobs under 8 GPUs, 9.4 h for 8 GPUs or more), while two thirds of
the preemptions were made by jobs that had waited under a minute. A preemptor that
waiting gets running within the minimum gain, by the limit-based estimate (an upper
bound: jobs mostly end before their limits), waits; so does one whose chosen victims are
all expected to end within the minimum gain of its start by preempting, by their runtime
predictions (``RunningJob.expected_runtime_seconds``, from their owners' finished jobs;
a victim without one, or running past it, is not expected to end). For the same reason a
running job expected to end within the minimum gain of a stop now (its grace) is nobody's
victim (``RunningRecord.ending``): the search looks past it for jobs whose stop does buy
the gain. Until 2026-12-06 the search chose by cost alone (least work lost: often a job
about to end) and then declined that set, so a preemptor could wait a day behind a
borrower holding GPUs for that long while a job ending in minutes stood in the way.

On the replay above, a 2 h gain with limits only waited 0.33 h on average instead of
0.38 h, re-waits included, with 5,287 preemptions instead of 9,790; 4 h with the
predicted ends (the simulator's ``sluice-min-gain`` policy since 2026-12-05 evening)
0.32 h with 1,810 preemptions, and jobs over 8 GPUs waited no longer than under FIFO
(README, *One pool at 85 %*; over three seeds, and with the victims filter, see the
README's *Victims expected to end within the minimum gain, and three seeds*).

On each node the victims are taken in the order borrowed first, lowest class,
unprotected first, least work lost (GPUs x time since its last checkpoint, or its start:
what stopping it now throws away), until enough GPUs would be free; victims that turn
out unnecessary are dropped again, the most protected (and most work) first. The node
whose set disturbs least wins: fewest guaranteed victims, then the lowest highest class,
fewest protected victims, fewest victims, least work lost, fewest GPUs freed beyond need.

Searching every node for every preemptor would cost O(pending x nodes). Instead each kind
of preemptor (slice, size, class, training or not, inside its guarantee or not) keeps a
heap of node costs; a node is re-evaluated only when it changed since (lazy deletion).
The heaps ignore the preemptor's tenant: their costs are lower bounds (a tenant can only
be refused a victim another tenant could take, except a borrower's own guaranteed jobs),
and the few best nodes are re-evaluated exactly. Work lost leaves that as it was: it is
fixed for the cycle (``now`` does not move), and inside a class (borrowed or not) the
victim order takes first the job that loses least, as the cost counts it, so a node
left with fewer possible victims or fewer idle GPUs costs no less than before. The same
holds for protection: fixed for the cycle, ordered as the cost counts it, and it takes
the same victims away from every preemptor, the heaps' tenant-blind rule included.

Own jobs are searched apart, by a tenant-specific search over the tenant's possible
victims only, when J lacks quota or is a borrower whose tenant runs guaranteed lower
jobs in the slice: it takes the quota victims first (victim order, none more than
needed), evaluates the nodes holding the tenant's jobs with them, asks the heaps for
other nodes unless one of those needs no further victim, and drops the victims that are
not needed after all.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from typing import Final

from .cluster import NodeSlot, SliceIndex
from .quota import Account
from .snapshot import PendingJob, RunningJob

# Training-like work never preempts inference (DESIGN.md §1, §6).
TRAINING_WORKLOADS: Final = frozenset({"training", "fine_tuning"})
INFERENCE_WORKLOAD: Final = "inference"
INF: Final = float("inf")


def at_preemption_limit(job: PendingJob | RunningJob) -> bool:
    """Whether ``job`` was preempted as often as its policy allows (0: no limit)."""
    return 0 < job.max_preemptions <= job.preemptions


def protected_until(job: RunningJob) -> float:
    """Until when a running job may not be stopped for a higher class (see the module
    docstring): -inf below its preemption limit, its start + its protection at the
    limit, or inf when that protection is 0 (the whole run)."""
    if not at_preemption_limit(job):
        return -INF
    if job.preemption_protection_seconds <= 0:
        return INF
    return job.started_at + job.preemption_protection_seconds


def attained_service(job: RunningJob, now: float) -> float:
    """GPU-seconds a running job has used by ``now``: its earlier runs' and this one's."""
    return job.attained_gpu_seconds + len(job.gpu_ids) * max(now - job.started_at, 0.0)


def lost_work(job: RunningJob, now: float) -> float:
    """GPU-seconds a running job would lose if stopped ``now``: its GPUs x the time since
    its last checkpoint in this run (its start when it has none, or none is known; with
    a ``checkpoint_interval``, the last multiple of it since its start)."""
    return _lost_since(
        job.started_at, job.checkpoint_interval, job.checkpointed_at, len(job.gpu_ids), now
    )


def _lost_since(
    started_at: float, interval: float, checkpointed: float | None, gpus: int, now: float
) -> float:
    saved = started_at
    if interval > 0:
        checkpointed = saved + (now - saved) // interval * interval
    if checkpointed is not None and checkpointed > saved:
        saved = checkpointed
    return gpus * max(now - saved, 0.0)


def _ending_from(expected_end: float, grace: int, gain: float) -> float:
    """From when a running job is expected to end (by its runtime prediction, at
    ``expected_end``) within the minimum ``gain`` of a stop then (its grace): until
    ``expected_end`` waiting for it is about as fast as stopping it, so it is nobody's
    victim. INF without a minimum gain or a prediction (a job running past its
    prediction is not expected to end either)."""
    if gain <= 0 or expected_end == INF:
        return INF
    return expected_end - max(grace, 1) - gain


class RunningRecord:
    """A running job as the planner tracks it during one cycle."""

    __slots__ = (
        "job",
        "end",
        "placement",
        "stopping",
        "seasoned",
        "protected",
        "inference",
        "account",
        "gpus",
        "_now",
        "_lost",
        "_order_key",
        "until",
        "base_end",
        "mark",
        "tenant",
        "priority",
        "preemptible",
        "borrowed",
        "started_at",
        "job_id",
        "checkpoint_interval",
        "checkpointed_at",
        "kept_by",
        "expected_end",
        "ending_from",
        "_gain",
        "time_sharing",
        "_attained",
    )

    def __init__(
        self,
        job: RunningJob,
        end: float,
        now: float,
        account: Account | None = None,
        gain: float = 0.0,
    ) -> None:
        self.job = job
        self.end = end
        # [(slice, slot, positions)] of the job's GPUs known to the cluster index.
        self.placement: list[tuple[SliceIndex, NodeSlot, list[int]]] = []
        self.stopping = job.stopping
        self.seasoned = now - job.started_at >= job.min_runtime_before_preemption
        # At its preemption limit: stopped by nobody (a higher class or a reclaim).
        self.until = protected_until(job)
        self.protected = now < self.until
        self.inference = job.workload_type == INFERENCE_WORKLOAD
        self.account = account  # the quota the job counts against
        self.gpus = len(job.gpu_ids)
        # Work lost and victim order are read by the victim search only: worked out on
        # first use (most running jobs of most cycles are never looked at as victims).
        self._now = now
        self._lost = -1.0
        self._order_key: tuple | None = None
        # Kept from one cycle to the next (cycle.KeptRunning): its end as a running
        # job, and the last cycle that found it unchanged.
        self.base_end = end
        self.mark = 0
        self.kept_by: object | None = None  # the cycle.KeptRunning that keeps it
        # The job's fields the victim search reads for every running job of a node it
        # looks at, read once (a record's job is never changed; reading an attribute of
        # the uncompiled snapshot record costs a generic lookup each time).
        self.tenant = job.tenant
        self.priority = job.priority
        self.preemptible = job.preemptible
        self.borrowed = job.borrowed
        self.started_at = job.started_at
        self.job_id = job.id
        self.checkpoint_interval = job.checkpoint_interval
        self.checkpointed_at = job.checkpointed_at
        # Its end by its runtime prediction (none: never), and whether that comes within
        # the minimum gain of a stop: from ending_from to expected_end it is nobody's
        # victim (see _ending_from and ending).
        expected = job.expected_runtime_seconds
        self.expected_end = job.started_at + expected if expected > 0 else INF
        self._gain = gain
        self.ending_from = _ending_from(self.expected_end, job.grace_seconds, gain)
        # Time-sharing: whether it takes part, and the GPU-seconds it has used by now
        # (worked out on first use, as the work lost).
        self.time_sharing = job.time_sharing
        self._attained = -1.0

    def renew(self, now: float, account: Account, gain: float = 0.0) -> None:
        """Back to what a new record of the same running job at ``now`` would be (a
        record kept from one cycle to the next, see cycle.KeptRunning)."""
        self.end = self.base_end
        self.stopping = False  # a kept job is not stopping (a cycle's _stop is undone)
        if not (self.seasoned and now >= self._now):
            # Once seasoned it stays so as time goes on: read the job only until then.
            job = self.job
            self.seasoned = now - job.started_at >= job.min_runtime_before_preemption
        self.protected = now < self.until
        if gain != self._gain:
            self._gain = gain
            self.ending_from = _ending_from(self.expected_end, self.job.grace_seconds, gain)
        self.account = account
        self._now = now
        self._lost = -1.0
        self._order_key = None
        self._attained = -1.0

    @property
    def lost(self) -> float:
        """What stopping it now would throw away (fixed for the cycle)."""
        if self._lost < 0:
            self._lost = _lost_since(
                self.started_at,
                self.checkpoint_interval,
                self.checkpointed_at,
                self.gpus,
                self._now,
            )
        return self._lost

    @property
    def attained(self) -> float:
        """GPU-seconds the job has used by now, over all its runs (fixed for the cycle)."""
        if self._attained < 0:
            self._attained = attained_service(self.job, self._now)
        return self._attained

    @property
    def ending(self) -> bool:
        """Expected to end within the minimum gain of a stop now: nobody's victim."""
        return self.ending_from <= self._now < self.expected_end

    @property
    def order_key(self) -> tuple:
        """Victim order: borrowed first, then lowest class, unprotected, least work lost
        (then most recently started)."""
        key = self._order_key
        if key is None:
            key = self._order_key = (
                not self.borrowed,
                self.priority,
                self.protected,
                self.lost,
                -self.started_at,
                self.job_id,
            )
        return key

    def positions_on(self, slot: NodeSlot) -> list[int]:
        """The positions of this job's GPUs on ``slot``."""
        for _, held_slot, positions in self.placement:
            if held_slot is slot:
                return positions
        return []

    def holds_reserved(self) -> bool:
        """Whether one of the job's GPUs is promised to a waiting job after it."""
        return any(slot.reserved[pos] for _, slot, positions in self.placement for pos in positions)


class Rule:
    """Which running jobs a preemptor may stop. ``tenant`` None: any borrower may be
    reclaimed, and no job counts as the preemptor's own (the tenant-blind rule used by
    the heaps). A value (equal and hashed by its fields; not changed once made), part of
    the keys of the cycle's searches. A plain class, as :class:`Preemptor`: compiled, a
    dataclass keeps the interpreted ``__init__`` (and ``__hash__``) ``dataclasses``
    generates."""

    __slots__ = ("priority", "training", "within_guarantee", "tenant", "sharing", "attained")

    def __init__(
        self,
        priority: int | None,  # victims must be below this class; None: no priority preemption
        training: bool,
        within_guarantee: bool,
        tenant: str | None,
        sharing: int | None = None,  # time-sharing victims' class; None: no time-sharing
        attained: float = INF,  # ... that have used at least this many GPU-seconds
    ) -> None:
        self.priority = priority
        self.training = training
        self.within_guarantee = within_guarantee
        self.tenant = tenant
        self.sharing = sharing
        self.attained = attained

    def _fields(self) -> tuple[int | None, bool, bool, str | None, int | None, float]:
        return (
            self.priority,
            self.training,
            self.within_guarantee,
            self.tenant,
            self.sharing,
            self.attained,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Rule):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            "Rule(priority={!r}, training={!r}, within_guarantee={!r}, tenant={!r}, "
            "sharing={!r}, attained={!r})"
        ).format(*self._fields())

    def allows(self, record: RunningRecord) -> bool:
        """Whether ``record`` may be stopped (its age and GPUs are checked elsewhere)."""
        if record.inference and self.training:
            return False
        if record.tenant != self.tenant:
            if self.within_guarantee:
                if record.borrowed:
                    # Reclaim, unless the job is at its stop limit: every stop counts.
                    return not record.protected
            elif not record.borrowed:
                return False  # a borrower never takes guaranteed GPUs of others
        # Own jobs, borrowed or not, and the rest: a lower, preemptible class, unless the
        # job is protected at its preemption limit.
        if (
            self.priority is not None
            and record.preemptible
            and record.priority < self.priority
            and not record.protected
        ):
            return True
        return self.shares_time(record)

    def shares_time(self, record: RunningRecord) -> bool:
        """Whether ``record`` may be stopped for time-sharing: a time-sharing job of the
        rule's class that has used more GPU-time (a higher level), preemptible and not
        protected, of the preemptor's tenant or borrowing (a guarantee is never taken
        from another tenant)."""
        return (
            self.sharing is not None
            and record.time_sharing
            and record.priority == self.sharing
            and record.attained >= self.attained
            and record.preemptible
            and not record.protected
            and (self.tenant is None or record.tenant == self.tenant or record.borrowed)
        )


class Preemptor:
    """The job that wants GPUs, whether it will run inside its tenant's guarantee, and
    how much of the tenant's quota (``account``) the victims must free: ``quota_need``
    GPUs and ``jobs_need`` running-job slots (both 0 when the job fits already)."""

    __slots__ = ("job", "within_guarantee", "account", "quota_need", "jobs_need", "sharing")

    def __init__(
        self,
        job: PendingJob,
        within_guarantee: bool,
        account: Account | None = None,
        quota_need: int = 0,
        jobs_need: int = 0,
    ) -> None:
        self.job = job
        self.within_guarantee = within_guarantee
        self.account = account
        self.quota_need = quota_need
        self.jobs_need = jobs_need
        # Time-sharing (see with_sharing): the attained GPU-seconds from which a
        # time-sharing job of its class may be stopped for it; INF: none.
        self.sharing = INF

    def with_sharing(self, attained: float) -> Preemptor:
        """The same preemptor, that may also stop time-sharing jobs of its class that have
        used at least ``attained`` GPU-seconds (a higher level than its own)."""
        twin = Preemptor(
            self.job, self.within_guarantee, self.account, self.quota_need, self.jobs_need
        )
        twin.sharing = attained
        return twin

    @classmethod
    def under(cls, job: PendingJob, account: Account, within_guarantee: bool) -> Preemptor:
        """The preemptor for running ``job`` under ``account``, inside the guarantee or
        inside guaranteed + borrowing; jobs already stopping count as gone."""
        cap = account.guaranteed if within_guarantee else account.limit
        gpus, jobs = account.shortfall(job.gpus, cap)
        return cls(job, within_guarantee, account, gpus, jobs)

    @property
    def short_of_quota(self) -> bool:
        """Whether the victims must include the tenant's own jobs to free quota."""
        return self.quota_need > 0 or self.jobs_need > 0

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
        tenant = job.tenant if exact else None
        if self.sharing < INF:
            return Rule(
                threshold, training, self.within_guarantee, tenant, job.priority, self.sharing
            )
        return Rule(threshold, training, self.within_guarantee, tenant)

    def shares_time(self, record: RunningRecord) -> bool:
        """Whether ``record``, stopped for this preemptor, is stopped for time-sharing
        (not for a higher class, nor to reclaim borrowed GPUs)."""
        if self.sharing == INF or self.is_reclaim(record):
            return False
        job = self.job
        if job.can_preempt and record.priority < job.priority:
            return False
        return record.time_sharing and record.priority == job.priority

    def is_reclaim(self, record: RunningRecord) -> bool:
        """Reclaim: the job is inside its guarantee, the victim borrows (another tenant)."""
        return self.within_guarantee and record.borrowed and record.tenant != self.job.tenant

    def might_find_victims(self, slice_: SliceIndex) -> bool:
        """Cheap check that a search in ``slice_`` is not hopeless."""
        stats = slice_stats(slice_)
        job = self.job
        if job.can_preempt and stats.priorities and stats.priorities[0] < job.priority:
            return True
        if self.sharing < INF:
            for priority, attained in stats.sharing:
                if priority == job.priority and attained >= self.sharing:
                    return True
        # Reclaiming from other tenants frees none of the tenant's own quota.
        if self.short_of_quota:
            return False
        return self.within_guarantee and bool(stats.borrowers - {job.tenant})


@dataclass(frozen=True, slots=True)
class SliceStats:
    """Possible victims of a slice at the start of the cycle (only shrinks afterwards)."""

    priorities: list[int]  # distinct classes of preemptible, unprotected jobs, ascending
    borrowers: frozenset[str]  # tenants with unprotected borrowed jobs
    has_inference: bool
    # (tenant, job id) of borrowed jobs at their stop limit: nobody reclaims them.
    protected_borrowers: tuple[tuple[str, int], ...] = ()
    # (class, most GPU-seconds attained) of the time-sharing jobs that may be stopped.
    sharing: tuple[tuple[int, float], ...] = ()


def slice_stats(slice_: SliceIndex) -> SliceStats:
    """The slice's :class:`SliceStats`, computed once per cycle."""
    stats = slice_.victim_stats
    if stats is None:
        priorities = set()
        borrowers = set()
        protected: list[tuple[str, int]] = []
        has_inference = False
        sharing: dict[int, float] = {}
        for slot in slice_.slots:
            for record in slot.running:
                if record.stopping:
                    continue
                if record.borrowed and record.protected:
                    protected.append((record.tenant, record.job_id))
                if not record.seasoned or record.ending:
                    continue
                if record.preemptible and not record.protected:
                    priorities.add(record.priority)
                    if record.time_sharing:
                        most = sharing.get(record.priority, -INF)
                        if record.attained > most:
                            sharing[record.priority] = record.attained
                if record.borrowed and not record.protected:
                    borrowers.add(record.tenant)
                has_inference |= record.inference
        stats = SliceStats(
            sorted(priorities),
            frozenset(borrowers),
            has_inference,
            tuple(sorted(set(protected))),
            tuple(sorted(sharing.items())),
        )
        slice_.victim_stats = stats
    return stats


def protected_borrowers(slice_: SliceIndex, tenant: str) -> list[int]:
    """Jobs of other tenants than ``tenant`` borrowing GPUs of ``slice_`` at their stop
    limit: no reclaim stops them (ascending ids)."""
    return [job_id for owner, job_id in slice_stats(slice_).protected_borrowers if owner != tenant]


@dataclass(slots=True)
class VictimChoice:
    """The victims chosen for a job and the node slots it will use."""

    cost: tuple
    slots: list[NodeSlot]
    victims: list[RunningRecord]


def _candidates(slot: NodeSlot) -> list[tuple[RunningRecord, list[int]]]:
    """The jobs on ``slot`` that may ever be victims this cycle, in victim order, with
    their GPUs on the slot (computed once per slot; what changes is checked per use). A
    protected job is nobody's victim."""
    view = slot.victim_view
    if view is None:
        found = [
            (record.order_key, record, record.positions_on(slot))
            for record in slot.running
            if record.seasoned
            and not record.stopping
            and not record.ending
            and not record.protected
        ]
        found.sort(key=lambda item: item[0])
        view = slot.victim_view = [(record, held) for _, record, held in found]
    return view


def evaluate_slot(
    slot: NodeSlot, gpus: int, rule: Rule, now: float
) -> tuple[tuple, list[RunningRecord]] | None:
    """The cheapest victim set on ``slot`` that frees ``gpus`` GPUs, with its cost."""
    need = gpus - slot.idle_unreserved(now)
    if need <= 0:
        return (0, float("-inf"), 0, 0, 0.0, -need, slot.idx), []
    chosen: list[tuple[RunningRecord, int]] = []
    freed = 0
    reserved = slot.reserved
    for record, positions in _candidates(slot):
        if record.stopping or not rule.allows(record):
            continue
        promised = False
        for pos in positions:
            if reserved[pos]:
                promised = True
                break
        if promised:
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
    victims = [record for record, _ in chosen]  # not empty: they free need > 0 GPUs
    highest = victims[0].priority  # a loop: the builtin max of a generator is a generic call
    for record in victims:
        if record.priority > highest:
            highest = record.priority
    cost = (
        sum(1 for record in victims if not record.borrowed),
        highest,
        sum(1 for record in victims if record.protected),
        len(victims),
        sum(record.lost for record in victims),
        freed - need,
        slot.idx,
    )
    return cost, victims


# -- the tenant-specific search (own jobs as victims) ------------------------------------------


def _quota_victims(own: list[RunningRecord], preemptor: Preemptor) -> list[RunningRecord] | None:
    """The tenant's possible victims (victim order) that free the quota the preemptor
    lacks: the first ones that do, less those not needed after all (the most protected
    first); [] if it lacks none, None if they cannot."""
    if not preemptor.short_of_quota:
        return []
    taken: list[RunningRecord] = []
    freed = 0
    for record in own:
        if record.account is not preemptor.account:
            continue
        taken.append(record)
        freed += record.gpus
        if freed >= preemptor.quota_need and len(taken) >= preemptor.jobs_need:
            break
    else:
        return None
    spare_gpus = freed - preemptor.quota_need
    spare_jobs = len(taken) - preemptor.jobs_need
    for index in range(len(taken) - 2, -1, -1):  # the last one was needed
        gpus = taken[index].gpus
        if spare_gpus >= gpus and spare_jobs >= 1:
            spare_gpus -= gpus
            spare_jobs -= 1
            del taken[index]
    return taken


def _slot_victims(
    slot: NodeSlot, gpus: int, idle: int, rule: Rule, quota_ids: set[int]
) -> tuple[list[tuple[RunningRecord, int]], int] | None:
    """Victims on ``slot`` (``idle`` GPUs idle and unreserved) besides the quota victims
    (``quota_ids``), in victim order and with their GPUs there, that make room for
    ``gpus`` GPUs with what the quota victims free there, and the GPUs still needed once
    the quota victims are gone (<= 0: none); None if there are not enough."""
    candidates = _candidates(slot)
    need = gpus - idle
    if quota_ids:
        for record, positions in candidates:
            if id(record) in quota_ids:
                need -= len(positions)
    if need <= 0:
        return [], need
    chosen: list[tuple[RunningRecord, int]] = []
    freed = 0
    reserved = slot.reserved
    for record, positions in candidates:
        if record.stopping or id(record) in quota_ids or not rule.allows(record):
            continue
        if True in [reserved[pos] for pos in positions]:
            continue
        chosen.append((record, len(positions)))
        freed += len(positions)
        if freed >= need:
            # Drop victims that are not needed after all, the most protected first.
            for item in reversed(list(chosen)):
                if freed - item[1] >= need:
                    chosen.remove(item)
                    freed -= item[1]
            return chosen, need
    return None


def _trim(
    victims: list[RunningRecord], slots: list[NodeSlot], gpus: int, preemptor: Preemptor, now: float
) -> tuple[tuple, list[RunningRecord]]:
    """Drop the victims (given in victim order) needed neither for the GPUs on ``slots``
    nor for the tenant's quota, the most protected first; returns the cost of the rest
    (as :func:`evaluate_slot` counts it, over all slots) and the rest."""
    need: dict[int, int] = {}
    held: dict[int, list[tuple[int, int]]] = {}  # victim -> [(slot, its GPUs there)]
    for slot in slots:
        need[id(slot)] = gpus - slot.idle_unreserved(now)
        for record, positions in _candidates(slot):
            held.setdefault(id(record), []).append((id(slot), len(positions)))
    freed = dict.fromkeys(need, 0)
    for record in victims:
        for key, count in held.get(id(record), ()):
            freed[key] += count
    account = preemptor.account
    spare_gpus = -preemptor.quota_need
    spare_jobs = -preemptor.jobs_need
    for record in victims:
        if record.account is account:
            spare_gpus += record.gpus
            spare_jobs += 1
    kept = list(victims)
    for index in range(len(victims) - 1, -1, -1):
        record = victims[index]
        mine = held.get(id(record), ())
        if any(freed[key] - count < need[key] for key, count in mine):
            continue
        if record.account is account:
            if spare_gpus < record.gpus or spare_jobs < 1:
                continue
            spare_gpus -= record.gpus
            spare_jobs -= 1
        for key, count in mine:
            freed[key] -= count
        del kept[index]
    cost = (
        sum(1 for record in kept if not record.borrowed),
        max((record.priority for record in kept), default=float("-inf")),
        sum(1 for record in kept if record.protected),
        len(kept),
        sum(record.lost for record in kept),
        sum(freed[key] - need[key] for key in need),
    )
    return cost, kept


def _order_key(record: RunningRecord) -> tuple:
    return record.order_key


# An entry of the victim search's heaps: (lower bound of the cost, slot number, slot
# version). Typed, so that the compiled search reads the slot's version directly.
_Entry = tuple[tuple, int, int]


class VictimFinder:
    """Finds victim sets during one cycle, sharing work between similar preemptors."""

    def __init__(self, now: float) -> None:
        self.now = now
        # (slice, gpus, tenant-blind rule) -> ([(cost, slot idx, version)], {idx: version},
        # [grown slots seen])
        self._heaps: dict[tuple, tuple[list[_Entry], dict[int, int], list[int]]] = {}
        # slice key -> tenant -> its preemptible, seasoned running jobs, in victim order
        self._own: dict[tuple, dict[str, list[RunningRecord]]] = {}

    def _heap(
        self, slice_: SliceIndex, gpus: int, rule: Rule
    ) -> tuple[list[_Entry], dict[int, int]]:
        """The heap of (lower bound of the cost, slot number, slot version) for a job size
        and rule, built once per cycle. Slots only lose idle GPUs and victims, so a stale
        entry's cost is a lower bound, re-evaluated when it reaches the top; a slot that
        gained idle GPUs (a held reservation given back, ``slice_.grown``) gets a fresh
        entry with its lower cost before the next search."""
        key = (slice_.key, gpus, rule)
        found = self._heaps.get(key)
        if found is None:
            heap: list[_Entry] = []
            pushed: dict[int, int] = {}
            for slot in slice_.slots:
                if len(slot.gpu_ids) < gpus:
                    continue
                result = evaluate_slot(slot, gpus, rule, self.now)
                if result is not None:
                    heap.append((result[0], slot.idx, slot.version))
                    pushed[slot.idx] = slot.version
            heapify(heap)
            found = self._heaps[key] = (heap, pushed, [len(slice_.grown)])
        heap, pushed, seen = found
        grown = slice_.grown
        if seen[0] < len(grown):
            slots = slice_.slots
            for idx in dict.fromkeys(grown[seen[0] :]):
                slot = slots[idx]
                if pushed.get(idx) == slot.version or len(slot.gpu_ids) < gpus:
                    continue
                pushed[idx] = slot.version
                result = evaluate_slot(slot, gpus, rule, self.now)
                if result is not None:
                    heappush(heap, (result[0], idx, slot.version))
            seen[0] = len(grown)
        return heap, pushed

    def find(self, slice_: SliceIndex, preemptor: Preemptor) -> VictimChoice | None:
        """The best victim set in ``slice_`` for the preemptor's job; None if there is
        none; one without victims if the job needs none there (idle GPUs enough)."""
        job = preemptor.job
        exact = preemptor.rule(slice_, exact=True)
        own: list[RunningRecord] | None = None
        quota: list[RunningRecord] = []
        if preemptor.short_of_quota or not preemptor.within_guarantee:
            own = self._own_victims(slice_, job.tenant, exact)
            found = _quota_victims(own, preemptor)
            if found is None:
                return None
            quota = found
            if not quota and all(record.borrowed for record in own):
                own = None  # the tenant-blind search sees every victim already
        if own is not None:
            return self._find_with_own(slice_, preemptor, exact, own, quota)
        results = self._search(slice_, preemptor, exact)
        if len(results) < job.nodes:
            return None
        picked = results[: job.nodes]
        victims: dict[int, RunningRecord] = {}
        for _, _, slot_victims in picked:
            for record in slot_victims:
                victims.setdefault(record.job.id, record)
        if not victims:
            # Enough idle GPUs after all: nothing to preempt now. Not a failed search:
            # those GPUs may be reserved later in the cycle, and victims needed then.
            return VictimChoice((), [], [])
        # Per node at worst, as for one node; work lost over the whole set.
        cost = (
            *(max(item[0][i] for item in picked) for i in range(4)),
            sum(record.lost for record in victims.values()),
            max(item[0][5] for item in picked),
        )
        return VictimChoice(cost, [slot for _, slot, _ in picked], list(victims.values()))

    def _search(
        self, slice_: SliceIndex, preemptor: Preemptor, exact: Rule
    ) -> list[tuple[tuple, NodeSlot, list[RunningRecord]]]:
        """The best node slots by the heaps, each with its exact victims, best first: at
        least the job's node count of them if the slice has that many."""
        gpus, nodes = preemptor.job.gpus_per_node, preemptor.job.nodes
        blind = preemptor.rule(slice_, exact=False)
        heap, pushed = self._heap(slice_, gpus, blind)
        slots = slice_.slots
        results: list[tuple[tuple, NodeSlot, list[RunningRecord]]] = []
        popped: list[_Entry] = []
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
        results.sort(key=lambda item: item[0])
        return results

    def _own_victims(self, slice_: SliceIndex, tenant: str, rule: Rule) -> list[RunningRecord]:
        """The tenant's running jobs in ``slice_`` that ``rule`` lets stop now, in victim
        order (the per-tenant lists are built once per slice and cycle)."""
        by_tenant = self._own.get(slice_.key)
        if by_tenant is None:
            by_tenant = {}
            seen: set[int] = set()
            for slot in slice_.slots:
                for record in slot.running:
                    if (
                        record.seasoned
                        and not record.stopping
                        and not record.ending
                        and record.preemptible
                        and not record.protected
                        and id(record) not in seen
                    ):
                        seen.add(id(record))
                        by_tenant.setdefault(record.tenant, []).append(record)
            for records in by_tenant.values():
                records.sort(key=lambda record: record.order_key)
            self._own[slice_.key] = by_tenant
        return [
            record
            for record in by_tenant.get(tenant, ())
            if not record.stopping and rule.allows(record) and not record.holds_reserved()
        ]

    def _find_with_own(
        self,
        slice_: SliceIndex,
        preemptor: Preemptor,
        exact: Rule,
        own: list[RunningRecord],
        quota: list[RunningRecord],
    ) -> VictimChoice | None:
        """The best victim set when the tenant's own jobs may be victims: the quota
        victims, plus victims on the best nodes among those holding the tenant's jobs and
        those the heaps find, less the victims not needed after all."""
        job = preemptor.job
        gpus, nodes, now = job.gpus_per_node, job.nodes, self.now
        candidates: dict[int, NodeSlot] = {}
        for record in own:
            for _, slot, _ in record.placement:
                if len(slot.gpu_ids) >= gpus:
                    candidates.setdefault(slot.idx, slot)
        quota_ids = {id(record) for record in quota}
        # The quota victims are all needed (see _quota_victims): only victims of the
        # tenant's quota among those on a node can make some of them unnecessary.
        base = (
            sum(1 for record in quota if not record.borrowed),
            max((record.priority for record in quota), default=float("-inf")),
            0,  # the tenant's own jobs are never protected victims
            len(quota),
        )
        scored = self._score(candidates, preemptor, exact, quota, quota_ids, base)
        scored.sort(key=lambda item: item[:3])
        # On any other node the quota victims are needed all the same, plus victims of
        # other tenants: where the tenant's own jobs make room without further victims,
        # the heaps need not be asked (on a tie, rather wait for GPUs being freed).
        if len(scored) < nodes or scored[nodes - 1][0][:4] > base:
            others = {
                slot.idx: slot
                for _, slot, _ in self._search(slice_, preemptor, exact)[:nodes]
                if slot.idx not in candidates
            }
            scored += self._score(others, preemptor, exact, quota, quota_ids, base)
            scored.sort(key=lambda item: item[:3])
        if len(scored) < nodes:
            return None
        picked = scored[:nodes]
        slots = [item[3] for item in picked]
        if nodes == 1:
            cost, victims = picked[0][0], picked[0][5]
        else:
            merged = {id(record): record for item in picked for record in item[4]}
            merged.update((id(record), record) for record in quota)
            ordered = sorted(merged.values(), key=_order_key)
            cost, victims = _trim(ordered, slots, gpus, preemptor, now)
        if not victims:
            return VictimChoice((), [], [])  # nothing to preempt now (see find)
        return VictimChoice(cost, slots, victims)

    def _score(
        self,
        candidates: dict[int, NodeSlot],
        preemptor: Preemptor,
        exact: Rule,
        quota: list[RunningRecord],
        quota_ids: set[int],
        base: tuple,
    ) -> list[tuple]:
        """(cost, idle GPUs taken, idx, slot, victims on it, all victims) of each
        candidate slot that can make room for the job with the quota victims."""
        gpus, now = preemptor.job.gpus_per_node, self.now
        account = preemptor.account
        scored = []
        for idx, slot in candidates.items():
            idle = slot.idle_unreserved(now)
            found = _slot_victims(slot, gpus, idle, exact, quota_ids)
            if found is None:
                continue
            chosen, need = found
            on_slot = [record for record, _ in chosen]
            if preemptor.short_of_quota and any(record.account is account for record in on_slot):
                victims = sorted(quota + on_slot, key=_order_key)
                cost, victims = _trim(victims, [slot], gpus, preemptor, now)
            else:
                victims = quota + on_slot
                cost = (
                    base[0] + sum(1 for record in on_slot if not record.borrowed),
                    max([base[1], *(record.priority for record in on_slot)]),
                    sum(1 for record in on_slot if record.protected),
                    len(victims),
                    sum(record.lost for record in victims),
                    sum(count for _, count in chosen) - need,
                )
            # On a tie, rather wait for GPUs being freed than hold idle ones.
            scored.append((cost, min(idle, gpus), idx, slot, on_slot, victims))
        return scored
