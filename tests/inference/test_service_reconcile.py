"""service_reconcile and service_tick: replicas submitted, cancelled, replaced and rolled
towards the desired count, within the tenant's quota, with the reason when blocked."""

from datetime import timedelta

import pytest
from django.utils import timezone

from inference.choices import ServiceState
from inference.models import ScaleDecision, Service, ServiceReplica
from inference.selectors import service_endpoints
from inference.services import (
    replicas_drained,
    service_reconcile,
    service_tick,
    service_update,
    services_tick,
)
from scheduling.choices import JobState, WorkloadType
from scheduling.models import Job, ServeSample
from tests.inference.factories import replica, set_job

pytestmark = pytest.mark.usefixtures("dispatch_requests")


def _desire(service, n):
    Service.objects.filter(pk=service.pk).update(desired_replicas=n)
    service.refresh_from_db()


def _live(service):
    return list(
        ServiceReplica.objects.filter(service=service, retired_at__isnull=True)
        .select_related("job")
        .order_by("id")
    )


def test_scale_up_submits_inference_jobs_that_serve(service, world):
    _desire(service, 2)
    result = service_reconcile(service=service)
    assert len(result.submitted) == 2 and not result.blocked_code
    jobs = Job.objects.filter(pk__in=result.submitted).order_by("id")
    for job in jobs:
        assert job.workload_type == WorkloadType.INFERENCE
        assert job.state == JobState.PENDING
        assert job.queue_id == service.queue_id and job.project_id == world.project.pk
        assert job.submitted_by_id == world.member.pk
        assert job.serve == {"health_path": "/health", "metrics_path": "/metrics"}
        assert job.labels["sluice.service"] == str(service.pk)
        assert job.max_runtime_seconds == 7 * 86400  # the inference policy's maximum
    assert [r.job_id for r in _live(service)] == [j.pk for j in jobs]
    # idempotent: nothing changed, nothing done
    again = service_reconcile(service=service)
    assert again.submitted == [] and again.cancelled == []


def test_scale_down_cancels_not_ready_and_newest_first(service):
    ready = replica(service, state=JobState.RUNNING, ready=True)
    older_waiting = replica(service)
    newer_waiting = replica(service)
    _desire(service, 2)
    result = service_reconcile(service=service)
    assert result.cancelled == [newer_waiting.job_id]
    assert set_job(newer_waiting).state == JobState.CANCELLED
    assert {r.job_id for r in _live(service)} == {ready.job_id, older_waiting.job_id}
    _desire(service, 1)
    assert service_reconcile(service=service).cancelled == [older_waiting.job_id]
    newer_waiting.refresh_from_db()
    assert newer_waiting.retired_at is not None and "scale down" in newer_waiting.retire_reason


def test_a_ready_replica_leaving_is_drained_then_stopped(service, settings):
    settings.SLUICE_SERVICE_DRAIN_S = 5
    a = replica(service, state=JobState.RUNNING, ready=True)
    b = replica(service, state=JobState.RUNNING, ready=True, port=31000)
    _desire(service, 1)
    result = service_reconcile(service=service)
    assert result.cancelled == [b.job_id]
    b.refresh_from_db()
    assert b.retired_at is not None and b.drain_until is not None
    # out of the endpoints at once, still serving what the balancer sent it
    assert [e["job"] for e in service_endpoints(service)] == [a.job_id]
    assert set_job(b).state == JobState.RUNNING
    assert replicas_drained(now=b.retired_at + timedelta(seconds=4)) == []
    assert replicas_drained(now=b.retired_at + timedelta(seconds=5)) == [b.job_id]
    assert set_job(b).state == JobState.STOPPING
    assert set_job(a).state == JobState.RUNNING
    b.refresh_from_db()
    assert b.drain_until is None
    assert replicas_drained(now=b.retired_at + timedelta(seconds=60)) == []


def test_without_drain_a_leaving_replica_stops_at_once(service, settings):
    settings.SLUICE_SERVICE_DRAIN_S = 0
    replica(service, state=JobState.RUNNING, ready=True)
    b = replica(service, state=JobState.RUNNING, ready=True)
    _desire(service, 1)
    assert service_reconcile(service=service).cancelled == [b.job_id]
    assert set_job(b).state == JobState.STOPPING


def test_a_dead_replica_is_retired_and_replaced(service):
    dead = replica(service, state=JobState.RUNNING, ready=True)
    set_job(dead, state=JobState.FAILED, finished_at=timezone.now())
    _desire(service, 1)
    result = service_reconcile(service=service)
    assert result.retired == [dead.job_id]
    assert len(result.submitted) == 1
    dead.refresh_from_db()
    assert dead.retired_at is not None and dead.retire_reason == "job failed"
    assert [r.job_id for r in _live(service)] == result.submitted


