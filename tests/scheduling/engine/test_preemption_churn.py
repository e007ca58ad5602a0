"""Preemption churn: protection at a job's preemption limit, and victims that lose the
least work since their last checkpoint (DESIGN.md §6, scheduling.engine.preemption)."""

import dataclasses

from engine_builders import NOW, gpu_ids, job, node, quota, run_plan, running, snapshot

from scheduling.engine import reasons


def _victims(result) -> list[int]:
    return sorted(p.victim_id for p in result.preemptions)


def _churned(record, preemptions=3, limit=3, protection=0, checkpointed_at=None):
    """``record`` preempted ``preemptions`` times before, under a limit of ``limit``."""
    return dataclasses.replace(
        record,
        preemptions=preemptions,
        max_preemptions=limit,
        preemption_protection_seconds=protection,
        checkpointed_at=checkpointed_at,
    )


def _two_low_jobs(first, second):
    """Tenant b runs two low 4-GPU jobs on node 1: ``first`` (10) has lost less work than
    ``second`` (11) would, so it is the first victim unless protected."""
    return [
        first(running(10, "b", gpu_ids(1, 0, 1, 2, 3), "low", age=400, runtime=86400)),
        second(running(11, "b", gpu_ids(1, 4, 5, 6, 7), "low", age=5000, runtime=86400)),
    ]


def _same(record):
    return record


def _plan_high(run, gpus=4, quotas=None):
    quotas = quotas or [quota("a", 8), quota("b", 8)]
    return run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=gpus, cls="high")], run))


def test_a_job_at_its_limit_is_never_chosen_for_a_higher_class():
    assert _victims(_plan_high(_two_low_jobs(_same, _same))) == [10]

    result = _plan_high(_two_low_jobs(_churned, _same))
    assert _victims(result) == [11]

    # Both at their limit: nothing to stop, the high job waits for GPUs.
    result = _plan_high(_two_low_jobs(_churned, _churned))
    assert result.preemptions == []
    assert result.pending[1].code == reasons.WAITING_FOR_GPUS


def test_below_its_limit_or_without_a_limit_a_job_may_be_chosen():
    below = _plan_high(_two_low_jobs(lambda r: _churned(r, preemptions=2), _same))
    assert _victims(below) == [10]
    no_limit = _plan_high(_two_low_jobs(lambda r: _churned(r, preemptions=50, limit=0), _same))
    assert _victims(no_limit) == [10]


def test_a_job_at_its_limit_may_be_chosen_again_after_its_protection_window():
    # Job 10 started 400 s ago: protected for 600 s, it is not chosen; for 300 s, it is.
    protected = _plan_high(_two_low_jobs(lambda r: _churned(r, protection=600), _same))
    assert _victims(protected) == [11]
    over = _plan_high(_two_low_jobs(lambda r: _churned(r, protection=300), _same))
    assert _victims(over) == [10]


def test_own_jobs_at_their_limit_are_not_stopped_to_free_quota():
    # Tenant a uses its whole quota with two low jobs; its high job may stop one of them
    # (own-tenant priority preemption), not the one at its limit.
    run = [
        _churned(running(10, "a", gpu_ids(1, 0, 1, 2, 3), "low", age=400, runtime=86400)),
        running(11, "a", gpu_ids(1, 4, 5, 6, 7), "low", age=5000, runtime=86400),
    ]
    result = _plan_high(run, quotas=[quota("a", 8)])
    assert _victims(result) == [11]

    run[1] = _churned(run[1])
    result = _plan_high(run, quotas=[quota("a", 8)])
    assert result.preemptions == []


def test_a_borrower_at_its_stop_limit_is_not_reclaimed_and_the_reason_says_so():
    # Every stop counts: tenant a (inside its guarantee) does not reclaim b's borrowed job
    # at its limit; it waits for its end, and its reason names the job.
    quotas = [quota("a", 8), quota("b", 0, 8)]
    run = [
        _churned(
            running(10, "b", gpu_ids(1, *range(8)), "low", borrowed=True, runtime=86400),
            protection=0,
        )
    ]
    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=8)], run))
    assert result.preemptions == []
    info = result.pending[1]
    assert info.code == reasons.WAITING_FOR_GPUS
    assert "job(s) 10 are not reclaimed" in info.message
    assert "run on to their end or their runtime limit" in info.message
    # The estimate is still an upper bound: the borrower's runtime limit.
    assert info.estimated_start is not None
    assert info.estimated_start <= NOW + 86400 + 1
    # Below its limit it is reclaimed (and that stop is counted by the caller).
    below = [dataclasses.replace(run[0], preemptions=2)]
    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=8)], below))
    assert _victims(result) == [10]
    assert result.preemptions[0].reason == reasons.PREEMPT_RECLAIM
    assert "not reclaimed" not in result.pending[1].message
    # ... and a higher class of a borrower does not stop it (c's low job on node 2, on
    # guaranteed GPUs, is not the borrower's to take either).
    quotas = [quota("a", 0, 16), quota("b", 0, 8), quota("c", 8)]
    run.append(running(11, "c", gpu_ids(2, *range(8)), "low", runtime=86400))
    pending = [job(1, "a", gpus=8, cls="high")]
    result = run_plan(snapshot([node(1), node(2)], quotas, pending, run))
    assert result.preemptions == []


