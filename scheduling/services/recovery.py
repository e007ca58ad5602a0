"""Recovering GPUs held by nothing useful: stuck launches, zombie GPU processes, and the
retention of job logs (DESIGN §4 step 4).

- **Stuck launch**: a job ``ADMITTED`` but not ``RUNNING`` ``SLUICE_STUCK_LAUNCH_SECONDS``
  after its admission goes back to ``PENDING`` as a new attempt; its GPUs are released and
  its nodes are told to stop the old attempt (reason ``lost``) should it start after all.
- **Zombie GPU processes** (``Node.zombies``, from heartbeats: GPU processes of no job) are
  shown on the nodes page and killed by this rule: a zombie reported for at least one
  control interval (``SLUICE_CONTROL_INTERVAL``, so a process caught between a job's end and
  the agent's clean-up is spared) is killed when the workload policy governing its GPU has
  ``kill_zombies``. The governing policy is that of the job the GPU is allocated to, or, on
  a free GPU, of the last job that held it. A zombie on a GPU no job ever held is only shown.
  The kill is asked once (``ZombieProcess.kill_requested_at``); the agent refuses to kill a
  process of one of its jobs or one that no longer uses a GPU.
- **Retention**: a job's log folder (``SLUICE_LOG_DIR/<job id>/``) is deleted
  ``retention_days`` (its policy's) after the job finished; folders of jobs that no longer
  exist after the longest retention. Checked every ``SLUICE_RETENTION_CLEANUP_SECONDS``;
  each run writes one ``retention.cleanup`` audit event per tenant listing what it deleted.
  The agents keep checkpoints for the same number of days (the launch carries it).
- **Job timelines**: the events of a job that ended more than
  ``SLUICE_JOB_EVENT_RETENTION_DAYS`` ago are deleted but its final one (the line of its
  end), in batches of jobs taken in the order they ended from where the last run stopped;
  0 keeps them forever. The job row, its outcome and the audit log stay.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import audit_record
from scheduling.agent.protocol import kill_process_message, stop_message

from ..choices import ACTIVE_STATES, JobState, NodeState, NotificationKind, ReclaimKind, StopReason
from ..models import Allocation, Gpu, Job, JobEvent, Node, WorkloadPolicy, ZombieProcess
from .enqueue import dispatch_on_commit
from .lifecycle import job_transition, requeue_fields
from .messaging import send_node_messages
from .stopping import grace_seconds_for
from .waste import gpu_hours_left, human_duration, notify_owner, reclaim_record_add

log = logging.getLogger(__name__)

RETENTION_CLEANUP_KEY = "sluice:retention-cleanup"
JOB_EVENTS_RETENTION_KEY = "sluice:job-events-retention"
# Where the last pruning of job timelines stopped: (finished_at ISO, job id) of its last
# job. Lost with the cache, the next run starts again from the oldest job (harmless).
JOB_EVENTS_PRUNED_UNTIL_KEY = "sluice:job-events-pruned-until"
JOB_EVENTS_BATCH_JOBS = 500
JOB_EVENTS_BATCHES_PER_RUN = 40
_SQLITE_CHUNK = 900


def _guarded(step, pk: int, *args):
    """One item failing must not stop the others; it is tried again on the next sweep."""
    try:
        return step(pk, *args)
    except Exception:
        log.exception("%s failed for %s", step.__name__, pk)
        return None


# --- stuck launches ----------------------------------------------------------------------------


def stuck_launches_requeue(now: datetime | None = None) -> list[int]:
    """Requeue the jobs admitted more than ``SLUICE_STUCK_LAUNCH_SECONDS`` ago that never
    started; returns their ids."""
    now = now or timezone.now()
    cutoff = _reports_seen_until(now) - timedelta(seconds=settings.SLUICE_STUCK_LAUNCH_SECONDS)
    stuck = Job.objects.filter(state=JobState.ADMITTED, admitted_at__lte=cutoff)
    return [
        pk for pk in stuck.values_list("pk", flat=True) if _guarded(_requeue_stuck, pk, now, cutoff)
    ]


def _reports_seen_until(now: datetime) -> datetime:
    """Up to when the nodes' reports are known to be handled: the send time of the last
    probe a reports worker handled (sent each sweep through the reports queue), else now.
    A ``started`` report queued behind a backlog (workers down or restarting) is not a
    stuck launch: its job must not be requeued, and launched again, before it is read."""
    from .nodes import REPORTS_PROBE_KEY

    probe = cache.get(REPORTS_PROBE_KEY)
    if probe is None:
        return now
    return min(now, datetime.fromtimestamp(probe, tz=UTC))


@transaction.atomic
def _requeue_stuck(pk: int, now: datetime, cutoff: datetime) -> bool:
    job = (
        Job.objects.select_for_update(of=("self",))
        .select_related("tenant", "submitted_by")
        .filter(pk=pk, state=JobState.ADMITTED, admitted_at__lte=cutoff)
        .first()
    )
    if job is None:
        return False
    held = job.allocations.filter(released_at__isnull=True)
    nodes = sorted(set(held.values_list("node__name", flat=True)))
    gpus = held.count()
    hours = gpu_hours_left(job, gpus, now)
    old_attempt, waited = job.attempt, (now - job.admitted_at).total_seconds()
    held.update(released_at=now)
    message = (
        f"Requeued: not running {human_duration(waited)} after its admission "
        f"(launch stuck on {', '.join(nodes) or 'no node'})."
    )
    job_transition(
        job,
        JobState.PENDING,
        kind="requeued",
        message=message,
        data={"reason": "stuck_launch", "nodes": nodes, "attempt": old_attempt},
        now=now,
        **requeue_fields(job, now),
    )
    audit_record(
        action="job.requeue",
        target=job,
        tenant=job.tenant,
        before={"state": JobState.ADMITTED, "attempt": old_attempt, "nodes": nodes},
        after={"state": job.state, "attempt": job.attempt, "kind": "stuck_launch"},
        reason=message,
    )
    reclaim_record_add(
        kind=ReclaimKind.STUCK_LAUNCH,
        job=job,
        now=now,
        gpus=gpus,
        gpu_hours=hours,
        detail={"nodes": nodes, "attempt": old_attempt},
    )
    notify_owner(job, NotificationKind.JOB_REQUEUED, f"Job {job.pk} ({job.name}): {message}")
    grace = grace_seconds_for(job)
    messages = [
        (
            name,
            stop_message(
                job_id=job.pk, attempt=old_attempt, reason=StopReason.LOST, grace_seconds=grace
            ),
        )
        for name in nodes
    ]
    transaction.on_commit(lambda: send_node_messages(messages))
    dispatch_on_commit()
    return True


# --- zombie GPU processes ----------------------------------------------------------------------


def _reported_zombies(node: Node) -> dict[tuple[int, int], dict]:
    zombies = {}
    for item in node.zombies or []:
        try:
            zombies[(int(item["gpu_index"]), int(item["pid"]))] = item
        except (KeyError, TypeError, ValueError):
            continue
    return zombies


def _track(node: Node, now: datetime) -> None:
    """Mirror the node's last reported zombies into ``ZombieProcess`` rows."""
    reported = _reported_zombies(node)
    known = {(z.gpu_index, z.pid): z for z in node.zombie_processes.all()}
    gone = [z.pk for key, z in known.items() if key not in reported]
    ZombieProcess.objects.filter(pk__in=gone).delete()
    ZombieProcess.objects.filter(
        node=node, pk__in=[z.pk for key, z in known.items() if key in reported]
    ).update(last_seen_at=now)
    ZombieProcess.objects.bulk_create(
        [
            ZombieProcess(
                node=node,
                gpu_index=gpu_index,
                pid=pid,
                name=str(item.get("name") or "")[:200],
                memory_mb=item.get("memory_mb") if isinstance(item.get("memory_mb"), int) else None,
                first_seen_at=now,
                last_seen_at=now,
            )
            for (gpu_index, pid), item in reported.items()
            if (gpu_index, pid) not in known
        ],
        ignore_conflicts=True,
    )


