"""What-if replays of the cluster's own history, and the export of that history.

A platform admin changes quotas (a tenant's guaranteed GPUs and borrow limit in a pool),
the class a tenant's jobs run at, the class one queue's jobs run at (``queue_classes``,
by queue id) or takes nodes out of the cluster (``cordon``, by node name), and sees,
before changing anything, what the jobs recorded in the last days would have waited and
received with and without the change. Both replays run the real engine
(scheduling.simulator) on the cluster as it is now (ready nodes, healthy GPUs, quotas,
priority classes, workload policies).

Recorded jobs: those that ran and ended (``started_at`` and ``finished_at`` set), each
with its last run's duration (a requeued job's earlier runs are not replayed), its
declared runtime limit, its base class (temporary raises are not replayed) and its
queue's pool. Fair-share history starts empty.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import timedelta

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from portal.errors import BusinessError, NotFoundError, PermissionDeniedError
from tenants.selectors import is_platform_admin

from ..choices import GpuHealth, NodeState, SimulationState
from ..engine import QuotaInfo
from ..models import (
    Gpu,
    Job,
    Node,
    PriorityClass,
    Queue,
    Quota,
    SimulationRun,
    WorkloadPolicy,
)
from ..simulator import (
    POLICIES,
    ClassSpec,
    NodeSpec,
    Scenario,
    SimConfig,
    SimJob,
    TraceJob,
    WorkloadSpec,
    replay,
)
from ..simulator.metrics import per_tenant, summarize
from ..simulator.scenario import DEFAULT_WORKLOADS
from .enqueue import simulation_run_enqueue

log = logging.getLogger(__name__)

DEFAULT_DAYS = 30
MAX_DAYS = 365
DEFAULT_POLICY = "sluice"


# -- the cluster as it is now -----------------------------------------------------------------


def cluster_nodes() -> list[NodeSpec]:
    """Ready nodes with their healthy GPUs, in name order (as the dispatch loop reads them);
    a node with GPUs of several models or sizes gives one spec per kind."""
    gpus: dict[int, dict[tuple[str, int], list[int]]] = defaultdict(lambda: defaultdict(list))
    rows = Gpu.objects.filter(health=GpuHealth.HEALTHY).order_by("index")
    for node_id, index, model, memory in rows.values_list("node_id", "index", "model", "memory_mb"):
        gpus[node_id][(model, memory)].append(index)
    nodes = []
    ready = Node.objects.filter(state=NodeState.READY).select_related("pool").order_by("name")
    for node in ready:
        for (model, memory), indices in gpus.get(node.id, {}).items():
            nodes.append(
                NodeSpec(node.name, node.pool.name, len(indices), model, memory, tuple(indices))
            )
    return nodes


def cluster_quotas() -> dict[int, QuotaInfo]:
    """Every quota by its id, as the engine sees it."""
    return {
        quota.pk: QuotaInfo(
            tenant=quota.tenant.slug,
            pool=quota.pool.name,
            gpu_model=quota.gpu_model,
            guaranteed=quota.guaranteed_gpus,
            borrow_limit=quota.borrow_limit_gpus,
            max_running_jobs=quota.max_running_jobs,
        )
        for quota in Quota.objects.select_related("tenant", "pool").order_by("id")
    }


def cluster_classes() -> dict[str, ClassSpec]:
    """Every priority class by name."""
    return {
        cls.name: ClassSpec(cls.name, cls.value, cls.preemptible, cls.can_preempt)
        for cls in PriorityClass.objects.all()
    }


def cluster_workloads() -> dict[str, WorkloadSpec]:
    """Every workload policy by workload type (the default for types without one)."""
    workloads = dict(DEFAULT_WORKLOADS)
    for policy in WorkloadPolicy.objects.all():
        workloads[policy.workload_type] = WorkloadSpec(
            preemptible=policy.preemptible,
            grace_seconds=policy.stop_grace_seconds,
            min_runtime_before_preemption=policy.min_runtime_before_preemption_seconds,
        )
    return workloads


# -- the recorded jobs ---------------------------------------------------------------------------


def history_jobs(*, days: int | None = None) -> QuerySet[Job]:
    """Jobs that ran and ended (submitted in the last ``days`` days), oldest first."""
    jobs = Job.objects.filter(started_at__isnull=False, finished_at__isnull=False)
    if days:
        jobs = jobs.filter(submitted_at__gte=timezone.now() - timedelta(days=days))
    return jobs.select_related("tenant", "project", "queue__pool", "base_priority_class").order_by(
        "submitted_at", "id"
    )


def _duration(job: Job) -> float:
    return (job.finished_at - job.started_at).total_seconds()


def sim_job(job: Job, *, duration: float | None = None, priority_class: str = "") -> SimJob:
    """The simulator's job for a Job row (same id), with its effective class by default."""
    return SimJob(
        id=job.pk,
        name=str(job.pk),
        tenant=job.tenant.slug,
        pool=job.queue.pool.name,
        priority_class=priority_class or job.priority_class.name,
        workload_type=job.workload_type,
        gpus_per_node=job.gpus_per_node,
        nodes=job.nodes,
        submit=job.submitted_at.timestamp(),
        duration=_duration(job) if duration is None else duration,
        limit=job.max_runtime_seconds,
        gpu_models=tuple(job.gpu_models or ()),
        min_gpu_memory_mb=job.min_gpu_memory_mb,
        project=job.project.slug,
    )


