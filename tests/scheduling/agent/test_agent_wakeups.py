"""The loop sleeps until something happens: a job's exit (its pidfd, or SIGCHLD), a
message, a stop request; and a burst of launches starts every wrapper before waiting for
any. The bounds below are loose on purpose: a woken pass returns in milliseconds, a pass
that was not woken waits its whole timeout (5 s)."""

import threading
import time

import pytest

from scheduling.agent import launcher as agent_module
from scheduling.agent import wakeups
from scheduling.agent.protocol import stop_message
from tests.scheduling.agent.helpers import launch, python_job, release, stop, waiting_job

NEEDS_PIDFD = pytest.mark.skipif(
    not wakeups.pidfds_supported(), reason="the kernel gives no pidfds"
)
WOKEN = 2.0  # well under the 5 s the pass would otherwise wait


def timed_tick(h, timeout: float = 5.0) -> float:
    began = time.monotonic()
    h.agent.tick(timeout)
    return time.monotonic() - began


def running_job(h, trigger, job_id: int = 1) -> None:
    h.send(launch(job_id, waiting_job(trigger)))
    h.wait_for(lambda: h.log_text(job_id) == "waiting\n")


def ended_pass(h, trigger) -> float:
    """End the job waiting on ``trigger``; how long the next pass (timeout 5 s) took."""
    release(trigger, "3")
    return timed_tick(h)


@NEEDS_PIDFD
def test_an_exit_wakes_the_loop_through_the_jobs_pidfd(make_agent, tmp_path):
    h = make_agent(poll_seconds=60)  # nothing is polled: only the pidfd can wake the pass
    trigger = tmp_path / "go"
    running_job(h, trigger)
    assert h.agent.waiter.watching_process((1, 1))
    h.agent.tick(0)  # nothing more queued, nothing due
    assert ended_pass(h, trigger) < WOKEN
    exited = h.wait_report("exited", 1)  # queued and flushed by that one pass
    assert exited["exit_code"] == 3
    assert not h.agent.waiter.watching_process((1, 1))  # forgotten once ended


@NEEDS_PIDFD
def test_an_adopted_jobs_exit_wakes_the_new_agent(make_agent, tmp_path):
    trigger = tmp_path / "go"
    first = make_agent(work_dir=tmp_path / "work", poll_seconds=60)
    running_job(first, trigger)
    first.agent.close()
    # Not this agent's child: no SIGCHLD would come, the pidfd still does.
    second = make_agent(work_dir=tmp_path / "work", poll_seconds=60)
    assert second.agent.jobs[(1, 1)].process is None
    assert second.agent.waiter.watching_process((1, 1))
    assert ended_pass(second, trigger) < WOKEN
    assert second.wait_report("exited", 1)["exit_code"] == 3


def test_without_pidfds_sigchld_wakes_the_loop(make_agent, tmp_path, monkeypatch):
    monkeypatch.setattr(wakeups, "pidfds_supported", lambda: False)
    h = make_agent(poll_seconds=60)
    try:
        assert h.agent.waiter.sigchld
        trigger = tmp_path / "go"
        running_job(h, trigger)
        assert not h.agent.waiter.watching_process((1, 1))
        h.agent.tick(0)
        assert ended_pass(h, trigger) < WOKEN
        assert h.wait_report("exited", 1)["exit_code"] == 3
    finally:
        h.agent.waiter.close()  # gives SIGCHLD and the wake-up fd back


def test_without_any_signal_an_exit_is_found_by_polling(make_agent, tmp_path, monkeypatch):
    monkeypatch.setattr(wakeups, "pidfds_supported", lambda: False)
    monkeypatch.setattr(wakeups.LoopWaiter, "route_sigchld", lambda self: False)
    h = make_agent(poll_seconds=0.05)
    trigger = tmp_path / "go"
    running_job(h, trigger)
    assert h.agent._wait_time() <= 0.05  # polled: the wait is capped by poll_seconds
    release(trigger)
    assert h.wait_report("exited", 1)["exit_code"] == 0


def test_a_message_wakes_the_loop(make_agent):
    h = make_agent()
    threading.Timer(0.2, h.send, args=[stop_message(job_id=9, attempt=1, reason="lost")]).start()
    assert timed_tick(h) < WOKEN
    assert h.of_type("exited", 9)


def test_a_stop_request_from_another_thread_wakes_the_loop(make_agent):
    h = make_agent()
    threading.Timer(0.2, h.agent.request_stop).start()
    assert timed_tick(h) < WOKEN


def test_an_idle_agent_sleeps_until_its_next_heartbeat(make_agent, monkeypatch):
    h = make_agent(heartbeat_seconds=60)
    passes = []
    real_tick = h.agent.tick
    monkeypatch.setattr(h.agent, "tick", lambda: passes.append(1) or real_tick())
    loop = threading.Thread(target=h.agent.run)
    h.agent.start = lambda: None  # started already by the fixture
    loop.start()
    time.sleep(1.0)
    h.agent.request_stop()
    loop.join(timeout=5)
    assert not loop.is_alive()
    assert len(passes) <= 2  # the first pass sleeps; the stop request ends the second


