"""Turning the simulator's state into the engine's :class:`~scheduling.engine.Snapshot`.

This mirrors what :func:`scheduling.services.dispatch.load_snapshot` reads from the
database, field by field, so that the same state gives the engine the same input in both
(a test checks it): nodes in the scenario's order (the database reader gives them in
name order, as ``load_snapshot`` does) with their GPUs in index order, a job's
effective preemptibility from its class and its workload policy, the workload policy's
grace period, minimum runtime before preemption, preemption limit and protection and
topology wait, each node's topology block, how
often the job was preempted and when it last saved a checkpoint, and for a job stopping
because of a preemption the job it makes room for. The replay hands each job's reservation back to
the next cycle as the dispatch loop does.
"""

from __future__ import annotations

from collections import defaultdict

from scheduling.engine import (
    GpuInfo,
    KeptCluster,
    NodeInfo,
    PendingJob,
    QueueInfo,
    RunningJob,
    Snapshot,
)

from .model import ClassSpec, Scenario, SimJob
from .policies import Policy

# Simulated jobs that save checkpoints (every ``SimConfig.checkpoint_interval`` of a run):
# training-like work; a trace without workload types ("") is of training jobs.
CHECKPOINTING_WORKLOADS = frozenset({"", "training", "fine_tuning"})


