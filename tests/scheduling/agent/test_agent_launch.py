"""Launching jobs through the agent: environment, output, exit status, failures, duplicates."""

import json
import os
from pathlib import Path

from scheduling.agent.protocol import validate_report
from scheduling.agent.runner import SYSTEM_JOB_PATH
from tests.scheduling.agent.helpers import (
    IS_ROOT,
    PYTHON,
    launch,
    python_job,
    release,
    stop,
    waiting_job,
)

SHOW_ENV = """
import os
for key in ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
            "SLUICE_JOB_ID", "SLUICE_ATTEMPT", "SLUICE_NODE", "SLUICE_ARRAY_INDEX",
            "SLUICE_GPU_UUIDS", "FOO", "PYTHONPATH", "CELERY_BROKER_URL", "LD_PRELOAD",
            "SLUICE_EVIL", "HOME"]:
    print(f"{key}={os.environ.get(key)}")
print(f"PATH_IS_NODES={os.environ.get('PATH') == os.environ.get('EXPECTED_PATH')}")
print(f"CKPT_IS_DIR={os.path.isdir(os.environ['SLUICE_CHECKPOINT_DIR'])}")
print(f"CKPT={os.environ['SLUICE_CHECKPOINT_DIR']}")
print(f"CWD={os.getcwd()}")
"""


def test_job_runs_with_its_gpus_and_environment(make_agent, caplog):
    base = {**os.environ, "CELERY_BROKER_URL": "redis://secret@broker/0", "PATH": "/usr/bin:/bin"}
    h = make_agent(base_env=base)
    uuids = [h.agent.gpus[1].uuid, h.agent.gpus[3].uuid]
    h.send(
        launch(
            1,
            python_job(SHOW_ENV),
            gpu_indices=[1, 3],
            gpu_uuids=uuids,
            array_index=4,
            # A user can neither widen the GPUs it was given nor hook the loader, nor pass
            # for Sluice; the agent drops reserved names even if the portal let them by.
            env={
                "FOO": "bar",
                "PYTHONPATH": "/opt/lib",
                "CUDA_VISIBLE_DEVICES": "0,1,2,3",
                "NVIDIA_VISIBLE_DEVICES": "all",
                "LD_PRELOAD": "/tmp/evil.so",
                "PATH": "/tmp/evil-bin",
                "HOME": "/root",
                "SLUICE_EVIL": "1",
                # A job of its own account gets the node's system PATH, not the agent's.
                "EXPECTED_PATH": SYSTEM_JOB_PATH if IS_ROOT else "/usr/bin:/bin",
            },
        )
    )
    exited = h.wait_report("exited", 1)
    started = h.of_type("started", 1)
    assert len(started) == 1
    assert h.reports.index(started[0]) < h.reports.index(exited)
    assert started[0]["pid"] > 0 and started[0]["attempt"] == 1
    assert (exited["exit_code"], exited["signal"], exited["stop_reason"]) == (0, None, None)
    assert exited["message"] == "exited with code 0"
    for report in h.reports:
        validate_report(report)

    log = h.log_text(1)
    workspace = h.workspace(1)
    assert "CUDA_VISIBLE_DEVICES=1,3\n" in log
    assert "NVIDIA_VISIBLE_DEVICES=1,3\n" in log
    assert "LD_PRELOAD=None\n" in log and "SLUICE_EVIL=None\n" in log
    assert "PATH_IS_NODES=True\n" in log  # the node's PATH, not the message's
    assert "PYTHONPATH=/opt/lib\n" in log  # user configuration, not reserved
    assert f"HOME={workspace}\n" in log
    dropped = [r.getMessage() for r in caplog.records if "dropped environment" in r.getMessage()]
    assert dropped == [
        "job 1 attempt 1: dropped environment names only Sluice sets: CUDA_VISIBLE_DEVICES, "
        "HOME, LD_PRELOAD, NVIDIA_VISIBLE_DEVICES, PATH, SLUICE_EVIL"
    ]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID\n" in log
    assert "SLUICE_JOB_ID=1\n" in log
    assert "SLUICE_ATTEMPT=1\n" in log
    assert "SLUICE_NODE=node-a\n" in log
    assert "SLUICE_ARRAY_INDEX=4\n" in log
    assert f"SLUICE_GPU_UUIDS={','.join(uuids)}\n" in log
    assert "FOO=bar\n" in log
    assert "CELERY_BROKER_URL=None\n" in log  # the agent's secrets stay with the agent
    assert "CKPT_IS_DIR=True\n" in log
    assert f"CKPT={workspace / 'checkpoints'}\n" in log
    assert f"CWD={workspace}\n" in log
    # The log reports carry exactly what is in the job's log file.
    assert log == h.paths(1).log.read_text()
    state = json.loads(h.paths(1).state.read_text())
    assert state["exit_reported"] is True and state["log_offset"] == len(log.encode())


