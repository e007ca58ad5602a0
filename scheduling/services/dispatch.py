"""The dispatch loop: load a snapshot, call ``engine.plan``, apply the plan in one transaction.

One leader at a time (a PostgreSQL advisory lock; a file lock on the embedded default).
Requests are coalesced through the cache: a burst of submits queues one cycle, not one each.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from audit.services import audit_record
from scheduling.agent.protocol import launch_message
from tenants.selectors import job_unix_account

from .. import engine, signals
from ..choices import ACTIVE_STATES, GpuHealth, JobState, NodeState, QueueState, StopReason
from ..limits.selectors import launch_runtime_limit
from ..models import (
    Allocation,
    Gpu,
    Job,
    JobEvent,
    Node,
    PoolEstimates,
    Queue,
    Quota,
    ResourcePool,
    TenantUsage,
    WorkloadPolicy,
    topology_block,
)
from ..runtime_prediction import expected_runtimes
from .enqueue import WAITING_VERSION_KEY, dispatch_on_commit
from .leader import file_leader_lock
from .lifecycle import jobs_transition_bulk
from .messaging import send_node_messages
from .pending_cache import (
    PendingCache,
    PendingRow,
    attained_service,
    epoch,
    takes_part_in_time_sharing,
)
from .pending_ranks import ranks_after
from .sql import rows_update
from .stopping import job_stop

MIB = 1024 * 1024

log = logging.getLogger(__name__)

# The engine's reservations of the last cycle, handed back to the next one so that estimates
# stay upper bounds. Derived scheduler state, not business data: losing it (cache flush,
# restart) only makes the next cycle compute reservations afresh.
RESERVATIONS_KEY = "sluice:dispatch:reservations"
#: When each waiting job first waited for one topology block (epoch seconds, by job id),
#: moved later by the time it since waited for something else (see TOPOLOGY_PAUSED_KEY).
TOPOLOGY_WAITS_KEY = "sluice:dispatch:topology-waits"
#: Since when a job of TOPOLOGY_WAITS_KEY waits for something else than one block (quota,
#: GPUs, its turn): its topology wait does not count meanwhile (epoch seconds, by job id).
TOPOLOGY_PAUSED_KEY = "sluice:dispatch:topology-paused"
_LEADER_LOCK_KEY = 0x51_1CE_D15
#: The waiting jobs as the dispatch leader last read them (see pending_cache).
LEADER_CACHE = PendingCache()


@contextlib.contextmanager
def _leader_lock():
    """Yield True if this process is the dispatch leader for the duration of the block."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_LEADER_LOCK_KEY])
            yield bool(cursor.fetchone()[0])
        return
    with file_leader_lock("dispatch") as leader:
        yield leader


@dataclass(slots=True)
class RunningRow:
    """What a cycle reads of a placed job (ADMITTED, RUNNING or STOPPING): plain values,
    the model object is read only for a job the cycle preempts."""

    id: int
    project_id: int
    tenant: str
    pool: str
    workload_type: str
    priority: int
    priority_class: str
    class_preemptible: bool
    admitted_at: datetime | None
    max_runtime_seconds: int
    state: str
    stop_reason: str
    preemption_count: int
    submitted_by_id: int | None
    queue_time_sharing: bool = False
    checkpoint_dir: str = ""


def _load_running() -> dict[int, RunningRow]:
    """The placed jobs, one narrow query (their tenants, pools and classes by joins)."""
    rows = Job.objects.filter(state__in=ACTIVE_STATES).values_list(
        "id",
        "project_id",
        "tenant__slug",
        "queue__pool__name",
        "workload_type",
        "priority_class__value",
        "priority_class__name",
        "priority_class__preemptible",
        "admitted_at",
        "max_runtime_seconds",
        "state",
        "stop_reason",
        "preemption_count",
        "submitted_by_id",
        "queue__time_sharing",
        "checkpoint_dir",
    )
    return {row[0]: RunningRow(*row) for row in rows.order_by()}


def _running_expected(
    running_jobs: dict[int, RunningRow], known: dict[int, float]
) -> dict[int, float]:
    """Each placed job's predicted runtime (seconds, 0: none), where the minimum
    preemption gain reads it (SLUICE_PREEMPTION_MIN_GAIN_SECONDS > 0). ``known``: the
    predictions made when the jobs were first seen placed (``PendingCache.
    running_expected``), updated here: one query for the jobs placed since, none
    otherwise."""
    if settings.SLUICE_PREEMPTION_MIN_GAIN_SECONDS <= 0:
        known.clear()
        return known
    for job_id in [job_id for job_id in known if job_id not in running_jobs]:
        del known[job_id]
    new = [job for job_id, job in running_jobs.items() if job_id not in known]
    if new:
        found = expected_runtimes(
            (
                job.id,
                job.project_id,
                job.workload_type,
                job.submitted_by_id,
                job.max_runtime_seconds,
            )
            for job in new
        )
        for job in new:
            known[job.id] = found.get(job.id) or 0.0
    return known


