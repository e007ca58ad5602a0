"""The ``started`` and ``exited`` reports of a batch applied together, set-based
(``nodes.job_reports_apply``): the same outcome as one report at a time, at a cost that
does not grow with the batch's jobs, and the uncommon cases left to the handlers."""

import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling.choices import JobState, StopReason
from scheduling.models import Allocation, Job, JobEvent, RuntimeHistory
from scheduling.services import reports as reports_service
from scheduling.services.dispatch import dispatch_cycle
from scheduling.services.stopping import job_stop
from scheduling.tasks import agent_reports
from tests import factories as f

from .test_report_batches import _exited, _heartbeat, _job_report, _log, _now, _snapshot, _started


@pytest.fixture(autouse=True)
def _logs(settings, tmp_path):
    settings.SLUICE_LOG_DIR = tmp_path / "logs"


@pytest.fixture
def one_by_one(monkeypatch):
    """Reports applied one at a time, as before the set-based path (the reference)."""
    monkeypatch.setattr(reports_service, "TOGETHER", ())


def _placed(world, count=1, *, gpus=1, nodes=1):
    """``count`` jobs placed by a dispatch cycle, ADMITTED, as (job, its node)."""
    jobs = [
        f.JobFactory(
            queue=world.queue,
            project=world.project,
            submitted_by=world.member,
            gpus_per_node=gpus,
            nodes=nodes,
        )
        for _ in range(count)
    ]
    dispatch_cycle()
    placed = []
    for job in jobs:
        job.refresh_from_db()
        assert job.state == JobState.ADMITTED
        placed.append((job, job.allocations.first().node))
    return placed


def _held(job):
    return Allocation.objects.filter(job=job, released_at__isnull=True).count()


def _kinds(job):
    return list(JobEvent.objects.filter(job=job).values_list("kind", flat=True))


def _launch_failed(node, job):
    return _job_report(
        "exited",
        node,
        job,
        exit_code=None,
        signal=None,
        stop_reason="launch_failed",
        message="no such directory",
        finished_at=_now(),
    )


def test_started_and_exited_of_many_jobs_in_one_batch(world, django_capture_on_commit_callbacks):
    placed = _placed(world, 6)
    starts = [_started(node, job) for job, node in placed]
    exits = [
        _exited(node, job, code=(0 if i % 2 == 0 else 3)) for i, (job, node) in enumerate(placed)
    ]
    with django_capture_on_commit_callbacks(execute=True):
        result = agent_reports(starts + exits)
    assert result == {"reports": 12, "invalid": 0, "superseded_heartbeats": 0, "failed": 0}
    for i, ((job, _), start, end) in enumerate(zip(placed, starts, exits, strict=True)):
        job.refresh_from_db()
        assert job.state == (JobState.SUCCEEDED if i % 2 == 0 else JobState.FAILED)
        assert abs(job.started_at.timestamp() - start["started_at"]) < 0.001
        assert abs(job.finished_at.timestamp() - end["finished_at"]) < 0.001
        assert job.exit_code == end["exit_code"] and job.pending_rank is None
        assert _kinds(job)[-2:] == ["started", job.state.lower()]
        assert _held(job) == 0
        released = Allocation.objects.filter(job=job).values_list("released_at", flat=True)
        assert [r.timestamp() for r in released] == [pytest.approx(end["finished_at"])]
    failed = Job.objects.filter(state=JobState.FAILED).first()
    assert failed.failure_message == "Failed with exit code 3."
    started = JobEvent.objects.filter(job=placed[0][0], kind="started").get()
    assert started.data == {
        "from": "ADMITTED",
        "to": "RUNNING",
        "node": placed[0][1].name,
        "pid": starts[0]["pid"],
    }
    # What runtime prediction learns: the 3 jobs that succeeded, in both rows.
    assert sorted(len(r.entries) for r in RuntimeHistory.objects.all()) == [3, 3]


def test_a_batch_costs_the_same_queries_for_more_jobs(world):
    def cost(count):
        placed = _placed(world, count)
        batch = [r for job, node in placed for r in (_started(node, job), _exited(node, job))]
        with CaptureQueriesContext(connection) as queries:
            agent_reports(batch)
        assert set(
            Job.objects.filter(pk__in=[j.pk for j, _ in placed]).values_list("state", flat=True)
        ) == {JobState.SUCCEEDED}
        return len(queries)

    assert cost(2) == cost(7)


