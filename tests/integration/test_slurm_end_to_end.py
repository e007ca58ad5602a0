"""Jobs through the portal into Slurm: a real worker and beat, the Slurm bridge in front of
an emulated cluster (tools/slurm_cluster.py), PostgreSQL and Redis."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from scheduling.choices import JobState, NodeState
from scheduling.models import Allocation, Gpu, Job, Node

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import slurm_cluster  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def slurm():
    reason = ""
    if not slurm_cluster.installed():
        reason = "Slurm and munge are not installed (apt-get install slurmctld slurmd munge)"
    elif os.geteuid() != 0:
        reason = "the emulated Slurm cluster needs root"
    if reason:
        if os.environ.get("SLUICE_REQUIRE_SLURM") == "1":
            pytest.fail(f"SLUICE_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix="sluice-slurm-e2e-"))
    args = slurm_cluster.argparse.Namespace(
        dir=str(directory),
        nodes=2,
        gpus=4,
        gpu_type="h100",
        prefix="se",
        partition="sluice",
        cluster="sluice",
    )
    layout = slurm_cluster.start(args)
    work = directory / "work"
    work.mkdir()
    work.chmod(0o755)
    # Slurm pools run jobs as the tenants' existing accounts (the site's, on every node).
    try:
        pwd.getpwnam("sluice-nlp")
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "sluice-nlp"], check=True)
    yield {**layout, "work": work}
    slurm_cluster.stop(directory)
    shutil.rmtree(directory, ignore_errors=True)


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
