"""Properties every replay keeps: each job ends exactly once, no GPU is held twice,
work is conserved across preemptions, and a seed gives the same result every time."""

import random
from collections import defaultdict

import pytest

from scheduling.engine import QuotaInfo, plan
from scheduling.simulator import SimConfig, Trace, TraceJob, build_scenario, replay
from scheduling.simulator.metrics import summarize
from scheduling.simulator.parallel import replay_split
from scheduling.simulator.scenario import ScenarioOptions
from scheduling.simulator.simulation import COMPLETED, TIMED_OUT, Replay

from .conftest import ANY_GAIN, POOL, scenario, sim_job


def busy_trace(seed: int = 7, count: int = 200):
    """Two tenants borrowing from each other on 2 x 8 GPUs, a fifth of the jobs "high"
    (may preempt), some jobs longer than their limit: preemptions and timeouts happen."""
    rng = random.Random(seed)
    jobs = []
    for number in range(1, count + 1):
        duration = rng.randint(60, 3000)
        limit = duration * 2 if rng.random() > 0.05 else duration // 2
        jobs.append(
            sim_job(
                number,
                rng.uniform(0, 10_000),
                duration,
                rng.choice([1, 1, 1, 2, 4, 8]),
                tenant=rng.choice("ab"),
                cls=rng.choices(["high", "normal", "low"], [0.2, 0.5, 0.3])[0],
                limit=limit,
            )
        )
    quotas = [QuotaInfo("a", POOL, "", 8, 8), QuotaInfo("b", POOL, "", 8, 8)]
    return scenario(jobs, nodes=2, gpus=8, quotas=quotas)


@pytest.mark.parametrize("full_cycles", [False, True])
@pytest.mark.parametrize("policy", ["fifo", "sluice", "sluice-no-backfill", "sluice-tuned"])
def test_every_job_ends_exactly_once_and_no_gpu_is_held_twice(policy, full_cycles):
    config = SimConfig(checkpoint_interval=300, full_cycles=full_cycles)
    result = replay(busy_trace(), ANY_GAIN[policy], config)

    assert sorted(run.job.id for run in result.runs) == list(range(1, 201))
    holders = defaultdict(list)
    for run in result.runs:
        assert run.outcome in (COMPLETED, TIMED_OUT)
        assert len(run.attempts) == run.preemptions + 1  # every run but the last was stopped
        assert run.attempts[-1][1] == run.finish
        for start, end, gpu_ids in run.attempts:
            assert len(gpu_ids) == run.job.gpus
            for gpu_id in gpu_ids:
                holders[gpu_id].append((start, end))
        ran = sum(end - start for start, end, _ in run.attempts)
        lost = run.lost_gpu_seconds / run.job.gpus
        if run.outcome == COMPLETED:
            assert ran - lost == pytest.approx(run.job.duration)
        else:  # killed at its limit, in its last run
            assert run.attempts[-1][1] - run.attempts[-1][0] == run.job.limit
    for intervals in holders.values():
        intervals.sort()
        for (_, end), (next_start, _) in zip(intervals, intervals[1:], strict=False):
            assert end <= next_start


class CheckedReplay(Replay):
    """A replay that plans each cycle's snapshot a second time in full and compares."""

    compared = skipped = 0

    def _cycle(self, pool, now, selected):
        selected = list(selected)
        result = super()._cycle(pool, now, selected)
        full = plan(self._snapshot(pool, now, selected, decisions_only=False))
        assert (result.placements, result.preemptions) == (full.placements, full.preemptions)
        assert len(result.pending) + result.skipped == len(full.pending)
        self.compared += 1
        self.skipped += result.skipped
        return result


@pytest.mark.parametrize("policy", ["sluice", "sluice-no-backfill", "sluice-tuned"])
def test_decisions_only_cycles_decide_as_full_ones_all_through_a_replay(policy):
    checked = CheckedReplay(
        busy_trace(count=400), ANY_GAIN[policy], SimConfig(checkpoint_interval=300)
    )
    checked.run()

    assert checked.compared > 100
    assert checked.skipped > 0  # some cycles did stop early


def _attempts(result):
    return [(run.job.id, run.attempts, run.preemptions, run.outcome) for run in result.runs]


@pytest.mark.parametrize("policy", ["fifo", "sluice-no-backfill"])
def test_without_backfill_a_decisions_only_replay_is_a_replay_of_full_cycles(policy):
    """Without backfill a cycle that stops early hands on what a full one hands on (the
    blocked job's reservation, the GPUs kept for preemptors), and the replay drops the
    older reservations of the jobs it did not reach: every start, GPU, end and
    preemption is that of a replay in which every cycle considers every job."""
    trace = busy_trace(count=400)
    fast = CountingReplay(trace, ANY_GAIN[policy], SimConfig(checkpoint_interval=300))
    full = replay(trace, ANY_GAIN[policy], SimConfig(checkpoint_interval=300, full_cycles=True))

    assert _attempts(fast.run()) == _attempts(full)
    if policy != "fifo":
        assert sum(run.preemptions for run in full.runs) > 0
        assert fast.skipped > 0  # cycles did stop early


class CountingReplay(Replay):
    """A replay that counts the jobs its cycles did not reach."""

    skipped = 0

    def _cycle(self, pool, now, selected):
        result = super()._cycle(pool, now, selected)
        self.skipped += result.skipped
        return result


