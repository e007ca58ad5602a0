"""Time-sharing inside a class (a queue's opt-in): least attained service in levels,
stops of more-attained checkpointing jobs for waiting ones, within the churn bounds."""

import dataclasses

from engine_builders import NOW, gpu_ids, job, node, quota, run_plan, running, snapshot

from scheduling.engine import reasons
from scheduling.engine.planner import Planner

LEVELS = {
    "time_sharing_levels": (3600.0, 36000.0),
    "time_sharing_promotion_seconds": 7200.0,
    "time_sharing_min_wait_seconds": 0.0,
}
HOUR = 3600.0


def sharing_job(job_id, attained=0.0, gpus=8, **kwargs):
    waiting = job(job_id, gpus=gpus, **kwargs)
    waiting.time_sharing = True
    waiting.attained_gpu_seconds = attained
    waiting.queued_at = NOW - 600
    return waiting


def sharing_running(job_id, attained=0.0, age=2 * HOUR, **kwargs):
    run = running(job_id, "a", gpu_ids(1, *range(8)), age=age, runtime=86400, **kwargs)
    run.time_sharing = True
    run.attained_gpu_seconds = attained
    return run


def contended(waiting, run, **flags):
    """One 8-GPU node held by ``run``, ``waiting`` for it (tenant a guaranteed 8)."""
    return snapshot([node(1)], [quota("a", 8)], [waiting], [run], **{**LEVELS, **flags})


def test_a_waiting_job_stops_a_more_attained_one_of_its_class():
    # Levels from 1 and 10 GPU-hours: the running job has used 8 GPUs x 2 h = 16 GPU-hours
    # (level 2), the waiting one none (level 0).
    result = run_plan(contended(sharing_job(1), sharing_running(50)))
    assert [(p.victim_id, p.preemptor_id) for p in result.preemptions] == [(50, 1)]
    stop = result.preemptions[0]
    assert stop.reason == reasons.PREEMPT_TIME_SHARING
    assert stop.message.startswith("stopped for time-sharing: job 1 of class normal")
    assert "16.0 GPU-hours" in stop.message
    assert result.pending[1].code == reasons.WAITING_FOR_PREEMPTION


def test_earlier_runs_count_towards_the_attained_service():
    # 5 minutes on 8 GPUs (0.7 GPU-hours) is level 0, like the waiting job; with 2
    # GPU-hours of earlier runs it is level 1.
    young = sharing_running(50, age=300)
    assert run_plan(contended(sharing_job(1), young)).preemptions == []
    older = dataclasses.replace(young, attained_gpu_seconds=2 * HOUR)
    assert [p.victim_id for p in run_plan(contended(sharing_job(1), older)).preemptions] == [50]


def test_no_stop_for_a_job_of_the_same_level():
    # Both in level 2: the waiting one has used 12 GPU-hours in earlier runs.
    result = run_plan(contended(sharing_job(1, attained=12 * HOUR), sharing_running(50)))
    assert result.preemptions == []
    assert result.pending[1].code == reasons.WAITING_FOR_QUOTA


def test_only_jobs_of_the_same_class_that_time_share_and_checkpoint():
    other_class = sharing_running(50, cls="low")
    other_class.priority_class = "low"
    # A lower class is not stopped by time-sharing (normal may not preempt by class).
    assert run_plan(contended(sharing_job(1), other_class)).preemptions == []
    not_sharing = dataclasses.replace(sharing_running(50), time_sharing=False)
    assert run_plan(contended(sharing_job(1), not_sharing)).preemptions == []
    not_preemptible = sharing_running(50, preemptible=False)
    assert run_plan(contended(sharing_job(1), not_preemptible)).preemptions == []
    waiting_not_sharing = dataclasses.replace(sharing_job(1), time_sharing=False)
    assert run_plan(contended(waiting_not_sharing, sharing_running(50))).preemptions == []


