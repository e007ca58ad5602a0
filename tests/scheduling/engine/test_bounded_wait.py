"""A bound on every wait: the reservation of a job past its maximum wait is held against
backfill that would delay it and against later jobs of every class that may not
preempt (DESIGN.md §6; scheduling/engine/reservations.py)."""

import dataclasses

import pytest
from engine_builders import (
    NOW,
    check_plan,
    gpu_ids,
    handed_back,
    job,
    node,
    quota,
    run_plan,
    running,
)
from engine_builders import snapshot as make_snapshot

from scheduling.engine import reasons

DAY = 86400.0


def _overdue_job_reserved(overdue: bool = True):
    """One 8-GPU node, 6 GPUs busy until NOW + 600; job 1 (tenant a, 8 GPUs) waits, past
    its maximum wait (12 h) or not, and reserves the node from NOW + 600."""
    nodes = [node(1, gpus=8)]
    quotas = [quota("a", 8), quota("b", 8), quota("c", 8), quota("d", 8)]
    run = [running(10, "c", gpu_ids(1, 0, 1, 2, 3, 4, 5), age=3000, runtime=3600)]
    submitted = NOW - 3 * DAY if overdue else NOW - 60
    big = job(1, "a", gpus=8, runtime=7200, submitted=submitted)
    usage = {"a": 500_000.0, "b": 0.0, "c": 0.0, "d": 0.0}
    first = run_plan(make_snapshot(nodes, quotas, [big], run, usage=usage))
    return nodes, quotas, run, usage, big, first


def _next_cycle(later, overdue: bool = True):
    nodes, quotas, run, usage, big, first = _overdue_job_reserved(overdue)
    pending = [*handed_back([big], first), *later]
    snap = make_snapshot(nodes, quotas, pending, run, usage=usage, now=NOW + 5)
    result = run_plan(snap)
    check_plan(snap, result)
    return first, result


def test_an_overdue_job_that_reserves_gets_a_guaranteed_start_equal_to_its_estimate():
    *_, first = _overdue_job_reserved()
    info = first.pending[1]
    assert info.reserved_gpu_ids
    assert info.estimated_start == NOW + 600
    assert info.guaranteed_start == NOW + 600


def test_a_job_not_past_its_maximum_wait_gets_no_guaranteed_start():
    *_, first = _overdue_job_reserved(overdue=False)
    assert first.pending[1].estimated_start == NOW + 600
    assert first.pending[1].guaranteed_start is None


def test_a_later_smaller_job_ahead_by_fair_share_does_not_take_the_bounded_gpus():
    # Job 2 (tenant b, no usage) would be ahead of job 1 by fair share and fits the 2 idle
    # GPUs now, but would run past NOW + 600: the bounded job is considered first.
    small = job(2, "b", gpus=2, runtime=3600, submitted=NOW + 1)
    first, result = _next_cycle([small])
    assert result.pending[1].pool_position == 1
    assert result.pending[2].pool_position == 2
    assert result.placements == []
    assert result.pending[1].estimated_start == NOW + 600
    assert result.pending[1].guaranteed_start == NOW + 600
    assert result.pending[1].reserved_gpu_ids == first.pending[1].reserved_gpu_ids
    assert result.pending[2].estimated_start >= NOW + 600 + 7200


def test_without_the_bound_the_same_job_takes_the_gpus():
    # The same cycle with job 1 inside its maximum wait: its hold stands only for the jobs
    # that were behind it, and job 2 (new, ahead by fair share) starts on the idle GPUs.
    small = job(2, "b", gpus=2, runtime=3600, submitted=NOW + 1)
    _, result = _next_cycle([small], overdue=False)
    assert [p.job_id for p in result.placements] == [2]
    assert result.pending[1].guaranteed_start is None
    assert result.pending[1].estimated_start > NOW + 600


@pytest.mark.parametrize("cls", ["normal", "high"])
def test_a_later_job_of_a_class_that_may_not_preempt_waits_for_the_bound(cls):
    later = job(3, "d", gpus=2, cls=cls, can_preempt=False, runtime=3600, submitted=NOW + 2)
    first, result = _next_cycle([later])
    assert result.placements == []
    assert result.pending[1].guaranteed_start == NOW + 600
    assert result.pending[1].reserved_gpu_ids == first.pending[1].reserved_gpu_ids


def test_a_higher_class_that_may_preempt_still_takes_the_gpus():
    urgent = job(4, "d", gpus=2, cls="high", runtime=3600, submitted=NOW + 2)
    _, result = _next_cycle([urgent])
    assert [p.job_id for p in result.placements] == [4]
    # The bound does not cover it: job 1 gets a later start, and a new bound.
    assert result.pending[1].estimated_start > NOW + 600
    assert result.pending[1].guaranteed_start == result.pending[1].estimated_start


