"""Every heartbeat (and register) reconciles the node's jobs with what its agent says it
runs: lost ``started`` and ``exited`` reports are repaired, jobs the agent forgot are LOST."""

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone
from freezegun import freeze_time

from audit.models import AuditEvent
from scheduling.choices import JobState, StopReason
from scheduling.models import Allocation, Job
from scheduling.services.dispatch import dispatch_cycle
from scheduling.services.stopping import job_stop
from scheduling.tasks import agent_report, agent_reports
from tests import factories as f

from .test_agent_reports import _placed_job, _register, _report


@pytest.fixture(autouse=True)
def _fresh_cache():
    cache.clear()  # "asked again" marks of an earlier test's job ids


def _heartbeat(node, jobs, *, sent_at=None, batch=False):
    report = {
        "type": "heartbeat",
        "node": node.name,
        "sent_at": (sent_at or timezone.now()).timestamp(),
        "gpus": [],
        "jobs": jobs,
        "zombies": [],
    }
    if batch:
        agent_reports([report])
    else:
        agent_report(report)


def _running(job, **fields):
    return {
        "job_id": job.pk,
        "attempt": job.attempt,
        "pid": 4242,
        "running": True,
        "stop_reason": None,
        **fields,
    }


def _finished(job, exit_code=0, signal=None, stop_reason=None, message=""):
    return {
        **_running(job),
        "running": False,
        "stop_reason": stop_reason,
        "exit_code": exit_code,
        "signal": signal,
        "finished_at": timezone.now().timestamp(),
        "message": message,
    }


def _started_job(world, started_ago=60):
    job, node = _placed_job(world)
    started = (timezone.now() - timedelta(seconds=started_ago)).timestamp()
    job = _report("started", node, job, pid=4242, started_at=started)
    assert job.state == JobState.RUNNING
    return job, node


def _active(job):
    return Allocation.objects.filter(job=job, released_at__isnull=True).count()


def _exited(node, job, **fields):
    values = {
        "exit_code": 0,
        "signal": None,
        "stop_reason": None,
        "message": "",
        "finished_at": timezone.now().timestamp(),
    }
    return _report("exited", node, job, **{**values, **fields})


# --- a finished job whose exited report was lost ----------------------------------------


def test_finished_job_ends_as_its_exit_says_and_the_late_exit_changes_nothing(
    world, dispatch_requests, django_capture_on_commit_callbacks
):
    job, node = _started_job(world)
    with django_capture_on_commit_callbacks(execute=True):
        _heartbeat(node, [_finished(job, exit_code=0)], batch=True)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.exit_code == 0 and job.finished_at
    assert _active(job) == 0
    assert job.events.get(kind="succeeded").data["reconciled"] is True
    assert dispatch_requests == [1]
    events = job.events.count()
    job = _exited(node, job)  # the exited report arrives after all
    assert job.state == JobState.SUCCEEDED and job.events.count() == events
    _heartbeat(node, [_finished(job, exit_code=0)])  # and the next heartbeat too
    assert job.events.count() == events


def test_failed_exit_in_a_heartbeat_fails_the_job_with_its_message(world):
    job, node = _started_job(world)
    _heartbeat(node, [_finished(job, exit_code=3, message="CUDA error")])
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.exit_code == 3
    assert "exit code 3" in job.failure_message and "CUDA error" in job.failure_message


def test_preempted_job_that_ended_is_requeued_from_the_heartbeat(world):
    job, node = _started_job(world)
    job_stop(job=job, reason=StopReason.PREEMPTED, message="preempted by job 9")
    _heartbeat(node, [_finished(job, exit_code=None, signal=15, stop_reason="preempted")])
    job.refresh_from_db()
    assert job.state in (JobState.PENDING, JobState.ADMITTED) and job.requeue_count == 1
    assert job.preemption_count == 1 and job.events.filter(kind="preempted").count() == 1
    assert not Allocation.objects.filter(job=job, node=node, released_at__isnull=True).exists()


