"""Outputs of a comparison: a terminal table, JSON, CSV, and a chart over time."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from .metrics import per_tenant, summarize, timeline, wait_by_class, wait_by_size
from .simulation import ReplayResult

TABLE_COLUMNS = [
    # (heading, summary key, formatter)
    ("policy", "policy", str),
    ("jobs", "jobs", lambda v: f"{v:,}"),
    ("wait avg", "wait_avg_s", None),
    ("p50", "wait_p50_s", None),
    ("p95", "wait_p95_s", None),
    ("p99", "wait_p99_s", None),
    ("longest", "wait_max_s", None),
    (">1 d", "waited_over_day", lambda v: f"{v:,}"),
    ("1st wait", "wait_first_avg_s", None),
    (">8 GPUs", "wait_big_avg_s", None),
    ("JCT avg", "jct_avg_s", None),
    ("makespan", "makespan_s", None),
    ("util", "utilization", lambda v: f"{v:.1%}"),
    ("Jain", "fairness", lambda v: f"{v:.3f}"),
    ("Jain/day", "fairness_daily", lambda v: f"{v:.3f}"),
    ("Jain/hour", "fairness_hourly", lambda v: f"{v:.3f}"),
    ("preempt", "preemptions", lambda v: f"{v:,}"),
    (">=5x", "preempted_5_plus", lambda v: f"{v:,}"),
    ("max", "max_preemptions", lambda v: f"{v:,}"),
    ("lost GPU-h", "lost_gpu_hours", lambda v: f"{v:,.0f}"),
    ("timed out", "timed_out", lambda v: f"{v:,}"),
    ("unsched", "unschedulable", lambda v: f"{v:,}"),
    ("time", "wall_seconds", lambda v: f"{v:.1f} s"),
]
CSV_COLUMNS = [
    "trace",
    "policy",
    "jobs",
    "completed",
    "timed_out",
    "unschedulable",
    "never_started",
    "wait_avg_s",
    "wait_p50_s",
    "wait_p95_s",
    "wait_p99_s",
    "wait_max_s",
    "waited_over_day",
    "wait_beyond_day_s",
    "big_waited_over_day",
    "wait_first_avg_s",
    "wait_first_p50_s",
    "wait_first_p95_s",
    "wait_big_avg_s",
    "rewait_avg_s",
    "rewait_preempted_avg_s",
    "jct_avg_s",
    "makespan_s",
    "utilization",
    "fairness",
    "fairness_daily",
    "fairness_hourly",
    "preemptions",
    "preempted_jobs",
    "preempted_2_plus",
    "preempted_5_plus",
    "max_preemptions",
    "lost_gpu_hours",
    "lost_share",
    "gpus",
    "plans",
    "plan_seconds",
    "wall_seconds",
]


def duration(seconds: float) -> str:
    """A duration the way a person reads it: 45 s, 37 min, 5.3 h, 3.1 d."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def table(summaries: list[dict]) -> str:
    """A fixed-width table of the headline figures, one line per policy."""
    rows = [[heading for heading, _, _ in TABLE_COLUMNS]]
    for summary in summaries:
        row = []
        for _, key, formatter in TABLE_COLUMNS:
            value = summary[key]
            row.append(duration(value) if formatter is None else formatter(value))
        rows.append(row)
    return _fixed_width(rows)


def size_table(entries: list[dict]) -> str:
    """Waits by job size (``wait_by_size``), one line per policy and size: the jobs, their
    share of the GPU-hours, their average first wait and re-wait, what they add to the
    average wait, their longest wait, how many waited more than a day, and the three
    reasons that carry most of the average (with ``--wait-reasons``)."""
    rows = [
        [
            "policy",
            "GPUs",
            "jobs",
            "GPU-h",
            "1st wait",
            "re-wait",
            "of avg",
            "longest",
            ">1 d",
            "mostly",
        ]
    ]
    for entry in entries:
        for size, figures in entry["wait_by_size"].items():
            reasons = list(figures.get("reasons_h", {}).items())[:3]
            rows.append(
                [
                    entry["summary"]["policy"],
                    size,
                    f"{figures['jobs']:,}",
                    f"{figures['gpu_hours_share']:.1%}",
                    duration(figures["first_wait_h"] * 3600),
                    duration(figures["rewait_h"] * 3600),
                    duration(figures["of_average_h"] * 3600),
                    duration(figures["longest_h"] * 3600),
                    f"{figures['over_day']:,}",
                    ", ".join(f"{code} {duration(hours * 3600)}" for code, hours in reasons),
                ]
            )
    return _fixed_width(rows, text_last=True)


