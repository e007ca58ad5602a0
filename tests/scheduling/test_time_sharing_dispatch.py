"""Time-sharing through the dispatch loop: the snapshot's attained service (from the
allocations of earlier runs), the stop it decides, counted and shown on the job page."""

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from scheduling.choices import JobState, StopReason
from scheduling.services.dispatch import dispatch_cycle, load_snapshot
from scheduling.services.nodes import job_exited, job_started
from tests import factories as f


@pytest.fixture(autouse=True)
def _any_preemption_gain(settings):
    settings.SLUICE_PREEMPTION_MIN_GAIN_SECONDS = 0


def _sharing_queue(world):
    world.queue.time_sharing = True
    world.queue.save(update_fields=["time_sharing"])
    return world.queue


def _job(world, **kw):
    kw.setdefault("checkpoint_dir", "/ckpt/run")
    return f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        base_priority_class=world.low,
        priority_class=world.low,
        **kw,
    )


def _earlier_run(job, gpus, hours, ended_hours_ago):
    """Allocations of an earlier run of ``job``: ``gpus`` GPUs for ``hours``, released
    ``ended_hours_ago`` hours ago."""
    released = timezone.now() - timedelta(hours=ended_hours_ago)
    for gpu in gpus:
        f.AllocationFactory(
            job=job, gpu=gpu, granted_at=released - timedelta(hours=hours), released_at=released
        )
    return released


def test_the_snapshot_carries_attained_service_and_who_time_shares(world):
    _sharing_queue(world)
    gpus = list(world.nodes[0].gpus.order_by("index"))
    waiting = _job(world, requeue_count=1, gpus_per_node=2)
    released = _earlier_run(waiting, gpus[:2], hours=3, ended_hours_ago=1)
    no_checkpoint = _job(world, checkpoint_dir="")
    running = f.placed_job(
        gpus=gpus[4:8],
        queue=world.queue,
        project=world.project,
        base_priority_class=world.low,
        priority_class=world.low,
        checkpoint_dir="/ckpt/r",
    )
    _earlier_run(running, gpus[4:8], hours=1, ended_hours_ago=2)
    other = f.JobFactory(
        queue=world.other_queue,
        project=world.other_project,
        base_priority_class=world.low,
        priority_class=world.low,
        checkpoint_dir="/ckpt/o",
    )

    snapshot = load_snapshot(timezone.now(), update_usage=False).snapshot

    pending = {job.id: job for job in snapshot.pending}
    assert pending[waiting.pk].time_sharing
    assert pending[waiting.pk].attained_gpu_seconds == pytest.approx(2 * 3 * 3600)
    assert pending[waiting.pk].queued_at == pytest.approx(released.timestamp())
    assert not pending[no_checkpoint.pk].time_sharing
    assert not pending[other.pk].time_sharing  # its queue does not time-share
    [record] = [job for job in snapshot.running if job.id == running.pk]
    assert record.time_sharing
    # The earlier run only: the engine adds the current one from its start.
    assert record.attained_gpu_seconds == pytest.approx(4 * 3600)


def test_a_time_sharing_queue_off_by_default(world):
    assert not world.queue.time_sharing
    gpus = list(world.nodes[0].gpus.order_by("index"))
    waiting = _job(world, requeue_count=1)
    _earlier_run(waiting, gpus[:1], hours=1, ended_hours_ago=1)

    snapshot = load_snapshot(timezone.now(), update_usage=False).snapshot

    [record] = snapshot.pending
    assert not record.time_sharing and record.attained_gpu_seconds == 0.0


def _long_job_and_a_fresh_one(world, checkpoint_dir):
    """nlp's long job (class low) has used 8 GPUs x 10 h before this run on node 0; vision
    holds node 1; a fresh 8-GPU job of nlp has waited 2 h."""
    _sharing_queue(world)
    node0 = list(world.nodes[0].gpus.order_by("index"))
    node1 = list(world.nodes[1].gpus.order_by("index"))
    long = f.placed_job(
        gpus=node0,
        queue=world.queue,
        project=world.project,
        base_priority_class=world.low,
        priority_class=world.low,
        checkpoint_dir=checkpoint_dir,
    )
    _earlier_run(long, node0, hours=10, ended_hours_ago=11)
    f.placed_job(
        gpus=node1,
        queue=world.other_queue,
        project=world.other_project,
        base_priority_class=world.low,
        priority_class=world.low,
    )
    fresh = _job(world, gpus_per_node=8, submitted_at=timezone.now() - timedelta(hours=2))
    return long, fresh


