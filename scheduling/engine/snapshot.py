"""The input of the scheduling engine: an immutable-by-convention picture of the cluster.

The dispatch loop builds a :class:`Snapshot` from the database and hands it to
:func:`scheduling.engine.plan`. Everything here is plain data; times are epoch seconds.

A snapshot is one flat record, as its callers (the dispatch loop, the simulator, the
tests) build and change it. The engine reads it in three parts, split once at the start
of a cycle: :class:`ClusterState`, what the cluster is (nodes, quotas, queues, the jobs
running and waiting, usage); :class:`Policy`, how to decide (the settings, frozen: no
part of the engine changes them during a cycle); and the engine's caches
(``kept_cluster``, a :class:`~.cluster.KeptCluster` kept between cycles by the caller,
and the fields each record keeps for the planner, e.g. ``PendingJob.layout``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final

from .defaults import (
    TIME_SHARING_LEVELS,
    TIME_SHARING_MIN_WAIT_SECONDS,
    TIME_SHARING_PROMOTION_SECONDS,
)

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import KeptCluster
    from .preemption import RunningRecord


def _by_constructor(record: Any) -> tuple:
    """``__reduce__`` of a frozen record: rebuilt through its constructor from every field
    (compiled, a frozen record would be restored by ``setattr``, which it refuses; this
    serves pickle, ``copy`` and ``deepcopy``)."""
    return (type(record), tuple(getattr(record, item.name) for item in fields(record)))


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One healthy GPU of a schedulable node."""

    id: int
    node_id: int
    index: int
    model: str
    memory_mb: int

    def __reduce__(self) -> tuple:
        return _by_constructor(self)


@dataclass(slots=True)
class NodeInfo:
    """A schedulable node of a resource pool, with its healthy GPUs only."""

    id: int
    name: str
    pool: str
    gpus: list[GpuInfo]
    _kinds: list[tuple[str, int, list[int]]] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    # The topology block (leaf switch, rack or NVLink domain) the node is in; "" (the
    # default): in no block. A job of several nodes is kept inside one block where one
    # can hold it (see :mod:`.cluster`, topology).
    block: str = ""

    def kinds(self) -> list[tuple[str, int, list[int]]]:
        """(model, memory, GPU ids in index order) per kind of GPU on the node, in the
        order of their first GPU; computed once (a snapshot is not changed once made, and
        the simulator hands the same nodes to every cycle)."""
        if self._kinds is None:
            grouped: dict[tuple[str, int], list[int]] = {}
            for gpu in sorted(self.gpus, key=_gpu_index):
                grouped.setdefault((gpu.model, gpu.memory_mb), []).append(gpu.id)
            self._kinds = [(model, memory, ids) for (model, memory), ids in grouped.items()]
        return self._kinds


def _gpu_index(gpu: GpuInfo) -> int:
    return gpu.index


@dataclass(frozen=True, slots=True)
class QuotaInfo:
    """A tenant's quota in one pool for one GPU model.

    ``gpu_model == ""`` is a single budget shared by every model of the pool that has no
    model-specific quota for this tenant (a model-specific quota wins for its model). A
    tenant without any quota for a pool/model has ``guaranteed == borrow_limit == 0``.
    ``max_running_jobs`` (None = unlimited) caps the tenant's running jobs under that quota.
    """

    tenant: str
    pool: str
    gpu_model: str
    guaranteed: int
    borrow_limit: int
    max_running_jobs: int | None = None

    def __reduce__(self) -> tuple:
        return _by_constructor(self)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue: a closed queue dispatches nothing; a strict-FIFO queue's head blocks the rest."""

    id: int
    name: str
    tenant: str
    strict_fifo: bool = False
    open: bool = True

    def __reduce__(self) -> tuple:
        return _by_constructor(self)