def test_array_index_absent_and_working_and_checkpoint_dirs(make_agent):
    h = make_agent()
    h.send(launch(2, python_job(SHOW_ENV), working_dir="project/src", checkpoint_dir="ck/run-1"))
    assert h.wait_report("exited", 2)["exit_code"] == 0
    log = h.log_text(2)
    workspace = h.workspace(2)
    assert "SLUICE_ARRAY_INDEX=None\n" in log
    # Both are made inside the job's workspace, before it starts.
    assert f"CWD={workspace / 'project/src'}\n" in log
    assert f"CKPT={workspace / 'ck/run-1'}\n" in log
    assert "CKPT_IS_DIR=True\n" in log


def test_nonzero_exit_code_is_reported(make_agent):
    h = make_agent()
    h.send(launch(3, python_job("import sys; print('bye'); sys.exit(3)")))
    exited = h.wait_report("exited", 3)
    assert (exited["exit_code"], exited["signal"], exited["stop_reason"]) == (3, None, None)
    assert h.log_text(3) == "bye\n"


def test_shell_command(make_agent):
    h = make_agent()
    h.send(launch(4, ['echo "gpus=$CUDA_VISIBLE_DEVICES arg=$1"; exit 5', "one"], shell=True))
    exited = h.wait_report("exited", 4)
    assert exited["exit_code"] == 5
    assert h.log_text(4) == "gpus=0 arg=one\n"


def test_command_that_cannot_start_is_reported_as_launch_failed(make_agent):
    h = make_agent()
    h.send(launch(5, ["/nonexistent/train"]))
    exited = h.wait_report("exited", 5)
    assert exited["exit_code"] is None and exited["signal"] is None
    assert exited["stop_reason"] == "launch_failed"
    assert "No such file or directory" in exited["message"]
    assert not h.of_type("started", 5)
    assert "[sluice] launch failed" in h.log_text(5)
    validate_report(exited)


def test_launch_failures_of_bad_directories_and_gpus(make_agent, tmp_path):
    h = make_agent()
    h.send(launch(6, ["true"], working_dir=str(tmp_path)))
    h.send(launch(7, ["true"], gpu_indices=[9]))
    h.send(launch(8, ["true"], gpu_indices=[0], gpu_uuids=["GPU-not-this-one"]))
    h.send(launch(9, ["true"], gpu_indices=[1, 1]))
    messages = {job: h.wait_report("exited", job)["message"] for job in (6, 7, 8, 9)}
    assert all(r["stop_reason"] == "launch_failed" for r in h.of_type("exited"))
    assert "working_dir" in messages[6] and "outside the job's workspace" in messages[6]
    assert "GPU 9 does not exist on node node-a" in messages[7]
    assert "not GPU-not-this-one" in messages[8]
    assert "repeat" in messages[9]
    assert not h.of_type("started")


def test_duplicate_launch_starts_nothing_new(make_agent, tmp_path):
    h = make_agent()
    trigger = tmp_path / "go"
    message = launch(10, waiting_job(trigger))
    h.send(message)
    first = h.wait_report("started", 10)
    h.send(message)
    h.wait_for(lambda: len(h.of_type("started", 10)) == 2)
    assert {r["pid"] for r in h.of_type("started", 10)} == {first["pid"]}

    release(trigger)
    h.wait_report("exited", 10)
    h.send(message)  # after the end: the exit is repeated, nothing is started
    h.wait_for(lambda: len(h.of_type("exited", 10)) == 2)
    assert len(h.of_type("started", 10)) == 2
    assert h.of_type("exited", 10)[1]["exit_code"] == 0
    assert h.log_text(10).count("waiting") == 1