@dataclass
class Loaded:
    """The rows a cycle reads, kept for applying the plan without reading them again."""

    snapshot: engine.Snapshot
    pending: dict[int, PendingRow] = field(default_factory=dict)
    running: dict[int, RunningRow] = field(default_factory=dict)
    gpus: dict[int, tuple[int, int, str]] = field(
        default_factory=dict
    )  # gpu id -> (node id, index, uuid)
    node_names: dict[int, str] = field(default_factory=dict)
    pool_ids: set[int] = field(default_factory=set)
    policies: dict[str, WorkloadPolicy] = field(default_factory=dict)
    #: The reservations the last cycle handed over, by job id (see _remember_reservations).
    held_reservations: dict[int, tuple] = field(default_factory=dict)


#: Each tenant's decayed usage is stored at most this often. Between two writes a cycle
#: computes it from the stored value (the GPUs in use now counted since then: a few GPU-
#: seconds against a history of days), so that a cycle that changes nothing writes nothing
#: (and its commit waits on no disk).
USAGE_WRITE_SECONDS = 10.0


def _update_usage(now: datetime, in_use: dict[str, int]) -> dict[str, float]:
    """Decay and accrue each tenant's fair-share usage since it was last stored; returns it
    by slug, storing it when that was ``USAGE_WRITE_SECONDS`` ago or more."""
    from tenants.models import Tenant

    rows = {u.tenant_id: u for u in TenantUsage.objects.all()}
    slugs = dict(Tenant.objects.values_list("id", "slug"))
    usage: dict[str, float] = {}
    changed, created = [], []
    for tenant_id, slug in slugs.items():
        row = rows.get(tenant_id)
        if row is None:
            created.append(TenantUsage(tenant_id=tenant_id, gpu_seconds=0.0, updated_at=now))
            usage[slug] = 0.0
            continue
        elapsed = max((now - row.updated_at).total_seconds(), 0.0)
        value = engine.decay_usage(
            {slug: row.gpu_seconds},
            elapsed,
            settings.SLUICE_USAGE_HALF_LIFE_SECONDS,
            {slug: in_use.get(slug, 0)},
        ).get(slug, 0.0)
        usage[slug] = value
        if elapsed >= USAGE_WRITE_SECONDS:
            row.gpu_seconds, row.updated_at = value, now
            changed.append(row)
    TenantUsage.objects.bulk_update(changed, ["gpu_seconds", "updated_at"], batch_size=500)
    TenantUsage.objects.bulk_create(created, ignore_conflicts=True)
    return usage


def _preemptors_of_stopping(jobs) -> dict[int, int]:
    """For jobs stopping because of a preemption: the job each one makes room for."""
    ids = [
        j.id for j in jobs if j.state == JobState.STOPPING and j.stop_reason == StopReason.PREEMPTED
    ]
    if not ids:
        return {}
    preemptors: dict[int, int] = {}
    for job_id, data in JobEvent.objects.filter(job_id__in=ids, kind="stop_preempted").values_list(
        "job_id", "data"
    ):
        if isinstance(data, dict) and data.get("preemptor"):
            preemptors[job_id] = int(data["preemptor"])
    return preemptors


def _remember_positions(plan: engine.Plan, loaded: Loaded) -> None:
    """Hand this cycle's pool positions to the next one; after a short cycle (see
    ``_explain_now``) the jobs it did not reach keep the positions they had."""
    positions = {job_id: info.pool_position for job_id, info in plan.pending.items()}
    if loaded.snapshot.decisions_only:
        positions = {**LEADER_CACHE.positions, **positions}
    LEADER_CACHE.positions = positions


def _remember_reservations(plan: engine.Plan, loaded: Loaded) -> None:
    """Hand this cycle's reservations to the next one; after a short cycle the waiting
    jobs it did not reach keep the reservations they held (as the simulator's records
    do: scheduling/simulator)."""
    reservations = {
        job_id: (list(info.reserved_gpu_ids), info.estimated_start, list(info.claimed_gpu_ids))
        for job_id, info in plan.pending.items()
        if info.reserved_gpu_ids
    }
    if loaded.snapshot.decisions_only:
        placed = {p.job_id for p in plan.placements}
        for job_id, held in loaded.held_reservations.items():
            if job_id in loaded.pending and job_id not in plan.pending and job_id not in placed:
                reservations[job_id] = held
    cache.set(RESERVATIONS_KEY, reservations, timeout=3600)


