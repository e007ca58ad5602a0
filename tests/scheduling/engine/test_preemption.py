"""Victim choice, and what happens in the cycles after a preemption."""

import dataclasses

from engine_builders import NOW, gpu_ids, job, node, quota, run_plan, running, snapshot

from scheduling.engine import messages, reasons


def _victims(result) -> list[int]:
    return sorted(p.victim_id for p in result.preemptions)


def _two_gpu_jobs_on_one_node():
    """Four 2-GPU jobs of tenant b: borrowed normal, old low, recent low, normal."""
    return [
        running(10, "b", gpu_ids(1, 0, 1), "normal", borrowed=True, age=900, runtime=86400),
        running(11, "b", gpu_ids(1, 2, 3), "low", age=5000, runtime=86400),
        running(12, "b", gpu_ids(1, 4, 5), "low", age=100, runtime=86400),
        running(13, "b", gpu_ids(1, 6, 7), "normal", age=50, runtime=86400),
    ]


def test_victims_borrowed_first_then_lowest_class_then_most_recent():
    quotas = [quota("a", 8), quota("b", 6, 2)]
    run = _two_gpu_jobs_on_one_node()

    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=2, cls="high")], run))
    assert _victims(result) == [10]

    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=4, cls="high")], run))
    assert _victims(result) == [10, 12]

    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=6, cls="high")], run))
    assert _victims(result) == [10, 11, 12]


def test_reclaim_and_priority_reasons():
    quotas = [quota("a", 8), quota("b", 6, 2)]
    result = run_plan(
        snapshot([node(1)], quotas, [job(1, "a", gpus=4, cls="high")], _two_gpu_jobs_on_one_node())
    )
    reasons_by_victim = {p.victim_id: p.reason for p in result.preemptions}
    assert reasons_by_victim == {10: reasons.PREEMPT_RECLAIM, 12: reasons.PREEMPT_PRIORITY}
    assert all(p.preemptor_id == 1 and p.message for p in result.preemptions)
    info = result.pending[1]
    assert info.code == reasons.WAITING_FOR_PREEMPTION
    assert "10" in info.message and "12" in info.message
    assert info.estimated_start == NOW + 30  # the victims' grace period


def test_smallest_set_on_one_node():
    nodes = [node(1), node(2)]
    quotas = [quota("a", 8), quota("b", 16)]
    run = [
        running(10, "b", gpu_ids(1, 0, 1, 2, 3), "low", runtime=86400),
        running(11, "b", gpu_ids(1, 4, 5, 6, 7), "low", runtime=86400),
        *[running(20 + i, "b", gpu_ids(2, i), "low", runtime=86400) for i in range(8)],
    ]
    result = run_plan(snapshot(nodes, quotas, [job(1, "a", gpus=4, cls="high")], run))
    assert len(result.preemptions) == 1
    assert _victims(result) in ([10], [11])


def test_multi_node_preemption_frees_a_node_each():
    nodes = [node(1), node(2), node(3)]
    quotas = [quota("a", 16), quota("b", 24)]
    run = [
        running(10, "b", gpu_ids(1, *range(8)), "low", runtime=86400),
        running(11, "b", gpu_ids(2, *range(8)), "normal", runtime=86400),
        running(12, "b", gpu_ids(3, *range(8)), "low", runtime=86400),
    ]
    result = run_plan(snapshot(nodes, quotas, [job(1, "a", gpus=8, nodes=2, cls="high")], run))
    assert _victims(result) == [10, 12]


def test_borrower_may_only_preempt_lower_borrowed_work():
    quotas = [quota("a", 0, 8), quota("b", 4, 4)]
    run = [
        running(10, "b", gpu_ids(1, 0, 1, 2, 3), "low", runtime=86400),
        running(11, "b", gpu_ids(1, 4, 5, 6, 7), "low", borrowed=True, runtime=86400),
    ]
    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=4, cls="high")], run))
    assert _victims(result) == [11]
    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=8, cls="high")], run))
    assert result.preemptions == []
    assert result.pending[1].code == reasons.WAITING_FOR_QUOTA


def test_no_preemption_when_gpus_free_up_within_the_grace_period():
    quotas = [quota("a", 8), quota("b", 8)]
    run = [running(10, "b", gpu_ids(1, *range(8)), "low", age=3590, runtime=3600)]
    result = run_plan(snapshot([node(1)], quotas, [job(1, "a", gpus=8, cls="high")], run))
    assert result.preemptions == []
    assert result.pending[1].code == reasons.WAITING_FOR_GPUS
    assert result.pending[1].estimated_start == NOW + 10


