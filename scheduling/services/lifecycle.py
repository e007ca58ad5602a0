"""The one place job states change: legal transitions only, each with a timeline event."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from portal.errors import BusinessError

from ..choices import JobState as S
from ..models import Job, JobEvent
from .enqueue import waiting_changed_on_commit

#: The states of a waiting job (what the dispatch leader keeps a copy of).
WAITING = (S.PENDING, S.HELD)

# DESIGN §5. A preempted or lost job whose policy allows requeue goes back to PENDING.
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.ADMITTED, S.HELD, S.CANCELLED}),
    S.HELD: frozenset({S.PENDING, S.CANCELLED}),
    # ADMITTED -> PENDING: stuck launch requeued; -> SUCCEEDED/FAILED: the exit report overtook "started".
    S.ADMITTED: frozenset({S.RUNNING, S.STOPPING, S.SUCCEEDED, S.FAILED, S.LOST, S.PENDING}),
    S.RUNNING: frozenset({S.STOPPING, S.SUCCEEDED, S.FAILED, S.LOST}),
    S.STOPPING: frozenset(
        {S.CANCELLED, S.PREEMPTED, S.TIMED_OUT, S.RECLAIMED, S.SUCCEEDED, S.FAILED, S.LOST}
    ),
    S.PREEMPTED: frozenset({S.PENDING}),
    S.LOST: frozenset({S.PENDING}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMED_OUT: frozenset(),
    S.RECLAIMED: frozenset(),
}


class IllegalTransition(BusinessError):
    def __init__(self, job: Job, to_state: str) -> None:
        super().__init__(
            f"Job {job.pk} cannot go from {job.state} to {to_state}.",
            code="illegal_transition",
            field="state",
        )


class ConcurrentChange(BusinessError):
    """The job changed state under us (another worker got there first)."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"Job {job.pk} changed state meanwhile; try again.", code="conflict")
        self.status_code = 409


