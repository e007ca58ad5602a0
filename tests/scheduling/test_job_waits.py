"""A job's waits, re-waits included (scheduling.waits): a requeued job waits again, and every
wait figure is the total of its first wait and its re-waits."""

import importlib
from datetime import timedelta

from django.apps import apps
from freezegun import freeze_time

from scheduling.choices import JobState, StopReason
from scheduling.services.dispatch import dispatch_cycle
from scheduling.services.jobs import job_cancel
from scheduling.services.nodes import job_started
from scheduling.services.recovery import stuck_launches_requeue
from scheduling.services.stopping import job_stop
from scheduling.waits import job_wait
from tests import factories as f
from tests.scheduling.limits_helpers import T0, placed, report_exit

HOUR = 3600


def _at(seconds):
    return T0 + timedelta(seconds=seconds)


def _start(job):
    job.refresh_from_db()
    job_started(
        {
            "type": "started",
            "node": job.allocations.first().node.name,
            "job_id": job.pk,
            "attempt": job.attempt,
            "pid": 100,
            "started_at": _at(0).timestamp(),
        }
    )
    job.refresh_from_db()


def test_a_preempted_job_waits_again_and_its_waits_add_up(world, dispatch_requests):
    with freeze_time(T0) as clock:
        job = f.JobFactory(
            queue=world.queue, project=world.project, submitted_by=world.member, gpus_per_node=2
        )
        clock.move_to(_at(HOUR))
        dispatch_cycle()
        _start(job)
        assert job.state == JobState.RUNNING and job_wait(job).total_seconds == HOUR

        clock.move_to(_at(3 * HOUR))
        job_stop(job=job, reason=StopReason.PREEMPTED, message="Preempted by job 99.")
        report_exit(job, stop_reason="preempted", at=_at(3 * HOUR))
        job.refresh_from_db()
        assert (job.state, job.requeue_count, job.preemption_count) == (JobState.PENDING, 1, 1)
        assert (job.queued_at, job.waited_seconds, job.first_wait_seconds) == (
            _at(3 * HOUR),
            HOUR,
            HOUR,
        )

        clock.move_to(_at(3 * HOUR + 40 * 60))
        wait = job_wait(job)
        assert (wait.total_seconds, wait.first_seconds, wait.rewait_seconds) == (
            HOUR + 2400,
            HOUR,
            2400,
        )
        assert wait.waiting and wait.since == _at(3 * HOUR)
        assert wait.message == "waiting 1 h 40 min in all, 40 min of it after 1 preemption"

        dispatch_cycle()
        clock.move_to(_at(5 * HOUR))
        job.refresh_from_db()
        wait = job_wait(job)
        assert job.state == JobState.ADMITTED and not wait.waiting
        assert wait.total_seconds == HOUR + 2400  # stopped counting at its admission
        assert wait.message == "waited 1 h 40 min in all, 40 min of it after 1 preemption"


def test_a_stuck_launch_counts_as_waiting_until_its_requeue(
    world, settings, outbox, dispatch_requests
):
    settings.SLUICE_STUCK_LAUNCH_SECONDS = 300
    with freeze_time(T0) as clock:
        job = placed(world, state=JobState.ADMITTED, submitted_at=_at(-600))
        clock.move_to(_at(300))
        assert stuck_launches_requeue() == [job.pk]
        clock.move_to(_at(400))
        job.refresh_from_db()

        wait = job_wait(job)

    # Never started: the 10 min before its admission and the 5 min stuck are its first wait.
    assert (job.waited_seconds, job.first_wait_seconds) == (900, 900)
    assert (wait.total_seconds, wait.rewait_seconds) == (1000, 100)
    assert wait.message == "waiting 16 min 40 s in all, 1 min 40 s of it after 1 requeue"


def test_a_job_cancelled_while_waiting_stops_counting(world, dispatch_requests):
    with freeze_time(T0) as clock:
        job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
        clock.move_to(_at(1800))
        job_cancel(user=world.member, job=job)
        clock.move_to(_at(99_999))
        job.refresh_from_db()

        wait = job_wait(job)

    assert (wait.total_seconds, wait.waiting, wait.message) == (1800, False, "waited 30 min")


def test_requeued_jobs_of_before_the_migration_get_their_waits_from_their_timeline(world):
    migration = importlib.import_module("scheduling.migrations.0007_scheduling_order_waits")
    job = f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        submitted_at=T0,
        requeue_count=2,
        preemption_count=1,
    )
    timeline = [
        (0, "released", "HELD", "PENDING"),  # a hold ending is no requeue
        (HOUR, "admitted", "PENDING", "ADMITTED"),
        (HOUR + 10, "started", "ADMITTED", "RUNNING"),
        (2 * HOUR, "requeued", "PREEMPTED", "PENDING"),
        (2 * HOUR + 600, "admitted", "PENDING", "ADMITTED"),
        (2 * HOUR + 900, "requeued", "ADMITTED", "PENDING"),  # stuck launch: waited on
    ]
    for seconds, kind, before, after in timeline:
        job.events.create(created_at=_at(seconds), kind=kind, data={"from": before, "to": after})
    untouched = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)

    migration.backfill_waits(apps, None)

    job.refresh_from_db()
    untouched.refresh_from_db()
    assert job.queued_at == _at(2 * HOUR + 900)
    assert (job.waited_seconds, job.first_wait_seconds) == (HOUR + 900, HOUR)
    assert (untouched.queued_at, untouched.waited_seconds, untouched.first_wait_seconds) == (
        None,
        0.0,
        None,
    )
