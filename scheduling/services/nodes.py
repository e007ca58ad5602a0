"""What node agents report (register, heartbeat, started, exited, log) and lost-node handling."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Subquery
from django.utils import timezone

from portal.audit.services import audit_record
from scheduling.agent.protocol import stop_message

from ..choices import (
    ACTIVE_STATES,
    STOP_REASON_END_STATE,
    GpuHealth,
    JobState,
    NodeState,
    ReclaimKind,
    StopReason,
)
from ..models import Allocation, Gpu, Job, Node, ResourcePool, WorkloadPolicy
from .enqueue import dispatch_on_commit
from .lifecycle import (
    ConcurrentChange,
    IllegalTransition,
    job_event,
    job_transition,
    requeue_fields,
)
from .messaging import send_node_message
from .waste import gpu_hours_left, reclaim_record_add

#: Log cap of a job whose workload type has no policy (the policy's default).
DEFAULT_LOG_CAP_MB = 100

log = logging.getLogger(__name__)


def _ts(value: float | None) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC) if value else timezone.now()


def _stop_orphan(node_name: str, job_id: int, attempt: int, why: str) -> None:
    """The agent runs something the portal no longer places there: stop it (nothing keeps GPUs it should not)."""
    message = stop_message(job_id=job_id, attempt=attempt, reason=StopReason.LOST, grace_seconds=10)
    log.warning("stopping orphan job %s attempt %s on %s: %s", job_id, attempt, node_name, why)
    transaction.on_commit(lambda: send_node_message(node_name, message))


# --- register and heartbeat -----------------------------------------------------------------


@transaction.atomic
def node_register(report: dict) -> Node:
    """Create or update the node and its GPUs from the agent's discovery."""
    now = timezone.now()
    pool_name = report.get("pool") or "general"
    pool, created = ResourcePool.objects.get_or_create(name=pool_name)
    if created:
        log.warning("node %s registered into new pool %s", report["node"], pool_name)
    node, _ = Node.objects.select_for_update().get_or_create(
        name=report["node"], defaults={"pool": pool}
    )
    was_down = node.state == NodeState.DOWN
    node.pool = pool
    node.hostname = report.get("hostname", "")[:255]
    node.agent_version = str(report.get("agent_version", ""))[:40]
    node.backend = report.get("backend", "")[:20]
    node.cpus = int(report.get("cpus") or 0)
    node.memory_mb = int(report.get("memory_mb") or 0)
    node.isolation = _isolation(report.get("isolation"))
    node.registered_at = node.last_heartbeat = now
    if was_down:
        node.state = NodeState.READY
    node.save()
    seen = set()
    for item in report.get("gpus", []):
        gpu = (
            Gpu.objects.filter(uuid=item["uuid"]).first()
            or Gpu.objects.filter(node=node, index=item["index"]).first()
        )
        gpu = gpu or Gpu(node=node, index=item["index"], uuid=item["uuid"])
        gpu.node, gpu.index, gpu.uuid = node, item["index"], item["uuid"]
        gpu.model, gpu.memory_mb, gpu.health = (
            item["model"],
            int(item["memory_mb"]),
            GpuHealth.HEALTHY,
        )
        gpu.save()
        seen.add(gpu.pk)
    # A GPU the agent no longer sees is unhealthy (fell off the bus), not deleted: allocations refer to it.
    node.gpus.exclude(pk__in=seen).update(health=GpuHealth.UNHEALTHY)
    if was_down:
        audit_record(action="node.up", target=node, reason="agent registered again")
    _reconcile_jobs(node, report.get("jobs", []))
    dispatch_on_commit()
    return node


def _isolation(reported) -> dict:
    """What the agent said it enforces; an agent too old to say enforces nothing known."""
    if not isinstance(reported, dict):
        return {"reported": False, "notes": ["the agent did not report what it enforces"]}
    notes = reported.get("notes")
    return {
        "reported": True,
        "run_as_user": bool(reported.get("run_as_user")),
        "cgroup": bool(reported.get("cgroup")),
        "cgroup_controllers": [str(c)[:20] for c in reported.get("cgroup_controllers") or []][:10],
        "device_isolation": bool(reported.get("device_isolation")),
        "notes": [str(n)[:300] for n in notes][:10] if isinstance(notes, list) else [],
    }