def _explain_now(loaded: Loaded, monotonic: float) -> bool:
    """Whether this cycle explains every waiting job (a full cycle) or is a short one.

    In a deep backlog (``SLUICE_DISPATCH_DEEP_BACKLOG`` waiting jobs or more), explaining
    every waiting job is most of a cycle: its order, reason, estimate and reservation, the
    sort keys compared, a JSON of 10,000 estimates written. A short cycle
    (``Snapshot.decisions_only``, as the simulator runs every cycle) stops once no waiting
    job left could start or preempt: it places and preempts exactly what a full cycle from
    the same state would (engine/settled.py), writes the reasons of the jobs it reached
    that changed, and leaves the others as the last full cycle explained them (their
    reasons, sort keys and estimates; their positions and held reservations are handed on
    unchanged). A full cycle runs whenever a waiting job is new or changed (it is
    explained at once) and otherwise once the last one is ``_explain_interval`` old: what
    a page shows of a job deep in the backlog is at most that old."""
    return LEADER_CACHE.whole_reads > 0 or not _short_allowed(len(loaded.pending), monotonic)


def _explain_interval() -> float:
    """How old the last full cycle may get in a deep backlog: long enough that full cycles
    take at most ``SLUICE_DISPATCH_EXPLAIN_SHARE`` of the loop's time (a full cycle of
    0.3 s at the default tenth: one every 3 s), at least ``SLUICE_DISPATCH_EXPLAIN_SECONDS``
    and at most ``SLUICE_DISPATCH_EXPLAIN_MAX_SECONDS``. Explaining 10,000 waiting jobs
    every second took a third of the dispatcher's time in a 10,000-job drain; what it
    refreshes (the positions and estimates of jobs thousands deep) moves little meanwhile."""
    share = settings.SLUICE_DISPATCH_EXPLAIN_SHARE
    floor = settings.SLUICE_DISPATCH_EXPLAIN_SECONDS
    by_cost = LEADER_CACHE.explained_seconds / share if share > 0 else floor
    return min(max(floor, by_cost), max(floor, settings.SLUICE_DISPATCH_EXPLAIN_MAX_SECONDS))


def _short_allowed(waiting: int, monotonic: float) -> bool:
    """A deep backlog whose last full cycle is recent (``_explain_now``)."""
    deep = settings.SLUICE_DISPATCH_DEEP_BACKLOG
    explained = LEADER_CACHE.explained_at
    return (
        0 < deep <= waiting
        and explained is not None
        and monotonic - explained < _explain_interval()
    )


def _waiting_to_read(monotonic: float) -> bool:
    """Whether this cycle reads the waiting jobs, or may take them from the leader's copy.

    A cycle that would be a short one (a deep backlog, the last full cycle recent: see
    ``_explain_now``) takes them from the copy when no waiting job changed since they were
    last read but by this leader's own cycles (``enqueue.WAITING_VERSION_KEY``, bumped by
    submissions, state changes to and from waiting, raises and limit changes): at 10,000
    waiting, reading them is a third of such a cycle, and the database's work besides. The
    counter is read before the jobs are, so a change that commits meanwhile is read by the
    next cycle. A placement the copy does not know to be stale (a job cancelled in the
    meantime) is dropped when the cycle reads the placed jobs (``_placed_jobs``)."""
    version = cache.get(WAITING_VERSION_KEY)
    skip = _short_allowed(LEADER_CACHE.size, monotonic) and LEADER_CACHE.waiting_unchanged(version)
    LEADER_CACHE.waiting_version = version
    return not skip


def _remember_topology_waits(plan: engine.Plan, loaded: Loaded) -> None:
    """Keep, for the next cycles, when each waiting job first waited for one topology
    block (``engine.PendingJob.topology_since``): its topology wait counts from then, but
    only while it waits for one block. A cycle that gives it another reason (quota, GPUs
    for it anywhere, its turn) pauses the count (``TOPOLOGY_PAUSED_KEY``): the time it
    waits for something else is no delay of the topology's, and would otherwise spend its
    topology wait, so that it would be spread at once when its turn came. The count
    resumes (its start moved later by the pause) when it waits for one block again. A job
    that started (or stopped waiting) drops both."""
    now = loaded.snapshot.now
    previous = cache.get(TOPOLOGY_WAITS_KEY) or {}
    previous_paused = cache.get(TOPOLOGY_PAUSED_KEY) or {}
    pending = loaded.pending
    waits = {job_id: since for job_id, since in previous.items() if job_id in pending}
    paused = {job_id: at for job_id, at in previous_paused.items() if job_id in waits}
    for job_id in (p.job_id for p in plan.placements):
        waits.pop(job_id, None)
        paused.pop(job_id, None)
    for job_id, info in plan.pending.items():
        if info.code == engine.reasons.WAITING_FOR_TOPOLOGY:
            at = paused.pop(job_id, None)
            if at is not None and job_id in waits:
                waits[job_id] += now - at
            waits.setdefault(job_id, now)
        elif job_id in waits:
            paused.setdefault(job_id, now)
    if waits or previous:
        cache.set(TOPOLOGY_WAITS_KEY, waits, timeout=24 * 3600)
    if paused or previous_paused:
        cache.set(TOPOLOGY_PAUSED_KEY, paused, timeout=24 * 3600)


def topology_since(waits: dict, paused: dict, job_id: int, now: float) -> float | None:
    """When a job's topology wait counts from in a cycle at ``now`` (see
    :func:`_remember_topology_waits`): moved later by a pause still going on."""
    since = waits.get(job_id)
    if since is None:
        return None
    at = paused.get(job_id)
    return since if at is None else since + (now - at)


