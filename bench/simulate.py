"""Benchmark of the trace-driven simulator (DESIGN.md §11: a 69,000-job trace in <= 60 s).

Run ``.venv/bin/python bench/simulate.py`` (``--quick``: ITP cluster01 only). Replays the
whole ITP trace (69,351 jobs, ten clusters) under each policy and prints one JSON line per
policy: wall seconds, engine seconds, cycles, and the headline figures, and whether the
engine ran compiled (``make native``) or as Python (``SLUICE_PURE_ENGINE=1``). Traces are read
from ``../shared/traces`` (or ``SLUICE_TRACES_DIR``). No Django.

``--deep``: the deep-backlog case (DESIGN.md §11, "cost follows what changed, not N"):
ITP's ten clusters merged into one pool (tenants shared) sized for 95 % offered load, so
that thousands of jobs wait in one pool at once under FIFO (peak about 2,700, mean 800;
Sluice's backfill keeps its own queue to hundreds: peak about 500, mean 80); target 120 s
per policy. Each line also gives the peak and the time-weighted mean number of jobs
waiting, and ``digest``, a hash of every decision (each job's runs and preemptions): an
optimisation of the engine or the replay must leave it unchanged. ``--one-pool`` merges
the pools of any trace; ``--max-jobs N`` replays only the first N jobs by submit time
(for profiling). Every line gives the waits' tail too: ``wait_max_h`` (the longest
wait of one job), ``waited_over_day`` and ``big_waited_over_day`` (jobs, and jobs over
8 GPUs, that waited more than a day in all) and ``wait_beyond_day_h`` (what the waits
beyond their first day add to the average), and ``tail_by_class``: per priority class,
the longest wait (``longest_h``) and the jobs past a day (``over_day``). ``--wait-reasons`` adds ``wait_by_size``:
per size of job, its waits and the part of the average it carries, split by the reason
the engine gave its jobs while they waited (``scheduling.simulator.metrics.wait_by_size``),
and ``wait_by_class``: the same per priority class, split by size (``wait_by_class``). ``--knob NAME=VALUE``
sets an engine setting of every policy but FIFO (e.g.
``preemption_min_gain_seconds=3600``) and ``--workload FIELD=VALUE`` a field of the
scenario's workload policy (e.g. ``min_runtime_before_preemption=1800``), to measure a
setting before making it a policy. ``--seed 1,2,3`` replays the scenario drawn with each
seed and ends with a ``summary`` line per policy: each figure per seed and its mean, and
with ``fifo`` among the policies the ratio of FIFO's average wait to the policy's, and
the policy's longest wait over FIFO's (``max_wait_vs_fifo``) (a
lever is judged on several seeds: one seed to the next moves a figure by up to a quarter).
``--class-mix high=0.1,normal=0.9`` draws the classes of jobs without one with other weights.
``--reference sjf,sjf-classes,srtf,srtf-limited`` (one pool only) adds a line per reference
scheduler on the same scenario (``scheduling.simulator.reference``: real runtimes known, no
quotas, no reservations; what a kind of scheduler can reach, for scale, not a policy),
counted in the seed summaries like a policy (``ref-`` before its name).
``--nodes-per-block N`` puts the cluster's nodes in topology blocks of N nodes and
``--multi-node-share S`` re-draws the jobs' shapes with a share S on several whole nodes
(``scheduling.simulator.scenario``); each line then gives ``one_block_share`` (the starts
of multi-node jobs inside one block) and ``multi_node_wait_avg_h``; ``--topology-blind``
replays the same scenario with the blocks hidden from the engine (the share still
counted against them), the baseline of topology-aware placement.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduling.engine import native  # noqa: E402
from scheduling.simulator import DEFAULT_POLICIES, SimConfig, parse_policies  # noqa: E402
from scheduling.simulator.cli import default_traces_dir  # noqa: E402
from scheduling.simulator.metrics import (  # noqa: E402
    block_placement,
    summarize,
    tail_by_class,
    wait_by_class,
    wait_by_size,
)
from scheduling.simulator.model import WorkloadSpec  # noqa: E402
from scheduling.simulator.parallel import replay_split  # noqa: E402
from scheduling.simulator.policies import KNOBS, SHARING_KNOBS  # noqa: E402
from scheduling.simulator.readers import load_trace  # noqa: E402
from scheduling.simulator.reference import parse_references, run_reference  # noqa: E402
from scheduling.simulator.scenario import (  # noqa: E402
    DEFAULT_CLASS_MIX,
    DEFAULT_TARGET_LOAD,
    ScenarioOptions,
    build_scenario,
    format_class_mix,
    parse_class_mix,
)
from scheduling.simulator.simulation import ReplayStalled  # noqa: E402
from scheduling.simulator.snapshot import SnapshotBuilder  # noqa: E402

TARGET_SECONDS = 60.0
DEEP_TARGET_SECONDS = 120.0
DEEP_LOAD = 0.95


def waiting_figures(series: tuple[list[float], list[int], list[int]]) -> tuple[int, float]:
    """(peak, time-weighted mean) of the jobs waiting, from a replay's step series."""
    times, waiting, _ = series
    if not times:
        return 0, 0.0
    area = sum(
        count * (end - start) for start, end, count in zip(times, times[1:], waiting, strict=False)
    )
    span = times[-1] - times[0]
    return max(waiting), (area / span if span > 0 else float(waiting[0]))