def test_no_preemption_for_less_than_the_minimum_gain():
    # Job 10 ends by its limit in 20 minutes: preempting it gains job 1 under 20 minutes.
    quotas = [quota("a", 8), quota("b", 8)]
    run = [running(10, "b", gpu_ids(1, *range(8)), "low", age=2400, runtime=3600)]
    pending = [job(1, "a", gpus=8, cls="high")]
    result = run_plan(snapshot([node(1)], quotas, pending, run))
    assert _victims(result) == [10]  # the default: any gain
    gained = run_plan(snapshot([node(1)], quotas, pending, run, preemption_min_gain_seconds=1800))
    assert gained.preemptions == []
    assert gained.pending[1].code == reasons.WAITING_FOR_GPUS
    assert gained.pending[1].estimated_start == NOW + 1200
    enough = run_plan(snapshot([node(1)], quotas, pending, run, preemption_min_gain_seconds=600))
    assert _victims(enough) == [10]
    # 2 h: it waits for 20 minutes, and preempts to save a day.
    two_hours = {"preemption_min_gain_seconds": 7200}
    assert run_plan(snapshot([node(1)], quotas, pending, run, **two_hours)).preemptions == []
    day = [dataclasses.replace(run[0], max_runtime_seconds=86400)]
    assert _victims(run_plan(snapshot([node(1)], quotas, pending, day, **two_hours))) == [10]
    # A reclaim (borrowed victim, job inside its guarantee) is held back the same way.
    quotas = [quota("a", 8), quota("b", 0, 8)]
    run = [dataclasses.replace(run[0], borrowed=True)]
    pending = [job(1, "a", gpus=8)]
    result = run_plan(snapshot([node(1)], quotas, pending, run))
    assert _victims(result) == [10]
    gained = run_plan(snapshot([node(1)], quotas, pending, run, preemption_min_gain_seconds=1800))
    assert gained.preemptions == []


def test_minimum_gain_reads_the_victims_runtime_predictions():
    # Job 10's limit is a day away, but its owner's jobs run an hour: it is expected to
    # end in 20 minutes. Preempting it gains job 1 less than the 30-minute minimum gain.
    quotas = [quota("a", 8), quota("b", 8)]
    long_limit = running(10, "b", gpu_ids(1, *range(8)), "low", age=2400, runtime=86400)
    pending = [job(1, "a", gpus=8, cls="high")]
    gain = {"preemption_min_gain_seconds": 1800}

    def plan_with(expected: float, **knobs):
        run = [dataclasses.replace(long_limit, expected_runtime_seconds=expected)]
        return run_plan(snapshot([node(1)], quotas, pending, run, **knobs))

    waits = plan_with(3600, **gain)
    assert waits.preemptions == []
    assert waits.pending[1].code == reasons.WAITING_FOR_GPUS
    assert waits.pending[1].estimated_start == NOW + 86400 - 2400  # the estimate: its limit
    assert _victims(plan_with(0, **gain)) == [10]  # no prediction: the limit counts
    assert _victims(plan_with(2400 + 3000, **gain)) == [10]  # expected in 50 minutes
    assert _victims(plan_with(1800, **gain)) == [10]  # past its prediction: not expected
    assert _victims(plan_with(3600)) == [10]  # no minimum gain: any gain


def _reclaim_with_one_victim_expected_to_end_soon(gain: float):
    """Tenant a, inside its guarantee, waits for 8 GPUs held by two borrowed jobs of b:
    job 10 (10 minutes in, least work lost) is expected to end in 10 minutes, job 11
    (40 minutes in) has no prediction. Both run for a day by their limits."""
    quotas = [quota("a", 8), quota("b", 0, 16)]
    run = [
        dataclasses.replace(
            running(10, "b", gpu_ids(1, *range(8)), borrowed=True, age=600, runtime=86400),
            expected_runtime_seconds=1200,
        ),
        running(11, "b", gpu_ids(2, *range(8)), borrowed=True, age=2400, runtime=86400),
    ]
    pending = [job(1, "a", gpus=8)]
    return run_plan(
        snapshot([node(1), node(2)], quotas, pending, run, preemption_min_gain_seconds=gain)
    )


def test_a_victim_expected_to_end_within_the_minimum_gain_is_passed_over():
    # Without a minimum gain the least work lost decides: job 10.
    assert _victims(_reclaim_with_one_victim_expected_to_end_soon(0)) == [10]
    # With 30 minutes, job 10 would be gone by then anyway: stopping it buys nothing, so
    # the job that holds its GPUs for a day is reclaimed instead (before, the search took
    # job 10, found it expected to end, and stopped nobody: job 1 waited a day).
    result = _reclaim_with_one_victim_expected_to_end_soon(1800)
    assert _victims(result) == [11]
    assert result.pending[1].code == reasons.WAITING_FOR_PREEMPTION