@dataclass(slots=True)
class PendingJob:
    """A job waiting for GPUs. ``pool`` is already resolved by the caller.

    ``priority`` is the integer value of the effective priority class, ``preemptible`` the
    effective flag (class or workload policy), ``gpu_models == ()`` accepts any model, and
    ``max_runtime_seconds <= 0`` means no limit (the job can then never be backfilled and
    gets no finite estimate behind it).

    ``reserved_gpu_ids``/``reserved_start`` (optional) carry the reservation the previous
    cycle gave the job (``PendingInfo.reserved_gpu_ids`` and ``estimated_start``). The job
    keeps those GPUs while they are still free by that time, so that a reservation, and
    the estimates of the jobs behind it, do not move from one cycle to the next (Slurm
    keeps its reservations the same way). Without them every cycle plans afresh.

    ``claimed_gpu_ids`` (optional) carry ``PendingInfo.claimed_gpu_ids``: GPUs that jobs
    preempted for this one have freed (or are freeing). They stay the job's until its
    turn, whatever the class or fair share of the jobs ordered before it, so that a
    victim requeued ahead of its preemptor cannot take its GPUs back and be preempted
    again, cycle after cycle.
    """

    id: int
    tenant: str
    project: str
    queue_id: int
    pool: str
    workload_type: str
    priority: int
    priority_class: str
    preemptible: bool
    can_preempt: bool
    gpus_per_node: int
    nodes: int
    gpu_models: tuple[str, ...]
    min_gpu_memory_mb: int
    submitted_at: float
    max_runtime_seconds: int
    allowed_pools: tuple[str, ...] = ()
    held: bool = False
    reserved_gpu_ids: tuple[int, ...] = ()
    reserved_start: float | None = None
    claimed_gpu_ids: tuple[int, ...] = ()
    # The pool position the previous cycle gave the job (``PendingInfo.pool_position``;
    # 0: none, e.g. a new job). A job that was behind another one and is now ahead of it
    # does not wait for that one's held reservation (see :mod:`.reservations`).
    previous_position: int = 0
    # Size- and runtime-aware order (see :mod:`.order`): the runtime the job is expected
    # to need (a prediction from its owner's finished jobs; <= 0: its declared limit),
    # and the wait after which it goes before every job of its class and tenant that
    # has waited less (<= 0: the snapshot's ``max_wait_seconds``).
    expected_runtime_seconds: float = 0.0
    max_wait_seconds: float = 0.0
    # Preemption churn (see :mod:`.preemption`): how often the job was preempted so far,
    # and its policy's limit (0: none); at the limit it is admitted inside its guarantee.
    preemptions: int = 0
    max_preemptions: int = 0
    # Time-sharing (see :mod:`.order`, least attained service): whether the job takes
    # part (its queue opts in and the job checkpoints: preemptible, with a checkpoint
    # directory and a grace period; the caller decides), the GPU-seconds it has used
    # in its earlier runs, and when it last entered the queue (0: ``submitted_at``).
    time_sharing: bool = False
    attained_gpu_seconds: float = 0.0
    queued_at: float = 0.0
    # (reserved_gpu_ids, their grouping by node, and on a kept cluster index the
    # locator and the placement found there): remembered by the planner (Locator)
    layout: tuple | None = field(default=None, init=False, repr=False, compare=False)
    # Total GPUs of the job (``gpus_per_node * nodes``), worked out once: read millions
    # of times per replay.
    gpus: int = field(default=0, init=False, repr=False, compare=False)
    # Topology (see :mod:`.cluster`): how long a job of several nodes waits for one
    # block to hold it whole, once the idle GPUs would hold it spread over blocks, before
    # it is spread (<= 0: spread at once when no block can hold it now); and since when
    # it waits so (None: it has not yet): the caller keeps the time of the first cycle
    # that gave the job ``reasons.WAITING_FOR_TOPOLOGY``, as it keeps reservations,
    # moved later by the time it since waited for something else (another reason).
    topology_wait_seconds: float = 0.0
    topology_since: float | None = None

    def __post_init__(self) -> None:
        self.gpus = self.gpus_per_node * self.nodes

    def ordered_with(self, priority: int) -> PendingJob:
        """A copy ordered with the class of value ``priority`` (class aging, see
        :func:`.order.age_classes`): everything else, its class name included, as it
        is."""
        twin = self.not_preemptible()
        twin.priority = priority
        twin.preemptible = self.preemptible
        twin.layout = self.layout
        return twin

    def not_preemptible(self) -> PendingJob:
        """A copy admitted like non-preemptible work: ``dataclasses.replace(self,
        preemptible=False)`` (the planner asks it of every job at its preemption limit
        in every cycle; ``replace`` cost a few percent of a replay)."""
        return PendingJob(
            self.id,
            self.tenant,
            self.project,
            self.queue_id,
            self.pool,
            self.workload_type,
            self.priority,
            self.priority_class,
            False,
            self.can_preempt,
            self.gpus_per_node,
            self.nodes,
            self.gpu_models,
            self.min_gpu_memory_mb,
            self.submitted_at,
            self.max_runtime_seconds,
            self.allowed_pools,
            self.held,
            self.reserved_gpu_ids,
            self.reserved_start,
            self.claimed_gpu_ids,
            self.previous_position,
            self.expected_runtime_seconds,
            self.max_wait_seconds,
            self.preemptions,
            self.max_preemptions,
            time_sharing=self.time_sharing,
            attained_gpu_seconds=self.attained_gpu_seconds,
            queued_at=self.queued_at,
            topology_wait_seconds=self.topology_wait_seconds,
            topology_since=self.topology_since,
        )


