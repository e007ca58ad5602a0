"""What ``/metrics`` and ``/api/v1/metrics/summary`` read: the cluster's state, from the
database at the moment it is asked, in a constant number of grouped queries.

``/metrics`` is two parts (docs/insights-metrics.md lists every name):

- the **state** read here, at scrape time: waiting jobs by queue and reason, placed jobs,
  GPUs allocated / used / idle by pool, tenant and GPU model, each GPU's last sample, nodes
  and their heartbeats, quotas, and the totals the database keeps exactly (job outcomes,
  preemptions, reclaims and the GPU-hours they recovered: these survive any restart);
- the **events** observed where they happen (admission waits, dispatch cycles;
  insights.instrument), merged from prometheus-client's multiprocess files.

The state is rendered to the text format here rather than through prometheus-client's
generic writer: a cluster of 8,000 GPUs is ~35,000 samples, which that writer takes
~200 ms to format; building each GPU's labels once and joining strings takes ~15 ms.
:class:`DatabaseCollector` offers the same families to a prometheus-client registry.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.db.models import (
    BooleanField,
    Case,
    CharField,
    Count,
    ExpressionWrapper,
    F,
    Min,
    Q,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from scheduling.choices import (
    DEFAULT_IDLE_THRESHOLD,
    FINAL_STATES,
    STOP_REASON_END_STATE,
    WAITING_STATES,
    GpuHealth,
    JobState,
    NodeState,
    StopReason,
)
from scheduling.models import (
    Allocation,
    Gpu,
    Job,
    Node,
    Queue,
    Quota,
    ReclaimRecord,
    WorkloadPolicy,
)

MIB = 1024 * 1024
#: A pending job no dispatch cycle has looked at yet has no reason code: this one.
NEW_REASON = "NEW"
#: End states counted as outcomes: the final ones, and preempted or lost jobs that were
#: not requeued (a requeued job waits again; its preemption is counted anyway).
OUTCOME_STATES = (*FINAL_STATES, JobState.PREEMPTED, JobState.LOST)


# --- reading ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueLabel:
    pool: str
    tenant: str
    name: str  # "<tenant>/<queue>": queue names are unique per tenant only

    @property
    def short(self) -> str:
        return self.name.partition("/")[2]


def queue_labels() -> dict[int, QueueLabel]:
    rows = Queue.objects.values_list("id", "name", "tenant__slug", "pool__name").order_by()
    return {qid: QueueLabel(pool, tenant, f"{tenant}/{name}") for qid, name, tenant, pool in rows}


@dataclass(slots=True)
class GpuRow:
    id: int
    node: str
    pool: str
    node_state: str
    index: int
    uuid: str
    model: str
    memory_mb: int
    healthy: bool
    utilization: float | None  # percent, None when the last sample is stale or missing
    memory_used_mb: int | None
    # filled from the active allocations
    job_id: int | None = None
    queue_id: int | None = None
    job_state: str = ""
    workload_type: str = ""
    borrowed: bool = False

    @property
    def allocated(self) -> bool:
        return self.job_id is not None

    @property
    def schedulable(self) -> bool:
        return self.node_state == NodeState.READY and self.healthy


@dataclass
class PoolModelGpus:
    """One pool's GPUs of one model: where they stand, and the use of those allocated."""

    allocated: int = 0
    free: int = 0  # schedulable, not allocated
    unavailable: int = 0  # not allocated, node not ready or GPU unhealthy
    used: float = 0.0  # sum of the allocated GPUs' utilization, 0-1 each
    idle: int = 0  # allocated, sampled below their job's policy idle threshold

    @property
    def total(self) -> int:
        return self.allocated + self.free + self.unavailable


@dataclass
class TenantGpus:
    """A tenant's allocated GPUs in one pool and model."""

    allocated: int = 0
    borrowed: int = 0
    used: float = 0.0
    idle: int = 0


@dataclass
class GpuState:
    gpus: list[GpuRow]
    pools: dict[tuple[str, str], PoolModelGpus]  # (pool, model)
    tenants: dict[tuple[str, str, str], TenantGpus]  # (pool, tenant, model)
    running: dict[tuple[int, str, str], int]  # (queue id, model, job state) -> placed jobs


