"""The bridge: options, a kubeconfig, and the runtime driving the executor for several
nodes (messages in, reports out) against the stand-in."""

import time

import pytest
import yaml

from scheduling.agent.protocol import launch_message
from scheduling.executors.kubernetes.__main__ import build_executor, parser
from scheduling.executors.kubernetes.pods import pod_name


def kubeconfig(tmp_path, url):
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "standin", "cluster": {"server": url}}],
                "users": [{"name": "bridge", "user": {"token": "t0ken"}}],
                "contexts": [
                    {"name": "standin", "context": {"cluster": "standin", "user": "bridge"}}
                ],
                "current-context": "standin",
            }
        )
    )
    return str(path)


def test_options_need_a_way_to_the_cluster():
    with pytest.raises(SystemExit):
        parser().parse_args(["--pool", "k8s"])
    with pytest.raises(SystemExit):
        parser().parse_args(["--pool", "k8s", "--in-cluster", "--kubeconfig", "x"])


def test_runtime_drives_the_executor_for_every_node(standin, tmp_path):
    runtime_module = pytest.importorskip("scheduling.executors.runtime")
    args = parser().parse_args(
        ["--pool", "k8s", "--kubeconfig", kubeconfig(tmp_path, standin.url), "--heartbeat", "60"]
    )
    executor = build_executor(args)
    executor.watch_timeout_seconds = 2
    sources = {n.name: runtime_module.LocalMessageSource() for n in executor.nodes()}
    reports = []
    runtime = runtime_module.Runtime(
        executor,
        [runtime_module.RuntimeNode(name=n, messages=s, pool="k8s") for n, s in sources.items()],
        reports.append,
    )
    try:
        runtime.start()
        assert {r["node"] for r in reports if r["type"] == "register"} == set(sources)
        message = launch_message(
            job_id=5, attempt=1, name="t", command=["true"], gpu_indices=[0], tenant="acme"
        )
        message["image"] = "busybox:1.36"
        sources["gpu-3"].put(message)
        runtime.tick(timeout=0.1)
        name = pod_name(5, 1, "gpu-3")
        assert ("sluice-acme", name) in standin.pods
        standin.run("sluice-acme", name)
        deadline = time.monotonic() + 5
        while not any(r["type"] == "started" for r in reports) and time.monotonic() < deadline:
            runtime.tick(timeout=0.1)
        (started,) = [r for r in reports if r["type"] == "started"]
        assert (started["node"], started["job_id"]) == ("gpu-3", 5)
    finally:
        executor.close()