def test_the_same_outcome_as_one_report_at_a_time(
    world, monkeypatch, outbox, dispatch_requests, django_capture_on_commit_callbacks
):
    """Every case of the set-based path, then the batch delivered again, against the
    same reports applied one by one to jobs in the same places: the same jobs, events,
    allocations, messages to the nodes and dispatch requests."""

    def scenario():
        outbox.clear()
        dispatch_requests.clear()
        placed = _placed(world, 6)
        (a, na), (b, nb), (c, nc), (d, nd), (e, ne), (s, ns) = placed
        agent_reports([_started(ns, s)])
        s.refresh_from_db()
        job_stop(job=s, reason=StopReason.CANCELLED, message="stop")
        stale = {**_started(nc, c), "attempt": 7}
        batch = [
            _started(na, a),
            _exited(na, a),
            _started(nb, b),
            _log(nb, b, 0, "out\n"),
            _exited(nb, b, code=3),
            _launch_failed(nc, c),
            stale,
            _started(nd, d),
            _started(nd, d),
            _exited(nd, d),
            _exited(nd, d),
            _started(nd, d),
            _started(ne, e),
            _exited(ns, s, code=143),
        ]
        with django_capture_on_commit_callbacks(execute=True):
            agent_reports(batch)
        first = _described(placed)
        with django_capture_on_commit_callbacks(execute=True):
            agent_reports(batch)
        assert _described(placed) == first  # a batch delivered twice
        index = {job.pk: i for i, (job, _) in enumerate(placed)}
        sent = [(node, m["type"], index[m["job_id"]], m["attempt"]) for node, m in outbox]
        return first, sent, len(dispatch_requests)

    together = scenario()
    monkeypatch.setattr(reports_service, "TOGETHER", ())
    alone = scenario()
    assert together == alone
    jobs, sent, dispatches = together
    states = [job["state"] for job in jobs]
    assert states == ["SUCCEEDED", "FAILED", "FAILED", "SUCCEEDED", "RUNNING", "CANCELLED"]
    assert jobs[2]["failure_message"] == "Launch failed: no such directory"
    # The start of an attempt the node should not run (7) is stopped at each delivery.
    assert [(kind, i, attempt) for _, kind, i, attempt in sent] == [("stop", 2, 7)] * 2
    assert dispatches == 1  # the first delivery ended jobs, the second nothing


def _described(placed):
    """What the reports changed about ``placed`` jobs, without their ids and times."""
    described = []
    for job, _ in placed:
        job.refresh_from_db()
        events = [
            (e.kind, e.message.replace(str(100 + job.pk), "PID"), {**e.data, "pid": None})
            for e in JobEvent.objects.filter(job=job)
        ]
        described.append(
            {
                "state": job.state,
                "exit_code": job.exit_code,
                "failure_message": job.failure_message,
                "started": job.started_at is not None,
                "finished": job.finished_at is not None,
                "held": _held(job),
                "events": events,
                "log_size": job.log_size,
            }
        )
    return described


def test_duplicates_in_one_batch_change_nothing(world):
    [(job, node)] = _placed(world)
    started, exited = _started(node, job), _exited(node, job)
    agent_reports([started, started, exited, exited, dict(exited)])
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert _kinds(job).count("started") == 1 and _kinds(job).count("succeeded") == 1


def test_a_batch_delivered_again_changes_nothing(world, outbox):
    placed = _placed(world, 3)
    batch = [_started(node, job) for job, node in placed] + [
        _exited(node, job) for job, node in placed[:2]
    ]
    agent_reports(batch)
    before = _snapshot(*(job for job, _ in placed))
    messages = len(outbox)
    agent_reports(batch)
    assert _snapshot(*(job for job, _ in placed)) == before
    assert len(outbox) == messages  # no orphan stop for a start already applied
    states = [Job.objects.get(pk=job.pk).state for job, _ in placed]
    assert states == [JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.RUNNING]


