"""The Slurm executor never submits an attempt twice and reports how a job ended as Slurm
recorded it, with a fake controller (no daemons): a launch repeated after the attempt ended,
a launch of an attempt older than one already launched, a launch or stop arriving at a
restarted bridge for an attempt the controller already ran, and a job cancelled in Slurm
whose recorded exit status is 0."""

import dataclasses
import signal

import pytest

from scheduling.agent import protocol
from scheduling.executors.base import Exited, Started
from scheduling.executors.slurm.client import SlurmClient, SlurmJob
from scheduling.executors.slurm.executor import SUPERSEDED_MESSAGE, SlurmExecutor


class FakeController(SlurmClient):
    """Keeps submitted jobs in memory; tests move them through Slurm's states."""

    def __init__(self):
        super().__init__(partition="sluice")
        self.records: dict[str, SlurmJob] = {}
        self.submitted: list[str] = []
        self.cancelled: list[str] = []

    def submit(self, script, options):
        job_id = str(1000 + len(self.submitted))
        self.submitted.append(job_id)
        value = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in options if "=" in o}
        self.records[job_id] = SlurmJob(
            job_id=job_id,
            name=value["--job-name"],
            state="PENDING",
            partition="sluice",
            user="root",
            nodes="",
            comment=value["--comment"],
            exit_status=None,
            state_reason="None",
            gpu_indices=(),
            gpus_requested=1,
            start_time=0,
            end_time=0,
            standard_output=value["--output"],
            required_nodes=value["--nodelist"],
        )
        return job_id

    def set(self, job_id, **fields):
        self.records[job_id] = dataclasses.replace(self.records[job_id], **fields)

    def run_to(self, job_id, state, exit_status):
        node = self.records[job_id].required_nodes
        self.set(job_id, state=state, exit_status=exit_status, nodes=node, start_time=1)

    def jobs(self):
        return list(self.records.values())

    def signal(self, job_id, signal_name):
        pass

    def cancel(self, job_id):
        self.cancelled.append(job_id)


def _launch(job_id=7, attempt=0):
    message = protocol.launch_message(
        job_id=job_id,
        attempt=attempt,
        name="train",
        command=["true"],
        shell=False,
        gpu_indices=[0],
        grace_seconds=3,
        run_as="nobody",
        env={},
    )
    message["tenant"] = "nlp"
    return message


def _stop(job_id=7, attempt=0, reason=protocol.STOP_REASONS[0]):
    return protocol.stop_message(job_id=job_id, attempt=attempt, reason=reason, grace_seconds=3)


@pytest.fixture
def controller():
    return FakeController()


def _bridge(controller, tmp_path):
    executor = SlurmExecutor(client=controller, work_dir=tmp_path, refresh_seconds=0)
    executor.start()
    return executor


def _exits(events):
    return [e for e in events if isinstance(e, Exited)]


def _ended_once(controller, executor, exit_status=0, state="COMPLETED"):
    (slurm_id,) = controller.submitted
    controller.run_to(slurm_id, state, exit_status)
    events = list(executor.poll())
    (exited,) = _exits(events)
    return slurm_id, exited


def test_a_launch_repeated_after_the_attempt_ended_is_answered_not_submitted(controller, tmp_path):
    executor = _bridge(controller, tmp_path)
    executor.launch("sn1", _launch())
    _, exited = _ended_once(controller, executor)
    assert exited.exit_code == 0
    list(executor.poll())  # the ended attempt is forgotten by the loop, its exit kept
    executor.launch("sn1", _launch())
    again = _exits(executor.poll())
    assert len(controller.submitted) == 1
    assert [(e.job_id, e.attempt, e.exit_code) for e in again] == [(7, 0, 0)]


def test_a_launch_of_an_older_attempt_is_superseded_not_submitted(controller, tmp_path):
    executor = _bridge(controller, tmp_path)
    executor.launch("sn1", _launch(attempt=2))
    executor.launch("sn1", _launch(attempt=1))
    (refused,) = _exits(executor.poll())
    assert len(controller.submitted) == 1
    assert (refused.attempt, refused.reason) == (1, protocol.SUPERSEDED)
    assert refused.message == SUPERSEDED_MESSAGE and refused.exit_code is None