def test_newer_attempt_stops_the_older_one_first(make_agent, tmp_path):
    h = make_agent()
    h.send(launch(11, ["sleep", "600"], attempt=1))
    h.wait_report("started", 11, attempt=1)
    h.send(launch(11, [PYTHON, "-c", "print('second')"], attempt=2, grace_seconds=1))
    old_exit = h.wait_report("exited", 11, attempt=1)
    new_start = h.wait_report("started", 11, attempt=2)
    assert old_exit["stop_reason"] == "superseded"
    assert h.reports.index(old_exit) < h.reports.index(new_start)
    assert h.wait_report("exited", 11, attempt=2)["exit_code"] == 0

    # A late launch of an attempt older than one the node ran is answered, not run.
    h.send(launch(11, ["sleep", "600"], attempt=1))
    h.send(launch(11, ["sleep", "600"], attempt=0))
    stale = h.wait_report("exited", 11, attempt=0)
    assert stale["stop_reason"] == "superseded" and stale["exit_code"] is None
    assert len(h.of_type("started", 11)) == 1 + 1


def test_launch_waits_for_gpus_of_a_job_in_its_grace_period(make_agent):
    from tests.scheduling.agent.helpers import IGNORES_SIGTERM

    h = make_agent()
    h.send(launch(12, python_job(IGNORES_SIGTERM), gpu_indices=[0, 1]))
    h.wait_report("started", 12)
    h.wait_file_contains(h.paths(12).log, "ready")
    h.send(stop(12, "preempted", grace_seconds=0.5))
    h.send(launch(13, ["true"], gpu_indices=[1, 2]))
    started = h.wait_report("started", 13)
    victim = h.wait_report("exited", 12)
    assert victim["stop_reason"] == "preempted" and victim["signal"] == 9
    assert h.reports.index(victim) < h.reports.index(started)


def test_stop_of_a_launch_still_waiting_for_gpus(make_agent):
    from tests.scheduling.agent.helpers import IGNORES_SIGTERM

    h = make_agent()
    h.send(launch(14, python_job(IGNORES_SIGTERM)))
    h.wait_report("started", 14)
    h.wait_file_contains(h.paths(14).log, "ready")
    h.send(stop(14, "preempted", grace_seconds=1))
    h.send(launch(15, ["true"]))
    h.send(stop(15, "cancelled"))
    exited = h.wait_report("exited", 15)
    assert exited["stop_reason"] == "cancelled" and "before it started" in exited["message"]
    h.wait_report("exited", 14)
    assert not h.of_type("started", 15)


def test_relative_work_dir_is_made_absolute(make_agent, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    h = make_agent(work_dir=Path("var/agent/node-a"))
    h.send(launch(16, python_job(SHOW_ENV)))
    assert h.wait_report("exited", 16)["exit_code"] == 0
    job_dir = tmp_path / "var/agent/node-a/jobs/16-1"
    assert f"CWD={job_dir / 'workspace'}\n" in h.log_text(16)
    assert (job_dir / "exit.json").exists()


def test_a_pass_works_only_on_jobs_in_flight(make_agent):
    """Ended jobs whose exit was reported stay known (duplicates are answered from them) but
    leave the set each pass looks at: after a burst the loop's work does not grow with it."""
    h = make_agent()
    for job_id in range(40, 46):
        h.send(launch(job_id, ["true"]))
    h.send(launch(46, ["sleep", "600"]))
    h.wait_for(lambda: len(h.of_type("exited")) == 6)
    h.wait_report("started", 46)
    h.wait_for(lambda: [r.job_id for r in h.agent._active_records()] == [46])
    assert len(h.agent.jobs) == 7
    h.send(launch(41, ["true"]))  # a duplicate of an ended job: answered, not run again
    h.wait_for(lambda: len(h.of_type("exited", 41)) == 2)
    assert len(h.of_type("started", 41)) == 1
    h.send(stop(46))
    h.wait_report("exited", 46)
    h.wait_for(lambda: h.agent._active_records() == [])