def test_no_preemption_when_every_victim_is_expected_to_end_within_the_minimum_gain():
    quotas = [quota("a", 8), quota("b", 0, 16)]
    run = [
        dataclasses.replace(
            running(10 + n, "b", gpu_ids(n + 1, *range(8)), borrowed=True, age=600, runtime=86400),
            expected_runtime_seconds=1200 + 300 * n,
        )
        for n in range(2)
    ]
    pending = [job(1, "a", gpus=8)]
    nodes = [node(1), node(2)]
    gain = {"preemption_min_gain_seconds": 1800}
    waits = run_plan(snapshot(nodes, quotas, pending, run, **gain))
    assert waits.preemptions == []
    assert waits.pending[1].code == reasons.WAITING_FOR_GPUS
    # The decisions-only cycle (the simulator's) stops as early and decides the same.
    quick = run_plan(snapshot(nodes, quotas, pending, run, decisions_only=True, **gain))
    assert quick.preemptions == [] and quick.placements == []
    # Once a job runs past its prediction it is no longer expected to end: it is a victim.
    later = run_plan(snapshot(nodes, quotas, pending, run, now=NOW + 700, **gain))
    assert _victims(later) == [10]


def test_stopping_victims_are_not_preempted_again_and_wait_for_their_preemptor():
    quotas = [quota("a", 16), quota("b", 16)]
    nodes = [node(1), node(2)]
    run = [
        running(10, "b", gpu_ids(1, *range(8)), "low", stopping=True, preempted_by=1),
        running(11, "b", gpu_ids(2, *range(8)), "low", runtime=86400),
    ]
    # Job 2 comes first in the order (higher class) but must not take job 1's GPUs.
    pending = [job(1, "a", gpus=8, cls="high"), job(2, "a", gpus=8, cls="critical")]
    result = run_plan(snapshot(nodes, quotas, pending, run))
    assert {p.victim_id: p.preemptor_id for p in result.preemptions} == {11: 2}
    assert result.pending[1].code == reasons.WAITING_FOR_PREEMPTION
    assert result.pending[1].estimated_start == NOW + 30
    assert result.pending[2].code == reasons.WAITING_FOR_PREEMPTION


def test_a_job_ahead_of_a_preemptor_is_told_when_the_gpus_kept_for_it_are_free():
    # Job 1 preempted job 10 (stopping, 30 s grace) for node 1. Job 2, of a higher class
    # that may not preempt, comes first and finds only those GPUs, kept for job 1 until
    # job 1's turn. It is told it starts after job 1's run (its limit, 1 h) and holds
    # nothing, so job 1 still starts once its victim is gone.
    # Job 3 preempted job 11 in another pool: its kept GPUs are not in job 2's way.
    quotas = [quota("a", 16), quota("b", 8), quota("a", 8, pool="inference")]
    quotas.append(quota("b", 8, pool="inference"))
    run = [
        running(10, "b", gpu_ids(1, *range(8)), "low", stopping=True, preempted_by=1),
        running(11, "b", gpu_ids(2, *range(8)), "low", stopping=True, preempted_by=3),
    ]
    preemptor = job(1, "a", gpus=8, cls="high")
    ahead = job(2, "a", gpus=8, cls="critical", can_preempt=False)
    elsewhere = job(3, "a", gpus=8, cls="high", pool="inference")
    nodes = [node(1), node(2, pool="inference")]
    result = run_plan(snapshot(nodes, quotas, [preemptor, ahead, elsewhere], run))
    info = result.pending[2]
    assert (info.code, info.pool_position) == (reasons.WAITING_FOR_GPUS, 1)
    assert info.estimated_start == NOW + 30 + 3600
    assert info.reserved_gpu_ids == ()
    assert info.message.endswith("GPUs being freed are kept for job 1, which preempted for them")
    assert result.pending[1].estimated_start == NOW + 30
    handed = [_handed_back_with_claims(preemptor, result.pending[1]), ahead]
    after = run_plan(snapshot([node(1)], quotas[:2], handed, [], now=NOW + 30))
    assert [p.job_id for p in after.placements] == [1]
    assert after.pending[2].estimated_start == NOW + 30 + 3600


def test_kept_gpus_named_for_each_preemptor():
    assert messages.kept_for_preemptors([7, 3]) == (
        "GPUs being freed are kept for jobs 3, 7, which preempted for them"
    )


def test_stopping_gpus_without_a_known_preemptor_prevent_a_second_preemption():
    quotas = [quota("a", 8), quota("b", 16)]
    nodes = [node(1), node(2)]
    run = [
        running(10, "b", gpu_ids(1, *range(8)), "low", stopping=True),
        running(11, "b", gpu_ids(2, *range(8)), "low", runtime=86400),
    ]
    result = run_plan(snapshot(nodes, quotas, [job(1, "a", gpus=8, cls="high")], run))
    assert result.preemptions == []
    assert result.pending[1].code == reasons.WAITING_FOR_PREEMPTION


