"""Preemption churn in a replay: the limit per job and its protection, the minimum
runtime between preemptions, checkpoints handed to the engine, and re-waits counted in
the waits."""

import pytest

from scheduling.engine import QuotaInfo
from scheduling.runtime_rule import HISTORY_JOBS
from scheduling.simulator import POLICIES, SimConfig, WorkloadSpec, replay
from scheduling.simulator.metrics import per_tenant, summarize
from scheduling.simulator.simulation import RuntimeLearner

from .conftest import ANY_GAIN, POOL, scenario, sim_job
from .test_replay_invariants import busy_trace

EXACT = SimConfig(dispatch_interval=0)


def _policy(max_preemptions: int, protection: int = 0) -> dict[str, WorkloadSpec]:
    return {
        "": WorkloadSpec(
            preemptible=True,
            grace_seconds=5,
            min_runtime_before_preemption=300,
            max_preemptions=max_preemptions,
            preemption_protection_seconds=protection,
        )
    }


def _stream(every: float, count: int, max_preemptions: int, protection: int = 0):
    """A low 4-GPU job of 10,000 s from 0 on a 4-GPU node, and ``count`` high 4-GPU jobs
    of 100 s (their class may preempt) arriving from 400 s, one every ``every`` s."""
    jobs = [sim_job(1, 0, 10_000, 4, cls="low")]
    jobs += [sim_job(2 + k, 400 + k * every, 100, 4, cls="high") for k in range(count)]
    churn = scenario(jobs)
    churn.workloads = _policy(max_preemptions, protection)
    return churn


def test_a_job_is_preempted_no_more_than_its_limit():
    # Without a limit each high job stops the low one again (six times); with a limit of
    # 2 it runs to its end from its third start, at 1005, and the others wait for it.
    unlimited = replay(_stream(500, 6, max_preemptions=0), ANY_GAIN["sluice"], EXACT)
    assert unlimited.runs[0].preemptions == 6

    result = replay(_stream(500, 6, max_preemptions=2), ANY_GAIN["sluice"], EXACT)
    low = result.runs[0]
    assert low.preemptions == 2
    assert low.attempts[-1][:2] == (1005, 11_005)  # no checkpoint reached: all work lost
    assert result.runs[3].first_start == 11_005


def test_at_its_limit_a_job_waits_for_its_guarantee_instead_of_borrowing_again():
    # Tenant a fills its 4 guaranteed GPUs with G until 5000; its low job L borrows b's 4
    # idle GPUs from 10 and is reclaimed at 1000 by b's first job: at its limit (1), L
    # does not borrow again between b's jobs (to be reclaimed by the next one) but waits
    # for a's guarantee, free at 5000, where no reclaim reaches it.
    jobs = [
        sim_job(1, 0, 5000, 4, cls="normal"),
        sim_job(2, 10, 20_000, 4, cls="low"),
        *[sim_job(3 + k, 1000 * (k + 1), 300, 4, tenant="b") for k in range(4)],
    ]
    quotas = [QuotaInfo("a", POOL, "", 4, 4), QuotaInfo("b", POOL, "", 4, 4)]
    shared = scenario(jobs, gpus=8, quotas=quotas)
    shared.workloads = _policy(1)
    result = replay(shared, ANY_GAIN["sluice"], EXACT)
    low = result.runs[1]
    assert low.preemptions == 1
    assert [start for start, _, _ in low.attempts] == [10, 5000]
    assert low.borrowed is False  # its last run, inside the guarantee
    assert [run.first_start for run in result.runs[2:]] == [1005, 2000, 3000, 4000]

    shared.workloads = _policy(0)
    assert replay(shared, ANY_GAIN["sluice"], EXACT).runs[1].preemptions == 4


def test_in_a_busy_replay_no_job_goes_beyond_the_limit():
    # Both tenants' guarantees hold every job: at its limit a job runs inside it, where
    # neither a higher class nor a reclaim stops it.
    config = SimConfig(checkpoint_interval=300)
    busy = busy_trace()
    busy.workloads = _policy(0)
    assert max(run.preemptions for run in replay(busy, ANY_GAIN["sluice"], config).runs) > 1

    busy.workloads = _policy(1)
    result = replay(busy, ANY_GAIN["sluice"], config)
    assert max(run.preemptions for run in result.runs) == 1
    assert summarize(result)["max_preemptions"] == 1


