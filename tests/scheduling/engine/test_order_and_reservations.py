"""Reservations follow the current order: position, estimate and start
agree, while estimates stay upper bounds as long as the order does not change."""

import dataclasses
import random

import pytest
from engine_builders import NOW, gpu_ids, handed_back, job, node, quota, run_plan, running, snapshot

from scheduling.engine import RunningJob, reasons
from scheduling.engine.order import SizeOrder


def _four_gpu_pool():
    nodes = [node(1, gpus=4)]
    quotas = [quota("a", 4, 4), quota("b", 4, 4), quota("c", 4)]
    run = [running(10, "c", gpu_ids(1, 0, 1, 2, 3), age=0, runtime=600)]
    return nodes, quotas, run


def test_a_job_that_overtakes_gets_the_earlier_estimate_and_starts_first():
    """The report: A's job 204 waits alone and reserves the pool; B's job 205 arrives
    3 s later with less usage, so it is ahead. 205 must be shown at position 1 with the
    earlier estimate, and start first."""
    nodes, quotas, run = _four_gpu_pool()
    a = job(204, "a", gpus=4, runtime=3600, submitted=NOW)
    first = run_plan(snapshot(nodes, quotas, [a], run, usage={"a": 5000.0}, now=NOW))
    assert first.pending[204].estimated_start == NOW + 600

    b = job(205, "b", gpus=4, runtime=3600, submitted=NOW + 3)
    pending = [*handed_back([a], first), b]
    usage = {"a": 5000.0, "b": 0.0}
    second = run_plan(snapshot(nodes, quotas, pending, run, usage=usage, now=NOW + 3))
    assert second.pending[205].pool_position == 1
    assert second.pending[204].pool_position == 2
    assert second.pending[205].estimated_start == NOW + 600
    assert second.pending[204].estimated_start == NOW + 600 + 3600
    assert "204" not in second.pending[205].message

    # The GPUs free up: 205 starts, 204 waits for it.
    pending = handed_back(pending, second)
    third = run_plan(snapshot(nodes, quotas, pending, [], usage=usage, now=NOW + 600))
    assert [p.job_id for p in third.placements] == [205]
    assert third.pending[204].estimated_start == NOW + 600 + 3600
    assert "205" in third.pending[204].message or third.pending[204].code != (
        reasons.RESERVED_FOR_HIGHER_PRIORITY
    )


def test_a_job_overtaken_by_fair_share_drift_loses_its_reservation():
    """Both jobs waited last cycle, 204 ahead; now B's share has fallen below A's: 205 is
    ahead and its reservation, made behind 204, moves before 204's."""
    nodes, quotas, run = _four_gpu_pool()
    a = job(204, "a", gpus=4, runtime=3600, submitted=NOW)
    b = job(205, "b", gpus=4, runtime=3600, submitted=NOW + 3)
    before = {"a": 0.0, "b": 5000.0}
    first = run_plan(snapshot(nodes, quotas, [a, b], run, usage=before, now=NOW + 3))
    assert first.pending[204].pool_position == 1
    assert first.pending[205].estimated_start == NOW + 600 + 3600

    after = {"a": 9000.0, "b": 5000.0}
    pending = handed_back([a, b], first)
    second = run_plan(snapshot(nodes, quotas, pending, run, usage=after, now=NOW + 10))
    assert second.pending[205].pool_position == 1
    assert second.pending[205].estimated_start == NOW + 600
    assert second.pending[204].estimated_start == NOW + 600 + 3600


def test_a_hold_made_behind_a_job_does_not_move_that_jobs_reservation():
    """The order did not change: job 1 keeps its reservation and job 2 (behind it,
    reserved in the hole before it) keeps its own, cycle after cycle."""
    nodes = [node(1, gpus=4)]
    run = [running(10, "a", gpu_ids(1, 0, 1), age=0, runtime=600)]
    pending = [job(1, "a", gpus=4, runtime=3600), job(2, "a", gpus=2, runtime=7200)]
    snap = snapshot(nodes, [quota("a", 8)], pending, run, size_order=False)
    first = run_plan(snap)
    second = run_plan(dataclasses.replace(snap, pending=handed_back(pending, first), now=NOW + 5))
    for job_id in (1, 2):
        assert second.pending[job_id].estimated_start == first.pending[job_id].estimated_start
        assert second.pending[job_id].reserved_gpu_ids == first.pending[job_id].reserved_gpu_ids


# -- the property ---------------------------------------------------------------------------


def _as_running(pending_job, placement, now) -> RunningJob:
    return RunningJob(
        id=pending_job.id,
        tenant=pending_job.tenant,
        pool=pending_job.pool,
        workload_type=pending_job.workload_type,
        priority=pending_job.priority,
        priority_class=pending_job.priority_class,
        preemptible=pending_job.preemptible,
        gpu_ids=placement.gpu_ids,
        gpu_model=placement.gpu_model,
        borrowed=placement.borrowed,
        started_at=now,
        max_runtime_seconds=pending_job.max_runtime_seconds,
    )


