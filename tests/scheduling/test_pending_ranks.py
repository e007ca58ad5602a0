"""Sort keys of the scheduling order: only the jobs whose relative order changed move."""

import random

import pytest

from scheduling.services.pending_ranks import SPACING, ranks_after


def _apply(order, old):
    new = dict(old)
    new.update(ranks_after(order, old))
    return new


def _increasing(order, keys):
    values = [keys[j] for j in order]
    return all(a < b for a, b in zip(values, values[1:], strict=False))


def test_first_cycle_numbers_every_job():
    keys = ranks_after([7, 3, 9], {})
    assert keys == {7: SPACING, 3: 2 * SPACING, 9: 3 * SPACING}


def test_jobs_leaving_the_head_move_nobody():
    old = {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}
    assert ranks_after([3, 4], old) == {}


def test_a_new_job_in_the_middle_takes_a_key_between_its_neighbours():
    old = {1: 1.0, 2: 2.0, 3: 3.0}
    changed = ranks_after([1, 9, 2, 3], old)
    assert list(changed) == [9] and 1.0 < changed[9] < 2.0


def test_one_job_overtaking_others_is_the_only_one_rewritten():
    old = {j: float(j) for j in range(1, 11)}
    order = [10, *range(1, 10)]
    assert list(ranks_after(order, old)) == [10]


def test_an_exhausted_gap_renumbers_the_whole_order():
    old = {1: 1.0, 2: 1.0 + 1e-9}
    changed = ranks_after([1, 5, 2], old)
    keys = {**old, **changed}
    assert _increasing([1, 5, 2], keys)
    assert keys[1] == SPACING  # renumbered


@pytest.mark.parametrize("seed", range(30))
def test_random_cycles_keep_keys_in_order_and_rewrite_at_most_the_moved(seed):
    rng = random.Random(seed)
    order = list(range(50))
    keys = _apply(order, {})
    next_id = 1000
    for _ in range(60):
        order = order[rng.randrange(0, 4) :]  # some start
        for _ in range(rng.randrange(0, 5)):  # some arrive anywhere
            order.insert(rng.randrange(len(order) + 1), next_id)
            next_id += 1
        moved = 0
        if order and rng.random() < 0.3:  # one overtakes (fair share, a raise)
            job = order.pop(rng.randrange(len(order)))
            order.insert(rng.randrange(len(order) + 1), job)
            moved = 1
        new_jobs = sum(1 for j in order if j not in keys)
        changed = ranks_after(order, keys)
        keys.update(changed)
        assert _increasing(order, keys)
        # Never more than the new jobs and the one that moved (unless renumbered).
        assert len(changed) <= new_jobs + moved or len(changed) == len(order)