def _raw_rows(queryset) -> list[tuple]:
    """The rows of a ``values_list`` query as the database driver returns them: without
    Django's per-row conversions (~4 µs a row; 14,000 rows here). Only for columns the
    driver returns as wanted: numbers, strings, booleans (SQLite's 0/1 are as good)."""
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def sample_cutoff(now: datetime) -> datetime:
    """Samples older than this are not shown as current (their node would be marked lost
    by then; a lost node's last utilization is not the GPU's)."""
    return now - timedelta(seconds=max(settings.SLUICE_NODE_LOST_SECONDS, 30))


def gpu_state(now: datetime, queues: dict[int, QueueLabel]) -> GpuState:
    """Every GPU with its last fresh sample and the job holding it: three queries (GPUs,
    active allocations, idle thresholds), whatever the cluster's size."""
    fresh = ExpressionWrapper(Q(sampled_at__gte=sample_cutoff(now)), output_field=BooleanField())
    rows = _raw_rows(
        Gpu.objects.values_list(
            "id",
            "node__name",
            "node__pool__name",
            "node__state",
            "index",
            "uuid",
            "model",
            "memory_mb",
            "health",
            "utilization",
            "memory_used_mb",
            fresh,
        ).order_by()
    )
    gpus: dict[int, GpuRow] = {}
    for gid, node, pool, state, index, uuid, model, mem, health, util, used, ok in rows:
        gpus[gid] = GpuRow(
            gid,
            node,
            pool,
            state,
            index,
            uuid,
            model,
            mem,
            health == GpuHealth.HEALTHY,
            util if ok else None,
            used if ok else None,
        )
    allocations = _raw_rows(
        Allocation.objects.filter(released_at__isnull=True)
        .values_list(
            "gpu_id", "job_id", "job__queue_id", "job__state", "job__workload_type", "borrowed"
        )
        .order_by()
    )
    for gid, job_id, queue_id, job_state, workload_type, borrowed in allocations:
        row = gpus.get(gid)
        if row is not None:
            row.job_id, row.queue_id, row.job_state = job_id, queue_id, job_state
            row.workload_type, row.borrowed = workload_type, bool(borrowed)
    thresholds = dict(
        WorkloadPolicy.objects.values_list("workload_type", "idle_utilization_threshold")
    )
    pools: dict[tuple[str, str], PoolModelGpus] = defaultdict(PoolModelGpus)
    tenants: dict[tuple[str, str, str], TenantGpus] = defaultdict(TenantGpus)
    jobs: dict[int, tuple[int, str, str]] = {}
    for row in gpus.values():
        pool = pools[row.pool, row.model]
        if not row.allocated:
            if row.schedulable:
                pool.free += 1
            else:
                pool.unavailable += 1
            continue
        label = queues.get(row.queue_id) if row.queue_id is not None else None
        tenant = tenants[row.pool, label.tenant if label else "", row.model]
        pool.allocated += 1
        tenant.allocated += 1
        tenant.borrowed += row.borrowed
        if row.utilization is not None:
            share = min(max(row.utilization, 0.0), 100.0) / 100.0
            pool.used += share
            tenant.used += share
            if row.utilization < thresholds.get(row.workload_type, DEFAULT_IDLE_THRESHOLD):
                pool.idle += 1
                tenant.idle += 1
        jobs[row.job_id] = (row.queue_id, row.model, row.job_state)  # type: ignore[index]
    running: dict[tuple[int, str, str], int] = defaultdict(int)
    for key in jobs.values():
        running[key] += 1
    return GpuState(list(gpus.values()), dict(pools), dict(tenants), dict(running))


@dataclass
class QueueWaiting:
    """A queue's waiting jobs now."""

    pending: int = 0
    held: int = 0
    pending_gpus: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # PENDING jobs by reason code
    oldest_since: datetime | None = None  # when its longest-waiting PENDING job began to wait

    def longest_wait_seconds(self, now: datetime) -> float:
        if self.oldest_since is None:
            return 0.0
        return max((now - self.oldest_since).total_seconds(), 0.0)