def history_sim_jobs(jobs: Iterable[Job]) -> list[SimJob]:
    """Recorded jobs ready to replay (base class; jobs without a positive duration left out)."""
    result = []
    for job in jobs:
        duration = _duration(job)
        if duration > 0:
            result.append(
                sim_job(job, duration=duration, priority_class=job.base_priority_class.name)
            )
    return result


def history_trace_jobs(jobs: Iterable[Job]) -> list[TraceJob]:
    """Recorded jobs in the simulator's plain CSV format (see scheduling.simulator.readers)."""
    rows = []
    for job in jobs:
        duration = _duration(job)
        if duration <= 0:
            continue
        rows.append(
            TraceJob(
                job_id=str(job.pk),
                submit_time=job.submitted_at.timestamp(),
                duration=duration,
                num_gpus=job.gpus_per_node * job.nodes,
                gpus_per_node=job.gpus_per_node,
                tenant=job.tenant.slug,
                priority_class=job.base_priority_class.name,
                gpu_models=tuple(job.gpu_models or ()),
                workload_type=job.workload_type,
                pool=job.queue.pool.name,
                runtime_limit=float(job.max_runtime_seconds),
            )
        )
    return rows


# -- what-if scenarios ---------------------------------------------------------------------------


def baseline_scenario(jobs: list[SimJob], quotas: dict[int, QuotaInfo]) -> Scenario:
    """The recorded jobs on the cluster as it is configured now (``quotas`` by id)."""
    return Scenario(
        name="baseline",
        nodes=cluster_nodes(),
        quotas=list(quotas.values()),
        classes=cluster_classes(),
        workloads=cluster_workloads(),
        jobs=jobs,
    )


def changed_scenario(baseline: Scenario, quotas: dict[int, QuotaInfo], params: dict) -> Scenario:
    """The baseline (whose ``quotas`` by id are given) with the quotas, tenants' classes,
    queues' classes and cordoned nodes of ``params`` changed."""
    overrides = {int(key): value for key, value in (params.get("quotas") or {}).items()}
    changed_quotas = []
    for quota_id, quota in quotas.items():
        change = overrides.get(quota_id)
        if change:
            quota = replace(
                quota, guaranteed=change["guaranteed"], borrow_limit=change["borrow_limit"]
            )
        changed_quotas.append(quota)
    classes = params.get("classes") or {}
    jobs = [
        replace(job, priority_class=classes[job.tenant]) if classes.get(job.tenant) else job
        for job in baseline.jobs
    ]
    queue_classes = params.get("queue_classes") or {}
    if queue_classes:
        queue_of = dict(
            Job.objects.filter(queue_id__in=[int(key) for key in queue_classes]).values_list(
                "pk", "queue_id"
            )
        )
        jobs = [
            replace(job, priority_class=queue_classes[str(queue_of[job.id])])
            if job.id in queue_of
            else job
            for job in jobs
        ]
    cordon = set(params.get("cordon") or ())
    nodes = [node for node in baseline.nodes if node.name not in cordon]
    return replace(baseline, name="changed", nodes=nodes, quotas=changed_quotas, jobs=jobs)