def test_backfill_that_ends_before_the_bound_still_runs():
    short = job(5, "b", gpus=2, runtime=300, submitted=NOW + 1)
    _, result = _next_cycle([short])
    assert [p.job_id for p in result.placements] == [5]
    assert result.pending[1].guaranteed_start == NOW + 600
    assert result.pending[1].code == reasons.WAITING_FOR_GPUS


def test_the_bounded_job_starts_on_its_gpus_at_its_bound():
    small = job(2, "b", gpus=2, runtime=3600, submitted=NOW + 1)
    nodes, quotas, run, usage, big, first = _overdue_job_reserved()
    pending = [*handed_back([big], first), small]
    second = run_plan(make_snapshot(nodes, quotas, pending, run, usage=usage, now=NOW + 5))
    pending = handed_back(pending, second)
    third = run_plan(make_snapshot(nodes, quotas, pending, [], usage=usage, now=NOW + 600))
    assert [p.job_id for p in third.placements] == [1]
    assert set(third.placements[0].gpu_ids) == set(first.pending[1].reserved_gpu_ids)


def test_an_overdue_job_waiting_for_its_tenants_quota_is_bounded_too():
    # Tenant a's guarantee (8) is held by its own job until NOW + 600; job 1 (8 GPUs, past
    # its maximum wait) waits for that quota and reserves it from then; a later small job
    # of the same tenant does not take the quota when it frees.
    nodes = [node(1, gpus=8), node(2, gpus=8)]
    quotas = [quota("a", 8)]
    run = [running(10, "a", gpu_ids(1, 0, 1, 2, 3, 4, 5, 6, 7), age=3000, runtime=3600)]
    big = job(1, "a", gpus=8, runtime=7200, submitted=NOW - 3 * DAY)
    first = run_plan(make_snapshot(nodes, quotas, [big], run))
    assert first.pending[1].code == reasons.WAITING_FOR_QUOTA
    assert first.pending[1].guaranteed_start == NOW + 600
    assert first.pending[1].reserved_gpu_ids

    small = job(2, "a", gpus=1, runtime=7200, submitted=NOW + 1)
    pending = [*handed_back([big], first), small]
    second = run_plan(make_snapshot(nodes, quotas, pending, run, now=NOW + 5))
    assert second.pending[1].guaranteed_start == NOW + 600
    pending = handed_back(pending, second)
    third = run_plan(make_snapshot(nodes, quotas, pending, [], now=NOW + 600))
    assert [p.job_id for p in third.placements] == [1]


def _shared_gpu_cycle():
    """Job 5 (8 GPUs, past its maximum wait) reserved node 1 from NOW + 890, GPU 107 right
    after job 1 (two nodes, not past its maximum wait), which reserved it with GPU 200 for
    NOW + 590 to NOW + 890; job 6 (past its maximum wait, one GPU for 900 s) reserved GPU
    300 from NOW + 590. Every GPU is busy until NOW + 590 but GPU 107, idle now."""
    nodes = [node(1, gpus=8), node(2, gpus=1), node(3, gpus=1)]
    quotas = [quota("a", 16), quota("b", 16)]
    run = [
        running(10, "b", gpu_ids(1, 0, 1, 2, 3, 4, 5, 6), age=10, runtime=600),
        running(11, "b", gpu_ids(2, 0), age=10, runtime=600),
        running(12, "b", gpu_ids(3, 0), age=10, runtime=600),
    ]
    gang = job(1, "a", gpus=1, nodes=2, runtime=300, submitted=NOW)
    big = job(5, "a", gpus=8, cls="low", runtime=300, submitted=NOW - 3000)
    small = job(6, "a", gpus=1, cls="low", runtime=900, submitted=NOW - 3000)
    pending = [
        dataclasses.replace(
            gang, reserved_gpu_ids=(107, 200), reserved_start=NOW + 590, previous_position=1
        ),
        dataclasses.replace(
            big,
            reserved_gpu_ids=gpu_ids(1, *range(8)),
            reserved_start=NOW + 890,
            previous_position=2,
        ),
        dataclasses.replace(
            small, reserved_gpu_ids=(300,), reserved_start=NOW + 590, previous_position=3
        ),
    ]
    snap = make_snapshot(nodes, quotas, pending, run, max_wait_seconds=900.0)
    result = run_plan(snap)
    check_plan(snap, result)
    return result


