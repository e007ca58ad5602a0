"""Borrowed GPUs that come back inside the tenant's guarantee count against it
(``engine.promotions``), and a job placed as borrowed where the guarantee has room for it
starts on it (``placed_within_guarantee``): reclaim takes back only what a tenant borrows
beyond its guarantee."""

import dataclasses

from engine_builders import gpu_ids, job, node, quota, run_plan, running, snapshot

from scheduling.engine import promotions
from scheduling.engine.quota import fit_guarantee, placed_within_guarantee

LONG = 86400


def test_a_borrowed_job_inside_the_guarantee_is_promoted():
    # Tenant a (guarantee 8) started job 10 borrowing while its guaranteed job ran; that
    # job has ended, so job 10's 4 GPUs are inside the guarantee now.
    run = [running(10, "a", gpu_ids(1, 0, 1, 2, 3), borrowed=True)]
    assert promotions(run, [quota("a", 8, borrow=8)]) == [10]


def test_only_what_fits_what_is_left_of_the_guarantee():
    # Guarantee 8: 4 GPUs held by a guaranteed job; borrowed jobs of 8 (oldest), 4 and 2
    # GPUs: the 8 does not fit the 4 left, the 4 does, and then nothing is left.
    run = [
        running(1, "a", gpu_ids(1, 0, 1, 2, 3)),
        running(2, "a", gpu_ids(2, *range(8)), borrowed=True, age=900),
        running(3, "a", gpu_ids(1, 4, 5, 6, 7), borrowed=True, age=800),
        running(4, "a", gpu_ids(3, 0, 1), borrowed=True, age=700),
    ]
    assert promotions(run, [quota("a", 8, borrow=16)]) == [3]


def test_oldest_first_then_by_id():
    run = [
        running(7, "a", gpu_ids(1, 0), borrowed=True, age=100),
        running(6, "a", gpu_ids(1, 1), borrowed=True, age=100),
        running(5, "a", gpu_ids(1, 2), borrowed=True, age=50),
    ]
    assert promotions(run, [quota("a", 2, borrow=8)]) == [6, 7]
    assert fit_guarantee(run, 1) == [6]
    assert fit_guarantee(run, 0) == []


def test_stopping_jobs_hold_their_share_and_are_not_promoted():
    # A stopping guaranteed job still holds its GPUs (until gone); a stopping borrowed job
    # is on its way out and stays borrowed.
    run = [
        running(1, "a", gpu_ids(1, 0, 1, 2, 3), stopping=True),
        running(2, "a", gpu_ids(1, 4, 5), borrowed=True, stopping=True),
        running(3, "a", gpu_ids(1, 6, 7), borrowed=True),
    ]
    assert promotions(run, [quota("a", 6, borrow=8)]) == [3]
    assert promotions(run, [quota("a", 5, borrow=8)]) == []


def test_each_account_on_its_own():
    # A model quota and the pool's any-model quota are separate accounts (as Quotas
    # resolves them); other tenants and pools do not count; no quota: no guarantee.
    run = [
        running(1, "a", gpu_ids(1, 0, 1), model="H100"),
        running(2, "a", gpu_ids(1, 2, 3), model="H100", borrowed=True),
        running(3, "a", gpu_ids(2, 0, 1), model="A100", borrowed=True),
        running(4, "b", gpu_ids(2, 2, 3), model="A100", borrowed=True),
        running(5, "a", gpu_ids(3, 0), pool="inference", borrowed=True),
    ]
    quotas = [quota("a", 2, borrow=8, model="H100"), quota("a", 2, borrow=8), quota("b", 1)]
    assert promotions(run, quotas) == [3]
    assert promotions(run, [quota("a", 4, borrow=8, model="H100")]) == [2]
    assert promotions(run, []) == []


