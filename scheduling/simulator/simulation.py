"""The discrete-event replay of a scenario under one policy.

Events are arrivals, ends (a job completes, or is killed at its runtime limit), stops (a
preempted job's grace period is over: it loses the work since its last checkpoint and is
requeued with what remains) and wake-ups (a running job becomes old enough to be
preempted, or its protection at its preemption limit is over). A job saves a checkpoint
every ``checkpoint_interval`` seconds of each run; the engine is told when it last did,
and how often the job was preempted, as the dispatch loop tells it. Every decision -
what starts, where, what is preempted - comes from :func:`scheduling.engine.plan`,
called the way the dispatch loop calls it.

When to plan: the dispatch loop runs on every submit and finish and every few seconds.
The replay plans a pool only when something changed in it, at the next multiple of
``dispatch_interval`` (5 s, the dispatch loop's default), so that arrivals and ends that
close together are coalesced into one cycle as the real loop does; with an interval of 0
it plans at the exact time of each change, after every event of that time. Jobs thus
wait up to one interval longer than they would with a loop that reacted instantly.

Pools share no GPUs, so each pool is planned on its own snapshot, which makes a cycle
cost what that pool holds rather than the whole cluster. The one thing pools share is a
tenant's fair share (usage history plus GPUs held now, over all pools): GPUs a tenant
holds in the other pools are added to its usage in the snapshot, so the engine orders
tenants exactly as it would with every pool in one snapshot.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right, insort
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from heapq import heappop, heappush
from itertools import count, islice

from scheduling.engine import (
    KeptCluster,
    PendingInfo,
    PendingJob,
    Placement,
    Plan,
    RunningJob,
    Snapshot,
    decay_usage,
    plan,
    promotions,
    reasons,
)
from scheduling.engine.defaults import TIME_SHARING_LEVELS, TIME_SHARING_MIN_WAIT_SECONDS
from scheduling.engine.preemption import (
    INFERENCE_WORKLOAD,
    TRAINING_WORKLOADS,
    attained_service,
    protected_until,
)
from scheduling.engine.quota import fit_guarantee
from scheduling.runtime_rule import HISTORY_JOBS, predicted_seconds, ratio_statistic

from .model import Scenario, SimJob
from .policies import Policy
from .snapshot import SnapshotBuilder

INF = math.inf

# Event kinds. Events of one time are handled in the order they were scheduled.
ARRIVE, END, STOPPED, WAKE, SPREAD = range(5)

# Outcomes of a job.
COMPLETED = "completed"
TIMED_OUT = "timed_out"
UNSCHEDULABLE = "unschedulable"  # the engine says it can never start (too big, no quota)
NEVER_STARTED = "never_started"  # still waiting when nothing else could happen


class ReplayStalled(RuntimeError):
    """The replay is caught in a preemption storm (see ``SimConfig.max_preemptions``)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Settings of a replay that are not part of the scenario.

    ``checkpoint_interval``: a job saves its progress every so many seconds of its run
    (0: never), so a preempted job loses what it did since its last checkpoint.
    ``usage_half_life``: fair-share history half-life (Sluice's default is 7 days).
    ``keep_reservations``: hand each pending job's reservation back to the next cycle
    (``PendingJob.reserved_gpu_ids``), as the dispatch loop does. Without it a job that
    preempted others may find the freed GPUs taken by a job ordered before it and
    preempt again, cycle after cycle.
    ``max_waiting_per_tenant``: 0 (the default) hands every waiting job to each cycle,
    as the dispatch loop does. N > 0 hands only each tenant's N oldest waiting jobs of
    each class, like Slurm's ``bf_max_job_user``: far cheaper cycles on long queues, at
    the price of deeper jobs not being considered (for backfill in particular) until
    older ones of their tenant and class have started.
    ``full_cycles``: have the engine consider every waiting job in every cycle, as the
    dispatch loop does to explain each one. By default a cycle stops once no job left
    could start or preempt (``Snapshot.decisions_only``): the decisions of each cycle
    are the same, several times faster on long queues; what differs is that the jobs
    left out keep the reservation of the last cycle that considered them for the next.
    ``wait_reasons``: record under which reason the waiting jobs wait
    (:class:`WaitReasons`, ``ReplayResult.wait_reasons``).
    ``max_preemptions``: the replay gives up (:class:`ReplayStalled`) after this many
    preemptions per job on average: jobs preempted again and again for others that then
    do not start is a policy (or engine) defect worth a report, not hours of replay. (The
    limit per job that protects a job from churn is its workload policy's,
    :attr:`WorkloadSpec.max_preemptions`.)
    """

    dispatch_interval: float = 5.0
    checkpoint_interval: float = 1800.0
    usage_half_life: float = 7 * 86400.0
    keep_reservations: bool = True
    max_waiting_per_tenant: int = 0
    full_cycles: bool = False
    max_preemptions: float = 20.0
    wait_reasons: bool = False


class JobRun:
    """A job's life in one replay: where it stands and what happened to it."""

    __slots__ = (
        "job",
        "remaining",
        "first_start",
        "attempt_start",
        "finish",
        "outcome",
        "code",
        "preemptions",
        "lost_gpu_seconds",
        "gpu_seconds",
        "epoch",
        "gpu_ids",
        "borrowed",
        "stopping",
        "completes",
        "pending_record",
        "running_record",
        "pending_since",
        "attempts",
        "waits",
    )

    def __init__(self, job: SimJob, pending_record: PendingJob) -> None:
        self.job = job
        self.remaining = float(job.duration)
        self.first_start: float | None = None
        self.attempt_start = 0.0
        self.finish: float | None = None
        self.outcome = ""
        self.code = ""  # the engine's reason when the job could never start
        self.preemptions = 0
        self.lost_gpu_seconds = 0.0
        self.gpu_seconds = 0.0
        self.epoch = 0  # bumped at each start and stop: older events are stale
        self.gpu_ids: tuple[int, ...] = ()
        self.borrowed = False
        self.stopping = False
        self.completes = False  # the running attempt ends by completing (not timing out)
        self.pending_record = pending_record
        self.running_record: RunningJob | None = None
        self.pending_since = job.submit
        # (start, end, GPU ids) of each run of the job
        self.attempts: list[tuple[float, float, tuple[int, ...]]] = []
        # (from, to) of each wait that ended: the first from submit, then one from each
        # preemption's stop to the next start
        self.waits: list[tuple[float, float]] = []

    @property
    def first_wait(self) -> float | None:
        """From submit to first start (None if it never started)."""
        return None if self.first_start is None else self.first_start - self.job.submit

    @property
    def rewait(self) -> float:
        """Time waiting again after preemptions, until each next start (a wait that had
        not ended when the replay did is not counted)."""
        return sum(end - start for start, end in self.waits[1:])

    @property
    def total_wait(self) -> float | None:
        """All the time the job waited: its first wait and every re-wait after a
        preemption (None if it never started). This is the queueing delay of the
        metrics."""
        first = self.first_wait
        return None if first is None else first + self.rewait


@dataclass(slots=True)
class ReplayResult:
    """What a replay produced: every job's run and the cluster's state over time.

    ``series`` holds change points (time, jobs waiting, GPUs busy) of step functions.
    """

    policy: str
    scenario: str
    runs: list[JobRun]
    capacity: int
    guarantees: dict[str, int]
    series: tuple[list[float], list[int], list[int]]
    plans: int = 0
    plan_seconds: float = 0.0
    wall_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    # (size bucket, reason code) -> job-seconds (``SimConfig.wait_reasons``; see
    # :class:`WaitReasons`), empty without it.
    wait_reasons: dict[tuple[str, str], float] = field(default_factory=dict)
    # Borrowed running jobs brought inside their tenant's guarantee (engine.promotions).
    promotions: int = 0


# Jobs by total GPUs, for the wait reasons and the waits by size (metrics.wait_by_size).
SIZE_BUCKETS: tuple[tuple[int, float, str], ...] = (
    (1, 1, "1"),
    (2, 4, "2-4"),
    (5, 8, "5-8"),
    (9, math.inf, ">8"),
)
# The reason of a waiting job a decisions-only cycle did not reach: the cycle stopped
# once no job left could start or preempt (Snapshot.decisions_only).
NOT_REACHED = "NOT_REACHED"


def size_bucket(gpus: int) -> str:
    """The :data:`SIZE_BUCKETS` label of a job of ``gpus`` GPUs."""
    for low, high, label in SIZE_BUCKETS:
        if low <= gpus <= high:
            return label
    return SIZE_BUCKETS[0][2]


class WaitReasons:
    """Where the waiting goes: the job-seconds each waiting job spends under the reason
    the engine last gave it (``PendingInfo.code``, or :data:`NOT_REACHED`), by job size.

    A reason counts from the cycle that gave it to the pool's next cycle (a skipped cycle,
    one that could start nothing, changes no reason). The time a job waits before the
    first cycle that sees it (it arrived, or was requeued, while nothing could start) is
    counted by no reason: :func:`~scheduling.simulator.metrics.wait_by_size` reports it."""

    __slots__ = ("seconds", "_last")

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        # pool -> (time of its last cycle, waiting jobs counted by (bucket, reason))
        self._last: dict[str, tuple[float, dict[tuple[str, str], int]]] = {}

    def cycle(self, pool: str, now: float, snapshot: Snapshot, result: Plan) -> None:
        """Count the pool's previous reasons up to ``now``; take this cycle's."""
        last = self._last.get(pool)
        if last is not None and now > last[0]:
            span = now - last[0]
            seconds = self.seconds
            for key, jobs in last[1].items():
                seconds[key] += span * jobs
        placed = {placement.job_id for placement in result.placements}
        explained = result.pending
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for job in snapshot.pending:
            if job.id in placed:
                continue
            info = explained.get(job.id)
            counts[(size_bucket(job.gpus), NOT_REACHED if info is None else info.code)] += 1
        self._last[pool] = (now, counts)


class RuntimeLearner:
    """Runtime predictions learnt as the replay goes, by the dispatch loop's rule
    (:mod:`scheduling.runtime_rule`): each job that completes or times out adds its
    last run's ``runtime / limit`` (a time-out: 1) to its tenant's, project's and
    workload type's history (the newest :data:`HISTORY_JOBS`); a job starting is
    predicted to run its limit times the 75th percentile of that history (0: fewer
    than three jobs there, no prediction). The trace has no submitters: the project
    stands for one. Preempted runs teach nothing, as in the portal."""

    __slots__ = ("_histories", "_statistics")

    def __init__(self) -> None:
        self._histories: dict[tuple[str, str, str], deque[float]] = {}
        # The statistic of a history, until the history changes.
        self._statistics: dict[tuple[str, str, str], tuple[float, int] | None] = {}

    @staticmethod
    def _key(job: SimJob) -> tuple[str, str, str]:
        return (job.tenant, job.project, job.workload_type)

    def ended(self, job: SimJob, runtime: float, timed_out: bool) -> None:
        """``job``'s run of ``runtime`` seconds ended (``timed_out``: at its limit)."""
        if job.limit <= 0:
            return
        ratio = 1.0 if timed_out else min(max(runtime / job.limit, 0.0), 1.0)
        key = self._key(job)
        history = self._histories.get(key)
        if history is None:
            history = self._histories[key] = deque(maxlen=HISTORY_JOBS)
        history.append(ratio)
        self._statistics.pop(key, None)

    def expected(self, job: SimJob) -> float:
        """Seconds ``job`` is predicted to run from a start (0: not known)."""
        if job.limit <= 0:
            return 0.0
        key = self._key(job)
        if key in self._statistics:
            found = self._statistics[key]
        else:
            found = self._statistics[key] = ratio_statistic(self._histories.get(key))
        return 0.0 if found is None else predicted_seconds(job.limit, found[0])


class Replay:
    """Replays one scenario under one policy; call :meth:`run` once."""

    def __init__(
        self,
        scenario: Scenario,
        policy: Policy,
        config: SimConfig | None = None,
        progress: Callable[[float], None] | None = None,
        builder: SnapshotBuilder | None = None,
    ) -> None:
        self.scenario = scenario
        self.policy = policy
        self.config = config or SimConfig()
        self.progress = progress
        self.builder = builder or SnapshotBuilder(scenario, policy.time_sharing)
        self.runs = [JobRun(job, self.builder.pending_job(job)) for job in scenario.jobs]
        self.by_id = {run.job.id: run for run in self.runs}
        self.pools = sorted(self.builder.nodes_by_pool)
        self.free = {pool: self.builder.pool_gpus(pool) for pool in self.pools}
        # Idle GPUs per node (by the builder's node id), for the cheap "worth a cycle?" test.
        self.node_free: dict[int, int] = {}
        self.pool_nodes: dict[str, list[int]] = {}
        for pool, nodes in self.builder.nodes_by_pool.items():
            self.pool_nodes[pool] = [node.id for node in nodes]
            for node in nodes:
                self.node_free[node.id] = len(node.gpus)
        # Pools with topology blocks: a job of several nodes waiting for one block there
        # is planned again when its topology wait is over (it may then be spread).
        self.block_pools = {
            pool
            for pool, nodes in self.builder.nodes_by_pool.items()
            if any(node.block for node in nodes)
        }
        # Per pool: the jobs whose topology wait is paused (they wait for something else
        # than one block), and since when (see _keep_topology_waits).
        self.topology_paused: dict[str, dict[int, float]] = defaultdict(dict)
        # Each pool's cluster index, reset for each cycle instead of built anew.
        self.kept_clusters = {pool: KeptCluster() for pool in self.pools}
        self.pending: dict[str, dict[int, JobRun]] = defaultdict(dict)
        # Waiting jobs per pool counted by what decides whether they might preempt
        # (training-like, class may preempt, class, tenant, GPUs): see _preemptors.
        self.pending_kinds: dict[str, dict[tuple, int]] = defaultdict(lambda: defaultdict(int))
        # Waiting time-sharing jobs per pool and class (see _might_share).
        self.sharing: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        self.sharing_from = INF  # GPU-seconds from which a running job may be stopped
        # A waiting time-sharing job stops nobody before it has waited this long: a cycle
        # is planned then (pool, time) (see _enqueue).
        self.sharing_wait = 0.0
        self.sharing_wakes: set[tuple[str, float]] = set()
        if policy.time_sharing:
            first = policy.time_sharing_first_level_gpu_seconds
            if first is None:
                first = TIME_SHARING_LEVELS[0] if TIME_SHARING_LEVELS else INF
            self.sharing_from = first
            wait = policy.time_sharing_min_wait_seconds
            self.sharing_wait = TIME_SHARING_MIN_WAIT_SECONDS if wait is None else wait
        # ... and by what decides whether they might start (tenant, GPUs per node, GPUs,
        # preemptible): see _might_start.
        self.pending_shapes: dict[str, dict[tuple, int]] = defaultdict(lambda: defaultdict(int))
        # (submit, id) of the waiting jobs per pool and (tenant, class), in order: the
        # window of max_waiting_per_tenant.
        self.groups: dict[str, dict[tuple[str, str], list]] = defaultdict(lambda: defaultdict(list))
        self.running: dict[str, dict[int, JobRun]] = defaultdict(dict)
        # The engine's records of the running and waiting jobs per pool, in the order of
        # self.running and self.pending (each changed with them): a cycle's snapshot
        # copies these lists instead of reading a record from every run.
        self.running_records: dict[str, dict[int, RunningJob]] = defaultdict(dict)
        self.pending_records: dict[str, dict[int, PendingJob]] = defaultdict(dict)
        self.in_use: dict[str, int] = defaultdict(int)
        self.in_use_pool: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.guaranteed_pool: dict[tuple[str, str], int] = defaultdict(int)
        self.quotas_of: dict[tuple[str, str], list] = defaultdict(list)
        for quota in scenario.quotas:
            self.guaranteed_pool[(quota.tenant, quota.pool)] += max(quota.guaranteed, 0)
            self.quotas_of[(quota.tenant, quota.pool)].append(quota)
        self.caps = _quota_caps(scenario)
        # Per (tenant, pool): the GPUs its borrowed jobs hold (stopping ones included)
        # and its borrowed jobs not stopping, which a release may bring inside its
        # guarantee (_promote).
        self.borrowed_gpus: dict[tuple[str, str], int] = defaultdict(int)
        self.borrowers: dict[tuple[str, str], dict[int, JobRun]] = defaultdict(dict)
        self.promotions = 0
        self.usage: dict[str, float] = {}
        self.usage_time = self.usage_origin = 0.0
        self.events: list = []
        self._seq = count()
        self.dirty: set[str] = set()
        self.plan_at: float | None = None
        self.wake_at: dict[str, float] = {}
        # Per pool, the times from which running jobs may be stopped (old enough; then
        # past their protection at their preemption limit), in time order: (time,
        # sequence, run, its epoch then, protected then). See _schedule_wake.
        self.ready: dict[str, list[tuple[float, int, JobRun, int, bool]]] = defaultdict(list)
        self.waiting = 0
        self.busy = 0
        self.series: tuple[list[float], list[int], list[int]] = ([], [], [])
        self.plans = 0
        self.plan_seconds = 0.0
        self.preemptions = 0
        self.preemption_budget = max(1000, int(self.config.max_preemptions * len(self.runs)))
        self.learner = RuntimeLearner()
        self.wait_reasons = WaitReasons() if self.config.wait_reasons else None
        # Without backfill: per pool, the waiting jobs whose records carry a reservation
        # handed on (see _keep_reservations).
        self.handed_on: dict[str, dict[int, PendingJob]] = defaultdict(dict)

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> ReplayResult:
        """Replay every event; returns the jobs' runs and the series."""
        started = time.perf_counter()
        self._screen()
        order = sorted(
            (run for run in self.runs if not run.outcome),
            key=lambda run: (run.job.submit, run.job.id),
        )
        if order:
            self.usage_time = self.usage_origin = order[0].job.submit
        for run in order:
            self._push(run.job.submit, ARRIVE, run, 0)
        total = max(len(order), 1)
        arrived = 0
        report_every = max(total // 100, 1)
        events = self.events
        while True:
            next_time = events[0][0] if events else INF
            if self.plan_at is not None and self.plan_at < next_time:
                self._plan(self.plan_at)
                continue
            if not events:
                break
            when, _, kind, subject, epoch = heappop(events)
            if kind == ARRIVE:
                self._arrive(subject, when)
                arrived += 1
                if self.progress is not None and arrived % report_every == 0:
                    self.progress(arrived / total)
            elif kind == END:
                self._end(subject, when, epoch)
            elif kind == STOPPED:
                self._stopped(subject, when, epoch)
            elif kind == SPREAD:
                self._spread(subject, when)
            else:
                self._wake(subject, when)
            self._record(when)
        for pool in self.pools:
            for run in list(self.pending[pool].values()):
                self._dequeue(run)
                run.outcome = NEVER_STARTED
        return ReplayResult(
            policy=self.policy.name,
            scenario=self.scenario.name,
            runs=self.runs,
            capacity=self.scenario.capacity,
            guarantees=self.scenario.guarantees(),
            series=self.series,
            plans=self.plans,
            plan_seconds=self.plan_seconds,
            wall_seconds=time.perf_counter() - started,
            wait_reasons={} if self.wait_reasons is None else dict(self.wait_reasons.seconds),
            promotions=self.promotions,
        )

    def _screen(self) -> None:
        """Set aside the jobs the engine says can never start (no node can hold them, or
        bigger than their quota allows): asked once per kind of job, on the empty pool.
        Those reasons do not depend on what runs, so no later cycle would start them."""
        verdicts: dict[tuple, str] = {}
        for run in self.runs:
            job = run.job
            key = (
                job.pool,
                job.tenant,
                job.priority_class,
                job.workload_type,
                job.gpus_per_node,
                job.nodes,
                job.gpu_models,
                job.min_gpu_memory_mb,
            )
            code = verdicts.get(key)
            if code is None:
                snapshot = self.builder.snapshot(
                    job.submit, [job.pool], [], [run.pending_record], {}, self.policy
                )
                info = plan(snapshot).pending.get(job.id)
                code = info.code if info is not None and info.code in reasons.NEVER_STARTS else ""
                verdicts[key] = code
            if code:
                run.outcome, run.code = UNSCHEDULABLE, code

    def _push(self, when: float, kind: int, subject, epoch: int) -> None:
        heappush(self.events, (when, next(self._seq), kind, subject, epoch))

    def _touch(self, pool: str, when: float) -> None:
        """Something changed in ``pool`` at ``when``: plan it at the next dispatch tick."""
        self.dirty.add(pool)
        if self.plan_at is None:
            interval = self.config.dispatch_interval
            self.plan_at = math.ceil(when / interval) * interval if interval > 0 else when

    def _record(self, when: float) -> None:
        times, waiting, busy = self.series
        if times and times[-1] == when:
            waiting[-1], busy[-1] = self.waiting, self.busy
        elif not times or waiting[-1] != self.waiting or busy[-1] != self.busy:
            times.append(when)
            waiting.append(self.waiting)
            busy.append(self.busy)

    def _advance_usage(self, when: float) -> None:
        """Decay and accrue fair-share usage up to ``when`` (before GPUs change hands)."""
        if when > self.usage_time:
            self.usage = decay_usage(
                self.usage, when - self.usage_time, self.config.usage_half_life, self.in_use
            )
            self.usage_time = when

    # -- the waiting jobs ---------------------------------------------------------------------

    def _enqueue(self, run: JobRun, when: float) -> None:
        job = run.job
        run.pending_since = when
        self.pending[job.pool][job.id] = run
        self.pending_records[job.pool][job.id] = run.pending_record
        self.pending_kinds[job.pool][_preemptor_kind(run.pending_record)] += 1
        if run.pending_record.time_sharing:
            self.sharing[job.pool][run.pending_record.priority] += 1
            if self.sharing_wait > 0:
                wake = (job.pool, when + self.sharing_wait)
                if wake not in self.sharing_wakes:
                    self.sharing_wakes.add(wake)
                    self._push(wake[1], WAKE, job.pool, 0)
        self.pending_shapes[job.pool][_shape(run.pending_record)] += 1
        if self.config.max_waiting_per_tenant:
            insort(self.groups[job.pool][(job.tenant, job.priority_class)], (job.submit, job.id))
        self.waiting += 1
        self._touch(job.pool, when)
        run.pending_record.topology_since = None  # a requeued job waits for a block anew
        self.topology_paused[job.pool].pop(job.id, None)

    def _dequeue(self, run: JobRun) -> None:
        job = run.job
        del self.pending[job.pool][job.id]
        del self.pending_records[job.pool][job.id]
        _count_down(self.pending_kinds[job.pool], _preemptor_kind(run.pending_record))
        if run.pending_record.time_sharing:
            _count_down(self.sharing[job.pool], run.pending_record.priority)
        _count_down(self.pending_shapes[job.pool], _shape(run.pending_record))
        self.topology_paused[job.pool].pop(job.id, None)
        if self.config.max_waiting_per_tenant:
            group = self.groups[job.pool][(job.tenant, job.priority_class)]
            del group[bisect_left(group, (job.submit, job.id))]
        self.waiting -= 1

    # -- events ---------------------------------------------------------------------------

    def _arrive(self, run: JobRun, when: float) -> None:
        self._enqueue(run, when)

    def _end(self, run: JobRun, when: float, epoch: int) -> None:
        if epoch != run.epoch or run.running_record is None:
            return  # stopped by a preemption before
        self._advance_usage(when)
        run.remaining = max(run.remaining - (when - run.attempt_start), 0.0)
        run.outcome = COMPLETED if run.completes else TIMED_OUT
        run.finish = when
        self.learner.ended(run.job, when - run.attempt_start, not run.completes)
        self._release(run, when)
        self._touch(run.job.pool, when)

    def _stopped(self, run: JobRun, when: float, epoch: int) -> None:
        """A preempted job's grace is over: keep the work up to its last checkpoint."""
        if epoch != run.epoch or run.running_record is None:
            return  # it ended on its own during the grace period
        self._advance_usage(when)
        elapsed = when - run.attempt_start
        interval = self.config.checkpoint_interval
        saved = min(elapsed // interval * interval if interval > 0 else 0.0, run.remaining)
        run.remaining -= saved
        run.lost_gpu_seconds += (elapsed - saved) * len(run.gpu_ids)
        run.preemptions += 1
        record = run.pending_record
        record.preemptions = run.preemptions
        record.queued_at = when
        self.preemptions += 1
        if self.preemptions > self.preemption_budget:
            raise ReplayStalled(
                f"{self.policy.name}: {self.preemptions:,} preemptions for {len(self.runs):,} "
                f"jobs by day {(when - self.usage_origin) / 86400:.0f} (job "
                f"{run.job.name} alone {run.preemptions} times): a preemption storm, "
                "replay abandoned"
            )
        self._release(run, when)
        record.attained_gpu_seconds = run.gpu_seconds  # every run's GPU-time so far
        run.epoch += 1
        self._enqueue(run, when)

    def _wake(self, pool: str, when: float) -> None:
        if self.wake_at.get(pool) == when:
            del self.wake_at[pool]
            self._touch(pool, when)
        if (pool, when) in self.sharing_wakes:
            self.sharing_wakes.discard((pool, when))
            self._touch(pool, when)

    # -- starting and stopping jobs ------------------------------------------------------------

    def _start(self, run: JobRun, placement: Placement, now: float) -> None:
        job = run.job
        self._dequeue(run)
        record = run.pending_record
        record.reserved_gpu_ids, record.reserved_start = (), None
        record.claimed_gpu_ids = ()
        record.previous_position = 0
        run.gpu_ids = placement.gpu_ids
        run.borrowed = placement.borrowed
        if run.borrowed:
            key = (job.tenant, job.pool)
            self.borrowed_gpus[key] += len(run.gpu_ids)
            self.borrowers[key][job.id] = run
        run.attempt_start = now
        run.waits.append((run.pending_since, now))
        if run.first_start is None:
            run.first_start = now
        run.epoch += 1
        run.stopping = False
        # The engine works out its last checkpoint at each cycle (every
        # checkpoint_interval seconds of this run; a stopping job's record has none).
        run.running_record = self.builder.running_job(
            job,
            placement.gpu_ids,
            run.borrowed,
            now,
            preemptions=run.preemptions,
            checkpoint_interval=max(self.config.checkpoint_interval, 0.0),
            expected_runtime=self.learner.expected(job),
            attained=run.gpu_seconds,
        )
        self.running[job.pool][job.id] = run
        self.running_records[job.pool][job.id] = run.running_record
        self._hold(job, placement.gpu_ids, -1)
        if self.policy.preemption:
            self._index_ready(run)
        limit = job.limit if job.limit > 0 else INF
        run.completes = run.remaining <= limit
        self._push(now + min(run.remaining, limit), END, run, run.epoch)

    def _hold(self, job: SimJob, gpu_ids: tuple[int, ...], sign: int) -> None:
        """Count GPUs taken (``sign`` -1) or given back (+1) by ``job``."""
        gpus = len(gpu_ids)
        node_of = self.builder.gpu_node
        for gpu_id in gpu_ids:
            self.node_free[node_of(gpu_id)] += sign
        self.free[job.pool] += sign * gpus
        self.in_use[job.tenant] -= sign * gpus
        self.in_use_pool[job.pool][job.tenant] -= sign * gpus
        self.busy -= sign * gpus

    def _preempt(self, run: JobRun, preemptor: int, now: float) -> None:
        """The engine chose ``run`` as a victim for job ``preemptor``: it stops after its
        grace period, its GPUs kept for that job meanwhile."""
        if run.running_record is None or run.stopping:
            return
        run.stopping = True
        if run.borrowed:
            del self.borrowers[(run.job.tenant, run.job.pool)][run.job.id]
        run.running_record = self.builder.running_job(
            run.job,
            run.gpu_ids,
            run.borrowed,
            run.attempt_start,
            True,
            preemptor,
            preemptions=run.preemptions,
            attained=run.gpu_seconds,
        )
        self.running_records[run.job.pool][run.job.id] = run.running_record
        stop_at = now + self.scenario.workload(run.job.workload_type).grace_seconds
        limit = run.job.limit if run.job.limit > 0 else INF
        if run.attempt_start + min(run.remaining, limit) > stop_at:
            self._push(stop_at, STOPPED, run, run.epoch)

    def _release(self, run: JobRun, when: float) -> None:
        job = run.job
        run.gpu_seconds += len(run.gpu_ids) * (when - run.attempt_start)
        run.attempts.append((run.attempt_start, when, run.gpu_ids))
        del self.running[job.pool][job.id]
        del self.running_records[job.pool][job.id]
        self._hold(job, run.gpu_ids, +1)
        key = (job.tenant, job.pool)
        if run.borrowed:
            self.borrowed_gpus[key] -= len(run.gpu_ids)
            self.borrowers[key].pop(job.id, None)
        run.running_record = None
        run.gpu_ids = ()
        run.stopping = False
        if self.borrowers.get(key):
            self._promote(key)

    def _promote(self, key: tuple[str, str]) -> None:
        """A job of the tenant ``key`` names let go of GPUs in that pool: its borrowed
        jobs that now fit its guarantee count against it from now on (the engine's
        :func:`~scheduling.engine.promotions`, as the dispatch loop applies it), handed
        to the engine as not borrowed: no longer reclaimable."""
        tenant, pool = key
        borrowers = self.borrowers[key]
        cap = self.caps.get(key)
        if cap is not None:  # one quota for any model: counted without a scan
            held = self.in_use_pool[pool][tenant] - self.borrowed_gpus[key]
            runs: Iterable[JobRun] = borrowers.values()
            records = [run.running_record for run in runs if run.running_record is not None]
            promoted = fit_guarantee(records, cap[0] - held)
        else:
            runs = (run for run in self.running[pool].values() if run.job.tenant == tenant)
            records = [run.running_record for run in runs if run.running_record is not None]
            promoted = promotions(records, self.quotas_of.get(key, []))
        for job_id in promoted:
            run = borrowers.pop(job_id)
            run.borrowed = False
            self.borrowed_gpus[key] -= len(run.gpu_ids)
            assert run.running_record is not None
            run.running_record = replace(run.running_record, borrowed=False)
            self.running_records[pool][job_id] = run.running_record
            self.promotions += 1

    # -- planning -------------------------------------------------------------------------

    def _plan(self, now: float) -> None:
        self.plan_at = None
        pools = sorted(self.dirty)
        self.dirty.clear()
        self._advance_usage(now)
        for pool in pools:
            self._plan_pool(pool, now)
        self._record(now)

    def _plan_pool(self, pool: str, now: float) -> None:
        """One dispatch cycle of ``pool``: the engine decides, the replay applies."""
        if not self.pending[pool]:
            return
        if not self._worth_a_cycle(pool, now):
            if self.policy.preemption:
                self._schedule_wake(pool, now)  # victims not old enough yet: come back then
            return
        while True:
            selected, truncated = self._select(pool)
            set_aside = self._apply(self._cycle(pool, now, selected), now, pool)
            if not (set_aside and truncated and self.pending[pool]):
                break  # a truncated FIFO cycle that set jobs aside looks further
        if self.policy.preemption and self.pending[pool]:
            self._schedule_wake(pool, now)

    def _select(self, pool: str) -> tuple[Iterable[JobRun], bool]:
        """The waiting jobs handed to the cycle, and whether some were left out."""
        pending = self.pending[pool]
        if self.policy.global_fifo and len(pending) > self.free[pool] + 1:
            # Strict FIFO starts a prefix of the submit order, one GPU or more per job:
            # the jobs after the first (idle GPUs + 1) cannot start in this cycle.
            return islice(pending.values(), self.free[pool] + 1), True
        window = self.config.max_waiting_per_tenant
        if window:
            by_id = self.by_id
            groups = self.groups[pool].values()
            return [by_id[job_id] for group in groups for _, job_id in group[:window]], True
        return _AllWaiting(pending, self.pending_records[pool]), False

    def _snapshot(
        self, pool: str, now: float, selected: Iterable[JobRun], decisions_only: bool
    ) -> Snapshot:
        """The pool's snapshot with the waiting jobs ``selected``."""
        if isinstance(selected, _AllWaiting):
            pending = list(selected.records.values())
        else:
            pending = [run.pending_record for run in selected]
        return self.builder.snapshot(
            now,
            [pool],
            list(self.running_records[pool].values()),
            pending,
            self._usage_for(pool),
            self.policy,
            decisions_only=decisions_only,
            kept_cluster=self.kept_clusters[pool],
        )

    def _cycle(self, pool: str, now: float, selected: Iterable[JobRun]) -> Plan:
        """Build the pool's snapshot and let the engine plan it."""
        paused = self.topology_paused[pool]
        if paused:
            by_id = self.by_id
            for job_id, since in paused.items():
                record = by_id[job_id].pending_record
                if record.topology_since is not None:
                    record.topology_since += now - since
                paused[job_id] = now
        snapshot = self._snapshot(pool, now, selected, not self.config.full_cycles)
        started = time.perf_counter()
        result = plan(snapshot)
        self.plan_seconds += time.perf_counter() - started
        self.plans += 1
        if self.wait_reasons is not None:
            self.wait_reasons.cycle(pool, now, snapshot, result)
        return result

    def _apply(self, result: Plan, now: float, pool: str) -> bool:
        """Start, preempt and set aside what the plan says; True if jobs were set aside."""
        for placement in result.placements:
            self._start(self.by_id[placement.job_id], placement, now)
        for preemption in result.preemptions:
            self._preempt(self.by_id[preemption.victim_id], preemption.preemptor_id, now)
        # Screened out before the replay; kept as a safety net (an engine that finds a
        # new reason why a job can never start must not stall the replay).
        hopeless = [
            (job_id, info.code)
            for job_id, info in result.pending.items()
            if info.code in reasons.NEVER_STARTS
        ]
        for job_id, code in hopeless:
            run = self.by_id[job_id]
            self._dequeue(run)
            run.outcome, run.code = UNSCHEDULABLE, code
        if self.config.keep_reservations:
            self._keep_reservations(result.pending, pool)
        if pool in self.block_pools:
            self._keep_topology_waits(result.pending, now, pool)
        return bool(hopeless)

    def _keep_topology_waits(self, infos: dict[int, PendingInfo], now: float, pool: str) -> None:
        """Remember when each job first waited for one topology block, pausing that wait
        while the job waits for something else (as the dispatch loop does: the start of
        the wait is moved later by each pause, see _cycle), and plan the pool again when
        the wait is over: the job may then be spread over blocks."""
        by_id = self.by_id
        paused = self.topology_paused[pool]
        for job_id, info in infos.items():
            record = by_id[job_id].pending_record
            since = record.topology_since
            if info.code != reasons.WAITING_FOR_TOPOLOGY:
                if (
                    since is not None
                    and job_id not in paused
                    and now - since < record.topology_wait_seconds
                ):
                    paused[job_id] = now
                continue
            if since is None:
                record.topology_since = now
                self._push(now + record.topology_wait_seconds, SPREAD, job_id, 0)
            elif paused.pop(job_id, None) is not None:
                self._push(since + record.topology_wait_seconds, SPREAD, job_id, 0)

    def _spread(self, job_id: int, when: float) -> None:
        """Plan the pool of a job whose topology wait is over at ``when``, if it still
        waits for one block: not if it started, or if its wait was paused since (the
        event pushed when it resumed is the one that counts)."""
        run = self.by_id[job_id]
        pool = run.job.pool
        record = run.pending_record
        since = record.topology_since
        if (
            job_id in self.pending[pool]
            and since is not None
            and job_id not in self.topology_paused[pool]
            and since + record.topology_wait_seconds <= when
        ):
            self._touch(pool, when)

    def _worth_a_cycle(self, pool: str, now: float) -> bool:
        """A cheap necessary condition for a cycle to start or stop anything; a cycle
        that would do neither is skipped (it would only refresh estimates)."""
        largest_idle = max(self.node_free[node] for node in self.pool_nodes[pool])
        if self.policy.global_fifo:
            head = next(iter(self.pending[pool].values())).job
            return head.gpus_per_node <= largest_idle and head.gpus <= self.free[pool]
        if self._might_start(pool, largest_idle):
            return True
        return self.policy.preemption and self._might_preempt(pool, now)

    def _might_start(self, pool: str, largest_idle: int) -> bool:
        """Whether a waiting job might start now: its GPUs per node are idle on some
        node, all its GPUs are idle in the pool, and its tenant's quota admits it (the
        engine admits a job only if the GPUs its tenant holds, stopping jobs included,
        plus its own stay within the guarantee, or guarantee + borrowing for
        preemptible work). Reservations and GPU models are left to the engine."""
        if not largest_idle:
            return False  # every job needs a GPU per node at least
        free = self.free[pool]
        held = self.in_use_pool[pool]
        caps = self.caps
        for tenant, per_node, gpus, preemptible in self.pending_shapes[pool]:
            if per_node > largest_idle or gpus > free:
                continue
            cap = caps.get((tenant, pool))
            if cap is None or held.get(tenant, 0) + gpus <= cap[preemptible]:
                return True
        return False

    def _keep_reservations(self, infos: dict[int, PendingInfo], pool: str) -> None:
        """Carry each waiting job's reservation into its record for the next cycle (the
        engine keeps no reference to the records between cycles).

        Without backfill the engine hands on only the reservations of the jobs up to
        each pool's first blocked job and of those for which a preemption keeps GPUs,
        and a cycle that stops early always considers those jobs (see
        ``scheduling.engine.settled``): a reservation of an earlier cycle left on a job
        the cycle did not reach is dropped, as a full cycle would have dropped it, so
        that a decisions-only replay is exactly a replay of full cycles."""
        by_id = self.by_id
        handed = None if self.policy.backfill else self.handed_on[pool]
        for job_id, info in infos.items():
            record = by_id[job_id].pending_record
            record.previous_position = info.pool_position
            reserved = info.reserved_gpu_ids
            if reserved or record.reserved_gpu_ids:
                record.reserved_gpu_ids = reserved
                record.reserved_start = info.estimated_start if reserved else None
                record.claimed_gpu_ids = info.claimed_gpu_ids
                if handed is not None:
                    if reserved:
                        handed[job_id] = record
                    else:
                        handed.pop(job_id, None)
        if handed:
            for job_id in [job_id for job_id in handed if job_id not in infos]:
                record = handed.pop(job_id)
                record.reserved_gpu_ids, record.reserved_start = (), None
                record.claimed_gpu_ids = ()

    def _usage_for(self, pool: str) -> dict[str, float]:
        """Usage as the engine should see it when given ``pool`` only (see module doc)."""
        if len(self.pools) == 1:
            return self.usage
        here = self.in_use_pool[pool]
        usage = dict(self.usage)
        for tenant, gpus in self.in_use.items():
            elsewhere = gpus - here.get(tenant, 0)
            if elsewhere:
                usage[tenant] = usage.get(tenant, 0.0) + elsewhere
        return usage

    def _schedule_wake(self, pool: str, now: float) -> None:
        """Plan again when a running job that a waiting job might preempt becomes old
        enough to be preempted (the dispatch loop would notice within seconds)."""
        preemptors = self._preemptors(pool)
        sharing = self.sharing[pool] if self.policy.time_sharing else None
        if preemptors is None and not sharing:
            return
        # The first time after now at which a running job may be stopped by a waiting
        # one; times up to now never come again (a job that ended or is stopping since
        # its entry was made is passed over).
        entries = self.ready[pool]
        del entries[: bisect_right(entries, (now, INF))]
        soonest = INF
        for ready, _, run, epoch, protected in entries:
            record = run.running_record
            if run.epoch != epoch or run.stopping or record is None:
                continue
            if (preemptors is not None and _may_stop(preemptors, record, protected)) or (
                sharing and self._may_share(sharing, record, ready, protected)
            ):
                soonest = ready
                break
        if soonest == INF:
            return
        current = self.wake_at.get(pool)
        if current is None or current <= now or soonest < current:
            self.wake_at[pool] = soonest
            self._push(soonest, WAKE, pool, 0)

    def _index_ready(self, run: JobRun) -> None:
        """Enter the times from which the job just started may be stopped: once old
        enough (reclaimed then, and stopped for a higher class unless protected at its
        preemption limit), once its protection is over too, and, with a minimum gain,
        once it runs past its runtime prediction."""
        record = run.running_record
        assert record is not None
        entries = self.ready[run.job.pool]
        for ready, protected in stoppable_times(record, self.policy, self.sharing_from):
            if ready < INF:
                insort(entries, (ready, next(self._seq), run, run.epoch, protected))

    def _might_preempt(self, pool: str, now: float) -> bool:
        """A cheap necessary condition for a preemption in ``pool`` (the engine decides):
        a running job old enough to be preempted at ``now`` that a waiting job might stop
        (see :func:`_may_stop`)."""
        preemptors = self._preemptors(pool)
        sharing = self.sharing[pool] if self.policy.time_sharing else None
        if preemptors is None and not sharing:
            return False
        for run in self.running[pool].values():
            if run.stopping:
                continue
            record = run.running_record
            if now - record.started_at < record.min_runtime_before_preemption:
                continue
            protected = now < protected_until(record)
            if preemptors is not None and _may_stop(preemptors, record, protected):
                return True
            if sharing and self._may_share(sharing, record, now, protected):
                return True
        return False

    def _may_share(
        self, sharing: dict[int, int], record: RunningJob, now: float, protected: bool
    ) -> bool:
        """Whether a waiting time-sharing job of ``record``'s class might stop it at
        ``now``: it time-shares, is not protected, and has used GPU-time enough to be past
        the first level (every waiting job may be in the first level, by promotion)."""
        return (
            not protected
            and record.time_sharing
            and record.preemptible
            and sharing.get(record.priority, 0) > 0
            and attained_service(record, now) >= self.sharing_from
        )

    def _preemptors(self, pool: str) -> tuple[list[float], list[set[str]]] | None:
        """What the waiting jobs of ``pool`` could stop, per kind of victim (0: not
        inference, 1: inference; training-like work never preempts inference): the
        highest class among waiting jobs whose class may preempt, and the tenants with
        a waiting job inside their guarantee (who may reclaim others' borrowed GPUs).
        None when no waiting job could preempt anything."""
        highest = [-INF, -INF]
        reclaimers: list[set[str]] = [set(), set()]
        held = self.in_use_pool[pool]
        guaranteed = self.guaranteed_pool
        for training, can_preempt, priority, tenant, gpus in self.pending_kinds[pool]:
            within = held.get(tenant, 0) + gpus <= guaranteed[(tenant, pool)]
            for inference in (0,) if training else (0, 1):
                if can_preempt and priority > highest[inference]:
                    highest[inference] = priority
                if within:
                    reclaimers[inference].add(tenant)
        if highest == [-INF, -INF] and not (reclaimers[0] or reclaimers[1]):
            return None
        return highest, reclaimers


class _AllWaiting:
    """All the waiting jobs of a pool, as :meth:`Replay._select` hands them to a cycle:
    the runs in order, and their engine records in the same order (copied into the
    snapshot as one list)."""

    __slots__ = ("runs", "records")

    def __init__(self, runs: dict[int, JobRun], records: dict[int, PendingJob]) -> None:
        self.runs = runs
        self.records = records

    def __iter__(self) -> Iterator[JobRun]:
        return iter(self.runs.values())


def _may_stop(
    preemptors: tuple[list[float], list[set[str]]], record: RunningJob, protected: bool
) -> bool:
    """Whether some waiting job summed up in ``preemptors`` might stop ``record``: its
    class is lower and preemptible, below a waiting job whose class may preempt, and it
    is not ``protected`` at its preemption limit, or it runs on borrowed GPUs, is not
    ``protected``, and another tenant's waiting job is inside its guarantee (every stop
    counts against the limit: a protected job is stopped by nobody)."""
    if protected:
        return False
    highest, reclaimers = preemptors
    inference = record.workload_type == INFERENCE_WORKLOAD
    if record.preemptible and record.priority < highest[inference]:
        return True
    if record.borrowed:
        tenants = reclaimers[inference]
        return len(tenants) > 1 or (bool(tenants) and record.tenant not in tenants)
    return False


def stoppable_times(
    record: RunningJob, policy: Policy, sharing_from: float = INF
) -> list[tuple[float, bool]]:
    """The times from which a running job may become a victim, each with whether it is
    protected then: once old enough, once its protection is over, with a minimum
    gain, once it runs past its runtime prediction (until then it is expected to end
    within the gain: nobody's victim, see preemption._ending_from), and, for a job that
    time-shares, once it has used ``sharing_from`` GPU-seconds (past the first level)."""
    seasoned = record.started_at + record.min_runtime_before_preemption
    until = protected_until(record)
    times = [(seasoned, seasoned < until), (max(seasoned, until), False)]
    if record.time_sharing and sharing_from < INF and record.gpu_ids:
        left = sharing_from - record.attained_gpu_seconds
        past = max(seasoned, record.started_at + max(left, 0.0) / len(record.gpu_ids))
        times.append((past, past < until))
    expected = record.expected_runtime_seconds
    if (policy.preemption_min_gain_seconds or 0) > 0 and expected > 0:
        overrun = record.started_at + expected
        if overrun > seasoned:
            times.append((overrun, overrun < until))
    return times


def _count_down(counts: dict, key) -> None:
    """One fewer ``key`` in ``counts`` (a key counted down to zero is dropped)."""
    counts[key] -= 1
    if not counts[key]:
        del counts[key]


def _preemptor_kind(job: PendingJob) -> tuple[bool, bool, int, str, int]:
    """What :meth:`Replay._might_preempt` reads of a waiting job."""
    training = job.workload_type in TRAINING_WORKLOADS
    return training, job.can_preempt, job.priority, job.tenant, job.gpus


def _shape(job: PendingJob) -> tuple[str, int, int, bool]:
    """What :meth:`Replay._might_start` reads of a waiting job."""
    return job.tenant, job.gpus_per_node, job.gpus, job.preemptible


def _quota_caps(scenario: Scenario) -> dict[tuple[str, str], tuple[int, int]]:
    """(tenant, pool) -> (GPUs a non-preemptible job may bring the tenant to, a
    preemptible one): its guarantee, and guarantee + borrowing. Only for tenants with a
    single quota in the pool, for any GPU model (with several, which one a job counts
    against depends on the model it gets: no cap is known beforehand)."""
    rows: dict[tuple[str, str], list] = defaultdict(list)
    for quota in scenario.quotas:
        rows[(quota.tenant, quota.pool)].append(quota)
    caps = {}
    for key, quotas in rows.items():
        if len(quotas) == 1 and quotas[0].gpu_model == "":
            guaranteed = max(quotas[0].guaranteed, 0)
            caps[key] = (guaranteed, guaranteed + max(quotas[0].borrow_limit, 0))
    return caps


def replay(
    scenario: Scenario,
    policy: Policy,
    config: SimConfig | None = None,
    progress: Callable[[float], None] | None = None,
) -> ReplayResult:
    """Replay ``scenario`` under ``policy``; see :class:`Replay`."""
    return Replay(scenario, policy, config, progress).run()
