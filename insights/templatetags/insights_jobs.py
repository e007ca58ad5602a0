"""``{% job_gpu_chart job %}``: the job page's chart of its GPUs over its run (utilization
and memory, from the rollup writer's ``JobGpuSeries``) and a sentence that tells the owner
whether the GPUs held are used."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime

from django import template
from django.utils import timezone

from insights.models import JobGpuSeries
from scheduling.choices import DEFAULT_IDLE_THRESHOLD
from scheduling.models import WorkloadPolicy
from scheduling.services.waste import human_duration

register = template.Library()

#: Up to this many GPUs a line per GPU; beyond it, the mean and a band of ± one deviation.
LINES_PER_GPU = 4
COLORS = ["#2f6fde", "#1e8e3e", "#e4a11b", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d", "#d35400"]
MIB_PER_GIB = 1024


def usage_verdict(percent: float) -> str:
    if percent < 5:
        return "idle"
    if percent < 30:
        return "mostly idle"
    if percent < 70:
        return "partly used"
    return "well used"


def _labels(stamps: list[int]) -> list[str]:
    moments = [timezone.localtime(datetime.fromtimestamp(s, UTC)) for s in stamps]
    several_days = bool(moments) and (moments[-1].date() != moments[0].date())
    fmt = "%d %b %H:%M" if several_days else "%H:%M"
    return [m.strftime(fmt) for m in moments]


def _gib(value):
    return None if value is None else round(value / MIB_PER_GIB, 2)


def _column(points: list, which: int, index: int) -> list:
    return [p[which][index] if index < len(p[which]) else None for p in points]


def _mean_and_spread(values: list) -> tuple:
    known = [v for v in values if v is not None]
    if not known:
        return None, None
    return statistics.fmean(known), (statistics.pstdev(known) if len(known) > 1 else 0.0)


def chart_config(series: JobGpuSeries) -> dict:
    """A Chart.js line chart: utilization (%) on the left axis, memory (GiB, dashed) on the
    right; a line per GPU, or the mean with a ± one standard deviation band when many."""
    points = series.points
    width = max((len(p[1]) for p in points), default=0)
    datasets = []
    if width <= LINES_PER_GPU:
        for i in range(width):
            name = series.gpus[i] if i < len(series.gpus) else f"GPU {i}"
            color = COLORS[i % len(COLORS)]
            datasets.append(_line(f"{name} utilization", _column(points, 1, i), color, "y"))
            datasets.append(
                _line(
                    f"{name} memory",
                    [_gib(v) for v in _column(points, 2, i)],
                    color,
                    "y1",
                    dashed=True,
                )
            )
    else:
        util = [_mean_and_spread(p[1]) for p in points]
        memory = [_mean_and_spread(p[2])[0] for p in points]
        low = [None if m is None else round(max(m - s, 0.0), 1) for m, s in util]
        high = [None if m is None else round(min(m + s, 100.0), 1) for m, s in util]
        band = "rgba(47, 111, 222, 0.15)"
        datasets.append({**_line("mean − 1 σ", low, band, "y"), "pointRadius": 0, "borderWidth": 0})
        datasets.append(
            {
                **_line("mean + 1 σ", high, band, "y"),
                "pointRadius": 0,
                "borderWidth": 0,
                "fill": "-1",
                "backgroundColor": band,
            }
        )
        datasets.append(
            _line(
                f"mean utilization of {width} GPUs",
                [None if m is None else round(m, 1) for m, _ in util],
                COLORS[0],
                "y",
            )
        )
        datasets.append(
            _line("mean memory", [_gib(v) for v in memory], COLORS[1], "y1", dashed=True)
        )
    return {
        "type": "line",
        "data": {"labels": _labels([p[0] for p in points]), "datasets": datasets},
        "options": {
            "maintainAspectRatio": True,
            "aspectRatio": 3.2,
            "spanGaps": False,
            "interaction": {"mode": "index", "intersect": False},
            "plugins": {"legend": {"position": "bottom", "labels": {"boxWidth": 12}}},
            "scales": {
                "y": {
                    "min": 0,
                    "max": 100,
                    "title": {"display": True, "text": "utilization"},
                    "ticks": {"format": "percent"},
                },
                "y1": {
                    "position": "right",
                    "min": 0,
                    "title": {"display": True, "text": "memory (GiB)"},
                    "grid": {"drawOnChartArea": False},
                },
                "x": {"ticks": {"maxTicksLimit": 10, "autoSkip": True}},
            },
        },
    }


def _line(label: str, data: list, color: str, axis: str, *, dashed: bool = False) -> dict:
    line = {
        "label": label,
        "data": data,
        "borderColor": color,
        "backgroundColor": color,
        "yAxisID": axis,
        "pointRadius": 0,
        "borderWidth": 1.5,
        "tension": 0.2,
    }
    if dashed:
        line["borderDash"] = [5, 4]
    return line


def idle_tail_seconds(series: JobGpuSeries, threshold: float) -> float:
    """How long the last points have had every GPU known and below ``threshold`` %."""
    points = series.points
    first_idle = None
    for point in reversed(points):
        known = [v for v in point[1] if v is not None]
        if not known or max(known) >= threshold:
            break
        first_idle = point
    if first_idle is None:
        return 0.0
    return float(points[-1][0] - first_idle[0] + series.step_seconds)


def usage_summary(
    series: JobGpuSeries, gpus: int, threshold: float = 5.0
) -> tuple[str, str, float | None]:
    """("8 GPUs held for 3 h, used 12 % on average — mostly idle", verdict, percent); the
    sentence adds how long the GPUs have been idle when the last 10 minutes or more were."""
    gpus = gpus or len(series.gpus) or 1
    if series.allocated_gpu_seconds > 0:
        percent = 100.0 * series.used_gpu_seconds / series.allocated_gpu_seconds
        held = human_duration(series.allocated_gpu_seconds / gpus)
    else:
        known = [v for p in series.points for v in p[1] if v is not None]
        if not known:
            return "No utilization sample has reached the portal yet.", "", None
        percent = statistics.fmean(known)
        held = "less than a minute"
    verdict = usage_verdict(percent)
    noun = "GPU" if gpus == 1 else "GPUs"
    sentence = f"{gpus} {noun} held for {held}, used {percent:.0f} % on average — {verdict}"
    idle = idle_tail_seconds(series, threshold)
    if idle >= 600 and verdict != "idle":
        sentence += f"; idle (below {threshold:g} %) for the last {human_duration(idle)}"
    return f"{sentence}.", verdict, percent


@register.inclusion_tag("insights/_job_gpu_chart.html")
def job_gpu_chart(job) -> dict:
    """The job's GPUs over its run; nothing for a job that never ran."""
    series = JobGpuSeries.objects.filter(job_id=job.pk).first()
    if series is None:
        return {"show": job.started_at is not None, "job": job, "config": None}
    threshold = (
        WorkloadPolicy.objects.filter(workload_type=job.workload_type)
        .values_list("idle_utilization_threshold", flat=True)
        .first()
    )
    summary, verdict, percent = usage_summary(
        series, job.total_gpus, DEFAULT_IDLE_THRESHOLD if threshold is None else threshold
    )
    return {
        "show": True,
        "job": job,
        "config": chart_config(series),
        "chart_id": f"job-gpu-chart-{job.pk}",
        "summary": summary,
        "verdict": verdict.replace(" ", "-"),
        "step": series.step_seconds,
        "points": len(series.points),
    }