def _random_two_cycles(seed: int, topology: bool = False):
    """A one-tenant pool of three 4-GPU nodes: cycle 1 plans a backlog; before cycle 2
    running jobs end early and new jobs arrive (some smaller, so ahead of held owners).
    ``topology``: nodes 1 and 2 are a block, node 3 another, and some jobs need two nodes
    and may wait for one block."""
    rng = random.Random(seed)
    blocks = {1: "b1", 2: "b1", 3: "b2"} if topology else {}
    nodes = [node(i, gpus=4, block=blocks.get(i, "")) for i in range(1, 4)]
    shapes = [1, 1, 2, 2, 3, 4]
    make = _gang_or_not(rng) if topology else job
    runtimes = [300, 900, 1800, 3600, 7200]
    run = [
        running(90 + n, "a", gpu_ids(n, *range(4)), age=0, runtime=rng.choice(runtimes))
        for n in range(1, 4)
    ]
    backlog = [
        make(i, "a", rng.choice(shapes), runtime=rng.choice(runtimes), submitted=NOW - 500 + i)
        for i in range(1, 9)
    ]
    snap = snapshot(nodes, [quota("a", 100)], backlog, run)
    first = run_plan(snap)
    now = NOW + rng.choice([60, 200, 400])
    ended = set(rng.sample(range(3), rng.randint(1, 2)))
    run2 = [r for n, r in enumerate(run) if n not in ended]
    placed = {p.job_id: p for p in first.placements}
    run2 += [_as_running(j, placed[j.id], NOW) for j in backlog if j.id in placed]
    arrivals = [
        make(i, "a", rng.choice(shapes), runtime=rng.choice(runtimes), submitted=now - 1)
        for i in range(20, 20 + rng.randint(1, 4))
    ]
    pending = [*handed_back(backlog, first), *arrivals]
    return dataclasses.replace(snap, now=now, running=run2, pending=pending)


def _gang_or_not(rng):
    """``job`` for the topology case: a third of the jobs on two nodes (GPUs per node as
    drawn, at most 2), with a topology wait."""

    def make(job_id, tenant, gpus, **fields):
        if rng.random() < 1 / 3:
            return job(job_id, tenant, min(gpus, 2), nodes=2, topology_wait=600.0, **fields)
        return job(job_id, tenant, gpus, **fields)

    return make


@pytest.mark.parametrize("topology", [False, True])
@pytest.mark.parametrize("seed", range(60))
def test_jobs_behind_the_first_waiting_job_never_delay_it(seed, topology):
    """For the job at pool position 1, after a cycle in which new jobs arrived (some
    smaller, so ahead of older reservations) and running jobs ended early: a job new at
    the front starts as early as it would if the jobs behind it did not exist (held
    reservations of jobs behind it may not make it wait: the report, a job shown first
    told it waits for a job behind it); one that was planned last cycle keeps its
    reservation or better."""
    snap = _random_two_cycles(seed, topology)
    result = run_plan(snap)
    order = [
        item for _, item in SizeOrder(snap.cluster_state(), snap.policy()).sort(list(snap.pending))
    ]
    waiting = [item for item in order if item.id in result.pending]
    if not waiting:
        return
    first = waiting[0]
    assert result.pending[first.id].pool_position == 1
    # Its kept reservation is a promise it may wait for (holds made around it stand).
    promised = first.reserved_start if first.reserved_gpu_ids else None
    mine = result.pending[first.id].estimated_start
    alone = run_plan(dataclasses.replace(snap, pending=order[: order.index(first) + 1]))
    if first.id not in alone.pending:
        # It starts now without the jobs behind it: with them it starts too, or waits
        # for its own reservation.
        assert promised is not None and mine is not None and mine <= promised, first.id
        return
    without = alone.pending[first.id].estimated_start
    assert mine is not None and without is not None
    assert mine <= without or (promised is not None and mine <= promised), (
        first.id,
        mine - NOW,
        without - NOW,
    )


# -- size order and aging -----------------------------------------------------------------