def test_launch_failure_reported_only_in_a_heartbeat_fails_the_admitted_job(world):
    job, node = _placed_job(world)
    _heartbeat(
        node,
        [_finished(job, exit_code=None, stop_reason="launch_failed", message="no such file")],
    )
    job.refresh_from_db()
    assert job.state == JobState.FAILED and "no such file" in job.failure_message
    assert _active(job) == 0


def test_finished_summary_without_exit_fields_asks_the_agent_for_the_exit_again(
    world, outbox, django_capture_on_commit_callbacks
):
    """An older agent's summary does not say how the job ended: the exited report may only
    be late, and guessing could fail a job that succeeded. The agent is asked again (a stop
    of an ended attempt is answered with its exited report), at most every 10 s."""
    job, node = _started_job(world)
    with freeze_time(timezone.now()) as clock:
        for _ in range(2):
            with django_capture_on_commit_callbacks(execute=True):
                _heartbeat(node, [_running(job, running=False)])
        job.refresh_from_db()
        assert job.state == JobState.RUNNING and _active(job) == 2
        asked = [(n, m["type"], m["job_id"], m["attempt"]) for n, m in outbox]
        assert asked == [(node.name, "stop", job.pk, 0)]
        clock.tick(11)
        with django_capture_on_commit_callbacks(execute=True):
            _heartbeat(node, [_running(job, running=False)])
        assert len(outbox) == 2
    job = _exited(node, job, exit_code=0)  # the answer
    assert job.state == JobState.SUCCEEDED


def test_summary_of_an_older_attempt_leaves_the_current_one_alone(world):
    job, node = _started_job(world)
    old = _finished(job, exit_code=1)
    old["attempt"] = job.attempt + 5
    _heartbeat(node, [old, _running(job)])
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and _active(job) == 2


# --- a started report that was lost -----------------------------------------------------


def test_admitted_job_the_agent_runs_becomes_running_once(world):
    job, node = _placed_job(world)
    started = (timezone.now() - timedelta(seconds=5)).timestamp()
    _heartbeat(node, [_running(job, started_at=started)])
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert abs(job.started_at.timestamp() - started) < 0.01
    job = _report("started", node, job, pid=4242, started_at=started)  # the late report
    _heartbeat(node, [_running(job)])
    assert job.state == JobState.RUNNING and job.events.filter(kind="started").count() == 1


# --- jobs the agent does not list -------------------------------------------------------


def test_running_job_the_agent_does_not_list_is_lost_and_requeued(
    world, dispatch_requests, django_capture_on_commit_callbacks
):
    job, node = _started_job(world)
    with django_capture_on_commit_callbacks(execute=True):
        _heartbeat(node, [], batch=True)
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.requeue_count == 1
    assert job.events.filter(kind="lost").count() == 1
    assert job.events.filter(kind="requeued").count() == 1
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    audit = AuditEvent.objects.get(action="job.lost", target_id=str(job.pk))
    assert audit.before["node"] == node.name and audit.after["state"] == JobState.PENDING
    assert dispatch_requests == [1]
    _heartbeat(node, [])  # nothing more happens to the requeued attempt
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.events.filter(kind="lost").count() == 1


def test_lost_job_stays_lost_when_its_policy_forbids_requeue(world):
    f.policy("training", requeue_on_lost=False)
    job, node = _started_job(world)
    _heartbeat(node, [])
    job.refresh_from_db()
    assert job.state == JobState.LOST and job.requeue_count == 0 and job.finished_at


def test_stopping_job_the_agent_forgot_ends_as_its_stop_intended(world):
    job, node = _started_job(world)
    job_stop(job=job, reason=StopReason.CANCELLED, message="cancelled by its owner")
    _heartbeat(node, [])
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and _active(job) == 0


def test_heartbeat_sent_before_the_job_started_says_nothing_about_it(world):
    """Two workers may handle a node's reports out of order: a heartbeat produced before
    the job started does not list it, and must not end it."""
    job, node = _started_job(world, started_ago=10)
    _heartbeat(node, [], sent_at=timezone.now() - timedelta(seconds=30), batch=True)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and _active(job) == 2


