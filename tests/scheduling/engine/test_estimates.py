"""Estimated starts: reservation times on the same timeline as backfill (an upper bound
while running jobs use their full limits and no more important work arrives)."""

import random

import pytest
from engine_builders import NOW, Simulation, gpu_ids, job, node, quota, run_plan, running, snapshot

from scheduling.engine import reasons


def test_estimates_follow_the_reservations():
    snap = snapshot(
        [node(1)],
        [quota("a", 8), quota("b", 8)],
        [job(1, "a", gpus=8), job(2, "a", gpus=2, runtime=1800), job(3, "a", gpus=2, runtime=7200)],
        [running(10, "b", gpu_ids(1, 0, 1, 2, 3), age=0, runtime=3600)],
        size_order=False,  # submit order: job 1 is ahead of the small ones
    )
    result = run_plan(snap)
    assert [p.job_id for p in result.placements] == [2]  # ends before job 1's reservation
    assert result.pending[1].estimated_start == NOW + 3600
    assert result.pending[3].code == reasons.RESERVED_FOR_HIGHER_PRIORITY
    assert result.pending[3].estimated_start == NOW + 3600 + 3600  # after job 1
    assert result.pending[1].queue_position == 1
    assert result.pending[3].queue_position == 2


def test_estimates_of_jobs_that_cannot_run_are_none():
    snap = snapshot(
        [node(1)],
        [quota("a", 4)],
        [job(1, gpus=8), job(2, models=("B200",)), job(3, held=True)],
    )
    result = run_plan(snap)
    assert [result.pending[i].estimated_start for i in (1, 2, 3)] == [None, None, None]


def test_waiting_for_quota_is_estimated_from_the_tenants_own_jobs():
    snap = snapshot(
        [node(1), node(2)],
        [quota("a", 8)],
        [job(1, gpus=4), job(2, gpus=8)],
        [running(10, "a", gpu_ids(1, 0, 1, 2, 3, 4, 5), age=0, runtime=1000)],
    )
    result = run_plan(snap)
    assert result.pending[1].code == reasons.WAITING_FOR_QUOTA
    assert result.pending[1].estimated_start == NOW + 1000
    assert result.pending[2].estimated_start == NOW + 1000 + 3600  # after job 1


def _random_cluster(seed: int):
    rng = random.Random(seed)
    nodes = [node(i, gpus=4) for i in range(1, 4)]
    shapes = [(1, 1), (2, 1), (4, 1), (3, 1), (4, 2)]
    pending = [
        job(
            i,
            "a",
            *rng.choice(shapes),
            runtime=rng.choice([100, 250, 400, 700, 1000]),
            submitted=NOW - 1000 + i,
        )
        for i in range(1, 26)
    ]
    run = [
        running(90, "a", gpu_ids(1, 0, 1), age=0, runtime=rng.choice([50, 300])),
        running(91, "a", gpu_ids(2, 0), age=0, runtime=rng.choice([150, 600])),
    ]
    return nodes, pending, run


@pytest.mark.parametrize("seed", range(12))
def test_every_job_starts_no_later_than_its_first_estimate(seed):
    """Jobs of one class on three 4-GPU nodes; every job runs to its full limit and the
    dispatch hands each reservation back to the next cycle (as it must)."""
    nodes, pending, run = _random_cluster(seed)
    snap = snapshot(nodes, [quota("a", 100)], pending, run)
    simulation = Simulation(snap, keep_reservations=True)
    simulation.run()
    assert set(simulation.started) == {j.id for j in pending}, "every job ran"
    for job_id, start in simulation.started.items():
        estimate = simulation.first_estimate.get(job_id, start)  # placed at once: no estimate
        assert estimate is not None
        assert start <= estimate + 1e-6, (job_id, start - NOW, estimate - NOW)


class FirstReservations(Simulation):
    """Records each job's estimate when a cycle first hands its reservation on."""

    def step(self):
        result = super().step()
        for info in result.pending.values():
            if info.reserved_gpu_ids:
                self.first_reserved.setdefault(info.job_id, info.estimated_start)
        return result


@pytest.mark.parametrize("seed", range(12))
def test_without_backfill_the_first_blocked_job_starts_no_later_than_its_estimate(seed):
    """Without backfill only the pool's first blocked job hands its reservation on (the
    jobs behind it are planned afresh each cycle, see Explaining.wait): from the cycle it
    becomes that job, it starts no later than the estimate it was given then."""
    nodes, pending, run = _random_cluster(seed)
    snap = snapshot(nodes, [quota("a", 100)], pending, run, backfill=False)
    simulation = FirstReservations(snap, keep_reservations=True)
    simulation.first_reserved = {}
    simulation.run()
    assert set(simulation.started) == {j.id for j in pending}, "every job ran"
    assert len(simulation.first_reserved) >= 5
    for job_id, estimate in simulation.first_reserved.items():
        start = simulation.started[job_id]
        assert start <= estimate + 1e-6, (job_id, start - NOW, estimate - NOW)
