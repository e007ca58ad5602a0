"""`sluice ls`, `show`, `logs`, `cancel`, `hold`, `release` against the live server."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduling.choices import JobState
from scheduling.models import Job
from scheduling.services.nodes import job_log_append
from tests import factories as f


@pytest.fixture
def member_key(world, token_of):
    return token_of(world.member)


def _job(world, user, state=JobState.PENDING, queue=None, **fields):
    queue = queue or world.queue
    project = world.project if queue.tenant == world.tenant else world.other_project
    return f.JobFactory(queue=queue, project=project, submitted_by=user, state=state, **fields)


def test_ls_shows_my_jobs_by_default_and_filters(world, sluice, member_key):
    pending = _job(world, world.member, name="mine-pending")
    running = _job(world, world.member, JobState.RUNNING, name="mine-running")
    theirs = _job(world, world.tenant_admin, name="admins-job")
    outsider = _job(world, world.outsider, queue=world.other_queue, name="vision-job")

    mine = sluice("ls", token=member_key)
    assert mine.code == 0, mine.err
    assert "mine-pending" in mine.out and "mine-running" in mine.out
    assert "admins-job" not in mine.out
    header = mine.out.splitlines()[0].split()
    assert header[:3] == ["ID", "NAME", "STATE"]

    only_running = sluice("ls", "--state", "running", "--json", token=member_key)
    assert only_running.code == 0, only_running.err
    assert [j["id"] for j in only_running.json()] == [running.pk]

    everyone = sluice("ls", "--all", "--json", token=member_key)
    ids = {j["id"] for j in everyone.json()}
    assert ids == {pending.pk, running.pk, theirs.pk}  # not the other tenant's
    assert outsider.pk not in ids

    by_user = sluice("ls", "--user", "nlp-admin", "--json", token=member_key)
    assert [j["id"] for j in by_user.json()] == [theirs.pk]

    limited = sluice("ls", "--all", "--limit", "2", "--json", token=member_key)
    assert [j["id"] for j in limited.json()] == sorted(ids, reverse=True)[:2]

    by_queue = sluice("ls", "--queue", "train", "--state", "PENDING,HELD", token=member_key)
    assert "mine-pending" in by_queue.out and "mine-running" not in by_queue.out


def test_ls_refuses_an_unknown_state(world, sluice, member_key):
    run = sluice("ls", "--state", "SLEEPING", token=member_key)
    assert run.code == 2
    assert "unknown state SLEEPING" in run.err


def test_show_prints_the_reason_position_and_estimate_of_a_waiting_job(world, sluice, member_key):
    # The first job is placed at once (eager dispatch); the 16 GPUs cannot hold them all.
    for _ in range(2):
        assert sluice("submit", "-q", "train", "-g", "8", "--", "x", token=member_key).code == 0
    waiting = sluice("submit", "-q", "train", "-g", "8", "--quiet", "--", "x", token=member_key)
    job = Job.objects.get(pk=int(waiting.out))
    assert job.state == JobState.PENDING and job.pending_reason_code

    as_json = sluice("show", job.pk, "--json", token=member_key)
    data = as_json.json()
    assert data["id"] == job.pk
    assert data["pending_reason"]["code"] == job.pending_reason_code
    assert data["queue_position"] and data["pool_position"] and data["estimated_start"]

    run = sluice("show", job.pk, token=member_key)

    assert run.code == 0, run.err
    assert f"Job {job.pk}" in run.out
    assert "State          PENDING" in run.out
    assert f"Reason         {job.pending_reason_code}: {job.pending_reason_message}" in run.out
    position = f"{data['queue_position']} in queue train, {data['pool_position']} in pool training"
    assert f"Position       {position}" in run.out
    assert "Est. start     20" in run.out and "(in " in run.out
    assert "Runtime limit  1h" in run.out

    listed = sluice("ls", "--state", "PENDING", token=member_key)
    assert f"#{data['queue_position']} {job.pending_reason_code} start in " in listed.out


def test_cancel_hold_and_release(world, sluice, member_key, dispatch_requests):
    job = _job(world, world.member)
    other = _job(world, world.member)

    held = sluice("hold", job.pk, other.pk, "--reason", "later", token=member_key)
    assert held.code == 0, held.err
    assert f"job {job.pk}: held (now HELD)" in held.out
    job.refresh_from_db()
    other.refresh_from_db()
    assert job.state == other.state == JobState.HELD

    released = sluice("release", job.pk, token=member_key)
    assert released.code == 0, released.err
    job.refresh_from_db()
    assert job.state == JobState.PENDING

    cancelled = sluice("cancel", job.pk, "--json", token=member_key)
    assert cancelled.code == 0, cancelled.err
    assert cancelled.json()["state"] == JobState.CANCELLED
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_cancel_goes_on_after_a_failure_and_exits_with_its_code(world, sluice, member_key):
    job = _job(world, world.member)

    run = sluice("cancel", 999999, job.pk, token=member_key)

    assert run.code == 3
    assert "error: job 999999: Job not found." in run.err
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_a_viewer_may_not_cancel(world, sluice, token_of):
    job = _job(world, world.member)

    run = sluice("cancel", job.pk, token=token_of(world.viewer))

    assert run.code == 1
    assert run.err == f"error: job {job.pk}: Only the job's owner or a tenant admin may do this.\n"
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_logs_prints_the_output(world, sluice, member_key):
    job = _job(world, world.member, JobState.RUNNING, started_at=timezone.now())
    job_log_append({"job_id": job.pk, "attempt": 0, "offset": 0, "data": "epoch 1\nepoch 2\n"})

    run = sluice("logs", job.pk, token=member_key)

    assert run.code == 0, run.err
    assert run.out == "epoch 1\nepoch 2\n"

    tail = sluice("logs", job.pk, "--tail", "8", token=member_key)
    assert tail.out == "epoch 2\n"
    assert "not shown" in tail.err

    as_json = sluice("logs", job.pk, "--json", token=member_key)
    assert as_json.json()["text"] == "epoch 1\nepoch 2\n"


def test_logs_follow_prints_new_output_until_the_job_ends(world, sluice, member_key, monkeypatch):
    job = _job(world, world.member, JobState.RUNNING, started_at=timezone.now())
    job_log_append({"job_id": job.pk, "attempt": 0, "offset": 0, "data": "start\n"})
    steps = iter(
        [
            lambda: job_log_append(
                {"job_id": job.pk, "attempt": 0, "offset": 6, "data": "step 1\n"}
            ),
            lambda: None,  # nothing new: nothing printed twice
            lambda: (
                job_log_append({"job_id": job.pk, "attempt": 0, "offset": 13, "data": "done\n"}),
                Job.objects.filter(pk=job.pk).update(
                    state=JobState.SUCCEEDED, finished_at=timezone.now(), exit_code=0
                ),
            ),
        ]
    )
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        next(steps)()

    monkeypatch.setattr("sluice_cli.main._sleep", sleep)

    run = sluice("logs", "-f", job.pk, token=member_key)

    assert run.code == 0, run.err
    assert run.out == "start\nstep 1\ndone\n"
    assert f"job {job.pk} SUCCEEDED" in run.err
    assert len(sleeps) == 3


@pytest.mark.parametrize(
    ("state", "code", "signal", "shown"),
    [
        (JobState.CANCELLED, None, 15, "Ended          stopped by signal 15 (SIGTERM)"),
        (JobState.FAILED, 3, None, "Ended          exit code 3"),
        (JobState.SUCCEEDED, 0, None, "Ended          exit code 0"),
    ],
)
def test_show_says_how_a_stopped_job_ended(world, sluice, member_key, state, code, signal, shown):
    now = timezone.now()
    job = _job(
        world,
        world.member,
        state=state,
        exit_code=code,
        exit_signal=signal,
        started_at=now - timedelta(minutes=5),
        finished_at=now,
    )

    run = sluice("show", job.pk, token=member_key)

    assert run.code == 0, run.err
    assert shown in run.out
    assert "None" not in run.out


def test_show_of_a_job_cancelled_before_it_started_says_no_exit(world, sluice, member_key):
    job = _job(world, world.member, state=JobState.CANCELLED, finished_at=timezone.now())

    run = sluice("show", job.pk, token=member_key)

    assert run.code == 0, run.err
    assert "Ended" not in run.out and "None" not in run.out
