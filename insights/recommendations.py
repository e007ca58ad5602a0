"""Recommendations that close the loop: the rules over the recorded history and what their
result says (ranking, simulated effect). What is written from them (the daily refresh, and a
platform admin's simulate, apply and dismiss) is in ``insights.services.recommendations``.

Each rule reads the history of one period (the rollups of ``insights.models`` and the
scheduling tables) and proposes at most one recommendation per *key* (kind and target):
its evidence (the numbers and the period), and a concrete change. The daily beat task
``insights.recommendations`` calls ``recommendations_refresh`` (the services), which

- refreshes the open recommendation of a key (new evidence and change; a simulation run for
  another change is unlinked, it no longer says anything about this one);
- opens a new one unless the same key was dismissed or applied less than
  ``COOLDOWN_DAYS`` ago, and its numbers (``evidence["score"]``) are not clearly worse
  (``WORSE_FACTOR`` times the decided one's);
- dismisses (automatically, with a reason) the open ones the history no longer supports.

Changes the what-if simulator can replay carry ``change["whatif"]`` (parameters of
``scheduling.services.whatif.clean_params``: quotas, classes of a queue's jobs, cordoned
nodes); the others say why (``change["not_simulated"]``). ``change["action"]`` is what
*apply* does, through the same services as a manual edit (audited); a change computed
from a quota's, a queue's or a policy's values records them in ``change["from"]``, and *apply*
refuses it (code ``stale``) once they were edited since.

Thresholds are module constants; each can be overridden by a setting of the same name
prefixed with ``SLUICE_RECOMMEND_`` (e.g. ``SLUICE_RECOMMEND_FAILURE_MIN_JOBS = 3``).
"""

from __future__ import annotations

import math
import shlex
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEvent
from scheduling.choices import (
    ExtensionState,
    GpuHealth,
    JobState,
    NodeState,
    ReclaimKind,
    SimulationState,
    WorkloadType,
)
from scheduling.models import (
    Allocation,
    Gpu,
    Job,
    JobEvent,
    PriorityClass,
    PriorityRaise,
    Queue,
    Quota,
    ReclaimRecord,
    RuntimeExtension,
    WorkloadPolicy,
)
from tenants.choices import Role
from tenants.models import Membership, Project, Tenant

from .choices import RecommendationKind, Resolution
from .models import GpuActivity, QueueRollup, Recommendation, UsageRollup

# -- thresholds (override with settings SLUICE_RECOMMEND_<NAME>) -------------------------------

#: Days of history each rule reads (raises: ``RAISES_PERIOD_DAYS``).
PERIOD_DAYS = 7
#: A dismissed or applied recommendation stays closed this long for its key...
COOLDOWN_DAYS = 7
#: ...unless its score (``evidence["score"]``) is at least this many times the decided one's.
WORSE_FACTOR = 1.5

#: Guarantee unused: hours whose allocation stayed below ``GUARANTEE_LOW_USE`` of the
#: guarantee must be at least ``GUARANTEE_UNUSED_SHARE`` of the observed hours, and the
#: observed hours at least ``GUARANTEE_MIN_HOURS`` (the pool's hour rollups).
GUARANTEE_LOW_USE = 0.5
GUARANTEE_UNUSED_SHARE = 0.5
GUARANTEE_MIN_HOURS = 72
#: The new guarantee N = ceil(p95 of the hourly allocation x (1 + headroom)).
GUARANTEE_HEADROOM = 0.25

#: Queue waits: at least this many admissions in the period. The target is the smallest
#: ``max_wait_seconds`` of the workload policies the queue allows (the policy's own "this
#: job has waited too long"), capped by ``QUEUE_WAIT_TARGET_SECONDS`` when that is set (> 0).
QUEUE_WAIT_MIN_JOBS = 5
QUEUE_WAIT_TARGET_SECONDS = 0

#: Repeated failures: this many failed jobs of one submitter in one project with one exit.
FAILURE_MIN_JOBS = 5

#: Idle GPUs: a GPU whose last busy sample is this old; only whole nodes are proposed,
#: and a pool keeps ``IDLE_KEEP_NODES`` ready nodes at least.
IDLE_GPU_DAYS = 3
IDLE_KEEP_NODES = 1
#: GPU activity sampled longer ago than this is not evidence (the rollup writer stopped).
IDLE_SAMPLE_MAX_AGE = timedelta(hours=1)

#: Sessions reclaimed: this many idle reclaims of interactive sessions in the period; the
#: proposed window is half the current one, not below ``IDLE_WINDOW_MIN_SECONDS``.
RECLAIM_MIN_SESSIONS = 10
IDLE_WINDOW_MIN_SECONDS = 900

#: Raises and exemptions: this many for one project in ``RAISES_PERIOD_DAYS``.
RAISES_MIN = 5
RAISES_PERIOD_DAYS = 30

