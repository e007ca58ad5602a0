"""scheduling.services.lifecycle: the one place job states change (DESIGN §5)."""

import pytest
from django.db import transaction

from portal.errors import BusinessError
from scheduling.choices import JobState
from scheduling.models import Job, JobEvent
from scheduling.services.lifecycle import (
    TRANSITIONS,
    ConcurrentChange,
    IllegalTransition,
    can_transition,
    job_event,
    job_transition,
    jobs_transition_bulk,
)
from tests import factories as f

LEGAL = sorted((a, b) for a, targets in TRANSITIONS.items() for b in targets)
ILLEGAL = sorted(
    (a, b) for a in JobState.values for b in JobState.values if b not in TRANSITIONS[a]
)


def test_every_state_has_a_rule():
    assert set(TRANSITIONS) == set(JobState.values)


def test_design_lifecycle_paths_are_legal():
    path = [JobState.PENDING, JobState.ADMITTED, JobState.RUNNING, JobState.STOPPING]
    assert all(can_transition(a, b) for a, b in zip(path, path[1:], strict=False))
    assert can_transition(JobState.HELD, JobState.PENDING)
    assert can_transition(JobState.PENDING, JobState.HELD)
    assert can_transition(JobState.PREEMPTED, JobState.PENDING)
    assert can_transition(JobState.LOST, JobState.PENDING)
    for end in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT):
        assert TRANSITIONS[end] == frozenset()


@pytest.mark.parametrize(("from_state", "to_state"), LEGAL)
def test_legal_transition_changes_state_and_writes_an_event(db, from_state, to_state):
    job = f.JobFactory(state=from_state)
    actor = f.UserFactory()

    job_transition(job, to_state, message="why", actor=actor, data={"n": 1}, exit_code=3)

    assert job.state == to_state
    job.refresh_from_db()
    assert job.state == to_state
    assert job.exit_code == 3
    event = JobEvent.objects.get(job=job)
    assert event.kind == to_state.lower()
    assert event.message == "why"
    assert event.actor == actor
    assert event.data == {"from": from_state, "to": to_state, "n": 1}


@pytest.mark.parametrize(("from_state", "to_state"), ILLEGAL)
def test_illegal_transition_raises_and_changes_nothing(db, from_state, to_state):
    job = f.JobFactory(state=from_state)

    with pytest.raises(IllegalTransition) as excinfo:
        job_transition(job, to_state, exit_code=9)

    assert isinstance(excinfo.value, BusinessError)
    assert excinfo.value.status_code == 400
    assert excinfo.value.code == "illegal_transition"
    assert f"from {from_state} to {to_state}" in excinfo.value.message
    job.refresh_from_db()
    assert job.state == from_state
    assert job.exit_code is None
    assert not JobEvent.objects.exists()


def test_custom_event_kind(db):
    job = f.JobFactory(state=JobState.HELD)

    job_transition(job, JobState.PENDING, kind="released")

    assert JobEvent.objects.get().kind == "released"


def test_concurrent_change_is_refused(db):
    job = f.JobFactory(state=JobState.PENDING)
    stale = Job.objects.get(pk=job.pk)
    job_transition(job, JobState.ADMITTED)

    with pytest.raises(ConcurrentChange) as excinfo, transaction.atomic():
        job_transition(stale, JobState.CANCELLED)

    assert excinfo.value.status_code == 409
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED
    assert list(JobEvent.objects.values_list("kind", flat=True)) == ["admitted"]


def test_anonymous_actor_is_stored_as_none(db):
    from django.contrib.auth.models import AnonymousUser

    job = f.JobFactory(state=JobState.PENDING)

    job_transition(job, JobState.HELD, actor=AnonymousUser())

    assert JobEvent.objects.get().actor is None


def test_job_event_is_a_timeline_line_without_a_state_change(db):
    job = f.JobFactory(state=JobState.RUNNING)

    job_event(job, "runtime_warning", "80 % of the runtime used", data={"pct": 80})

    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    event = JobEvent.objects.get()
    assert (event.kind, event.data) == ("runtime_warning", {"pct": 80})


def test_bulk_transition_moves_every_job_and_writes_one_event_each(db):
    jobs = [f.JobFactory(state=JobState.PENDING) for _ in range(3)]
    held = f.JobFactory(state=JobState.HELD)

    jobs_transition_bulk(
        [*jobs, held], JobState.CANCELLED, kind="cancelled", message_for=lambda j: f"bye {j.pk}"
    )

    assert set(Job.objects.values_list("state", flat=True)) == {JobState.CANCELLED}
    events = list(JobEvent.objects.order_by("id"))
    assert len(events) == 4
    assert events[-1].data == {"from": JobState.HELD, "to": JobState.CANCELLED}
    assert events[0].message == f"bye {jobs[0].pk}"


def test_bulk_transition_with_an_illegal_job_changes_nothing(db):
    good = f.JobFactory(state=JobState.PENDING)
    ended = f.JobFactory(state=JobState.SUCCEEDED)

    with pytest.raises(IllegalTransition), transaction.atomic():
        jobs_transition_bulk([good, ended], JobState.ADMITTED, kind="admitted", message_for=str)

    good.refresh_from_db()
    assert good.state == JobState.PENDING
    assert not JobEvent.objects.exists()


def test_bulk_transition_fails_whole_on_a_concurrent_change(db):
    first = f.JobFactory(state=JobState.PENDING)
    second = f.JobFactory(state=JobState.PENDING)
    Job.objects.filter(pk=second.pk).update(state=JobState.HELD)

    with pytest.raises(ConcurrentChange), transaction.atomic():
        jobs_transition_bulk([first, second], JobState.ADMITTED, kind="admitted", message_for=str)

    first.refresh_from_db()
    assert first.state == JobState.PENDING
    assert not JobEvent.objects.exists()