def test_preemptor_starts_once_the_victims_are_gone():
    quotas = [quota("a", 8), quota("b", 8)]
    run = [running(10, "b", gpu_ids(1, *range(8)), "low", runtime=86400)]
    pending = [job(1, "a", gpus=8, cls="high")]
    first = run_plan(snapshot([node(1)], quotas, pending, run))
    assert _victims(first) == [10]
    after_grace = run_plan(snapshot([node(1)], quotas, pending, [], now=NOW + 30))
    assert [p.job_id for p in after_grace.placements] == [1]


def test_one_victim_is_not_given_to_two_preemptors():
    quotas = [quota("a", 16), quota("b", 8)]
    run = [running(10, "b", gpu_ids(1, *range(8)), "low", runtime=86400)]
    pending = [job(1, "a", gpus=8, cls="high"), job(2, "a", gpus=8, cls="high")]
    result = run_plan(snapshot([node(1)], quotas, pending, run))
    assert _victims(result) == [10]
    assert result.pending[1].code == reasons.WAITING_FOR_PREEMPTION
    assert result.pending[2].code != reasons.WAITING_FOR_PREEMPTION


def test_gpus_promised_to_an_earlier_job_are_not_preempted_for_a_later_one():
    # Job 1 (critical, not allowed to preempt) holds a reservation on node 1 for when the
    # low job ends; job 2 (high) must not preempt that low job.
    quotas = [quota("a", 16), quota("b", 8)]
    run = [running(10, "b", gpu_ids(1, *range(8)), "low", age=0, runtime=7200)]
    pending = [
        job(1, "a", gpus=8, cls="critical", can_preempt=False),
        job(2, "a", gpus=8, cls="high"),
    ]
    result = run_plan(snapshot([node(1)], quotas, pending, run))
    assert result.preemptions == []
    assert result.pending[1].code == reasons.WAITING_FOR_GPUS
    assert result.pending[1].estimated_start == NOW + 7200


# -- within-tenant priority preemption ------------------------------------------------------

LONG = 86400


def _handed_back(item, info):
    """The pending job as the dispatch loop passes it to the next cycle."""
    return dataclasses.replace(
        item,
        reserved_gpu_ids=info.reserved_gpu_ids,
        reserved_start=info.estimated_start if info.reserved_gpu_ids else None,
    )


def test_own_tenant_preemption_over_three_cycles():
    # DESIGN §6 (a) inside one tenant: nlp's guarantee is held by its own low job; a
    # high, non-preemptible job of nlp (it must fit the guarantee) preempts it.
    nodes, quotas = [node(1, gpus=4)], [quota("nlp", 4, 4)]
    low = running(10, "nlp", gpu_ids(1, 0, 1, 2, 3), "low", age=5000, runtime=LONG)
    high = job(1, "nlp", gpus=4, cls="high", preemptible=False)

    first = run_plan(snapshot(nodes, quotas, [high], [low]))
    (preemption,) = first.preemptions
    assert (preemption.victim_id, preemption.preemptor_id) == (10, 1)
    assert preemption.reason == reasons.PREEMPT_PRIORITY
    assert "class high, higher than low" in preemption.message
    info = first.pending[1]
    assert info.code == reasons.WAITING_FOR_PREEMPTION
    assert info.estimated_start == NOW + 30  # the victim's grace period
    assert info.reserved_gpu_ids == low.gpu_ids
    assert "quota" in info.message

    # The victim is stopping for the job: nothing more is preempted, the job waits.
    stopping = dataclasses.replace(low, stopping=True, preempted_by=1)
    second = run_plan(snapshot(nodes, quotas, [_handed_back(high, info)], [stopping], now=NOW + 10))
    assert second.preemptions == [] and second.placements == []
    assert second.pending[1].code == reasons.WAITING_FOR_PREEMPTION
    assert second.pending[1].reserved_gpu_ids == low.gpu_ids
    assert second.pending[1].estimated_start == NOW + 40

    # The victim is gone and requeued: the job starts inside the guarantee, the victim
    # waits for quota without preempting anything or taking the job's GPUs.
    requeued = job(10, "nlp", gpus=4, cls="low")
    pending = [_handed_back(high, second.pending[1]), requeued]
    third = run_plan(snapshot(nodes, quotas, pending, [], now=NOW + 40))
    assert [(p.job_id, p.gpu_ids, p.borrowed) for p in third.placements] == [
        (1, low.gpu_ids, False)
    ]
    assert third.preemptions == []
    assert third.pending[10].code == reasons.WAITING_FOR_QUOTA


