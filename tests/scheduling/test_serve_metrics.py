"""The portal's side of serving jobs: ``serve_metrics`` reports become
``ServeSample`` rows and the job's endpoint (``serve_port``, ``serve_ready``); the port of
``started``; the samples' selector and retention."""

from datetime import UTC, datetime, timedelta

from django.core.cache import cache
from django.utils import timezone

from scheduling import selectors
from scheduling.agent.protocol import serve_metrics_report, started_report
from scheduling.choices import JobState, WorkloadType
from scheduling.models import Allocation, ServeSample
from scheduling.services import serving, sweeps
from scheduling.services.dispatch import dispatch_cycle
from scheduling.services.reports import agent_reports_process
from scheduling.services.serving import SERVE_SAMPLES_CLEANUP_KEY
from tests import factories as f

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC).timestamp()


def _serving_job(world, state=JobState.RUNNING, node_index=0, **fields):
    held = Allocation.objects.filter(released_at__isnull=True).values("gpu_id")
    free = world.nodes[node_index].gpus.exclude(pk__in=held)
    return f.placed_job(
        gpus=[free.order_by("index")[0]],
        state=state,
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        workload_type=WorkloadType.INFERENCE,
        serve={"health_path": "/health", "metrics_path": "/metrics"},
        **fields,
    )


def _sample(job, at=T0, **overrides):
    return {
        "job_id": job.pk,
        "attempt": job.attempt,
        "port": 20001,
        "ready": True,
        "running": 2.0,
        "waiting": 1.0,
        "requests_total": 40.0,
        "errors_total": 1.0,
        "latency_buckets": [[0.05, 10.0], [0.1, 39.0], [None, 40.0]],
        "scraped_at": at,
        **overrides,
    }


def _send(node, *samples):
    return agent_reports_process(
        reports=[serve_metrics_report(node=node.name, samples=list(samples))]
    )


def test_a_report_stores_samples_and_the_endpoint(world):
    job = _serving_job(world)
    other = _serving_job(world, node_index=0)
    result = _send(world.nodes[0], _sample(job), _sample(other, port=20002, ready=False))
    assert result["failed"] == 0 and result["invalid"] == 0
    row = ServeSample.objects.get(job=job)
    assert (row.node_id, row.port, row.ready) == (world.nodes[0].pk, 20001, True)
    assert (row.running, row.waiting, row.requests_total, row.errors_total) == (2, 1, 40, 1)
    assert row.latency_buckets == [[0.05, 10.0], [0.1, 39.0], [None, 40.0]]
    assert row.at == datetime.fromtimestamp(T0, tz=UTC)
    job.refresh_from_db()
    other.refresh_from_db()
    assert (job.serve_port, job.serve_ready) == (20001, True)
    assert (other.serve_port, other.serve_ready) == (20002, False)


def test_a_repeated_report_changes_nothing(world):
    job = _serving_job(world)
    report = serve_metrics_report(node=world.nodes[0].name, samples=[_sample(job)])
    agent_reports_process(reports=[report])
    agent_reports_process(reports=[report, report])
    assert ServeSample.objects.filter(job=job).count() == 1


def test_an_older_report_handled_late_does_not_flip_readiness_back(world):
    job = _serving_job(world)
    _send(world.nodes[0], _sample(job, at=T0 + 2, ready=True))
    _send(world.nodes[0], _sample(job, at=T0, ready=False))
    job.refresh_from_db()
    assert job.serve_ready is True
    assert list(ServeSample.objects.filter(job=job).values_list("ready", flat=True)) == [
        False,
        True,
    ]
    _send(world.nodes[0], _sample(job, at=T0 + 4, ready=False))
    job.refresh_from_db()
    assert job.serve_ready is False


def test_a_stopping_replica_is_not_ready(world):
    job = _serving_job(world, state=JobState.STOPPING)
    _send(world.nodes[0], _sample(job, ready=True))
    job.refresh_from_db()
    assert (job.serve_port, job.serve_ready) == (20001, False)


def test_samples_of_other_attempts_nodes_or_ended_jobs_are_dropped(world):
    job = _serving_job(world)
    ended = _serving_job(world, state=JobState.SUCCEEDED)
    _send(world.nodes[0], _sample(job, attempt=job.attempt + 1), _sample(ended))
    _send(world.nodes[1], _sample(job))  # not placed there
    assert not ServeSample.objects.exists()
    job.refresh_from_db()
    assert (job.serve_port, job.serve_ready) == (None, False)


def test_a_bad_report_is_refused_whole(world):
    job = _serving_job(world)
    bad = serve_metrics_report(node=world.nodes[0].name, samples=[_sample(job)])
    bad["samples"][0]["ready"] = "yes"
    assert agent_reports_process(reports=[bad])["invalid"] == 1
    assert not ServeSample.objects.exists()


def test_the_started_report_gives_the_endpoint_port(world):
    job = f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        workload_type=WorkloadType.INFERENCE,
        serve={"health_path": "/health", "metrics_path": "/metrics"},
    )
    dispatch_cycle()
    job.refresh_from_db()
    node = job.allocations.first().node
    report = started_report(
        node=node.name, job_id=job.pk, attempt=job.attempt, pid=99, started_at=T0, port=20123
    )
    agent_reports_process(reports=[report])
    job.refresh_from_db()
    assert (job.state, job.serve_port, job.serve_ready) == (JobState.RUNNING, 20123, False)
    assert job.events.get(kind="started").data["port"] == 20123


