"""The log cap: output is shipped up to it, then one marker, then nothing; the job goes on."""

import json

from scheduling.agent.protocol import log_truncated_marker
from tests.scheduling.agent.helpers import PYTHON, launch, python_job, release

#: Prints ``n`` bytes, waits for a file, prints more, writes "done" in its workspace.
TALKER = """
import os, sys, time
n, trigger = int(sys.argv[1]), sys.argv[2]
sys.stdout.write("x" * n); sys.stdout.flush()
while not os.path.exists(trigger):
    time.sleep(0.02)
sys.stdout.write("y" * n); sys.stdout.flush()
open("done", "w").write("still ran")
"""


def _logs(h, job_id):
    return sorted((r["offset"], r["data"]) for r in h.of_type("log", job_id))


def test_output_beyond_the_cap_is_cut_with_a_marker_and_the_job_goes_on(make_agent, tmp_path):
    h = make_agent(log_chunk_bytes=300)
    trigger = tmp_path / "go"
    h.send(launch(1, [PYTHON, "-c", TALKER, "5000", str(trigger)], log_cap_bytes=1000))
    marker = log_truncated_marker(1000)
    h.wait_for(lambda: any(d == marker for _, d in _logs(h, 1)))
    # Once the marker is out the node keeps no more than the cap on disk either.
    h.wait_for(lambda: h.paths(1).log.stat().st_size == 1000)
    release(trigger, "")
    exited = h.wait_report("exited", 1)
    assert (exited["exit_code"], exited["stop_reason"]) == (0, None)  # not killed
    assert (h.workspace(1) / "done").read_text() == "still ran"
    logs = _logs(h, 1)
    assert logs[-1] == (1000, "\n[sluice: log truncated at 1000 bytes; the job goes on running]\n")
    assert "".join(d for _, d in logs[:-1]) == "x" * 1000
    assert all(len(d.encode()) <= 300 for _, d in logs[:-1])
    assert len(h.of_type("log", 1)) == len(logs)  # the marker once, nothing after it
    state = json.loads(h.paths(1).state.read_text())
    assert state["log_truncated"] is True and state["log_offset"] == 1000


def test_output_under_the_cap_is_all_shipped(make_agent):
    h = make_agent()
    h.send(launch(2, python_job("print('a' * 999)"), log_cap_bytes=1000))
    h.wait_report("exited", 2)
    assert h.log_text(2) == "a" * 999 + "\n"  # exactly the cap: nothing cut


def test_the_agent_default_cap_applies(make_agent):
    h = make_agent(log_cap_bytes=100)
    h.send(launch(3, python_job("print('b' * 500)")))
    h.wait_report("exited", 3)
    assert h.log_text(3) == "b" * 100 + log_truncated_marker(100)


def test_a_character_split_at_the_cap_is_shipped_as_far_as_the_cap(make_agent):
    h = make_agent()
    h.send(launch(4, python_job("print('é' * 1000)"), log_cap_bytes=1001))
    h.wait_report("exited", 4)
    logs = _logs(h, 4)
    assert logs[-1] == (1001, log_truncated_marker(1001))
    assert "".join(d for _, d in logs[:-1]) == "é" * 500 + "\ufffd"


def test_a_restarted_agent_does_not_resume_shipping(make_agent, tmp_path):
    work = tmp_path / "work"
    trigger = tmp_path / "go"
    first = make_agent(work_dir=work)
    first.send(launch(5, [PYTHON, "-c", TALKER, "2000", str(trigger)], log_cap_bytes=500))
    first.wait_for(lambda: first.agent.jobs.get((5, 1)) and first.agent.jobs[(5, 1)].log_truncated)
    first.agent.close()

    second = make_agent(work_dir=work)
    release(trigger, "")
    assert second.wait_report("exited", 5)["exit_code"] == 0
    assert not second.of_type("log", 5)


def test_a_marker_not_delivered_before_a_restart_is_sent_again(make_agent, tmp_path):
    work = tmp_path / "work"

    def broker_down(report):
        raise ConnectionError("broker down")

    first = make_agent(work_dir=work, send_report=broker_down)
    first.send(launch(6, python_job("print('c' * 3000)"), log_cap_bytes=1000))
    first.wait_for(lambda: first.agent.jobs.get((6, 1)) and first.agent.jobs[(6, 1)].finished)
    first.agent.tick(0)
    first.agent.close()

    second = make_agent(work_dir=work)
    second.wait_report("exited", 6)
    assert second.log_text(6) == "c" * 1000 + log_truncated_marker(1000)