def governing_job(node: Node, gpu_index: int) -> tuple[Job | None, bool]:
    """The job whose policy rules a GPU: (the job it is allocated to, True), else (the last
    job that held it, False), else (None, False)."""
    gpu = Gpu.objects.filter(node=node, index=gpu_index).first()
    if gpu is None:
        return None, False
    allocations = Allocation.objects.filter(gpu=gpu).select_related("job", "job__tenant")
    current = allocations.filter(released_at__isnull=True).first()
    if current is not None:
        return current.job, True
    last = allocations.order_by("-released_at", "-id").first()
    return (last.job, False) if last else (None, False)


def zombies_sweep(now: datetime | None = None) -> dict:
    """Track the zombies nodes report and kill those the rule (see the module) says to."""
    now = now or timezone.now()
    with_zombies = Node.objects.exclude(state=NodeState.DOWN).exclude(zombies=[])
    tracked = Node.objects.filter(zombie_processes__isnull=False)
    for node in (with_zombies | tracked).distinct():
        _track(node, now)
    ripe = ZombieProcess.objects.filter(
        kill_requested_at__isnull=True,
        first_seen_at__lte=now - timedelta(seconds=settings.SLUICE_CONTROL_INTERVAL),
    ).exclude(node__state=NodeState.DOWN)
    policies = {p.workload_type: p for p in WorkloadPolicy.objects.filter(kill_zombies=True)}
    killed = 0
    if policies:
        for pk in ripe.values_list("pk", flat=True):
            killed += bool(_guarded(_kill_one, pk, policies, now))
    return {"tracked": ZombieProcess.objects.count(), "killed": killed}