def test_after_its_protection_window_a_borrower_may_be_reclaimed():
    quotas = [quota("a", 8), quota("b", 0, 8)]
    base = running(10, "b", gpu_ids(1, *range(8)), "low", borrowed=True, age=400, runtime=86400)
    inside = [_churned(base, protection=600)]
    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=8)], inside))
    assert result.preemptions == []
    over = [_churned(base, protection=300)]
    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=8)], over))
    assert _victims(result) == [10]


def _at_limit(pending, preemptions=3, limit=3):
    return dataclasses.replace(pending, preemptions=preemptions, max_preemptions=limit)


def test_a_job_at_its_limit_runs_only_inside_its_guarantee():
    # Tenant a holds its 4 guaranteed GPUs; 4 more are idle and it may borrow them.
    quotas = [quota("a", 4, 4)]
    run = [running(10, "a", gpu_ids(1, 0, 1, 2, 3), runtime=86400)]

    fresh = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=4)], run))
    assert [(p.job_id, p.borrowed) for p in fresh.placements] == [(1, True)]

    limited = run_plan(snapshot([node(1)], quotas, [_at_limit(job(1, "a", gpus=4))], run))
    assert limited.placements == []
    info = limited.pending[1]
    assert info.code == reasons.WAITING_FOR_QUOTA
    assert "preempted 3 times (limit 3)" in info.message

    # Inside its guarantee it starts, on guaranteed GPUs.
    started = run_plan(snapshot([node(1)], quotas, [_at_limit(job(1, "a", gpus=4))]))
    assert [(p.job_id, p.borrowed) for p in started.placements] == [(1, False)]


def test_a_job_at_its_limit_still_borrows_where_no_guarantee_could_hold_it():
    # Without a guarantee big enough it would never run again: it borrows (and, at its
    # limit, no reclaim stops it, see above).
    for guaranteed in (0, 2):
        quotas = [quota("a", guaranteed, 8)]
        result = run_plan(snapshot([node(1)], quotas, [_at_limit(job(1, "a", gpus=4))]))
        assert [(p.job_id, p.borrowed) for p in result.placements] == [(1, True)]


def test_the_minimum_runtime_counts_from_the_start_of_the_current_run():
    # Preempted twice before, restarted 100 s ago: too young to stop again.
    young = running(10, "b", gpu_ids(1, *range(8)), "low", age=100, min_runtime=300)
    result = _plan_high([_churned(young, preemptions=2)], gpus=8)
    assert result.preemptions == []
    seasoned = running(10, "b", gpu_ids(1, *range(8)), "low", age=300, min_runtime=300)
    result = _plan_high([_churned(seasoned, preemptions=2)], gpus=8)
    assert _victims(result) == [10]


def test_the_victim_with_the_least_work_since_its_checkpoint_is_chosen():
    # Job 10 started long ago but saved a checkpoint 60 s ago (240 GPU-s to lose); job 11
    # started 600 s ago and never saved (2,400 GPU-s): 10 is stopped, although 11 is the
    # more recently started.
    run = [
        running(10, "b", gpu_ids(1, 0, 1, 2, 3), "low", age=20_000, runtime=86400),
        running(11, "b", gpu_ids(1, 4, 5, 6, 7), "low", age=600, runtime=86400),
    ]
    assert _victims(_plan_high(run)) == [11]  # no checkpoint known: since its start

    run[0] = dataclasses.replace(run[0], checkpointed_at=NOW - 60)
    assert _victims(_plan_high(run)) == [10]