def describe_changes(params: dict) -> list[str]:
    """The changes of ``params`` in words."""
    lines = []
    quotas = Quota.objects.select_related("tenant", "pool").in_bulk(
        [int(key) for key in (params.get("quotas") or {})]
    )
    for key, change in sorted((params.get("quotas") or {}).items()):
        quota = quotas.get(int(key))
        if quota is not None:
            lines.append(
                f"{quota}: guaranteed {quota.guaranteed_gpus} -> {change['guaranteed']}, "
                f"borrow limit {quota.borrow_limit_gpus} -> {change['borrow_limit']}"
            )
    for tenant, cls in sorted((params.get("classes") or {}).items()):
        lines.append(f"{tenant}: jobs run at class {cls}")
    queue_classes = params.get("queue_classes") or {}
    queues = Queue.objects.select_related("tenant").in_bulk([int(key) for key in queue_classes])
    for key, cls in sorted(queue_classes.items()):
        if int(key) in queues:
            lines.append(f"queue {queues[int(key)]}: jobs run at class {cls}")
    for name in params.get("cordon") or ():
        lines.append(f"node {name}: cordoned (its GPUs left out of the replay)")
    return lines


# -- runs ---------------------------------------------------------------------------------------


def simulation_runs_visible_to(user) -> QuerySet[SimulationRun]:
    """Runs a user may see: platform admins see all of them, nobody else any."""
    runs = SimulationRun.objects.select_related("created_by")
    return runs if is_platform_admin(user) else runs.none()


def simulation_run_get(user, pk: int) -> SimulationRun:
    """One run, or NotFoundError when it does not exist for this user."""
    run = simulation_runs_visible_to(user).filter(pk=pk).first()
    if run is None:
        raise NotFoundError("No such simulation.")
    return run


def clean_params(params: dict) -> dict:
    """Check and normalise what-if parameters; raises BusinessError naming the field."""
    days = int(params.get("days") or DEFAULT_DAYS)
    if not 1 <= days <= MAX_DAYS:
        raise BusinessError(f"Replay between 1 and {MAX_DAYS} days of history.", field="days")
    policy = params.get("policy") or DEFAULT_POLICY
    if policy not in POLICIES:
        raise BusinessError(f"Unknown policy {policy}.", field="policy")
    quotas = {}
    known = set(Quota.objects.values_list("id", flat=True))
    for key, change in (params.get("quotas") or {}).items():
        if int(key) not in known:
            raise BusinessError(f"No quota {key}.", field="quotas")
        guaranteed, borrow = int(change["guaranteed"]), int(change["borrow_limit"])
        if guaranteed < 0 or borrow < 0:
            raise BusinessError("Quotas cannot be negative.", field="quotas")
        quotas[str(int(key))] = {"guaranteed": guaranteed, "borrow_limit": borrow}
    classes = {}
    names = set(PriorityClass.objects.values_list("name", flat=True))
    for tenant, cls in (params.get("classes") or {}).items():
        if cls and cls not in names:
            raise BusinessError(f"Unknown priority class {cls}.", field="classes")
        if cls:
            classes[tenant] = cls
    cleaned = {"days": days, "policy": policy, "quotas": quotas, "classes": classes}
    # Optional changes, kept out of the parameters when absent (older runs have neither).
    queue_classes = {}
    known_queues = set(Queue.objects.values_list("id", flat=True))
    for key, cls in (params.get("queue_classes") or {}).items():
        if not str(key).isdigit() or int(key) not in known_queues:
            raise BusinessError(f"No queue {key}.", field="queue_classes")
        if cls not in names:
            raise BusinessError(f"Unknown priority class {cls}.", field="queue_classes")
        queue_classes[str(int(key))] = cls
    if queue_classes:
        cleaned["queue_classes"] = queue_classes
    cordon = params.get("cordon") or []
    if not isinstance(cordon, list) or not all(isinstance(name, str) for name in cordon):
        raise BusinessError("Cordon a list of node names.", field="cordon")
    cordon = sorted(set(cordon))
    unknown = set(cordon) - set(Node.objects.filter(name__in=cordon).values_list("name", flat=True))
    if unknown:
        raise BusinessError(f"No node {sorted(unknown)[0]}.", field="cordon")
    if cordon:
        cleaned["cordon"] = cordon
    return cleaned


