"""Heartbeats: GPU samples, the jobs the agent holds, zombie GPU processes, kill_process."""

import signal
import subprocess
import time

from scheduling.agent.gpus import GpuInfo, GpuSample
from scheduling.agent.protocol import kill_process_message, validate_report
from tests.scheduling.agent.helpers import PYTHON, launch, python_job, stop, wait_until


class FakeNvml:
    """A GPU backend whose compute processes the test decides (as NVML would report)."""

    name = "nvml"

    def __init__(self, count: int = 2) -> None:
        self.gpus = [
            GpuInfo(index=i, uuid=f"GPU-{i}", model="H100-80GB", name="H100", memory_mb=81559)
            for i in range(count)
        ]
        self.processes: dict[int, list[int]] = {gpu.index: [] for gpu in self.gpus}

    def discover(self) -> list[GpuInfo]:
        return list(self.gpus)

    def sample(self, holders):
        return [
            GpuSample(
                index=gpu.index,
                uuid=gpu.uuid,
                utilization=50.0,
                memory_used_mb=1000,
                temperature_c=60.0,
                power_w=300.0,
                processes=[{"pid": pid, "memory_mb": 500} for pid in self.processes[gpu.index]],
            )
            for gpu in self.gpus
        ]

    def close(self) -> None:
        pass


def test_heartbeats_are_sent_on_schedule_with_samples_and_jobs(make_agent):
    h = make_agent(heartbeat_seconds=0.2, spec="2xL4")
    h.send(launch(1, python_job("while True: pass"), gpu_indices=[1]))
    started = h.wait_report("started", 1)
    # The busy job's GPU looks busy: a whole core on an idle machine (less under load, so
    # wait for one clear sample), while the other GPU stays idle.
    beat = h.wait_for(
        lambda: [b for b in h.of_type("heartbeat") if b["gpus"][1]["utilization"] > 30]
    )[-1]
    h.wait_for(lambda: len(h.of_type("heartbeat")) >= 4)
    validate_report(beat)
    assert beat["jobs"] == [
        {"job_id": 1, "attempt": 1, "pid": started["pid"], "running": True, "stop_reason": None}
    ]
    gpu0, gpu1 = beat["gpus"]
    assert gpu0["utilization"] == 0 and gpu0["processes"] == []
    assert started["pid"] in [p["pid"] for p in gpu1["processes"]]
    assert beat["zombies"] == []
    times = [r["sent_at"] for r in h.of_type("heartbeat")]
    assert all(0.1 < b - a < 2.0 for a, b in zip(times[1:], times[2:], strict=False))

    h.send(stop(1, grace_seconds=1))
    h.wait_report("exited", 1)
    h.wait_for(lambda: h.of_type("heartbeat")[-1]["gpus"][1]["processes"] == [])
    # An ended job stays in the heartbeat for a while, not running, with how it ended (as
    # its exited report says), so a lost exit shows and can be settled from the heartbeat.
    exited = h.of_type("exited", 1)[0]
    summary = h.of_type("heartbeat")[-1]["jobs"][0]
    assert summary == {
        "job_id": 1,
        "attempt": 1,
        "pid": started["pid"],
        "running": False,
        "stop_reason": "cancelled",
        "exit_code": exited["exit_code"],
        "signal": exited["signal"],
        "finished_at": exited["finished_at"],
        "message": exited["message"],
    }
    assert summary["signal"] == signal.SIGTERM and "stopped (cancelled)" in summary["message"]


def test_finished_jobs_leave_the_summaries_after_their_retention(make_agent):
    h = make_agent(finished_retention_seconds=0.5)
    h.send(launch(1, python_job("raise SystemExit(3)")))
    h.wait_report("exited", 1)
    h.agent._heartbeat()
    h.agent.outbox.flush()
    (summary,) = h.of_type("heartbeat")[-1]["jobs"]
    assert (summary["running"], summary["exit_code"], summary["signal"]) == (False, 3, None)
    assert summary["stop_reason"] is None and summary["message"] == "exited with code 3"
    wait_until(lambda: time.time() - h.agent.jobs[(1, 1)].finished_at > 0.5)
    h.agent._heartbeat()
    h.agent.outbox.flush()
    assert h.of_type("heartbeat")[-1]["jobs"] == []


