"""The victim search is not made where no preemption could pay
(``Preempting.may_pay``: waiting starts the job by now + 1 s + the minimum
gain; ``Preempting.preempt``: without backfill, behind a blocked job that starts after
every victim would be gone): the cycles decide and explain as with every search made."""

import dataclasses

from engine_builders import NOW, gpu_ids, job, node, quota, running, snapshot
from hypothesis import given
from hypothesis import strategies as st
from test_preemption import job_behind_a_blocked_head
from test_properties import (
    FAST,
    Requeueing,
    assert_shortcut_plans_alike,
    crowded_tenants,
    snapshots,
)

from scheduling.engine import KeptCluster, QueueInfo, reasons
from scheduling.engine.planner import Planner


@FAST
@given(
    st.one_of(snapshots(), crowded_tenants()),
    st.sampled_from([0.0, 60.0, 1800.0, 7200.0]),
    st.data(),
)
def test_skipped_searches_plan_as_made_ones(snap, gain, data):
    """Through starts, preemptions, stops and requeues, with each reservation handed
    back to the next cycle, full and decisions-only cycles plan alike with and without
    the searches that cannot pay, whatever the minimum gain."""
    keep = KeptCluster()
    sim = Requeueing(dataclasses.replace(snap, preemption_min_gain_seconds=gain))
    for pause in (1, 60, 60, 600, 60):
        assert_shortcut_plans_alike(sim, keep, "always_search")
        sim.step()
        sim.next_event()
        sim.advance(sim.snap.now + pause)
        if data.draw(st.booleans()):
            sim.advance(sim.snap.now + data.draw(st.sampled_from([300, 3600])))


def test_no_search_where_waiting_is_within_the_gain():
    """Job 10 ends by its limit in 20 minutes: with a 30-minute gain no search is made
    (no victim heap built), with 10 minutes it is, and preempts."""
    quotas = [quota("a", 8), quota("b", 8)]
    run = [running(10, "b", gpu_ids(1, *range(8)), "low", age=2400, runtime=3600)]
    pending = [job(1, "a", gpus=8, cls="high")]
    for gain, searched in ((1800, False), (600, True)):
        snap = snapshot([node(1)], quotas, pending, run, preemption_min_gain_seconds=gain)
        for always_search in (False, True):
            planner = Planner(snap)
            planner.always_search = always_search
            result = planner.run()
            assert bool(planner.preempting.victims._heaps) == (searched or always_search)
            assert bool(result.preemptions) == searched
            if not searched:
                assert result.pending[1].code == reasons.WAITING_FOR_GPUS


def test_no_search_behind_a_blocked_job_of_a_pool_without_backfill():
    """Without backfill job 2 starts after job 1, which is blocked until NOW + 3600: a
    victim stopped for job 2 now would be gone long before then, so no search is made for
    it (no victim heap for its size); searching anyway decides and explains the same."""
    nodes, quotas, pending, run = job_behind_a_blocked_head()
    snap = snapshot(nodes, quotas, pending, run, backfill=False, fair_share=False, size_order=False)
    results = []
    for always_search in (False, True):
        planner = Planner(snap)
        planner.always_search = always_search
        results.append(planner.run())
        one_gpu_heaps = [key for key in planner.preempting.victims._heaps if key[1] == 1]
        assert bool(one_gpu_heaps) == always_search
    shortcut, plain = results
    assert shortcut.preemptions == plain.preemptions == []
    assert shortcut.pending == plain.pending
    assert shortcut.pending[2].estimated_start >= NOW + 3600


def test_behind_a_blocked_job_reserved_now_the_shortcut_preempts_as_the_search_does():
    """The example hypothesis found (no backfill; every job without a runtime limit):
    tenant a's high job 2 (not preemptible) had reserved node 0 from now; a's normal
    job 1 (may preempt) comes behind it; b's low job 1001 runs on node 1 for a day.
    Job 2 once never started (an unlimited job found no idle node) and searched for
    victims in vain, which marked the search hopeless for job 1 with every search made,
    not with the shortcut: now job 2 starts on node 0, and both ways plan alike."""
    quotas = [quota("a", 4, borrow=4), quota("b", 0)]
    victim = running(1001, "b", gpu_ids(1, 0, 1, 2, 3), "low", age=11, runtime=86400, grace=0)
    blocked = dataclasses.replace(
        job(2, "a", gpus=4, cls="high", runtime=0, submitted=NOW),
        reserved_gpu_ids=gpu_ids(0, 0, 1, 2, 3),
        reserved_start=NOW + 1,
        previous_position=1,
    )
    behind = dataclasses.replace(
        job(1, "a", gpus=4, cls="normal", runtime=0, submitted=NOW, can_preempt=True),
        previous_position=2,
    )
    later = job(1000, "a", gpus=4, cls="low", runtime=0, models=("H100",), submitted=NOW + 1)
    nodes = [node(0, gpus=4), node(1, gpus=4)]
    snap = snapshot(
        nodes,
        quotas,
        [behind, blocked, dataclasses.replace(later, preemptible=False)],
        [victim],
        queues=[QueueInfo(1, "open", "a")],
        usage={"a": 4.0, "b": 4.0},
        now=NOW + 1,
        backfill=False,
        fair_share=False,
    )
    plans = []
    for always_search in (False, True):
        planner = Planner(snap)
        planner.always_search = always_search
        plans.append(planner.run())
    shortcut, plain = plans
    assert [p.job_id for p in shortcut.placements] == [p.job_id for p in plain.placements] == [2]
    assert shortcut.preemptions == plain.preemptions
    assert shortcut.pending == plain.pending


def test_a_search_that_needed_no_victims_does_not_stop_a_later_one():
    """Without backfill, job 1 (8 GPUs, may not preempt) is blocked until node 1's job 10 ends in 100 s,
    and the jobs behind it start no sooner. Job 2 (one GPU, may preempt) finds node 2's
    idle GPU enough: its search needs no victims, and that GPU is planned for it from
    then. Job 3, of the same size, class and tenant, then needs a victim: b's job 21,
    borrowed on node 2 (grace 600 s, a day to run), is reclaimed for it. A search that needed no victims is
    no failed one (the same search could not be skipped for job 3 as hopeless)."""
    nodes = [node(1), node(2)]
    quotas = [quota("a", 8), quota("b", 0, 8), quota("c", 16)]
    run = [
        running(10, "c", gpu_ids(1, *range(8)), age=3500, runtime=3600),
        running(21, "b", gpu_ids(2, *range(1, 8)), "low", borrowed=True, runtime=86400, grace=600),
    ]
    pending = [
        job(1, "c", gpus=8, cls="high", can_preempt=False, submitted=NOW - 30),
        job(2, "a", cls="high", submitted=NOW - 20),
        job(3, "a", cls="high", submitted=NOW - 10),
    ]
    snap = snapshot(nodes, quotas, pending, run, backfill=False, fair_share=False, size_order=False)
    for always_search in (False, True):
        planner = Planner(snap)
        planner.always_search = always_search
        result = planner.run()
        assert result.placements == []
        assert result.pending[1].estimated_start == NOW + 100
        assert result.pending[2].estimated_start == NOW + 100
        assert [(p.victim_id, p.preemptor_id) for p in result.preemptions] == [(21, 3)]
        assert result.pending[3].code == reasons.WAITING_FOR_PREEMPTION
        assert result.pending[3].estimated_start == NOW + 600
