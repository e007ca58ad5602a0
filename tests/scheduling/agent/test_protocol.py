"""The protocol module: builders produce valid messages, validators reject bad ones."""

import re

import pytest

from scheduling.agent import protocol as p


def test_launch_message_has_every_field_of_the_protocol():
    message = p.launch_message(
        job_id=7, attempt=2, name="train", command=["python", "train.py"], gpu_indices=[0, 1]
    )
    assert message["type"] == "launch"
    assert set(message) == {
        "type", "job_id", "attempt", "name", "command", "shell", "env", "working_dir",
        "gpu_indices", "gpu_uuids", "checkpoint_dir", "array_index", "grace_seconds", "sent_at",
        "tenant", "run_as", "limits", "log_cap_bytes",
    }  # fmt: skip
    assert (message["tenant"], message["run_as"], message["log_cap_bytes"]) == ("", "", None)
    assert message["limits"] == {"cpus": None, "memory_mb": None, "pids": None}
    assert p.validate_control_message(message) is message


def test_a_launch_of_an_older_portal_without_isolation_fields_is_valid():
    message = p.launch_message(job_id=1, attempt=1, name="x", command=["true"], gpu_indices=[0])
    for name in ("tenant", "run_as", "limits", "log_cap_bytes"):
        del message[name]
    assert p.validate_control_message(message) is message


def test_launch_isolation_fields_are_carried():
    message = p.launch_message(
        job_id=1, attempt=1, name="x", command=["true"], gpu_indices=[0], tenant="nlp",
        run_as="sluice-nlp", limits={"cpus": 2.5, "memory_mb": 4096}, log_cap_bytes=1000,
    )  # fmt: skip
    assert (message["tenant"], message["run_as"], message["log_cap_bytes"]) == (
        "nlp",
        "sluice-nlp",
        1000,
    )
    assert message["limits"] == {"cpus": 2.5, "memory_mb": 4096, "pids": None}
    with pytest.raises(p.ProtocolError, match="unknown limits"):
        p.launch_message(
            job_id=1, attempt=1, name="x", command=["x"], gpu_indices=[0], limits={"gpus": 1}
        )


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"tenant": "../etc"}, "'tenant' '../etc' is not a tenant slug"),
        ({"tenant": 3}, "'tenant' must be a string"),
        ({"run_as": "root:0"}, "'run_as' 'root:0' is not a Unix account name"),
        ({"run_as": "Sluice"}, "not a Unix account name"),
        ({"run_as": "a" * 33}, "not a Unix account name"),
        ({"limits": [1]}, "'limits' must be an object"),
        ({"limits": {"cpus": 0}}, "'limits.cpus' must be a positive number"),
        ({"limits": {"memory_mb": 1.5}}, "'limits.memory_mb' must be a positive integer"),
        ({"limits": {"pids": -1}}, "'limits.pids' must be a positive integer"),
        ({"limits": {"pids": True}}, "'limits.pids' must be a positive integer"),
        ({"log_cap_bytes": 0}, "'log_cap_bytes' must be positive"),
        ({"log_cap_bytes": "1"}, "'log_cap_bytes' must be an integer or null"),
    ],
)
def test_invalid_isolation_fields_are_rejected(change, error):
    message = p.launch_message(job_id=1, attempt=1, name="x", command=["true"], gpu_indices=[0])
    message.update(change)
    with pytest.raises(p.ProtocolError, match=re.escape(error)):
        p.validate_control_message(message)


def test_reserved_env_names():
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LD_PRELOAD", "PATH", "HOME",
                 "SLUICE_JOB_ID", "SLUICE_ANYTHING"):  # fmt: skip
        assert p.is_reserved_env_name(name), name
    for name in ("PYTHONPATH", "FOO", "HF_HOME", "CUDA_HOME", "LD_PRELOADX"):
        assert not p.is_reserved_env_name(name), name