#: Raises of a project that count (cancelled requests do not).
_COUNTED_RAISE_STATES = ("pending", "approved", "rejected", "expired", "revoked")


def threshold(name: str):
    """A threshold: the setting ``SLUICE_RECOMMEND_<name>`` or the module constant."""
    return getattr(settings, f"SLUICE_RECOMMEND_{name}", globals()[name])


# -- what a rule proposes --------------------------------------------------------------------


@dataclass
class Proposal:
    """A recommendation a rule wants open: ``evidence`` holds ``facts`` (label, value) for
    the pages, the raw numbers, the period, ``impact_gpu_hours`` (what ranks it) and
    ``score`` (what "clearly worse" compares)."""

    kind: str
    key: str
    tenant: Tenant | None
    title: str
    evidence: dict
    change: dict = field(default_factory=dict)


def _period(start: datetime, end: datetime) -> dict:
    return {
        "start": start.isoformat(timespec="seconds"),
        "end": end.isoformat(timespec="seconds"),
        "days": round((end - start).total_seconds() / 86400, 2),
    }


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]


def weighted_percentile(pairs: list[tuple[float, float]], fraction: float) -> float:
    """Nearest-rank percentile of ``(value, weight)`` pairs."""
    pairs = sorted((v, w) for v, w in pairs if w > 0)
    total = sum(w for _, w in pairs)
    if not total:
        return 0.0
    seen = 0.0
    for value, weight in pairs:
        seen += weight
        if seen >= fraction * total - 1e-9:
            return value
    return pairs[-1][0]


