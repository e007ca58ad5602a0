"""The command line of the simulator: ``manage.py simulate`` or ``python -m scheduling.simulator``.

Reads a trace, builds the scenario (printing what it chose and why), replays it under each
policy, prints a table and writes JSON, CSV and a chart into ``--out``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .parallel import replay_split
from .policies import DEFAULT_POLICIES, parse_policies
from .readers import ALIBABA_PODS, FRACTIONAL_MODES, TraceError, load_trace
from .report import class_table, payload, size_table, table, write_chart, write_csv, write_json
from .scenario import (
    DEFAULT_CLASS_MIX,
    DEFAULT_TARGET_LOAD,
    ScenarioOptions,
    build_scenario,
    format_class_mix,
    parse_class_mix,
)
from .simulation import ReplayStalled, SimConfig

DAY = 86400


def default_traces_dir() -> Path:
    """``SLUICE_TRACES_DIR``, else ``shared/traces`` beside the project checkout."""
    configured = os.environ.get("SLUICE_TRACES_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[3] / "shared" / "traces"


def add_arguments(parser: argparse.ArgumentParser, *, out_dir: Path) -> None:
    """The options of ``simulate`` (shared by the management command)."""
    add = parser.add_argument
    add("--trace", required=True, help="itp-2021, alibaba-pai-2023 or a path to a CSV file")
    add("--policy", default=",".join(DEFAULT_POLICIES), help="comma-separated policies")
    add("--nodes", type=int, help="nodes per pool (default: smallest meeting --load)")
    add(
        "--load",
        type=float,
        default=DEFAULT_TARGET_LOAD,
        help="offered load the cluster is sized for when --nodes is not given "
        "(0-1; 1: the smallest cluster keeping it below 100 %%)",
    )
    add("--gpus-per-node", type=int, default=8)
    add("--tenants", type=int, default=4, help="tenants drawn for jobs that have none")
    add("--seed", type=int, default=1)
    add(
        "--class-mix",
        help="classes drawn for jobs without one, with weights "
        f"(default {format_class_mix(DEFAULT_CLASS_MIX)})",
    )
    add("--limit-factor", type=float, default=2.0, help="declared limit = duration x this")
    add("--limit-cap", type=float, default=7 * DAY, help="longest declared limit, seconds")
    add("--checkpoint-interval", type=float, default=1800.0, help="seconds (0: none)")
    add("--dispatch-interval", type=float, default=5.0, help="seconds between cycles")
    add("--max-waiting-per-tenant", type=int, default=0, help="cycle window (0: all jobs)")
    add("--keep-reservations", action=argparse.BooleanOptionalAction, default=True)
    add(
        "--full-cycles",
        action="store_true",
        help="have every cycle consider every waiting job (slower; same decisions per cycle)",
    )
    add(
        "--wait-reasons",
        action="store_true",
        help="record under which reason jobs wait: the waits by size are split by it",
    )
    add("--cluster", help="ITP: one cluster (cluster01..cluster10) instead of all")
    add(
        "--one-pool",
        action="store_true",
        help="merge the trace's pools into one (ITP: its ten clusters as one; a deep queue)",
    )
    add(
        "--nodes-per-block",
        type=int,
        default=0,
        help="put the nodes in topology blocks of N nodes (0: no topology)",
    )
    add(
        "--multi-node-share",
        type=float,
        help="re-draw the jobs' shapes: this share (0-1) on 2 to 4 whole nodes",
    )
    add("--max-jobs", type=int, help="replay only the first N jobs by submit time")
    add("--alibaba-pods", choices=sorted(ALIBABA_PODS), default="default")
    add("--fractional", choices=FRACTIONAL_MODES, default="round-up")
    add("--traces-dir", type=Path, default=default_traces_dir())
    add("--workers", type=int, default=os.cpu_count() or 1, help="processes for ITP's pools")
    add("--out", type=Path, default=out_dir, help="folder for the JSON, CSV and chart")
    add("--json", type=Path, help="JSON file (default: <out>/<trace>.json)")
    add("--csv", type=Path, help="CSV file (default: <out>/<trace>.csv)")
    add("--chart", type=Path, help="PNG or SVG chart (default: <out>/<trace>.png)")


class _Progress:
    """Prints how far a long replay is, every tenth of its jobs."""

    def __init__(self, name: str, write: Callable[[str], None]) -> None:
        self.name, self.write, self.next = name, write, 0.1
        self.started = time.perf_counter()

    def __call__(self, fraction: float) -> None:
        if fraction >= self.next and fraction < 1:
            elapsed = time.perf_counter() - self.started
            self.write(f"  {self.name}: {fraction:.0%} of the jobs submitted ({elapsed:.0f} s)")
            while self.next <= fraction:
                self.next += 0.1


def _file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "trace"


def run(
    options: dict,
    write: Callable[[str], None] = print,
    before_replay: Callable[[int, list], None] | None = None,
) -> list[dict]:
    """Run a comparison from parsed options; returns the summaries, one per policy.
    ``before_replay(jobs, policies)`` is called once the scenario is built."""
    policies = parse_policies(options["policy"])
    trace = load_trace(
        options["trace"],
        Path(options["traces_dir"]),
        cluster=options.get("cluster"),
        alibaba_pods=options.get("alibaba_pods") or "default",
        fractional=options.get("fractional") or "round-up",
    )
    scenario = build_scenario(
        trace,
        ScenarioOptions(
            nodes=options.get("nodes"),
            gpus_per_node=options["gpus_per_node"],
            tenants=options["tenants"],
            seed=options["seed"],
            class_mix=parse_class_mix(options.get("class_mix")),
            limit_factor=options["limit_factor"],
            limit_cap=options["limit_cap"],
            max_jobs=options.get("max_jobs"),
            target_load=options.get("load", DEFAULT_TARGET_LOAD),
            one_pool=bool(options.get("one_pool")),
            nodes_per_block=options.get("nodes_per_block") or 0,
            multi_node_share=options.get("multi_node_share"),
        ),
    )
    config = SimConfig(
        dispatch_interval=options["dispatch_interval"],
        checkpoint_interval=options["checkpoint_interval"],
        keep_reservations=options["keep_reservations"],
        max_waiting_per_tenant=options["max_waiting_per_tenant"],
        full_cycles=bool(options.get("full_cycles")),
        wait_reasons=bool(options.get("wait_reasons")),
    )
    write(f"Replaying {trace.name}: {len(scenario.jobs):,} jobs on {scenario.capacity:,} GPUs")
    for note in scenario.notes:
        write(f"  {note}")
    if before_replay is not None:
        before_replay(len(scenario.jobs), policies)
    results, failures = [], []
    for policy in policies:
        try:
            progress = _Progress(policy.name, write)
            result = replay_split(scenario, policy, config, options["workers"], progress)
        except ReplayStalled as error:
            failures.append(str(error))
            write(f"  {policy.name}: abandoned ({error})")
            continue
        results.append(result)
        write(f"  {policy.name}: replayed in {result.wall_seconds:.1f} s")
    settings = {key: str(value) for key, value in sorted(options.items()) if value is not None}
    data = payload(trace.name, results, scenario.notes, settings)
    data["failures"] = failures
    summaries = [entry["summary"] for entry in data["policies"]]
    write("")
    write(table(summaries))
    if data["policies"]:
        write("")
        write("Waits by job size (of avg: the part of the average wait; mostly: its reasons)")
        write(size_table(data["policies"]))
        write("")
        write("Waits by priority class (of avg: the part of the average wait)")
        write(class_table(data["policies"]))
    for failure in failures:
        write(f"not replayed: {failure}")
    _write_outputs(options, trace.name, data, summaries, write)
    return summaries


def _write_outputs(options: dict, name: str, data: dict, summaries: list[dict], write) -> None:
    out = Path(options["out"])
    out.mkdir(parents=True, exist_ok=True)
    stem = _file_stem(name)
    json_path = options.get("json") or out / f"{stem}.json"
    csv_path = options.get("csv") or out / f"{stem}.csv"
    chart_path = options.get("chart") or out / f"{stem}.png"
    write_json(Path(json_path), data)
    write_csv(Path(csv_path), summaries)
    write_chart(Path(chart_path), data)
    write(f"\nWrote {json_path}, {csv_path} and {chart_path}")


def main(argv: list[str] | None = None) -> int:
    """``python -m scheduling.simulator``."""
    parser = argparse.ArgumentParser(prog="simulate", description=__doc__)
    add_arguments(parser, out_dir=Path("var/sim"))
    options = vars(parser.parse_args(argv))
    try:
        run(options)
    except (TraceError, ValueError) as error:
        print(f"simulate: {error}", file=sys.stderr)
        return 2
    return 0