def test_stop_and_kill_messages_are_valid():
    stop = p.stop_message(job_id=1, attempt=1, reason="preempted", grace_seconds=10)
    assert stop["reason"] == "preempted"
    kill = p.kill_process_message(pid=123, gpu_index=3, reason="zombie")
    assert p.validate_control_message(kill)["pid"] == 123


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"type": "explode"}, "unknown message type"),
        ({"job_id": "7"}, "'job_id' must be an integer"),
        ({"job_id": True}, "'job_id' must be an integer"),
        ({"command": []}, "must not be empty"),
        ({"command": "python x.py"}, "'command' must be a list of strings"),
        ({"env": {"A": 1}}, "'env' must be an object of strings"),
        ({"gpu_uuids": ["GPU-a"]}, "one to one"),
        ({"array_index": "3"}, "'array_index' must be an integer or null"),
    ],
)
def test_invalid_launch_messages_are_rejected(change, error):
    message = p.launch_message(job_id=1, attempt=1, name="x", command=["true"], gpu_indices=[0, 1])
    message.update(change)
    with pytest.raises(p.ProtocolError, match=error):
        p.validate_control_message(message)


def test_missing_field_and_unknown_stop_reason_are_rejected():
    stop = p.stop_message(job_id=1, attempt=1, reason="cancelled")
    del stop["grace_seconds"]
    with pytest.raises(p.ProtocolError, match="missing field 'grace_seconds'"):
        p.validate_control_message(stop)
    with pytest.raises(p.ProtocolError, match="unknown reason"):
        p.stop_message(job_id=1, attempt=1, reason="bored")
    with pytest.raises(p.ProtocolError):
        p.validate_control_message(["not", "a", "dict"])


def test_reports_validate():
    exited = p.exited_report(
        node="n1", job_id=1, attempt=1, exit_code=None, signal=9,
        stop_reason="launch_failed", message="m", finished_at=1.0,
    )  # fmt: skip
    assert p.validate_report(exited) is exited
    exited["stop_reason"] = "whatever"
    with pytest.raises(p.ProtocolError, match="unknown stop_reason"):
        p.validate_report(exited)
    log = p.log_report(node="n1", job_id=1, attempt=1, offset=0, data="hi")
    assert p.validate_report(log)["type"] == "log"
    with pytest.raises(p.ProtocolError, match="missing field 'node'"):
        p.validate_report({"type": "started", "sent_at": 1.0})


def test_isolation_of_register_and_started_reports_is_optional_and_checked():
    started = p.started_report(node="n1", job_id=1, attempt=1, pid=5, started_at=1.0)
    assert "isolation" not in started and p.validate_report(started)
    isolation = {"run_as": "sluice-nlp", "uid": 990, "gid": 990, "cgroup": None, "limits": {}}
    started = p.started_report(
        node="n1", job_id=1, attempt=1, pid=5, started_at=1.0, isolation=isolation
    )
    assert p.validate_report(started)["isolation"]["uid"] == 990
    started["isolation"] = {**isolation, "uid": "990"}
    with pytest.raises(p.ProtocolError, match="started isolation: 'uid' must be an integer"):
        p.validate_report(started)
    register = p.report(
        "register", "n1", pool=None, hostname="h", agent_version="1", cpus=1, memory_mb=1,
        backend="simulated", gpus=[], jobs=[],
    )  # fmt: skip
    assert p.validate_report(register)
    register["isolation"] = {
        "run_as_user": False, "cgroup": False, "cgroup_controllers": [],
        "device_isolation": False, "notes": ["jobs run as the agent's user (agent not root)"],
    }  # fmt: skip
    assert p.validate_report(register)
    del register["isolation"]["notes"]
    with pytest.raises(p.ProtocolError, match="register isolation: missing field 'notes'"):
        p.validate_report(register)


@pytest.mark.parametrize("name", ["gpu-01", "dgx.a100_3", "n1"])
def test_node_queue_name(name):
    assert p.node_queue_name(name) == f"node.{name}"


@pytest.mark.parametrize("name", ["", "../etc", "a b", "-x", "n/1", "x" * 200])
def test_bad_node_names_are_rejected(name):
    with pytest.raises(p.ProtocolError):
        p.node_queue_name(name)
