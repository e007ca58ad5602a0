"""The control loop around the autoscaler: the SLO handed to replicas, draining replicas
taken back when the count rises again, waiting replicas cancelled when the load that asked
for them is gone."""

from datetime import timedelta

import pytest
from django.utils import timezone

from inference.models import Service, ServiceReplica
from inference.selectors import service_endpoints
from inference.services import SLO_ENV, service_reconcile, service_tick
from scheduling.agent.sample_model_server import ModelStats
from scheduling.choices import JobState
from scheduling.models import Job, ServeSample
from tests.inference.factories import replica, set_job

pytestmark = pytest.mark.usefixtures("dispatch_requests")


def _desire(service, n):
    Service.objects.filter(pk=service.pk).update(desired_replicas=n)
    service.refresh_from_db()


def test_replicas_carry_the_slo_for_their_model_server(service):
    Service.objects.filter(pk=service.pk).update(latency_slo_ms=150, env={"MODEL": "m"})
    service.refresh_from_db()
    _desire(service, 1)
    job = Job.objects.get(pk=service_reconcile(service=service).submitted[0])
    assert job.env == {"MODEL": "m", SLO_ENV: "0.15"}


def test_the_sample_model_server_makes_the_slo_a_bucket_bound(monkeypatch):
    monkeypatch.setenv(SLO_ENV, "0.15")
    stats = ModelStats()
    for _ in range(3):
        stats.observe(0.107, failed=False)  # a 100 ms model's answer
    text = stats.render()
    assert 'sluice_request_duration_seconds_bucket{le="0.15"} 3' in text
    assert 'sluice_request_duration_seconds_bucket{le="0.1"} 0' in text
    monkeypatch.setenv(SLO_ENV, "not a number")
    assert 'le="0.15"' not in ModelStats().render()


def test_a_draining_replica_is_taken_back_before_a_new_one_is_submitted(service, settings):
    """Scaled 2 → 1, then back to 2 while the leaving replica drains: it serves again at
    once, where a new replica would wait for the quota it still holds."""
    settings.SLUICE_SERVICE_DRAIN_S = 30
    a = replica(service, state=JobState.RUNNING, ready=True, port=31000)
    b = replica(service, state=JobState.RUNNING, ready=True, port=31001)
    _desire(service, 1)
    assert service_reconcile(service=service).cancelled == [b.job_id]
    _desire(service, 2)
    result = service_reconcile(service=service)
    assert result.submitted == [] and result.taken_back == [b.job_id]
    b.refresh_from_db()
    assert b.retired_at is None and b.drain_until is None and b.retire_reason == ""
    assert set_job(b).state == JobState.RUNNING
    assert {e["job"] for e in service_endpoints(service)} == {a.job_id, b.job_id}
    assert Job.objects.filter(pk__in=[a.job_id, b.job_id]).count() == Job.objects.count()


def test_a_stopped_replica_is_not_taken_back(service, settings):
    settings.SLUICE_SERVICE_DRAIN_S = 30
    replica(service, state=JobState.RUNNING, ready=True)
    b = replica(service, state=JobState.RUNNING, ready=True)
    _desire(service, 1)
    service_reconcile(service=service)
    set_job(b, state=JobState.STOPPING)  # its drain is over: stopping
    _desire(service, 2)
    result = service_reconcile(service=service)
    assert result.taken_back == [] and len(result.submitted) == 1


def test_waiting_replicas_the_load_no_longer_asks_for_are_cancelled(service):
    """4 wanted (the panic hold), 2 serving, 2 waiting for quota; the load has ended: the
    next tick cancels the 2 waiting ones, the 2 serving stay."""
    serving = [replica(service, state=JobState.RUNNING, ready=True) for _ in range(2)]
    waiting = [replica(service) for _ in range(2)]
    for r in waiting:
        set_job(r, pending_reason_code="WAITING_FOR_QUOTA", pending_reason_message="at quota")
    now = timezone.now()
    node = service.queue.pool.nodes.first()
    for r in serving:
        for t in range(60, -1, -2):
            ServeSample.objects.create(
                job_id=r.job_id,
                node_id=node.pk,
                at=now - timedelta(seconds=t),
                port=8000,
                ready=True,
                running=8.0 if t > 20 else 0.0,
                waiting=0,
                requests_total=float(60 - t),
                errors_total=0.0,
            )
    Service.objects.filter(pk=service.pk).update(
        desired_replicas=4,
        autoscaler_state={
            "recommendations": [[now.timestamp() - 10, 4]],
            "panic_until": now.timestamp() + 40,
            "last_activity_at": now.timestamp() - 20,
        },
    )
    row = service_tick(service_id=service.pk, now=now)
    assert (row.current, row.desired, row.reason_code) == (4, 2, "waiting_not_needed")
    assert sorted(row.inputs["cancelled"]) == sorted(r.job_id for r in waiting)
    for r in waiting:
        assert set_job(r).state == JobState.CANCELLED
    for r in serving:
        assert set_job(r).state == JobState.RUNNING
    live = ServiceReplica.objects.filter(service=service, retired_at__isnull=True)
    assert {r.job_id for r in live} == {r.job_id for r in serving}