def test_never_a_guaranteed_job_of_another_tenant():
    theirs = dataclasses.replace(sharing_running(50), tenant="b")
    snap = snapshot([node(1)], [quota("a", 8), quota("b", 8)], [sharing_job(1)], [theirs], **LEVELS)
    assert run_plan(snap).preemptions == []
    borrowing = dataclasses.replace(theirs, borrowed=True)
    snap.running = [borrowing]
    # Its GPUs are borrowed: reclaimed for a tenant inside its guarantee, as always.
    assert [p.reason for p in run_plan(snap).preemptions] == [reasons.PREEMPT_RECLAIM]


def test_the_minimum_run_between_stops_is_respected():
    fresh = sharing_running(50, attained=20 * HOUR, age=200, min_runtime=300)
    assert run_plan(contended(sharing_job(1), fresh)).preemptions == []
    seasoned = sharing_running(50, attained=20 * HOUR, age=400, min_runtime=300)
    assert [p.victim_id for p in run_plan(contended(sharing_job(1), seasoned)).preemptions] == [50]


def test_a_job_at_its_stop_limit_runs_on():
    at_limit = dataclasses.replace(sharing_running(50), preemptions=3, max_preemptions=3)
    assert run_plan(contended(sharing_job(1), at_limit)).preemptions == []
    below = dataclasses.replace(at_limit, preemptions=2)
    assert [p.victim_id for p in run_plan(contended(sharing_job(1), below)).preemptions] == [50]


def test_a_job_that_waited_long_is_promoted_to_the_first_level():
    # The waiting job has used 20 GPU-hours (level 2), the running one 16 + 12 (level 2).
    waiting = sharing_job(1, attained=20 * HOUR)
    run = sharing_running(50, attained=12 * HOUR)
    assert run_plan(contended(waiting, run)).preemptions == []
    waiting.queued_at = NOW - 3 * HOUR  # past the 2 h promotion
    assert [p.victim_id for p in run_plan(contended(waiting, run)).preemptions] == [50]


def test_a_job_stops_nobody_before_its_minimum_wait():
    waiting = sharing_job(1)  # entered the queue 10 minutes ago
    patient = contended(waiting, sharing_running(50), time_sharing_min_wait_seconds=900.0)
    result = run_plan(patient)
    assert result.preemptions == []
    waiting.queued_at = NOW - 1000
    assert [p.victim_id for p in run_plan(patient).preemptions] == [50]


def test_off_by_default():
    # Everything as in the first test, but no job takes part: no stop at all.
    waiting = dataclasses.replace(sharing_job(1), time_sharing=False)
    run = dataclasses.replace(sharing_running(50), time_sharing=False)
    assert run_plan(contended(waiting, run)).preemptions == []
    assert run_plan(snapshot([node(1)], [quota("a", 8)], [waiting], [run])).preemptions == []


def test_least_attained_first_inside_a_class():
    # Four waiting jobs of one class: the one that used most goes last, whatever its size
    # and submit time; a job of a higher class still goes first; jobs that do not
    # time-share are in the first level.
    most = sharing_job(1, attained=50 * HOUR, gpus=1)
    some = sharing_job(2, attained=2 * HOUR, gpus=1)
    none = sharing_job(3, attained=0.0, gpus=8)
    plain = job(4, gpus=8)
    high = sharing_job(5, attained=80 * HOUR, gpus=1, cls="high")
    snap = snapshot([node(1)], [quota("a", 8)], [most, some, none, plain, high], **LEVELS)
    order = [waiting.id for waiting in Planner(snap).order()]
    assert order.index(5) == 0
    assert order.index(3) < order.index(2) < order.index(1)
    assert order.index(4) < order.index(2)
    # Without time-sharing, the smallest (size order) go first instead.
    for waiting in snap.pending:
        waiting.time_sharing = False
    order = [waiting.id for waiting in Planner(snap).order()]
    assert order.index(1) < order.index(3)


def test_a_promoted_job_goes_back_to_the_first_level():
    most = sharing_job(1, attained=50 * HOUR, gpus=1)
    none = sharing_job(2, attained=0.0, gpus=8)
    snap = snapshot([node(1)], [quota("a", 8)], [most, none], **LEVELS)
    assert [waiting.id for waiting in Planner(snap).order()] == [2, 1]
    most.queued_at = NOW - 3 * HOUR
    assert [waiting.id for waiting in Planner(snap).order()] == [1, 2]
