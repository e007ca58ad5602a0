"""A container job reaching a node agent fails with a clear reason: the agent runs bare
host processes (the control side refuses images on agent pools; this covers a pool whose
executor changed under a queued job)."""

from scheduling.agent.protocol import validate_report
from tests.scheduling.agent.helpers import launch


def test_a_launch_with_an_image_fails_with_a_clear_reason(make_agent):
    h = make_agent()
    h.send(launch(3, ["true"], image="registry.example.com/team/train:1.0"))
    exited = h.wait_report("exited", 3)
    validate_report(exited)
    assert exited["stop_reason"] == "launch_failed"
    assert "cannot run the container image registry.example.com/team/train:1.0" in exited["message"]
    assert not h.of_type("started", 3)


def test_a_launch_without_an_image_still_runs(make_agent):
    h = make_agent()
    h.send(launch(4, ["true"]))
    assert h.wait_report("exited", 4)["exit_code"] == 0