def test_admitted_job_not_listed_is_left_to_the_stuck_launch_sweep(world):
    job, node = _placed_job(world)
    _heartbeat(node, [])
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED and _active(job) == 2


def test_register_after_an_agent_restart_reconciles_too(world):
    job, node = _started_job(world)
    _register(name=node.name, gpus=8, jobs=[])
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.events.filter(kind="lost").exists()


def test_register_listing_the_job_keeps_it(world):
    job, node = _started_job(world)
    _register(name=node.name, gpus=8, jobs=[_running(job)])
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


def test_job_running_elsewhere_is_stopped_as_before(
    world, outbox, django_capture_on_commit_callbacks
):
    job, node = _started_job(world)
    other = world.nodes[1] if node == world.nodes[0] else world.nodes[0]
    with django_capture_on_commit_callbacks(execute=True):
        _heartbeat(other, [_running(job)])
    assert [(n, m["type"], m["job_id"]) for n, m in outbox] == [(other.name, "stop", job.pk)]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


# --- multi-node jobs --------------------------------------------------------------------


def _two_node_job(world):
    job = f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.member, nodes=2,
        gpus_per_node=4,
    )  # fmt: skip
    dispatch_cycle()
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED
    first, second = sorted({a.node for a in job.allocations.all()}, key=lambda n: n.name)
    return job, first, second


def test_multi_node_job_is_lost_only_on_a_node_that_started_it(
    world, outbox, django_capture_on_commit_callbacks
):
    job, first, second = _two_node_job(world)
    earlier = (timezone.now() - timedelta(seconds=30)).timestamp()
    job = _report("started", first, job, pid=1, started_at=earlier)
    assert job.state == JobState.RUNNING
    # The second node has not launched it yet (its launch waits for GPUs): not lost.
    _heartbeat(second, [])
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and _active(job) == 8
    job = _report("started", second, job, pid=2, started_at=earlier)
    assert job.events.filter(kind="started").count() == 2
    with django_capture_on_commit_callbacks(execute=True):
        _heartbeat(second, [])
    job.refresh_from_db()
    assert job.requeue_count == 1 and job.events.filter(kind="lost").count() == 1
    assert job.state in (JobState.PENDING, JobState.ADMITTED)  # the dispatch may place it again
    assert (
        not Allocation.objects.filter(job=job, granted_at__lt=job.queued_at)
        .filter(released_at__isnull=True)
        .exists()
    )
    assert (first.name, "stop", 0) in [(n, m["type"], m["attempt"]) for n, m in outbox]


def test_multi_node_job_ends_when_its_last_node_reports_the_exit(world):
    job, first, second = _two_node_job(world)
    for node in (first, second):
        job = _report("started", node, job, pid=1, started_at=timezone.now().timestamp())
    _heartbeat(first, [_finished(job, exit_code=0)])
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and _active(job) == 4
    events = job.events.count()
    _heartbeat(first, [_finished(job, exit_code=0)])  # the same summary again: no new line
    assert job.events.count() == events
    _heartbeat(second, [_finished(job, exit_code=0)])
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and _active(job) == 0
    assert Job.objects.get(pk=job.pk).events.filter(kind="node_exited").count() == 1


def test_heartbeat_within_a_second_of_a_whole_second_start_says_nothing_about_it(world):
    """Slurm and Kubernetes give start times in whole seconds, truncated: a heartbeat sent
    0.5 s after such a start may have been produced before the executor saw the job
    start (heartbeats drained apart from the reports come after the ``started`` report),
    so it must not make the job lost; one sent later does."""
    job, node = _started_job(world, started_ago=30)
    started = job.started_at
    _heartbeat(node, [], sent_at=started + timedelta(seconds=0.5), batch=True)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and _active(job) == 2
    _heartbeat(node, [], sent_at=started + timedelta(seconds=5), batch=True)
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.events.filter(kind="lost").count() == 1