def _hours(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def pool_capacity(pool_id: int) -> int:
    """Schedulable GPUs of a pool: healthy GPUs of its ready nodes."""
    return Gpu.objects.filter(
        node__pool_id=pool_id, node__state=NodeState.READY, health=GpuHealth.HEALTHY
    ).count()


# -- rule: a guarantee unused most of the week -------------------------------------------------


def rule_lower_guarantee(now: datetime) -> list[Proposal]:
    """A quota whose hourly allocation stayed below half its guarantee most of the period:
    lower the guarantee to the p95 allocation plus headroom, and raise the borrow limit by
    as much, so the tenant may still use as many GPUs when they are idle but no longer
    holds them reserved. Never below the largest non-preemptible job the tenant ran in the
    pool in the period: such a job must fit within the guarantee, or it could never start."""
    start = now - timedelta(days=threshold("PERIOD_DAYS"))
    hour_rows = UsageRollup.objects.filter(
        resolution=Resolution.HOUR, bucket__gte=start, bucket__lt=now
    )
    observed: dict[int, set] = defaultdict(set)
    for pool_id, bucket in hour_rows.filter(tenant__isnull=True).values_list("pool_id", "bucket"):
        observed[pool_id].add(bucket)
    allocated: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    for tenant_id, pool_id, model, bucket, gpus in hour_rows.filter(
        tenant__isnull=False
    ).values_list("tenant_id", "pool_id", "gpu_model", "bucket", "allocated_gpus"):
        allocated[(tenant_id, pool_id)].append((model, bucket, gpus))
    quotas = list(Quota.objects.filter(guaranteed_gpus__gt=0).select_related("tenant", "pool"))
    specific = defaultdict(set)  # (tenant, pool) -> GPU models with a quota of their own
    for quota in quotas:
        if quota.gpu_model:
            specific[(quota.tenant_id, quota.pool_id)].add(quota.gpu_model)
    largest = _largest_non_preemptible_jobs(start, now)
    proposals = []
    for quota in quotas:
        buckets = observed.get(quota.pool_id, set())
        # No hour at all says nothing (and divides by zero), whatever the setting allows.
        if not buckets or len(buckets) < threshold("GUARANTEE_MIN_HOURS"):
            continue
        per_bucket: dict = defaultdict(float)
        others = specific[(quota.tenant_id, quota.pool_id)]
        for model, bucket, gpus in allocated.get((quota.tenant_id, quota.pool_id), []):
            mine = model == quota.gpu_model if quota.gpu_model else model not in others
            if mine and bucket in buckets:
                per_bucket[bucket] += gpus
        values = [per_bucket.get(bucket, 0.0) for bucket in buckets]
        guaranteed = quota.guaranteed_gpus
        low = [v for v in values if v < guaranteed * threshold("GUARANTEE_LOW_USE")]
        unused_share = len(low) / len(values)
        p95, peak = percentile(values, 0.95), max(values)
        floor = largest.get((quota.tenant_id, quota.pool_id), 0)
        new = max(math.ceil(round(p95 * (1 + threshold("GUARANTEE_HEADROOM")), 6)), floor)
        if unused_share < threshold("GUARANTEE_UNUSED_SHARE") or new >= guaranteed:
            continue
        borrow = quota.borrow_limit_gpus + (guaranteed - new)
        unused_hours = sum(guaranteed - v for v in values if v < guaranteed)
        evidence = {
            "period": _period(start, now),
            "quota": quota.pk,
            "guaranteed_gpus": guaranteed,
            "hours_observed": len(values),
            "hours_below_half": len(low),
            "unused_share": round(unused_share, 4),
            "allocated_p95_gpus": round(p95, 2),
            "allocated_peak_gpus": round(peak, 2),
            "allocated_mean_gpus": round(sum(values) / len(values), 2),
            "largest_non_preemptible_job_gpus": floor,
            "impact_gpu_hours": round(unused_hours, 1),
            "score": guaranteed - new,
            "facts": [
                ["Guarantee", f"{guaranteed} GPUs ({quota})"],
                [
                    "Hours below half the guarantee",
                    f"{len(low)} of {len(values)} ({unused_share:.0%})",
                ],
                ["Allocated, 95th percentile of hours", f"{p95:.1f} GPUs"],
                ["Allocated, peak hour", f"{peak:.1f} GPUs"],
                ["Largest non-preemptible job", f"{floor} GPUs" if floor else "none"],
                ["Guaranteed GPU-hours left unused", f"{unused_hours:,.0f}"],
            ],
        }
        change = {
            "summary": (
                f"Lower {quota}'s guarantee from {guaranteed} to {new} GPUs "
                f"(p95 {p95:.1f} + {threshold('GUARANTEE_HEADROOM'):.0%} headroom) and raise "
                f"its borrow limit from {quota.borrow_limit_gpus} to {borrow}, so its ceiling "
                f"stays {guaranteed + quota.borrow_limit_gpus} GPUs."
            ),
            "action": "quota_update",
            "quota": quota.pk,
            "guaranteed": new,
            "borrow_limit": borrow,
            "from": {"guaranteed": guaranteed, "borrow_limit": quota.borrow_limit_gpus},
            "whatif": {"quotas": {str(quota.pk): {"guaranteed": new, "borrow_limit": borrow}}},
        }
        proposals.append(
            Proposal(
                RecommendationKind.LOWER_GUARANTEE,
                f"lower_guarantee:quota:{quota.pk}",
                quota.tenant,
                f"{quota.tenant.slug}: under half its {quota.pool.name} guarantee used "
                f"{unused_share:.0%} of the hours — lower it from {guaranteed} to {new}",
                evidence,
                change,
            )
        )
    return proposals


def _largest_non_preemptible_jobs(start: datetime, end: datetime) -> dict[tuple[int, int], int]:
    """(tenant, pool) -> GPUs of the largest job that started in the period and may not be
    preempted (its base class or its workload policy says so, as the dispatch loop reads)."""
    policies = dict(WorkloadPolicy.objects.values_list("workload_type", "preemptible"))
    largest: dict[tuple[int, int], int] = defaultdict(int)
    rows = Job.objects.filter(started_at__gte=start, started_at__lt=end).values_list(
        "tenant_id",
        "queue__pool_id",
        "gpus_per_node",
        "nodes",
        "base_priority_class__preemptible",
        "workload_type",
    )
    for tenant_id, pool_id, gpus, nodes, class_preemptible, workload_type in rows:
        if not (class_preemptible and policies.get(workload_type, True)):
            key = (tenant_id, pool_id)
            largest[key] = max(largest[key], gpus * nodes)
    return largest


# -- rule: a queue whose p95 wait exceeds its target ------------------------------------------


def queue_wait_target(queue: Queue, policies: dict[str, int]) -> int:
    """The wait a queue's jobs should not pass: the smallest ``max_wait_seconds`` of the
    policies of the workload types it allows, capped by QUEUE_WAIT_TARGET_SECONDS if set."""
    types = queue.allowed_workload_types or list(WorkloadType.values)
    known = [policies[t] for t in types if t in policies]
    target = min(known) if known else settings.SLUICE_MAX_WAIT_SECONDS
    cap = threshold("QUEUE_WAIT_TARGET_SECONDS")
    return min(target, cap) if cap else target


def rule_queue_wait(now: datetime) -> list[Proposal]:
    """A queue whose 95th percentile wait (over the hours of the period, weighted by the
    jobs admitted in each: an upper estimate, each hour's p95 standing for its jobs) passed
    its target: raise its tenant's guarantee by the GPUs that waited in those hours when
    the pool has unguaranteed GPUs for it, else run the queue's jobs one class higher."""
    start = now - timedelta(days=threshold("PERIOD_DAYS"))
    rows = defaultdict(list)
    for queue_id, admitted, p95, pending_gpus in QueueRollup.objects.filter(
        resolution=Resolution.HOUR, bucket__gte=start, bucket__lt=now
    ).values_list("queue_id", "admitted_jobs", "wait_p95_seconds", "pending_gpus"):
        rows[queue_id].append((admitted, p95, pending_gpus))
    if not rows:
        return []
    policies = dict(WorkloadPolicy.objects.values_list("workload_type", "max_wait_seconds"))
    queues = Queue.objects.select_related(
        "tenant", "pool", "default_priority_class", "max_self_service_class"
    ).in_bulk(list(rows))
    classes = list(PriorityClass.objects.order_by("value"))
    guaranteed_in_pool: dict[int, int] = defaultdict(int)
    for pool_id, gpus in Quota.objects.values_list("pool_id", "guaranteed_gpus"):
        guaranteed_in_pool[pool_id] += gpus
    proposals = []
    for queue_id, hours in rows.items():
        queue = queues.get(queue_id)
        admitted = sum(a for a, _, _ in hours)
        if queue is None or admitted < threshold("QUEUE_WAIT_MIN_JOBS"):
            continue
        target = queue_wait_target(queue, policies)
        p95 = weighted_percentile([(w, a) for a, w, _ in hours if w is not None], 0.95)
        if p95 <= target:
            continue
        over = [(a, w, p) for a, w, p in hours if w is not None and w > target]
        gpus = max(1, math.ceil(round(sum(p for _, _, p in over) / max(len(over), 1), 6)))
        quota = (
            Quota.objects.filter(tenant=queue.tenant, pool=queue.pool)
            .order_by("gpu_model", "id")
            .first()
        )
        room = pool_capacity(queue.pool_id) - guaranteed_in_pool[queue.pool_id]
        higher = next((c for c in classes if c.value > queue.default_priority_class.value), None)
        evidence = {
            "period": _period(start, now),
            "queue": queue.pk,
            "target_seconds": target,
            "wait_p95_seconds": round(p95, 1),
            "admitted_jobs": admitted,
            "hours_over_target": len(over),
            "jobs_in_hours_over_target": sum(a for a, _, _ in over),
            "pending_gpus_over_target": gpus,
            "unguaranteed_gpus_in_pool": room,
            "impact_gpu_hours": float(gpus * len(over)),
            "score": round(p95 / target, 3),
            "facts": [
                ["95th percentile wait", _hours(p95)],
                ["Target", f"{_hours(target)} (the policy's maximum wait)"],
                ["Jobs admitted", str(admitted)],
                ["Hours over the target", f"{len(over)} ({sum(a for a, _, _ in over)} jobs)"],
                ["GPUs waiting in those hours (mean)", str(gpus)],
                ["Pool GPUs not guaranteed to anyone", str(room)],
            ],
        }
        if quota is not None and (room >= gpus or higher is None):
            new = quota.guaranteed_gpus + gpus
            change = {
                "summary": f"Raise {quota}'s guarantee from {quota.guaranteed_gpus} to {new} GPUs"
                + ("" if room >= gpus else " (the pool's guarantees would pass its capacity)"),
                "action": "quota_update",
                "quota": quota.pk,
                "guaranteed": new,
                "borrow_limit": quota.borrow_limit_gpus,
                "from": {
                    "guaranteed": quota.guaranteed_gpus,
                    "borrow_limit": quota.borrow_limit_gpus,
                },
                "whatif": {
                    "quotas": {
                        str(quota.pk): {"guaranteed": new, "borrow_limit": quota.borrow_limit_gpus}
                    }
                },
            }
            remedy = f"raise {queue.tenant.slug}'s guarantee by {gpus}"
        elif higher is not None:
            change = {
                "summary": (
                    f"Run queue {queue}'s jobs at class {higher.name} instead of "
                    f"{queue.default_priority_class.name} (its default; the pool has no "
                    f"unguaranteed GPUs for {gpus} more)"
                ),
                "action": "queue_class",
                "queue": queue.pk,
                "priority_class": higher.name,
                "from": {"default_priority_class": queue.default_priority_class.name},
                "whatif": {"queue_classes": {str(queue.pk): higher.name}},
            }
            remedy = f"raise its class to {higher.name}"
        else:
            continue
        proposals.append(
            Proposal(
                RecommendationKind.QUEUE_WAIT,
                f"queue_wait:queue:{queue.pk}",
                queue.tenant,
                f"{queue}: p95 wait {_hours(p95)} over its {_hours(target)} target — {remedy}",
                evidence,
                change,
            )
        )
    return proposals


# -- rule: jobs failing repeatedly with the same exit ------------------------------------------


def _command_text(command, shell: bool) -> str:
    if shell or isinstance(command, str):
        return str(command if isinstance(command, str) else " ".join(map(str, command)))
    return shlex.join(str(part) for part in command or [])


def rule_repeated_failure(now: datetime) -> list[Proposal]:
    """One submitter's jobs in one project failing with the same exit code (or signal) at
    least FAILURE_MIN_JOBS times: tell the owner, with the command and the last message."""
    start = now - timedelta(days=threshold("PERIOD_DAYS"))
    groups = defaultdict(list)
    failed = Job.objects.filter(
        state=JobState.FAILED, finished_at__gte=start, finished_at__lt=now
    ).order_by("-finished_at", "-id")
    for row in failed.values(
        "pk",
        "tenant_id",
        "project_id",
        "submitted_by_id",
        "exit_code",
        "exit_signal",
        "command",
        "shell",
        "failure_message",
        "started_at",
        "finished_at",
        "gpus_per_node",
        "nodes",
    ):
        exit_key = (
            f"exit {row['exit_code']}"
            if row["exit_code"] is not None
            else f"signal {row['exit_signal']}"
            if row["exit_signal"] is not None
            else "no exit code"
        )
        groups[(row["project_id"], row["submitted_by_id"], exit_key)].append(row)
    wanted = {k: v for k, v in groups.items() if len(v) >= threshold("FAILURE_MIN_JOBS")}
    if not wanted:
        return []
    projects = Project.objects.select_related("tenant").in_bulk([k[0] for k in wanted])
    users = {u.pk: u for u in users_with_ids([k[1] for k in wanted])}
    proposals = []
    for (project_id, user_id, exit_key), jobs in wanted.items():
        project, owner = projects[project_id], users.get(user_id)
        commands = Counter(_command_text(j["command"], j["shell"]) for j in jobs)
        command, same_command = commands.most_common(1)[0]
        gpu_hours = (
            sum(
                (j["finished_at"] - j["started_at"]).total_seconds()
                * j["gpus_per_node"]
                * j["nodes"]
                for j in jobs
                if j["started_at"]
            )
            / 3600
        )
        who = owner.get_username() if owner else f"user {user_id}"
        link = reverse("job-list") + f"?state={JobState.FAILED}"
        message = (
            f"{len(jobs)} of your jobs in {project.tenant.slug}/{project.slug} failed with "
            f"{exit_key} in the last {threshold('PERIOD_DAYS')} days (e.g. `{command[:200]}`; "
            f"last: {jobs[0]['failure_message'][:200] or 'no message'}). Please fix the cause "
            "before submitting again."
        )
        evidence = {
            "period": _period(start, now),
            "project": project_id,
            "user": user_id,
            "exit": exit_key,
            "failed_jobs": len(jobs),
            "same_command_jobs": same_command,
            "command": command[:500],
            "last_message": jobs[0]["failure_message"][:500],
            "job_ids": [j["pk"] for j in jobs[:20]],
            "impact_gpu_hours": round(gpu_hours, 2),
            "score": len(jobs),
            "facts": [
                ["Failed jobs", f"{len(jobs)} with {exit_key}"],
                ["Submitter", who],
                ["Most common command", f"{command[:200]} ({same_command} jobs)"],
                ["Last failure message", jobs[0]["failure_message"][:200] or "—"],
                ["GPU-hours spent on them", f"{gpu_hours:.1f}"],
                ["Jobs", ", ".join(f"#{j['pk']}" for j in jobs[:10])],
            ],
        }
        change = {
            "summary": f"Notify {who} in the portal (and by mail when enabled): {message}",
            "action": "notify",
            "users": [user_id],
            "message": message,
            "link": link,
            "not_simulated": "A notification changes no quota, class or node: there is "
            "nothing for the what-if simulator to replay.",
        }
        proposals.append(
            Proposal(
                RecommendationKind.REPEATED_FAILURE,
                f"repeated_failure:project:{project_id}:user:{user_id}:{exit_key}",
                project.tenant,
                f"{who}'s jobs in {project.tenant.slug}/{project.slug} failed {len(jobs)} "
                f"times with {exit_key} — notify the owner",
                evidence,
                change,
            )
        )
    return proposals


def users_with_ids(ids):
    """The users of these ids (those that still exist)."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(pk__in=ids)


# -- rule: GPUs idle for days -----------------------------------------------------------------


def rule_idle_gpus(now: datetime) -> list[Proposal]:
    """Whole ready nodes whose GPUs all have not been busy for IDLE_GPU_DAYS (GpuActivity):
    cordon them, which shrinks the pool (the nodes can then be moved to a pool with demand
    or powered down). The what-if replays the period without them."""
    idle_after = timedelta(days=threshold("IDLE_GPU_DAYS"))
    period = timedelta(days=threshold("PERIOD_DAYS"))
    activity = {
        a.gpu_id: a
        for a in GpuActivity.objects.filter(gpu__node__state=NodeState.READY).select_related("gpu")
    }
    # A node holding GPUs for a job is left alone: idle held GPUs are idle reclaim's business.
    busy_nodes = set(
        Allocation.objects.filter(released_at__isnull=True).values_list("node_id", flat=True)
    )
    nodes = defaultdict(list)
    for gpu in Gpu.objects.filter(
        node__state=NodeState.READY, health=GpuHealth.HEALTHY
    ).select_related("node__pool"):
        nodes[gpu.node].append(gpu)
    by_pool = defaultdict(list)
    ready_nodes = defaultdict(int)
    for node, gpus in nodes.items():
        ready_nodes[node.pool] += 1
        if node.pk in busy_nodes:
            continue
        idle_for = []
        for gpu in gpus:
            row = activity.get(gpu.pk)
            # Stale samples (the rollup writer stopped) prove nothing about idleness.
            fresh = row is not None and now - row.sampled_at <= IDLE_SAMPLE_MAX_AGE
            since = fresh and (row.busy_at or row.idle_since) or None
            if since is None or now - since < idle_after:
                break
            idle_for.append((now - since).total_seconds())
        else:
            by_pool[node.pool].append((node, len(gpus), min(idle_for)))
    proposals = []
    for pool, idle in by_pool.items():
        keep = threshold("IDLE_KEEP_NODES")
        room = ready_nodes[pool] - keep
        if room <= 0:
            continue
        idle = sorted(idle, key=lambda item: (-item[2], item[0].name))[:room]
        gpus = sum(n for _, n, _ in idle)
        gpu_hours = sum(n * min(s, period.total_seconds()) for _, n, s in idle) / 3600
        names = sorted(node.name for node, _, _ in idle)
        least = min(s for _, _, s in idle)
        evidence = {
            "period": _period(now - period, now),
            "pool": pool.pk,
            "nodes": names,
            "idle_gpus": gpus,
            "idle_days_min": round(least / 86400, 2),
            "pool_ready_nodes": ready_nodes[pool],
            "impact_gpu_hours": round(gpu_hours, 1),
            "score": gpus,
            "facts": [
                ["Idle nodes", ", ".join(names)],
                ["Idle GPUs", f"{gpus} of the pool's {ready_nodes[pool]} ready nodes"],
                ["Idle for at least", _hours(least)],
                ["Idle GPU-hours in the period", f"{gpu_hours:,.0f}"],
            ],
        }
        change = {
            "summary": (
                f"Cordon {', '.join(names)} in pool {pool.name}: no new job is placed there "
                "(running ones finish), so the nodes can move to a pool with demand or be "
                "powered down. The what-if replays the period without their GPUs."
            ),
            "action": "node_cordon",
            "nodes": names,
            "whatif": {"cordon": names},
        }
        proposals.append(
            Proposal(
                RecommendationKind.IDLE_GPUS,
                f"idle_gpus:pool:{pool.pk}",
                None,
                f"Pool {pool.name}: {gpus} GPUs idle for {least / 86400:.1f} days or more — "
                f"cordon {len(names)} node{'s' if len(names) != 1 else ''}",
                evidence,
                change,
            )
        )
    return proposals


# -- rule: interactive sessions reclaimed often ------------------------------------------------


def rule_short_idle_window(now: datetime) -> list[Proposal]:
    """Interactive sessions reclaimed for idleness RECLAIM_MIN_SESSIONS times or more: the
    sessions are routinely left idle, so a shorter idle window gives the GPUs back sooner
    (half the current window, at least IDLE_WINDOW_MIN_SECONDS)."""
    start = now - timedelta(days=threshold("PERIOD_DAYS"))
    records = list(
        ReclaimRecord.objects.filter(
            kind=ReclaimKind.IDLE_RECLAIM,
            workload_type=WorkloadType.INTERACTIVE,
            created_at__gte=start,
            created_at__lt=now,
        ).values_list("tenant_id", "gpus", "gpu_hours_freed", "job__submitted_by_id")
    )
    if len(records) < threshold("RECLAIM_MIN_SESSIONS"):
        return []
    policy = WorkloadPolicy.objects.filter(workload_type=WorkloadType.INTERACTIVE).first()
    if policy is None or not policy.idle_reclaim_enabled:
        return []
    current = policy.idle_window_seconds
    new = max(threshold("IDLE_WINDOW_MIN_SECONDS"), current // 2 // 60 * 60)
    if new >= current:
        return []
    lead = min(policy.idle_warning_lead_seconds, new // 2)
    gpus = sum(r[1] for r in records)
    freed = sum(r[2] for r in records)
    sooner = gpus * (current - new) / 3600
    evidence = {
        "period": _period(start, now),
        "reclaims": len(records),
        "tenants": len({r[0] for r in records if r[0]}),
        "users": len({r[3] for r in records if r[3]}),
        "gpus": gpus,
        "gpu_hours_freed": round(freed, 2),
        "idle_window_seconds": current,
        "impact_gpu_hours": round(sooner, 2),
        "score": len(records),
        "facts": [
            ["Interactive sessions reclaimed idle", str(len(records))],
            ["Users / tenants", f"{evidence_users(records)} / {len({r[0] for r in records})}"],
            ["GPU-hours freed by the reclaims", f"{freed:.1f}"],
            ["Idle window now", _hours(current)],
            ["GPU-hours back sooner with the new window", f"{sooner:.1f}"],
        ],
    }
    change = {
        "summary": (
            f"Shorten the interactive policy's idle window from {_hours(current)} to "
            f"{_hours(new)} (warning {_hours(lead)} before)."
        ),
        "action": "policy_update",
        "policy": WorkloadType.INTERACTIVE,
        "fields": {"idle_window_seconds": new, "idle_warning_lead_seconds": lead},
        "from": {
            "idle_window_seconds": current,
            "idle_warning_lead_seconds": policy.idle_warning_lead_seconds,
        },
        "not_simulated": "The what-if simulator replays recorded runtimes; it does not model "
        "GPU utilization, so an idle window cannot be replayed. The evidence gives the "
        "GPU-hours the reclaimed sessions would have returned sooner.",
    }
    return [
        Proposal(
            RecommendationKind.SHORT_IDLE_WINDOW,
            "short_idle_window:policy:interactive",
            None,
            f"Interactive sessions reclaimed idle {len(records)} times — shorten the idle "
            f"window to {_hours(new)}",
            evidence,
            change,
        )
    ]


def evidence_users(records) -> int:
    return len({r[3] for r in records if r[3]})


# -- rule: frequent raises or exemptions for one project ---------------------------------------


def rule_frequent_raises(now: datetime) -> list[Proposal]:
    """A project that asked for RAISES_MIN raises, idle exemptions or runtime extensions
    needing approval in RAISES_PERIOD_DAYS: make a rule instead of deciding each. When raises
    are among them, run the project's queue at the class most asked for (its default, and
    its self-service maximum if lower); otherwise tell the tenant's admins."""
    start = now - timedelta(days=threshold("RAISES_PERIOD_DAYS"))
    raises = defaultdict(list)
    for project_id, job_project, to_class, job_queue in PriorityRaise.objects.filter(
        created_at__gte=start, created_at__lt=now, state__in=_COUNTED_RAISE_STATES
    ).values_list("project_id", "job__project_id", "to_class__name", "job__queue_id"):
        raises[project_id or job_project].append((to_class, job_queue))
    exemptions = Counter(
        JobEvent.objects.filter(
            kind="idle_exempt", created_at__gte=start, created_at__lt=now
        ).values_list("job__project_id", flat=True)
    )
    extensions = Counter(
        RuntimeExtension.objects.filter(created_at__gte=start, created_at__lt=now)
        .exclude(state=ExtensionState.AUTO_GRANTED)
        .values_list("job__project_id", flat=True)
    )
    counts = {
        p: len(raises.get(p, ())) + exemptions.get(p, 0) + extensions.get(p, 0)
        for p in set(raises) | set(exemptions) | set(extensions)
    }
    wanted = [p for p, n in counts.items() if p and n >= threshold("RAISES_MIN")]
    if not wanted:
        return []
    projects = Project.objects.select_related("tenant").in_bulk(wanted)
    classes = {c.name: c for c in PriorityClass.objects.all()}
    proposals = []
    for project_id in sorted(wanted):
        project = projects[project_id]
        asked = raises.get(project_id, [])
        evidence = {
            "period": _period(start, now),
            "project": project_id,
            "raises": len(asked),
            "idle_exemptions": exemptions.get(project_id, 0),
            "runtime_extensions": extensions.get(project_id, 0),
            "impact_gpu_hours": 0.0,
            "score": counts[project_id],
            "facts": [
                ["Priority raises asked", str(len(asked))],
                ["Idle-reclaim exemptions", str(exemptions.get(project_id, 0))],
                ["Runtime extensions needing approval", str(extensions.get(project_id, 0))],
            ],
        }
        queue = _project_queue(project, [q for _, q in asked if q])
        target = Counter(c for c, _ in asked).most_common(1)[0][0] if asked else None
        if target and queue is not None and target in classes:
            evidence["queue"] = queue.pk
            evidence["class_asked"] = target
            evidence["facts"].append(["Class asked most", target])
            change = {
                "summary": (
                    f"Make it a rule: queue {queue} runs its jobs at {target} by default "
                    f"(now {queue.default_priority_class.name}); members may choose it without "
                    "asking. Jobs of other projects in that queue get it too."
                ),
                "action": "queue_class",
                "queue": queue.pk,
                "priority_class": target,
                "from": {"default_priority_class": queue.default_priority_class.name},
                "whatif": {"queue_classes": {str(queue.pk): target}},
            }
            remedy = f"run queue {queue.name} at {target}"
        else:
            admins = list(
                Membership.objects.filter(tenant=project.tenant, role=Role.ADMIN).values_list(
                    "user_id", flat=True
                )
            )
            message = (
                f"Project {project.tenant.slug}/{project.slug} asked for "
                f"{counts[project_id]} exemptions or extensions in "
                f"{threshold('RAISES_PERIOD_DAYS')} days: consider a queue or policy of its own."
            )
            change = {
                "summary": f"Tell {project.tenant.slug}'s admins: {message}",
                "action": "notify",
                "users": admins,
                "message": message,
                "link": "",
                "not_simulated": "A notification changes nothing the what-if simulator replays.",
            }
            remedy = "tell the tenant's admins"
        proposals.append(
            Proposal(
                RecommendationKind.FREQUENT_RAISES,
                f"frequent_raises:project:{project_id}",
                project.tenant,
                f"{project.tenant.slug}/{project.slug}: {counts[project_id]} raises or "
                f"exemptions in {threshold('RAISES_PERIOD_DAYS')} days — {remedy}",
                evidence,
                change,
            )
        )
    return proposals