@transaction.atomic
def _kill_one(pk: int, policies: dict[str, WorkloadPolicy], now: datetime) -> bool:
    zombie = (
        ZombieProcess.objects.select_for_update(of=("self",))
        .select_related("node")
        .filter(pk=pk, kill_requested_at__isnull=True)
        .first()
    )
    if zombie is None:
        return False
    job, current = governing_job(zombie.node, zombie.gpu_index)
    if job is None or job.workload_type not in policies:
        return False
    ZombieProcess.objects.filter(pk=pk).update(kill_requested_at=now)
    whose = f"{'allocated to' if current else 'last used by'} job {job.pk}"
    reason = (
        f"zombie on GPU {zombie.gpu_index} ({whose}; the {job.workload_type} policy kills zombies)"
    )
    message = kill_process_message(pid=zombie.pid, gpu_index=zombie.gpu_index, reason=reason)
    node_name = zombie.node.name
    transaction.on_commit(lambda: send_node_messages([(node_name, message)]))
    seen = (now - zombie.first_seen_at).total_seconds()
    detail = {
        "pid": zombie.pid,
        "gpu_index": zombie.gpu_index,
        "name": zombie.name,
        "memory_mb": zombie.memory_mb,
        "job": job.pk,
        "gpu_allocated": current,
        "seen_seconds": round(seen),
    }
    audit_record(
        action="node.kill_zombie",
        target=zombie.node,
        tenant=job.tenant,
        after=detail,
        reason=reason,
    )
    reclaim_record_add(
        kind=ReclaimKind.ZOMBIE_KILL,
        job=job,
        node=zombie.node,
        now=now,
        gpus=1,
        gpu_hours=seen / 3600,
        detail=detail,
    )
    return True


# --- retention of job logs ---------------------------------------------------------------------

_ENDED = tuple(
    s for s in JobState.values if s not in (*ACTIVE_STATES, JobState.PENDING, JobState.HELD)
)


def retention_cleanup(now: datetime | None = None) -> dict | str:
    """The sweep's entry: at most once every ``SLUICE_RETENTION_CLEANUP_SECONDS``."""
    if not cache.add(RETENTION_CLEANUP_KEY, 1, timeout=settings.SLUICE_RETENTION_CLEANUP_SECONDS):
        return "not due"
    from accounts.services import api_tokens_expired_delete

    figures = job_logs_retention_cleanup(now=now)
    api_tokens_expired_delete(now=now or timezone.now())
    return figures


def _log_folders(root: Path) -> dict[int, Path]:
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return {}
    return {
        int(e.name): Path(e.path)
        for e in entries
        if e.name.isdigit() and e.is_dir(follow_symlinks=False)
    }


def _expired_folders(folders: dict[int, Path], now: datetime) -> dict[int, object]:
    """The job ids whose log folder is past its retention, with the job's tenant (or None)."""
    days = dict(WorkloadPolicy.objects.values_list("workload_type", "retention_days"))
    longest = max(days.values(), default=14)
    ids = sorted(folders)
    expired: dict[int, object] = {}
    for start in range(0, len(ids), _SQLITE_CHUNK):
        chunk = ids[start : start + _SQLITE_CHUNK]
        found = set()
        for job in Job.objects.filter(pk__in=chunk).select_related("tenant"):
            found.add(job.pk)
            keep = timedelta(days=days.get(job.workload_type, longest))
            if job.state in _ENDED and job.finished_at and job.finished_at + keep <= now:
                expired[job.pk] = job.tenant
        for pk in set(chunk) - found:  # the job row is gone: keep its logs the longest time
            modified = datetime.fromtimestamp(folders[pk].stat().st_mtime, tz=now.tzinfo)
            if modified + timedelta(days=longest) <= now:
                expired[pk] = None
    return expired


def _delete_folder(path: Path) -> tuple[int, int]:
    """Delete a log folder; returns (files, bytes) deleted."""
    files = size = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            files += 1
            with contextlib.suppress(OSError):  # vanished meanwhile: nothing to count
                size += os.lstat(os.path.join(dirpath, name)).st_size
    shutil.rmtree(path)
    return files, size


