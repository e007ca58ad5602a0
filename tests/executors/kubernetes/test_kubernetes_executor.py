"""The Kubernetes executor against the local stand-in of the API."""

import json

from kubernetes import client

from scheduling.agent.protocol import (
    LAUNCH_FAILED,
    STOP_LOST,
    launch_message,
    stop_message,
    validate_control_message,
)
from scheduling.executors.base import Exited, LogChunk, Started
from scheduling.executors.kubernetes.pods import PodSettings, pod_name
from tests.executors.kubernetes.conftest import api_client, make_executor, poll_until

NS = "sluice-acme"


def launch(job_id=7, attempt=1, gpus=(0, 1), image="ghcr.io/acme/train:1.2", **extra):
    message = launch_message(
        job_id=job_id,
        attempt=attempt,
        name="train",
        command=["python", "train.py"],
        gpu_indices=list(gpus),
        env={"LR": "0.1", "LD_PRELOAD": "/evil.so"},
        grace_seconds=45,
        tenant="acme",
        log_cap_bytes=extra.pop("log_cap_bytes", None),
    )
    message.update(image=image, **extra)
    return message


def as_model(data, kind):
    """Deserialize an answer of the stand-in with the client's own models (a wrong shape
    fails here)."""
    return client.ApiClient().deserialize(json.dumps(data), kind, "application/json")


def exits(events):
    return [e for e in events if isinstance(e, Exited)]


def test_every_pod_carries_namespace_labels_gpus_grace_and_image(standin, executor):
    executor.launch("gpu-1", launch())
    name = pod_name(7, 1, "gpu-1")
    pod = as_model(standin.pod(NS, name), "V1Pod")
    assert pod.metadata.namespace == NS
    assert pod.metadata.labels == {
        "app.kubernetes.io/managed-by": "sluice",
        "sluice.io/pool": "k8s",
        "sluice.io/job-id": "7",
        "sluice.io/attempt": "1",
        "sluice.io/tenant": "acme",
    }
    spec = pod.spec
    assert spec.node_name == "gpu-1"
    assert spec.restart_policy == "Never"
    assert spec.termination_grace_period_seconds == 45
    (container,) = spec.containers
    assert container.image == "ghcr.io/acme/train:1.2"
    assert container.command == ["python", "train.py"]
    assert container.resources.limits == {"nvidia.com/gpu": "2"}
    env = {e.name: e.value for e in container.env}
    assert env["LR"] == "0.1" and env["SLUICE_JOB_ID"] == "7" and "LD_PRELOAD" not in env
    assert "CUDA_VISIBLE_DEVICES" not in env  # the device plugin's
    security = container.security_context
    assert security.run_as_non_root and security.allow_privilege_escalation is False
    assert security.capabilities.drop == ["ALL"]
    namespace = as_model(standin.namespaces[NS], "V1Namespace")
    assert namespace.metadata.labels["app.kubernetes.io/managed-by"] == "sluice"
    assert namespace.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_pull_policy_secret_runtime_limit_and_serving(standin, executor):
    message = launch(image_pull_policy="Always", image_pull_secret="acme-registry")
    message.update(
        runtime_limit_seconds=3600, serve={"health_path": "/ready", "metrics_path": "/m"}
    )
    executor.launch("gpu-1", message)
    pod = as_model(standin.pod(NS, pod_name(7, 1, "gpu-1")), "V1Pod")
    assert pod.spec.image_pull_secrets[0].name == "acme-registry"
    assert pod.spec.active_deadline_seconds == 3600 + 45 + 300
    container = pod.spec.containers[0]
    assert container.image_pull_policy == "Always"
    assert container.readiness_probe.http_get.path == "/ready"
    assert container.ports[0].container_port == 8000


def test_job_without_image_fails_its_launch_on_a_pool_without_default(standin, executor):
    executor.launch("gpu-1", launch(image=""))
    (exited,) = exits(executor.poll())
    assert exited.reason == LAUNCH_FAILED and "no image" in exited.message
    assert not standin.pods


def test_start_output_and_exit(standin, executor):
    executor.launch("gpu-1", launch())
    name = pod_name(7, 1, "gpu-1")
    standin.run(NS, name, ["epoch 1", "epoch 2"])
    events = poll_until(executor, lambda ev: any(isinstance(e, Started) for e in ev))
    standin.write_log(NS, name, "done")
    standin.finish(NS, name, 0)
    events += poll_until(executor, lambda ev: exits(ev))
    (started,) = [e for e in events if isinstance(e, Started)]
    assert started.external_id == f"{NS}/{name}"
    output = b"".join(e.data for e in events if isinstance(e, LogChunk))
    assert output == b"epoch 1\nepoch 2\ndone\n"
    (exited,) = exits(events)
    assert (exited.exit_code, exited.reason) == (0, "")
    assert executor.running() == []


def test_log_cap(standin, executor):
    executor.launch("gpu-1", launch(log_cap_bytes=10))
    name = pod_name(7, 1, "gpu-1")
    standin.run(NS, name, ["0123456789abcdef"])
    events = poll_until(executor, lambda ev: len([e for e in ev if isinstance(e, LogChunk)]) >= 2)
    chunks = [e for e in events if isinstance(e, LogChunk)]
    assert chunks[0].data == b"0123456789" and chunks[1].offset == 10
    assert b"truncated" in chunks[1].data