def _project_queue(project: Project, raised_queues: list[int]) -> Queue | None:
    """The queue of the project's raised jobs (the most common), else its own queue."""
    queues = Queue.objects.select_related("tenant", "default_priority_class")
    if raised_queues:
        return queues.filter(pk=Counter(raised_queues).most_common(1)[0][0]).first()
    return queues.filter(project=project).order_by("id").first()


RULES = (
    rule_lower_guarantee,
    rule_queue_wait,
    rule_repeated_failure,
    rule_idle_gpus,
    rule_short_idle_window,
    rule_frequent_raises,
)


# -- the daily refresh ---------------------------------------------------------------------------


def recommendations_compute(now: datetime | None = None) -> list[Proposal]:
    """What every rule proposes from the history up to ``now``."""
    now = now or timezone.now()
    return [proposal for rule in RULES for proposal in rule(now)]


#: The audit action of a run of the rules: the record of when they last ran.
REFRESH_ACTION = "recommendations.refresh"
#: The beat schedule's entry of the daily run (portal.settings).
BEAT_ENTRY = "insights-recommendations"


def recommendations_last_run() -> datetime | None:
    """When the rules last ran (the daily run or an admin's), ``None`` if they never did."""
    return (
        AuditEvent.objects.filter(action=REFRESH_ACTION)
        .order_by("-id")
        .values_list("created_at", flat=True)
        .first()
    )


