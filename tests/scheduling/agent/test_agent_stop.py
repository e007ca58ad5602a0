"""Stopping jobs: SIGTERM to the group, SIGKILL after the grace period, idempotent stops."""

import os
import time

from scheduling.agent import procfs
from scheduling.agent.protocol import NOT_RUNNING_MESSAGE
from tests.scheduling.agent.helpers import IGNORES_SIGTERM, launch, python_job, stop


def test_stop_of_a_sleeping_job_is_quick_and_carries_the_reason(make_agent):
    h = make_agent()
    h.send(launch(1, ["sleep", "600"]))
    started = h.wait_report("started", 1)
    began = time.monotonic()
    h.send(stop(1, "cancelled", grace_seconds=30))
    exited = h.wait_report("exited", 1)
    assert time.monotonic() - began < 3
    assert exited["stop_reason"] == "cancelled"
    assert (exited["exit_code"], exited["signal"]) == (None, 15)
    assert exited["message"] == "stopped (cancelled): killed by SIGTERM"
    assert not procfs.group_members(started["pid"])


def test_job_ignoring_sigterm_is_killed_after_the_grace_period(make_agent):
    h = make_agent()
    h.send(launch(2, python_job(IGNORES_SIGTERM)))
    h.wait_report("started", 2)
    h.wait_file_contains(h.paths(2).log, "ready")
    grace = 0.6
    began = time.monotonic()
    h.send(stop(2, "timed_out", grace_seconds=grace))
    exited = h.wait_report("exited", 2)
    took = time.monotonic() - began
    assert grace - 0.05 <= took < grace + 2.0
    assert exited["stop_reason"] == "timed_out"
    assert exited["signal"] == 9 and exited["exit_code"] is None
    assert "at the end of the grace period" in exited["message"]


def test_sigterm_reaches_the_whole_group_and_a_graceful_exit_keeps_its_code(make_agent):
    # The command starts a child that checkpoints on SIGTERM; both must get the signal.
    code = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('child saved', flush=True), sys.exit(0)))\\n"
    "print('child ready', flush=True)\\n"
    "time.sleep(600)"])
def on_term(*_):
    child.wait()
    print("parent saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
time.sleep(600)
"""
    h = make_agent()
    h.send(launch(3, python_job(code)))
    h.wait_report("started", 3)
    h.wait_file_contains(h.paths(3).log, "child ready")
    h.send(stop(3, "preempted", grace_seconds=10))
    exited = h.wait_report("exited", 3)
    assert (exited["exit_code"], exited["signal"], exited["stop_reason"]) == (0, None, "preempted")
    log = h.log_text(3)
    assert "child saved" in log and "parent saved" in log


def test_duplicate_stop_does_no_harm_and_a_late_stop_repeats_the_exit(make_agent):
    h = make_agent()
    h.send(launch(4, python_job(IGNORES_SIGTERM)))
    h.wait_report("started", 4)
    h.wait_file_contains(h.paths(4).log, "ready")
    h.send(stop(4, "preempted", grace_seconds=0.5))
    h.send(stop(4, "cancelled", grace_seconds=60))  # keeps the first reason and deadline
    exited = h.wait_report("exited", 4)
    assert exited["stop_reason"] == "preempted" and exited["signal"] == 9
    h.send(stop(4, "cancelled"))
    h.wait_for(lambda: len(h.of_type("exited", 4)) == 2)
    again = h.of_type("exited", 4)[1]
    assert {k: v for k, v in again.items() if k != "sent_at"} == {
        k: v for k, v in exited.items() if k != "sent_at"
    }


def test_a_second_stop_with_a_shorter_grace_brings_the_kill_forward(make_agent):
    h = make_agent()
    h.send(launch(5, python_job(IGNORES_SIGTERM)))
    h.wait_report("started", 5)
    h.wait_file_contains(h.paths(5).log, "ready")
    began = time.monotonic()
    h.send(stop(5, "reclaimed", grace_seconds=600))
    h.send(stop(5, "cancelled", grace_seconds=0))
    exited = h.wait_report("exited", 5)
    assert time.monotonic() - began < 3
    assert exited["stop_reason"] == "reclaimed" and exited["signal"] == 9


def test_stop_of_an_unknown_job(make_agent):
    h = make_agent()
    h.send(stop(99, "lost", attempt=3))
    exited = h.wait_report("exited", 99)
    assert exited["attempt"] == 3
    assert (exited["exit_code"], exited["signal"], exited["stop_reason"]) == (None, None, "lost")
    assert exited["message"] == NOT_RUNNING_MESSAGE


def test_stop_for_another_attempt_leaves_the_running_one_alone(make_agent):
    h = make_agent()
    h.send(launch(6, ["sleep", "600"], attempt=2))
    started = h.wait_report("started", 6)
    h.send(stop(6, "cancelled", attempt=1))
    assert h.wait_report("exited", 6)["message"] == NOT_RUNNING_MESSAGE
    h.agent.tick(0.1)
    assert procfs.is_same_process(started["pid"], None)


def test_processes_left_behind_by_a_finished_job_are_killed(make_agent):
    # The command exits at once but leaves a background process in its group.
    h = make_agent()
    h.send(launch(7, ["sleep 600 & echo $! > bg.pid; exit 0"], shell=True))
    exited = h.wait_report("exited", 7)
    assert exited["exit_code"] == 0
    assert "left behind" in exited["message"]
    pid = int((h.workspace(7) / "bg.pid").read_text())
    h.wait_for(lambda: not procfs.is_same_process(pid, None), timeout=5)
    assert not os.path.exists(f"/proc/{pid}") or procfs.read_stat(pid).state == "Z"