def test_gpus_count_in_the_work_lost():
    # Job 11 started last, but on 4 GPUs it would lose 4,000 GPU-s; job 10, on 2 GPUs
    # for 1,500 s, 3,000; job 12, on 2 GPUs for 2,000 s, 4,000: job 10 is stopped.
    run = [
        running(10, "b", gpu_ids(1, 0, 1), "low", age=1500, runtime=86400),
        running(11, "b", gpu_ids(1, 2, 3, 4, 5), "low", age=1000, runtime=86400),
        running(12, "b", gpu_ids(1, 6, 7), "low", age=2000, runtime=86400),
    ]
    result = _plan_high(run, gpus=2, quotas=[quota("a", 8), quota("b", 8)])
    assert _victims(result) == [10]


def test_class_still_comes_before_work_lost():
    # A normal job that lost nothing is still stopped after the low one.
    run = [
        running(10, "b", gpu_ids(1, 0, 1, 2, 3), "low", age=20_000, runtime=86400),
        dataclasses.replace(
            running(11, "b", gpu_ids(1, 4, 5, 6, 7), "normal", age=600, runtime=86400),
            checkpointed_at=NOW,
        ),
    ]
    assert _victims(_plan_high(run)) == [10]


def test_the_node_whose_victims_lose_the_least_work_is_chosen():
    # One low 8-GPU job per node; the one on node 2 saved a checkpoint recently.
    nodes = [node(1), node(2), node(3)]
    quotas = [quota("a", 8), quota("b", 24)]
    run = [
        running(10, "b", gpu_ids(1, *range(8)), "low", age=3000, runtime=86400),
        dataclasses.replace(
            running(11, "b", gpu_ids(2, *range(8)), "low", age=9000, runtime=86400),
            checkpointed_at=NOW - 100,
        ),
        running(12, "b", gpu_ids(3, *range(8)), "low", age=2000, runtime=86400),
    ]
    result = run_plan(snapshot(nodes, quotas, [job(1, "a", gpus=8, cls="high")], run))
    assert _victims(result) == [11]
    assert set(result.pending[1].reserved_gpu_ids) == set(gpu_ids(2, *range(8)))


def test_protected_nodes_are_passed_over_by_the_search_for_every_preemptor():
    # Several preemptors of one kind share the node heap: the protected job's node is
    # never offered, the others are taken in order of work lost.
    nodes = [node(1), node(2), node(3)]
    quotas = [quota("a", 24), quota("b", 24)]
    run = [
        _churned(running(10, "b", gpu_ids(1, *range(8)), "low", age=100, runtime=86400)),
        running(11, "b", gpu_ids(2, *range(8)), "low", age=3000, runtime=86400),
        running(12, "b", gpu_ids(3, *range(8)), "low", age=2000, runtime=86400),
    ]
    pending = [job(i, "a", gpus=8, cls="high") for i in (1, 2, 3)]
    result = run_plan(snapshot(nodes, quotas, pending, run))
    assert {p.preemptor_id: p.victim_id for p in result.preemptions} == {1: 12, 2: 11}
    assert result.pending[3].code != reasons.WAITING_FOR_PREEMPTION


def test_a_reclaim_takes_other_borrowed_work_or_waits():
    # Both b's jobs borrow; job 10, at its limit, would lose less work, yet job 11 is
    # reclaimed; on two nodes, the node without a job at its limit is chosen.
    quotas = [quota("a", 8), quota("b", 0, 16)]
    protected = _churned(
        running(10, "b", gpu_ids(1, 0, 1, 2, 3), "low", borrowed=True, age=400, runtime=86400)
    )
    other = running(11, "b", gpu_ids(1, 4, 5, 6, 7), "low", borrowed=True, age=5000, runtime=86400)
    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=4)], [protected, other]))
    assert _victims(result) == [11]
    unprotected = dataclasses.replace(protected, preemptions=0)
    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=4)], [unprotected, other]))
    assert _victims(result) == [10]

    run = [
        _churned(running(10, "b", gpu_ids(1, *range(8)), borrowed=True, age=400, runtime=86400)),
        running(11, "b", gpu_ids(2, *range(8)), borrowed=True, age=5000, runtime=86400),
    ]
    result = run_plan(snapshot([node(1), node(2)], quotas, [job(1, "a", gpus=8)], run))
    assert _victims(result) == [11]
    # Only the job at its limit would do: nothing is stopped, the job waits and says why.
    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=8)], [protected, other]))
    assert result.preemptions == []
    assert "job(s) 10 are not reclaimed" in result.pending[1].message
