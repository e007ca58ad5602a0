"""Small builders for engine snapshots, an invariant checker and a cluster simulator."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from scheduling.engine import (
    GpuInfo,
    NodeInfo,
    PendingJob,
    Plan,
    QueueInfo,
    QuotaInfo,
    RunningJob,
    Snapshot,
    decay_usage,
    plan,
    reasons,
)
from scheduling.engine.order import level_of, sharing_level
from scheduling.engine.preemption import attained_service, protected_until

NOW = 1_000_000.0
CLASSES = {"low": 10, "normal": 100, "high": 1000, "critical": 10000}
TRAINING = {"training", "fine_tuning"}


def node(
    node_id: int,
    pool: str = "training",
    model: str = "H100",
    gpus: int = 8,
    memory: int = 81920,
    block: str = "",
) -> NodeInfo:
    """A node whose GPU ids are ``node_id * 100 + index`` (in topology ``block``)."""
    return NodeInfo(
        node_id,
        f"n{node_id}",
        pool,
        [GpuInfo(node_id * 100 + i, node_id, i, model, memory) for i in range(gpus)],
        block=block,
    )


def gpu_ids(node_id: int, *indexes: int) -> tuple[int, ...]:
    return tuple(node_id * 100 + index for index in indexes)


def quota(
    tenant: str,
    guaranteed: int,
    borrow: int = 0,
    pool: str = "training",
    model: str = "",
    max_jobs=None,
):
    return QuotaInfo(tenant, pool, model, guaranteed, borrow, max_jobs)


def job(
    job_id: int,
    tenant: str = "a",
    gpus: int = 1,
    nodes: int = 1,
    cls: str = "normal",
    *,
    pool: str = "training",
    preemptible: bool | None = None,
    can_preempt: bool | None = None,
    workload: str = "training",
    models: tuple[str, ...] = (),
    min_memory: int = 0,
    runtime: int = 3600,
    submitted: float | None = None,
    queue: int = 1,
    held: bool = False,
    topology_wait: float = 0.0,
) -> PendingJob:
    """A pending job; classes ``high``/``critical`` may preempt, ``critical`` is not
    preemptible (unless told otherwise)."""
    return PendingJob(
        id=job_id,
        tenant=tenant,
        project="p",
        queue_id=queue,
        pool=pool,
        workload_type=workload,
        priority=CLASSES[cls],
        priority_class=cls,
        preemptible=cls != "critical" if preemptible is None else preemptible,
        can_preempt=cls in ("high", "critical") if can_preempt is None else can_preempt,
        gpus_per_node=gpus,
        nodes=nodes,
        gpu_models=models,
        min_gpu_memory_mb=min_memory,
        submitted_at=NOW - 1000 + job_id if submitted is None else submitted,
        max_runtime_seconds=runtime,
        held=held,
        topology_wait_seconds=topology_wait,
    )


def running(
    job_id: int,
    tenant: str,
    gpus: tuple[int, ...],
    cls: str = "normal",
    *,
    pool: str = "training",
    model: str = "H100",
    preemptible: bool = True,
    borrowed: bool = False,
    age: float = 600,
    runtime: int = 3600,
    min_runtime: int = 0,
    workload: str = "training",
    stopping: bool = False,
    grace: int = 30,
    preempted_by: int | None = None,
) -> RunningJob:
    return RunningJob(
        id=job_id,
        tenant=tenant,
        pool=pool,
        workload_type=workload,
        priority=CLASSES[cls],
        priority_class=cls,
        preemptible=preemptible,
        gpu_ids=gpus,
        gpu_model=model,
        borrowed=borrowed,
        started_at=NOW - age,
        max_runtime_seconds=runtime,
        min_runtime_before_preemption=min_runtime,
        stopping=stopping,
        grace_seconds=grace,
        preempted_by=preempted_by,
    )


def snapshot(nodes, quotas, pending, run=(), queues=None, usage=None, now=NOW, **flags) -> Snapshot:
    """A snapshot; by default one open queue (id 1) and one strict queue (id 2)."""
    if queues is None:
        queues = [QueueInfo(1, "main", "a"), QueueInfo(2, "strict", "a", strict_fifo=True)]
    return Snapshot(
        now=now,
        nodes=list(nodes),
        quotas=list(quotas),
        queues=list(queues),
        running=list(run),
        pending=list(pending),
        usage=dict(usage or {}),
        **flags,
    )


def handed_back(pending, result):
    """The pending jobs as the dispatch loop passes them to the next cycle: each with the
    reservation and pool position the plan gave it (jobs it placed are left out)."""
    out = []
    for item in pending:
        info = result.pending.get(item.id)
        if info is None:
            continue
        out.append(
            dataclasses.replace(
                item,
                reserved_gpu_ids=info.reserved_gpu_ids,
                reserved_start=info.estimated_start if info.reserved_gpu_ids else None,
                previous_position=info.pool_position,
            )
        )
    return out


# -- invariants ------------------------------------------------------------------------------


def account_key(snap: Snapshot, tenant: str, pool: str, model: str) -> tuple[str, str, str]:
    specific = {(q.tenant, q.pool, q.gpu_model) for q in snap.quotas}
    return (tenant, pool, model if (tenant, pool, model) in specific else "")


def quota_of(snap: Snapshot, key: tuple[str, str, str]) -> tuple[int, int]:
    for q in snap.quotas:
        if (q.tenant, q.pool, q.gpu_model) == key:
            return q.guaranteed, q.borrow_limit
    return 0, 0


def check_plan(snap: Snapshot, result: Plan) -> None:
    """Assert the invariants every plan must satisfy."""
    gpus = {gpu.id: (node, gpu) for node in snap.nodes for gpu in node.gpus}
    pending = {job.id: job for job in snap.pending}
    runs = {job.id: job for job in snap.running}
    busy = {gpu for job in snap.running for gpu in job.gpu_ids}
    seen: set[int] = set()
    used: dict[tuple, int] = defaultdict(int)
    on_guarantee: dict[tuple, int] = defaultdict(int)  # GPUs not borrowed
    for job in snap.running:
        key = account_key(snap, job.tenant, job.pool, job.gpu_model)
        used[key] += len(job.gpu_ids)
        if not job.borrowed:
            on_guarantee[key] += len(job.gpu_ids)

    placed = set()
    for placement in result.placements:
        job = pending[placement.job_id]
        assert placement.job_id not in placed
        placed.add(placement.job_id)
        assert len(placement.gpu_ids) == job.gpus_per_node * job.nodes
        assert len(set(placement.node_ids)) == job.nodes, "nodes must be distinct"
        per_node: dict[int, int] = defaultdict(int)
        for gpu_id in placement.gpu_ids:
            assert gpu_id in gpus, "unknown GPU"
            assert gpu_id not in busy, "GPU already held by a running job"
            assert gpu_id not in seen, "GPU in two placements"
            seen.add(gpu_id)
            node, gpu = gpus[gpu_id]
            per_node[node.id] += 1
            assert node.pool == job.pool
            assert gpu.model == placement.gpu_model
            assert not job.gpu_models or gpu.model in job.gpu_models
            assert gpu.memory_mb >= job.min_gpu_memory_mb
        assert set(per_node) == set(placement.node_ids)
        assert all(count == job.gpus_per_node for count in per_node.values()), "gang per node"
        assert not job.held
        # Quota, in placement (= scheduling) order.
        key = account_key(snap, job.tenant, job.pool, placement.gpu_model)
        guaranteed, borrow = quota_of(snap, key)
        total = job.gpus_per_node * job.nodes
        assert used[key] + total <= guaranteed + borrow, "above guaranteed + borrow limit"
        if not job.preemptible:
            assert used[key] + total <= guaranteed, "non-preemptible outside the guarantee"
            assert not placement.borrowed
        if not placement.borrowed:
            # Admitted on the guarantee, or borrowed where the GPUs not borrowed leave
            # the guarantee room for it (engine.quota.placed_within_guarantee).
            assert on_guarantee[key] + total <= guaranteed
            on_guarantee[key] += total
        else:
            assert used[key] + total > guaranteed
        used[key] += total

    victims = set()
    for preemption in result.preemptions:
        victim = runs[preemption.victim_id]
        preemptor = pending[preemption.preemptor_id]
        assert preemption.victim_id not in victims
        victims.add(preemption.victim_id)
        assert preemption.preemptor_id not in placed, "a preemptor waits for the grace period"
        assert not victim.stopping
        assert snap.now - victim.started_at >= victim.min_runtime_before_preemption
        # Every stop counts: a job at its stop limit is stopped by nobody (a higher class
        # or a reclaim) while protected (its whole run by default).
        assert snap.now >= protected_until(victim), "a job at its stop limit was stopped"
        assert not (victim.workload_type == "inference" and preemptor.workload_type in TRAINING)
        assert victim.pool == preemptor.pool
        by_priority = (
            preemptor.can_preempt and victim.preemptible and victim.priority < preemptor.priority
        )
        assert preemption.reason in (
            reasons.PREEMPT_PRIORITY,
            reasons.PREEMPT_RECLAIM,
            reasons.PREEMPT_TIME_SHARING,
        )
        if preemption.reason == reasons.PREEMPT_TIME_SHARING:
            # Time-sharing: both take part, same class, the victim in a higher level
            # (more GPU-time used), preemptible, of the preemptor's tenant or borrowing.
            assert preemptor.time_sharing and victim.time_sharing and victim.preemptible
            assert victim.priority == preemptor.priority
            assert victim.tenant == preemptor.tenant or victim.borrowed
            attained = attained_service(victim, snap.now)
            level = sharing_level(preemptor, snap.now, snap.policy())
            assert level < len(snap.time_sharing_levels)
            assert attained >= snap.time_sharing_levels[level], "victim not in a higher level"
            assert level_of(attained, snap.time_sharing_levels) > level
        else:
            assert by_priority or victim.borrowed, "victim neither of a lower class nor borrowed"
            if victim.tenant == preemptor.tenant:
                assert by_priority, "own-tenant victim not of a lower, preemptible class"
        if preemption.reason == reasons.PREEMPT_RECLAIM:
            assert victim.borrowed and victim.tenant != preemptor.tenant
        elif preemption.reason == reasons.PREEMPT_PRIORITY:
            assert by_priority
        preempting = result.pending[preemption.preemptor_id]
        assert preempting.code == reasons.WAITING_FOR_PREEMPTION
        # The victims free GPUs (or quota) in the slice the preemptor waits for.
        assert preempting.reserved_gpu_ids
        _, wanted = gpus[preempting.reserved_gpu_ids[0]]
        for gpu_id in victim.gpu_ids:
            if gpu_id in gpus:
                _, held = gpus[gpu_id]
                assert (held.model, held.memory_mb) == (wanted.model, wanted.memory_mb)

    assert set(result.pending) | placed == set(pending), "every job placed or explained"
    assert not set(result.pending) & placed
    queue_positions = defaultdict(list)
    pool_positions = defaultdict(list)
    for info in result.pending.values():
        assert info.code in reasons.ALL
        assert info.message
        if info.code in reasons.NEVER_STARTS:
            assert info.estimated_start is None
        if info.estimated_start is not None:
            assert info.estimated_start >= snap.now
        queue_positions[pending[info.job_id].queue_id].append(info.queue_position)
        pool_positions[pending[info.job_id].pool].append(info.pool_position)
    for positions in (*queue_positions.values(), *pool_positions.values()):
        assert sorted(positions) == list(range(1, len(positions) + 1))


def run_plan(snap: Snapshot) -> Plan:
    """plan() plus the invariant checks."""
    result = plan(snap)
    check_plan(snap, result)
    return result


# -- simulation ------------------------------------------------------------------------------


@dataclasses.dataclass
class Simulation:
    """Drives plan() over time: placements start, jobs run to their full limit, victims
    stop after their grace period, fair-share usage decays."""

    snap: Snapshot
    half_life: float = 3600.0
    started: dict[int, float] = dataclasses.field(default_factory=dict)
    first_estimate: dict[int, float | None] = dataclasses.field(default_factory=dict)
    gpu_seconds: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    stop_time: dict[int, float] = dataclasses.field(default_factory=dict)
    keep_reservations: bool = True  # hand each reservation back, as the dispatch loop does

    def step(self) -> Plan:
        snap = self.snap
        result = run_plan(snap)
        for info in result.pending.values():
            self.first_estimate.setdefault(info.job_id, info.estimated_start)
        pending = {job.id: job for job in snap.pending}
        if self.keep_reservations:
            for info in result.pending.values():
                pending[info.job_id] = dataclasses.replace(
                    pending[info.job_id],
                    reserved_gpu_ids=info.reserved_gpu_ids,
                    reserved_start=info.estimated_start if info.reserved_gpu_ids else None,
                    previous_position=info.pool_position,
                )
        for info in result.pending.values():
            # When a job first waited for one topology block, as the dispatch loop keeps it.
            waiting = pending[info.job_id]
            if info.code == reasons.WAITING_FOR_TOPOLOGY and waiting.topology_since is None:
                pending[info.job_id] = dataclasses.replace(waiting, topology_since=snap.now)
        runs = {job.id: job for job in snap.running}
        for preemption in result.preemptions:
            victim = runs[preemption.victim_id]
            runs[victim.id] = dataclasses.replace(
                victim, stopping=True, preempted_by=preemption.preemptor_id
            )
        for placement in result.placements:
            job = pending.pop(placement.job_id)
            self.started[job.id] = snap.now
            runs[job.id] = RunningJob(
                id=job.id,
                tenant=job.tenant,
                pool=job.pool,
                workload_type=job.workload_type,
                priority=job.priority,
                priority_class=job.priority_class,
                preemptible=job.preemptible,
                gpu_ids=placement.gpu_ids,
                gpu_model=placement.gpu_model,
                borrowed=placement.borrowed,
                started_at=snap.now,
                max_runtime_seconds=job.max_runtime_seconds,
            )
        snap.pending = list(pending.values())
        snap.running = list(runs.values())
        return result

    def next_event(self) -> float | None:
        """When the next running job ends (full limit, or grace for stopping jobs)."""
        snap = self.snap
        ends = []
        for job in snap.running:
            if job.stopping:
                ends.append(self.stop_time.setdefault(job.id, snap.now + job.grace_seconds))
            else:
                ends.append(job.started_at + job.max_runtime_seconds)
        for job in snap.pending:  # a topology wait ends: the job may be spread then
            if job.topology_since is not None:
                over = job.topology_since + job.topology_wait_seconds
                if over > snap.now:
                    ends.append(over)
        return min(ends) if ends else None

    def advance(self, until: float) -> None:
        """Move time to ``until``: jobs that ended are removed, usage accrues."""
        snap = self.snap
        elapsed = until - snap.now
        in_use: dict[str, int] = defaultdict(int)
        for job in snap.running:
            in_use[job.tenant] += len(job.gpu_ids)
            self.gpu_seconds[job.tenant] += len(job.gpu_ids) * elapsed
        snap.usage = decay_usage(snap.usage, elapsed, self.half_life, in_use)
        snap.now = until
        kept = []
        for job in snap.running:
            end = (
                self.stop_time.get(job.id, until + 1)
                if job.stopping
                else job.started_at + job.max_runtime_seconds
            )
            if end > until:
                kept.append(job)
            elif job.stopping:
                self.requeue(job)
        snap.running = kept

    def requeue(self, job: RunningJob) -> None:
        """A preempted job comes back as pending (not needed by most tests)."""

    def run(self, cycles: int = 1000) -> None:
        """Plan, then jump to the next end, until nothing is left to do."""
        for _ in range(cycles):
            self.step()
            upcoming = self.next_event()
            if upcoming is None:
                break
            self.advance(max(upcoming, self.snap.now))