def waiting_by_queue(queue_ids=None) -> dict[int, QueueWaiting]:
    """Waiting jobs per queue (one grouped query on the state-and-queue index)."""
    jobs = Job.objects.filter(state__in=WAITING_STATES)
    if queue_ids is not None:
        jobs = jobs.filter(queue_id__in=queue_ids)
    rows = (
        jobs.values_list("queue_id", "state", "pending_reason_code")
        .annotate(
            n=Count("id"),
            gpus=Sum(F("gpus_per_node") * F("nodes")),
            since=Min(Coalesce("queued_at", "submitted_at")),
        )
        .order_by()
    )
    found: dict[int, QueueWaiting] = defaultdict(QueueWaiting)
    for queue_id, state, reason, n, gpus, since in rows:
        waiting = found[queue_id]
        if state == JobState.HELD:
            waiting.held += n
            continue
        waiting.pending += n
        waiting.pending_gpus += gpus or 0
        code = reason or NEW_REASON
        waiting.reasons[code] = waiting.reasons.get(code, 0) + n
        if since is not None and (waiting.oldest_since is None or since < waiting.oldest_since):
            waiting.oldest_since = since
    return dict(found)


#: Why a job ended, for ``sluice_jobs_finished_total``: the stop asked for, else what its
#: end state says (a job can reach PREEMPTED, RECLAIMED, TIMED_OUT or LOST only by a stop of
#: that kind, even when no ``stop_reason`` was recorded), else how its process exited; a job
#: cancelled after it started was stopped by the cancel. ``not_started`` is left for jobs
#: that ended without ever running (cancelled while pending, a launch that failed).
_OUTCOME_REASON = Case(
    When(~Q(stop_reason=""), then=F("stop_reason")),
    When(state=JobState.SUCCEEDED, then=Value("completed")),
    *(
        When(state=state, then=Value(reason))
        for reason, state in STOP_REASON_END_STATE.items()
        if state != JobState.CANCELLED
    ),
    When(exit_signal__isnull=False, then=Value("signal")),
    When(exit_code__isnull=False, then=Value("exit_code")),
    When(state=JobState.CANCELLED, started_at__isnull=False, then=Value(StopReason.CANCELLED)),
    default=Value("not_started"),
    output_field=CharField(),
)


@dataclass
class JobTotals:
    outcomes: dict[tuple[int, str, str, str], int]  # (queue id, workload type, state, reason)
    preemptions: dict[tuple[int, str], int]  # (queue id, workload type)


def job_totals() -> JobTotals:
    """Outcomes of the jobs that ended, and the preemptions of every job: one pass over the
    jobs table, grouped (the database's totals are exact and survive restarts)."""
    rows = (
        Job.objects.annotate(reason=_OUTCOME_REASON)
        .values_list("queue_id", "workload_type", "state", "reason")
        .annotate(n=Count("id"), preempted=Sum("preemption_count"))
        .order_by()
    )
    outcomes: dict[tuple[int, str, str, str], int] = defaultdict(int)
    preemptions: dict[tuple[int, str], int] = defaultdict(int)
    for queue_id, workload_type, state, reason, n, preempted in rows:
        if state in OUTCOME_STATES:
            outcomes[queue_id, workload_type, state, reason] += n
        if preempted:
            preemptions[queue_id, workload_type] += preempted
    return JobTotals(dict(outcomes), dict(preemptions))


def reclaim_totals() -> list[tuple[str, str, str, int, float]]:
    """(tenant, workload type, kind, count, GPU-hours freed) from the reclaim records."""
    rows = (
        ReclaimRecord.objects.values_list("tenant__slug", "workload_type", "kind")
        .annotate(n=Count("id"), hours=Sum("gpu_hours_freed"))
        .order_by()
    )
    return [(tenant or "", wt or "", kind, n, hours or 0.0) for tenant, wt, kind, n, hours in rows]


#: The totals (outcomes, preemptions, reclaims) as the last refresh computed them.
TOTALS_CACHE_KEY = "sluice:metrics:totals"
TOTALS_LOCK_KEY = "sluice:metrics:totals:refreshing"


def totals_compute() -> dict:
    """The database's exact totals, labelled: ``outcomes`` {(pool, tenant, workload type,
    outcome, reason): jobs}, ``preemptions`` {(pool, tenant, workload type): n},
    ``reclaims`` [(tenant, workload type, kind, n, GPU-hours)]. One pass over the jobs and
    one over the reclaim records: ~0.1-0.3 s at 100,000 jobs, which is why a beat task
    does it (insights.metrics_totals) and a scrape reads the result."""
    queues = queue_labels()
    totals = job_totals()
    outcomes: dict[tuple, int] = defaultdict(int)
    for (queue_id, workload_type, job_state, reason), n in totals.outcomes.items():
        q = queues.get(queue_id) or QueueLabel("", "", str(queue_id))
        outcomes[q.pool, q.tenant, workload_type, job_state.lower(), reason] += n
    preemptions: dict[tuple, int] = defaultdict(int)
    for (queue_id, workload_type), n in totals.preemptions.items():
        q = queues.get(queue_id) or QueueLabel("", "", str(queue_id))
        preemptions[q.pool, q.tenant, workload_type] += n
    return {
        "computed_at": time.time(),
        "outcomes": dict(outcomes),
        "preemptions": dict(preemptions),
        "reclaims": reclaim_totals(),
    }


