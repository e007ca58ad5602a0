"""Agent restarts: running jobs are adopted, exits meanwhile are reported exactly once."""

import json
import os
import signal

from scheduling.agent import procfs
from scheduling.agent.agent import LocalMessage
from tests.scheduling.agent.helpers import (
    IGNORES_SIGTERM,
    launch,
    python_job,
    release,
    stop,
    wait_until,
    waiting_job,
)


def test_restarted_agent_adopts_a_running_job_and_reports_its_exit(make_agent, tmp_path):
    work = tmp_path / "work"
    trigger = tmp_path / "go"
    first = make_agent(work_dir=work)
    first.send(launch(1, waiting_job(trigger)))
    started = first.wait_report("started", 1)
    first.wait_for(lambda: first.log_text(1) == "waiting\n")
    first.agent.close()  # the agent stops; the job does not
    assert procfs.is_same_process(started["pid"], None)

    second = make_agent(work_dir=work)
    register = second.of_type("register")[0]
    assert register["jobs"] == [
        {"job_id": 1, "attempt": 1, "pid": started["pid"], "running": True, "stop_reason": None}
    ]
    assert second.of_type("heartbeat")[0]["jobs"][0]["running"] is True
    release(trigger, "4")
    exited = second.wait_report("exited", 1)
    # The wrapper wrote the exit code down, so it survives the change of agent.
    assert (exited["exit_code"], exited["signal"]) == (4, None)
    # Output already shipped by the first agent is not shipped again.
    assert not second.of_type("log", 1)
    assert not second.of_type("started", 1)


def test_job_that_ended_while_the_agent_was_down_is_reported_once(make_agent, tmp_path):
    work = tmp_path / "work"
    trigger = tmp_path / "go"
    first = make_agent(work_dir=work)
    first.send(launch(2, waiting_job(trigger)))
    first.wait_report("started", 2)
    first.agent.close()
    release(trigger)
    exit_file = first.paths(2).exit
    wait_until(exit_file.exists)

    second = make_agent(work_dir=work)
    exited = second.wait_report("exited", 2)
    assert exited["exit_code"] == 0
    assert json.loads(second.paths(2).state.read_text())["exit_reported"] is True

    third = make_agent(work_dir=work)
    third.agent.tick(0.2)
    third.agent.tick(0.2)
    assert not third.of_type("exited")
    # ... but it still knows the job: a duplicate stop gets the exit again.
    third.send(stop(2))
    assert third.wait_report("exited", 2)["exit_code"] == 0


def test_stop_deadline_survives_a_restart(make_agent, tmp_path):
    work = tmp_path / "work"
    first = make_agent(work_dir=work)
    first.send(launch(3, python_job(IGNORES_SIGTERM)))
    first.wait_report("started", 3)
    first.wait_file_contains(first.paths(3).log, "ready")
    first.send(stop(3, "timed_out", grace_seconds=0.5))
    first.agent.tick(0)
    first.agent.close()

    second = make_agent(work_dir=work)
    exited = second.wait_report("exited", 3)
    # Not the new agent's child, and killed with its wrapper: the agent knows it sent SIGKILL.
    assert exited["stop_reason"] == "timed_out" and exited["signal"] == 9


def test_unreported_exit_and_unsent_output_are_sent_after_a_restart(make_agent, tmp_path):
    work = tmp_path / "work"

    def broker_down(report):
        raise ConnectionError("broker down")

    first = make_agent(work_dir=work, send_report=broker_down)
    first.send(launch(4, python_job("print('precious output')")))
    first.wait_for(lambda: first.agent.jobs.get((4, 1)) and first.agent.jobs[(4, 1)].finished)
    first.agent.close()

    second = make_agent(work_dir=work)
    exited = second.wait_report("exited", 4)
    assert exited["exit_code"] == 0
    assert second.log_text(4) == "precious output\n"
    # Started was never delivered; the exit says all the control side needs.
    assert second.reports.index(second.of_type("log", 4)[0]) < second.reports.index(exited)


