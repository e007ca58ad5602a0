"""Tiny traces whose FIFO and backfill schedules are computed by hand.

All on one node of 4 GPUs, planned at the exact time of every event (dispatch interval
0) unless a test says otherwise; each job declares its real duration as its limit.
"""

from dataclasses import replace

import pytest

from scheduling.simulator import ClassSpec, SimConfig, replay
from scheduling.simulator.metrics import summarize, tail_by_class, wait_by_class, wait_by_size
from scheduling.simulator.simulation import COMPLETED, Replay

from .conftest import ANY_GAIN, scenario, sim_job

EXACT = SimConfig(dispatch_interval=0)
# The schedules below are worked out in submit order inside a class (the size-aware
# order has its own hand-computed test at the end).
SUBMIT_ORDER = {
    name: replace(policy, size_order=False) if not policy.global_fifo else policy
    for name, policy in ANY_GAIN.items()
}


def starts(result) -> dict[str, float]:
    return {run.job.name: run.first_start for run in result.runs}


def test_brief_example_no_gpu_is_idle_before_a_ends_so_backfill_changes_nothing():
    # A holds all 4 GPUs until 100; at 100 B (submitted before C) takes all 4 until 200:
    # C (1 GPU, 50 s) finds no idle GPU before 200 under any policy.
    jobs = [sim_job(1, 0, 100, 4), sim_job(2, 1, 100, 4), sim_job(3, 2, 50, 1)]
    for policy in ("fifo", "sluice", "sluice-no-backfill"):
        result = replay(scenario(jobs), SUBMIT_ORDER[policy], EXACT)
        assert starts(result) == {"job1": 0, "job2": 100, "job3": 200}, policy
        assert summarize(result)["makespan_s"] == 250


# A: 2 GPUs 0-100. B: 4 GPUs, submitted at 1, must wait for A. C: 1 GPU for 50 s at 2:
# fits the 2 idle GPUs and ends (52) before B's reservation (100), so backfill starts it
# at once. D: 1 GPU for 200 s at 3 would end after B's start: it waits for B.
BACKFILL_TRACE = [
    sim_job(1, 0, 100, 2),
    sim_job(2, 1, 100, 4),
    sim_job(3, 2, 50, 1),
    sim_job(4, 3, 200, 1),
]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("fifo", {"job1": 0, "job2": 100, "job3": 200, "job4": 200}),
        ("sluice-no-backfill", {"job1": 0, "job2": 100, "job3": 200, "job4": 200}),
        ("sluice", {"job1": 0, "job2": 100, "job3": 2, "job4": 200}),
    ],
)
def test_backfill_starts_a_short_job_in_the_hole_before_a_reservation(policy, expected):
    result = replay(scenario(BACKFILL_TRACE), SUBMIT_ORDER[policy], EXACT)

    assert starts(result) == expected
    waits = {run.job.name: run.first_wait for run in result.runs}
    assert waits == {name: expected[name] - submit for name, submit in _submits().items()}
    assert all(run.outcome == COMPLETED for run in result.runs)


def _submits() -> dict[str, float]:
    return {job.name: job.submit for job in BACKFILL_TRACE}


def test_figures_of_the_backfill_schedule():
    summary = summarize(replay(scenario(BACKFILL_TRACE), SUBMIT_ORDER["sluice"], EXACT))

    # waits 0, 99, 0, 197; completions 100, 199, 50, 397
    assert summary["wait_avg_s"] == pytest.approx((0 + 99 + 0 + 197) / 4)
    assert summary["wait_p50_s"] == pytest.approx(49.5)
    assert summary["jct_avg_s"] == pytest.approx((100 + 199 + 50 + 397) / 4)
    assert summary["makespan_s"] == 400
    busy = 2 * 100 + 4 * 100 + 1 * 50 + 1 * 200
    assert summary["utilization"] == pytest.approx(busy / (4 * 400))
    assert summary["preemptions"] == 0


def test_cycles_are_coalesced_on_the_dispatch_interval():
    # With the default 5 s interval, C (submitted at 2) is planned at the tick of 5.
    result = replay(
        scenario(BACKFILL_TRACE), SUBMIT_ORDER["sluice"], SimConfig(dispatch_interval=5)
    )

    assert starts(result) == {"job1": 0, "job2": 100, "job3": 5, "job4": 200}


