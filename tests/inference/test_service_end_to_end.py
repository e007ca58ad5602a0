"""A service end to end (integration: PostgreSQL, Redis, a real worker with beat and a node
agent): its replicas are sample model servers on simulated GPUs, scraped by the agent; load
makes the autoscaler add replicas, quiet takes them away again."""

from __future__ import annotations

import http.client
import shutil
import threading
import time

import pytest
from rest_framework.test import APIClient

from inference.models import ScaleDecision, Service
from inference.services import ServiceSpec, service_create
from scheduling.agent import sample_model_server
from scheduling.choices import NodeState
from scheduling.models import Gpu, Node, ServeSample
from tests import factories as f
from tests.integration.conftest import cluster, it_world  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration


def _endpoints(user, service_id) -> list[dict]:
    client = APIClient()
    client.force_authenticate(user=user)
    response = client.get(f"/api/v1/services/{service_id}/endpoints")
    assert response.status_code == 200
    return response.json()


def _ready(user, service_id) -> list[dict]:
    return [e for e in _endpoints(user, service_id) if e["ready"]]


class Load:
    """``clients`` closed-loop clients sending GET /infer to the ready replicas in turn."""

    def __init__(self, user, service_id, clients: int) -> None:
        self.user, self.service_id = user, service_id
        self.stop = threading.Event()
        self.targets: list[tuple[str, int]] = []
        self.sent = 0
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(clients)]

    def refresh(self) -> None:
        self.targets = [("127.0.0.1", e["port"]) for e in _ready(self.user, self.service_id)]

    def _run(self, index: int) -> None:
        n = index
        while not self.stop.is_set():
            targets = self.targets
            if not targets:
                time.sleep(0.1)
                continue
            host, port = targets[n % len(targets)]
            n += 1
            try:
                conn = http.client.HTTPConnection(host, port, timeout=10)
                conn.request("GET", "/infer")
                conn.getresponse().read()
                conn.close()
                self.sent += 1
            except OSError:
                time.sleep(0.1)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=15)


def test_a_service_scales_up_under_load_and_back_down(cluster, it_world):  # noqa: F811
    from django.db import connection

    member = it_world["member"]
    pool = f.PoolFactory(name="inference", allowed_workload_types=["inference"])
    f.QuotaFactory(tenant=it_world["tenant"], pool=pool, guaranteed_gpus=4, borrow_limit_gpus=0)
    f.policy("inference", preemptible=False, stop_grace_seconds=3, max_runtime_seconds=3600)
    queue = f.QueueFactory(
        tenant=it_world["tenant"],
        name="serve",
        pool=pool,
        allowed_workload_types=["inference"],
        default_priority_class=it_world["normal"],
        max_self_service_class=it_world["normal"],
    )
    server = cluster.work / "sample_model_server.py"
    shutil.copy(sample_model_server.__file__, server)
    server.chmod(0o644)
    cluster.start_agent("infer-01", pool="inference", simulate="4xA100-40GB")
    cluster.wait_for(
        lambda: (
            Gpu.objects.filter(node__name="infer-01").count() == 4
            and Node.objects.filter(name="infer-01", state=NodeState.READY).exists()
        ),
        what="node registered",
    )
    service = service_create(
        user=member,
        spec=ServiceSpec(
            project=it_world["project"],
            queue=queue,
            name="chat",
            command=[
                "python3",
                str(server),
                "--service-ms",
                "300",
                "--concurrency",
                "1",
                "--warmup",
                "1",
            ],
            min_replicas=1,
            max_replicas=3,
            target_running_per_replica=1,
            stable_window_s=12,
            panic_window_s=4,
            scale_up_max_step=0,
            scale_down_delay_s=6,
        ),
    )
    cluster.wait_for(
        lambda: len(_ready(member, service.pk)) == 1, timeout=90, what="1 replica ready"
    )

    with Load(member, service.pk, clients=4) as load:
        started = time.monotonic()
        deadline = started + 90
        while time.monotonic() < deadline and len(load.targets) < 3:
            load.refresh()
            time.sleep(1)
            connection.close()
        assert len(load.targets) == 3, cluster.logs()
        assert load.sent > 0
    up = ScaleDecision.objects.filter(service=service, desired__gt=1).order_by("at").first()
    assert up is not None and up.reason_code in ("panic", "scale_up", "max_replicas")
    assert ServeSample.objects.filter(job__service_replica__service=service).exists()

    # Quiet: back to one replica after the stable window and the scale-down delay.
    cluster.wait_for(
        lambda: Service.objects.get(pk=service.pk).desired_replicas == 1,
        timeout=90,
        what="scale down to 1",
    )
    cluster.wait_for(
        lambda: len([e for e in _endpoints(member, service.pk) if e["state"] != "STOPPING"]) == 1,
        timeout=60,
        what="surplus replicas stopped",
    )
    down = ScaleDecision.objects.filter(service=service, reason_code="scale_down").first()
    assert down is not None
