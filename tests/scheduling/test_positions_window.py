"""Positions are read from the waiting jobs that can stand before the ones asked about
(their pools, up to the highest rank asked there): the same answer as ranking every
waiting job, for any set of jobs asked about, with ties broken by id."""

import random

import pytest

from scheduling.choices import JobState
from scheduling.positions import positions_attach
from tests import factories as f


def _expected(jobs):
    """Positions by ranking every waiting ranked job (the plain definition)."""
    waiting = [j for j in jobs if j.pending_rank is not None and j.state in ("PENDING", "HELD")]
    by_queue, by_pool = {}, {}
    for job in sorted(waiting, key=lambda j: (j.pending_rank, j.pk)):
        by_queue.setdefault(job.queue_id, []).append(job.pk)
        by_pool.setdefault(job.queue.pool_id, []).append(job.pk)
    return {
        j.pk: (
            by_queue[j.queue_id].index(j.pk) + 1,
            by_pool[j.queue.pool_id].index(j.pk) + 1,
        )
        for j in waiting
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_positions_of_any_subset_match_ranking_every_waiting_job(world, seed):
    rng = random.Random(seed)
    second_pool = f.PoolFactory(name="inference")
    queues = [
        world.queue,
        world.other_queue,
        f.QueueFactory(
            tenant=world.tenant, name="serve", pool=second_pool, default_priority_class=world.normal
        ),
        f.QueueFactory(
            tenant=world.other, name="serve", pool=second_pool, default_priority_class=world.normal
        ),
    ]
    states = [JobState.PENDING] * 6 + [JobState.HELD, JobState.RUNNING, JobState.SUCCEEDED]
    jobs = []
    for _ in range(60):
        state = rng.choice(states)
        rank = rng.randrange(20) if state != JobState.SUCCEEDED or rng.random() < 0.5 else None
        jobs.append(f.JobFactory(queue=rng.choice(queues), state=state, pending_rank=rank))
    expected = _expected(jobs)
    for _ in range(10):
        asked = rng.sample(jobs, rng.randrange(1, 12))
        fresh = [type(j).objects.select_related("queue").get(pk=j.pk) for j in asked]
        positions_attach(fresh)
        for job in fresh:
            want = expected.get(job.pk, (None, None))
            assert (job.queue_position, job.pool_position) == want, (seed, job.pk, job.state)