def test_image_that_cannot_be_pulled_ends_the_job(standin, executor):
    executor.launch("gpu-1", launch(image="ghcr.io/acme/nope:0"))
    name = pod_name(7, 1, "gpu-1")
    standin.cannot_pull(NS, name, "ImagePullBackOff")
    (exited,) = exits(poll_until(executor, exits))
    assert exited.reason == LAUNCH_FAILED
    assert "ghcr.io/acme/nope:0" in exited.message and "ImagePullBackOff" in exited.message
    assert (NS, name) not in standin.pods


def test_pod_deleted_behind_sluices_back(standin, executor):
    executor.launch("gpu-1", launch())
    name = pod_name(7, 1, "gpu-1")
    standin.run(NS, name)
    poll_until(executor, lambda ev: ev)
    standin.delete_pod(NS, name)
    (exited,) = exits(poll_until(executor, exits))
    assert exited.exit_code is None and exited.reason == ""
    assert "deleted outside Sluice" in exited.message


def test_node_lost(standin, executor):
    executor.launch("gpu-2", launch())
    standin.run(NS, pod_name(7, 1, "gpu-2"))
    poll_until(executor, lambda ev: ev)
    standin.remove_node("gpu-2")
    (exited,) = exits(poll_until(executor, exits))
    assert exited.reason == STOP_LOST and "gpu-2 lost" in exited.message


def test_node_not_ready_past_the_delay(standin):
    executor = make_executor(standin, node_lost_seconds=0.0)
    try:
        executor.launch("gpu-2", launch())
        standin.run(NS, pod_name(7, 1, "gpu-2"))
        standin.node_not_ready("gpu-2")
        (exited,) = exits(poll_until(executor, exits))
        assert exited.reason == STOP_LOST and "not ready" in exited.message
    finally:
        executor.close()


def test_oom_killed(standin, executor):
    executor.launch("gpu-1", launch())
    name = pod_name(7, 1, "gpu-1")
    standin.run(NS, name)
    standin.finish(NS, name, 137, reason="OOMKilled")
    (exited,) = exits(poll_until(executor, exits))
    assert (exited.exit_code, exited.signal) == (137, 9)
    assert "OOMKilled" in exited.message


def test_stop_deletes_with_the_policys_grace(standin, executor):
    executor.launch("gpu-1", launch())
    name = pod_name(7, 1, "gpu-1")
    standin.run(NS, name)
    poll_until(executor, lambda ev: ev)
    executor.stop("gpu-1", stop_message(job_id=7, attempt=1, reason="preempted", grace_seconds=20))
    deletes = [r for r in standin.requests if r[0] == "DELETE"]
    assert deletes[-1][2]["gracePeriodSeconds"] == "20"
    (exited,) = exits(poll_until(executor, exits))
    assert (exited.reason, exited.exit_code) == ("preempted", 143)


def test_gang_all_or_nothing(standin, executor):
    standin.refuse_on_node["gpu-2"] = (403, "Forbidden", "exceeded quota: gpus")
    executor.launch("gpu-1", launch())
    assert (NS, pod_name(7, 1, "gpu-1")) in standin.pods
    executor.launch("gpu-2", launch())
    executor.launch("gpu-3", launch())  # a later member of the failed gang: refused
    events = poll_until(executor, lambda ev: len(exits(ev)) == 3)
    assert {e.node: e.reason for e in exits(events)} == {
        "gpu-1": LAUNCH_FAILED,
        "gpu-2": LAUNCH_FAILED,
        "gpu-3": LAUNCH_FAILED,
    }
    assert "exceeded quota" in next(e.message for e in exits(events) if e.node == "gpu-2")
    assert not standin.pods


def test_restart_adopts_pods_and_launches_nothing_twice(standin, executor):
    executor.launch("gpu-1", launch())
    name = pod_name(7, 1, "gpu-1")
    standin.run(NS, name)
    poll_until(executor, lambda ev: ev)
    executor.close()
    # A Pod of a job Sluice no longer runs (left by an older bridge).
    orphan = json.loads(json.dumps(standin.pod(NS, name)))
    orphan["metadata"].update(name=pod_name(99, 1, "gpu-2"))
    orphan["metadata"]["labels"]["sluice.io/job-id"] = "99"
    orphan["metadata"]["annotations"]["sluice.io/node"] = "gpu-2"
    orphan["spec"]["nodeName"] = "gpu-2"
    standin.create_pod(NS, orphan)

    restarted = make_executor(standin)
    try:
        assert sorted((r.job_id, r.node) for r in restarted.running()) == [
            (7, "gpu-1"),
            (99, "gpu-2"),
        ]
        creates = len([r for r in standin.requests if r[0] == "POST" and r[1].endswith("/pods")])
        restarted.launch("gpu-1", launch())  # the control side's repeated launch
        assert [r for r in standin.requests if r[0] == "POST" and r[1].endswith("/pods")][
            creates:
        ] == []
        assert [type(e) for e in restarted.poll()] == [Started]
        standin.finish(NS, name, 3)
        (exited,) = exits(poll_until(restarted, exits))
        assert (exited.job_id, exited.exit_code) == (7, 3)
    finally:
        restarted.close()