def test_a_job_longer_than_its_limit_is_killed_at_the_limit():
    jobs = [sim_job(1, 0, 500, 1, limit=300), sim_job(2, 0, 100, 4)]
    result = replay(scenario(jobs), ANY_GAIN["fifo"], EXACT)
    by_name = {run.job.name: run for run in result.runs}

    assert by_name["job1"].outcome == "timed_out"
    assert by_name["job1"].finish == 300
    assert by_name["job2"].first_start == 300
    assert summarize(result)["timed_out"] == 1


def test_a_preempted_job_loses_the_work_since_its_checkpoint_and_is_requeued():
    # L (low, 4 GPUs, 1000 s) runs from 0; H (high, may preempt) arrives at 700: L stops
    # after its 5 s grace at 705, keeps its checkpoint of 600 s, and is requeued with
    # 400 s of work; H runs 705-805, then L 805-1205.
    jobs = [sim_job(1, 0, 1000, 4, cls="low"), sim_job(2, 700, 100, 4, cls="high")]
    result = replay(
        scenario(jobs), ANY_GAIN["sluice"], SimConfig(dispatch_interval=0, checkpoint_interval=600)
    )
    low, high = result.runs

    assert high.first_start == 705
    assert low.preemptions == 1
    assert low.lost_gpu_seconds == 4 * 105
    assert [(start, end) for start, end, _ in low.attempts] == [(0, 705), (805, 1205)]
    assert low.finish == 1205 and low.outcome == COMPLETED
    assert summarize(result)["lost_gpu_hours"] == pytest.approx(4 * 105 / 3600)


def test_waits_by_class_count_the_victims_rewait_against_its_class():
    # The preemption above: H (high) waits 700-705 for L's grace; L (low) waits again
    # 705-805 while H runs. Two started jobs: each second waited adds 1/2 s to the average.
    jobs = [sim_job(1, 0, 1000, 4, cls="low"), sim_job(2, 700, 100, 4, cls="high")]
    result = replay(
        scenario(jobs), ANY_GAIN["sluice"], SimConfig(dispatch_interval=0, checkpoint_interval=600)
    )
    by_class = wait_by_class(result)
    per_job = 2 * 3600

    assert list(by_class) == ["low", "high"]  # the class that carries most first
    assert by_class["low"] == {
        "jobs": 1,
        "first_wait_h": 0.0,
        "rewait_h": round(100 / 3600, 3),
        "preemptions": 1,
        "longest_h": round(100 / 3600, 1),
        "over_day": 0,
        "of_average_h": round(100 / per_job, 4),
        "by_size_h": {"2-4": round(100 / per_job, 4)},
    }
    assert by_class["high"]["first_wait_h"] == round(5 / 3600, 3)
    assert by_class["high"]["preemptions"] == 0
    assert by_class["high"]["of_average_h"] == round(5 / per_job, 4)
    total = sum(figures["of_average_h"] for figures in by_class.values())
    assert total == pytest.approx(summarize(result)["wait_avg_s"] / 3600, abs=1e-4)
    assert tail_by_class(result) == {
        "high": {"longest_h": 0.0, "over_day": 0},
        "low": {"longest_h": 0.0, "over_day": 0},
    }


def test_the_tail_by_class_counts_the_jobs_past_a_day():
    # One node of 4: A (4 GPUs, 30 h) runs first; B (low, 4 GPUs) waits 30 h, C (high,
    # 1 GPU, arriving 1 h later) 29 h.
    jobs = [
        sim_job(1, 0, 30 * 3600, 4, cls="normal"),
        sim_job(2, 10, 3600, 4, cls="low"),
        sim_job(3, 3610, 3600, 1, cls="high"),
    ]
    result = replay(scenario(jobs), ANY_GAIN["fifo"], SimConfig(dispatch_interval=0))
    tail = tail_by_class(result)
    assert tail["normal"] == {"longest_h": 0.0, "over_day": 0}
    assert tail["low"]["over_day"] == 1 and tail["low"]["longest_h"] >= 29.9
    assert tail["high"]["over_day"] == 1 and tail["high"]["longest_h"] >= 24.0
    assert wait_by_class(result)["low"]["over_day"] == 1