def _previous_reservation(entry) -> tuple[tuple[int, ...], float | None, tuple[int, ...]]:
    """``PendingJob``'s reserved GPUs, reserved start and claimed GPUs from a remembered
    reservation (also one from before claims were remembered: two fields)."""
    if not entry:
        return (), None, ()
    gpu_ids, start, *rest = entry
    return tuple(gpu_ids), start, tuple(rest[0]) if rest else ()


def order_settings() -> dict:
    """The engine's ordering knobs, the minimum preemption gain and time-sharing's
    settings from the settings (see SLUICE_SIZE_ORDER, SLUICE_PREEMPTION_MIN_GAIN_SECONDS,
    SLUICE_CLASS_AGING_SECONDS and SLUICE_TIME_SHARING_* in portal/settings.py)."""
    return {
        "size_order": settings.SLUICE_SIZE_ORDER,
        "size_halving_seconds": float(settings.SLUICE_SIZE_HALVING_SECONDS),
        "max_wait_seconds": float(settings.SLUICE_MAX_WAIT_SECONDS),
        "fair_share_band": float(settings.SLUICE_FAIR_SHARE_BAND),
        "preemption_min_gain_seconds": float(settings.SLUICE_PREEMPTION_MIN_GAIN_SECONDS),
        "gang_borrower_reserve_seconds": float(settings.SLUICE_GANG_BORROWER_RESERVE_SECONDS),
        "class_aging_seconds": float(settings.SLUICE_CLASS_AGING_SECONDS),
        "time_sharing_levels": tuple(
            3600.0 * float(hours) for hours in settings.SLUICE_TIME_SHARING_LEVELS_GPU_HOURS
        ),
        "time_sharing_promotion_seconds": float(settings.SLUICE_TIME_SHARING_PROMOTION_SECONDS),
        "time_sharing_min_wait_seconds": float(settings.SLUICE_TIME_SHARING_MIN_WAIT_SECONDS),
    }


