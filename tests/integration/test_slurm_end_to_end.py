"""Jobs through the portal into Slurm: a real worker and beat, the Slurm bridge in front of
an emulated cluster (tools/slurm_cluster.py), PostgreSQL and Redis."""

from __future__ import annotations

import sys

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from scheduling.choices import JobState, NodeState
from scheduling.models import Allocation, Gpu, Job, Node
from tests.integration.slurm_helpers import emulated_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def slurm():
    with emulated_cluster(
        prefix="se", nodes=2, gpus=4, folder_prefix="sluice-slurm-e2e-"
    ) as layout:
        yield layout


def _client(user):
    client = APIClient()
    client.force_authenticate(user=user)
    return client


def _submit(w, command, *, gpus=1):
    body = {
        "project": w["project"].pk,
        "queue": w["queue"].pk,
        "workload_type": "training",
        "command": command,
        "gpus_per_node": gpus,
    }
    response = _client(w["member"]).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _state(job_id):
    return Job.objects.get(pk=job_id).state


def _start_bridge(cluster, slurm):
    cluster.env["SLURM_CONF"] = slurm["slurm_conf"]
    cluster._spawn(
        "bridge",
        [
            sys.executable,
            "-m",
            "scheduling.executors.slurm",
            "--pool",
            "training",
            "--partition",
            "sluice",
            "--work-dir",
            str(slurm["work"]),
            "--broker",
            settings.CELERY_BROKER_URL,
            "--heartbeat",
            "1",
            "--refresh",
            "0.5",
        ],
    )
    for name in ("se1", "se2"):
        cluster.wait_for(
            lambda name=name: (
                Gpu.objects.filter(node__name=name).count() == 4
                and Node.objects.filter(name=name, state=NodeState.READY).exists()
            ),
            what=f"{name} registered",
        )


def test_submit_dispatch_slurm_succeeded_and_cancel_with_grace(cluster, it_world, slurm):
    _start_bridge(cluster, slurm)
    job_id = _submit(
        it_world, ["sh", "-c", 'echo "on=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES"'], gpus=2
    )
    cluster.wait_for(lambda: _state(job_id) == JobState.SUCCEEDED, what="job succeeded")
    job = Job.objects.get(pk=job_id)
    node = Allocation.objects.filter(job=job).values_list("gpu__node__name", flat=True).first()
    assert Allocation.objects.filter(job=job).count() == 2 and job.exit_code == 0
    logs = cluster.wait_for(
        lambda: _client(it_world["member"]).get(f"/api/v1/jobs/{job_id}/logs").json()["text"],
        what="log shipped",
    )
    assert f"on={node} " in logs and len(logs.split("gpus=")[1].split()[0].split(",")) == 2

    running = _submit(it_world, ["sleep", "600"])
    cluster.wait_for(lambda: _state(running) == JobState.RUNNING, what="running")
    response = _client(it_world["member"]).post(f"/api/v1/jobs/{running}/cancel", {}, format="json")
    assert response.status_code == 200, response.json()
    cluster.wait_for(lambda: _state(running) == JobState.CANCELLED, timeout=30, what="cancelled")
    assert not Allocation.objects.filter(job_id=running, released_at__isnull=True).exists()