def test_preemptible_job_frees_its_borrowing_limit_and_runs_borrowed():
    nodes, quotas = [node(1)], [quota("nlp", 4, 4)]
    run = [
        running(10, "nlp", gpu_ids(1, 0, 1, 2, 3), "low", age=5000, runtime=LONG),
        running(11, "nlp", gpu_ids(1, 4, 5, 6, 7), "low", borrowed=True, runtime=LONG),
    ]
    high = job(1, "nlp", gpus=4, cls="high")
    first = run_plan(snapshot(nodes, quotas, [high], run))
    assert _victims(first) == [11]
    run[1] = dataclasses.replace(run[1], stopping=True, preempted_by=1)
    second = run_plan(snapshot(nodes, quotas, [_handed_back(high, first.pending[1])], run))
    assert second.preemptions == []
    assert second.pending[1].code == reasons.WAITING_FOR_PREEMPTION
    third = run_plan(snapshot(nodes, quotas, [high], run[:1], now=NOW + 30))
    assert [(p.job_id, p.gpu_ids, p.borrowed) for p in third.placements] == [
        (1, gpu_ids(1, 4, 5, 6, 7), True)
    ]


def test_own_tenant_victims_in_victim_order():
    # Borrowed first, then the lowest class, then the most recently started.
    nodes, quotas = [node(1)], [quota("nlp", 6, 2)]
    run = [
        running(10, "nlp", gpu_ids(1, 0, 1), "normal", age=900, runtime=LONG),
        running(11, "nlp", gpu_ids(1, 2, 3), "low", age=5000, runtime=LONG),
        running(12, "nlp", gpu_ids(1, 4, 5), "low", age=100, runtime=LONG),
        running(13, "nlp", gpu_ids(1, 6, 7), "normal", borrowed=True, age=50, runtime=LONG),
    ]
    for gpus, victims in ((2, [13]), (4, [12, 13]), (6, [11, 12, 13])):
        result = run_plan(snapshot(nodes, quotas, [job(1, "nlp", gpus=gpus, cls="high")], run))
        assert _victims(result) == victims


def test_quota_victim_on_another_node_keeps_the_idle_gpus_usable():
    # The job lacks quota only; its own low job on node 1 frees quota and GPUs at once,
    # so it waits for those GPUs and node 2 stays free for others now.
    nodes = [node(1, gpus=4), node(2, gpus=4)]
    quotas = [quota("nlp", 4), quota("b", 4)]
    run = [running(10, "nlp", gpu_ids(1, 0, 1, 2, 3), "low", age=5000, runtime=LONG)]
    pending = [job(1, "nlp", gpus=4, cls="high", preemptible=False), job(2, "b", gpus=4)]
    result = run_plan(snapshot(nodes, quotas, pending, run))
    assert _victims(result) == [10]
    assert result.pending[1].reserved_gpu_ids == gpu_ids(1, 0, 1, 2, 3)
    assert [(p.job_id, p.node_ids) for p in result.placements] == [(2, (2,))]


def test_quota_held_by_a_stopping_job_waits_for_the_job_it_was_stopped_for():
    # Job 1 of nlp comes first (same class, older) but must not count on the quota of
    # the job stopped for job 2, nor on its GPUs.
    nodes = [node(1, gpus=4), node(2, gpus=4)]
    quotas = [quota("nlp", 4)]
    run = [
        running(10, "nlp", gpu_ids(1, 0, 1, 2, 3), "low", stopping=True, preempted_by=2),
    ]
    pending = [
        job(1, "nlp", gpus=4, cls="high", preemptible=False, can_preempt=False),
        job(2, "nlp", gpus=4, cls="high", preemptible=False),
    ]
    result = run_plan(snapshot(nodes, quotas, pending, run))
    assert result.preemptions == [] and result.placements == []
    assert result.pending[1].code == reasons.WAITING_FOR_QUOTA
    assert result.pending[2].code == reasons.WAITING_FOR_PREEMPTION
    assert result.pending[2].estimated_start == NOW + 30


def test_quota_of_a_stopping_job_serves_one_waiting_job_only():
    # Nobody stopped the job for anyone: the first waiting job takes its quota, the next
    # one waits for quota again.
    nodes = [node(1, gpus=4), node(2, gpus=4)]
    quotas = [quota("nlp", 4)]
    run = [running(10, "nlp", gpu_ids(1, 0, 1, 2, 3), "low", stopping=True)]
    pending = [
        job(1, "nlp", gpus=4, cls="high", preemptible=False),
        job(2, "nlp", gpus=4, cls="high", preemptible=False),
    ]
    result = run_plan(snapshot(nodes, quotas, pending, run))
    assert result.preemptions == []
    assert result.pending[1].code == reasons.WAITING_FOR_PREEMPTION
    assert result.pending[1].estimated_start == NOW + 30
    assert result.pending[2].code == reasons.WAITING_FOR_QUOTA