def load_snapshot(
    now: datetime,
    *,
    update_usage: bool = True,
    pending_cache: PendingCache | None = None,
    read_waiting: bool = True,
) -> Loaded:
    """Read everything the engine needs in a handful of queries. The dispatch loop passes
    its ``PendingCache`` (waiting jobs read whole only when new or changed, and not read at
    all with ``read_waiting=False``: see ``_waiting_to_read``); other callers read them
    afresh."""
    policies = {
        p.workload_type: p for p in WorkloadPolicy.objects.prefetch_related("allowed_pools")
    }
    nodes: dict[int, engine.NodeInfo] = {}
    node_names: dict[int, str] = {}
    node_rows = Node.objects.select_related("pool").values_list(
        "id", "name", "pool__name", "state", "labels", "pool__topology_label"
    )
    for node_id, name, pool, state, labels, topology_label in node_rows:
        node_names[node_id] = name
        if state == NodeState.READY:
            nodes[node_id] = engine.NodeInfo(
                id=node_id,
                name=name,
                pool=pool,
                gpus=[],
                block=topology_block(labels, topology_label),
            )
    gpus: dict[int, tuple[int, int, str]] = {}
    for gpu_id, node_id, index, uuid, model, mem, health, outside in Gpu.objects.values_list(
        "id", "node_id", "index", "uuid", "model", "memory_mb", "health", "held_outside"
    ):
        gpus[gpu_id] = (node_id, index, uuid)
        # A GPU held by work outside Sluice (a Slurm job of someone else) is capacity in use.
        if node_id in nodes and health == GpuHealth.HEALTHY and not outside:
            nodes[node_id].gpus.append(
                engine.GpuInfo(id=gpu_id, node_id=node_id, index=index, model=model, memory_mb=mem)
            )

    queues = [
        engine.QueueInfo(
            id=q.id,
            name=q.name,
            tenant=q.tenant.slug,
            strict_fifo=q.strict_fifo,
            open=q.state != QueueState.CLOSED,
        )
        for q in Queue.objects.select_related("tenant")
    ]
    quotas = [
        engine.QuotaInfo(
            tenant=q.tenant.slug,
            pool=q.pool.name,
            gpu_model=q.gpu_model,
            guaranteed=q.guaranteed_gpus,
            borrow_limit=q.borrow_limit_gpus,
            max_running_jobs=q.max_running_jobs,
        )
        for q in Quota.objects.select_related("tenant", "pool")
    ]

    running_jobs = _load_running()
    alloc_by_job: dict[int, list[tuple[int, bool, str]]] = defaultdict(list)
    for job_id, gpu_id, borrowed, model in Allocation.objects.filter(
        released_at__isnull=True
    ).values_list("job_id", "gpu_id", "borrowed", "gpu__model"):
        alloc_by_job[job_id].append((gpu_id, borrowed, model))
    preemptors = _preemptors_of_stopping(running_jobs.values())
    pending_cache = pending_cache or PendingCache()
    expected = _running_expected(running_jobs, pending_cache.running_expected)
    running, in_use = [], defaultdict(int)
    sharing = {
        job.id
        for job in running_jobs.values()
        if takes_part_in_time_sharing(
            job.queue_time_sharing,
            job.checkpoint_dir,
            job.class_preemptible,
            policies.get(job.workload_type),
        )
    }
    attained = attained_service(sharing) if sharing else {}
    for job in running_jobs.values():
        allocs = alloc_by_job.get(job.id, [])
        policy = policies.get(job.workload_type)
        in_use[job.tenant] += len(allocs)
        preemptible = job.class_preemptible and (policy.preemptible if policy else True)
        running.append(
            engine.RunningJob(
                id=job.id,
                tenant=job.tenant,
                pool=job.pool,
                workload_type=job.workload_type,
                priority=job.priority,
                priority_class=job.priority_class,
                preemptible=preemptible,
                gpu_ids=tuple(a[0] for a in allocs),
                gpu_model=allocs[0][2] if allocs else "",
                borrowed=any(a[1] for a in allocs),
                started_at=epoch(job.admitted_at),
                max_runtime_seconds=job.max_runtime_seconds,
                min_runtime_before_preemption=policy.min_runtime_before_preemption_seconds
                if policy
                else 0,
                stopping=job.state == JobState.STOPPING,
                grace_seconds=policy.stop_grace_seconds if policy else 30,
                preempted_by=preemptors.get(job.id),
                preemptions=job.preemption_count,
                # Nothing records when a job last saved a checkpoint (the agent sets
                # SLUICE_CHECKPOINT_DIR but reports no checkpoint): counted from its start.
                checkpointed_at=None,
                max_preemptions=policy.max_preemptions if policy else 0,
                preemption_protection_seconds=policy.preemption_protection_seconds if policy else 0,
                expected_runtime_seconds=expected.get(job.id, 0.0),
                time_sharing=job.id in sharing and preemptible,
                attained_gpu_seconds=attained.get(job.id, (0.0, 0.0))[0],
            )
        )

    pending_rows, pending = pending_cache.load(policies, read_waiting=read_waiting)
    previous = pending_cache.previous_positions(pending_rows)
    reservations = cache.get(RESERVATIONS_KEY) or {}
    topology_waits = cache.get(TOPOLOGY_WAITS_KEY) or {}
    topology_paused = (cache.get(TOPOLOGY_PAUSED_KEY) or {}) if topology_waits else {}
    epoch_now = now.timestamp()
    for job in pending:
        # Last cycle's pool position: a job that overtakes another one does not wait for
        # that one's held reservation (engine/reservations.py). The records are the
        # cache's own, kept between cycles: what changes every cycle is set every cycle.
        job.previous_position = previous.get(job.id, 0)
        (job.reserved_gpu_ids, job.reserved_start, job.claimed_gpu_ids) = _previous_reservation(
            reservations.get(job.id)
        )
        job.topology_since = topology_since(topology_waits, topology_paused, job.id, epoch_now)
    usage = _update_usage(now, in_use) if update_usage else {}
    snapshot = engine.Snapshot(
        now=now.timestamp(),
        nodes=list(nodes.values()),
        quotas=quotas,
        queues=queues,
        running=running,
        pending=pending,
        usage=usage,
        **order_settings(),
    )
    return Loaded(
        snapshot=snapshot,
        held_reservations=reservations,
        pending=pending_rows,
        pool_ids=set(ResourcePool.objects.values_list("id", flat=True)),
        running=running_jobs,
        gpus=gpus,
        node_names=node_names,
        policies=policies,
    )


def launch_messages(
    job: Job,
    gpus_by_node: dict[str, list[tuple[int, str]]],
    policy: WorkloadPolicy | None,
    run_as: str,
) -> list[tuple[str, dict]]:
    """One ``launch`` per node of the job, with that node's GPU indices and UUIDs, the
    Unix account it runs as, the limits its policy sets (cgroup on the node, scaled by the
    GPUs it holds there), its log cap, how long the node keeps its directory, how long it
    may run (:func:`launch_runtime_limit`), for a serving job the paths its agent scrapes
    (``serve``), and a container job's image."""
    messages = []
    for node_name, gpus in sorted(gpus_by_node.items()):
        gpus = sorted(gpus)
        message = launch_message(
            job_id=job.id,
            attempt=job.attempt,
            name=job.name,
            command=job.command,
            shell=job.shell,
            env=job.env,
            working_dir=job.working_dir,
            gpu_indices=[g[0] for g in gpus],
            gpu_uuids=[g[1] for g in gpus],
            checkpoint_dir=job.checkpoint_dir,
            array_index=job.array_index,
            grace_seconds=policy.stop_grace_seconds if policy else 30,
            retention_days=policy.retention_days if policy else None,
            runtime_limit_seconds=launch_runtime_limit(job, policy),
            tenant=job.tenant.slug,
            run_as=run_as,
            limits=node_limits(policy, max(1, len(gpus))),
            log_cap_bytes=policy.log_cap_mb * MIB if policy else None,
            serve=job.serve or None,
            image=job.image,
            image_pull_policy=job.image_pull_policy,
            image_pull_secret=job.image_pull_secret,
        )
        messages.append((node_name, message))
    return messages


