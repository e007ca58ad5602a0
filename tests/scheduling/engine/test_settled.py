"""Decisions-only cycles: where a cycle stops, and that it decides as a full one."""

import dataclasses

from engine_builders import gpu_ids, job, node, quota, run_plan, running, snapshot

from scheduling.engine import plan


def _one_preemption_then_a_queue_that_can_do_nothing():
    """Tenant a's high job 1 preempts b's low job on the one node; then a's job 2 finds
    no victim left, and ten jobs of tenant c, which has no quota of its own and may not
    preempt, can do nothing at all."""
    quotas = [quota("a", 8), quota("b", 8), quota("c", 0, 8)]
    run = [running(10, "b", gpu_ids(1, *range(8)), "low", runtime=86400)]
    pending = [job(1, "a", gpus=8, cls="high"), job(2, "a", gpus=8, cls="high")]
    pending += [job(100 + n, "c", gpus=1) for n in range(10)]
    return snapshot([node(1)], quotas, pending, run)


def test_a_cycle_stops_once_the_room_it_remembered_is_taken():
    """Before job 1 the check finds room on node 1 for tenant a and remembers it; once
    job 1 has taken it, that memory must not keep the cycle going: neither for a's job 2
    (the victim is stopping) nor, after it, for c's jobs (a has none left)."""
    snap = _one_preemption_then_a_queue_that_can_do_nothing()
    full = run_plan(snap)
    fast = plan(dataclasses.replace(snap, decisions_only=True))
    assert [p.victim_id for p in full.preemptions] == [10]
    assert (fast.placements, fast.preemptions) == (full.placements, full.preemptions)
    assert fast.skipped == 11
    assert set(fast.pending) == {1}
    assert fast.pending[1] == full.pending[1]


def test_a_cycle_stops_once_the_victim_it_remembered_is_promised_to_another_job():
    """Before d's job the check finds room on node 1 for a's high job (b's low job) and
    remembers it; d's job, which may not preempt, then reserves the low job's GPUs for
    when it ends, which protects that job: a's job can stop nobody, and the cycle stops
    there (the node changed since the room was found)."""
    quotas = [quota("a", 8), quota("b", 8), quota("d", 8), quota("c", 0, 8)]
    run = [
        running(10, "b", gpu_ids(1, 0, 1, 2, 3), "low"),
        running(11, "b", gpu_ids(1, 4, 5, 6, 7), "normal", preemptible=False, runtime=86400),
    ]
    pending = [
        job(1, "d", gpus=4, cls="critical", can_preempt=False),
        job(2, "a", gpus=4, cls="high"),
    ]
    pending += [job(100 + n, "c", gpus=1) for n in range(10)]
    snap = snapshot([node(1)], quotas, pending, run)
    full = run_plan(snap)
    fast = plan(dataclasses.replace(snap, decisions_only=True))
    assert full.preemptions == [] and full.placements == []
    assert full.pending[1].reserved_gpu_ids == gpu_ids(1, 0, 1, 2, 3)
    assert (fast.placements, fast.preemptions) == ([], [])
    assert fast.skipped == 11
    assert fast.pending[1] == full.pending[1]


def test_a_job_that_may_preempt_its_own_jobs_first_may_then_reclaim():
    """Tenant b holds one GPU over its guarantee for its 8-GPU job, which may preempt: it
    stops its own low job to get back inside its guarantee and reclaims the GPUs tenant
    a borrowed. The check must not call the cycle settled before it (it once did: b
    was not inside its guarantee before stopping its own job)."""
    quotas = [quota("a", 0, 8), quota("b", 8), quota("c", 0, 8)]
    run = [
        running(10, "a", gpu_ids(1, 0, 1, 2), "low", preemptible=False, borrowed=True),
        running(11, "a", gpu_ids(1, 3, 4, 5, 6), "low", preemptible=False, borrowed=True),
        running(12, "b", gpu_ids(1, 7), "low"),
    ]
    pending = [job(1, "b", gpus=8, preemptible=False, can_preempt=True)]
    pending += [job(100 + n, "c", gpus=1) for n in range(10)]
    snap = snapshot([node(1)], quotas, pending, run)
    full = run_plan(snap)
    fast = plan(dataclasses.replace(snap, decisions_only=True))
    assert sorted(p.victim_id for p in full.preemptions) == [10, 11, 12]
    assert (fast.placements, fast.preemptions) == (full.placements, full.preemptions)


def _a_blocked_pool_without_backfill(grace: int):
    """Two nodes without backfill: b's job holds node 1 for another hour, c's low job
    (its grace ``grace``) node 2 for a day, neither borrowed. Tenant d's high job 1 (the
    shortest of its class: first) may stop nobody: it waits for node 1. Behind it, a's
    high jobs could stop c's low job, and c's one-GPU jobs wait behind them."""
    quotas = [quota("a", 8), quota("b", 8), quota("c", 8), quota("d", 8)]
    run = [
        running(10, "b", gpu_ids(1, *range(8)), preemptible=False, runtime=4200),
        running(11, "c", gpu_ids(2, *range(8)), "low", runtime=86400, grace=grace),
    ]
    pending = [job(1, "d", gpus=8, cls="high", can_preempt=False)]
    pending += [job(2 + n, "a", gpus=8, cls="high", runtime=7200) for n in range(3)]
    pending += [job(100 + n, "c", gpus=1) for n in range(10)]
    return snapshot([node(1), node(2)], quotas, pending, run, backfill=False)


def test_without_backfill_a_cycle_stops_once_the_blocked_job_starts_after_any_stop():
    """Job 1 waits an hour for node 1: nothing behind it starts before then, and a stop
    now (30 s of grace) is over long before, so the high jobs behind it stop nobody. The
    cycle stops after job 1, and only job 1 hands on a reservation."""
    snap = _a_blocked_pool_without_backfill(grace=30)
    full = run_plan(snap)
    fast = plan(dataclasses.replace(snap, decisions_only=True))
    assert (full.placements, full.preemptions) == ([], [])
    assert (fast.placements, fast.preemptions) == ([], [])
    assert set(fast.pending) == {1}
    assert fast.skipped == 13
    assert fast.pending[1] == full.pending[1]
    assert [job_id for job_id, info in full.pending.items() if info.reserved_gpu_ids] == [1]


def test_without_backfill_a_cycle_goes_on_while_a_stop_could_outlast_the_floor():
    """The same, but c's job takes 90 minutes to stop: a high job behind job 1 may stop
    it now for node 2, which it gets after the floor but before job 1 gives node 1 back,
    so the cycle goes on to it."""
    snap = _a_blocked_pool_without_backfill(grace=5400)
    full = run_plan(snap)
    fast = plan(dataclasses.replace(snap, decisions_only=True))
    assert [p.victim_id for p in full.preemptions] == [11]
    assert (fast.placements, fast.preemptions) == (full.placements, full.preemptions)
    assert fast.skipped < 13