def test_nodes_discovered_from_the_api(standin, executor):
    nodes = {n.name: n for n in executor.nodes()}
    assert set(nodes) == {"gpu-1", "gpu-2", "gpu-3"}
    gpus = nodes["gpu-1"].gpus
    assert len(gpus) == 8 and gpus[0]["model"] == "NVIDIA-H100-80GB-HBM3"
    assert gpus[0]["memory_mb"] == 81559
    assert len({g["uuid"] for n in nodes.values() for g in n.gpus}) == 24
    assert nodes["gpu-1"].labels["topology.kubernetes.io/zone"] == "rack-a"
    for node in standin.nodes.values():
        as_model(node, "V1Node")


def test_gpu_resource_name_is_configurable(standin):
    settings = PodSettings(pool="k8s", gpu_resource="amd.com/gpu")
    executor = make_executor(standin, settings=settings)
    try:
        executor.launch("gpu-1", launch())
        pod = standin.pod(NS, pod_name(7, 1, "gpu-1"))
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "2"}
    finally:
        executor.close()


def test_watch_answers_are_client_shapes(standin, executor):
    executor.launch("gpu-1", launch())
    standin.run(NS, pod_name(7, 1, "gpu-1"))
    standin.finish(NS, pod_name(7, 1, "gpu-1"), 0)
    assert len(standin.events) == 3
    for _version, _kind, obj in standin.events:
        as_model(obj, "V1Pod")
    as_model(standin.pod_list(""), "V1PodList")
    listed = client.CoreV1Api(api_client(standin)).list_pod_for_all_namespaces()
    assert [p.status.phase for p in listed.items] == ["Succeeded"]


def test_the_deadline_is_a_backstop_only_where_the_launch_carries_a_runtime_limit(
    standin, executor
):
    executor.launch("gpu-1", launch(job_id=8))
    pod = as_model(standin.pod(NS, pod_name(8, 1, "gpu-1")), "V1Pod")
    assert pod.spec.active_deadline_seconds is None
    message = launch(job_id=9)
    message["runtime_limit_seconds"] = 120
    executor.launch("gpu-1", validate_control_message(message))
    pod = as_model(standin.pod(NS, pod_name(9, 1, "gpu-1")), "V1Pod")
    # Sluice's own stop at 120 s, its grace (45 s), then the slack: Kubernetes comes last.
    assert pod.spec.active_deadline_seconds == 120 + 45 + 300
    assert pod.spec.termination_grace_period_seconds == 45


def test_pods_that_are_not_sluices_hold_gpus_outside_sluice(standin, executor):
    standin.add_foreign_pod("research", "notebook-1", "gpu-2", gpus=3)
    standin.add_foreign_pod("research", "prep", "gpu-2", gpus=1, init_gpus=2)  # max(1, 2)
    standin.add_foreign_pod("web", "frontend", "gpu-2", gpus=0)  # no GPU: not listed
    standin.add_foreign_pod("research", "done", "gpu-3", gpus=4, phase="Succeeded")
    standin.add_foreign_pod("research", "elsewhere", "cpu-9", gpus=2)  # not the pool's node
    executor.launch("gpu-2", launch())  # Sluice's own Pod is not outside work
    fields, _ = executor.heartbeat_fields("gpu-2")
    outside = sorted(fields["outside_jobs"], key=lambda item: item["pod"])
    assert [(o["pod"], o["gpus"], o["label"]) for o in outside] == [
        ("research/notebook-1", 3, "outside Sluice"),
        ("research/prep", 2, "outside Sluice"),
    ]
    assert executor.heartbeat_fields("gpu-3")[0]["outside_jobs"] == []
    # The list is kept for a few seconds: one request serves every node's heartbeat.
    standin.delete_pod("research", "notebook-1")
    assert len(executor.outside_jobs("gpu-2")) == 2


def test_a_field_selector_the_standin_does_not_know_is_refused(standin):
    core = client.CoreV1Api(api_client(standin))
    try:
        core.list_pod_for_all_namespaces(field_selector="spec.schedulerName=x")
    except client.exceptions.ApiException as exc:
        assert exc.status == 400
    else:
        raise AssertionError("an unknown field selector was accepted")


def test_topology_labels_are_passed_on_as_they_are_and_others_are_not(standin, executor):
    standin.add_node(
        "gpu-9",
        labels={
            "topology.sluice.io/block": "leaf-7",
            "network.topology.kubernetes.io/block": "nvl-2",
            "nvidia.com/gpu.clique": "clique-1",
            "team": "vision",
        },
    )
    labels = {n.name: n.labels for n in executor.nodes()}["gpu-9"]
    assert labels["topology.sluice.io/block"] == "leaf-7"
    assert labels["network.topology.kubernetes.io/block"] == "nvl-2"
    assert labels["nvidia.com/gpu.clique"] == "clique-1"
    assert "team" not in labels
