"""Victim choice, and what happens in the cycles after a preemption."""

from engine_builders import NOW, gpu_ids, job, node, quota, run_plan, running, snapshot

from scheduling.engine import reasons


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