def node_limits(policy: WorkloadPolicy | None, gpus: int) -> dict[str, float | int | None]:
    """The cgroup limits of a job on one node: its policy's per-GPU values times the GPUs
    it holds there (None: no limit)."""
    if policy is None:
        return {"cpus": None, "memory_mb": None, "pids": None}
    cpus = policy.cpu_limit_per_gpu
    memory = policy.memory_limit_mb_per_gpu
    return {
        "cpus": round(cpus * gpus, 2) if cpus else None,
        "memory_mb": memory * gpus if memory else None,
        "pids": policy.pids_limit,
    }


def job_accounts(jobs: list[Job]) -> dict[int, str]:
    """The Unix account each job runs as (one query for the submitters' names when the
    site maps accounts per user)."""
    usernames: dict[int, str] = {}
    if "{user}" in settings.SLUICE_JOB_ACCOUNT:
        from identity.selectors import unix_user_names

        usernames = unix_user_names({j.submitted_by_id for j in jobs})
    return {
        j.id: job_unix_account(tenant=j.tenant, username=usernames.get(j.submitted_by_id, ""))
        for j in jobs
    }


def _launch_messages(
    job: Job, allocations: list[Allocation], loaded: Loaded, run_as: str
) -> list[tuple[str, dict]]:
    gpus_by_node: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for alloc in allocations:
        node_id, index, uuid = loaded.gpus[alloc.gpu_id]
        gpus_by_node[loaded.node_names[node_id]].append((index, uuid))
    return launch_messages(job, gpus_by_node, loaded.policies.get(job.workload_type), run_as)


def _ready_placements(plan: engine.Plan, loaded: Loaded) -> list[engine.Placement]:
    """The placements whose nodes are still ready, their node rows locked until commit.

    The snapshot's queries are not one consistent read: a node marked down (its jobs
    requeued) between reading the nodes and reading the jobs would get a requeued job
    placed back on it. Locking the nodes first, before any other write of the cycle, also
    makes a concurrent ``node_mark_down`` wait and then release what this cycle placed."""
    if not plan.placements:
        return []
    node_ids = {loaded.gpus[gpu_id][0] for p in plan.placements for gpu_id in p.gpu_ids}
    ready = set(
        Node.objects.select_for_update()
        .filter(pk__in=node_ids, state=NodeState.READY)
        .values_list("pk", flat=True)
    )
    kept = [
        p for p in plan.placements if all(loaded.gpus[gpu_id][0] in ready for gpu_id in p.gpu_ids)
    ]
    if len(kept) < len(plan.placements):
        log.warning(
            "dispatch: %d placement(s) dropped, node(s) no longer ready",
            len(plan.placements) - len(kept),
        )
        dispatch_on_commit()
    return kept


def _placed_jobs(placements: list[engine.Placement]) -> list[Job]:
    """The model objects of the jobs placed this cycle (only these are read whole), those
    still waiting: a job cancelled since the snapshot is left out (and the cycle after
    this one uses its GPUs)."""
    found = Job.objects.select_related(
        "tenant", "project", "queue", "queue__pool", "priority_class"
    ).in_bulk([p.job_id for p in placements])
    jobs = [found[p.job_id] for p in placements if p.job_id in found]
    kept = [j for j in jobs if j.state == JobState.PENDING]
    if len(kept) < len(placements):
        log.warning(
            "dispatch: %d placement(s) dropped, job(s) no longer pending",
            len(placements) - len(kept),
        )
        dispatch_on_commit()
    return kept


def _apply_placements(plan: engine.Plan, loaded: Loaded, now: datetime) -> list[tuple[str, dict]]:
    ready = _ready_placements(plan, loaded)
    jobs = _placed_jobs(ready)
    if not jobs:
        return []
    placed = {j.id for j in jobs}
    placements = [p for p in ready if p.job_id in placed]
    allocations: dict[int, list[Allocation]] = {}
    rows = []
    for placement in placements:
        allocs = [
            Allocation(
                job_id=placement.job_id,
                gpu_id=gpu_id,
                node_id=loaded.gpus[gpu_id][0],
                borrowed=placement.borrowed,
                granted_at=now,
            )
            for gpu_id in placement.gpu_ids
        ]
        allocations[placement.job_id] = allocs
        rows.extend(allocs)
    # The partial unique index refuses a GPU that is already held: double allocation cannot commit.
    Allocation.objects.bulk_create(rows, batch_size=1000)
    kinds = {p.job_id: ("borrowed" if p.borrowed else "guaranteed") for p in placements}
    jobs_transition_bulk(
        jobs,
        JobState.ADMITTED,
        now=now,
        by_dispatch_leader=True,
        kind="admitted",
        message_for=lambda j: f"Admitted as {kinds[j.id]} on {len(allocations[j.id])} GPU(s).",
        admitted_at=now,
        pending_reason_code="",
        pending_reason_message="",
        pending_rank=None,
    )
    signals.jobs_admitted.send_robust(sender=Job, jobs=jobs, now=now)
    messages = []
    accounts = job_accounts(jobs)
    for job in jobs:
        messages.extend(_launch_messages(job, allocations[job.id], loaded, accounts[job.id]))
    return messages