def test_a_job_arriving_before_its_victim_may_be_preempted_preempts_it_when_it_may():
    # L (low, 4 GPUs, 1000 s) starts at 0; H (high) arrives at 100, when L is too young
    # to be preempted (300 s minimum): the cycle is skipped, but the replay comes back
    # at 300 and H runs from 305 (5 s grace), not when L ends at 1000.
    jobs = [sim_job(1, 0, 1000, 4, cls="low"), sim_job(2, 100, 100, 4, cls="high")]
    result = replay(scenario(jobs), ANY_GAIN["sluice"], EXACT)

    assert starts(result) == {"job1": 0, "job2": 305}
    assert result.runs[0].preemptions == 1


def test_fifo_never_preempts():
    jobs = [sim_job(1, 0, 1000, 4, cls="low"), sim_job(2, 700, 100, 4, cls="high")]
    result = replay(scenario(jobs), ANY_GAIN["fifo"], EXACT)

    assert starts(result) == {"job1": 0, "job2": 1000}
    assert summarize(result)["preemptions"] == 0


def test_a_job_that_can_never_start_is_set_aside():
    jobs = [sim_job(1, 0, 100, 8), sim_job(2, 0, 100, 1)]  # 8 GPUs on a 4-GPU node
    result = replay(scenario(jobs), ANY_GAIN["sluice"], EXACT)
    by_name = {run.job.name: run for run in result.runs}

    assert by_name["job1"].outcome == "unschedulable"
    assert by_name["job1"].code == "NO_MATCHING_NODES"
    assert by_name["job2"].first_start == 0