@dataclass(slots=True)
class RunningJob:
    """A job holding GPUs (admitted, running or stopping).

    ``stopping`` jobs free their GPUs within ``grace_seconds`` and are never chosen as
    victims again. ``preempted_by`` (optional) names the pending job a stopping job was
    preempted for: its GPUs are then kept for that job instead of being offered to others.
    """

    id: int
    tenant: str
    pool: str
    workload_type: str
    priority: int
    priority_class: str
    preemptible: bool
    gpu_ids: tuple[int, ...]
    gpu_model: str
    borrowed: bool
    started_at: float
    max_runtime_seconds: int
    min_runtime_before_preemption: int = 0
    stopping: bool = False
    grace_seconds: int = 30
    preempted_by: int | None = None
    # Preemption churn (see :mod:`.preemption`): how often the job was preempted before
    # this run, when it last saved a checkpoint in this run (None: not known, counted as
    # its start), and its policy's limit (0: none) and protection once at that limit
    # (seconds from its start; 0: for the rest of the run).
    preemptions: int = 0
    checkpointed_at: float | None = None
    max_preemptions: int = 0
    preemption_protection_seconds: int = 0
    # > 0: the job saves a checkpoint every so many seconds of this run, its last one
    # worked out from the cycle's ``now`` (``checkpointed_at`` is then not read): the
    # simulator's jobs, which would otherwise need it set on every record every cycle.
    checkpoint_interval: float = 0.0
    # How long the job is expected to run from ``started_at`` (its owner's runtime
    # prediction; 0: not known): the minimum preemption gain compares a preemption with
    # waiting for its victims' expected ends (see :mod:`.preemption`).
    expected_runtime_seconds: float = 0.0
    # Time-sharing (see :mod:`.order`): whether the job takes part (as for
    # ``PendingJob.time_sharing``) and the GPU-seconds it used in its earlier runs (the
    # engine adds this run's: GPUs x the time since ``started_at``).
    time_sharing: bool = False
    attained_gpu_seconds: float = 0.0
    # (gpu_ids, their grouping by node, and on a kept cluster index the locator and the
    # placement found there): remembered by the planner (Locator)
    layout: tuple | None = field(default=None, init=False, repr=False, compare=False)
    # The planner's record of the job on a cluster index kept between cycles (see
    # cycle.KeptRunning), found from the job directly rather than by a lookup.
    kept: RunningRecord | None = field(default=None, init=False, repr=False, compare=False)