def _reconcile_jobs(node: Node, reported: list[dict]) -> None:
    """Jobs the agent runs that the portal does not place on this node are stopped."""
    active = {
        (job_id, attempt)
        for job_id, attempt in Allocation.objects.filter(
            node=node, released_at__isnull=True
        ).values_list("job_id", "job__requeue_count")
    }
    for item in reported:
        if item.get("running") and (item["job_id"], item["attempt"]) not in active:
            _stop_orphan(node.name, item["job_id"], item["attempt"], "not allocated here")


@transaction.atomic
def node_heartbeat(report: dict) -> Node | None:
    """Store GPU samples, zombies and the last-active time of each running job."""
    now = _ts(report.get("sent_at"))
    node = Node.objects.filter(name=report["node"]).first()
    if node is None:
        log.warning("heartbeat from unregistered node %s", report["node"])
        return None
    node.last_heartbeat = timezone.now()
    node.zombies = report.get("zombies", [])[:100]
    fields = ["last_heartbeat", "zombies"]
    if node.state == NodeState.DOWN and _sent_after_down(node, now):
        node.state = NodeState.READY
        fields.append("state")
        audit_record(action="node.up", target=node, reason="heartbeats resumed")
        dispatch_on_commit()
    node.save(update_fields=fields)
    gpus = {g.index: g for g in node.gpus.all()}
    changed = []
    for sample in report.get("gpus", []):
        gpu = gpus.get(sample["index"])
        if gpu is None:
            continue
        gpu.utilization = sample.get("utilization")
        gpu.memory_used_mb = sample.get("memory_used_mb")
        gpu.temperature_c = sample.get("temperature_c")
        gpu.power_w = sample.get("power_w")
        gpu.sampled_at = now
        changed.append(gpu)
    Gpu.objects.bulk_update(
        changed, ["utilization", "memory_used_mb", "temperature_c", "power_w", "sampled_at"]
    )
    _mark_active_jobs(node, {g.pk: g.utilization for g in changed}, now)
    _reconcile_jobs(node, report.get("jobs", []))
    return node


def _sent_after_down(node: Node, sent_at: datetime) -> bool:
    """A heartbeat revives a down node only if it was sent after the node was marked down
    (a late message from before the outage must not bring a dead node back)."""
    from portal.audit.models import AuditEvent

    down_at = (
        AuditEvent.objects.filter(
            action="node.down", target_type="scheduling.node", target_id=str(node.pk)
        )
        .order_by("-id")
        .values_list("created_at", flat=True)
        .first()
    )
    return down_at is None or sent_at > down_at


def _mark_active_jobs(node: Node, utilization: dict[int, float | None], now: datetime) -> None:
    """A job is active when any of its GPUs is at or above its policy's idle threshold."""
    thresholds = dict(
        WorkloadPolicy.objects.values_list("workload_type", "idle_utilization_threshold")
    )
    active_jobs = set()
    for job_id, gpu_id, workload_type in Allocation.objects.filter(
        node=node, released_at__isnull=True, job__state=JobState.RUNNING
    ).values_list("job_id", "gpu_id", "job__workload_type"):
        value = utilization.get(gpu_id)
        if value is not None and value >= thresholds.get(workload_type, 5.0):
            active_jobs.add(job_id)
    if active_jobs:
        # Conditional: a heartbeat handled late must not move the last active time back.
        Job.objects.filter(pk__in=active_jobs).filter(
            Q(last_active_at__isnull=True) | Q(last_active_at__lt=now)
        ).update(last_active_at=now)


# --- job reports ----------------------------------------------------------------------------


def _current_job(report: dict) -> Job | None:
    """The job a report is about, or None if the report is about an older attempt."""
    job = Job.objects.select_for_update().filter(pk=report["job_id"]).first()
    if job is None or job.attempt != int(report.get("attempt", 0)):
        return None
    return job


def _allocated_here(job: Job, node_name: str) -> bool:
    return job.allocations.filter(node__name=node_name, released_at__isnull=True).exists()


