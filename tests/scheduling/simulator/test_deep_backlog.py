"""The deep-backlog case: a trace's pools merged into one (``ScenarioOptions.one_pool``,
``simulate --one-pool``, ``bench/simulate.py --deep``), and the replay's bookkeeping that
keeps what a cycle costs off the number of jobs running (when to wake up for a
preemption)."""

import argparse
import dataclasses
import importlib.util
import random
from pathlib import Path

import pytest

from scheduling.engine import QuotaInfo
from scheduling.simulator import POLICIES, SimConfig, Trace, TraceJob, WorkloadSpec, build_scenario
from scheduling.simulator.cli import add_arguments, run
from scheduling.simulator.reference import REFERENCES, run_reference
from scheduling.simulator.scenario import DEFAULT_POOL, ScenarioOptions, merge_pools
from scheduling.simulator.simulation import INF, WAKE, Replay, _may_stop, stoppable_times

from .conftest import POOL, scenario, sim_job

ROOT = Path(__file__).resolve().parents[3]


def two_clusters() -> Trace:
    """Two separate clusters (ITP-like: no tenants, no classes, independent pools)."""
    rng = random.Random(5)
    jobs = [
        TraceJob(f"j{n}", rng.uniform(0, 50_000), rng.randint(60, 4000), rng.choice([1, 2, 8]))
        for n in range(200)
    ]
    jobs = [dataclasses.replace(job, pool=f"c{n % 2 + 1}") for n, job in enumerate(jobs)]
    return Trace("two", jobs, independent_pools=True)


def test_one_pool_merges_the_clusters_into_one_with_shared_tenants():
    merged = build_scenario(two_clusters(), ScenarioOptions(one_pool=True, tenants=3))

    assert merged.name == "two/one-pool"
    assert {node.pool for node in merged.nodes} == {DEFAULT_POOL}
    assert {job.pool for job in merged.jobs} == {DEFAULT_POOL}
    assert not merged.independent_pools  # replayed in one piece, not pool by pool
    assert {job.tenant for job in merged.jobs} == {"t1", "t2", "t3"}  # not c1-t1, ...
    assert {quota.pool for quota in merged.quotas} == {DEFAULT_POOL}
    assert sum(quota.guaranteed for quota in merged.quotas) == merged.capacity
    assert "pools: the trace's 2 pools merged into one, default" in merged.notes
    assert len(merged.jobs) == 200


def test_without_one_pool_the_clusters_stay_apart():
    apart = build_scenario(two_clusters(), ScenarioOptions(tenants=3))

    assert {node.pool for node in apart.nodes} == {"c1", "c2"}
    assert apart.independent_pools
    assert {job.tenant.split("-")[0] for job in apart.jobs} == {"c1", "c2"}


def test_merging_one_pool_keeps_the_trace_name_and_says_nothing():
    trace = Trace("one", [TraceJob("a", 0, 60, 1, pool="x"), TraceJob("b", 1, 60, 1, pool="x")])

    merged = merge_pools(trace)

    assert merged.name == "one"
    assert [job.pool for job in merged.jobs] == [DEFAULT_POOL, DEFAULT_POOL]
    assert merged.notes == []


def test_simulate_one_pool(tmp_path):
    trace = tmp_path / "two.csv"
    trace.write_text(
        "job_id,submit_time,duration,num_gpus,pool\na,0,600,2,c1\nb,10,600,2,c2\nc,20,60,1,c2\n"
    )
    parser = argparse.ArgumentParser()
    add_arguments(parser, out_dir=tmp_path / "sim")
    options = vars(
        parser.parse_args(
            ["--trace", str(trace), "--one-pool", "--nodes", "1", "--policy", "fifo"]
            + ["--workers", "1"]
        )
    )
    lines: list[str] = []

    summaries = run(options, write=lines.append)

    assert "  pools: the trace's 2 pools merged into one, default" in lines
    assert any(line.startswith("  pool default: 1 node x 8 GPUs") for line in lines)
    assert summaries[0]["completed"] == 3


