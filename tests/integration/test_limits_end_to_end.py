"""Runtime limits, idle reclaim and stuck launches with a real worker, beat (a control sweep
every second) and agents whose simulated GPUs follow the CPU use of the jobs."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEvent
from scheduling.choices import JobState, NodeState, NotificationKind, ReclaimKind
from scheduling.models import (
    Allocation,
    Gpu,
    Job,
    Node,
    Notification,
    ReclaimRecord,
    WorkloadPolicy,
)
from tests import factories as f

pytestmark = pytest.mark.integration

IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(600)"
)
BUSY = "import time\nend = time.time() + 600\nwhile time.time() < end: pass"


def _client(user):
    client = APIClient()
    client.force_authenticate(user=user)
    return client


def _submit(w, command, *, workload_type="training", runtime=600, gpus=1):
    body = {
        "project": w["project"].pk,
        "queue": w["queue"].pk,
        "workload_type": workload_type,
        "command": command,
        "gpus_per_node": gpus,
        "max_runtime_seconds": runtime,
    }
    response = _client(w["member"]).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _job(job_id) -> Job:
    return Job.objects.get(pk=job_id)


def _node_ready(cluster, name, gpus=4):
    cluster.wait_for(
        lambda: (
            Gpu.objects.filter(node__name=name).count() == gpus
            and Node.objects.filter(name=name, state=NodeState.READY).exists()
        ),
        what=f"{name} registered",
    )


def _audited(action, job_id) -> bool:
    return AuditEvent.objects.filter(
        action=action, target_type="scheduling.job", target_id=str(job_id)
    ).exists()


def _notified(user, kind, job_id) -> int:
    return Notification.objects.filter(user=user, kind=kind, job_id=job_id).count()


def _released(job_id) -> bool:
    return not Allocation.objects.filter(job_id=job_id, released_at__isnull=True).exists()


def test_runtime_limit_warns_twice_then_times_out_and_kills_after_the_grace(cluster, it_world):
    member = it_world["member"]
    cluster.start_agent("it-01")
    _node_ready(cluster, "it-01")
    polite = _submit(it_world, ["sleep", "600"], runtime=5)
    stubborn = _submit(it_world, ["python3", "-c", IGNORES_SIGTERM], runtime=5)
    for job_id in (polite, stubborn):
        cluster.wait_for(
            lambda j=job_id: _job(j).state == JobState.TIMED_OUT, timeout=45, what="timed out"
        )
    for job_id in (polite, stubborn):
        job = _job(job_id)
        warnings = job.events.filter(kind="runtime_warning").order_by("id")
        assert [e.data["fraction"] for e in warnings] == [0.8, 0.95]
        assert job.runtime_warnings_sent == [0.8, 0.95]
        assert job.stop_reason == "timed_out" and job.events.filter(kind="stop_timed_out").exists()
        assert _audited("job.timeout", job_id)
        assert _notified(member, NotificationKind.RUNTIME_WARNING, job_id) == 2
        assert _notified(member, NotificationKind.JOB_TIMED_OUT, job_id) == 1
        assert _released(job_id)
        assert ReclaimRecord.objects.filter(job_id=job_id, kind=ReclaimKind.TIMEOUT).count() == 1
        ran = (job.stop_requested_at - job.started_at).total_seconds()
        assert 5 <= ran < 5 + 3, f"stopped {ran} s after its start"
    took = (_job(polite).finished_at - _job(polite).stop_requested_at).total_seconds()
    assert took < 2.5, f"sleep took {took} s to stop on SIGTERM"
    job = _job(stubborn)
    took = (job.finished_at - job.stop_requested_at).total_seconds()
    assert took >= 2.5, f"killed {took} s after the stop, before the 3 s grace"
    assert job.exit_signal == 9


@pytest.fixture
def quick_idle_reclaim(it_world):
    """Interactive sessions idle for 6 s (below 5 %) are reclaimed, warned 3 s before."""
    WorkloadPolicy.objects.filter(workload_type="interactive").update(
        idle_reclaim_enabled=True,
        idle_utilization_threshold=5.0,
        idle_window_seconds=6,
        idle_warning_lead_seconds=3,
    )


def test_idle_session_is_warned_and_reclaimed_but_busy_and_exempt_ones_are_not(
    cluster, it_world, quick_idle_reclaim
):
    member = it_world["member"]  # an admin of the tenant in it_world: may exempt
    cluster.start_agent("it-01")
    _node_ready(cluster, "it-01")
    idle = _submit(it_world, ["sleep", "600"], workload_type="interactive")
    busy = _submit(it_world, ["python3", "-c", BUSY], workload_type="interactive")
    exempt = _submit(it_world, ["sleep", "600"], workload_type="interactive")
    until = timezone.now() + timedelta(seconds=15)
    response = _client(member).post(
        f"/api/v1/jobs/{exempt}/exempt",
        {"until": until.isoformat(), "reason": "loading a dataset"},
        format="json",
    )
    assert response.status_code == 200, response.json()

    cluster.wait_for(lambda: _job(idle).state == JobState.RECLAIMED, timeout=40, what="reclaim")
    job = _job(idle)
    warning = job.events.get(kind="idle_warning")
    stop = job.events.get(kind="stop_reclaimed")
    assert warning.created_at < stop.created_at
    idle_for = (job.stop_requested_at - job.started_at).total_seconds()
    assert 6 <= idle_for < 6 + 4, f"reclaimed after {idle_for} s"
    assert _audited("job.reclaim", idle) and _released(idle)
    assert _notified(member, NotificationKind.IDLE_WARNING, idle) == 1
    assert _notified(member, NotificationKind.JOB_RECLAIMED, idle) == 1
    assert ReclaimRecord.objects.filter(job_id=idle, kind=ReclaimKind.IDLE_RECLAIM).exists()
    assert _job(exempt).state == JobState.RUNNING  # exempt meanwhile

    cluster.wait_for(
        lambda: _job(exempt).state == JobState.RECLAIMED, timeout=45, what="reclaim after exemption"
    )
    job = _job(exempt)
    assert job.stop_requested_at >= until + timedelta(seconds=6)
    assert job.events.filter(kind="idle_warning").count() == 1
    assert _audited("job.idle_exempt", exempt) and _audited("job.reclaim", exempt)

    busy_job = _job(busy)
    assert busy_job.state == JobState.RUNNING, busy_job.events.values_list("kind", "message")
    assert not busy_job.events.filter(kind="idle_warning").exists()
    assert (timezone.now() - busy_job.last_active_at).total_seconds() < 5
    _client(member).post(f"/api/v1/jobs/{busy}/cancel", {}, format="json")
    cluster.wait_for(lambda: _job(busy).state == JobState.CANCELLED, timeout=30, what="cancel")


def test_stuck_launch_is_requeued(cluster, it_world):
    """A node that heartbeats (its row is kept fresh here) but whose agent never starts
    anything: the job admitted onto it goes back to the queue."""
    cluster.kill("worker")
    cluster.env["SLUICE_STUCK_LAUNCH_SECONDS"] = "4"
    cluster.start_worker()
    ghost = f.NodeFactory(name="ghost-01", pool=it_world["pool"], last_heartbeat=timezone.now())
    for index in range(2):
        f.GpuFactory(node=ghost, index=index, uuid=f"GPU-ghost-{index}")
    job_id = _submit(it_world, ["sleep", "600"])

    def requeued():
        Node.objects.filter(pk=ghost.pk).update(last_heartbeat=timezone.now())
        return _job(job_id).requeue_count >= 1

    cluster.wait_for(requeued, timeout=60, what="stuck launch requeued")
    job = _job(job_id)
    event = job.events.filter(kind="requeued").first()
    assert "after its admission" in event.message and "ghost-01" in event.message
    assert _audited("job.requeue", job_id)
    assert _notified(it_world["member"], NotificationKind.JOB_REQUEUED, job_id) >= 1
    record = ReclaimRecord.objects.filter(job_id=job_id, kind=ReclaimKind.STUCK_LAUNCH).first()
    assert record is not None and record.gpus == 1
    first = Allocation.objects.filter(job_id=job_id).order_by("id").first()
    assert first.released_at is not None
    _client(it_world["member"]).post(f"/api/v1/jobs/{job_id}/cancel", {}, format="json")
