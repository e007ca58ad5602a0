"""Jobs run as real processes on simulated GPUs, driven by a real worker, beat and agents."""

import pytest
from rest_framework.test import APIClient

from scheduling.choices import JobState, NodeState
from scheduling.models import Allocation, Gpu, Job, Node

pytestmark = pytest.mark.integration


def _client(user):
    client = APIClient()
    client.force_authenticate(user=user)
    return client


def _submit(w, command, *, gpus=1, priority="", shell=False, runtime=None):
    body = {
        "project": w["project"].pk,
        "queue": w["queue"].pk,
        "workload_type": "training",
        "command": command,
        "shell": shell,
        "gpus_per_node": gpus,
        "priority_class": priority,
    }
    if runtime:
        body["max_runtime_seconds"] = runtime
    response = _client(w["member"]).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _state(job_id):
    return Job.objects.get(pk=job_id).state


def _node_ready(cluster, name, gpus=4):
    cluster.wait_for(
        lambda: (
            Gpu.objects.filter(node__name=name).count() == gpus
            and Node.objects.filter(name=name, state=NodeState.READY).exists()
        ),
        what=f"{name} registered",
    )


def test_job_sees_its_gpus_and_succeeds(cluster, it_world):
    cluster.start_agent("it-01")
    _node_ready(cluster, "it-01")
    job_id = _submit(
        it_world,
        ["python3", "-c", "import os; print('GPUS=' + os.environ['CUDA_VISIBLE_DEVICES'])"],
        gpus=2,
    )
    cluster.wait_for(lambda: _state(job_id) == JobState.SUCCEEDED, what="job succeeded")
    job = Job.objects.get(pk=job_id)
    indices = sorted(Allocation.objects.filter(job=job).values_list("gpu__index", flat=True))
    assert len(indices) == 2
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    logs = cluster.wait_for(
        lambda: (
            (r := _client(it_world["member"]).get(f"/api/v1/jobs/{job_id}/logs").json())["text"]
            and r
        ),
        what="log shipped",
    )
    assert f"GPUS={','.join(map(str, indices))}" in logs["text"]
    assert job.exit_code == 0 and job.started_at and job.finished_at


def test_cancel_stops_within_grace_and_frees_gpus(cluster, it_world):
    cluster.start_agent("it-01")
    _node_ready(cluster, "it-01")
    job_id = _submit(it_world, ["sleep", "600"])
    cluster.wait_for(lambda: _state(job_id) == JobState.RUNNING, what="running")
    response = _client(it_world["member"]).post(f"/api/v1/jobs/{job_id}/cancel", {}, format="json")
    assert response.status_code == 200, response.json()
    cluster.wait_for(lambda: _state(job_id) == JobState.CANCELLED, timeout=20, what="cancelled")
    job = Job.objects.get(pk=job_id)
    assert (job.finished_at - job.stop_requested_at).total_seconds() < 3 + 5
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_job_ignoring_sigterm_is_killed_after_grace(cluster, it_world):
    cluster.start_agent("it-01")
    _node_ready(cluster, "it-01")
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
    job_id = _submit(it_world, ["python3", "-c", script])
    cluster.wait_for(lambda: _state(job_id) == JobState.RUNNING, what="running")
    # Only once the handler is installed does the job really ignore SIGTERM.
    cluster.wait_for(
        lambda: (
            "ready" in _client(it_world["member"]).get(f"/api/v1/jobs/{job_id}/logs").json()["text"]
        ),
        what="the job to print ready",
    )
    _client(it_world["member"]).post(f"/api/v1/jobs/{job_id}/cancel", {}, format="json")
    cluster.wait_for(lambda: _state(job_id) == JobState.CANCELLED, timeout=30, what="killed")
    job = Job.objects.get(pk=job_id)
    took = (job.finished_at - job.stop_requested_at).total_seconds()
    assert took >= 2.5, f"stopped after {took}s, before the 3 s grace"
    assert job.exit_signal == 9 or job.exit_code in (-9, 137)


def test_killed_agent_makes_node_down_and_job_requeued(cluster, it_world):
    cluster.start_agent("it-01")
    _node_ready(cluster, "it-01")
    job_id = _submit(it_world, ["sleep", "600"])
    cluster.wait_for(lambda: _state(job_id) == JobState.RUNNING, what="running")
    cluster.kill("agent-it-01")
    cluster.wait_for(
        lambda: Node.objects.get(name="it-01").state == NodeState.DOWN, timeout=30, what="node down"
    )
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.PENDING and job.requeue_count == 1
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert job.events.filter(kind="lost").exists() and job.events.filter(kind="requeued").exists()
    from audit.models import AuditEvent

    assert (
        AuditEvent.objects.filter(
            action="node.down", target_id=str(Node.objects.get(name="it-01").pk)
        ).count()
        == 1
    )


def test_full_preemption_cycle(cluster, it_world):
    cluster.start_agent("it-01")
    _node_ready(cluster, "it-01")
    low = _submit(it_world, ["sleep", "600"], gpus=4, priority="low")
    cluster.wait_for(lambda: _state(low) == JobState.RUNNING, what="low running")
    high = _submit(
        it_world, ["python3", "-c", "import time; time.sleep(3)"], gpus=4, priority="high"
    )
    cluster.wait_for(
        lambda: _state(high) in (JobState.RUNNING, JobState.SUCCEEDED), timeout=60, what="high runs"
    )
    low_job = Job.objects.get(pk=low)
    assert low_job.preemption_count == 1 and low_job.requeue_count == 1
    assert low_job.events.filter(kind="stop_preempted").exists()
    cluster.wait_for(lambda: _state(high) == JobState.SUCCEEDED, timeout=60, what="high done")
    cluster.wait_for(lambda: _state(low) == JobState.RUNNING, timeout=60, what="low runs again")
    _client(it_world["member"]).post(f"/api/v1/jobs/{low}/cancel", {}, format="json")
    cluster.wait_for(lambda: _state(low) == JobState.CANCELLED, timeout=30, what="low cancelled")