def test_reports_of_an_older_attempt_are_ignored(world, outbox, django_capture_on_commit_callbacks):
    [(job, node), (other, other_node)] = _placed(world, 2)
    old = {"attempt": job.attempt + 1}
    with django_capture_on_commit_callbacks(execute=True):
        agent_reports(
            [
                {**_started(node, job), **old},
                {**_exited(node, job), **old},
                _started(other_node, other),
            ]
        )
    job.refresh_from_db()
    other.refresh_from_db()
    assert job.state == JobState.ADMITTED and _held(job) == 1 and _kinds(job) == _kinds(job)[:1]
    assert other.state == JobState.RUNNING
    # The start of an attempt the portal does not place there is stopped (an orphan).
    assert [(n, m["type"], m["job_id"], m["attempt"]) for n, m in outbox] == [
        (node.name, "stop", job.pk, job.attempt + 1)
    ]


def test_a_start_where_the_job_is_not_placed_stops_it(
    world, outbox, django_capture_on_commit_callbacks
):
    [(job, node)] = _placed(world)
    elsewhere = world.nodes[1] if node == world.nodes[0] else world.nodes[0]
    unknown = {**_started(node, job), "job_id": job.pk + 1000}
    with django_capture_on_commit_callbacks(execute=True):
        agent_reports([_started(elsewhere, job), unknown, _exited(elsewhere, job)])
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED and _held(job) == 1
    assert sorted((n, m["job_id"]) for n, m in outbox if m["type"] == "stop") == sorted(
        [(elsewhere.name, job.pk), (node.name, job.pk + 1000)]
    )


def test_exited_before_started(world, outbox, django_capture_on_commit_callbacks):
    """The exit overtook the start: in one batch or in two, the start is ignored."""
    [(first, node), (second, node2)] = _placed(world, 2)
    with django_capture_on_commit_callbacks(execute=True):
        agent_reports([_exited(node, first), _started(node, first)])
        agent_reports([_exited(node2, second)])
        agent_reports([_started(node2, second)])
    for job in (first, second):
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED and job.started_at is None
        assert "started" not in _kinds(job) and _held(job) == 0
    assert [m for _, m in outbox if m["type"] == "stop"] == []


def test_gang_and_single_node_jobs_in_one_batch(world, outbox, django_capture_on_commit_callbacks):
    [(gang, _)] = _placed(world, gpus=2, nodes=2)
    first, second = sorted({a.node for a in gang.allocations.all()}, key=lambda n: n.name)
    [(single, node)] = _placed(world)
    with django_capture_on_commit_callbacks(execute=True):
        agent_reports([_started(first, gang), _started(node, single)])
        agent_reports([_started(second, gang)])
    gang.refresh_from_db()
    assert gang.state == JobState.RUNNING and _kinds(gang).count("started") == 2
    # A failing gang member stops the rest; the job ends with its last node's exit.
    with django_capture_on_commit_callbacks(execute=True):
        result = agent_reports([_exited(first, gang, code=1), _exited(node, single)])
    assert result["failed"] == 0
    gang.refresh_from_db()
    single.refresh_from_db()
    assert single.state == JobState.SUCCEEDED
    assert gang.state == JobState.STOPPING and _held(gang) == 2
    assert "node_exited" in _kinds(gang)
    assert (second.name, "stop", gang.pk) in [(n, m["type"], m["job_id"]) for n, m in outbox]
    with django_capture_on_commit_callbacks(execute=True):
        agent_reports([_exited(second, gang, code=143)])
    gang.refresh_from_db()
    assert gang.state == JobState.CANCELLED and _held(gang) == 0


def test_a_gang_ends_with_its_last_node_in_the_same_batch(world):
    [(gang, _)] = _placed(world, gpus=2, nodes=2)
    first, second = sorted({a.node for a in gang.allocations.all()}, key=lambda n: n.name)
    agent_reports(
        [
            _started(first, gang),
            _started(second, gang),
            _exited(first, gang),
            _exited(second, gang),
        ]
    )
    gang.refresh_from_db()
    assert gang.state == JobState.SUCCEEDED and _held(gang) == 0
    assert _kinds(gang).count("started") == 2 and _kinds(gang).count("node_exited") == 1