def job_logs_retention_cleanup(*, now: datetime | None = None) -> dict:
    """Delete the log folders past their retention; audit what was deleted, per tenant."""
    now = now or timezone.now()
    folders = _log_folders(Path(settings.SLUICE_LOG_DIR))
    expired = _expired_folders(folders, now)
    by_tenant: dict[object, dict] = defaultdict(lambda: {"jobs": [], "files": 0, "bytes": 0})
    for pk, tenant in sorted(expired.items()):
        try:
            files, size = _delete_folder(folders[pk])
        except OSError:
            log.exception("could not delete the logs of job %s", pk)
            continue
        entry = by_tenant[tenant]
        entry["jobs"].append(pk)
        entry["files"] += files
        entry["bytes"] += size
    for tenant, entry in by_tenant.items():
        audit_record(
            action="retention.cleanup",
            target_type="scheduling.job_logs",
            target_label=f"logs of {len(entry['jobs'])} job(s)",
            tenant=tenant,
            after=entry,
            reason="job logs kept for their workload policy's retention_days after the job finished",
        )
    return {"deleted": sum(len(e["jobs"]) for e in by_tenant.values())}


# --- retention of job timelines ----------------------------------------------------------------


def job_events_retention(now: datetime | None = None) -> dict | str:
    """The sweep's entry: at most once every ``SLUICE_RETENTION_CLEANUP_SECONDS``."""
    if settings.SLUICE_JOB_EVENT_RETENTION_DAYS <= 0:
        return "off"
    if not cache.add(
        JOB_EVENTS_RETENTION_KEY, 1, timeout=settings.SLUICE_RETENTION_CLEANUP_SECONDS
    ):
        return "not due"
    return job_events_retention_cleanup(now=now)


def _events_kept(events: list[tuple[int, int, object]], states: dict[int, str]) -> set[int]:
    """Of ``events`` ((id, job id, data) of some ended jobs), the one kept per job: the
    newest that moved the job to its final state, else its newest."""
    kept: dict[int, tuple[bool, int]] = {}
    for pk, job_id, data in events:
        final = isinstance(data, dict) and data.get("to") == states[job_id]
        kept[job_id] = max(kept.get(job_id, (False, 0)), (final, pk))
    return {pk for _, pk in kept.values()}


def job_events_retention_cleanup(
    *,
    now: datetime | None = None,
    batch: int = JOB_EVENTS_BATCH_JOBS,
    batches: int = JOB_EVENTS_BATCHES_PER_RUN,
) -> dict:
    """Delete the timeline events of jobs that ended more than
    ``SLUICE_JOB_EVENT_RETENTION_DAYS`` ago, each job's final event kept: at most
    ``batches`` batches of ``batch`` jobs, in the order they ended, from where the last
    run stopped. Returns the jobs looked at and the events deleted."""
    now = now or timezone.now()
    days = settings.SLUICE_JOB_EVENT_RETENTION_DAYS
    if days <= 0:
        return {"jobs": 0, "deleted": 0}
    ended = Job.objects.filter(state__in=_ENDED, finished_at__lt=now - timedelta(days=days))
    jobs = deleted = 0
    for _ in range(batches):
        until = cache.get(JOB_EVENTS_PRUNED_UNTIL_KEY)
        rows = ended
        if until:
            at, pk = datetime.fromisoformat(until[0]), until[1]
            rows = rows.filter(Q(finished_at__gt=at) | Q(finished_at=at, pk__gt=pk))
        found = list(
            rows.order_by("finished_at", "pk").values_list("pk", "state", "finished_at")[:batch]
        )
        if not found:
            break
        deleted += _job_events_prune({pk: state for pk, state, _ in found})
        jobs += len(found)
        last = found[-1]
        cache.set(JOB_EVENTS_PRUNED_UNTIL_KEY, (last[2].isoformat(), last[0]), timeout=None)
    if deleted:
        audit_record(
            action="retention.job_events",
            target_type="scheduling.job_events",
            target_label=f"events of {jobs} job(s)",
            after={"jobs": jobs, "events": deleted},
            reason=(
                f"job timelines kept {days} days after the job ended "
                "(SLUICE_JOB_EVENT_RETENTION_DAYS); each job's final event stays"
            ),
        )
    return {"jobs": jobs, "deleted": deleted}


@transaction.atomic
def _job_events_prune(states: dict[int, str]) -> int:
    """Delete the events of these ended jobs ({id: state}) but each one's final event."""
    events = list(
        JobEvent.objects.filter(job_id__in=list(states)).values_list("id", "job_id", "data")
    )
    kept = _events_kept(events, states)
    doomed = [pk for pk, _, _ in events if pk not in kept]
    for start in range(0, len(doomed), _SQLITE_CHUNK):
        JobEvent.objects.filter(pk__in=doomed[start : start + _SQLITE_CHUNK]).delete()
    return len(doomed)