def totals_refresh() -> dict | None:
    """Compute the totals and store them for the scrapes (the beat task, every
    SLUICE_METRICS_TOTALS_INTERVAL seconds). One refresh at a time, so that a slower one
    never overwrites a newer one (the counters would seem to go back); None when another
    one runs."""
    from django.core.cache import cache

    if not cache.add(TOTALS_LOCK_KEY, 1, timeout=300):
        return None
    try:
        totals = totals_compute()
        cache.set(TOTALS_CACHE_KEY, totals, timeout=None)
        return totals
    finally:
        cache.delete(TOTALS_LOCK_KEY)


def totals_get() -> dict:
    """The stored totals; computed here only when none are stored yet (a cold cache)."""
    from django.core.cache import cache

    totals = cache.get(TOTALS_CACHE_KEY)
    if totals is None:
        totals = totals_refresh() or totals_compute()
    return totals


# --- the text format ----------------------------------------------------------------------


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def _number(value: float | int) -> str:
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is float and math.isfinite(value):
        return repr(value)
    if kind is bool:
        return "1" if value else "0"
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def labels_text(names: tuple[str, ...], values) -> str:
    return ",".join(
        [
            f'{n}="{_escape(v) if isinstance(v, str) else v}"'
            for n, v in zip(names, values, strict=True)
        ]
    )


@dataclass
class Family:
    """One metric family: its samples as (rendered labels, value)."""

    name: str  # the sample name (a counter's ends in _total)
    kind: str  # gauge | counter
    help: str
    labelnames: tuple[str, ...]
    samples: list[tuple[str, float | int]] = field(default_factory=list)
    raw_labels: list[tuple] = field(default_factory=list)  # kept for DatabaseCollector

    def add(self, values: tuple, value: float | int) -> None:
        self.raw_labels.append(values)
        self.samples.append((labels_text(self.labelnames, values), value))

    def add_rendered(self, labels: str, values: tuple, value: float | int) -> None:
        """A sample whose labels were rendered once for several families (the GPUs')."""
        self.raw_labels.append(values)
        self.samples.append((labels, value))

    @property
    def family_name(self) -> str:
        return self.name[: -len("_total")] if self.kind == "counter" else self.name

    def render(self) -> str:
        # The text format 0.0.4 names a counter's HELP and TYPE by its sample name, with
        # ``_total`` (as prometheus-client writes it): a family named without it leaves the
        # samples a metric of their own, untyped and without help (promtool: "no help text").
        help_text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        head = f"# HELP {self.name} {help_text}\n# TYPE {self.name} {self.kind}\n"
        name = self.name
        return head + "".join(
            [f"{name}{{{labels}}} {_number(value)}\n" for labels, value in self.samples]
        )