def _apply_preemptions(plan: engine.Plan, loaded: Loaded) -> None:
    if not plan.preemptions:
        return
    victims = Job.objects.select_related("tenant").in_bulk([p.victim_id for p in plan.preemptions])
    for preemption in plan.preemptions:
        victim = victims.get(preemption.victim_id)
        preemptor = loaded.pending.get(preemption.preemptor_id)
        if victim is None or victim.state not in (JobState.ADMITTED, JobState.RUNNING):
            continue
        message = (
            getattr(preemption, "message", "") or f"Preempted by job {preemption.preemptor_id}."
        )
        job_stop(
            job=victim,
            reason=StopReason.PREEMPTED,
            message=message,
            data={"preemptor": preemption.preemptor_id, "kind": preemption.reason},
        )
        audit_record(
            action="job.preempt",
            target=victim,
            tenant=victim.tenant,
            reason=message,
            before={"state": "RUNNING"},
            after={
                "state": "STOPPING",
                "preemptor": preemption.preemptor_id,
                "kind": preemption.reason,
                "preemptor_tenant": preemptor.tenant if preemptor else None,
            },
        )


def _apply_pending(
    plan: engine.Plan,
    loaded: Loaded,
    now: datetime,
    pending_cache: PendingCache | None = None,
    *,
    explain: bool = True,
) -> int:
    """Write what changed of the waiting jobs' standing: the reasons that changed, and
    in a full cycle (``explain``, see ``_explain_now``) the sort keys whose relative order
    changed (scheduling.services.pending_ranks) and each pool's estimates in one row
    (scheduling.positions); returns the number of job rows written. A cycle in which
    nothing changed writes nothing."""
    order = [job_id for job_id in plan.pending if job_id in loaded.pending]
    ranks = (
        ranks_after(order, {job_id: loaded.pending[job_id].rank for job_id in order})
        if explain
        else {}
    )
    retold = []
    for job_id in order:
        info = plan.pending[job_id]
        new = (info.code, info.message[:2000])
        if new != loaded.pending[job_id].reason:
            retold.append((job_id, *new))
    rows_update(Job, ["pending_rank"], list(ranks.items()))
    rows_update(Job, ["pending_reason_code", "pending_reason_message"], retold)
    if pending_cache is not None:
        for job_id, code, message in retold:
            pending_cache.retold(job_id, code, message)
    if explain:
        _write_estimates(plan, loaded, now)
    return len(ranks.keys() | {row[0] for row in retold})


def _write_estimates(plan: engine.Plan, loaded: Loaded, now: datetime) -> None:
    """One row per pool: ``{job id: estimated start}`` of its waiting jobs, to the second,
    and ``{job id: guaranteed start}`` of those holding a bounded reservation."""
    by_pool: dict[int, dict[str, int | None]] = {pool_id: {} for pool_id in loaded.pool_ids}
    bounds: dict[int, dict[str, int]] = {pool_id: {} for pool_id in loaded.pool_ids}
    for job_id, info in plan.pending.items():
        row = loaded.pending.get(job_id)
        if row is None:
            continue
        start = info.estimated_start
        by_pool[row.pool_id][str(job_id)] = round(start) if start is not None else None
        if info.guaranteed_start is not None:
            # Rounded up: the job starts by then (the estimate is rounded to the nearest).
            bounds[row.pool_id][str(job_id)] = math.ceil(info.guaranteed_start)
    changed = [
        PoolEstimates(pool_id=pool_id, computed_at=now, starts=starts, guaranteed=bounds[pool_id])
        for pool_id, starts in by_pool.items()
        if LEADER_CACHE.estimates.get(pool_id) != (starts, bounds[pool_id])
    ]
    if changed:
        PoolEstimates.objects.bulk_create(
            changed,
            update_conflicts=True,
            unique_fields=["pool"],
            update_fields=["computed_at", "starts", "guaranteed"],
        )
        # Known as written once the cycle commits (a rollback leaves the rows as they were).
        transaction.on_commit(
            lambda: LEADER_CACHE.estimates.update(
                {e.pool_id: (e.starts, e.guaranteed) for e in changed}
            )
        )


#: When this process's last cycle ended (time.monotonic()); see dispatch_pace.
_last_cycle_end: float | None = None