@dataclass(slots=True)
class Snapshot:
    """Everything :func:`~scheduling.engine.plan` needs for one scheduling cycle.

    ``usage`` is the decayed GPU-seconds per tenant (see
    :func:`~scheduling.engine.decay_usage`). ``global_fifo`` is the simulator's baseline
    policy: one cluster-wide queue in submit order, where the first job that cannot start
    blocks every later one (no priorities, no fair share, no backfill).

    ``decisions_only`` (the simulator): the plan's placements and preemptions are those
    of a full cycle, but the cycle stops once no job left could start or preempt (see
    :mod:`scheduling.engine.settled`); the jobs not considered get no ``PendingInfo``.
    """

    now: float
    nodes: list[NodeInfo]
    quotas: list[QuotaInfo]
    queues: list[QueueInfo]
    running: list[RunningJob]
    pending: list[PendingJob]
    usage: dict[str, float] = field(default_factory=dict)
    backfill: bool = True
    preemption: bool = True
    fair_share: bool = True
    global_fifo: bool = False
    decisions_only: bool = False
    # Size- and runtime-aware order inside a class and fair-share band (see :mod:`.order`).
    # The defaults below are the engine's plain rules (any preemption gain, ...); the
    # product's defaults, which the dispatch loop and the simulator's ``sluice`` policy
    # pass, are those of :mod:`.defaults`.
    size_order: bool = True
    size_halving_seconds: float = 6 * 3600.0
    max_wait_seconds: float = 12 * 3600.0
    fair_share_band: float = 0.25
    # Class aging (see :func:`.order.age_classes`): a job whose class may not preempt,
    # once it has waited this long since its submission, is ordered with the next class
    # up among the waiting jobs, unless that class may preempt. 0 (the default): off.
    class_aging_seconds: float = 0.0
    # Preemption pays only for a real gain (see :mod:`.preemption`): a job stops others
    # only when that gets it running at least this much sooner than waiting for GPUs
    # being freed as running jobs end by their limits (an upper bound). A victim pays for
    # it with its work since its last checkpoint and a second wait in the queue.
    # 0 (the default): any gain; the simulator's ``sluice-min-gain`` policy uses 4 h.
    preemption_min_gain_seconds: float = 0.0
    # A borrower (beyond its tenant's guarantee) reserves no GPUs until its maximum wait:
    # it borrows idle ones. A job that needs several whole nodes rarely finds them idle at
    # once, so such a job reserves once it has waited this long (0: at its maximum wait
    # only; see :mod:`.planner`, waiting to borrow).
    gang_borrower_reserve_seconds: float = 0.0
    # Time-sharing (least attained service inside a class, for the jobs whose queue opts
    # in and that checkpoint; see :mod:`.order`): the attained GPU-seconds at which each
    # level after the first begins, ascending, and the wait since a job last entered the
    # queue after which it is back in the first level (0: never), and the wait since then
    # before which it stops nobody.
    time_sharing_levels: tuple[float, ...] = TIME_SHARING_LEVELS
    time_sharing_promotion_seconds: float = TIME_SHARING_PROMOTION_SECONDS
    time_sharing_min_wait_seconds: float = TIME_SHARING_MIN_WAIT_SECONDS
    # A caller that plans the same nodes cycle after cycle (the simulator) may hand the
    # same :class:`~.cluster.KeptCluster` to each: the cluster index is then reset
    # instead of built anew (same plan; the dispatch loop builds it every cycle).
    kept_cluster: KeptCluster | None = field(default=None, repr=False, compare=False)

    def cluster_state(self) -> ClusterState:
        """What the cluster is at ``now`` (the snapshot's lists, not copies)."""
        return ClusterState(
            self.now, self.nodes, self.quotas, self.queues, self.running, self.pending, self.usage
        )

    def policy(self) -> Policy:
        """The snapshot's settings, frozen for the cycle: one record per set of settings,
        made once and shared (a replay's cycles all have the same; a frozen record made
        through the ``__init__`` that ``dataclasses`` generates costs some 4,000
        instructions, a noticeable part of a short cycle)."""
        key = (
            self.backfill,
            self.preemption,
            self.fair_share,
            self.global_fifo,
            self.decisions_only,
            self.size_order,
            self.size_halving_seconds,
            self.max_wait_seconds,
            self.fair_share_band,
            self.class_aging_seconds,
            self.preemption_min_gain_seconds,
            self.gang_borrower_reserve_seconds,
            self.time_sharing_levels,
            self.time_sharing_promotion_seconds,
            self.time_sharing_min_wait_seconds,
        )
        found = _POLICIES.get(key)
        if found is None:
            if len(_POLICIES) >= 256:
                _POLICIES.clear()
            found = _POLICIES[key] = Policy(*key)
        return found


@dataclass(slots=True)
class ClusterState:
    """What the cluster is at ``now``: its nodes (healthy GPUs only), the quotas and
    queues, the jobs holding GPUs and those waiting, and the decayed GPU-seconds per
    tenant (see :class:`Snapshot` for each). Made by :meth:`Snapshot.cluster_state`;
    class aging (:func:`.order.age_classes`) hands a copy with other pending jobs."""

    now: float
    nodes: list[NodeInfo]
    quotas: list[QuotaInfo]
    queues: list[QueueInfo]
    running: list[RunningJob]
    pending: list[PendingJob]
    usage: dict[str, float]


@dataclass(frozen=True, slots=True)
class Policy:
    """How a cycle decides: the settings of :class:`Snapshot` (see there for each), frozen
    so that no part of the engine changes them during a cycle. The defaults are the
    snapshot's (the engine's plain rules, not the product's: see :mod:`.defaults`)."""

    backfill: bool = True
    preemption: bool = True
    fair_share: bool = True
    global_fifo: bool = False
    decisions_only: bool = False
    size_order: bool = True
    size_halving_seconds: float = 6 * 3600.0
    max_wait_seconds: float = 12 * 3600.0
    fair_share_band: float = 0.25
    class_aging_seconds: float = 0.0
    preemption_min_gain_seconds: float = 0.0
    gang_borrower_reserve_seconds: float = 0.0
    time_sharing_levels: tuple[float, ...] = TIME_SHARING_LEVELS
    time_sharing_promotion_seconds: float = TIME_SHARING_PROMOTION_SECONDS
    time_sharing_min_wait_seconds: float = TIME_SHARING_MIN_WAIT_SECONDS

    def __reduce__(self) -> tuple:
        return _by_constructor(self)


# Snapshot.policy's records, by their settings.
_POLICIES: Final[dict[tuple, Policy]] = {}
