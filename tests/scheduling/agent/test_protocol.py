"""The protocol module: builders produce valid messages, validators reject bad ones."""

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
    }  # fmt: skip
    assert p.validate_control_message(message) is message


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


@pytest.mark.parametrize("name", ["gpu-01", "dgx.a100_3", "n1"])
def test_node_queue_name(name):
    assert p.node_queue_name(name) == f"node.{name}"


@pytest.mark.parametrize("name", ["", "../etc", "a b", "-x", "n/1", "x" * 200])
def test_bad_node_names_are_rejected(name):
    with pytest.raises(p.ProtocolError):
        p.node_queue_name(name)
