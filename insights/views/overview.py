"""The insights page: charts of the history and the five questions of the platform team
(which queues wait long, which teams use GPUs abnormally, which jobs fail often, which GPUs
sit idle long, which inference capacity is near its limit, inference services included),
each a ranked table with links to where one acts."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from scheduling.choices import ReclaimKind
from tenants.models import Tenant

from ..selectors import (
    IDLE_SHARE_FLAG,
    NEAR_CAPACITY,
    PERIODS,
    insights_for,
    insights_scope,
    period_from,
    services_near_capacity_for,
)

PALETTE = ["#2458d6", "#c0392b", "#1f8a4c", "#b7791f", "#8e6bd6", "#17a2b8", "#6b7385"]
GREY = "#9aa4b8"


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _line(labels, datasets, *, y_format=None, y_title="", stacked=False) -> dict:
    y = {"beginAtZero": True, "title": {"display": bool(y_title), "text": y_title}}
    if y_format:
        y["ticks"] = {"format": y_format}
    if stacked:
        y["stacked"] = True
    return {
        "type": "line",
        "data": {"labels": labels, "datasets": datasets},
        "options": {
            "spanGaps": True,
            "elements": {"point": {"radius": 0}, "line": {"borderWidth": 2, "tension": 0.2}},
            "interaction": {"mode": "index", "intersect": False},
            "plugins": {"legend": {"position": "bottom", "labels": {"boxWidth": 12}}},
            "scales": {"x": {"ticks": {"maxTicksLimit": 8, "maxRotation": 0}}, "y": y},
        },
    }


def _bar(labels, datasets, *, horizontal=False, y_format=None, stacked=False, title="") -> dict:
    value_axis = {"beginAtZero": True, "title": {"display": bool(title), "text": title}}
    if y_format:
        value_axis["ticks"] = {"format": y_format}
    category_axis: dict = {"ticks": {"autoSkip": False}}
    if stacked:
        value_axis["stacked"] = category_axis["stacked"] = True
    # charts.js formats the ticks of the axis named "y"; a horizontal bar's values are on x.
    scales = (
        {"x": value_axis, "y": category_axis}
        if horizontal
        else {"x": category_axis, "y": value_axis}
    )
    return {
        "type": "bar",
        "data": {"labels": labels, "datasets": datasets},
        "options": {
            "indexAxis": "y" if horizontal else "x",
            "datasets": {"bar": {"maxBarThickness": 36}},
            "plugins": {"legend": {"position": "bottom", "labels": {"boxWidth": 12}}},
            "scales": scales,
        },
    }


def _wait_chart(data) -> dict | None:
    queues = data["wait_chart_queues"]
    if not queues:
        return None
    datasets = []
    for i, r in enumerate(queues):
        series = data["queue_series"][r["queue"].pk]
        name = f"{r['queue'].tenant.slug}/{r['queue'].name}"
        datasets.append(
            {"label": f"{name} p95", "data": series["p95"], "borderColor": _color(i)}
            | {"backgroundColor": _color(i)}
        )
        datasets.append(
            {
                "label": f"{name} p50",
                "data": series["p50"],
                "borderColor": _color(i),
                "backgroundColor": _color(i),
                "borderDash": [4, 4],
                "borderWidth": 1,
            }
        )
    return _line(data["window"].labels(), datasets, y_format="duration", y_title="wait")


def _depth_chart(data) -> dict | None:
    queues = data["depth_chart_queues"]
    if not queues:
        return None
    datasets = [
        {
            "label": f"{r['queue'].tenant.slug}/{r['queue'].name}",
            "data": data["queue_series"][r["queue"].pk]["depth"],
            "borderColor": _color(i),
            "backgroundColor": _color(i),
        }
        for i, r in enumerate(queues)
    ]
    return _line(data["window"].labels(), datasets, y_title="pending jobs")


def _pool_charts(data) -> list[dict]:
    charts = []
    labels = data["window"].labels()
    for p in data["pools"]:
        series = data["pool_series"].get(p["pool"].pk)
        if series is None:
            continue
        datasets = [
            {
                "label": "capacity",
                "data": series["cap"],
                "borderColor": GREY,
                "backgroundColor": GREY,
                "borderDash": [6, 4],
                "borderWidth": 1,
            },
            {
                "label": "allocated",
                "data": series["alloc"],
                "borderColor": PALETTE[0],
                "backgroundColor": PALETTE[0],
            },
            {
                "label": "used",
                "data": series["used"],
                "borderColor": PALETTE[2],
                "backgroundColor": PALETTE[2],
            },
            {
                "label": "allocated but idle",
                "data": series["idle"],
                "borderColor": PALETTE[1],
                "backgroundColor": PALETTE[1],
            },
        ]
        charts.append(
            {
                "pool": p,
                "id": f"chart-pool-{p['pool'].pk}",
                "config": _line(labels, datasets, y_title="GPUs"),
            }
        )
    return charts


def _tenant_chart(data) -> dict | None:
    tenants = data["teams"]["per_tenant"]
    if not tenants:
        return None
    labels = [t["tenant"].slug for t in tenants]

    def values(key):
        return [round(t[key], 2) for t in tenants]

    return _bar(
        labels,
        [
            {
                "label": "allocated (mean)",
                "data": values("allocated"),
                "backgroundColor": PALETTE[0],
            },
            {"label": "used (mean)", "data": values("used"), "backgroundColor": PALETTE[2]},
            {"label": "idle while held", "data": values("idle"), "backgroundColor": PALETTE[1]},
            {"label": "guarantee", "data": values("guaranteed"), "backgroundColor": GREY},
        ],
        title="GPUs",
    )


def _failure_chart(rows, label_of) -> dict | None:
    rows = [r for r in rows if r["total"]][:10]
    if not rows:
        return None
    return _bar(
        [label_of(r) for r in rows],
        [
            {
                "label": "failure rate",
                "data": [round(100 * r["rate"], 1) for r in rows],
                "backgroundColor": PALETTE[1],
            }
        ],
        horizontal=True,
        y_format=None,
        title="% of ended jobs that failed",
    )


def _idle_chart(data) -> dict | None:
    rows = data["idle_gpus"]
    if not rows:
        return None
    return _bar(
        [f"{r['gpu'].node.name}:{r['gpu'].index}" for r in rows],
        [
            {
                "label": "hours idle",
                "data": [round(r["idle_seconds"] / 3600, 1) for r in rows],
                "backgroundColor": PALETTE[3],
            }
        ],
        horizontal=True,
        title="hours since last busy",
    )


def _recovery_chart(data) -> dict | None:
    over_time = data["recoveries"]["over_time"]
    if not over_time:
        return None
    short = data["window"].period.length.days < 2
    fmt = "%H:00" if short else "%d %b"
    labels = sorted({r["at"] for r in over_time})
    kinds = sorted({r["kind"] for r in over_time})
    names = dict(ReclaimKind.choices)
    index = {at: i for i, at in enumerate(labels)}
    datasets = []
    for i, kind in enumerate(kinds):
        values = [0.0] * len(labels)
        for r in over_time:
            if r["kind"] == kind:
                values[index[r["at"]]] = round(r["gpu_hours"] or 0.0, 2)
        datasets.append(
            {"label": names.get(kind, kind), "data": values, "backgroundColor": _color(i)}
        )
    return _bar([at.strftime(fmt) for at in labels], datasets, stacked=True, title="GPU-hours")


def _charts(data) -> dict:
    failures = data["failures"]
    return {
        "wait": _wait_chart(data),
        "depth": _depth_chart(data),
        "pools": _pool_charts(data),
        "tenants": _tenant_chart(data),
        "fail_project": _failure_chart(
            failures["by_project"], lambda r: f"{r['tenant__slug']}/{r['project__slug']}"
        ),
        "fail_type": _failure_chart(failures["by_type"], lambda r: r["label"]),
        "idle": _idle_chart(data),
        "recovery": _recovery_chart(data),
    }


def _coverage_note(data) -> str:
    """Where the history covers less than the period: how much, so that a mean diluted by
    the hours before the first record reads as such."""
    coverage, window = data["coverage"], data["window"]
    period_hours = window.period.length.total_seconds() / 3600
    recorded_hours = coverage.recorded * window.period.bucket_hours
    if not coverage.recorded or recorded_hours >= period_hours - 3 * window.period.bucket_hours:
        return ""
    if period_hours > 48:
        return f"History recorded for {recorded_hours / 24:.1f} of {period_hours / 24:.0f} days"
    return f"History recorded for {recorded_hours:.1f} of {period_hours:.0f} hours"


@login_required
def insights(request):
    scope = insights_scope(request.user)
    if scope is None:
        raise PermissionDenied(
            "The insights are for tenant admins (their tenant) and platform admins: ask an "
            "admin of your tenant."
        )
    period, period_error = period_from(request.GET.get("period"))
    data = insights_for(scope, period)
    failures = data["failures"]
    reclaim_names = dict(ReclaimKind.choices)
    for r in data["recoveries"]["by_kind"]:
        r["label"] = reclaim_names.get(r["kind"], r["kind"])
    context = {
        **data,
        "scope": scope,
        "period": data["window"].period,  # the 24 h view may fall back to hour rows
        "periods": list(PERIODS.values()),
        "period_error": period_error,
        "charts": _charts(data),
        "has_history": bool(
            data["buckets"] or data["queue_waits"] or failures["ended"] or data["idle_gpus"]
        ),
        "reclaimed_gpu_hours": sum(
            r["gpu_hours"] or 0.0
            for r in data["recoveries"]["by_kind"]
            if r["kind"] != ReclaimKind.PREEMPTION_REQUEUE
        ),
        "preempted_gpu_hours": sum(
            r["gpu_hours"] or 0.0
            for r in data["recoveries"]["by_kind"]
            if r["kind"] == ReclaimKind.PREEMPTION_REQUEUE
        ),
        "totals": {
            key: sum(p[key] for p in data["pools"]) for key in ("capacity", "allocated", "used")
        },
        "coverage_note": _coverage_note(data),
        "scope_tenants": [] if scope.platform else Tenant.objects.filter(pk__in=scope.tenant_ids),
        "idle_flag": round(IDLE_SHARE_FLAG * 100),
        "near_capacity": NEAR_CAPACITY,
        "services_near_capacity": services_near_capacity_for(request.user, scope),
        "since_choice": {"24h": "1d", "7d": "7d", "30d": "30d"}[period.key],
    }
    return render(request, "insights/insights.html", context)