def _bench():
    spec = importlib.util.spec_from_file_location("bench_simulate", ROOT / "bench" / "simulate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_reports_the_peak_and_the_time_weighted_mean_of_jobs_waiting():
    waiting_figures = _bench().waiting_figures

    assert waiting_figures(([0.0, 10.0, 20.0, 30.0], [0, 5, 1, 0], [0, 0, 0, 0])) == (5, 2.0)
    assert waiting_figures(([], [], [])) == (0, 0.0)
    assert waiting_figures(([7.0], [3], [0])) == (3, 3.0)


def _line(policy: str, seed: int, wait: float, **more) -> dict:
    figures = {
        "wait_first_avg_h": wait,
        "wait_big_avg_h": 2 * wait,
        "big_waited_over_day": 2 * seed,
        "preemptions": seed,
    }
    return {"policy": policy, "seed": seed, "wait_avg_h": wait, "lost_share": 0.0} | (
        figures | more
    )


def test_the_bench_sums_up_several_seeds_per_policy():
    bench = _bench()
    lines = [
        _line("fifo", 1, 2.0),
        _line("sluice", 1, 0.2),
        _line("fifo", 2, 3.0),
        _line("sluice", 2, 0.5),
        {"policy": "sluice-tuned", "seed": 2, "stalled": "a preemption storm", "ok": False},
    ]

    fifo, sluice = bench.seed_summaries(lines)  # the stalled replay is left out

    assert fifo["summary"] == "fifo" and fifo["seeds"] == [1, 2]
    assert fifo["wait_avg_h_mean"] == 2.5 and "vs_fifo" not in fifo
    assert sluice["wait_avg_h"] == [0.2, 0.5]
    assert sluice["wait_avg_h_mean"] == 0.35
    assert sluice["wait_big_avg_h_mean"] == 0.7
    assert sluice["preemptions"] == [1, 2] and sluice["preemptions_mean"] == 1.5
    assert sluice["big_waited_over_day"] == [2, 4] and sluice["big_waited_over_day_mean"] == 3
    assert sluice["vs_fifo"] == [10.0, 6.0]
    assert sluice["vs_fifo_of_means"] == round(2.5 / 0.35, 2)
    assert "max_wait_vs_fifo" not in sluice  # these lines give no longest wait
    longest = [
        _line("fifo", 1, 2.0, wait_max_h=40.0, waited_over_day=3),
        _line("sluice", 1, 0.2, wait_max_h=60.0, waited_over_day=5),
    ]
    _, bounded = bench.seed_summaries(longest)
    assert bounded["max_wait_vs_fifo"] == [1.5]
    assert bounded["wait_max_h"] == [60.0] and bounded["waited_over_day_mean"] == 5
    # Without FIFO for every seed of a policy there is no ratio.
    (alone,) = bench.seed_summaries([_line("sluice", 1, 0.2), _line("sluice", 2, 0.5)])
    assert "vs_fifo" not in alone


def test_a_reference_scheduler_line_is_summed_up_with_its_ratio_to_fifo():
    bench = _bench()
    # srtf on one node of 4: B (1 GPU x 1 h at 5 s) stops A (4 x 100,000 s), which waits
    # 1 h: 0.5 h on average.
    jobs = [sim_job(1, 0, 100_000, 4), sim_job(2, 5, 3600, 1)]
    result = run_reference(scenario(jobs), REFERENCES["srtf"], tick=0)

    line = bench.reference_line(result, "hand-made", 0.85, 1)
    (_, summary) = bench.seed_summaries([_line("fifo", 1, 5.0), line])

    assert line["policy"] == "ref-srtf" and line["reference"].startswith("preemptive")
    assert (line["wait_avg_h"], line["preemptions"], line["max_preemptions"]) == (0.5, 1, 1)
    assert summary["summary"] == "ref-srtf" and summary["vs_fifo"] == [10.0]


def test_the_bench_takes_one_seed_or_several():
    parse_seeds = _bench().parse_seeds

    assert parse_seeds("1") == [1]
    assert parse_seeds("1,2,3") == [1, 2, 3]
    for wrong in ("1,x", "", "2,2"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_seeds(wrong)


# -- when to wake up for a preemption -------------------------------------------------------


class ScanningReplay(Replay):
    """The wake-up of a replay found by scanning every running job, as it was before the
    replay kept them in time order: the reference for the indexed one."""

    def _schedule_wake(self, pool, now):
        preemptors = self._preemptors(pool)
        if preemptors is None:
            return
        soonest = INF
        for run_ in self.running[pool].values():
            if run_.stopping:
                continue
            record = run_.running_record
            for ready, protected in stoppable_times(record, self.policy):
                if now < ready < soonest and _may_stop(preemptors, record, protected):
                    soonest = ready
        if soonest == INF:
            return
        current = self.wake_at.get(pool)
        if current is None or current <= now or soonest < current:
            self.wake_at[pool] = soonest
            self._push(soonest, WAKE, pool, 0)


def _wakes(replay_class, scenario_, config, policy="sluice"):
    """(every job's runs, the wake-ups scheduled) of a replay."""
    wakes = []

    class Logged(replay_class):
        def _push(self, when, kind, subject, epoch):
            if kind == WAKE:
                wakes.append(when)
            super()._push(when, kind, subject, epoch)

    chosen = POLICIES[policy]
    if chosen.preemption_min_gain_seconds:  # 10 minutes: these jobs run under an hour
        chosen = dataclasses.replace(chosen, preemption_min_gain_seconds=600.0)
    result = Logged(scenario_, chosen, config).run()
    return [(run.job.id, run.attempts, run.preemptions) for run in result.runs], wakes


def _contended(max_preemptions: int, protection: int):
    """Two tenants borrowing from each other, a fifth of the jobs may preempt, jobs
    protected after ``max_preemptions`` preemptions for ``protection`` seconds."""
    rng = random.Random(13)
    jobs = [
        sim_job(
            number,
            rng.uniform(0, 20_000),
            rng.randint(60, 3000),
            rng.choice([1, 1, 2, 4]),
            tenant=rng.choice("ab"),
            cls=rng.choices(["high", "normal", "low"], [0.2, 0.5, 0.3])[0],
        )
        for number in range(1, 301)
    ]
    quotas = [QuotaInfo("a", POOL, "", 4, 4), QuotaInfo("b", POOL, "", 4, 4)]
    built = scenario(jobs, nodes=2, gpus=4, quotas=quotas)
    built.workloads = {
        "": WorkloadSpec(
            grace_seconds=5,
            min_runtime_before_preemption=300,
            max_preemptions=max_preemptions,
            preemption_protection_seconds=protection,
        )
    }
    return built


@pytest.mark.parametrize(
    ("max_preemptions", "protection", "policy"),
    [(0, 0, "sluice"), (1, 0, "sluice"), (1, 900, "sluice"), (1, 0, "sluice-min-gain")],
)
def test_wake_ups_are_those_of_a_scan_of_every_running_job(max_preemptions, protection, policy):
    """With a minimum gain (sluice-min-gain) a job expected to end within it becomes a
    possible victim once it runs past its prediction: a wake-up then too."""
    scenario_ = _contended(max_preemptions, protection)
    config = SimConfig(checkpoint_interval=300)

    indexed = _wakes(Replay, scenario_, config, policy)
    scanned = _wakes(ScanningReplay, scenario_, config, policy)

    assert indexed == scanned
    assert len(indexed[1]) > 20  # wake-ups did happen
    assert any(preemptions for _, _, preemptions in indexed[0])