def test_a_requeued_replica_is_not_ready_until_scraped_again(world):
    job = f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        workload_type=WorkloadType.INFERENCE,
        serve={"health_path": "/health", "metrics_path": "/metrics"},
        serve_port=20001,
        serve_ready=True,  # as its previous attempt left it
        requeue_count=1,
    )
    dispatch_cycle()
    job.refresh_from_db()
    node = job.allocations.first().node
    report = started_report(
        node=node.name, job_id=job.pk, attempt=job.attempt, pid=99, started_at=T0, port=20200
    )
    agent_reports_process(reports=[report])
    job.refresh_from_db()
    assert (job.state, job.serve_port, job.serve_ready) == (JobState.RUNNING, 20200, False)


def test_the_started_report_alone_gives_the_port_too(world):
    from scheduling.tasks import agent_report

    job = f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        workload_type=WorkloadType.INFERENCE,
        serve={"health_path": "/health", "metrics_path": "/metrics"},
    )
    dispatch_cycle()
    job.refresh_from_db()
    node = job.allocations.first().node
    agent_report(
        started_report(
            node=node.name, job_id=job.pk, attempt=job.attempt, pid=9, started_at=T0, port=20124
        )
    )
    job.refresh_from_db()
    assert (job.state, job.serve_port) == (JobState.RUNNING, 20124)


def test_selector_orders_by_time_and_scopes_to_the_user(world):
    job = _serving_job(world)
    for i in (2, 0, 1):
        _send(world.nodes[0], _sample(job, at=T0 + i, requests_total=float(i)))
    since = datetime.fromtimestamp(T0 + 1, tz=UTC)
    rows = list(selectors.serve_samples([job.pk], since))
    assert [r.requests_total for r in rows] == [1.0, 2.0]
    assert len(selectors.serve_samples([job.pk])) == 3
    assert len(selectors.serve_samples([job.pk], user=world.viewer)) == 3
    assert len(selectors.serve_samples([job.pk], user=world.platform_admin)) == 3
    assert not selectors.serve_samples([job.pk], user=world.outsider).exists()


def test_an_outsider_cannot_see_the_endpoint(world, api):
    job = _serving_job(world)
    _send(world.nodes[0], _sample(job))
    assert api(world.outsider).get(f"/api/v1/jobs/{job.pk}").status_code == 404
    shown = api(world.viewer).get(f"/api/v1/jobs/{job.pk}").json()
    assert (shown["serve_port"], shown["serve_ready"]) == (20001, True)


def test_retention_sweep_deletes_old_samples(world, settings):
    settings.SLUICE_SERVE_SAMPLE_RETENTION_HOURS = 24
    job = _serving_job(world)
    now = timezone.now()
    for hours in (30, 25, 23, 1):
        _send(world.nodes[0], _sample(job, at=(now - timedelta(hours=hours)).timestamp()))
    cache.delete(SERVE_SAMPLES_CLEANUP_KEY)
    results = sweeps.control_sweep(now=now)
    assert results["serve_samples"] == {"serve_samples_deleted": 2}
    assert ServeSample.objects.count() == 2
    # At most once per cleanup period.
    assert serving.serve_samples_expire(now=now + timedelta(hours=10)) == "not due"
    assert ServeSample.objects.count() == 2


def test_retention_sweep_deletes_in_chunks(world, monkeypatch):
    monkeypatch.setattr(serving, "DELETE_CHUNK", 2)
    job = _serving_job(world)
    old = timezone.now() - timedelta(days=3)
    ServeSample.objects.bulk_create(
        [ServeSample(job=job, node=world.nodes[0], at=old + timedelta(seconds=i)) for i in range(5)]
    )
    assert serving.serve_samples_delete_old() == {"serve_samples_deleted": 5}
    assert not ServeSample.objects.exists()


def test_samples_in_a_batch_do_not_split_the_job_reports_applied_together(world, monkeypatch):
    """A ``serve_metrics`` report between ``started`` and ``exited`` reports is applied
    after them: one set-based pass for the starts and exits, the sample on the started job."""
    from scheduling.agent.protocol import exited_report
    from scheduling.services import nodes

    serving_job = f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        workload_type=WorkloadType.INFERENCE,
        serve={"health_path": "/health", "metrics_path": "/metrics"},
    )
    plain = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    dispatch_cycle()
    serving_job.refresh_from_db()
    plain.refresh_from_db()
    node = serving_job.allocations.first().node
    assert plain.allocations.first().node == node
    passes = []
    real = nodes.job_reports_apply
    monkeypatch.setattr(nodes, "job_reports_apply", lambda **kw: passes.append(1) or real(**kw))
    reports = [
        started_report(node=node.name, job_id=serving_job.pk, attempt=0, pid=5, started_at=T0),
        serve_metrics_report(node=node.name, samples=[_sample(serving_job, at=T0 + 1)]),
        started_report(node=node.name, job_id=plain.pk, attempt=0, pid=6, started_at=T0),
        exited_report(
            node=node.name, job_id=plain.pk, attempt=0, exit_code=0, signal=None,
            stop_reason=None, message="", finished_at=T0 + 2,
        ),
    ]  # fmt: skip
    reports[0]["port"] = 20001
    assert agent_reports_process(reports=reports)["failed"] == 0
    assert passes == [1]
    serving_job.refresh_from_db()
    plain.refresh_from_db()
    assert (serving_job.state, serving_job.serve_port, serving_job.serve_ready) == (
        JobState.RUNNING,
        20001,
        True,
    )
    assert plain.state == JobState.SUCCEEDED