def test_rolling_update_keeps_old_replicas_until_new_ones_are_ready(service, world):
    old = [replica(service, state=JobState.RUNNING, ready=True) for _ in range(2)]
    _desire(service, 2)
    service_update(user=world.member, service=service, changes={"command": ["serve", "--v2"]})
    service.refresh_from_db()
    assert service.spec_version == 2
    first = service_reconcile(service=service)
    assert len(first.submitted) == 2 and first.cancelled == []
    new_jobs = Job.objects.filter(pk__in=first.submitted)
    assert all(j.command == ["serve", "--v2"] for j in new_jobs)
    # one new replica ready: one old one leaves
    set_job(new_jobs[0], state=JobState.RUNNING, serve_ready=True)
    second = service_reconcile(service=service)
    assert len(second.cancelled) == 1 and second.cancelled[0] in {r.job_id for r in old}
    # both ready: the other old one leaves too; the old ones are retired
    for job in new_jobs:
        set_job(job, state=JobState.RUNNING, serve_ready=True)
    third = service_reconcile(service=service)
    assert len(third.cancelled) == 1
    assert {r.spec_version for r in _live(service)} == {2}
    assert ServiceReplica.objects.filter(spec_version=1, retired_at__isnull=False).count() == 2


def test_at_quota_nothing_more_is_submitted_and_the_reason_shows(service, world, serving):
    """nlp: 4 guaranteed GPUs and inference not preemptible (no borrowing): with replicas
    of 2 GPUs, two fit; the third is not submitted and the timeline says why."""
    Service.objects.filter(pk=service.pk).update(gpus_per_node=2)
    service.refresh_from_db()
    _desire(service, 3)
    result = service_reconcile(service=service)
    assert len(result.submitted) == 2
    assert result.at_quota and result.blocked_code == "WAITING_FOR_QUOTA"
    assert "nlp uses 0/4 guaranteed" in result.blocked_message
    assert "4 GPUs of replicas waiting" not in result.blocked_message  # counted before submit
    assert "cannot borrow" in result.blocked_message
    # still at quota on the next pass: nothing more, same reason
    again = service_reconcile(service=service)
    assert again.submitted == [] and again.blocked_code == "WAITING_FOR_QUOTA"
    assert Job.objects.filter(workload_type=WorkloadType.INFERENCE).count() == 2


def test_tick_records_the_quota_reason_and_near_capacity(service, serving):
    Service.objects.filter(pk=service.pk).update(gpus_per_node=4, min_replicas=2, max_replicas=3)
    row = service_tick(service_id=service.pk)
    service.refresh_from_db()
    assert row.desired == 2 and row.blocked_reason_code == "WAITING_FOR_QUOTA"
    assert "At quota" in row.blocked_reason_message
    assert service.blocked_reason_code == "WAITING_FOR_QUOTA"
    assert service.near_capacity is False  # at quota, but not above target (no load yet)
    assert ServiceReplica.objects.filter(service=service).count() == 1


def test_a_waiting_replica_shows_its_pending_reason(service):
    r = replica(service)
    set_job(
        r,
        pending_reason_code="WAITING_FOR_GPUS",
        pending_reason_message="no node of pool inference has 1 idle GPU",
    )
    row = service_tick(service_id=service.pk)
    assert row.blocked_reason_code == "WAITING_FOR_GPUS"
    assert f"Replica job {r.job_id} waits" in row.blocked_reason_message


def _samples(job_ids, running, seconds=30, step=2):
    now = timezone.now()
    for job_id in job_ids:
        for i, t in enumerate(range(seconds, -1, -step)):
            ServeSample.objects.create(
                job_id=job_id,
                node_id=Job.objects.get(pk=job_id).queue.pool.nodes.first().pk,
                at=now - timedelta(seconds=t),
                port=8000,
                ready=True,
                running=running,
                waiting=0,
                requests_total=float(i * 10),
                errors_total=0.0,
            )


def test_tick_scales_up_on_load_and_records_the_decision(service):
    replicas = [replica(service, state=JobState.RUNNING, ready=True) for _ in range(2)]
    _samples([r.job_id for r in replicas], running=6)  # 12 ongoing, target 4 → 3
    row = service_tick(service_id=service.pk)
    assert (row.current, row.desired, row.reason_code) == (2, 3, "scale_up")
    assert row.inputs["stable_concurrency"] == pytest.approx(12)
    assert len(row.inputs["submitted"]) == 1
    service.refresh_from_db()
    assert service.desired_replicas == 3 and service.autoscaler_state["recommendations"]