def test_own_job_holding_gpus_promised_to_an_earlier_job_is_not_preempted():
    # Job 1 (critical, may not preempt) holds a reservation on the low job's GPUs for
    # when it ends; job 2 lacks quota held by that low job but must not stop it.
    quotas = [quota("nlp", 4), quota("b", 8), quota("c", 8)]
    run = [
        running(10, "nlp", gpu_ids(1, 0, 1, 2, 3), "low", age=3000, runtime=3600),
        running(20, "b", gpu_ids(1, 4, 5, 6, 7), "normal", preemptible=False, runtime=LONG),
    ]
    pending = [
        job(1, "c", gpus=4, cls="critical", can_preempt=False),
        job(2, "nlp", gpus=4, cls="high", preemptible=False),
    ]
    result = run_plan(snapshot([node(1)], quotas, pending, run))
    assert result.preemptions == []
    assert result.pending[1].code == reasons.WAITING_FOR_GPUS
    assert result.pending[1].reserved_gpu_ids == gpu_ids(1, 0, 1, 2, 3)
    assert result.pending[2].code == reasons.WAITING_FOR_QUOTA


def test_multi_node_job_stops_own_jobs_on_every_node():
    nodes = [node(1), node(2), node(3)]
    quotas = [quota("nlp", 16)]
    run = [
        running(10, "nlp", gpu_ids(1, *range(8)), "low", age=5000, runtime=LONG),
        running(11, "nlp", gpu_ids(2, *range(8)), "normal", age=5000, runtime=LONG),
    ]
    pending = [job(1, "nlp", gpus=8, nodes=2, cls="critical")]
    result = run_plan(snapshot(nodes, quotas, pending, run))
    # 16 GPUs of quota needed: both jobs stop although node 3 is idle.
    assert _victims(result) == [10, 11]
    assert result.pending[1].code == reasons.WAITING_FOR_PREEMPTION


def test_inside_its_guarantee_after_the_stops_a_job_may_take_lower_jobs_of_others():
    # nlp's own low job frees 2 GPUs of quota and GPUs on node 1; 2 more GPUs must come
    # from b's guaranteed low job there. A non-preemptible job runs inside nlp's
    # guarantee once its own job is gone, so it may; a preemptible one would borrow
    # (guarantee 2 + borrowing 2), and a borrower never takes guaranteed GPUs of others.
    nodes = [node(1, gpus=4), node(2, gpus=4)]
    run = [
        running(10, "nlp", gpu_ids(1, 0, 1), "low", runtime=LONG),
        running(21, "b", gpu_ids(1, 2, 3), "low", runtime=LONG),
        running(20, "b", gpu_ids(2, 0, 1, 2, 3), "low", runtime=LONG),
    ]
    inside = [quota("nlp", 4), quota("b", 8)]
    result = run_plan(snapshot(nodes, inside, [job(1, "nlp", gpus=4, cls="critical")], run))
    assert {p.victim_id: p.reason for p in result.preemptions} == {10: "priority", 21: "priority"}

    borrowing = [quota("nlp", 2, 2), quota("b", 8)]
    result = run_plan(snapshot(nodes, borrowing, [job(1, "nlp", gpus=4, cls="high")], run))
    assert result.preemptions == []
    assert result.pending[1].code == reasons.WAITING_FOR_QUOTA


def test_no_own_tenant_preemption_for_quota_earlier_jobs_count_on():
    # Job 1 (same class, earlier, may not preempt) waits for the quota job 11 frees when
    # it ends; job 2 could only start once job 1 is done as well, so stopping both low
    # jobs now would gain it nothing yet.
    run = [
        running(10, "a", gpu_ids(1, 0), "low", age=100, runtime=0),
        running(11, "a", gpu_ids(1, 1), "low", age=5000, runtime=LONG),
    ]
    pending = [
        job(1, "a", gpus=1, preemptible=False, can_preempt=False, runtime=3600),
        job(2, "a", gpus=2, preemptible=False, can_preempt=True),
    ]
    result = run_plan(snapshot([node(1, gpus=2)], [quota("a", 2)], pending, run))
    assert result.preemptions == []
    assert result.pending[2].code == reasons.WAITING_FOR_QUOTA


# -- GPUs freed by a preemption stay with the preemptor -------------------------------------


def _handed_back_with_claims(item, info):
    return dataclasses.replace(_handed_back(item, info), claimed_gpu_ids=info.claimed_gpu_ids)