def test_a_promoted_job_is_no_longer_reclaimed():
    # Tenant a (guarantee 8) runs job 10 on node 1, started as borrowed while a's other
    # work ran; tenant b (guarantee 8, running nothing) waits with an 8-GPU job. Labelled
    # borrowed, job 10 is reclaimed and a falls below its own guarantee (then a reclaims
    # in turn: churn); counted against a's guarantee, it runs on and b waits.
    quotas = [quota("a", 8, borrow=8), quota("b", 8, borrow=8)]
    labelled = running(10, "a", gpu_ids(1, *range(8)), borrowed=True, runtime=LONG)
    waiting = [job(1, "b", gpus=8)]
    before = run_plan(snapshot([node(1)], quotas, waiting, [labelled]))
    assert [(p.victim_id, p.reason) for p in before.preemptions] == [(10, "reclaim")]

    assert promotions([labelled], quotas) == [10]
    promoted = dataclasses.replace(labelled, borrowed=False)
    after = run_plan(snapshot([node(1)], quotas, waiting, [promoted]))
    assert after.preemptions == []
    assert after.pending[1].estimated_start is not None


def test_reclaim_then_takes_what_is_beyond_the_guarantee():
    # Two 8-GPU borrowers of a (guarantee 8): the older one is promoted, the newer one is
    # still borrowed and is what b reclaims.
    quotas = [quota("a", 8, borrow=8), quota("b", 8, borrow=8)]
    run = [
        running(10, "a", gpu_ids(1, *range(8)), borrowed=True, age=300, runtime=LONG),
        running(11, "a", gpu_ids(2, *range(8)), borrowed=True, age=900, runtime=LONG),
    ]
    assert promotions(run, quotas) == [11]
    run[1] = dataclasses.replace(run[1], borrowed=False)
    result = run_plan(snapshot([node(1), node(2)], quotas, [job(1, "b", gpus=8)], run))
    assert [(p.victim_id, p.reason) for p in result.preemptions] == [(10, "reclaim")]


# -- jobs placed as borrowed where the guarantee has room start on it -------------------


def test_a_job_placed_after_a_big_borrower_starts_on_the_guarantee():
    # Tenant a (guarantee 8, borrowing 8) runs nothing. In one cycle its 1-GPU batch job
    # starts on the guarantee (1 of 8), its 8-GPU job can only borrow (9 > 8), and then
    # its 1-GPU low job is admitted beyond the guarantee too (10 GPUs held, borrowed ones
    # included) though the guarantee has 7 GPUs left: it starts on the guarantee.
    quotas = [quota("a", 8, borrow=8)]
    pending = [
        job(1, "a", gpus=1, cls="normal"),
        job(2, "a", gpus=8, cls="normal"),
        job(3, "a", gpus=1, cls="low"),
    ]
    result = run_plan(snapshot([node(1), node(2)], quotas, pending, size_order=True))
    assert {p.job_id: p.borrowed for p in result.placements} == {1: False, 2: True, 3: False}


def test_placed_within_guarantee_counts_what_holds_the_guarantee():
    quotas = [quota("a", 8, borrow=8), quota("a", 4, pool="inference")]
    # Running on a's guarantee: 4 GPUs; a running borrower of 2 GPUs fits what is left,
    # and takes it first (older) as promotions() would.
    run = [
        running(10, "a", gpu_ids(1, 0, 1, 2, 3)),
        running(11, "a", gpu_ids(1, 4, 5), borrowed=True),
    ]
    placed = [
        (1, "a", "training", "H100", 1, False),  # on the guarantee: 5 of 8 held
        (3, "a", "training", "H100", 2, True),  # 2 left after job 11: fits
        (2, "a", "training", "H100", 1, True),  # by id, job 2 before job 3: fits
        (4, "a", "inference", "H100", 4, True),  # another account, 4 left: fits
        (5, "b", "training", "H100", 1, True),  # no quota for b: no guarantee
    ]
    assert placed_within_guarantee(run, placed, quotas) == [2, 4]
    # The borrower of 2 stopping: it holds no share of the guarantee; then 3 are left.
    stopping = [run[0], dataclasses.replace(run[1], stopping=True)]
    assert placed_within_guarantee(stopping, placed, quotas) == [2, 3, 4]
    # Nothing placed as borrowed: nothing to look at.
    assert placed_within_guarantee(run, [placed[0]], quotas) == []