def test_a_burst_of_launches_starts_every_wrapper_before_waiting_for_any(make_agent, monkeypatch):
    calls = []
    real_start, real_finish = agent_module.spawn_start, agent_module.spawn_finish

    def spawn_start(**kwargs):
        calls.append("start")
        return real_start(**kwargs)

    def spawn_finish(*args):
        calls.append("finish")
        return real_finish(*args)

    monkeypatch.setattr(agent_module, "spawn_start", spawn_start)
    monkeypatch.setattr(agent_module, "spawn_finish", spawn_finish)
    h = make_agent(spec="32xH100-80GB", max_receive_seconds=60)
    for job_id in range(1, 33):
        h.send(launch(job_id, python_job("import time; time.sleep(30)"), gpu_indices=[job_id - 1]))
    h.agent.tick(0)  # one pass takes them all
    assert calls[:32] == ["start"] * 32
    assert all(h.agent.jobs[(j, 1)].pid for j in range(1, 33))
    h.wait_for(lambda: len(h.of_type("started")) == 32)
    assert calls.count("finish") == 32
    for job_id in range(1, 33):
        h.send(stop(job_id, grace_seconds=1))
    h.wait_for(lambda: len(h.of_type("exited")) == 32)


def test_a_stop_while_the_wrapper_starts_is_passed_on_once_it_answers(make_agent):
    h = make_agent()
    h.send(launch(1, python_job("import time; time.sleep(60)")))
    h.send(stop(1))
    h.agent.tick(0)  # both in one pass: the stop finds the wrapper still starting
    exited = h.wait_report("exited", 1)
    kinds = [r["type"] for r in h.reports if r.get("job_id") == 1]
    assert kinds.index("started") < kinds.index("exited")
    assert exited["stop_reason"] == "cancelled" and exited["signal"] == 15


def test_an_agent_stopped_before_the_wrapper_answered_never_starts_the_job_twice(
    make_agent, tmp_path
):
    trigger = tmp_path / "go"
    first = make_agent(work_dir=tmp_path / "work")
    first.send(launch(1, waiting_job(trigger)))
    first.agent._receive(0)  # the wrapper is started; its answer is not read
    record = first.agent.jobs[(1, 1)]
    assert record.starting is not None and record.started_at is None
    pid = record.pid
    first.agent.close()
    assert not first.of_type("started", 1)

    second = make_agent(work_dir=tmp_path / "work")
    # Adopted, and its start told once, after the agent registered.
    assert [r["type"] for r in second.reports] == ["register", "started", "heartbeat"]
    assert second.of_type("started", 1)[0]["pid"] == pid
    second.wait_for(lambda: second.log_text(1) == "waiting\n")
    second.send(launch(1, waiting_job(trigger)))  # the launch again: answered, not rerun
    second.agent.tick(0)
    assert len(second.of_type("started", 1)) == 2
    assert second.agent.jobs[(1, 1)].pid == pid
    release(trigger)
    assert second.wait_report("exited", 1)["exit_code"] == 0


def test_a_repeated_launch_while_the_wrapper_starts_is_answered_once_it_runs(make_agent):
    h = make_agent()
    message = launch(1, python_job("import time; time.sleep(60)"))
    h.send(message)
    h.send(message)
    h.agent._receive(0)  # both handled; the wrapper's answer is not read yet
    assert not h.of_type("started", 1)  # nothing said before the wrapper answered
    h.agent._heartbeat()  # nor listed as running yet
    h.agent.outbox.flush()
    assert h.of_type("heartbeat")[-1]["jobs"] == []
    started = h.wait_report("started", 1)
    for _ in range(5):
        h.agent.tick(0.02)
    assert h.of_type("started", 1) == [started]
    h.send(stop(1, grace_seconds=1))
    h.wait_report("exited", 1)


def test_a_long_burst_is_taken_over_passes_that_do_not_wait(make_agent):
    h = make_agent(max_receive_seconds=0)  # one message per pass, then the rest of it
    for job_id in range(1, 4):
        h.send(stop_message(job_id=job_id, attempt=1, reason="lost"))
    h.agent.tick(0)
    assert len(h.of_type("exited")) == 1  # answered and sent in the same pass
    assert h.agent._wait_time() == 0  # more is waiting: the next pass comes at once
    began = time.monotonic()
    h.agent.tick()
    h.agent.tick()
    assert time.monotonic() - began < WOKEN
    assert [r["job_id"] for r in h.of_type("exited")] == [1, 2, 3]
    h.agent.tick()  # finds nothing more
    assert h.agent._wait_time() > 1  # back to sleeping