# (name, kind, help, labels): every family the database part exposes, in order.
FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "sluice_pending_jobs",
        "gauge",
        "Jobs waiting in a queue, by the reason they wait (HELD: held by a user or an admin; "
        "NEW: not yet seen by a dispatch cycle).",
        ("pool", "tenant", "queue", "reason"),
    ),
    (
        "sluice_pending_gpus",
        "gauge",
        "GPUs asked for by the pending jobs of a queue.",
        ("pool", "tenant", "queue"),
    ),
    (
        "sluice_queue_oldest_wait_seconds",
        "gauge",
        "How long the longest-waiting pending job of a queue has waited (0: none waits).",
        ("pool", "tenant", "queue"),
    ),
    (
        "sluice_running_jobs",
        "gauge",
        "Jobs holding GPUs (ADMITTED, RUNNING or STOPPING) by queue and GPU model.",
        ("pool", "tenant", "queue", "gpu_model", "state"),
    ),
    (
        "sluice_pool_gpus",
        "gauge",
        "GPUs of a pool by status: allocated, free (schedulable), unavailable (node not "
        "ready or GPU unhealthy).",
        ("pool", "gpu_model", "status"),
    ),
    (
        "sluice_allocated_gpus",
        "gauge",
        "GPUs allocated to a tenant's jobs.",
        ("pool", "tenant", "gpu_model"),
    ),
    (
        "sluice_borrowed_gpus",
        "gauge",
        "Allocated GPUs held beyond the tenant's guarantee (borrowed, reclaimable).",
        ("pool", "tenant", "gpu_model"),
    ),
    (
        "sluice_used_gpus",
        "gauge",
        "Sum of the utilization (0-1 each) of a tenant's allocated GPUs, from the agents' "
        "last samples: allocated minus used is what is held but not used.",
        ("pool", "tenant", "gpu_model"),
    ),
    (
        "sluice_idle_gpus",
        "gauge",
        "Allocated GPUs whose last sample is below their job's idle threshold.",
        ("pool", "tenant", "gpu_model"),
    ),
    (
        "sluice_quota_guaranteed_gpus",
        "gauge",
        "A tenant's guaranteed GPUs in a pool (gpu_model any: every model).",
        ("pool", "tenant", "gpu_model"),
    ),
    (
        "sluice_quota_borrow_limit_gpus",
        "gauge",
        "GPUs a tenant may borrow beyond its guarantee in a pool.",
        ("pool", "tenant", "gpu_model"),
    ),
    (
        "sluice_gpu_utilization_percent",
        "gauge",
        "A GPU's utilization in its agent's last sample (absent when the sample is stale).",
        ("node", "gpu", "uuid", "model", "pool"),
    ),
    (
        "sluice_gpu_memory_used_bytes",
        "gauge",
        "A GPU's memory in use in its agent's last sample (absent when stale).",
        ("node", "gpu", "uuid", "model", "pool"),
    ),
    (
        "sluice_gpu_memory_total_bytes",
        "gauge",
        "A GPU's memory.",
        ("node", "gpu", "uuid", "model", "pool"),
    ),
    (
        "sluice_gpu_allocated",
        "gauge",
        "1 when a job holds the GPU, else 0.",
        ("node", "gpu", "uuid", "model", "pool"),
    ),
    (
        "sluice_nodes",
        "gauge",
        "Nodes by state.",
        ("pool", "state"),
    ),
    (
        "sluice_node_heartbeat_age_seconds",
        "gauge",
        "Seconds since a node's agent last reported (nodes that never did are absent).",
        ("node", "pool"),
    ),
    (
        "sluice_jobs_finished_total",
        "counter",
        "Jobs that ended, by outcome (their end state) and reason (the stop that ended them: "
        "cancelled, preempted, timed_out, reclaimed, lost; or how they exited: completed, "
        "exit_code, signal; not_started: ended without running), from the database.",
        ("pool", "tenant", "workload_type", "outcome", "reason"),
    ),
    (
        "sluice_job_preemptions_total",
        "counter",
        "Preemptions of jobs (a requeued job counts each), from the database.",
        ("pool", "tenant", "workload_type"),
    ),
    (
        "sluice_reclaims_total",
        "counter",
        "GPUs taken back from wasting work (timeouts, idle reclaims, requeues, zombie kills), "
        "from the reclaim records.",
        ("tenant", "workload_type", "kind"),
    ),
    (
        "sluice_reclaimed_gpu_hours_total",
        "counter",
        "GPU-hours recovered by reclaims (see ReclaimRecord.gpu_hours_freed).",
        ("tenant", "workload_type", "kind"),
    ),
    (
        "sluice_metrics_totals_age_seconds",
        "gauge",
        "How old the database totals above are (refreshed every "
        "SLUICE_METRICS_TOTALS_INTERVAL seconds by a beat task).",
        (),
    ),
    (
        "sluice_metrics_read_seconds",
        "gauge",
        "How long this scrape took to read the database part of /metrics.",
        (),
    ),
)
FAMILY_NAMES = tuple(f[0] for f in FAMILIES)


