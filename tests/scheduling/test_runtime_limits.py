"""Runtime limits: warnings at 80 % and 95 % once each, the stop at 100 %, TIMED_OUT."""

from datetime import timedelta

import pytest
from django.core import mail
from freezegun import freeze_time

from scheduling.choices import JobState, NotificationKind, ReclaimKind, StopReason
from scheduling.models import Allocation, ReclaimRecord
from scheduling.services.limits import runtime_limits_check
from scheduling.services.sweeps import control_sweep
from tests.scheduling.limits_helpers import T0, audits, notes, placed, report_exit, stops


def _at(seconds):
    return T0 + timedelta(seconds=seconds)


def _warnings(job):
    return list(job.events.filter(kind="runtime_warning").order_by("id"))


@pytest.fixture(autouse=True)
def _interval(settings):
    """Sweeps every 10 s: a warning goes at the last sweep before its moment."""
    settings.SLUICE_CONTROL_INTERVAL = 10


def test_warns_at_80_and_95_percent_once_each(world):
    with freeze_time(T0) as clock:
        job = placed(world, max_runtime_seconds=1000)
        clock.move_to(_at(789))
        assert runtime_limits_check() == {"warned": 0, "timed_out": 0}
        clock.move_to(_at(790))  # the next sweep (800 s) would be on time, not before
        assert runtime_limits_check()["warned"] == 1
        clock.move_to(_at(900))
        assert runtime_limits_check()["warned"] == 0
        clock.move_to(_at(939))
        assert runtime_limits_check()["warned"] == 0
        clock.move_to(_at(940))
        runtime_limits_check()
        runtime_limits_check()
    job.refresh_from_db()
    assert job.runtime_warnings_sent == [0.8, 0.95]
    assert job.state == JobState.RUNNING
    events = _warnings(job)
    assert [e.data["fraction"] for e in events] == [0.8, 0.95]
    assert "reaches 80%" in events[0].message and "2026-03-02 09:16:40" in events[0].message
    sent = notes(world.member, NotificationKind.RUNTIME_WARNING)
    assert len(sent) == 2 and all(n.job_id == job.pk for n in sent)


def test_warnings_count_from_admission_while_the_job_has_not_started(world):
    with freeze_time(T0) as clock:
        job = placed(world, state=JobState.ADMITTED, max_runtime_seconds=100)
        clock.move_to(_at(75))
        runtime_limits_check()
    job.refresh_from_db()
    assert job.runtime_warnings_sent == [0.8]


def test_no_warning_is_skipped_when_two_fall_between_two_sweeps(world):
    with freeze_time(T0) as clock:
        job = placed(world, max_runtime_seconds=40)
        clock.move_to(_at(24))  # 80 % (32 s) is due by the next sweep: sent now
        assert runtime_limits_check()["warned"] == 1
        clock.move_to(_at(34))  # 95 % (38 s) falls before the next sweep (44 s)
        assert runtime_limits_check()["warned"] == 1
        clock.move_to(_at(44))
        assert runtime_limits_check()["timed_out"] == 1
    assert [e.data["fraction"] for e in _warnings(job)] == [0.8, 0.95]


def test_warnings_due_together_are_each_sent(world):
    with freeze_time(T0) as clock:
        job = placed(world, max_runtime_seconds=100)
        clock.move_to(_at(90))
        assert runtime_limits_check()["warned"] == 1
    assert [e.data["fraction"] for e in _warnings(job)] == [0.8, 0.95]


def test_stops_at_the_limit_with_reason_timed_out(
    world, outbox, dispatch_requests, django_capture_on_commit_callbacks
):
    with freeze_time(T0) as clock:
        job = placed(world, max_runtime_seconds=600, gpus=2)
        clock.move_to(_at(600))
        with django_capture_on_commit_callbacks(execute=True):
            assert runtime_limits_check()["timed_out"] == 1
        assert runtime_limits_check()["timed_out"] == 0  # STOPPING now: nothing more to do
    job.refresh_from_db()
    assert job.state == JobState.STOPPING and job.stop_reason == StopReason.TIMED_OUT
    assert job.stop_requested_at == _at(600)
    [(node, message)] = stops(outbox, job)
    assert node == world.nodes[0].name
    assert message["reason"] == "timed_out" and message["attempt"] == job.attempt
    assert message["grace_seconds"] == 5
    [audit] = audits("job.timeout", job)
    assert audit.tenant == world.tenant and audit.actor is None
    assert audit.after["max_runtime_seconds"] == 600 and audit.before == {"state": "RUNNING"}
    assert job.events.filter(kind="stop_timed_out").count() == 1
    [note] = notes(world.member, NotificationKind.JOB_TIMED_OUT)
    assert "runtime limit of 10 min" in note.message
    [record] = ReclaimRecord.objects.all()
    assert (record.kind, record.tenant, record.job, record.gpus) == (
        ReclaimKind.TIMEOUT,
        world.tenant,
        job,
        2,
    )
    assert record.gpu_hours_freed == 0.0


def test_the_exit_report_ends_it_timed_out_and_frees_its_gpus(world, dispatch_requests):
    with freeze_time(T0) as clock:
        job = placed(world, max_runtime_seconds=60)
        clock.move_to(_at(61))
        runtime_limits_check()
        # The job caught SIGTERM and exited 0 after checkpointing: still a timeout.
        report_exit(job, exit_code=0, signal=None, stop_reason="timed_out", at=_at(63))
    job.refresh_from_db()
    assert job.state == JobState.TIMED_OUT and job.finished_at == _at(63)
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_timeout_notice_is_mailed_when_mail_is_on(
    world, settings, dispatch_requests, django_capture_on_commit_callbacks
):
    settings.SLUICE_MAIL_ENABLED = True
    with freeze_time(T0) as clock:
        job = placed(world, max_runtime_seconds=60)
        clock.move_to(_at(60))
        with django_capture_on_commit_callbacks(execute=True):
            runtime_limits_check()
    assert [m.to for m in mail.outbox] == [[world.member.email]]
    assert f"Job {job.pk}" in mail.outbox[0].subject


def test_jobs_not_placed_are_left_alone(world):
    with freeze_time(T0) as clock:
        stopping = placed(world, max_runtime_seconds=10, state=JobState.STOPPING)
        ended = placed(world, max_runtime_seconds=10, state=JobState.SUCCEEDED, node=1)
        clock.move_to(_at(3600))
        assert runtime_limits_check() == {"warned": 0, "timed_out": 0}
    for job in (stopping, ended):
        job.refresh_from_db()
        assert job.runtime_warnings_sent == [] and not job.events.exists()


def test_the_control_sweep_runs_the_runtime_check(world):
    with freeze_time(T0) as clock:
        job = placed(world, max_runtime_seconds=60)
        clock.move_to(_at(60))
        results = control_sweep()
    assert results["runtime_limits"] == {"warned": 0, "timed_out": 1}
    assert {"runtime_limits", "idle_reclaim", "session_age", "stuck_launches"} <= set(results)
    assert {"zombie_kills", "retention_cleanup"} <= set(results)
    job.refresh_from_db()
    assert job.state == JobState.STOPPING
