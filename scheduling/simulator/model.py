"""Plain data of the simulator: traces as read, and the scenario a replay runs.

A :class:`Trace` is what a reader found in a file (times in seconds, GPUs, optional
tenants and classes). A :class:`Scenario` is a trace made concrete: a cluster of nodes,
tenants' quotas, priority classes, workload policies and jobs with a shape, a tenant, a
class and a declared runtime limit. One scenario is replayed under several policies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduling.engine import QuotaInfo


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace, as recorded. Only the first four fields are always known.

    ``gpus_per_node`` None: the job goes on one node when it fits one, else on whole
    nodes. Empty strings mean "not in the trace" (the scenario fills them in).
    ``runtime_limit`` is the limit the user declared, when the trace has it.
    """

    job_id: str
    submit_time: float
    duration: float
    num_gpus: int
    gpus_per_node: int | None = None
    tenant: str = ""
    priority_class: str = ""
    gpu_models: tuple[str, ...] = ()
    workload_type: str = ""
    pool: str = ""
    runtime_limit: float | None = None


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node of the simulated cluster: ``gpus`` GPUs of one model in one pool.

    ``indices`` (optional) are the GPU indices on the real node (default 0..gpus-1); a
    node whose GPUs are of several models is described by one spec per model.
    ``block``: the topology block the node is in ("" none; see
    ``ScenarioOptions.nodes_per_block``).
    """

    name: str
    pool: str
    gpus: int
    model: str
    memory_mb: int = 0
    indices: tuple[int, ...] = ()
    block: str = ""

    def gpu_indices(self) -> tuple[int, ...]:
        """The indices of the node's GPUs."""
        return self.indices or tuple(range(self.gpus))


@dataclass(slots=True)
class Trace:
    """Jobs read from a trace file, with the trace's own cluster when it describes one."""

    name: str
    jobs: list[TraceJob]
    nodes: list[NodeSpec] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    independent_pools: bool = False  # pools are separate clusters with separate users


@dataclass(frozen=True, slots=True)
class ClassSpec:
    """A priority class as the engine sees it (name, integer level, preemption rules)."""

    name: str
    value: int
    preemptible: bool = True
    can_preempt: bool = False


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """The parts of a workload policy that matter to scheduling (DESIGN.md §2).

    ``max_preemptions``: once preempted that many times, a job is protected from higher
    classes (and admitted inside its guarantee) for ``preemption_protection_seconds`` of
    each later run, 0 meaning the whole run; ``max_preemptions`` 0: no limit (see
    :mod:`scheduling.engine.preemption`). ``topology_wait_seconds``: how long a job of
    several nodes waits for one topology block before it is spread over blocks (the
    portal's default; nodes without blocks make it moot).
    """

    preemptible: bool = True
    grace_seconds: int = 30
    min_runtime_before_preemption: int = 300
    max_preemptions: int = 3
    preemption_protection_seconds: int = 0
    topology_wait_seconds: int = 1800


@dataclass(frozen=True, slots=True)
class SimJob:
    """A job ready to replay: shape, tenant, class, real duration and declared limit.

    ``id`` is the job's number in the scenario (the Job id for Sluice's own history);
    ``name`` the trace's job id. ``limit`` <= 0 means no limit.
    """

    id: int
    name: str
    tenant: str
    pool: str
    priority_class: str
    workload_type: str
    gpus_per_node: int
    nodes: int
    submit: float
    duration: float
    limit: int
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_mb: int = 0
    project: str = ""

    @property
    def gpus(self) -> int:
        """Total GPUs of the job."""
        return self.gpus_per_node * self.nodes


@dataclass(slots=True)
class Scenario:
    """Everything one replay needs; the same scenario is replayed under each policy.

    ``workloads`` maps a workload type to its policy; ``""`` is the default for types
    not listed. ``notes`` say what was chosen and why (cluster size, skipped jobs).
    ``independent_pools``: the pools share no tenant either, so they may be replayed
    separately (see :mod:`.parallel`).
    """

    name: str
    nodes: list[NodeSpec]
    quotas: list[QuotaInfo]
    classes: dict[str, ClassSpec]
    workloads: dict[str, WorkloadSpec]
    jobs: list[SimJob]
    notes: list[str] = field(default_factory=list)
    independent_pools: bool = False

    @property
    def capacity(self) -> int:
        """GPUs of the whole cluster."""
        return sum(node.gpus for node in self.nodes)

    def pool_capacity(self) -> dict[str, int]:
        """GPUs per pool."""
        capacity: dict[str, int] = {}
        for node in self.nodes:
            capacity[node.pool] = capacity.get(node.pool, 0) + node.gpus
        return capacity

    def workload(self, workload_type: str) -> WorkloadSpec:
        """The policy of a workload type (the default one if it has none)."""
        found = self.workloads.get(workload_type)
        if found is None:
            found = self.workloads.get("", WorkloadSpec())
        return found

    def guarantees(self) -> dict[str, int]:
        """Guaranteed GPUs per tenant, over all its quotas."""
        totals: dict[str, int] = {}
        for quota in self.quotas:
            totals[quota.tenant] = totals.get(quota.tenant, 0) + max(quota.guaranteed, 0)
        return totals