def test_a_restarted_bridge_reports_an_attempt_slurm_ran_instead_of_running_it_again(
    controller, tmp_path
):
    first = _bridge(controller, tmp_path)
    first.launch("sn1", _launch())
    (slurm_id,) = controller.submitted
    # The bridge stops before the job ends; Slurm runs it to the end meanwhile.
    controller.run_to(slurm_id, "COMPLETED", 0)
    second = _bridge(controller, tmp_path)
    second.launch("sn1", _launch())  # the launch message delivered again
    events = list(second.poll())
    assert controller.submitted == [slurm_id]
    assert any(isinstance(e, Started) for e in events)
    (exited,) = _exits(events)
    assert (exited.attempt, exited.exit_code, exited.signal) == (0, 0, None)
    # And a stop (the control side asking for the exit again) gets the same answer.
    second.stop("sn1", _stop())
    (again,) = _exits(second.poll())
    assert again.exit_code == 0 and again.message != protocol.NOT_RUNNING_MESSAGE


def test_a_stop_of_an_attempt_that_ended_here_answers_its_real_exit(controller, tmp_path):
    executor = _bridge(controller, tmp_path)
    executor.launch("sn1", _launch())
    _ended_once(controller, executor, exit_status=3 << 8, state="FAILED")
    list(executor.poll())
    executor.stop("sn1", _stop())
    (exited,) = _exits(executor.poll())
    assert exited.exit_code == 3 and exited.message != protocol.NOT_RUNNING_MESSAGE
    assert controller.cancelled == []


@pytest.mark.parametrize("status", [0, None])
def test_a_running_job_cancelled_in_slurm_with_exit_status_0_is_not_a_success(
    controller, tmp_path, status
):
    executor = _bridge(controller, tmp_path)
    executor.launch("sn1", _launch())
    _, exited = _ended_once(controller, executor, exit_status=status, state="CANCELLED")
    assert exited.exit_code is None and exited.signal == signal.SIGTERM
    assert "not by Sluice" in exited.message


def test_a_job_cancelled_in_slurm_with_its_signal_keeps_it(controller, tmp_path):
    executor = _bridge(controller, tmp_path)
    executor.launch("sn1", _launch())
    _, exited = _ended_once(controller, executor, exit_status=9, state="CANCELLED")
    assert exited.exit_code is None and exited.signal == 9


# --- what the heartbeats list: never ahead of the reported events ------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _summaries(executor, node="sn1"):
    return {(s["job_id"], s["attempt"]): s for s in executor.job_summaries(node)}


def test_a_job_that_ended_in_slurm_is_listed_running_until_its_exit_is_reported(
    controller, tmp_path
):
    clock = Clock()
    executor = SlurmExecutor(client=controller, work_dir=tmp_path, refresh_seconds=0, clock=clock)
    executor.start()
    executor.launch("sn1", _launch())
    (slurm_id,) = controller.submitted
    # Pending in Slurm: it has not started, so it is not listed (not "running" yet).
    list(executor.poll())
    assert _summaries(executor) == {}
    controller.set(slurm_id, state="RUNNING", nodes="sn1", start_time=990)
    (started,) = [e for e in executor.poll() if isinstance(e, Started)]
    assert started.started_at == 990
    assert _summaries(executor)[(7, 0)]["running"] is True
    # It ends in Slurm before the bridge looks again: a heartbeat built now must still
    # list it (the old code asked the controller again and left it out, so the control
    # side ended it LOST and ran it a second time).
    controller.run_to(slurm_id, "COMPLETED", 0)
    controller.set(slurm_id, end_time=995)
    assert _summaries(executor)[(7, 0)]["running"] is True
    (exited,) = _exits(executor.poll())
    summary = _summaries(executor)[(7, 0)]
    assert summary["running"] is False and summary["exit_code"] == 0
    assert summary["finished_at"] == exited.finished_at == 995
    assert _summaries(executor, "sn2") == {}
    clock.now += 61
    assert _summaries(executor) == {}


def test_a_stop_of_a_job_slurm_no_longer_knows_is_not_retried(controller, tmp_path):
    from scheduling.executors.slurm.client import SlurmJobGone

    executor = _bridge(controller, tmp_path)
    executor.launch("sn1", _launch())
    (slurm_id,) = controller.submitted
    controller.set(slurm_id, state="RUNNING", nodes="sn1", start_time=1)
    list(executor.poll())
    calls = []

    def gone(job_id, *args):
        calls.append(job_id)
        raise SlurmJobGone("scancel failed: Invalid job id specified")

    controller.signal = gone
    controller.cancel = gone
    executor.stop("sn1", _stop())
    del controller.records[slurm_id]  # purged
    for _ in range(5):
        events = list(executor.poll())
        if _exits(events):
            break
    assert calls == [slurm_id]  # no cancel at the deadline after it was found gone
    (exited,) = _exits(events)
    assert "no longer knows" in exited.message


