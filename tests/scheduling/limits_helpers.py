"""Helpers shared by the runtime-limit, extension, idle-reclaim and recovery tests."""

from datetime import UTC, datetime

from audit.models import AuditEvent
from scheduling.choices import JobState
from scheduling.models import Notification
from scheduling.services import nodes
from tests import factories as f

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def placed(world, *, gpus=2, state=JobState.RUNNING, node=0, user=None, **fields):
    """A job of the member (or ``user``) holding ``gpus`` GPUs of ``world.nodes[node]``."""
    return f.placed_job(
        gpus=list(world.nodes[node].gpus.order_by("index"))[:gpus],
        state=state,
        queue=world.queue,
        project=world.project,
        submitted_by=user or world.member,
        **fields,
    )


def report_exit(job, *, exit_code=None, signal=15, stop_reason=None, at=None):
    """The ``exited`` report of each node the job holds GPUs on."""
    names = sorted(set(job.allocations.values_list("node__name", flat=True)))
    for name in names:
        nodes.job_exited(
            {
                "type": "exited",
                "node": name,
                "job_id": job.pk,
                "attempt": job.attempt,
                "exit_code": exit_code,
                "signal": signal,
                "stop_reason": stop_reason,
                "message": "",
                "finished_at": (at or T0).timestamp(),
            }
        )


def audits(action, job=None):
    qs = AuditEvent.objects.filter(action=action)
    if job is not None:
        qs = qs.filter(target_type="scheduling.job", target_id=str(job.pk))
    return list(qs)


def notes(user, kind):
    return list(Notification.objects.filter(user=user, kind=kind))


def stops(outbox, job, reason=None):
    return [
        (node, m)
        for node, m in outbox
        if m["type"] == "stop"
        and m["job_id"] == job.pk
        and (reason is None or m["reason"] == reason)
    ]