@transaction.atomic
def job_started(report: dict) -> Job | None:
    job = _current_job(report)
    node_name = report["node"]
    if job is None or not _allocated_here(job, node_name):
        _stop_orphan(
            node_name, report["job_id"], report.get("attempt", 0), "started but not placed here"
        )
        return None
    started_at = _ts(report.get("started_at"))
    if job.state == JobState.ADMITTED:
        job_transition(
            job,
            JobState.RUNNING,
            kind="started",
            message=f"Started on {node_name} (pid {report.get('pid')}).",
            data={"node": node_name, "pid": report.get("pid")},
            started_at=started_at,
            last_active_at=started_at,
        )
    else:
        job_event(
            job,
            "started",
            f"Started on {node_name} (pid {report.get('pid')}).",
            data={"node": node_name, "pid": report.get("pid")},
        )
    return job


def _end_state(job: Job, report: dict) -> tuple[str, str]:
    code, sig = report.get("exit_code"), report.get("signal")
    how = f"exit code {code}" if code is not None else (f"signal {sig}" if sig else "unknown exit")
    if job.state == JobState.STOPPING and job.stop_reason:
        return STOP_REASON_END_STATE[
            StopReason(job.stop_reason)
        ], f"Stopped ({job.stop_reason}), {how}."
    if report.get("stop_reason") == "launch_failed":
        return JobState.FAILED, f"Launch failed: {report.get('message', '')}"
    if code == 0:
        return JobState.SUCCEEDED, "Finished with exit code 0."
    return JobState.FAILED, f"Failed with {how}." + (
        f" {report['message']}" if report.get("message") else ""
    )


@transaction.atomic
def job_exited(report: dict) -> Job | None:
    """Release the node's GPUs at once; when the job's last node exits, set its end state."""
    job = _current_job(report)
    node_name = report["node"]
    if job is None:
        return None
    now = _ts(report.get("finished_at"))
    released = Allocation.objects.filter(
        job=job, node__name=node_name, released_at__isnull=True
    ).update(released_at=now)
    if not released and job.state not in ACTIVE_STATES:
        return job  # a duplicate report
    remaining = job.allocations.filter(released_at__isnull=True)
    if remaining.exists():
        job_event(
            job,
            "node_exited",
            f"Process on {node_name} exited ({report.get('exit_code')}).",
            data=report,
        )
        if report.get("exit_code") not in (0, None) and job.state in (
            JobState.ADMITTED,
            JobState.RUNNING,
        ):
            from .stopping import job_stop

            job_stop(
                job=job,
                reason=StopReason.CANCELLED,
                message=f"A process of the gang failed on {node_name}.",
            )
        return job
    state, message = _end_state(job, report)
    fields = {
        "finished_at": now,
        "exit_code": report.get("exit_code"),
        "exit_signal": report.get("signal"),
    }
    if state == JobState.FAILED:
        fields["failure_message"] = message[:2000]
    job_transition(
        job, state, kind=state.lower(), message=message, data={"node": node_name}, **fields
    )
    _requeue_if_allowed(job, now)
    dispatch_on_commit()
    return job


def _requeue_if_allowed(job: Job, now: datetime) -> None:
    """A preempted or lost job whose policy allows it goes back to PENDING as a new attempt."""
    if job.state not in (JobState.PREEMPTED, JobState.LOST):
        return
    policy = WorkloadPolicy.objects.filter(workload_type=job.workload_type).first()
    allowed = policy is None or (
        policy.requeue_on_preemption if job.state == JobState.PREEMPTED else policy.requeue_on_lost
    )
    counter = (
        {"preemption_count": F("preemption_count") + 1} if job.state == JobState.PREEMPTED else {}
    )
    if counter:
        Job.objects.filter(pk=job.pk).update(**counter)
        job.preemption_count += 1
    if not allowed:
        return
    preempted = job.state == JobState.PREEMPTED
    why = "preempted" if preempted else "its node was lost"
    gpus = job.total_gpus
    hours = gpu_hours_left(job, gpus, now)
    job_transition(
        job,
        JobState.PENDING,
        kind="requeued",
        message=f"Requeued because {why}.",
        now=now,
        **requeue_fields(job, now),
    )
    reclaim_record_add(
        kind=ReclaimKind.PREEMPTION_REQUEUE if preempted else ReclaimKind.LOST_REQUEUE,
        job=job,
        now=now,
        gpus=gpus,
        gpu_hours=hours,
    )