def dispatch_pace(sleep=time.sleep) -> float:
    """Wait until ``SLUICE_DISPATCH_MIN_GAP_MS`` after this process's previous cycle
    ended; returns the seconds waited. The dispatch task waits *before* clearing its
    coalescing flag, so requests made meanwhile join the coming cycle instead of queueing
    another; an idle dispatcher (no cycle that recent) starts at once."""
    gap = settings.SLUICE_DISPATCH_MIN_GAP_MS / 1000
    if _last_cycle_end is None or gap <= 0:
        return 0.0
    wait = _last_cycle_end + gap - time.monotonic()
    if wait <= 0:
        return 0.0
    sleep(wait)
    return wait


def _apply_promotions(loaded: Loaded, now: datetime) -> int:
    """Jobs that borrowed GPUs when they started and now fit their tenant's guarantee
    count against it from now on (``engine.promotions``): their allocations are no longer
    borrowed (so no longer reclaimable), each job's timeline says so, and this cycle's
    snapshot hands them as not borrowed. Returns how many."""
    snapshot = loaded.snapshot
    promoted = engine.promotions(snapshot.running, snapshot.quotas)
    if not promoted:
        return 0
    ids = set(promoted)
    Allocation.objects.filter(job_id__in=ids, released_at__isnull=True).update(borrowed=False)
    running: list[engine.RunningJob] = []
    events: list[JobEvent] = []
    for job in snapshot.running:
        if job.id in ids:
            job = replace(job, borrowed=False)
            gpus = len(job.gpu_ids)
            events.append(
                JobEvent(
                    job_id=job.id,
                    created_at=now,
                    kind="guaranteed",
                    message=(
                        f"Its {gpus} borrowed GPU{'s' if gpus != 1 else ''} now count against "
                        f"{job.tenant}'s guarantee in pool {job.pool}: no longer reclaimable."
                    ),
                    data={"gpus": gpus, "pool": job.pool, "gpu_model": job.gpu_model},
                )
            )
        running.append(job)
    snapshot.running = running
    JobEvent.objects.bulk_create(events)
    return len(promoted)


def dispatch_cycle(now: datetime | None = None) -> dict:
    """One cycle. Returns figures for logs and benchmarks; ``skipped`` if another leader runs."""
    started = time.perf_counter()
    started_monotonic = time.monotonic()
    clock = now is None
    now = now or timezone.now()
    messages: list[tuple[str, dict]] = []
    try:
        with transaction.atomic(), _leader_lock() as leader:
            if not leader:
                return {"skipped": True}
            read_waiting = _waiting_to_read(started_monotonic)
            loaded = load_snapshot(now, pending_cache=LEADER_CACHE, read_waiting=read_waiting)
            promoted = _apply_promotions(loaded, now)
            explain = _explain_now(loaded, started_monotonic)
            loaded.snapshot.decisions_only = not explain
            t_loaded = time.perf_counter()
            # A GPU read as free was released before the snapshot, possibly after the cycle
            # began: its grant is stamped after the snapshot, so it never precedes that release.
            granted = max(now, timezone.now()) if clock else now
            plan = engine.plan(loaded.snapshot)
            t_planned = time.perf_counter()
            messages = _apply_placements(plan, loaded, granted)
            _apply_preemptions(plan, loaded)
            updated = _apply_pending(plan, loaded, now, LEADER_CACHE, explain=explain)
            if explain:
                transaction.on_commit(
                    lambda: LEADER_CACHE.explained(
                        started_monotonic, time.monotonic() - started_monotonic
                    )
                )
            transaction.on_commit(lambda: send_node_messages(messages))
            transaction.on_commit(lambda: _remember_reservations(plan, loaded))
            transaction.on_commit(lambda: _remember_topology_waits(plan, loaded))
            transaction.on_commit(lambda: _remember_positions(plan, loaded))
            placed_ids = [p.job_id for p in plan.placements]
            transaction.on_commit(lambda: LEADER_CACHE.forget(placed_ids))
    except Exception:
        # The leader's copy follows this cycle's writes, which were rolled back.
        LEADER_CACHE.clear()
        raise
    finished = time.perf_counter()
    global _last_cycle_end
    _last_cycle_end = time.monotonic()
    signals.dispatch_cycle_finished.send_robust(sender=None, seconds=finished - started)
    stats = {
        "skipped": False,
        "pending": len(loaded.pending),
        "running": len(loaded.running),
        "placed": len(plan.placements),
        "explained": explain,
        "read_waiting": read_waiting,
        "reached": len(plan.pending),
        "preempted": len(plan.preemptions),
        "promoted": promoted,
        "pending_updated": updated,
        "pending_read_whole": LEADER_CACHE.whole_reads,
        "load_ms": round((t_loaded - started) * 1000, 1),
        "plan_ms": round((t_planned - t_loaded) * 1000, 1),
        "apply_ms": round((finished - t_planned) * 1000, 1),
        "total_ms": round((finished - started) * 1000, 1),
    }
    if plan.placements or plan.preemptions:
        log.info("dispatch: %s", stats)
    return stats