def decisions_digest(runs) -> str:
    """A short hash of every decision of a replay: each job's outcome and runs (start,
    end, GPUs) and preemptions. Two replays with the same digest decided the same."""
    digest = hashlib.sha256()
    for run in sorted(runs, key=lambda run: run.job.id):
        digest.update(repr((run.job.id, run.outcome, run.preemptions, run.attempts)).encode())
    return digest.hexdigest()[:16]


def parse_knobs(items: list[str]) -> dict[str, float]:
    """``NAME=VALUE`` settings of :data:`KNOBS` as a dict (SystemExit on a bad one)."""
    knobs: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in (*KNOBS, *SHARING_KNOBS) or not value:
            known = (*KNOBS, *SHARING_KNOBS)
            raise SystemExit(f"--knob {item!r}: expected NAME=VALUE with NAME one of {known}")
        knobs[name] = float(value)
    return knobs


def parse_workload(items: list[str]) -> dict[str, int]:
    """``FIELD=VALUE`` overrides of :class:`WorkloadSpec`'s integer fields."""
    known = {name for name, value in asdict(WorkloadSpec()).items() if type(value) is int}
    fields = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in known or not value:
            raise SystemExit(f"--workload {item!r}: expected FIELD=VALUE with FIELD in {known}")
        fields[name] = int(value)
    return fields


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", default="itp-2021")
    parser.add_argument("--cluster", help="ITP: one cluster only")
    parser.add_argument("--policy", default=",".join(DEFAULT_POLICIES))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-waiting-per-tenant", type=int, default=0)
    parser.add_argument("--load", type=float, help="sized for (default 0.85, --deep 0.95)")
    parser.add_argument("--quick", action="store_true", help="ITP cluster01 only")
    parser.add_argument("--full-cycles", action="store_true", help="no decisions-only cycles")
    parser.add_argument("--deep", action="store_true", help="deep backlog: one pool, 95 %% load")
    parser.add_argument("--one-pool", action="store_true", help="merge the trace's pools")
    parser.add_argument("--max-jobs", type=int, help="the first N jobs by submit time only")
    parser.add_argument(
        "--seed",
        type=parse_seeds,
        default=[1],
        help="draws the tenants and classes the trace lacks; several (1,2,3): one line per "
        "seed and policy, then a summary line per policy (means over the seeds)",
    )
    parser.add_argument(
        "--class-mix",
        type=class_mix,
        default=DEFAULT_CLASS_MIX,
        help="classes drawn for jobs without one, with weights "
        f"(default {format_class_mix(DEFAULT_CLASS_MIX)})",
    )
    parser.add_argument(
        "--wait-reasons",
        action="store_true",
        help="add wait_by_size (waits per job size, split by the engine's reasons) and "
        "wait_by_class (per priority class, split by size)",
    )
    parser.add_argument(
        "--reference",
        type=references,
        default=[],
        help="reference schedulers to replay too, one pool only (sjf, sjf-classes, srtf, "
        "srtf-limited; scheduling.simulator.reference)",
    )
    parser.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=SECONDS",
        help=f"override an engine setting of every policy ({', '.join(KNOBS)})",
    )
    parser.add_argument("--nodes-per-block", type=int, default=0, help="topology blocks")
    parser.add_argument(
        "--multi-node-share", type=float, help="share of jobs re-drawn on several nodes"
    )
    parser.add_argument(
        "--topology-blind", action="store_true", help="hide the blocks from the engine"
    )
    parser.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field of every workload policy of the scenario (WorkloadSpec: "
        "min_runtime_before_preemption, max_preemptions, ...)",
    )
    args = parser.parse_args()
    knobs = parse_knobs(args.knob)
    cluster = "cluster01" if args.quick else args.cluster
    one_pool = args.one_pool or args.deep
    if args.reference and not one_pool:
        parser.error("--reference needs one pool (--one-pool or --deep)")
    load = args.load if args.load is not None else DEEP_LOAD if args.deep else DEFAULT_TARGET_LOAD
    target = DEEP_TARGET_SECONDS if args.deep else TARGET_SECONDS
    loaded = time.perf_counter()
    trace = load_trace(args.trace, default_traces_dir(), cluster=cluster)
    read = time.perf_counter() - loaded
    lines = []
    for seed in args.seed:
        lines += replay_seed(args, trace, seed, read, knobs, one_pool, load, target)
    if len(args.seed) > 1:
        for summary in seed_summaries(lines):
            print(json.dumps(summary), flush=True)