def test_after_its_protection_window_a_job_may_be_preempted_again():
    # Limit 1, protected for 600 s: preempted at 400 (stops at 405), restarted at 505 and
    # protected until 1105. The high job arriving at 900 waits for that moment (the
    # replay wakes up then), not for the low job's end.
    result = replay(_stream(500, 2, max_preemptions=1, protection=600), ANY_GAIN["sluice"], EXACT)
    low, _, second = result.runs
    assert second.first_start == 1110
    assert low.preemptions == 2
    assert [start for start, _, _ in low.attempts] == [0, 505, 1210]

    # Protected for the whole run: it waits until the low job ends.
    result = replay(_stream(500, 2, max_preemptions=1), ANY_GAIN["sluice"], EXACT)
    assert result.runs[2].first_start == 10_505
    assert result.runs[0].preemptions == 1


def test_the_minimum_runtime_holds_between_two_preemptions():
    # High jobs every 200 s: after each restart the low job runs its 300 s (plus the 5 s
    # grace) before it is stopped again, never less.
    result = replay(_stream(200, 5, max_preemptions=0), ANY_GAIN["sluice"], EXACT)
    low = result.runs[0]
    assert low.preemptions >= 3
    stopped = [end - start for start, end, _ in low.attempts[:-1]]
    assert min(stopped) == 305
    assert low.attempts[1][0] == 505  # restarted after the first high job


@pytest.mark.parametrize(("interval", "victim"), [(600, 1), (0, 2)])
def test_the_engine_is_told_the_last_checkpoint(interval, victim):
    # A (2 GPUs) runs from 0, B (2 GPUs) from 200; at 610 a high job needs 2 GPUs. With
    # checkpoints every 600 s A saved at 600 and loses least: it is stopped, though B
    # started later. Without checkpoints A would lose 1,220 GPU-s, B 820: B is stopped.
    jobs = [
        sim_job(1, 0, 5000, 2, cls="low"),
        sim_job(2, 200, 5000, 2, cls="low"),
        sim_job(3, 610, 100, 2, cls="high"),
    ]
    config = SimConfig(dispatch_interval=0, checkpoint_interval=interval)
    result = replay(scenario(jobs), ANY_GAIN["sluice"], config)
    assert [run.job.id for run in result.runs if run.preemptions] == [victim]


def test_waits_count_every_re_wait_after_a_preemption():
    # L (low, 4 GPUs, 1000 s) runs from 0; H (high) arrives at 700: L stops at 705, waits
    # again until H ends at 805, then runs to 1205 (checkpoint at 600 kept).
    jobs = [sim_job(1, 0, 1000, 4, cls="low"), sim_job(2, 700, 100, 4, cls="high")]
    config = SimConfig(dispatch_interval=0, checkpoint_interval=600)
    result = replay(scenario(jobs), ANY_GAIN["sluice"], config)
    low, high = result.runs

    assert (low.first_wait, low.rewait, low.total_wait) == (0, 100, 100)
    assert (high.first_wait, high.rewait, high.total_wait) == (5, 0, 5)
    summary = summarize(result)
    assert summary["wait_avg_s"] == pytest.approx((100 + 5) / 2)
    assert summary["wait_p99_s"] == pytest.approx(5 + 0.99 * 95)
    assert summary["wait_first_avg_s"] == pytest.approx((0 + 5) / 2)
    assert summary["rewait_avg_s"] == pytest.approx(100 / 2)
    assert summary["rewait_preempted_avg_s"] == pytest.approx(100)
    assert (summary["preempted_jobs"], summary["preempted_2_plus"]) == (1, 0)
    assert (summary["preempted_5_plus"], summary["max_preemptions"]) == (0, 1)
    held = 4 * 705 + 4 * 400 + 4 * 100  # lost work and grace included
    assert summary["lost_gpu_hours"] == pytest.approx(4 * 105 / 3600)
    assert summary["lost_share"] == pytest.approx(4 * 105 / held)
    (tenant,) = per_tenant(result)
    assert tenant["wait_avg_s"] == pytest.approx((100 + 5) / 2)
    assert tenant["rewait_avg_s"] == pytest.approx(100 / 2)


