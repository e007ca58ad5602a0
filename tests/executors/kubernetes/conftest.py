import time

import pytest
from kubernetes import client

from scheduling.executors.kubernetes.executor import KubernetesExecutor
from scheduling.executors.kubernetes.pods import PodSettings
from tests.executors.kubernetes.standin import StandIn


@pytest.fixture
def standin():
    server = StandIn().start()
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        server.add_node(
            name,
            gpus=8,
            labels={
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.memory": "81559",
                "topology.kubernetes.io/zone": "rack-a",
            },
        )
    yield server
    server.close()


def api_client(standin: StandIn) -> client.ApiClient:
    configuration = client.Configuration(host=standin.url)
    return client.ApiClient(configuration)


def make_executor(standin: StandIn, **kwargs) -> KubernetesExecutor:
    settings = kwargs.pop("settings", None) or PodSettings(pool="k8s", default_image="")
    executor = KubernetesExecutor(
        api_client(standin),
        settings,
        node_lost_seconds=kwargs.pop("node_lost_seconds", 0.0),
        node_check_seconds=kwargs.pop("node_check_seconds", 0.0),
        log_interval=0.0,
        watch_timeout_seconds=2,
        **kwargs,
    )
    executor.start()
    return executor


@pytest.fixture
def executor(standin):
    executor = make_executor(standin)
    yield executor
    executor.close()


def poll_until(executor, predicate, timeout: float = 5.0) -> list:
    """Poll until ``predicate(events so far)`` holds; the events seen."""
    events: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events.extend(executor.poll())
        if predicate(events):
            return events
        time.sleep(0.02)
    raise AssertionError(f"timed out; events so far: {events}")
