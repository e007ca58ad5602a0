"""How long a job has waited for GPUs, re-waits included.

A job waits from its submission until the dispatch loop admits it. A preempted (or lost,
or stuck) job that is requeued waits again, from its requeue until its next admission.
Every wait figure the portal shows or returns is the total of those waits, read from
three columns of the job (no query):

- ``queued_at``: when the current attempt's wait began (empty: at submission);
- ``waited_seconds``: the waits of the earlier attempts, summed (added at each requeue by
  :func:`scheduling.services.lifecycle.requeue_fields`);
- ``first_wait_seconds``: the first attempt's wait, kept at the first requeue.

An attempt's wait ends at its admission; an attempt requeued before it ever started (a
stuck launch, a preemption during launch) waited until its requeue.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from .choices import WAITING_STATES
from .models import Job
from .services.waste import human_duration


@dataclass(frozen=True)
class JobWait:
    """A job's waits: ``total_seconds`` = ``first_seconds`` + ``rewait_seconds``."""

    total_seconds: float
    first_seconds: float
    rewait_seconds: float
    current_seconds: float  # the current attempt's wait (still going when ``waiting``)
    waiting: bool
    since: datetime  # when the current attempt's wait began
    requeues: int
    preemptions: int

    @property
    def message(self) -> str:
        """``waited 2 h 10 min in all, 40 min of it after 1 preemption``."""
        verb = "waiting" if self.waiting else "waited"
        if not self.requeues:
            if self.waiting:
                return f"waiting {human_duration(self.total_seconds)} so far"
            return f"waited {human_duration(self.total_seconds)}"
        return (
            f"{verb} {human_duration(self.total_seconds)} in all, "
            f"{human_duration(self.rewait_seconds)} of it after {self._requeues_in_words()}"
        )

    def _requeues_in_words(self) -> str:
        if self.preemptions >= self.requeues:
            return f"{self.preemptions} preemption{'s' if self.preemptions != 1 else ''}"
        return f"{self.requeues} requeue{'s' if self.requeues != 1 else ''}"


def wait_start(job: Job) -> datetime:
    """When the job's current wait began: its last requeue, or its submission."""
    return job.queued_at or job.submitted_at


def attempt_wait_seconds(job: Job, now: datetime) -> float:
    """The current attempt's wait: until ``now`` while the job waits, else until its
    admission (or its end, for a job cancelled before it was admitted)."""
    if job.state in WAITING_STATES:
        end = now
    else:
        end = job.admitted_at or job.finished_at or now
    return max((end - wait_start(job)).total_seconds(), 0.0)


def job_wait(job: Job, now: datetime | None = None) -> JobWait:
    """The job's waits, at ``now`` (default: the present) while it still waits."""
    now = now or timezone.now()
    current = attempt_wait_seconds(job, now)
    earlier = max(job.waited_seconds or 0.0, 0.0)
    total = earlier + current
    if job.requeue_count and job.first_wait_seconds is not None:
        first = min(job.first_wait_seconds, total)
    elif job.requeue_count:
        first = earlier  # requeued before the columns existed and not backfilled
    else:
        first = current
    return JobWait(
        total_seconds=total,
        first_seconds=first,
        rewait_seconds=max(total - first, 0.0),
        current_seconds=current,
        waiting=job.state in WAITING_STATES,
        since=wait_start(job),
        requeues=job.requeue_count,
        preemptions=job.preemption_count,
    )


def requeue_wait_fields(job: Job, now: datetime) -> dict:
    """The wait columns of a job requeued at ``now``: its ending attempt's wait is added to
    the earlier ones (and kept as the first wait if it was the first attempt), and a new
    wait begins."""
    ended = _ended_attempt_wait(job, now)
    fields = {"waited_seconds": (job.waited_seconds or 0.0) + ended, "queued_at": now}
    if job.requeue_count == 0:
        fields["first_wait_seconds"] = ended
    return fields


def _ended_attempt_wait(job: Job, now: datetime) -> float:
    end = job.admitted_at if job.admitted_at and job.started_at else now
    return max((end - wait_start(job)).total_seconds(), 0.0)