def test_churn_figures_count_jobs_by_preemptions():
    result = replay(_stream(500, 6, max_preemptions=0), ANY_GAIN["sluice"], EXACT)
    summary = summarize(result)
    low = result.runs[0]
    assert low.preemptions == 6
    assert summary["preempted_jobs"] == summary["preempted_2_plus"] == 1
    assert summary["preempted_5_plus"] == 1
    assert summary["max_preemptions"] == low.preemptions
    assert summary["rewait_preempted_avg_s"] == pytest.approx(low.rewait)
    assert low.rewait == pytest.approx(sum(end - start for start, end in low.waits[1:]))


def test_sluice_min_gain_waits_for_a_job_ending_soon_instead_of_preempting():
    # A low job of 20,000 s (its limit) runs from 0; the high job arriving at 400 would
    # wait for it until 20,000: both policies preempt. With a low job of 1,000 s the high
    # job gains 600 s by preempting: Sluice preempts, sluice-min-gain (4 h) waits and the
    # low job runs to its end.
    long_ = _stream(500, 1, max_preemptions=0)
    long_.jobs[0] = sim_job(1, 0, 20_000, 4, cls="low")
    assert replay(long_, POLICIES["sluice-min-gain"], EXACT).runs[0].preemptions == 1
    short = _stream(500, 1, max_preemptions=0)
    short.jobs[0] = sim_job(1, 0, 1000, 4, cls="low")
    assert replay(short, ANY_GAIN["sluice"], EXACT).runs[0].preemptions == 1
    patient = replay(short, POLICIES["sluice-min-gain"], EXACT)
    assert patient.runs[0].preemptions == 0
    assert patient.runs[1].first_start == 1000
    assert ANY_GAIN["sluice"].preemption_min_gain_seconds == 0


def test_runtime_learner_follows_the_portals_rule():
    learner = RuntimeLearner()
    job = sim_job(1, 0, 600, limit=36_000)
    for _ in range(2):
        learner.ended(job, 600, timed_out=False)
    assert learner.expected(job) == 0.0  # fewer than three finished jobs: not known
    learner.ended(job, 1200, timed_out=False)
    # The 75th percentile of 1/60, 1/60, 1/30, times the limit.
    assert learner.expected(job) == pytest.approx(36_000 * (1 / 60 + (1 / 30 - 1 / 60) / 2))
    for _ in range(HISTORY_JOBS):
        learner.ended(job, 0, timed_out=True)  # a time-out counts as the whole limit
    assert learner.expected(job) == 36_000  # the newest 20 only
    other = sim_job(2, 0, 600, tenant="b", limit=36_000)
    assert learner.expected(other) == 0.0  # another tenant's history


def test_minimum_gain_waits_for_a_borrower_expected_to_end_soon():
    # Tenant b borrows the whole node with jobs declaring 10 h that run 10 minutes;
    # tenant a's job, inside its guarantee, comes while b's fourth job runs.
    quotas = [QuotaInfo("a", POOL, "", 4, 0), QuotaInfo("b", POOL, "", 0, 4)]

    def replayed(history: int):
        jobs = [sim_job(k, k * 600, 600, 4, tenant="b", limit=36_000) for k in range(history)]
        last = history * 600
        jobs += [sim_job(100, last, 600, 4, tenant="b", limit=36_000)]
        jobs += [sim_job(200, last + 400, 600, 4, tenant="a")]
        result = replay(scenario(jobs, quotas=quotas), POLICIES["sluice-min-gain"], EXACT)
        return {run.job.id: run for run in result.runs}, last

    runs, last = replayed(3)
    assert runs[100].preemptions == 0  # expected to end in 200 s: waiting is as fast
    assert runs[200].first_start == last + 600
    runs, last = replayed(0)
    assert runs[100].preemptions == 1  # no history: its 10 h limit counts
    assert runs[200].first_start == pytest.approx(last + 400 + 5, abs=1)