def test_a_time_sharing_stop_is_counted_and_shown_on_the_job_page(
    world, client, django_capture_on_commit_callbacks
):
    long, fresh = _long_job_and_a_fresh_one(world, "/ckpt/long")

    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()

    long.refresh_from_db()
    fresh.refresh_from_db()
    assert long.state == JobState.STOPPING and long.stop_reason == StopReason.PREEMPTED
    assert fresh.pending_reason_code == "WAITING_FOR_PREEMPTION"
    event = long.events.filter(kind="stop_preempted").get()
    assert event.message.startswith(f"stopped for time-sharing: job {fresh.pk} of class low")
    audit = AuditEvent.objects.get(action="job.preempt", target_id=str(long.pk))
    assert audit.after["kind"] == "time_sharing"

    with django_capture_on_commit_callbacks(execute=True):
        _exit_preempted(long)
    long.refresh_from_db()
    assert long.state == JobState.PENDING and long.preemption_count == 1  # it counts

    client.force_login(world.member)
    body = client.get(f"/jobs/{long.pk}/").content.decode()
    assert "stopped for time-sharing" in body
    assert 'id="time-sharing"' in body  # the order it waits in says the queue time-shares


@pytest.mark.parametrize(
    "setting",
    [
        # The long job's 80 GPU-hours and more are in the first level: nobody is above.
        {"SLUICE_TIME_SHARING_LEVELS_GPU_HOURS": (100.0, 1000.0)},
        # The fresh job has waited 2 h, less than this minimum wait.
        {"SLUICE_TIME_SHARING_MIN_WAIT_SECONDS": 3 * 3600.0},
    ],
)
def test_the_time_sharing_settings_reach_the_dispatch_loop(
    world, settings, setting, django_capture_on_commit_callbacks
):
    long, fresh = _long_job_and_a_fresh_one(world, "/ckpt/long")
    for name, value in setting.items():
        setattr(settings, name, value)

    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()

    long.refresh_from_db()
    fresh.refresh_from_db()
    assert long.state == JobState.RUNNING
    assert fresh.state == JobState.PENDING
    assert fresh.pending_reason_code != "WAITING_FOR_PREEMPTION"


def test_a_job_that_does_not_checkpoint_is_not_stopped(world, django_capture_on_commit_callbacks):
    long, _fresh = _long_job_and_a_fresh_one(world, "")

    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()

    long.refresh_from_db()
    assert long.state == JobState.RUNNING


def _exit_preempted(job):
    node = job.allocations.filter(released_at__isnull=True).first().node.name
    job_started(
        {
            "type": "started",
            "node": node,
            "job_id": job.pk,
            "attempt": 0,
            "pid": 100,
            "started_at": timezone.now().timestamp(),
        }
    )
    job_exited(
        {
            "type": "exited",
            "node": node,
            "job_id": job.pk,
            "attempt": 0,
            "exit_code": None,
            "signal": 15,
            "stop_reason": "preempted",
            "message": "",
            "finished_at": timezone.now().timestamp(),
        }
    )


def test_a_running_job_in_a_time_sharing_queue_says_whether_it_may_be_stopped(world, client):
    gpus = list(world.nodes[0].gpus.order_by("index"))
    with_dir = f.placed_job(
        gpus=gpus[:1],
        queue=world.queue,
        project=world.project,
        base_priority_class=world.low,  # preemptible
        priority_class=world.low,
        checkpoint_dir="ckpt/a",
    )
    without = f.placed_job(gpus=gpus[1:2], queue=world.queue, project=world.project)
    client.force_login(world.member)

    def status(job):
        return client.get(f"/jobs/{job.pk}/").content.decode()

    assert 'id="time-sharing-status"' not in status(with_dir)  # the queue does not share
    _sharing_queue(world)
    body = status(with_dir)
    assert 'id="time-sharing-status"' in body and "ckpt/a" in body
    assert "has used less GPU-time may stop it" in body
    assert "never stopped for time-sharing" in status(without)