def database_families(now: datetime | None = None) -> dict[str, Family]:
    """The state part of ``/metrics``: seven queries and a cache read, whatever the size
    of the cluster; the totals over the whole history come precomputed (totals_get)."""
    started = time.perf_counter()
    now = now or timezone.now()
    fam = {name: Family(name, kind, text, labels) for name, kind, text, labels in FAMILIES}
    queues = queue_labels()

    def queue_of(queue_id: int) -> QueueLabel:
        return queues.get(queue_id) or QueueLabel("", "", str(queue_id))

    for queue_id, waiting in sorted(waiting_by_queue().items()):
        q = queue_of(queue_id)
        for reason, n in sorted(waiting.reasons.items()):
            fam["sluice_pending_jobs"].add((q.pool, q.tenant, q.name, reason), n)
        if waiting.held:
            fam["sluice_pending_jobs"].add((q.pool, q.tenant, q.name, "HELD"), waiting.held)
        fam["sluice_pending_gpus"].add((q.pool, q.tenant, q.name), waiting.pending_gpus)
        fam["sluice_queue_oldest_wait_seconds"].add(
            (q.pool, q.tenant, q.name), round(waiting.longest_wait_seconds(now), 3)
        )

    state = gpu_state(now, queues)
    for (queue_id, model, job_state), n in sorted(state.running.items()):
        q = queue_of(queue_id)
        fam["sluice_running_jobs"].add((q.pool, q.tenant, q.name, model, job_state), n)
    for (pool, model), gpus in sorted(state.pools.items()):
        for status in ("allocated", "free", "unavailable"):
            fam["sluice_pool_gpus"].add((pool, model, status), getattr(gpus, status))
    for (pool, tenant, model), gpus in sorted(state.tenants.items()):
        key = (pool, tenant, model)
        fam["sluice_allocated_gpus"].add(key, gpus.allocated)
        fam["sluice_borrowed_gpus"].add(key, gpus.borrowed)
        fam["sluice_used_gpus"].add(key, round(gpus.used, 4))
        fam["sluice_idle_gpus"].add(key, gpus.idle)
    for tenant, pool, model, guaranteed, borrow in Quota.objects.values_list(
        "tenant__slug", "pool__name", "gpu_model", "guaranteed_gpus", "borrow_limit_gpus"
    ).order_by():
        key = (pool, tenant, model or "any")
        fam["sluice_quota_guaranteed_gpus"].add(key, guaranteed)
        fam["sluice_quota_borrow_limit_gpus"].add(key, borrow)
    _gpu_samples(fam, state.gpus)

    node_states: dict[tuple[str, str], int] = defaultdict(int)
    heartbeat = fam["sluice_node_heartbeat_age_seconds"]
    for name, pool, node_state, last in (
        Node.objects.values_list("name", "pool__name", "state", "last_heartbeat")
        .order_by()
        .iterator(chunk_size=5000)
    ):
        node_states[pool, node_state] += 1
        if last is not None:
            heartbeat.add((name, pool), round(max((now - last).total_seconds(), 0.0), 3))
    for (pool, node_state), n in sorted(node_states.items()):
        fam["sluice_nodes"].add((pool, node_state), n)

    totals = totals_get()
    for key, n in sorted(totals["outcomes"].items()):
        fam["sluice_jobs_finished_total"].add(key, n)
    for key, n in sorted(totals["preemptions"].items()):
        fam["sluice_job_preemptions_total"].add(key, n)
    for tenant, workload_type, kind, n, hours in sorted(totals["reclaims"]):
        fam["sluice_reclaims_total"].add((tenant, workload_type, kind), n)
        fam["sluice_reclaimed_gpu_hours_total"].add((tenant, workload_type, kind), round(hours, 6))
    fam["sluice_metrics_totals_age_seconds"].add(
        (), round(max(time.time() - totals["computed_at"], 0.0), 3)
    )

    fam["sluice_metrics_read_seconds"].add((), round(time.perf_counter() - started, 6))
    return fam


def _gpu_samples(fam: dict[str, Family], gpus: list[GpuRow]) -> None:
    """Per GPU (DCGM's exporter's shape): each GPU's labels rendered once for its four
    families."""
    names = fam["sluice_gpu_allocated"].labelnames
    util = fam["sluice_gpu_utilization_percent"]
    used = fam["sluice_gpu_memory_used_bytes"]
    total = fam["sluice_gpu_memory_total_bytes"]
    allocated = fam["sluice_gpu_allocated"]
    assert names == ("node", "gpu", "uuid", "model", "pool")
    for row in sorted(gpus, key=lambda r: (r.node, r.index)):
        values = (row.node, row.index, row.uuid, row.model, row.pool)
        # labels_text(names, values), spelled out: 8,000 GPUs.
        labels = (
            f'node="{_escape(row.node)}",gpu="{row.index}",uuid="{_escape(row.uuid)}",'
            f'model="{_escape(row.model)}",pool="{_escape(row.pool)}"'
        )
        if row.utilization is not None:
            util.add_rendered(labels, values, row.utilization)
        if row.memory_used_mb is not None:
            used.add_rendered(labels, values, row.memory_used_mb * MIB)
        total.add_rendered(labels, values, row.memory_mb * MIB)
        allocated.add_rendered(labels, values, 1 if row.allocated else 0)


