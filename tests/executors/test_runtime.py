"""The runtime between the node wire protocol and an executor: several nodes served by one
executor (a bridge), messages routed to the right node, reports and heartbeats per node,
and delivery driving the executor's state."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling.agent.protocol import (
    kill_process_message,
    launch_message,
    stop_message,
    validate_report,
)
from scheduling.executors.base import (
    Capabilities,
    Executor,
    Exited,
    GpuSample,
    LogChunk,
    NodeInfo,
    Running,
    Started,
)
from scheduling.executors.runtime import LocalMessageSource, Runtime, RuntimeConfig, RuntimeNode


class FakeExecutor(Executor):
    """Runs nothing: records calls, starts a launch at once, ends it on stop."""

    kind = "kubernetes"

    def __init__(self, node_names: list[str]) -> None:
        self.node_names = node_names
        self.calls: list[tuple[str, str, Any]] = []
        self.events: list[Any] = []
        self.delivered_events: list[Any] = []
        self.jobs: dict[tuple[int, int], str] = {}

    def capabilities(self) -> Capabilities:
        return Capabilities(
            images=True, gpu_isolation="device plugin", run_as="image", limits=(), serving=False
        )

    def nodes(self) -> list[NodeInfo]:
        return [
            NodeInfo(name=n, gpus=[{"index": 0, "uuid": f"GPU-{n}"}], labels={"rack": n[-1]})
            for n in self.node_names
        ]

    def launch(self, node, message):
        self.calls.append(("launch", node, message["job_id"]))
        self.jobs[(message["job_id"], message["attempt"])] = node
        self.events.append(
            Started(job_id=message["job_id"], attempt=message["attempt"], node=node, pid=None)
        )
        self.events.append(
            LogChunk(
                job_id=message["job_id"],
                attempt=message["attempt"],
                node=node,
                offset=0,
                data="héllo\n".encode(),
            )
        )

    def stop(self, node, message):
        self.calls.append(("stop", node, message["job_id"]))
        self.jobs.pop((message["job_id"], message["attempt"]), None)
        self.events.append(
            Exited(
                job_id=message["job_id"],
                attempt=message["attempt"],
                node=node,
                exit_code=None,
                signal=15,
                reason=message["reason"],
            )
        )

    def kill_process(self, node, pid, gpu_index):
        self.calls.append(("kill_process", node, pid))
        return False

    def poll(self):
        events, self.events = self.events, []
        return events

    def delivered(self, event):
        self.delivered_events.append(event)

    def running(self):
        return [Running(job_id=j, attempt=a, node=n) for (j, a), n in self.jobs.items()]

    def gpu_samples(self):
        return [
            GpuSample(node=n, index=0, utilization=50.0, memory_used_mb=10) for n in self.node_names
        ]


def _bridge(send=None):
    nodes = ["slice-a", "slice-b"]
    executor = FakeExecutor(nodes)
    sources = {n: LocalMessageSource() for n in nodes}
    reports: list[dict[str, Any]] = []
    runtime = Runtime(
        executor,
        [RuntimeNode(name=n, messages=sources[n], pool="k8s") for n in nodes],
        send or reports.append,
        RuntimeConfig(heartbeat_seconds=60.0),
    )
    return runtime, executor, sources, reports


def test_one_runtime_serves_several_nodes_with_one_executor():
    runtime, executor, sources, reports = _bridge()
    runtime.start()
    registers = {r["node"]: r for r in reports if r["type"] == "register"}
    assert set(registers) == {"slice-a", "slice-b"}
    for name, register in registers.items():
        validate_report(register)
        assert register["pool"] == "k8s"
        assert register["labels"] == {"rack": name[-1]}
        assert register["gpus"] == [{"index": 0, "uuid": f"GPU-{name}"}]
    heartbeats = [r for r in reports if r["type"] == "heartbeat"]
    assert sorted(h["node"] for h in heartbeats) == ["slice-a", "slice-b"]
    assert all(h["gpus"][0]["utilization"] == 50.0 for h in heartbeats)

    sources["slice-b"].put(
        launch_message(job_id=7, attempt=1, name="j", command=["x"], gpu_indices=[0])
    )
    sources["slice-a"].put(
        launch_message(job_id=8, attempt=1, name="k", command=["x"], gpu_indices=[0])
    )
    runtime.tick(0.5)
    runtime.tick(0)
    assert sorted(executor.calls) == [("launch", "slice-a", 8), ("launch", "slice-b", 7)]
    started = {r["job_id"]: r for r in reports if r["type"] == "started"}
    assert started[7]["node"] == "slice-b" and started[8]["node"] == "slice-a"
    logs = [r for r in reports if r["type"] == "log"]
    assert {r["data"] for r in logs} == {"héllo\n"}
    for item in [*started.values(), *logs]:
        validate_report(item)

    sources["slice-b"].put(stop_message(job_id=7, attempt=1, reason="preempted", grace_seconds=3))
    sources["slice-a"].put(kill_process_message(pid=99, gpu_index=0, reason="zombie"))
    runtime.tick(0.5)
    runtime.tick(0)
    assert ("stop", "slice-b", 7) in executor.calls
    assert ("kill_process", "slice-a", 99) in executor.calls
    exited = [r for r in reports if r["type"] == "exited"]
    assert len(exited) == 1 and exited[0]["node"] == "slice-b"
    assert exited[0]["stop_reason"] == "preempted" and exited[0]["signal"] == 15
    validate_report(exited[0])
    # Every heartbeat lists each node's own jobs.
    runtime._heartbeat()
    runtime.outbox.flush()
    last = {r["node"]: r for r in reports if r["type"] == "heartbeat"}
    assert [j["job_id"] for j in last["slice-a"]["jobs"]] == [8]
    assert last["slice-b"]["jobs"] == []
    runtime.close()


def test_an_event_is_delivered_only_once_its_report_is_out():
    failing = {"on": True}
    sent: list[dict[str, Any]] = []

    def send(report):
        if failing["on"]:
            raise ConnectionError("broker down")
        sent.append(report)

    runtime, executor, sources, _ = _bridge(send)
    runtime.start()
    sources["slice-a"].put(
        launch_message(job_id=1, attempt=1, name="j", command=["x"], gpu_indices=[0])
    )
    runtime.tick(0.5)
    assert executor.delivered_events == []  # queued, not delivered
    failing["on"] = False
    runtime.outbox.flush(force=True)
    kinds = [type(e).__name__ for e in executor.delivered_events]
    assert kinds == ["Started", "LogChunk"]
    assert [r["type"] for r in sent if r["job_id" if "job_id" in r else "type"] == 1] == [
        "started",
        "log",
    ]
    runtime.close()


def test_a_runtime_needs_a_node_with_a_valid_name():
    with pytest.raises(ValueError):
        Runtime(FakeExecutor([]), [], lambda r: None)
    with pytest.raises(Exception, match="node"):
        Runtime(FakeExecutor(["x"]), [RuntimeNode(name="bad name!")], lambda r: None)