class SnapshotBuilder:
    """The static part of every snapshot of a scenario (cluster, quotas, queues), and the
    conversion of jobs to the engine's pending and running records.

    GPU ids are numbered from 1 in node order; :meth:`gpu_label` gives back the node name
    and GPU index of an id.
    """

    def __init__(self, scenario: Scenario, time_sharing: bool = False) -> None:
        self.scenario = scenario
        # Whether every queue time-shares (the policy's): jobs that checkpoint take part.
        self.time_sharing = time_sharing
        self.nodes_by_pool: dict[str, list[NodeInfo]] = defaultdict(list)
        self._labels: dict[int, tuple[str, int]] = {}
        self._models: dict[int, str] = {}
        self._nodes: dict[int, int] = {}
        self._ids: dict[tuple[str, int], int] = {}
        gpu_id = 0
        for node_id, spec in enumerate(scenario.nodes, 1):
            gpus = []
            for index in spec.gpu_indices():
                gpu_id += 1
                gpus.append(GpuInfo(gpu_id, node_id, index, spec.model, spec.memory_mb))
                self._labels[gpu_id] = (spec.name, index)
                self._ids[(spec.name, index)] = gpu_id
                self._models[gpu_id] = spec.model
                self._nodes[gpu_id] = node_id
            self.nodes_by_pool[spec.pool].append(
                NodeInfo(node_id, spec.name, spec.pool, gpus, block=spec.block)
            )
        tenants = sorted(
            {job.tenant for job in scenario.jobs} | {q.tenant for q in scenario.quotas}
        )
        # One queue per tenant: the queue a job was submitted to changes nothing for
        # the engine unless it is strict FIFO or closed, which replays never use.
        self.queue_ids = {tenant: number for number, tenant in enumerate(tenants, 1)}
        self.queues = [
            QueueInfo(number, tenant, tenant) for tenant, number in self.queue_ids.items()
        ]
        self.quotas = list(scenario.quotas)

    def gpu_label(self, gpu_id: int) -> tuple[str, int]:
        """(node name, GPU index) of a GPU id of this builder."""
        return self._labels[gpu_id]

    def gpu_id(self, node_name: str, index: int) -> int:
        """The GPU id of a node's GPU (the inverse of :meth:`gpu_label`)."""
        return self._ids[(node_name, index)]

    def gpu_node(self, gpu_id: int) -> int:
        """The node id (in this builder's numbering) of a GPU id."""
        return self._nodes[gpu_id]

    def gpu_model(self, gpu_id: int) -> str:
        """The GPU model of a GPU id."""
        return self._models[gpu_id]

    def pool_gpus(self, pool: str) -> int:
        """GPUs of a pool."""
        return sum(len(node.gpus) for node in self.nodes_by_pool.get(pool, ()))

    def _class(self, job: SimJob) -> ClassSpec:
        return self.scenario.classes[job.priority_class]

    def shares_time(self, job: SimJob) -> bool:
        """Whether ``job`` takes part in time-sharing: its queue time-shares (the policy)
        and it checkpoints (training-like, preemptible, with a grace period), as the
        dispatch loop decides for a job with a checkpoint directory."""
        if not self.time_sharing or job.workload_type not in CHECKPOINTING_WORKLOADS:
            return False
        workload = self.scenario.workload(job.workload_type)
        return self._class(job).preemptible and workload.preemptible and workload.grace_seconds > 0

    def pending_job(self, job: SimJob, preemptions: int = 0) -> PendingJob:
        """The engine's record of ``job`` waiting (as ``load_snapshot`` builds it), after
        ``preemptions`` preemptions."""
        cls = self._class(job)
        workload = self.scenario.workload(job.workload_type)
        return PendingJob(
            id=job.id,
            tenant=job.tenant,
            project=job.project,
            queue_id=self.queue_ids[job.tenant],
            pool=job.pool,
            workload_type=job.workload_type,
            priority=cls.value,
            priority_class=cls.name,
            preemptible=cls.preemptible and workload.preemptible,
            can_preempt=cls.can_preempt,
            gpus_per_node=job.gpus_per_node,
            nodes=job.nodes,
            gpu_models=job.gpu_models,
            min_gpu_memory_mb=job.min_gpu_memory_mb,
            submitted_at=job.submit,
            max_runtime_seconds=job.limit,
            preemptions=preemptions,
            max_preemptions=workload.max_preemptions,
            topology_wait_seconds=float(workload.topology_wait_seconds),
            time_sharing=self.shares_time(job),
        )

    def running_job(
        self,
        job: SimJob,
        gpu_ids: tuple[int, ...],
        borrowed: bool,
        started_at: float,
        stopping: bool = False,
        preempted_by: int | None = None,
        preemptions: int = 0,
        checkpointed_at: float | None = None,
        checkpoint_interval: float = 0.0,
        expected_runtime: float = 0.0,
        attained: float = 0.0,
    ) -> RunningJob:
        """The engine's record of ``job`` holding ``gpu_ids`` since ``started_at``
        (``preempted_by``: the job a stopping job makes room for), preempted
        ``preemptions`` times before, its last checkpoint in this run at
        ``checkpointed_at`` (None: none yet), or every ``checkpoint_interval`` seconds
        of the run (> 0: worked out by the engine at each cycle), predicted to run
        ``expected_runtime`` seconds from ``started_at`` (0: not known)."""
        cls = self._class(job)
        workload = self.scenario.workload(job.workload_type)
        return RunningJob(
            id=job.id,
            tenant=job.tenant,
            pool=job.pool,
            workload_type=job.workload_type,
            priority=cls.value,
            priority_class=cls.name,
            preemptible=cls.preemptible and workload.preemptible,
            gpu_ids=gpu_ids,
            gpu_model=self._models[gpu_ids[0]] if gpu_ids else "",
            borrowed=borrowed,
            started_at=started_at,
            max_runtime_seconds=job.limit,
            min_runtime_before_preemption=workload.min_runtime_before_preemption,
            stopping=stopping,
            grace_seconds=workload.grace_seconds,
            preempted_by=preempted_by,
            preemptions=preemptions,
            checkpointed_at=checkpointed_at,
            checkpoint_interval=checkpoint_interval,
            max_preemptions=workload.max_preemptions,
            preemption_protection_seconds=workload.preemption_protection_seconds,
            expected_runtime_seconds=expected_runtime,
            time_sharing=self.shares_time(job),
            attained_gpu_seconds=attained,
        )

    def snapshot(
        self,
        now: float,
        pools: list[str] | None,
        running: list[RunningJob],
        pending: list[PendingJob],
        usage: dict[str, float],
        policy: Policy,
        decisions_only: bool = False,
        kept_cluster: KeptCluster | None = None,
    ) -> Snapshot:
        """A snapshot of ``pools`` (None: all) with the policy's knobs (``decisions_only``
        and ``kept_cluster``: see :class:`~scheduling.engine.Snapshot`)."""
        if pools is None:
            pools = list(self.nodes_by_pool)
        nodes = [node for pool in pools for node in self.nodes_by_pool.get(pool, ())]
        return Snapshot(
            now=now,
            nodes=nodes,
            quotas=self.quotas,
            queues=self.queues,
            running=running,
            pending=pending,
            usage=usage,
            backfill=policy.backfill,
            preemption=policy.preemption,
            fair_share=policy.fair_share,
            global_fifo=policy.global_fifo,
            **policy.order_knobs(),
            decisions_only=decisions_only,
            kept_cluster=kept_cluster,
        )
