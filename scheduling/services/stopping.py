"""Stopping a placed job: SIGTERM now, SIGKILL after the policy's grace (done by the agent)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from scheduling.agent.protocol import stop_message

from ..choices import JobState
from ..models import Job, WorkloadPolicy
from .lifecycle import job_transition
from .messaging import send_node_messages


def grace_seconds_for(job: Job) -> int:
    policy = WorkloadPolicy.objects.filter(workload_type=job.workload_type).first()
    return policy.stop_grace_seconds if policy else 30


def stop_messages(job: Job, reason: str, grace: int) -> list[tuple[str, dict]]:
    nodes = sorted(
        set(job.allocations.filter(released_at__isnull=True).values_list("node__name", flat=True))
    )
    return [
        (name, stop_message(job_id=job.pk, attempt=job.attempt, reason=reason, grace_seconds=grace))
        for name in nodes
    ]


@transaction.atomic
def job_stop(*, job: Job, reason: str, message: str, actor=None, data: dict | None = None) -> Job:
    """Move an admitted or running job to STOPPING and tell its nodes to stop it.

    The job reaches its end state (from ``reason``) when the agent reports the exit.
    """
    grace = grace_seconds_for(job)
    now = timezone.now()
    job_transition(
        job,
        JobState.STOPPING,
        kind=f"stop_{reason}",
        message=message,
        actor=actor,
        data={"reason": reason, "grace_seconds": grace, **(data or {})},
        stop_reason=reason,
        stop_requested_at=now,
        now=now,
    )
    messages = stop_messages(job, reason, grace)
    transaction.on_commit(lambda: send_node_messages(messages))
    return job