def recommendations_schedule(now: datetime | None = None) -> dict | None:
    """The daily run's time of day (``"05:17"``), its time zone and its next run after
    ``now``, read from the beat schedule; ``None`` when the schedule has no such entry."""
    entry = settings.CELERY_BEAT_SCHEDULE.get(BEAT_ENTRY)
    schedule = entry and entry.get("schedule")
    hours, minutes = getattr(schedule, "hour", None), getattr(schedule, "minute", None)
    if not hours or not minutes:
        return None
    zone = ZoneInfo(settings.CELERY_TIMEZONE or "UTC")
    local = (now or timezone.now()).astimezone(zone)
    runs = sorted(
        datetime.combine(local.date() + timedelta(days=d), time(h, m), tzinfo=zone)
        for d in (0, 1)
        for h in hours
        for m in minutes
    )
    upcoming = next((r for r in runs if r > local), runs[0] + timedelta(days=1))
    return {
        "times": ", ".join(f"{h:02d}:{m:02d}" for h in sorted(hours) for m in sorted(minutes)),
        "zone": zone.key,
        "next": upcoming,
    }


# -- reading the result --------------------------------------------------------------------------


def recommendations_ranked(recs) -> list[Recommendation]:
    """Open recommendations, largest impact (GPU-hours at stake) first."""
    return sorted(
        recs,
        key=lambda r: (-float(r.evidence.get("impact_gpu_hours") or 0), -float(_score(r)), r.pk),
    )