def test_a_pid_reused_by_another_process_is_not_adopted(make_agent, tmp_path):
    work = tmp_path / "work"
    first = make_agent(work_dir=work)
    first.send(launch(5, ["sleep", "600"]))
    first.wait_report("started", 5)
    first.agent.close()
    state_path = first.paths(5).state
    state = json.loads(state_path.read_text())
    real_ticks = state["pid_start_ticks"]
    state["pid_start_ticks"] = real_ticks - 1  # as if the pid now named another process
    state_path.write_text(json.dumps(state))

    second = make_agent(work_dir=work)
    exited = second.wait_report("exited", 5)
    assert exited["exit_code"] is None
    assert "exit status unknown" in exited["message"]
    # And the process it did not recognise was left alone.
    assert procfs.is_same_process(state["pid"], real_ticks)
    second.send(stop(5))  # answered from the record, the process is not signalled
    second.wait_for(lambda: len(second.of_type("exited", 5)) == 2)
    assert procfs.is_same_process(state["pid"], real_ticks)
    os.killpg(state["pid"], signal.SIGKILL)


def test_long_finished_jobs_are_forgotten_but_never_run_twice(make_agent):
    h = make_agent(forget_after_seconds=0.0, heartbeat_seconds=0.05)
    message = launch(6, python_job("print('once')"))
    h.send(message)
    h.wait_report("exited", 6)
    h.wait_for(lambda: (6, 1) not in h.agent.jobs)
    h.send(message)  # a very late duplicate: answered from the job's directory
    h.send(stop(6))
    h.wait_for(lambda: len(h.of_type("exited", 6)) == 3)
    assert {r["exit_code"] for r in h.of_type("exited", 6)} == {0}
    assert len(h.of_type("started", 6)) == 1
    assert h.paths(6).log.read_text() == "once\n"


def _count_state_writes(monkeypatch) -> dict[tuple[int, int], list[dict]]:
    """What each job's state file was written with, in order."""
    from scheduling.agent import jobstore as agent_module

    writes: dict[tuple[int, int], list[dict]] = {}
    real = agent_module.save_record

    def counting(record, paths):
        writes.setdefault(record.key, []).append(record.to_json())
        real(record, paths)

    monkeypatch.setattr(agent_module, "save_record", counting)
    return writes


def test_a_job_writes_its_state_once_per_step_that_must_survive_a_crash(make_agent, monkeypatch):
    """Launch and start are one write (with the pid), the end and the reported exit one
    more: three writes for a job's life instead of five."""
    writes = _count_state_writes(monkeypatch)
    h = make_agent()
    h.send(launch(1, python_job("pass")))
    h.wait_report("exited", 1)
    h.wait_for(lambda: json.loads(h.paths(1).state.read_text())["exit_reported"])
    states = writes[(1, 1)]
    assert len(states) == 3, [sorted(k for k, v in s.items() if v) for s in states]
    assert states[0]["pid"] and not states[0]["started_at"]  # the pid before anything else
    assert states[1]["started_at"] and not states[1]["finished"]
    assert states[2]["finished"] and states[2]["exit_reported"]


def test_a_waiting_launch_is_on_disk_before_its_message_is_acknowledged(make_agent, monkeypatch):
    """A launch that waits (its GPU is still held by a job in its stop grace period) is
    written down before the broker forgets the message: a restarted agent starts it."""
    h = make_agent()
    h.send(launch(1, python_job(IGNORES_SIGTERM), grace_seconds=30))
    h.wait_for(lambda: h.log_text(1))
    h.send(stop(1, grace_seconds=30))
    h.wait_for(lambda: h.agent.jobs[(1, 1)].stop_reason)
    on_disk_at_ack: list = []

    def ack(message):
        state = h.paths(2).state
        on_disk_at_ack.append(state.exists() and json.loads(state.read_text()))

    monkeypatch.setattr(LocalMessage, "ack", ack)
    h.send(launch(2, python_job("pass")))
    h.wait_for(lambda: on_disk_at_ack)
    state = on_disk_at_ack[0]
    assert state and state["pid"] is None and not state["finished"]
    assert h.agent.jobs[(2, 1)].waiting
    # Its message too (it is started from it), private: it carries the user's environment.
    assert json.loads(h.paths(2).launch.read_text())["job_id"] == 2
    assert h.paths(2).launch.stat().st_mode & 0o777 == 0o600
