"""Retention of job timelines: events of jobs that ended long ago are deleted but each job's
final one; waiting, running and recently ended jobs keep theirs; the audit log is untouched."""

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from audit.models import AuditEvent
from scheduling.choices import JobState
from scheduling.models import JobEvent
from scheduling.services import sweeps
from scheduling.services.recovery import (
    JOB_EVENTS_PRUNED_UNTIL_KEY,
    JOB_EVENTS_RETENTION_KEY,
    job_events_retention,
    job_events_retention_cleanup,
)
from tests import factories as f


@pytest.fixture(autouse=True)
def fresh_cache():
    cache.delete_many([JOB_EVENTS_PRUNED_UNTIL_KEY, JOB_EVENTS_RETENTION_KEY])
    yield
    cache.delete_many([JOB_EVENTS_PRUNED_UNTIL_KEY, JOB_EVENTS_RETENTION_KEY])


def _job(world, state, *, ended_days_ago=None, kinds=("submitted", "admitted", "started")):
    now = timezone.now()
    finished = now - timedelta(days=ended_days_ago) if ended_days_ago is not None else None
    job = f.JobFactory(project=world.project, queue=world.queue, state=state, finished_at=finished)
    at = (finished or now) - timedelta(hours=2)
    for kind in kinds:
        JobEvent.objects.create(job=job, created_at=at, kind=kind, data={})
    if finished is not None:
        JobEvent.objects.create(
            job=job,
            created_at=finished,
            kind=state.lower(),
            data={"from": "RUNNING", "to": state},
        )
    return job


def _kinds(job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).order_by("id").values_list("kind", flat=True))


def test_old_timelines_keep_only_their_final_event(world, settings):
    settings.SLUICE_JOB_EVENT_RETENTION_DAYS = 400
    old = [
        _job(world, JobState.SUCCEEDED, ended_days_ago=401),
        _job(world, JobState.FAILED, ended_days_ago=500),
        _job(world, JobState.CANCELLED, ended_days_ago=450),
    ]
    recent = _job(world, JobState.SUCCEEDED, ended_days_ago=399)
    waiting = _job(world, JobState.PENDING, kinds=("submitted", "held", "released"))
    audit_before = list(AuditEvent.objects.values_list("id", "hash"))

    assert job_events_retention_cleanup() == {"jobs": 3, "deleted": 9}

    assert [_kinds(j) for j in old] == [["succeeded"], ["failed"], ["cancelled"]]
    assert _kinds(recent) == ["submitted", "admitted", "started", "succeeded"]
    assert _kinds(waiting) == ["submitted", "held", "released"]
    # the audit log is appended to (one line saying what went), never pruned
    after = list(AuditEvent.objects.values_list("id", "hash"))
    assert after[: len(audit_before)] == audit_before
    line = AuditEvent.objects.get(action="retention.job_events")
    assert line.after == {"jobs": 3, "events": 9}


def test_a_late_event_after_the_end_does_not_displace_the_final_one(world, settings):
    settings.SLUICE_JOB_EVENT_RETENTION_DAYS = 30
    job = _job(world, JobState.TIMED_OUT, ended_days_ago=40)
    JobEvent.objects.create(job=job, created_at=timezone.now(), kind="note", data={})
    job_events_retention_cleanup()
    assert _kinds(job) == ["timed_out"]


def test_a_job_without_a_final_state_event_keeps_its_newest(world, settings):
    settings.SLUICE_JOB_EVENT_RETENTION_DAYS = 30
    job = _job(world, JobState.SUCCEEDED, ended_days_ago=40)
    JobEvent.objects.filter(job=job, kind="succeeded").delete()
    job_events_retention_cleanup()
    assert _kinds(job) == ["started"]


def test_batches_go_on_where_the_last_run_stopped(world, settings):
    settings.SLUICE_JOB_EVENT_RETENTION_DAYS = 10
    jobs = [_job(world, JobState.SUCCEEDED, ended_days_ago=100 - i) for i in range(5)]
    assert job_events_retention_cleanup(batch=2, batches=1) == {"jobs": 2, "deleted": 6}
    assert [len(_kinds(j)) for j in jobs] == [1, 1, 4, 4, 4]  # the oldest ended first
    assert job_events_retention_cleanup(batch=2, batches=5) == {"jobs": 3, "deleted": 9}
    assert [len(_kinds(j)) for j in jobs] == [1, 1, 1, 1, 1]
    # a job that reaches the age later is taken by a later run; nothing is read twice
    later = _job(world, JobState.FAILED, ended_days_ago=9)
    assert job_events_retention_cleanup() == {"jobs": 0, "deleted": 0}
    settings.SLUICE_JOB_EVENT_RETENTION_DAYS = 5
    assert job_events_retention_cleanup() == {"jobs": 1, "deleted": 3}
    assert _kinds(later) == ["failed"]


def test_zero_keeps_timelines_forever(world, settings):
    settings.SLUICE_JOB_EVENT_RETENTION_DAYS = 0
    job = _job(world, JobState.SUCCEEDED, ended_days_ago=5000)
    assert job_events_retention() == "off"
    assert job_events_retention_cleanup() == {"jobs": 0, "deleted": 0}
    assert len(_kinds(job)) == 4


def test_the_control_sweep_prunes_once_per_period(world, settings):
    settings.SLUICE_JOB_EVENT_RETENTION_DAYS = 400
    job = _job(world, JobState.SUCCEEDED, ended_days_ago=401)
    assert sweeps.control_sweep()["job_events_retention"] == {"jobs": 1, "deleted": 3}
    assert _kinds(job) == ["succeeded"]
    assert sweeps.control_sweep()["job_events_retention"] == "not due"
