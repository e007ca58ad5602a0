"""The Slurm executor on real Slurm daemons: an emulated cluster of four nodes with eight
fake H100s each (tools/slurm_cluster.py), started once for this module.

Skipped where Slurm, munge or root are missing, unless SLUICE_REQUIRE_SLURM=1 (CI) makes
that a failure.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from scheduling.agent import protocol
from scheduling.executors.base import Exited, LogChunk, Started
from scheduling.executors.slurm import SlurmClient, SlurmExecutor
from tests.integration.slurm_helpers import emulated_cluster, slurm_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster():
    # Job accounts (nobody) must reach the jobs' folders (the layout's "work").
    with emulated_cluster(
        prefix="sn", nodes=4, gpus=8, folder_prefix="sluice-slurm-", tenant_account=False
    ) as layout:
        yield layout


@pytest.fixture
def executor(cluster):
    client = SlurmClient(partition="sluice", conf=cluster["slurm_conf"])
    ex = SlurmExecutor(client=client, work_dir=cluster["work"], refresh_seconds=0.3)
    ex.start()
    yield ex
    for running in ex.running():
        subprocess.run(["scancel", running.external_id], env=client.env, check=False)


_next_id = iter(range(int(time.time()) % 100000 * 10, 10**9))


def _launch(ex, node, command, *, gpus=1, grace=5, **extra):
    job_id = next(_next_id)
    message = protocol.launch_message(
        job_id=job_id,
        attempt=1,
        name=f"job{job_id}",
        command=[command],
        shell=True,
        gpu_indices=list(range(gpus)),
        grace_seconds=grace,
        run_as="nobody",
        **extra,
    )
    ex.launch(node, message)
    return job_id


def _events_until(ex, predicate, timeout=60.0):
    events = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events += list(ex.poll())
        if predicate(events):
            return events
        time.sleep(0.2)
    raise AssertionError(f"timed out; events so far: {events}")


def _exited(job_id):
    return lambda events: any(isinstance(e, Exited) and e.job_id == job_id for e in events)


def _started(job_id):
    return lambda events: any(isinstance(e, Started) and e.job_id == job_id for e in events)


def _log(events, job_id) -> bytes:
    chunks = sorted(
        (e.offset, e.data) for e in events if isinstance(e, LogChunk) and e.job_id == job_id
    )
    return b"".join(data for _, data in chunks)


def _exit(events, job_id) -> Exited:
    return next(e for e in events if isinstance(e, Exited) and e.job_id == job_id)


def test_nodes_and_gpus_discovered_from_the_controller(executor):
    nodes = {n.name: n for n in executor.nodes()}
    assert sorted(nodes) == ["sn1", "sn2", "sn3", "sn4"]
    assert len(nodes["sn2"].gpus) == 8 and nodes["sn2"].gpus[0]["model"] == "H100"
    assert nodes["sn2"].labels["slurm.partition"] == "sluice"


def test_placement_honoured_node_gpu_count_account_and_environment(executor):
    job = _launch(
        executor,
        "sn3",
        'echo "node=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES user=$(id -un) '
        'job=$SLUICE_JOB_ID nv=$NVIDIA_VISIBLE_DEVICES home=$HOME"',
        gpus=3,
    )
    events = _events_until(executor, _exited(job))
    started = next(e for e in events if isinstance(e, Started) and e.job_id == job)
    assert started.node == "sn3" and started.external_id.isdigit()
    text = _log(events, job).decode()
    assert "node=sn3 " in text and "user=nobody" in text and f"job={job}" in text
    gpus = text.split("gpus=")[1].split()[0].split(",")
    assert len(gpus) == 3 and text.count(",".join(gpus)) == 2  # NVIDIA_VISIBLE_DEVICES too
    assert "/workspace" in text.split("home=")[1]
    exited = _exit(events, job)
    assert (exited.exit_code, exited.signal, exited.reason, exited.message) == (0, None, "", "")
    # Started before the output and the exit.
    kinds = [type(e) for e in events if getattr(e, "job_id", None) == job]
    assert kinds[0] is Started and kinds[-1] is Exited


def test_exit_codes_signals_and_the_log_cap(executor):
    failing = _launch(executor, "sn1", "echo before; exit 7")
    killed = _launch(executor, "sn1", "kill -KILL $$")
    chatty = _launch(executor, "sn2", "head -c 5000 /dev/zero | tr '\\0' x", log_cap_bytes=1000)
    events = _events_until(
        executor, lambda ev: all(_exited(j)(ev) for j in (failing, killed, chatty))
    )
    assert (_exit(events, failing).exit_code, _exit(events, failing).signal) == (7, None)
    assert _log(events, failing) == b"before\n"
    assert (_exit(events, killed).exit_code, _exit(events, killed).signal) == (None, 9)
    text = _log(events, chatty)
    assert text == b"x" * 1000 + protocol.log_truncated_marker(1000).encode()


def test_stop_with_grace_sigterm_seen_then_killed(executor):
    job = _launch(
        executor,
        "sn2",
        "trap 'echo got-term; sleep 60' TERM; echo ready; while :; do sleep 0.1; done",
        grace=3,
    )
    events = _events_until(executor, lambda ev: b"ready" in _log(ev, job))
    stopped_at = time.monotonic()
    executor.stop(
        "sn2", protocol.stop_message(job_id=job, attempt=1, reason="preempted", grace_seconds=3)
    )
    events += _events_until(executor, _exited(job), timeout=40)
    took = time.monotonic() - stopped_at
    assert b"got-term" in _log(events, job)
    exited = _exit(events, job)
    assert exited.reason == "preempted"
    assert 3 <= took < 20, took  # grace, KillWait (2 s), polling: not the trap's sleep 60
    assert executor.running() == [] or all(r.job_id != job for r in executor.running())


def test_stop_of_an_unknown_attempt_is_answered(executor):
    executor.stop("sn1", protocol.stop_message(job_id=1, attempt=99, reason="cancelled"))
    # (The bridge also reports again how the earlier tests' jobs ended, as after a restart.)
    (event,) = [e for e in executor.poll() if e.job_id == 1]
    assert isinstance(event, Exited) and event.message == protocol.NOT_RUNNING_MESSAGE


def test_cancelled_behind_sluices_back_is_reconciled_with_a_reason(executor):
    job = _launch(executor, "sn4", "sleep 300")
    _events_until(executor, _started(job))
    (slurm_id,) = [r.external_id for r in executor.running() if r.job_id == job]
    subprocess.run(["scancel", slurm_id], env=executor.client.env, check=True)
    events = _events_until(executor, _exited(job))
    exited = _exit(events, job)
    assert exited.reason == "" and "not by Sluice" in exited.message
    assert exited.signal == 15


def test_controller_restart_and_bridge_restart_lose_nothing(cluster, executor):
    job = _launch(executor, "sn1", "echo start; sleep 6; echo done")
    _events_until(executor, _started(job))
    slurm_cluster.restart_controller(cluster["dir"])
    # A new bridge (the old one gone with the controller) adopts the job from the controller.
    client = SlurmClient(partition="sluice", conf=cluster["slurm_conf"])
    fresh = SlurmExecutor(client=client, work_dir=cluster["work"], refresh_seconds=0.3)
    fresh.start()
    assert [r.job_id for r in fresh.running()] == [job]
    events = _events_until(fresh, _exited(job), timeout=60)
    assert _log(events, job) == b"start\ndone\n"  # shipped from the start, by offset
    assert (_exit(events, job).exit_code, _exit(events, job).reason) == (0, "")
    # The old bridge, still polling, sees the same end.
    assert _exit(_events_until(executor, _exited(job)), job).exit_code == 0


def test_jobs_not_sluices_show_as_capacity_in_use(cluster, executor):
    env = executor.client.env
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--partition=sluice",
            "--nodelist=sn4",
            "--gres=gpu:3",
            "--job-name=someones-training",
            "--output=/dev/null",
            "--wrap=sleep 120",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            executor._refresh(force=True)
            outside = executor.outside_jobs("sn4")
            if outside:
                break
            time.sleep(0.3)
        assert [(o["slurm_job_id"], o["gpus"], o["label"]) for o in outside] == [
            (out, 3, "outside Sluice")
        ]
        assert executor.outside_jobs("sn1") == []
        assert all(r.external_id != out for r in executor.running())
    finally:
        subprocess.run(["scancel", out], env=env, check=False)


def test_the_bridge_registers_every_node_and_reports_a_job_through_the_runtime(executor):
    from scheduling.executors.runtime import (
        LocalMessageSource,
        Runtime,
        RuntimeConfig,
        RuntimeNode,
    )

    sources = {name: LocalMessageSource() for name in ("sn1", "sn2", "sn3", "sn4")}
    reports: list[dict] = []
    runtime = Runtime(
        executor,
        [RuntimeNode(name=n, messages=s, pool="training") for n, s in sources.items()],
        reports.append,
        RuntimeConfig(heartbeat_seconds=60.0),
    )
    runtime.start()
    registers = {r["node"]: r for r in reports if r["type"] == "register"}
    assert sorted(registers) == ["sn1", "sn2", "sn3", "sn4"]
    assert len(registers["sn2"]["gpus"]) == 8 and registers["sn2"]["cpus"] == 16
    for report in reports:
        protocol.validate_report(report)
    job_id = next(_next_id)
    sources["sn2"].put(
        protocol.launch_message(
            job_id=job_id,
            attempt=1,
            name="via-bridge",
            command=["echo", "hello"],
            gpu_indices=[0],
            run_as="nobody",
        )
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
        r["type"] == "exited" and r.get("job_id") == job_id for r in reports
    ):
        runtime.tick(timeout=0.2)
    mine = [r for r in reports if r.get("job_id") == job_id]
    assert [r["type"] for r in mine] == ["started", "log", "exited"]
    assert mine[1]["data"] == "hello\n" and mine[2]["exit_code"] == 0
    assert all(r["node"] == "sn2" for r in mine)
    for report in mine:
        protocol.validate_report(report)
    heartbeat_fields, _ = executor.heartbeat_fields("sn2")
    # The job is listed as ended, with its exit, for a while (as the node agent does).
    assert heartbeat_fields["outside_jobs"] == []
    (summary,) = [j for j in heartbeat_fields["jobs"] if j["job_id"] == job_id]
    assert summary["running"] is False and summary["exit_code"] == 0
    assert not any(j["running"] for j in heartbeat_fields["jobs"])