def test_reclaimed_gpus_are_not_taken_back_by_the_requeued_victim():
    # Tenant b borrows node 1 with a normal job; tenant a, below its guarantee, reclaims it
    # with a low job. Once the victim is back in the queue it comes first (higher class),
    # but the GPUs it freed are claimed for job 1 until job 1's turn: no storm.
    quotas = [quota("a", 8), quota("b", 0, borrow=8)]
    victim = running(10, "b", gpu_ids(1, *range(8)), "normal", borrowed=True, runtime=LONG)
    reclaimer = job(1, "a", gpus=8, cls="low")
    first = run_plan(snapshot([node(1)], quotas, [reclaimer], [victim]))
    assert [(p.victim_id, p.reason) for p in first.preemptions] == [(10, "reclaim")]
    info = first.pending[1]
    assert info.code == reasons.WAITING_FOR_PREEMPTION
    assert sorted(info.claimed_gpu_ids) == list(gpu_ids(1, *range(8)))

    requeued = job(10, "b", gpus=8, cls="normal", submitted=NOW - 5000)
    pending = [_handed_back_with_claims(reclaimer, info), requeued]
    after = run_plan(snapshot([node(1)], quotas, pending, [], now=NOW + 30))
    assert [p.job_id for p in after.placements] == [1]
    assert after.pending[10].code != reasons.WAITING_FOR_PREEMPTION


def test_without_the_claim_the_requeued_victim_would_take_the_gpus_back():
    # The same cycle when the dispatch loop forgot the claim (cache flushed): the victim,
    # ordered first, borrows the idle node again. This is the loop the claim prevents.
    quotas = [quota("a", 8), quota("b", 0, borrow=8)]
    pending = [
        job(1, "a", gpus=8, cls="low"),
        job(10, "b", gpus=8, cls="normal", submitted=NOW - 5000),
    ]
    after = run_plan(snapshot([node(1)], quotas, pending, [], now=NOW + 30))
    assert [p.job_id for p in after.placements] == [10]


def test_claimed_gpus_idle_again_start_their_job_after_a_same_size_job_found_none():
    # Job 1 (tenant b, 8 GPUs) comes first and finds no idle node: node 1 is claimed for
    # job 2, whose victims have stopped. At job 2's turn the claimed GPUs are idle again
    # and job 2 starts there. (Once, the slice remembered that 8 GPUs on one node did
    # not fit now for jobs ending as late as job 1's, GPUs freed since or not: job 2 was
    # told its GPUs were reserved for other jobs and lost its claim to job 1.)
    quotas = [quota("a", 8), quota("b", 8)]
    claimer = dataclasses.replace(job(2, "a", gpus=8), claimed_gpu_ids=gpu_ids(1, *range(8)))
    first = job(1, "b", gpus=8)
    result = run_plan(
        snapshot([node(1)], quotas, [first, claimer], [], fair_share=False, size_order=False)
    )
    assert [(p.job_id, p.node_ids) for p in result.placements] == [(2, (1,))]
    assert result.pending[1].code == reasons.WAITING_FOR_GPUS
    # It is told it starts when job 2, started on the claimed GPUs, reaches its limit.
    assert result.pending[1].estimated_start == NOW + 3600


def test_a_stale_claim_on_busy_gpus_is_ignored():
    quotas = [quota("a", 8), quota("b", 8)]
    busy = running(11, "b", gpu_ids(1, *range(8)), "normal", runtime=LONG)
    claimer = dataclasses.replace(job(1, "a", gpus=8), claimed_gpu_ids=gpu_ids(1, *range(8)))
    result = run_plan(snapshot([node(1), node(2)], quotas, [claimer], [busy]))
    assert [(p.job_id, p.node_ids) for p in result.placements] == [(1, (2,))]


def test_a_claim_the_job_cannot_use_is_dropped():
    # Job 1 claims node 1 but its quota is now taken by its tenant's running job: it
    # waits for quota, reports no claim, and the idle node goes to job 2.
    quotas = [quota("a", 8), quota("b", 8)]
    own = running(11, "a", gpu_ids(2, *range(8)), "normal", runtime=LONG)
    claimer = dataclasses.replace(job(1, "a", gpus=8), claimed_gpu_ids=gpu_ids(1, *range(8)))
    other = job(2, "b", gpus=8, cls="low")
    result = run_plan(snapshot([node(1), node(2)], quotas, [claimer, other], [own]))
    assert [p.job_id for p in result.placements] == [2]
    assert result.pending[1].code == reasons.WAITING_FOR_QUOTA
    assert result.pending[1].claimed_gpu_ids == ()