def database_text(now: datetime | None = None) -> str:
    return "".join(f.render() for f in database_families(now).values())


class DatabaseCollector:
    """The database part as a prometheus-client collector (for a registry of one's own;
    ``/metrics`` renders the same families with :func:`database_text`, faster)."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for family in database_families().values():
            cls = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = cls(family.family_name, family.help, labels=list(family.labelnames))
            for values, (_labels, value) in zip(family.raw_labels, family.samples, strict=True):
                metric.add_metric([str(v) for v in values], value)
            yield metric


# --- /metrics -----------------------------------------------------------------------------

_gc_lock = threading.Lock()
_gc_holders = 0
_gc_was_enabled = True


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection while a scrape builds its ~100,000 short-lived objects
    (tuples and strings, freed by reference counting): the collector's passes over them
    doubled a scrape's CPU time (~55 ms -> ~110 ms at 8,000 GPUs). Nested or concurrent
    holders (gunicorn threads) share the pause; the last one restores the previous state."""
    global _gc_holders, _gc_was_enabled
    with _gc_lock:
        if _gc_holders == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_holders += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holders -= 1
            if _gc_holders == 0 and _gc_was_enabled:
                gc.enable()


#: Parsed multiprocess keys: (family, sample name, rendered labels without ``le``, le or
#: None, help). The keys are the same from scrape to scrape: parsed once per process.
_EVENT_KEYS: dict[str, tuple[str, str, str, float | None, str]] = {}
_LE_TEXT: dict[float, str] = {}


def _event_key(key: str) -> tuple[str, str, str, float | None, str]:
    parsed = _EVENT_KEYS.get(key)
    if parsed is None:
        family, sample, labels, help_text = json.loads(key)
        le = labels.pop("le", None)
        names = tuple(labels)
        text = labels_text(names, tuple(labels[n] for n in names))
        parsed = (family, sample, text, float(le) if le is not None else None, help_text)
        _EVENT_KEYS[key] = parsed
    return parsed


def _le_text(le: float) -> str:
    text = _LE_TEXT.get(le)
    if text is None:
        from prometheus_client.utils import floatToGoString

        text = _LE_TEXT[le] = floatToGoString(le)
    return text


@dataclass
class _EventFamily:
    kind: str
    help: str
    values: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    buckets: dict[str, dict[float, float]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )

    def render(self, name: str) -> str:
        help_text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        # A counter's samples are ``<name>_total``: its HELP and TYPE name them so (0.0.4).
        head = f"{name}_total" if self.kind == "counter" else name
        lines = [f"# HELP {head} {help_text}\n# TYPE {head} {self.kind}\n"]
        if self.kind == "counter":
            for (sample, labels), value in sorted(self.values.items()):
                lines.append(f"{sample}{{{labels}}} {_number(value)}\n")
            return "".join(lines)
        for labels in sorted(self.buckets.keys() | {lb for _s, lb in self.values}):
            sep = "," if labels else ""
            count = 0.0
            for le, value in sorted(self.buckets.get(labels, {}).items()):
                count += value
                lines.append(
                    f'{name}_bucket{{{labels}{sep}le="{_le_text(le)}"}} {_number(count)}\n'
                )
            lines.append(f"{name}_count{{{labels}}} {_number(count)}\n")
            lines.append(f"{name}_sum{{{labels}}} {_number(self.values[name + '_sum', labels])}\n")
        return "".join(lines)