def test_the_busy_trace_does_preempt_under_sluice():
    # Otherwise the test above would say nothing about requeues. Checkpoints as often as
    # the minimum runtime: with the engine as it stands a borrowed job can be placed
    # and reclaimed again and again (see the simulator's report), and without progress
    # saved between two reclaims the replay would end in a preemption storm.
    summary = summarize(
        replay(busy_trace(), ANY_GAIN["sluice"], SimConfig(checkpoint_interval=300))
    )

    assert summary["preemptions"] > 0
    assert summary["timed_out"] > 0


def _outcome(result):
    return [(run.job.id, run.first_start, run.finish, run.preemptions) for run in result.runs]


def synthetic_trace(pools: int = 1) -> Trace:
    rng = random.Random(3)
    jobs = [
        TraceJob(
            f"j{number}",
            rng.uniform(0, 20_000),
            rng.randint(60, 4000),
            rng.choice([1, 1, 2, 8]),
            pool=f"c{number % pools}" if pools > 1 else "",
        )
        for number in range(300)
    ]
    return Trace("synthetic", jobs, independent_pools=pools > 1)


def test_the_same_seed_gives_the_same_result():
    config = SimConfig(checkpoint_interval=300)
    first = replay(
        build_scenario(synthetic_trace(), ScenarioOptions(seed=5)), ANY_GAIN["sluice"], config
    )
    again = replay(
        build_scenario(synthetic_trace(), ScenarioOptions(seed=5)), ANY_GAIN["sluice"], config
    )

    assert _outcome(first) == _outcome(again)
    assert {k: v for k, v in summarize(first).items() if "seconds" not in k} == {
        k: v for k, v in summarize(again).items() if "seconds" not in k
    }


def test_another_seed_draws_other_tenants_and_classes():
    one = build_scenario(synthetic_trace(), ScenarioOptions(seed=1))
    two = build_scenario(synthetic_trace(), ScenarioOptions(seed=2))

    assert [(j.tenant, j.priority_class) for j in one.jobs] != [
        (j.tenant, j.priority_class) for j in two.jobs
    ]


def test_independent_pools_replayed_apart_give_the_same_result():
    scenario_ = build_scenario(synthetic_trace(pools=3), ScenarioOptions(seed=1))
    # see test_the_busy_trace_does_preempt...
    config = SimConfig(checkpoint_interval=300, wait_reasons=True)
    together = replay(scenario_, ANY_GAIN["sluice"], config)
    apart = replay_split(scenario_, ANY_GAIN["sluice"], config, workers=2)

    assert _outcome(apart) == _outcome(together)
    assert apart.series == together.series
    assert together.wait_reasons
    assert apart.wait_reasons.keys() == together.wait_reasons.keys()
    for key, seconds in together.wait_reasons.items():
        assert apart.wait_reasons[key] == pytest.approx(seconds)


def test_timeline_buckets_never_pour_an_interval_into_one_bucket():
    # A change point that lies on a bucket edge up to rounding once put the whole rest of
    # the replay into the bucket before it (a spike of 600 % utilization on the chart).
    from types import SimpleNamespace

    from scheduling.simulator.metrics import timeline

    start, end = 1343642.4411240122, 9833236.436802616
    edge = start + (end - start) / 7
    result = SimpleNamespace(capacity=1, series=([start, edge, end], [0, 0, 0], [0, 1, 0]))

    utilization = timeline(result, buckets=7)["utilization"]

    assert utilization[0] == pytest.approx(0.0, abs=1e-6)
    assert utilization[1:] == pytest.approx([1.0] * 6)


def capped_trace(seed: int = 11, count: int = 400):
    """Three tenants on 2 x 8 GPUs, c with a small quota (2 guaranteed + 2 to borrow):
    GPUs are often idle while c's jobs wait for its quota."""
    rng = random.Random(seed)
    jobs = [
        sim_job(
            number,
            rng.uniform(0, 20_000),
            rng.randint(60, 3000),
            rng.choice([1, 1, 2, 4]),
            tenant=rng.choices("abc", [0.25, 0.25, 0.5])[0],
            cls=rng.choices(["high", "normal", "low"], [0.2, 0.5, 0.3])[0],
        )
        for number in range(1, count + 1)
    ]
    quotas = [
        QuotaInfo("a", POOL, "", 7, 4),
        QuotaInfo("b", POOL, "", 7, 4),
        QuotaInfo("c", POOL, "", 2, 2),
    ]
    return scenario(jobs, nodes=2, gpus=8, quotas=quotas)


class GatedReplay(Replay):
    """A replay that plans, in full, every cycle it skips as not worth it, and checks
    that it would have started and stopped nothing."""

    skipped = skipped_with_idle_gpus = 0

    def _worth_a_cycle(self, pool, now):
        if super()._worth_a_cycle(pool, now):
            return True
        pending = list(self.pending[pool].values())
        full = plan(self._snapshot(pool, now, pending, decisions_only=False))
        assert (full.placements, full.preemptions) == ([], [])
        self.skipped += 1
        largest_idle = max(self.node_free[node] for node in self.pool_nodes[pool])
        if min(run.job.gpus_per_node for run in pending) <= largest_idle:
            self.skipped_with_idle_gpus += 1  # skipped for its tenants' quota
        return False


@pytest.mark.parametrize("trace", [busy_trace, capped_trace])
@pytest.mark.parametrize("policy", ["fifo", "sluice", "sluice-no-backfill"])
def test_a_cycle_skipped_as_not_worth_it_would_have_done_nothing(policy, trace):
    gated = GatedReplay(trace(), ANY_GAIN[policy], SimConfig(checkpoint_interval=300))
    gated.run()

    assert gated.skipped > 10
    if trace is capped_trace and policy != "fifo":
        assert gated.skipped_with_idle_gpus >= 5