def test_inside_a_class_and_tenant_smaller_work_goes_first_and_aging_catches_up():
    nodes = [node(1, gpus=4)]
    run = [running(10, "a", gpu_ids(1, 0, 1, 2, 3), age=0, runtime=600)]
    big = job(1, "a", gpus=4, runtime=7200, submitted=NOW - 100)
    small = job(2, "a", gpus=1, runtime=600, submitted=NOW - 50)
    result = run_plan(snapshot(nodes, [quota("a", 8)], [big, small], run))
    assert result.pending[2].pool_position == 1  # 600 GPU-s before 28,800
    # The big job has waited long enough that its aged size is the smaller one:
    # log2(4 x 7200) - 7 h / 1 h = 7.8 < log2(600) = 9.2.
    old = dataclasses.replace(big, submitted_at=NOW - 7 * 3600)
    snap = snapshot(nodes, [quota("a", 8)], [old, small], run, max_wait_seconds=0)
    result = run_plan(dataclasses.replace(snap, size_halving_seconds=3600.0))
    assert result.pending[1].pool_position == 1
    # Past its maximum wait it goes first whatever its size.
    late = dataclasses.replace(big, submitted_at=NOW - 3600, max_wait_seconds=1800)
    result = run_plan(snapshot(nodes, [quota("a", 8)], [late, small], run))
    assert result.pending[1].pool_position == 1


def test_a_prediction_shorter_than_the_limit_orders_the_job_by_it():
    nodes = [node(1, gpus=4)]
    run = [running(10, "a", gpu_ids(1, 0, 1, 2, 3), age=0, runtime=600)]
    declared_long = dataclasses.replace(
        job(1, "a", gpus=1, runtime=36000), expected_runtime_seconds=300
    )
    short = job(2, "a", gpus=1, runtime=3600)
    result = run_plan(snapshot(nodes, [quota("a", 8)], [declared_long, short], run))
    assert result.pending[1].pool_position == 1


def test_an_overdue_job_waiting_to_borrow_reserves_gpus():
    """A job bigger than its tenant's guarantee may only borrow idle GPUs, so it never
    reserves: small work of others keeps taking the GPUs as they free up. Past its maximum
    wait it reserves them like guaranteed work, and backfill must respect that."""
    nodes = [node(1, gpus=8)]
    quotas = [quota("a", 4, 4), quota("b", 4, 4)]
    run = [running(10, "b", gpu_ids(1, *range(6)), age=0, runtime=600)]
    big = dataclasses.replace(
        job(1, "a", gpus=8, runtime=7200, submitted=NOW - 100), max_wait_seconds=3600
    )
    other = job(2, "b", gpus=2, runtime=7200)
    fresh = run_plan(snapshot(nodes, quotas, [big, other], run))
    assert fresh.pending[1].reserved_gpu_ids == ()
    assert [p.job_id for p in fresh.placements] == [2]

    overdue = dataclasses.replace(big, submitted_at=NOW - 4000)
    result = run_plan(snapshot(nodes, quotas, [overdue, other], run))
    assert result.pending[1].code == reasons.WAITING_FOR_GPUS
    assert len(result.pending[1].reserved_gpu_ids) == 8
    assert result.pending[1].estimated_start == NOW + 600
    assert result.placements == []  # job 2 would run past job 1's start


def test_a_borrower_of_several_nodes_reserves_once_it_has_waited_long_enough():
    """Tenant b has no guarantee: its two-node job only borrows idle GPUs, and one GPU of
    each node stays busy (until +50 min and +2 h). Before its maximum wait it reserved
    nothing, so job 2 (three hours on four GPUs) took a node; with
    ``gang_borrower_reserve_seconds`` it reserves both nodes once it has waited that long,
    and job 2, which would run past that start, waits."""
    nodes = [node(1, gpus=8), node(2, gpus=8)]
    quotas = [quota("b", 0, 16), quota("c", 16)]
    run = [
        running(10, "c", gpu_ids(1, 0), preemptible=False, age=600, runtime=3600),
        running(11, "c", gpu_ids(2, 0), preemptible=False, age=600, runtime=7800),
    ]
    gang = job(1, "b", gpus=8, nodes=2, cls="high", can_preempt=False, runtime=36000)
    gang = dataclasses.replace(gang, submitted_at=NOW - 7200)  # waited 2 h
    other = job(2, "c", gpus=4, runtime=3 * 3600)

    def plan_after(seconds: float):
        knobs = {"gang_borrower_reserve_seconds": seconds}
        return run_plan(snapshot(nodes, quotas, [gang, other], run, **knobs))

    for seconds in (0, 3 * 3600):  # off, or not waited long enough yet
        result = plan_after(seconds)
        assert result.pending[1].reserved_gpu_ids == ()
        assert [p.job_id for p in result.placements] == [2]

    result = plan_after(3600)
    assert result.pending[1].code == reasons.WAITING_FOR_GPUS
    assert len(result.pending[1].reserved_gpu_ids) == 16
    assert result.pending[1].estimated_start == NOW + 7200
    assert result.placements == []
    assert result.pending[2].code == reasons.RESERVED_FOR_HIGHER_PRIORITY
    # A one-node borrower is not affected: it waits for its maximum wait as before.
    single = dataclasses.replace(gang, nodes=1)
    knobs = {"gang_borrower_reserve_seconds": 3600}
    result = run_plan(snapshot(nodes, quotas, [single, other], run, **knobs))
    assert result.pending[1].reserved_gpu_ids == ()