def test_a_stop_finding_the_job_started_reports_its_start(controller, tmp_path):
    executor = _bridge(controller, tmp_path)
    executor.launch("sn1", _launch())
    (slurm_id,) = controller.submitted
    list(executor.poll())
    controller.set(slurm_id, state="RUNNING", nodes="sn1", start_time=5)
    executor.stop("sn1", _stop())
    assert [type(e) for e in executor.poll()] == [Started]
    assert _summaries(executor)[(7, 0)]["running"] is True


def test_an_extension_raises_the_slurm_time_limit_of_the_running_attempt(controller, tmp_path):
    from scheduling.executors.runtime import Runtime, RuntimeNode

    limits = []
    controller.set_time_limit = lambda job_id, minutes: limits.append((job_id, minutes))
    executor = _bridge(controller, tmp_path)
    runtime = Runtime(executor, [RuntimeNode("sn1", "training")], lambda report: None)
    launch = _launch()
    launch["runtime_limit_seconds"] = 3600
    runtime.handle_message(launch, "sn1")
    (slurm_id,) = controller.submitted
    extend = protocol.extend_message(
        job_id=7, attempt=0, runtime_limit_seconds=3600 + 1800, grace_seconds=30
    )
    runtime.handle_message(extend, "sn1")
    # 5,400 s + 30 s of grace, rounded up to minutes, and one more.
    assert limits == [(slurm_id, 92)]
    # An attempt this bridge does not run (ended, or another's) is left alone.
    runtime.handle_message({**extend, "attempt": 3}, "sn1")
    assert limits == [(slurm_id, 92)]


def test_a_bridge_waits_for_the_controller_before_its_nodes_register(controller, tmp_path):
    from scheduling.executors.slurm.client import SlurmError

    first = _bridge(controller, tmp_path)
    first.launch("sn1", _launch())
    (slurm_id,) = controller.submitted
    controller.set(slurm_id, state="RUNNING", nodes="sn1", start_time=1)
    answers = iter([SlurmError("slurm_load_jobs error: Unable to contact slurm controller")] * 2)
    real_jobs = controller.jobs

    def jobs():
        error = next(answers, None)
        if error is not None:
            raise error
        return real_jobs()

    controller.jobs = jobs
    slept = []
    second = SlurmExecutor(
        client=controller, work_dir=tmp_path, refresh_seconds=0, sleep=slept.append
    )
    second.start()
    # Only once the controller answered: the running job is listed, not lost.
    assert slept == [1.0, 1.0]
    assert [s["running"] for s in second.job_summaries("sn1")] == [True]


def test_a_restarted_bridge_reports_how_a_job_ended_while_no_bridge_watched(controller, tmp_path):
    first = _bridge(controller, tmp_path)
    first.launch("sn1", _launch())
    (slurm_id,) = controller.submitted
    controller.run_to(slurm_id, "FAILED", 2 << 8)
    second = _bridge(controller, tmp_path)  # nobody asks it about the job
    events = list(second.poll())
    (exited,) = _exits(events)
    assert (exited.job_id, exited.attempt, exited.exit_code) == (7, 0, 2)
    assert controller.submitted == [slurm_id]
    summary = {(s["job_id"], s["attempt"]): s for s in second.job_summaries("sn1")}[(7, 0)]
    assert summary["running"] is False and summary["exit_code"] == 2


def test_a_job_cancelled_in_slurm_whose_shell_reports_128_plus_the_signal(controller, tmp_path):
    executor = _bridge(controller, tmp_path)
    executor.launch("sn1", _launch())
    _, exited = _ended_once(controller, executor, exit_status=143 << 8, state="CANCELLED")
    assert exited.exit_code is None and exited.signal == signal.SIGTERM
    assert "not by Sluice" in exited.message


def test_a_job_that_exits_143_by_itself_keeps_its_exit_code(controller, tmp_path):
    executor = _bridge(controller, tmp_path)
    executor.launch("sn1", _launch())
    _, exited = _ended_once(controller, executor, exit_status=143 << 8, state="FAILED")
    assert exited.exit_code == 143 and exited.signal is None