@transaction.atomic
def simulation_run_create(*, user, params: dict) -> SimulationRun:
    """Queue a what-if replay for a platform admin; the Celery task runs it."""
    if not is_platform_admin(user):
        raise PermissionDeniedError("Only platform admins run what-if simulations.")
    run = SimulationRun.objects.create(
        created_by=user, params=clean_params(params), created_at=timezone.now()
    )
    transaction.on_commit(lambda: simulation_run_enqueue(run.pk))
    return run


def simulation_run_execute(*, run_id: int) -> None:
    """Run a queued what-if (called by the task): claim it, replay both, store the result."""
    claimed = SimulationRun.objects.filter(pk=run_id, state=SimulationState.QUEUED).update(
        state=SimulationState.RUNNING, started_at=timezone.now()
    )
    if claimed != 1:
        return  # already taken by another worker, or gone
    run = SimulationRun.objects.get(pk=run_id)
    try:
        result = _replay_both(run)
    except Exception as error:  # the run must end as failed, whatever went wrong
        log.exception("simulation %s failed", run_id)
        SimulationRun.objects.filter(pk=run_id).update(
            state=SimulationState.FAILED, error=str(error)[:2000], finished_at=timezone.now()
        )
        return
    SimulationRun.objects.filter(pk=run_id).update(
        state=SimulationState.DONE, progress=100, result=result, finished_at=timezone.now()
    )


class _Progress:
    """Writes a run's progress (0-100) to its row, a few times per replay at most."""

    def __init__(self, run_id: int, start: int, span: int) -> None:
        self.run_id, self.start, self.span, self.last = run_id, start, span, -1

    def __call__(self, fraction: float) -> None:
        value = self.start + int(self.span * fraction)
        if value >= self.last + 5:
            self.last = value
            SimulationRun.objects.filter(pk=self.run_id).update(progress=min(value, 99))


def _replay_both(run: SimulationRun) -> dict:
    params = run.params
    jobs = history_sim_jobs(history_jobs(days=params["days"]))
    if not jobs:
        raise BusinessError(f"No finished job in the last {params['days']} days to replay.")
    policy = POLICIES[params["policy"]]
    quotas = cluster_quotas()
    baseline = baseline_scenario(jobs, quotas)
    changed = changed_scenario(baseline, quotas, params)
    config = SimConfig()
    outcomes = {}
    for number, scenario in enumerate((baseline, changed)):
        result = replay(scenario, policy, config, _Progress(run.pk, number * 50, 50))
        outcomes[scenario.name] = {"summary": summarize(result), "tenants": per_tenant(result)}
    return {
        "jobs": len(jobs),
        "gpus": baseline.capacity,
        "policy": policy.name,
        "changes": describe_changes(params),
        **outcomes,
        "comparison": compare_tenants(outcomes["baseline"], outcomes["changed"], changed),
    }


def compare_tenants(baseline: dict, changed: dict, scenario: Scenario) -> list[dict]:
    """Per tenant: the figures of both replays side by side."""
    after = {row["tenant"]: row for row in changed["tenants"]}
    guarantees = scenario.guarantees()
    rows = []
    for before in baseline["tenants"]:
        tenant = before["tenant"]
        now = after.get(tenant, before)
        rows.append(
            {
                "tenant": tenant,
                "jobs": before["jobs"],
                "guaranteed_before": before["guaranteed_gpus"],
                "guaranteed_after": guarantees.get(tenant, 0),
                "wait_avg_before_s": before["wait_avg_s"],
                "wait_avg_after_s": now["wait_avg_s"],
                "wait_p95_before_s": before["wait_p95_s"],
                "wait_p95_after_s": now["wait_p95_s"],
                "gpu_hours_before": before["gpu_hours"],
                "gpu_hours_after": now["gpu_hours"],
                "use_before": before["use_of_guarantee"],
                "use_after": now["use_of_guarantee"],
            }
        )
    return rows