def test_no_reclaim_for_a_guarantee_promised_to_an_earlier_job_of_the_tenant():
    # Tenant a (guarantee 3) runs one GPU; its job 1 (2 GPUs on one node) waits for b's
    # job 12 to end, with a reservation that promises a's other two guaranteed GPUs.
    # Job 2 (1 GPU) fits the guarantee by usage only: it must not reclaim b's borrowed
    # GPU, since it could not run inside the guarantee anyway.
    quotas = [quota("a", 3, borrow=5), quota("b", 2, borrow=2)]
    run = [
        running(10, "a", gpu_ids(1, 0), "normal", runtime=LONG),
        running(11, "b", gpu_ids(1, 1), "normal", borrowed=True, age=5000, runtime=LONG),
        running(12, "b", gpu_ids(1, 2, 3), "normal", age=0, runtime=600),
    ]
    pending = [job(1, "a", gpus=2, runtime=LONG), job(2, "a", gpus=1, cls="low", runtime=LONG)]
    result = run_plan(snapshot([node(1, gpus=4)], quotas, pending, run))
    assert result.pending[1].estimated_start == NOW + 600
    assert result.preemptions == []
    assert result.pending[2].code != reasons.WAITING_FOR_PREEMPTION


def job_behind_a_blocked_head():
    """Job 1 (tenant c, 8 GPUs) waits an hour for node 1; job 2 (tenant a, one GPU of its
    guarantee) comes after it and could reclaim b's borrowed job 21 on node 2 (job 22 is
    too young to stop). Returns nodes, quotas, pending and running jobs."""
    nodes = [node(1), node(2)]
    quotas = [quota("a", 2), quota("b", 8, 8), quota("c", 8)]
    run = [
        running(10, "b", gpu_ids(1, *range(8)), age=0, min_runtime=300),
        running(20, "a", gpu_ids(2, 0)),
        running(21, "b", gpu_ids(2, 1), borrowed=True, runtime=36000),
        running(22, "b", gpu_ids(2, *range(2, 8)), borrowed=True, age=10, min_runtime=300),
    ]
    return nodes, quotas, [job(1, "c", gpus=8), job(2, "a")], run


def test_without_backfill_nobody_preempts_for_a_job_behind_the_blocked_head():
    """Without backfill job 2 cannot start before job 1 (blocked: it waits an hour for
    node 1), so reclaiming b's borrowed GPU for it now would only cost b its work. With
    backfill the same reclaim gets job 2 running in 30 s."""
    nodes, quotas, pending, run = job_behind_a_blocked_head()

    strict = run_plan(
        snapshot(nodes, quotas, pending, run, backfill=False, fair_share=False, size_order=False)
    )
    assert strict.preemptions == []
    assert strict.pending[1].estimated_start == NOW + 3600
    assert strict.pending[2].estimated_start >= NOW + 3600

    relaxed = run_plan(snapshot(nodes, quotas, pending, run, fair_share=False, size_order=False))
    assert [p.victim_id for p in relaxed.preemptions] == [21]


def _quota_due_after_the_victims(grace: int):
    """Tenant a (2 GPUs guaranteed) runs nothing. Its job 1 (training, cannot stop the
    inference jobs) is promised node 1's first GPU at NOW + 1000 and one unit of a's
    quota until NOW + 2000. Its job 2 (inference, 2 GPUs) could reclaim the borrowed
    jobs 20 and 21 on node 2, but a's quota has room for it only from NOW + 2000."""
    nodes = [node(1, gpus=2), node(2, gpus=2)]
    quotas = [quota("a", 2), quota("b", 0, borrow=4)]
    inference = {"borrowed": True, "workload": "inference"}
    run = [
        running(10, "b", gpu_ids(1, 0), age=600, runtime=1600, **inference),
        running(11, "b", gpu_ids(1, 1), age=600, runtime=30_600, **inference),
        running(20, "b", gpu_ids(2, 0), runtime=30_600, grace=grace, **inference),
        running(21, "b", gpu_ids(2, 1), runtime=30_600, grace=grace, **inference),
    ]
    pending = [
        job(1, "a", runtime=1000),
        job(2, "a", gpus=2, workload="inference", runtime=3600),
    ]
    return run_plan(snapshot(nodes, quotas, pending, run))


def test_a_reclaim_whose_quota_is_due_only_after_its_victims_are_gone_waits():
    """Stopping jobs 20 and 21 now would leave their GPUs idle from NOW + 30 until a's
    quota is due: job 2 stops nobody yet (it would once the quota is due by the time
    victims are gone)."""
    result = _quota_due_after_the_victims(grace=30)
    assert result.pending[1].estimated_start == NOW + 1000
    assert result.preemptions == []
    assert result.pending[2].code != reasons.WAITING_FOR_PREEMPTION
    assert result.pending[2].estimated_start == NOW + 30_000


def test_a_reclaim_whose_quota_is_due_by_the_end_of_the_grace_period_preempts():
    result = _quota_due_after_the_victims(grace=3000)
    assert _victims(result) == [20, 21]
    info = result.pending[2]
    assert info.code == reasons.WAITING_FOR_PREEMPTION
    assert info.estimated_start == NOW + 3000