class _Timed(Replay):
    """A replay that notes when it planned."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.planned_at: list[float] = []

    def _cycle(self, pool, now, selected):
        self.planned_at.append(now)
        return super()._cycle(pool, now, selected)


def test_the_replay_comes_back_when_a_job_that_may_be_stopped_comes_of_age_only():
    # One node of 4 GPUs. L (low, 2 GPUs) runs from 0, C (critical: not preemptible,
    # 2 GPUs) from 10; H (high, 4 GPUs) arrives at 100, when L is too young to be
    # preempted. The replay comes back at 300, when L may be: H still cannot free 4 GPUs
    # (C may not be stopped), so nothing happens. At 310 C comes of age, but nobody may
    # stop it: no cycle then. At 5010 C ends: H preempts L and runs from 5015.
    jobs = [
        sim_job(1, 0, 10_000, 2, cls="low"),
        sim_job(2, 10, 5000, 2, cls="critical"),
        sim_job(3, 100, 1000, 4, cls="high"),
    ]
    world = scenario(jobs)
    world.classes["critical"] = ClassSpec("critical", 800, preemptible=False)
    timed = _Timed(world, ANY_GAIN["sluice"], EXACT)
    result = timed.run()

    assert starts(result) == {"job1": 0, "job2": 10, "job3": 5015}
    assert 300 in timed.planned_at and 310 not in timed.planned_at
    assert timed.planned_at == sorted(set(timed.planned_at))
    assert 100 not in timed.planned_at  # L too young: the cycle was not worth it


def test_smaller_work_goes_first_inside_a_class():
    # The brief example in Sluice's own order: when A ends at 100, C (1 GPU x 50 s) is
    # smaller than B (4 GPUs x 100 s), submitted a second later or not: C starts at 100 and
    # B, which needs every GPU, at 150. With and without backfill (C is ahead of B).
    jobs = [sim_job(1, 0, 100, 4), sim_job(2, 1, 100, 4), sim_job(3, 2, 50, 1)]
    for policy in ("sluice", "sluice-no-backfill"):
        result = replay(scenario(jobs), ANY_GAIN[policy], EXACT)
        assert starts(result) == {"job1": 0, "job2": 150, "job3": 100}, policy
    # Aged past its maximum wait, B goes first again.
    patient = replace(ANY_GAIN["sluice"], max_wait_seconds=50.0)
    assert starts(replay(scenario(jobs), patient, EXACT)) == {"job1": 0, "job2": 100, "job3": 200}


def test_wait_reasons_split_each_wait_by_the_engines_reason():
    # The backfill schedule above: B (4 GPUs) waits for A's GPUs from 1 to 100, D (1 GPU,
    # 200 s) waits behind B's reservation until B starts (3 to 100), then for B's GPUs
    # (100 to 200). B's arrival at 1 plans nothing (nothing could start: the cycle is
    # skipped), so its first second has no reason: UNPLANNED.
    policy = SUBMIT_ORDER["sluice"]
    plain = replay(scenario(BACKFILL_TRACE), policy, EXACT)
    result = replay(scenario(BACKFILL_TRACE), policy, replace(EXACT, wait_reasons=True))

    assert starts(result) == starts(plain)
    assert plain.wait_reasons == {}
    assert result.wait_reasons == {
        ("2-4", "WAITING_FOR_GPUS"): 98.0,
        ("1", "RESERVED_FOR_HIGHER_PRIORITY"): 97.0,
        ("1", "WAITING_FOR_GPUS"): 100.0,
    }
    by_size = wait_by_size(result)
    per_job = 4 * 3600  # hours per started job of the replay
    assert by_size["1"]["jobs"] == 2
    assert by_size["1"]["of_average_h"] == pytest.approx(197 / per_job, abs=1e-4)
    assert by_size["1"]["first_wait_h"] == pytest.approx(197 / 2 / 3600, abs=1e-3)
    assert by_size["1"]["reasons_h"] == {
        "WAITING_FOR_GPUS": round(100 / per_job, 4),
        "RESERVED_FOR_HIGHER_PRIORITY": round(97 / per_job, 4),
        "UNPLANNED": 0.0,
    }
    assert by_size["2-4"]["reasons_h"] == {
        "WAITING_FOR_GPUS": round(98 / per_job, 4),
        "UNPLANNED": round(1 / per_job, 4),
    }
    assert by_size["1"]["gpu_hours_share"] + by_size["2-4"]["gpu_hours_share"] == pytest.approx(
        1.0, abs=1e-3
    )
    assert "reasons_h" not in wait_by_size(plain)["1"]


def test_the_tail_counts_the_jobs_that_waited_more_than_a_day():
    # One 4-GPU node under FIFO: job1 holds it for 30 h, job2 (4 GPUs) waits 30 h - 10 s
    # behind it, job3 (1 GPU, 1 h) 31 h - 20 s behind both.
    jobs = [
        sim_job(1, 0, 30 * 3600, 4),
        sim_job(2, 10, 3600, 4),
        sim_job(3, 20, 3600, 1),
    ]
    result = replay(scenario(jobs), ANY_GAIN["fifo"], EXACT)
    summary = summarize(result)

    waits = [30 * 3600 - 10, 31 * 3600 - 20]
    assert summary["wait_max_s"] == pytest.approx(waits[1])
    assert summary["waited_over_day"] == 2
    assert summary["big_waited_over_day"] == 0  # none over 8 GPUs
    assert summary["wait_beyond_day_s"] == pytest.approx(sum(w - 86400 for w in waits) / 3)
    by_size = wait_by_size(result)
    assert by_size["2-4"]["over_day"] == 1 and by_size["1"]["over_day"] == 1
    assert by_size["1"]["longest_h"] == pytest.approx(waits[1] / 3600, abs=1e-3)
    assert by_size["2-4"]["longest_h"] == pytest.approx(waits[0] / 3600, abs=1e-3)


def test_the_tail_of_jobs_over_8_gpus_is_counted_apart():
    # Three 4-GPU nodes: two 12-GPU gangs one after the other; the second waits 25 h.
    jobs = [sim_job(1, 0, 25 * 3600, 4, nodes=3), sim_job(2, 5, 3600, 4, nodes=3)]
    summary = summarize(replay(scenario(jobs, nodes=3), ANY_GAIN["fifo"], EXACT))

    assert summary["wait_max_s"] == pytest.approx(25 * 3600 - 5)
    assert summary["waited_over_day"] == summary["big_waited_over_day"] == 1


def test_a_replay_without_a_long_wait_has_no_tail():
    summary = summarize(replay(scenario(BACKFILL_TRACE), SUBMIT_ORDER["sluice"], EXACT))

    assert summary["wait_max_s"] == pytest.approx(197)
    assert summary["waited_over_day"] == 0
    assert summary["wait_beyond_day_s"] == 0