def test_at_max_above_target_is_near_capacity(service):
    Service.objects.filter(pk=service.pk).update(max_replicas=2)
    replicas = [replica(service, state=JobState.RUNNING, ready=True) for _ in range(2)]
    _samples([r.job_id for r in replicas], running=10)
    row = service_tick(service_id=service.pk)
    service.refresh_from_db()
    assert row.desired == 2 and row.reason_code == "max_replicas"
    assert service.near_capacity and row.inputs["near_capacity"]


def test_a_quiet_tick_writes_no_line_until_the_interval(service, settings):
    settings.SLUICE_SERVICE_DECISION_EVERY_S = 3600
    replica(service, state=JobState.RUNNING, ready=True)
    assert service_tick(service_id=service.pk) is not None  # the first line
    assert service_tick(service_id=service.pk) is None
    assert ScaleDecision.objects.filter(service=service).count() == 1


def test_paused_and_deleted_services_have_no_replicas(service, world):
    a = replica(service, state=JobState.RUNNING, ready=True)
    Service.objects.filter(pk=service.pk).update(state=ServiceState.PAUSED)
    assert services_tick() == {"services": 1, "failed": 0}
    assert _live(service) == []
    assert set_job(a).state == JobState.RUNNING  # draining
    services_tick(now=timezone.now() + timedelta(seconds=60))
    assert set_job(a).state == JobState.STOPPING
    assert services_tick() == {"services": 0, "failed": 0}  # nothing left to cancel


def test_one_failing_service_does_not_stop_the_others(service, monkeypatch, world, serving):
    from tests.inference.factories import ServiceFactory

    other = ServiceFactory(queue=serving.queue, project=world.project, created_by=world.member)
    calls = []

    def tick(*, service_id, now=None):
        calls.append(service_id)
        if service_id == service.pk:
            raise RuntimeError("boom")

    monkeypatch.setattr("inference.services.service_tick", tick)
    assert services_tick() == {"services": 1, "failed": 1}
    assert sorted(calls) == sorted([service.pk, other.pk])


def test_the_beat_task_runs_the_tick(service):
    from inference.tasks import services_tick as task

    result = task.apply().get()
    assert result["leader"] is True and result["services"] == 1
    assert ServiceReplica.objects.filter(service=service).count() == 1


def test_rolling_update_at_quota_replaces_one_replica_at_a_time(world, serving, service):
    """4 guaranteed GPUs, 2 replicas of 2 GPUs running: no room to start a new replica
    beside the old ones, so one old replica leaves (only once every new one is ready)."""
    from tests import factories as f

    Service.objects.filter(pk=service.pk).update(gpus_per_node=2)
    service.refresh_from_db()
    gpus = list(serving.node.gpus.order_by("index"))
    old = []
    for pair in (gpus[:2], gpus[2:]):
        r = replica(service, state=JobState.RUNNING, ready=True)
        for gpu in pair:
            f.AllocationFactory(job=r.job, gpu=gpu)
        old.append(r)
    _desire(service, 2)
    service_update(user=world.member, service=service, changes={"env": {"MODEL": "v2"}})
    service.refresh_from_db()
    first = service_reconcile(service=service)
    assert first.submitted == [] and first.at_quota
    assert len(first.cancelled) == 1  # makes room for one new replica
    left = next(r for r in old if r.job_id == first.cancelled[0])
    Job.objects.filter(pk=left.job_id).update(state=JobState.CANCELLED)
    from scheduling.models import Allocation

    Allocation.objects.filter(job_id=left.job_id).update(released_at=timezone.now())
    second = service_reconcile(service=service)
    assert len(second.submitted) == 1 and second.cancelled == []  # the other old one serves
    new = set_job(Job.objects.get(pk=second.submitted[0]), state=JobState.RUNNING, serve_ready=True)
    for gpu in gpus[:2] if left is old[0] else gpus[2:]:
        f.AllocationFactory(job=new, gpu=gpu)
    third = service_reconcile(service=service)
    assert third.at_quota and third.submitted == []
    assert third.cancelled == [r.job_id for r in old if r is not left]


def test_the_tick_tasks_time_limits_are_consistent():
    """Celery refuses to apply a task whose soft limit is above its hard limit (found by
    the integration test: beat could not send the tick with the default soft limit)."""
    from inference.tasks import services_tick as task

    assert task.soft_time_limit < task.time_limit


def test_a_service_held_at_quota_writes_one_line_per_interval(service, serving, settings):
    settings.SLUICE_SERVICE_DECISION_EVERY_S = 3600
    Service.objects.filter(pk=service.pk).update(gpus_per_node=4, min_replicas=2, max_replicas=3)
    assert service_tick(service_id=service.pk) is not None  # submits one, at quota for two
    assert service_tick(service_id=service.pk) is not None  # the replica count changed
    for _ in range(3):
        assert service_tick(service_id=service.pk) is None  # same numbers, same reason
    assert ScaleDecision.objects.filter(service=service).count() == 2
