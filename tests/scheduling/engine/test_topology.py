"""Topology blocks: a job of several nodes inside one block, waiting for one up to its
topology wait; single-node jobs packed into blocks already in use."""

import dataclasses
import random

import pytest
from engine_builders import NOW, Simulation, gpu_ids, job, node, quota, run_plan, running, snapshot

from scheduling.engine import plan, reasons

WAIT = 1800.0


def blocks(*sizes: int, first: int = 1, gpus: int = 8) -> list:
    """Nodes numbered from ``first``, in blocks b1, b2, ... of the given sizes."""
    nodes, number = [], first
    for index, size in enumerate(sizes, 1):
        for _ in range(size):
            nodes.append(node(number, gpus=gpus, block=f"b{index}"))
            number += 1
    return nodes


def busy(node_id: int, job_id: int, runtime: int = 3600, age: float = 600):
    """A job holding all 8 GPUs of a node until ``NOW - age + runtime``."""
    return running(job_id, "a", gpu_ids(node_id, *range(8)), age=age, runtime=runtime)


def nodes_of(result, job_id: int) -> set[int]:
    (placement,) = [p for p in result.placements if p.job_id == job_id]
    return set(placement.node_ids)


def test_a_gang_goes_to_the_block_left_with_the_fewest_idle_gpus():
    # b1: nodes 1-4, one busy (3 idle nodes); b2: nodes 5-8, all idle.
    snap = snapshot(
        blocks(4, 4),
        [quota("a", 100)],
        [job(1, gpus=8, nodes=2, topology_wait=WAIT)],
        [busy(1, 50)],
    )
    result = run_plan(snap)
    assert nodes_of(result, 1) <= {2, 3, 4}