def test_register_describes_the_node(make_agent):
    h = make_agent(spec="4xA100-40GB,2xL4-24GB", pool="training")
    register = h.of_type("register")[0]
    validate_report(register)
    assert h.reports[0] is register
    assert register["pool"] == "training" and register["backend"] == "simulated"
    assert register["cpus"] >= 1 and register["memory_mb"] > 0
    assert [g["model"] for g in register["gpus"]] == ["A100-40GB"] * 4 + ["L4-24GB"] * 2
    assert set(register["gpus"][0]) == {"index", "uuid", "model", "name", "memory_mb"}
    assert register["jobs"] == []
    assert "labels" not in register  # none set


def test_register_carries_the_node_labels(make_agent):
    h = make_agent(labels={"topology.sluice.io/block": "leaf-3"})
    register = h.of_type("register")[0]
    validate_report(register)
    assert register["labels"] == {"topology.sluice.io/block": "leaf-3"}


def test_zombie_gpu_process_is_reported_and_killed_on_request(make_agent):
    backend = FakeNvml()
    h = make_agent(backend=backend, heartbeat_seconds=0.1)
    stray = subprocess.Popen(["sleep", "600"])
    try:
        h.send(launch(2, ["sleep", "600"], gpu_indices=[0]))
        job = h.wait_report("started", 2)
        command_pid = h.agent.jobs[(2, 1)].command_pid
        backend.processes = {0: [command_pid], 1: [stray.pid]}
        beat = h.wait_for(lambda: [b for b in h.of_type("heartbeat") if b["zombies"]])[-1]
        assert beat["zombies"] == [
            {"gpu_index": 1, "pid": stray.pid, "memory_mb": 500, "name": "sleep 600"}
        ]

        # The job's own process is never killed as a zombie, nor a pid that is no GPU process.
        h.send(kill_process_message(pid=command_pid, gpu_index=0, reason="zombie"))
        h.send(kill_process_message(pid=job["pid"] + 100000, gpu_index=0, reason="zombie"))
        h.send(kill_process_message(pid=stray.pid, gpu_index=1, reason="zombie"))
        kills = h.wait_for(lambda: [k for b in h.of_type("heartbeat") for k in b["kills"]])
        assert [(k["pid"], k["killed"]) for k in kills] == [
            (command_pid, False),
            (job["pid"] + 100000, False),
            (stray.pid, True),
        ]
        assert "running job" in kills[0]["message"]
        assert "not a GPU process" in kills[1]["message"]
        assert stray.wait(timeout=5) == -9
        assert h.agent.jobs[(2, 1)].running
    finally:
        stray.kill()
        stray.wait()


def test_job_process_in_its_own_session_is_still_the_jobs(make_agent):
    backend = FakeNvml()
    h = make_agent(backend=backend, heartbeat_seconds=0.1)
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen(['sleep', '600'], start_new_session=True); "
        "print(p.pid, flush=True); time.sleep(600)"
    )
    h.send(launch(3, [PYTHON, "-c", code]))
    h.wait_report("started", 3)
    h.wait_for(lambda: h.paths(3).log.read_text().strip())
    escaped = int(h.paths(3).log.read_text().split()[0])
    backend.processes = {0: [escaped], 1: []}
    begun = time.monotonic()
    h.wait_for(lambda: time.monotonic() - begun > 0.3)
    assert all(not b["zombies"] for b in h.of_type("heartbeat"))
    subprocess.run(["kill", "-9", str(escaped)], check=False)


def test_a_job_process_on_a_gpu_it_was_not_given_is_reported_and_may_be_killed(make_agent):
    """Without device isolation a job can reset CUDA_VISIBLE_DEVICES and use another GPU
    (seen on a real H200 by `sluice-agent check-isolation`); the heartbeat names it."""
    backend = FakeNvml()
    h = make_agent(backend=backend, heartbeat_seconds=0.1)
    h.send(launch(4, ["sleep", "600"], gpu_indices=[0]))
    h.wait_report("started", 4)
    command_pid = h.agent.jobs[(4, 1)].command_pid
    backend.processes = {0: [], 1: [command_pid]}

    beat = h.wait_for(lambda: [b for b in h.of_type("heartbeat") if b["zombies"]])[-1]
    [zombie] = beat["zombies"]
    assert (zombie["gpu_index"], zombie["pid"]) == (1, command_pid)
    assert "(job 4, outside its GPUs)" in zombie["name"]

    h.send(kill_process_message(pid=command_pid, gpu_index=1, reason="zombie"))
    [kill] = h.wait_for(lambda: [k for b in h.of_type("heartbeat") for k in b["kills"]])
    assert kill["killed"] is True
    h.wait_report("exited", 4)