def test_a_bounded_gpu_reserved_first_for_an_earlier_job_is_held_for_the_bounded_job():
    # GPU 107 is held for job 5 from the cycle's start although job 1 reserved it first:
    # job 6, considered before job 5 (its bound is earlier), does not start there for
    # 900 s, past job 5's bound (it would then start at NOW + 1200).
    result = _shared_gpu_cycle()
    for placement in result.placements:
        assert 107 not in placement.gpu_ids, placement
    assert result.pending[5].guaranteed_start <= NOW + 890  # it may only move earlier
    assert set(result.pending[5].reserved_gpu_ids) == set(gpu_ids(1, *range(8)))
    assert result.pending[6].guaranteed_start == NOW + 590


def test_a_bounded_gpu_shared_with_an_earlier_bounded_reservation_is_held_after_it():
    # Jobs 1, 2 and 3 are past their maximum wait. Job 1 (2 GPUs on one node) reserved
    # GPUs 106-107 from NOW + 590, job 3 (8 GPUs) node 1 from NOW + 890, right after it;
    # job 2 (one GPU for 900 s) GPU 400 from NOW + 700. Job 1 starts now on node 3
    # instead: GPU 107, idle now, is then held for job 3, and job 2, considered between
    # them, does not start there to run past job 3's bound.
    nodes = [node(1, gpus=8), node(3, gpus=2), node(4, gpus=1)]
    run = [
        running(10, "b", gpu_ids(1, 0, 1, 2, 3, 4, 5), age=10, runtime=900),
        running(11, "b", gpu_ids(1, 6), age=10, runtime=600),
        running(12, "b", gpu_ids(4, 0), age=10, runtime=710),
    ]
    first = job(1, "a", gpus=2, cls="low", runtime=300, submitted=NOW - 3000)
    between = job(2, "a", gpus=1, cls="low", runtime=900, submitted=NOW - 3000)
    big = job(3, "a", gpus=8, cls="low", runtime=300, submitted=NOW - 3000)
    pending = [
        dataclasses.replace(first, reserved_gpu_ids=gpu_ids(1, 6, 7), reserved_start=NOW + 590),
        dataclasses.replace(between, reserved_gpu_ids=gpu_ids(4, 0), reserved_start=NOW + 700),
        dataclasses.replace(big, reserved_gpu_ids=gpu_ids(1, *range(8)), reserved_start=NOW + 890),
    ]
    snap = make_snapshot(
        nodes, [quota("a", 16), quota("b", 16)], pending, run, max_wait_seconds=900.0
    )
    result = run_plan(snap)
    check_plan(snap, result)
    assert {p.job_id: p.gpu_ids for p in result.placements} == {1: gpu_ids(3, 0, 1)}
    assert result.pending[2].guaranteed_start == NOW + 700
    assert result.pending[3].guaranteed_start == NOW + 890
    assert set(result.pending[3].reserved_gpu_ids) == set(gpu_ids(1, *range(8)))


def test_a_gpu_in_three_bounded_reservations_is_held_for_each_in_turn():
    # GPU 103 is in the reservations of jobs 3 (now), 5 (all four GPUs, NOW + 300) and 6
    # (NOW + 600), all past their maximum wait: held for job 6 only once job 5 has been
    # considered, it does not cost job 5 its reservation.
    nodes = [node(1, gpus=4)]
    run = [running(10, "a", gpu_ids(1, 0, 1), age=310, runtime=600)]
    now_job = job(3, "a", gpus=1, cls="low", runtime=300, submitted=NOW - 3000)
    whole = job(5, "a", gpus=4, cls="low", runtime=300, submitted=NOW - 3000)
    last = job(6, "b", gpus=1, cls="low", runtime=300, submitted=NOW - 3000)
    other = job(4, "a", gpus=1, cls="low", runtime=300, submitted=NOW - 3000)
    pending = [
        dataclasses.replace(now_job, reserved_gpu_ids=gpu_ids(1, 3), reserved_start=NOW),
        dataclasses.replace(
            whole, reserved_gpu_ids=gpu_ids(1, 2, 0, 1, 3), reserved_start=NOW + 300
        ),
        dataclasses.replace(last, reserved_gpu_ids=gpu_ids(1, 3), reserved_start=NOW + 600),
        dataclasses.replace(other, reserved_gpu_ids=gpu_ids(1, 2), reserved_start=NOW + 600),
    ]
    snap = make_snapshot(
        nodes, [quota("a", 4), quota("b", 4)], pending, run, max_wait_seconds=300.0
    )
    result = run_plan(snap)
    check_plan(snap, result)
    assert result.pending[5].guaranteed_start == NOW + 300
    assert set(result.pending[5].reserved_gpu_ids) == set(gpu_ids(1, 0, 1, 2, 3))
    for placement in result.placements:  # nothing started now runs past NOW + 300
        assert placement.job_id in (3, 4), placement