def test_a_preempted_job_is_requeued(world, dispatch_requests, django_capture_on_commit_callbacks):
    [(job, node), (other, other_node)] = _placed(world, 2)
    agent_reports([_started(node, job), _started(other_node, other)])
    job.refresh_from_db()
    job_stop(job=job, reason=StopReason.PREEMPTED, message="room for a higher class")
    with django_capture_on_commit_callbacks(execute=True):
        agent_reports([_exited(node, job, code=143), _exited(other_node, other)])
    job.refresh_from_db()
    other.refresh_from_db()
    assert job.state == JobState.PENDING and job.requeue_count == 1
    assert job.preemption_count == 1 and _held(job) == 0
    assert _kinds(job)[-2:] == ["preempted", "requeued"]
    assert other.state == JobState.SUCCEEDED
    assert dispatch_requests == [1]


@pytest.mark.parametrize("with_heartbeat", [False, True], ids=["alone", "with-heartbeat"])
def test_a_failing_report_does_not_lose_the_others(world, with_heartbeat):
    """A report that cannot be applied (its time is out of range) makes the set-based
    path fail: the reports are applied one by one, and only that one is lost."""
    placed = _placed(world, 3)
    (bad, bad_node), *good = placed
    batch = [_started(node, job) for job, node in placed]
    batch += [{**_exited(bad_node, bad), "finished_at": 1e20}]
    batch += [_exited(node, job) for job, node in good]
    if with_heartbeat:  # the run of job reports is then not the whole group: a savepoint
        batch.insert(0, _heartbeat(bad_node, []))
    result = agent_reports(batch)
    assert result["failed"] == 1
    bad.refresh_from_db()
    assert bad.state == JobState.RUNNING and _held(bad) == 1
    for job, _ in good:
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED and _held(job) == 0
        assert _kinds(job).count("succeeded") == 1


def test_a_report_left_to_its_handler_that_fails_loses_only_itself(world, monkeypatch):
    placed = _placed(world, 2)
    (stopping, node), (other, other_node) = placed
    agent_reports([_started(node, stopping), _started(other_node, other)])
    stopping.refresh_from_db()
    job_stop(job=stopping, reason=StopReason.CANCELLED, message="stop")

    def broken(report):
        raise RuntimeError("disk full")

    monkeypatch.setitem(reports_service.HANDLERS, "exited", broken)
    result = agent_reports([_exited(node, stopping), _exited(other_node, other)])
    assert result["failed"] == 1
    stopping.refresh_from_db()
    other.refresh_from_db()
    assert stopping.state == JobState.STOPPING and other.state == JobState.SUCCEEDED


def test_one_dispatch_request_for_the_batch(
    world, dispatch_requests, django_capture_on_commit_callbacks
):
    placed = _placed(world, 3)
    with django_capture_on_commit_callbacks(execute=True):
        agent_reports([_started(node, job) for job, node in placed])
    assert dispatch_requests == []  # nothing ended
    with django_capture_on_commit_callbacks(execute=True):
        agent_reports([_exited(node, job) for job, node in placed])
    assert dispatch_requests == [1]


@pytest.mark.django_db(transaction=True)
def test_two_workers_on_the_same_jobs_at_once(world, dispatch_requests, monkeypatch):
    """Two workers apply batches about the same jobs at once, in opposite orders (a batch
    delivered twice, handled by two workers): the jobs end once each, nothing fails, and
    no deadlock sends the reports to the one-by-one fallback (the jobs are locked by id;
    one report at a time, the two workers would lock them in opposite orders)."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: SQLite serializes writers anyway")
    one_by_one = []
    for kind in ("started", "exited"):
        handler = reports_service.HANDLERS[kind]
        monkeypatch.setitem(
            reports_service.HANDLERS,
            kind,
            lambda report, handler=handler: one_by_one.append(report) or handler(report),
        )
    placed = _placed(world, 8)
    batch = [r for job, node in placed for r in (_started(node, job), _exited(node, job))]
    batches = [batch, batch[::-1]]
    barrier = threading.Barrier(2)
    results, errors = [], []

    def run(reports):
        from django.db import connections

        try:
            barrier.wait()
            for _ in range(3):
                results.append(agent_reports(reports))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert [r["failed"] for r in results] == [0] * 6
    assert one_by_one == []
    for job, _ in placed:
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED and _held(job) == 0
        assert _kinds(job).count("succeeded") == 1
    # Each success is in the runtime history once (two rows: the submitter's, the project's).
    assert sorted(len(r.entries) for r in RuntimeHistory.objects.all()) == [8, 8]