def _score(rec: Recommendation) -> float:
    return float(rec.evidence.get("score") or 0)


def simulation_effect(rec: Recommendation) -> dict | None:
    """The simulated effect of a recommendation's change: ``None`` without a run; the run's
    state while it runs; once done, the headline figures before and after, overall and
    for the recommendation's tenant."""
    run = rec.simulation
    if run is None:
        return None
    effect = {"run": run.pk, "state": run.state, "progress": run.progress}
    if run.state == SimulationState.FAILED:
        effect["error"] = run.error
    if run.state != SimulationState.DONE or not run.result:
        return effect
    before, after = run.result["baseline"]["summary"], run.result["changed"]["summary"]
    effect["overall"] = {
        key: [before.get(key), after.get(key)]
        for key in ("wait_avg_s", "wait_p95_s", "utilization", "unschedulable", "preemptions")
        if key in before
    }
    if rec.tenant is not None:
        row = next(
            (r for r in run.result.get("comparison", []) if r["tenant"] == rec.tenant.slug), None
        )
        if row:
            effect["tenant"] = {
                "tenant": rec.tenant.slug,
                "wait_p95_s": [row["wait_p95_before_s"], row["wait_p95_after_s"]],
                "wait_avg_s": [row["wait_avg_before_s"], row["wait_avg_after_s"]],
                "gpu_hours": [row["gpu_hours_before"], row["gpu_hours_after"]],
                "guaranteed": [row["guaranteed_before"], row["guaranteed_after"]],
            }
    return effect