def test_a_gang_waits_for_one_block_with_the_reason_and_a_reservation_in_one_block():
    # Nodes 2 (b1) and 4 (b2) are idle: spread it would start now; node 1 (b1) is free
    # in 20 minutes.
    snap = snapshot(
        blocks(2, 2),
        [quota("a", 100)],
        [job(1, gpus=8, nodes=2, topology_wait=WAIT)],
        [busy(1, 50, runtime=1800), busy(3, 51, runtime=7200)],
    )
    result = run_plan(snap)
    assert result.placements == []
    info = result.pending[1]
    assert info.code == reasons.WAITING_FOR_TOPOLOGY
    assert "waiting for one block to hold 2 nodes x 8 GPUs" in info.message
    assert "spread over blocks in 30 min" in info.message
    assert info.estimated_start == NOW + 1200
    assert {gpu // 100 for gpu in info.reserved_gpu_ids} == {1, 2}  # block b1


def test_past_its_topology_wait_a_gang_is_spread():
    waited = dataclasses.replace(
        job(1, gpus=8, nodes=2, topology_wait=WAIT), topology_since=NOW - WAIT
    )
    snap = snapshot(
        blocks(2, 2),
        [quota("a", 100)],
        [waited],
        [busy(1, 50, runtime=1800), busy(3, 51, runtime=7200)],
    )
    result = run_plan(snap)
    assert nodes_of(result, 1) == {2, 4}


def test_part_of_the_wait_left_keeps_it_waiting_and_says_how_long():
    waiting = dataclasses.replace(
        job(1, gpus=8, nodes=2, topology_wait=WAIT), topology_since=NOW - 1200
    )
    snap = snapshot(
        blocks(2, 2), [quota("a", 100)], [waiting], [busy(1, 50, 1800), busy(3, 51, 7200)]
    )
    info = run_plan(snap).pending[1]
    assert info.code == reasons.WAITING_FOR_TOPOLOGY
    assert "spread over blocks in 10 min" in info.message


def test_a_topology_wait_of_zero_spreads_at_once():
    snap = snapshot(
        blocks(2, 2),
        [quota("a", 100)],
        [job(1, gpus=8, nodes=2, topology_wait=0)],
        [busy(1, 50, 1800), busy(3, 51, 7200)],
    )
    assert nodes_of(run_plan(snap), 1) == {2, 4}


def test_a_gang_no_block_can_hold_is_spread_at_once():
    # Blocks of one node: none holds a job of two.
    snap = snapshot(
        blocks(1, 1, 1),
        [quota("a", 100)],
        [job(1, gpus=8, nodes=2, topology_wait=WAIT)],
        [busy(1, 50)],
    )
    assert nodes_of(run_plan(snap), 1) == {2, 3}


def test_nodes_in_no_block_hold_no_gang_while_it_waits_for_a_block():
    nodes = [*blocks(2), node(3), node(4)]  # nodes 3 and 4 are in no block
    snap = snapshot(
        nodes,
        [quota("a", 100)],
        [job(1, gpus=8, nodes=2, topology_wait=WAIT)],
        [busy(1, 50, 1800)],
    )
    result = run_plan(snap)
    assert result.pending[1].code == reasons.WAITING_FOR_TOPOLOGY


def test_single_node_jobs_go_to_a_block_already_in_use():
    # b1 (nodes 1-2) is idle, b2 (nodes 3-4) has a job on node 3: an 8-GPU job takes node 4
    # and leaves b1 whole, although best fit alone could have chosen node 1.
    snap = snapshot(
        blocks(2, 2),
        [quota("a", 100)],
        [job(1, gpus=8)],
        [running(50, "a", gpu_ids(3, 0, 1), age=600, runtime=3600)],
    )
    assert nodes_of(run_plan(snap), 1) == {4}


def test_single_node_jobs_still_fit_best_inside_the_blocks_in_use():
    snap = snapshot(
        blocks(2, 2),
        [quota("a", 100)],
        [job(1, gpus=2)],
        [
            running(50, "a", gpu_ids(3, 0, 1), age=600),
            running(51, "a", gpu_ids(4, 0, 1, 2, 3, 4, 5), age=600),
        ],
    )
    assert nodes_of(run_plan(snap), 1) == {4}


def test_a_borrowing_gang_waiting_for_a_block_reserves_inside_it_so_that_it_drains():
    # Tenant "a" borrows everything (no guarantee). Nodes 2 (b1) and 4 (b2) are idle:
    # spread the gang would start now; node 1 (b1) is free in 20 minutes. The gang
    # reserves b1, so the long single-node job behind it takes node 4, not node 2.
    snap = snapshot(
        blocks(2, 2),
        [quota("a", 0, borrow=100)],
        [
            job(1, gpus=8, nodes=2, topology_wait=WAIT),
            job(2, gpus=8, runtime=7200),
        ],
        [busy(1, 50, runtime=1800), busy(3, 51, runtime=7200)],
    )
    result = run_plan(snap)
    info = result.pending[1]
    assert info.code == reasons.WAITING_FOR_TOPOLOGY
    assert {gpu // 100 for gpu in info.reserved_gpu_ids} == {1, 2}  # block b1
    assert info.estimated_start == NOW + 1200
    assert nodes_of(result, 2) == {4}


def test_a_gang_stops_no_job_spread_over_blocks_while_it_may_wait_for_one():
    pending = [job(1, gpus=8, nodes=2, cls="high", topology_wait=WAIT)]
    run = [
        running(50, "a", gpu_ids(1, *range(8)), cls="low", age=600, runtime=7200),
        running(51, "a", gpu_ids(2, *range(8)), cls="low", age=600, runtime=7200),
        running(52, "a", gpu_ids(3, *range(8)), cls="low", age=600, runtime=1800),
        running(
            53, "a", gpu_ids(4, *range(8)), cls="normal", age=600, runtime=7200, preemptible=False
        ),
    ]
    snap = snapshot(blocks(2, 2), [quota("a", 100)], pending, run)
    # b1 = nodes 1 and 2 (low, preemptible): a preemption inside one block is allowed.
    result = run_plan(snap)
    assert {p.victim_id for p in result.preemptions} == {50, 51}


def test_the_same_decisions_without_blocks_whatever_the_topology_wait():
    rng = random.Random(7)
    pending = [
        job(i, gpus=rng.choice([1, 4, 8]), nodes=rng.choice([1, 2]), topology_wait=WAIT)
        for i in range(1, 12)
    ]
    run = [busy(1, 50, 1800), busy(3, 51, 7200)]
    with_wait = plan(snapshot([node(i) for i in range(1, 5)], [quota("a", 100)], pending, run))
    plain = [dataclasses.replace(p, topology_wait_seconds=0.0) for p in pending]
    without = plan(snapshot([node(i) for i in range(1, 5)], [quota("a", 100)], plain, run))
    assert with_wait.placements == without.placements
    assert with_wait.pending == without.pending


def _topology_cluster(seed: int):
    rng = random.Random(seed)
    nodes = [*blocks(2, 2, gpus=4), node(5, gpus=4)]
    shapes = [(1, 1), (2, 1), (4, 1), (4, 2), (2, 2), (4, 2)]
    pending = [
        job(
            i,
            "a",
            *rng.choice(shapes),
            runtime=rng.choice([100, 250, 400, 700, 1000]),
            submitted=NOW - 1000 + i,
            topology_wait=rng.choice([0.0, 300.0, 1800.0]),
        )
        for i in range(1, 21)
    ]
    run = [
        running(90, "a", gpu_ids(1, 0, 1), age=0, runtime=rng.choice([50, 300])),
        running(91, "a", gpu_ids(3, 0), age=0, runtime=rng.choice([150, 600])),
    ]
    return nodes, pending, run


@pytest.mark.parametrize("seed", range(10))
def test_with_blocks_every_job_starts_no_later_than_its_first_estimate(seed):
    nodes, pending, run = _topology_cluster(seed)
    simulation = Simulation(snapshot(nodes, [quota("a", 100)], pending, run))
    simulation.run()
    assert set(simulation.started) == {j.id for j in pending}, "every job ran"
    for job_id, start in simulation.started.items():
        estimate = simulation.first_estimate.get(job_id, start)
        assert estimate is not None
        assert start <= estimate + 1e-6, (job_id, start - NOW, estimate - NOW)