def events_text() -> str:
    """The events part: the counters and histograms of every process, summed from the
    multiprocess files (empty when the directory holds none yet).

    prometheus-client's own merge and writer take ~40 ms for 3,600 histogram samples
    (60 queues × 3 classes); with the keys parsed once per process and the lines written
    directly, a few. Files of other kinds (gauges, summaries: insights.instrument makes
    none today) go through prometheus-client's merge."""
    from prometheus_client.mmap_dict import MmapedDict

    path = Path(settings.PROMETHEUS_MULTIPROC_DIR or "")
    if not settings.PROMETHEUS_MULTIPROC_DIR or not path.is_dir():
        return ""
    families: dict[str, _EventFamily] = {}
    others = []
    for file in sorted(path.glob("*.db")):
        kind = file.name.partition("_")[0]
        if kind not in ("counter", "histogram"):
            others.append(str(file))
            continue
        try:
            values = list(MmapedDict.read_all_values_from_file(str(file)))
        except FileNotFoundError:
            continue  # removed since the listing (a dead process's, at a service start)
        for key, value, _timestamp, _pos in values:
            name, sample, labels, le, help_text = _event_key(key)
            family = families.get(name)
            if family is None:
                family = families[name] = _EventFamily(kind, help_text)
            if le is None:
                family.values[sample, labels] += value
            else:
                family.buckets[labels][le] += value
    text = "".join(families[name].render(name) for name in sorted(families))
    if others:
        text += _generic_events_text(others)
    return text


def _generic_events_text(files: list[str]) -> str:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    class _Files:
        def collect(self):
            return MultiProcessCollector.merge(files)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Files())
    return generate_latest(registry).decode("utf-8")


def metrics_text(now: datetime | None = None) -> str:
    """Everything ``/metrics`` answers, in Prometheus' text format 0.0.4."""
    with gc_paused():
        return events_text() + database_text(now)


# --- the summary (GET /api/v1/metrics/summary) --------------------------------------------


def metrics_summary(*, queue_ids: set[int] | None, now: datetime | None = None) -> dict:
    """Now, in numbers: per pool its GPUs and jobs (everybody may see these totals), per
    queue its depth and longest current wait (only ``queue_ids``; None: all queues).
    Five queries."""
    now = now or timezone.now()
    queues = queue_labels()
    with gc_paused():
        state = gpu_state(now, queues)
    waiting = waiting_by_queue()
    running_by_queue: dict[int, int] = defaultdict(int)
    for (queue_id, _model, _state), n in state.running.items():
        running_by_queue[queue_id] += n

    pools: dict[str, dict] = {}

    def pool_entry(name: str) -> dict:
        if name not in pools:
            pools[name] = {
                "name": name,
                "gpus": {
                    "total": 0,
                    "allocated": 0,
                    "used": 0.0,
                    "idle": 0,
                    "free": 0,
                    "unavailable": 0,
                },
                "gpu_models": [],
                "jobs": {"pending": 0, "held": 0, "running": 0},
            }
        return pools[name]

    for (pool, model), gpus in sorted(state.pools.items()):
        entry = pool_entry(pool)
        figures = {
            "gpu_model": model,
            "total": gpus.total,
            "allocated": gpus.allocated,
            "used": round(gpus.used, 2),
            "idle": gpus.idle,
            "free": gpus.free,
            "unavailable": gpus.unavailable,
        }
        entry["gpu_models"].append(figures)
        for key in ("total", "allocated", "used", "idle", "free", "unavailable"):
            entry["gpus"][key] += figures[key]
    for queue_id, q in queues.items():
        entry = pool_entry(q.pool)
        if queue_id in waiting:
            entry["jobs"]["pending"] += waiting[queue_id].pending
            entry["jobs"]["held"] += waiting[queue_id].held
        entry["jobs"]["running"] += running_by_queue.get(queue_id, 0)
    for entry in pools.values():
        entry["gpus"]["used"] = round(entry["gpus"]["used"], 2)

    listed = []
    for queue_id, q in sorted(queues.items(), key=lambda item: item[1].name):
        if queue_ids is not None and queue_id not in queue_ids:
            continue
        w = waiting.get(queue_id) or QueueWaiting()
        listed.append(
            {
                "id": queue_id,
                "name": q.short,
                "tenant": q.tenant,
                "pool": q.pool,
                "depth": w.pending,
                "held": w.held,
                "pending_gpus": w.pending_gpus,
                "running": running_by_queue.get(queue_id, 0),
                "longest_wait_seconds": round(w.longest_wait_seconds(now), 1),
                "waiting_since": w.oldest_since,
                "reasons": dict(sorted(w.reasons.items())),
            }
        )
    return {
        "generated_at": now,
        "pools": [pools[name] for name in sorted(pools)],
        "queues": listed,
    }