def class_table(entries: list[dict]) -> str:
    """Waits by priority class (``wait_by_class``), one line per policy and class: the
    jobs, their average first wait and re-wait, their preemptions, their longest wait
    and how many waited more than a day, what they add to the average wait, and how
    that splits by job size."""
    rows = [
        [
            "policy",
            "class",
            "jobs",
            "1st wait",
            "re-wait",
            "preemptions",
            "longest",
            ">1 d",
            "of avg",
            "by GPUs",
        ]
    ]
    for entry in entries:
        for name, figures in entry["wait_by_class"].items():
            rows.append(
                [
                    entry["summary"]["policy"],
                    name,
                    f"{figures['jobs']:,}",
                    duration(figures["first_wait_h"] * 3600),
                    duration(figures["rewait_h"] * 3600),
                    f"{figures['preemptions']:,}",
                    duration(figures["longest_h"] * 3600),
                    f"{figures['over_day']:,}",
                    duration(figures["of_average_h"] * 3600),
                    ", ".join(
                        f"{size}: {duration(hours * 3600)}"
                        for size, hours in figures["by_size_h"].items()
                    ),
                ]
            )
    return _fixed_width(rows, text_last=True)


def _fixed_width(rows: list[list[str]], text_last: bool = False) -> str:
    """Rows as a fixed-width table: the first column left-aligned, the others right
    (``text_last``: the last one left too, free text), a rule under the heading."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for number, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)
        ]
        if text_last:
            cells[-1] = row[-1].ljust(widths[-1])
        lines.append("  ".join(cells).rstrip())
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def payload(trace: str, results: list[ReplayResult], notes: list[str], settings: dict) -> dict:
    """Everything worth keeping of a comparison, as JSON-ready data."""
    return {
        "trace": trace,
        "notes": notes,
        "settings": settings,
        "policies": [
            {
                "summary": summarize(result),
                "tenants": per_tenant(result),
                "timeline": timeline(result),
                "wait_by_size": wait_by_size(result),
                "wait_by_class": wait_by_class(result),
            }
            for result in results
        ],
    }


def write_json(path: Path, data: dict) -> None:
    """Write the comparison as JSON."""
    path.write_text(json.dumps(data, indent=1))


def write_csv(path: Path, summaries: list[dict]) -> None:
    """Write one CSV line of figures per policy."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for summary in summaries:
            writer.writerow(summary)


def write_chart(path: Path, data: dict) -> None:
    """Jobs waiting and GPU utilization over time, one line per policy (PNG or SVG)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    from matplotlib import pyplot

    figure, (waiting, utilization) = pyplot.subplots(2, 1, figsize=(11, 7), sharex=True)
    for entry in data["policies"]:
        series = entry["timeline"]
        days = [hours / 24 for hours in series["hours"]]
        name = entry["summary"]["policy"]
        waiting.plot(days, series["waiting"], label=name, linewidth=1)
        utilization.plot(days, [value * 100 for value in series["utilization"]], label=name)
    waiting.set_ylabel("jobs waiting")
    waiting.set_title(f"Replay of {data['trace']}")
    waiting.legend(loc="upper left")
    utilization.set_ylabel("GPU utilization (%)")
    utilization.set_xlabel("days since the first submit")
    utilization.set_ylim(0, 105)
    for axis in (waiting, utilization):
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