def job_log_path(job_id: int, attempt: int) -> Path:
    return Path(settings.SLUICE_LOG_DIR) / str(job_id) / f"attempt-{attempt}.log"


def job_log_append(report: dict) -> None:
    """Write a chunk of a job's output at its offset (idempotent: a resent chunk overwrites
    itself). What lies beyond the job's log cap (its policy's ``log_cap_mb``) is dropped and
    a marker says so; the agent stops shipping there too, this bounds what any agent sends."""
    job_id, attempt = int(report["job_id"]), int(report.get("attempt", 0))
    cap = _log_cap_bytes(job_id)
    data = str(report.get("data", "")).encode("utf-8", errors="replace")
    offset = int(report.get("offset", 0))
    if offset >= cap:
        data, offset = log_truncated_marker(cap), cap
    elif offset + len(data) > cap:
        data = data[: cap - offset] + log_truncated_marker(cap)
    path = job_log_path(job_id, attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "r+b" if path.exists() else "w+b") as handle:
        handle.seek(offset)
        handle.write(data)
        size = handle.seek(0, 2)
    Job.objects.filter(pk=job_id, requeue_count=attempt).update(log_size=size)


def log_truncated_marker(cap: int) -> bytes:
    return f"\n[sluice: log truncated at {cap} bytes; the job goes on running]\n".encode()


def _log_cap_bytes(job_id: int) -> int:
    cap_mb = (
        WorkloadPolicy.objects.filter(
            workload_type=Subquery(Job.objects.filter(pk=job_id).values("workload_type")[:1])
        )
        .values_list("log_cap_mb", flat=True)
        .first()
    )
    return (cap_mb or DEFAULT_LOG_CAP_MB) * 1024 * 1024


# --- lost nodes -----------------------------------------------------------------------------


@transaction.atomic
def node_mark_down(*, node: Node, reason: str, actor=None) -> list[Job]:
    """The node is gone: release its GPUs, and requeue or fail its jobs by policy (LOST)."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.state == NodeState.DOWN:
        return []
    before = node.state
    node.state = NodeState.DOWN
    node.save(update_fields=["state"])
    now = timezone.now()
    job_ids = Allocation.objects.filter(node=node, released_at__isnull=True).values("job_id")
    affected = list(Job.objects.filter(pk__in=job_ids, state__in=ACTIVE_STATES).select_for_update())
    audit_record(
        action="node.down",
        target=node,
        actor=actor,
        reason=reason,
        before={"state": before},
        after={"state": NodeState.DOWN, "jobs": [j.pk for j in affected]},
    )
    for job in affected:
        job.allocations.filter(released_at__isnull=True).update(released_at=now)
        try:
            _end_after_loss(job, node, now, reason)
        except (IllegalTransition, ConcurrentChange):
            log.exception("could not end job %s after node %s was lost", job.pk, node.name)
    dispatch_on_commit()
    return affected


def _end_after_loss(job: Job, node: Node, now: datetime, reason: str) -> None:
    message = f"Node {node.name} is down: {reason}."
    if job.state == JobState.STOPPING and job.stop_reason not in (
        "",
        StopReason.PREEMPTED,
        StopReason.LOST,
    ):
        job_transition(
            job,
            STOP_REASON_END_STATE[StopReason(job.stop_reason)],
            message=message,
            finished_at=now,
        )
        return
    target = JobState.PREEMPTED if job.stop_reason == StopReason.PREEMPTED else JobState.LOST
    job_transition(job, target, message=message, finished_at=now, failure_message=message)
    _requeue_if_allowed(job, now)


def nodes_sweep_lost(now: datetime | None = None) -> list[str]:
    """Mark nodes without a heartbeat for SLUICE_NODE_LOST_SECONDS as down."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.SLUICE_NODE_LOST_SECONDS)
    lost = Node.objects.exclude(state=NodeState.DOWN).filter(last_heartbeat__lt=cutoff)
    names = []
    for node in lost:
        node_mark_down(
            node=node, reason=f"no heartbeat since {node.last_heartbeat:%Y-%m-%d %H:%M:%S}"
        )
        names.append(node.name)
    return names
