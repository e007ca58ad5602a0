"""Batches of agent reports (``scheduling.agent_reports``): in order, idempotent, one bad
report never loses the others, one dispatch request per batch, newest heartbeat per node."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduling.agent.protocol import REPORTS_TASK
from scheduling.choices import JobState
from scheduling.models import Allocation, Gpu, Job, JobEvent
from scheduling.services import reports as reports_service
from scheduling.services.nodes import job_log_path
from scheduling.tasks import agent_reports

from .test_agent_reports import _placed_job


@pytest.fixture(autouse=True)
def _logs(settings, tmp_path):
    settings.SLUICE_LOG_DIR = tmp_path / "logs"


def _now(offset=0.0):
    return (timezone.now() + timedelta(seconds=offset)).timestamp()


def _job_report(kind, node, job, **fields):
    return {
        "type": kind,
        "node": node.name,
        "job_id": job.pk,
        "attempt": job.attempt,
        "sent_at": _now(),
        **fields,
    }


def _started(node, job):
    return _job_report("started", node, job, pid=100 + job.pk, started_at=_now(-5))


def _exited(node, job, code=0):
    return _job_report(
        "exited",
        node,
        job,
        exit_code=code,
        signal=None,
        stop_reason=None,
        message="",
        finished_at=_now(),
    )


def _log(node, job, offset, data):
    return _job_report("log", node, job, offset=offset, data=data)


def _heartbeat(node, jobs, *, sent_at=None, utilization=0.0):
    return {
        "type": "heartbeat",
        "node": node.name,
        "sent_at": sent_at if sent_at is not None else _now(),
        "gpus": [
            {
                "index": g,
                "uuid": f"GPU-{node.name}-{g}",
                "utilization": utilization,
                "memory_used_mb": 100,
                "temperature_c": 40.0,
                "power_w": 100.0,
                "processes": [],
            }
            for g in range(8)
        ],
        "jobs": jobs,
        "zombies": [],
    }


def _snapshot(*jobs):
    """Everything a report can change about these jobs."""
    return [
        (
            Job.objects.filter(pk=j.pk).values().get(),
            list(JobEvent.objects.filter(job=j).values_list("kind", "message")),
            list(Allocation.objects.filter(job=j).values_list("gpu_id", "released_at")),
            job_log_path(j.pk, 0).read_bytes() if job_log_path(j.pk, 0).exists() else b"",
        )
        for j in jobs
    ]


def test_the_task_is_the_one_the_protocol_names():
    assert agent_reports.name == REPORTS_TASK


def test_a_batch_is_applied_in_order(world):
    job, node = _placed_job(world)
    result = agent_reports(
        [
            _started(node, job),
            _log(node, job, 0, "hello "),
            _log(node, job, 6, "world\n"),
            _exited(node, job),
        ]
    )
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.log_size == 12
    assert job_log_path(job.pk, 0).read_text() == "hello world\n"
    assert [e.kind for e in job.events.all()][-2:] == ["started", "succeeded"]
    assert result == {"reports": 4, "invalid": 0, "superseded_heartbeats": 0, "failed": 0}


def test_a_batch_delivered_twice_changes_nothing_the_second_time(world):
    first, node = _placed_job(world)
    second, node2 = _placed_job(world)
    assert node == node2
    batch = [
        _started(node, first),
        _started(node, second),
        _log(node, first, 0, "out\n"),
        _heartbeat(
            node,
            [
                {"job_id": first.pk, "attempt": 0, "pid": 1, "running": True},
                {"job_id": second.pk, "attempt": 0, "pid": 2, "running": True},
            ],
        ),
        _exited(node, first, code=0),
        _log(node, second, 0, "partial"),
    ]
    agent_reports(batch)
    before = _snapshot(first, second)
    agent_reports(batch)
    assert _snapshot(first, second) == before
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, second.state) == (JobState.SUCCEEDED, JobState.RUNNING)


def test_duplicates_inside_one_batch_change_nothing(world):
    job, node = _placed_job(world)
    started, exited, chunk = (
        _started(node, job),
        _exited(node, job, code=2),
        _log(node, job, 0, "x"),
    )
    beat = _heartbeat(node, [{"job_id": job.pk, "attempt": 0, "pid": 1, "running": True}])
    agent_reports([started, started, chunk, beat, dict(beat), chunk, exited, exited])
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.log_size == 1
    kinds = list(job.events.values_list("kind", flat=True))
    assert kinds.count("started") == 1 and kinds.count("failed") == 1


def test_a_bad_report_does_not_lose_the_others(world, monkeypatch):
    job, node = _placed_job(world)
    other, _ = _placed_job(world)

    def broken(report):
        raise RuntimeError("disk full")

    monkeypatch.setitem(reports_service.HANDLERS, "log", broken)
    result = agent_reports(
        [
            _started(node, job),
            {"type": "exited", "node": node.name},  # not a valid report
            _log(node, job, 0, "lost"),  # its handler fails
            "not even a dict",
            _started(node, other),
            _exited(node, job, code=0),
        ]
    )
    assert result == {"reports": 6, "invalid": 2, "superseded_heartbeats": 0, "failed": 1}
    job.refresh_from_db()
    other.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and other.state == JobState.RUNNING


def test_reports_span_several_transactions(world, monkeypatch):
    monkeypatch.setattr(reports_service, "REPORTS_PER_TRANSACTION", 2)
    jobs = [_placed_job(world) for _ in range(3)]
    batch = [_started(node, job) for job, node in jobs] + [_exited(node, job) for job, node in jobs]
    assert agent_reports(batch)["failed"] == 0
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}


def test_a_group_whose_commit_fails_is_applied_one_report_at_a_time(world, monkeypatch):
    """A failure that spoils the whole group's transaction (not one report's savepoint)
    falls back to one transaction per report."""
    job, node = _placed_job(world)
    calls = []
    real = reports_service._apply_group

    def group_then_alone(group):
        calls.append(len(group))
        if len(calls) == 1:
            return sum(not reports_service._apply_alone(item) for item in group)
        return real(group)

    monkeypatch.setattr(reports_service, "_apply_group", group_then_alone)
    agent_reports([_started(node, job), _exited(node, job)])
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and calls == [2]


def test_one_dispatch_request_per_batch(
    world, dispatch_requests, django_capture_on_commit_callbacks
):
    jobs = [_placed_job(world) for _ in range(3)]
    batch = [r for job, node in jobs for r in (_started(node, job), _exited(node, job))]
    with django_capture_on_commit_callbacks(execute=True):
        agent_reports(batch)
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    assert dispatch_requests == [1]
    with django_capture_on_commit_callbacks(execute=True):
        agent_reports([_log(jobs[0][1], jobs[0][0], 0, "nothing to place")])
    assert dispatch_requests == [1]  # nothing ended: no cycle asked for


def test_only_the_newest_heartbeat_of_a_node_is_applied(world):
    job, node = _placed_job(world)
    agent_reports([_started(node, job)])
    listed = [{"job_id": job.pk, "attempt": 0, "pid": 1, "running": True}]
    busy_at = _now(-3)
    newest = _heartbeat(node, listed, sent_at=_now(-1), utilization=1.0)
    newest["zombies"] = [{"gpu_index": 7, "pid": 66, "memory_mb": 10, "name": "python"}]
    result = agent_reports(
        [
            newest,
            _heartbeat(node, listed, sent_at=busy_at, utilization=90.0),
            _heartbeat(node, [], sent_at=_now(-2), utilization=2.0),
        ]
    )
    assert result["superseded_heartbeats"] == 2
    node.refresh_from_db()
    job.refresh_from_db()
    assert node.zombies[0]["pid"] == 66
    assert set(Gpu.objects.filter(node=node).values_list("utilization", flat=True)) == {1.0}
    # The older heartbeats' GPU activity still counts, at its own moment.
    assert abs(job.last_active_at.timestamp() - busy_at) < 0.01
    # The middle heartbeat (not listing the job) was superseded, so the job was not lost.
    assert job.state == JobState.RUNNING


def test_an_older_heartbeat_handled_later_does_not_overwrite_a_newer_one(world):
    """Two workers may handle two batches of one node out of order."""
    job, node = _placed_job(world)
    agent_reports([_started(node, job)])
    listed = [{"job_id": job.pk, "attempt": 0, "pid": 1, "running": True}]
    newer = _heartbeat(node, listed, sent_at=_now(-1), utilization=10.0)
    newer["zombies"] = [{"gpu_index": 7, "pid": 66, "memory_mb": 10, "name": "python"}]
    agent_reports([newer])
    agent_reports([_heartbeat(node, listed, sent_at=_now(-20), utilization=70.0)])
    node.refresh_from_db()
    assert node.zombies[0]["pid"] == 66
    assert set(Gpu.objects.filter(node=node).values_list("utilization", flat=True)) == {10.0}


def test_single_reports_of_older_agents_still_work(world):
    from scheduling.tasks import agent_report

    job, node = _placed_job(world)
    agent_report(_started(node, job))
    agent_report(_exited(node, job))
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
