"""Reservations handed back from one cycle to the next, positions and messages."""

import dataclasses

from engine_builders import NOW, gpu_ids, handed_back, job, node, quota, run_plan, running, snapshot

from scheduling.engine import QueueInfo, reasons


def test_a_blocked_job_reports_the_gpus_reserved_for_it():
    snap = snapshot(
        [node(1)],
        [quota("a", 8), quota("b", 8)],
        [job(1, "a", gpus=8)],
        [running(10, "b", gpu_ids(1, 0, 1), age=0, runtime=600)],
    )
    info = run_plan(snap).pending[1]
    assert info.code == reasons.WAITING_FOR_GPUS
    assert sorted(info.reserved_gpu_ids) == list(gpu_ids(1, *range(8)))
    assert info.estimated_start == NOW + 600


def _two_nodes_one_ending_early():
    nodes = [node(1, gpus=4), node(2, gpus=4)]
    quotas = [quota("a", 16), quota("b", 16)]
    run = [
        running(10, "b", gpu_ids(1, 0, 1, 2, 3), age=0, runtime=600),
        running(11, "b", gpu_ids(2, 0, 1, 2, 3), age=0, runtime=600),
    ]
    pending = [job(2, "a", gpus=4, runtime=3600, submitted=NOW - 10)]
    first = run_plan(snapshot(nodes, quotas, pending, run))
    kept = first.pending[2].reserved_gpu_ids
    assert len(kept) == 4 and first.pending[2].estimated_start == NOW + 600
    # Next cycle: the job on job 2's node ended early.
    mine = kept[0] // 100
    run = [r for r in run if r.gpu_ids[0] // 100 != mine]
    return nodes, quotas, run, handed_back(pending, first), kept


def test_a_new_job_ahead_takes_a_held_reservation_it_can_start_on_now():
    # An older job of the same class and size arrives: it is ahead of job 2 in the order
    # and fits on job 2's node now. Job 2's hold, made when it was alone, must not make
    # it wait: it starts, and job 2 waits for the other node.
    nodes, quotas, run, pending, kept = _two_nodes_one_ending_early()
    pending = [*pending, job(1, "a", gpus=4, runtime=3600)]
    second = run_plan(snapshot(nodes, quotas, pending, run, now=NOW + 60))
    assert [(p.job_id, p.gpu_ids) for p in second.placements] == [(1, kept)]
    assert second.pending[2].pool_position == 1
    assert second.pending[2].estimated_start == NOW + 600
    assert second.pending[2].code == reasons.WAITING_FOR_GPUS


def test_a_new_job_ahead_that_can_start_elsewhere_leaves_a_held_reservation_alone():
    nodes, quotas, run, pending, kept = _two_nodes_one_ending_early()
    nodes = [*nodes, node(3, gpus=4)]  # idle: job 1 starts there, keeping costs it nothing
    pending = [*pending, job(1, "a", gpus=4, runtime=3600)]
    second = run_plan(snapshot(nodes, quotas, pending, run, now=NOW + 60))
    placed = {p.job_id: p.gpu_ids for p in second.placements}
    assert placed == {1: gpu_ids(3, 0, 1, 2, 3), 2: kept}


def test_a_kept_reservation_starts_on_its_own_gpus():
    nodes = [node(1, gpus=4), node(2, gpus=4)]
    quotas = [quota("a", 16)]
    pending = [
        dataclasses.replace(
            job(1, "a", gpus=2), reserved_gpu_ids=gpu_ids(2, 2, 3), reserved_start=NOW + 100
        )
    ]
    result = run_plan(snapshot(nodes, quotas, pending))
    # Best fit alone would pick node 1 (same free count, lower id); the reservation wins.
    assert result.placements[0].gpu_ids == gpu_ids(2, 2, 3)


def test_a_higher_class_may_take_a_kept_reservation():
    nodes = [node(1, gpus=4)]
    quotas = [quota("a", 16)]
    pending = [
        dataclasses.replace(
            job(1, "a", gpus=4, cls="low"),
            reserved_gpu_ids=gpu_ids(1, 0, 1, 2, 3),
            reserved_start=NOW + 100,
        ),
        job(2, "a", gpus=4, cls="normal", runtime=3600),
    ]
    result = run_plan(snapshot(nodes, quotas, pending))
    assert [p.job_id for p in result.placements] == [2]
    assert result.pending[1].estimated_start == NOW + 3600


def test_a_reservation_that_no_longer_holds_is_planned_afresh():
    nodes = [node(1, gpus=4), node(2, gpus=4)]
    quotas = [quota("a", 16), quota("b", 16)]
    run = [
        running(10, "b", gpu_ids(1, 0, 1, 2, 3), age=0, runtime=7200),
        running(11, "b", gpu_ids(2, 0, 1, 2, 3), age=0, runtime=600),
    ]
    stale = dataclasses.replace(
        job(1, "a", gpus=4), reserved_gpu_ids=gpu_ids(1, 0, 1, 2, 3), reserved_start=NOW + 60
    )
    info = run_plan(snapshot(nodes, quotas, [stale], run)).pending[1]
    assert info.estimated_start == NOW + 600
    assert info.reserved_gpu_ids == gpu_ids(2, 0, 1, 2, 3)


def test_positions_count_waiting_jobs_per_queue_and_pool_in_order():
    queues = [QueueInfo(1, "q1", "a"), QueueInfo(3, "q3", "a", open=False)]
    pending = [
        job(1, "a", gpus=8, cls="high"),
        job(2, "a", gpus=8, queue=3),
        job(3, "a", gpus=8, pool="other"),
        job(4, "a", gpus=8, cls="low"),
        job(5, "a", gpus=1),
    ]
    snap = snapshot([node(1)], [quota("a", 8, 8)], pending, [], queues=queues, size_order=False)
    result = run_plan(snap)
    assert [p.job_id for p in result.placements] == [1]
    positions = {i: (p.queue_position, p.pool_position) for i, p in result.pending.items()}
    # Order: 1 (high, placed), then the normal class 2, 3, 5, then 4 (low).
    assert positions == {2: (1, 1), 3: (1, 1), 5: (2, 2), 4: (3, 3)}
    assert result.pending[2].code == reasons.QUEUE_CLOSED


def test_quota_message_carries_the_numbers():
    result = run_plan(
        snapshot(
            [node(1)],
            [quota("nlp", 4, 2, model="H100")],
            [job(1, "nlp", gpus=2, models=("H100",))],
            [running(10, "nlp", gpu_ids(1, 0, 1, 2, 3, 4, 5))],
        )
    )
    info = result.pending[1]
    assert info.code == reasons.WAITING_FOR_QUOTA
    assert info.message == (
        "nlp uses 6/4 guaranteed H100 in pool training; borrowing allowed 2, idle 2; job needs 2"
    )


def test_the_fast_pending_info_constructor_builds_the_same_object():
    from scheduling.engine.explaining import _pending_info
    from scheduling.engine.results import PendingInfo

    values = (7, reasons.WAITING_FOR_GPUS, "waits", 2, 3, 900.0, (1, 2), (), 900.0)
    assert _pending_info(*values) == PendingInfo(*values)
    assert _pending_info(*values).guaranteed_start == 900.0


def test_a_later_jobs_old_reservation_does_not_block_the_first_job():
    # Job 2's reservation of the last cycle holds node 1 from NOW + 600; job 1 is new and
    # ahead of it. Without backfill nothing may start before the pool's first blocked job;
    # with backfill the hold stands only where it costs the jobs ahead nothing: job 1
    # fits now, so it starts either way.
    later = dataclasses.replace(
        job(2, "a", gpus=8),
        reserved_gpu_ids=gpu_ids(1, *range(8)),
        reserved_start=NOW + 600,
        previous_position=1,
    )
    pending = [job(1, "a", gpus=8, submitted=NOW - 5000), later]
    for backfill in (True, False):
        result = run_plan(snapshot([node(1)], [quota("a", 16)], pending, backfill=backfill))
        assert [p.job_id for p in result.placements] == [1], backfill
        assert result.pending[2].pool_position == 1


def test_a_reservation_held_and_given_back_leaves_an_earlier_promise_on_its_gpu():
    """GPU 0 is promised to job 1 (high but not preempting, training) from the end of
    the borrowed inference job 10 on it (training never preempts inference). Job 2 (low, inference,
    inside its tenant's guarantee) held GPU 0 from a reservation of the last cycle,
    starting after job 1's: giving that hold back at job 2's turn must leave job 1's
    promise in place, so job 10 is no victim of job 2's reclaim (it used to be)."""
    nodes = [node(1, gpus=2)]
    quotas = [quota("a", 2), quota("b", 0, borrow=2), quota("c", 1)]
    run = [
        running(10, "b", gpu_ids(1, 0), borrowed=True, runtime=1600, workload="inference"),
        running(11, "a", gpu_ids(1, 1), runtime=100_000),
    ]
    # Job 10 ends at NOW + 1000; job 1 would run from then until NOW + 6000.
    pending = [
        job(1, "a", cls="high", can_preempt=False, runtime=5000),
        dataclasses.replace(
            job(2, "c", cls="low", workload="inference", runtime=3000),
            reserved_gpu_ids=gpu_ids(1, 0),
            reserved_start=NOW + 7000,
        ),
    ]
    result = run_plan(snapshot(nodes, quotas, pending, run))
    assert result.preemptions == []
    assert result.pending[1].reserved_gpu_ids == gpu_ids(1, 0)
    assert result.pending[1].estimated_start == NOW + 1000
    assert result.pending[2].estimated_start >= NOW + 6000