def can_transition(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS[from_state]


@transaction.atomic
def job_transition(
    job: Job,
    to_state: str,
    *,
    kind: str | None = None,
    message: str = "",
    actor=None,
    data: dict | None = None,
    now=None,
    **fields,
) -> Job:
    """Move ``job`` to ``to_state`` if legal, set ``fields``, and write a ``JobEvent``.

    The update is conditional on the state we read, so two workers racing on the same job
    cannot both win: the loser gets ``ConcurrentChange``.
    """
    if not can_transition(job.state, to_state):
        raise IllegalTransition(job, to_state)
    now = now or timezone.now()
    fields = _leaving_the_queue(to_state, fields)
    updated = Job.objects.filter(pk=job.pk, state=job.state).update(state=to_state, **fields)
    if updated != 1:
        raise ConcurrentChange(job)
    from_state = job.state
    if from_state in WAITING or to_state in WAITING:
        waiting_changed_on_commit()
    job.state = to_state
    for key, value in fields.items():
        setattr(job, key, value)
    JobEvent.objects.create(
        job=job,
        created_at=now,
        kind=kind or to_state.lower(),
        message=message,
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        data={"from": from_state, "to": to_state, **(data or {})},
    )
    if to_state in (S.SUCCEEDED, S.TIMED_OUT):
        from .runtime_history import runtime_history_record

        runtime_history_record(job, now=now)  # what runtime prediction learns from
    return job


def _leaving_the_queue(to_state: str, fields: dict) -> dict:
    """A job that stops waiting loses its place in the scheduling order (positions are
    counted from ``pending_rank``; see scheduling.positions)."""
    if to_state in (S.PENDING, S.HELD) or "pending_rank" in fields:
        return fields
    return {**fields, "pending_rank": None}


def requeue_fields(job: Job, now=None) -> dict:
    """What a requeued job's next attempt starts from: a new attempt number, nothing of
    the previous attempt's run, and a new wait from ``now`` with the ended attempt's wait
    kept (see :mod:`scheduling.waits`); the argument ``job_transition(job, PENDING, ...)``
    takes."""
    from ..waits import requeue_wait_fields

    return {
        **requeue_wait_fields(job, now or timezone.now()),
        "requeue_count": job.requeue_count + 1,
        "stop_reason": "",
        "stop_requested_at": None,
        "admitted_at": None,
        "started_at": None,
        "finished_at": None,
        "exit_code": None,
        "exit_signal": None,
        "runtime_warnings_sent": [],
        "idle_warning_sent_at": None,
        "last_active_at": None,
    }


def job_event(
    job: Job, kind: str, message: str = "", *, actor=None, data: dict | None = None, now=None
) -> JobEvent:
    """A timeline line that is not a state change (a warning, a log note, a raise)."""
    return JobEvent.objects.create(
        job=job,
        created_at=now or timezone.now(),
        kind=kind,
        message=message,
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        data=data or {},
    )


@transaction.atomic
def jobs_transition_bulk(
    jobs: list[Job],
    to_state: str,
    *,
    kind: str,
    message_for,
    now=None,
    by_dispatch_leader: bool = False,
    **fields,
) -> None:
    """The bulk form of ``job_transition`` for the dispatch loop: same checks, one UPDATE per state.

    Every job must be in a state that may go to ``to_state``; if any changed meanwhile the
    whole batch fails (the caller's transaction rolls back) instead of half-applying.
    ``by_dispatch_leader``: the leader's own placements, which its copy of the waiting
    jobs follows by itself (no ``waiting_changed_on_commit``).
    """
    now = now or timezone.now()
    fields = _leaving_the_queue(to_state, fields)
    by_state: dict[str, list[Job]] = {}
    for job in jobs:
        if not can_transition(job.state, to_state):
            raise IllegalTransition(job, to_state)
        by_state.setdefault(job.state, []).append(job)
    for from_state, group in by_state.items():
        ids = [j.pk for j in group]
        updated = 0
        for start in range(0, len(ids), 900):  # SQLite allows ~1000 variables a statement
            chunk = ids[start : start + 900]
            updated += Job.objects.filter(pk__in=chunk, state=from_state).update(
                state=to_state, **fields
            )
        if updated != len(ids):
            raise ConcurrentChange(group[0])
    if not by_dispatch_leader and (to_state in WAITING or any(s in WAITING for s in by_state)):
        waiting_changed_on_commit()
    events = []
    for job in jobs:
        events.append(
            JobEvent(
                job=job,
                created_at=now,
                kind=kind,
                message=message_for(job),
                data={"from": job.state, "to": to_state},
            )
        )
        job.state = to_state
        for key, value in fields.items():
            setattr(job, key, value)
    JobEvent.objects.bulk_create(events, batch_size=1000)


@dataclass
class Step:
    """One state change of :func:`jobs_transition_steps`: ``job`` to ``to_state`` with
    ``fields`` set, written with a ``JobEvent`` as ``job_transition`` writes it."""

    job: Job
    to_state: str
    kind: str
    message: str = ""
    data: dict = field(default_factory=dict)
    fields: dict = field(default_factory=dict)


def jobs_transition_steps(steps: Sequence[Step], *, now=None) -> None:
    """The set-based form of ``job_transition`` for jobs that each change in their own way
    (the agent reports of a batch): the same legality checks, events and runtime history,
    applied in order (a job may take several steps: ADMITTED → RUNNING → SUCCEEDED), with
    one UPDATE per set of changed fields and one INSERT of all the events.

    The caller must hold the jobs' rows locked (``select_for_update``) in this transaction
    and pass them as read then: the rows are written by primary key, without the
    conditional update of ``job_transition`` that the lock makes needless. An illegal step
    raises ``IllegalTransition`` before anything is written.
    """
    from .runtime_history import runtime_history_record
    from .sql import rows_update

    now = now or timezone.now()
    changed: dict[int, tuple[Job, dict]] = {}
    events = []
    touches_waiting = False
    for step in steps:
        job = step.job
        if not can_transition(job.state, step.to_state):
            raise IllegalTransition(job, step.to_state)
        touches_waiting = touches_waiting or job.state in WAITING or step.to_state in WAITING
        fields = _leaving_the_queue(step.to_state, step.fields)
        events.append(
            JobEvent(
                job_id=job.pk,
                created_at=now,
                kind=step.kind,
                message=step.message,
                data={"from": job.state, "to": step.to_state, **step.data},
            )
        )
        job.state = step.to_state
        for key, value in fields.items():
            setattr(job, key, value)
        changed.setdefault(job.pk, (job, {}))[1].update({"state": step.to_state, **fields})
    by_columns: dict[tuple[str, ...], list[list]] = {}
    for job, fields in changed.values():
        columns = tuple(sorted(fields))
        by_columns.setdefault(columns, []).append([job.pk, *(fields[c] for c in columns)])
    for columns, rows in by_columns.items():
        rows_update(Job, columns, rows)
    if touches_waiting:
        waiting_changed_on_commit()
    JobEvent.objects.bulk_create(events, batch_size=1000)
    for job, _ in changed.values():
        if job.state in (S.SUCCEEDED, S.TIMED_OUT):  # as job_transition
            runtime_history_record(job, now=now)