def replay_seed(args, trace, seed, read, knobs, one_pool, load, target) -> list[dict]:
    """Replay every policy on the scenario drawn with ``seed``; print and return the lines."""
    loaded = time.perf_counter()
    options = ScenarioOptions(
        target_load=load,
        one_pool=one_pool,
        max_jobs=args.max_jobs,
        seed=seed,
        class_mix=args.class_mix,
        nodes_per_block=args.nodes_per_block,
        multi_node_share=args.multi_node_share,
    )
    scenario = build_scenario(trace, options)
    block_of = {node.name: node.block for node in scenario.nodes if node.block}
    topology = bool(block_of) or args.multi_node_share is not None
    gpu_node = gpu_namer(scenario) if topology else None
    if args.topology_blind:
        scenario.nodes = [replace(node, block="") for node in scenario.nodes]
    if args.workload:
        fields = parse_workload(args.workload)
        scenario.workloads = {
            name: replace(spec, **fields) for name, spec in scenario.workloads.items()
        }
    setup = read + time.perf_counter() - loaded
    config = SimConfig(
        max_waiting_per_tenant=args.max_waiting_per_tenant,
        full_cycles=args.full_cycles,
        wait_reasons=args.wait_reasons,
    )
    lines = []
    for policy in parse_policies(args.policy):
        if knobs and not policy.global_fifo:
            policy = replace(policy, **knobs)
        line = {
            "trace": scenario.name,
            "policy": policy.name,
            "jobs": len(scenario.jobs),
            "gpus": scenario.capacity,
            "workers": args.workers,
            "engine": "compiled" if native.is_compiled() else "python",
            "python": native.interpreter(),
            "max_waiting_per_tenant": args.max_waiting_per_tenant,
            "load": load,
            "seed": seed,
            "class_mix": dict(args.class_mix),
            "full_cycles": args.full_cycles,
            "knobs": {name: getattr(policy, name) for name in KNOBS},
            "sharing_knobs": {name: getattr(policy, name) for name in SHARING_KNOBS}
            if policy.time_sharing
            else None,
            "workload": asdict(scenario.workload("")),
            "read_and_setup_s": round(setup, 2),
            "target_s": target,
        }
        try:
            result = replay_split(scenario, policy, config, args.workers)
        except ReplayStalled as error:
            line.update({"stalled": str(error), "ok": False})
            print(json.dumps(line), flush=True)
            lines.append(line)
            continue
        summary = summarize(result)
        peak, mean = waiting_figures(result.series)
        line.update(
            {
                "wall_s": round(result.wall_seconds, 2),
                "engine_s": round(result.plan_seconds, 2),
                "cycles": result.plans,
                "ms_per_cycle": round(1000 * result.plan_seconds / max(result.plans, 1), 3),
                "wait_avg_h": round(summary["wait_avg_s"] / 3600, 3),  # re-waits included
                "wait_first_avg_h": round(summary["wait_first_avg_s"] / 3600, 3),
                "wait_big_avg_h": round(summary["wait_big_avg_s"] / 3600, 3),  # > 8 GPUs
                "wait_p99_h": round(summary["wait_p99_s"] / 3600, 2),
                "wait_max_h": round(summary["wait_max_s"] / 3600, 1),
                "waited_over_day": summary["waited_over_day"],
                "wait_beyond_day_h": round(summary["wait_beyond_day_s"] / 3600, 4),
                "big_waited_over_day": summary["big_waited_over_day"],
                # Per priority class: the longest wait (h) and the jobs past a day.
                "tail_by_class": tail_by_class(result),
                "jain_daily": round(summary["fairness_daily"], 3),
                "jain_hourly": round(summary["fairness_hourly"], 3),
                "lost_share": round(summary["lost_share"], 4),
                "utilization": round(summary["utilization"], 4),
                "preemptions": summary["preemptions"],
                "preempted_5_plus": summary["preempted_5_plus"],
                "max_preemptions": summary["max_preemptions"],
                "promotions": result.promotions,  # borrowers brought inside a guarantee
                "lost_gpu_hours": round(summary["lost_gpu_hours"], 1),
                "waiting_peak": peak,
                "waiting_mean": round(mean, 1),
                "digest": decisions_digest(result.runs),
                "ok": result.wall_seconds <= target,
            }
        )
        if gpu_node is not None:
            placed = block_placement(result, gpu_node, block_of)
            line["nodes_per_block"] = args.nodes_per_block
            line["topology_blind"] = args.topology_blind
            line["multi_node_starts"] = placed["starts"]
            line["one_block_share"] = round(placed["share"], 4)
            line["multi_node_wait_avg_h"] = round(placed["wait_avg_s"] / 3600, 3)
        if args.wait_reasons:
            line["wait_by_size"] = wait_by_size(result)
            line["wait_by_class"] = wait_by_class(result)
        print(json.dumps(line), flush=True)
        lines.append(line)
    for reference in args.reference:
        line = reference_line(run_reference(scenario, reference), scenario.name, load, seed)
        print(json.dumps(line), flush=True)
        lines.append(line)
    return lines


def gpu_namer(scenario):
    """The node name of a GPU id of a replay of ``scenario``, whose pools must be replayed
    in one piece (pools replayed apart number their GPUs alike)."""
    if scenario.independent_pools and len(scenario.pool_capacity()) > 1:
        raise SystemExit(
            "--nodes-per-block/--multi-node-share: one pool only (--quick, --one-pool)"
        )
    builder = SnapshotBuilder(scenario)
    return lambda gpu_id: builder.gpu_label(gpu_id)[0]


def reference_line(result, trace: str, load: float, seed: int) -> dict:
    """A reference scheduler's figures, named and rounded as a policy's are."""
    return {
        "trace": trace,
        "policy": f"ref-{result.reference.name}",
        "reference": result.reference.description,
        "jobs": result.jobs,
        "load": load,
        "seed": seed,
        "wall_s": round(result.wall_seconds, 2),
        "wait_avg_h": round(result.wait_avg_s / 3600, 3),
        "wait_first_avg_h": round(result.wait_first_avg_s / 3600, 3),
        "wait_big_avg_h": round(result.wait_big_avg_s / 3600, 3),
        "wait_max_h": round(result.wait_max_s / 3600, 1),
        "big_waited_over_day": result.big_waited_over_day,
        "preemptions": result.preemptions,
        "max_preemptions": result.max_preemptions,
        "lost_share": round(result.lost_share, 4),
    }


def class_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``--class-mix`` (:func:`~scheduling.simulator.scenario.parse_class_mix`)."""
    try:
        return parse_class_mix(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def references(text: str):
    """``--reference`` (:func:`~scheduling.simulator.reference.parse_references`)."""
    try:
        return parse_references(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_seeds(text: str) -> list[int]:
    """``--seed``: one seed or several, comma-separated."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seeds like 1 or 1,2,3") from None
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: a seed given twice")
    return seeds


SUMMED = (
    "wait_avg_h",
    "wait_first_avg_h",
    "wait_big_avg_h",
    "wait_max_h",
    "waited_over_day",
    "big_waited_over_day",
    "preemptions",
    "lost_share",
)


def seed_summaries(lines: list[dict]) -> list[dict]:
    """One line per policy over the seeds replayed: the seeds, each figure of
    :data:`SUMMED` per seed and its mean, and with a ``fifo`` line for the same seeds,
    ``vs_fifo``: FIFO's average wait over the policy's, per seed and for the means (a
    lever is judged on several seeds: one seed to the next moves a figure by up to a
    quarter). Replays that stalled are left out of their policy's figures."""
    done = [line for line in lines if "stalled" not in line]
    fifo = {line["seed"]: line["wait_avg_h"] for line in done if line["policy"] == "fifo"}
    longest = {line["seed"]: line.get("wait_max_h") for line in done if line["policy"] == "fifo"}
    summaries = []
    for policy in dict.fromkeys(line["policy"] for line in done):
        mine = [line for line in done if line["policy"] == policy]
        summary: dict = {"summary": policy, "seeds": [line["seed"] for line in mine]}
        for key in SUMMED:
            values = [line.get(key) for line in mine]
            if None in values:
                continue  # a figure a reference scheduler does not give
            summary[key] = values
            summary[f"{key}_mean"] = round(sum(values) / len(values), 4)
        if policy != "fifo" and all(line["seed"] in fifo for line in mine):
            summary["vs_fifo"] = [
                round(fifo[line["seed"]] / line["wait_avg_h"], 2) if line["wait_avg_h"] else None
                for line in mine
            ]
            mean_fifo = sum(fifo[line["seed"]] for line in mine) / len(mine)
            wait = summary["wait_avg_h_mean"]
            summary["vs_fifo_of_means"] = round(mean_fifo / wait, 2) if wait else None
            # The longest wait against FIFO's, per seed (a bound on every wait: at most 2).
            if all("wait_max_h" in line and longest.get(line["seed"]) for line in mine):
                summary["max_wait_vs_fifo"] = [
                    round(line["wait_max_h"] / longest[line["seed"]], 2) for line in mine
                ]
        summaries.append(summary)
    return summaries


if __name__ == "__main__":
    main()
