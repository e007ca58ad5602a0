"""The usage page (chargeback): ``/usage/``, the same report as ``GET /api/v1/usage``."""

from __future__ import annotations

import datetime as dt

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import render
from django.urls import reverse

from scheduling.choices import WorkloadType
from scheduling.selectors import pools_visible_to
from tenants.selectors import projects_visible_to, tenants_visible_to

from .. import usage

PAGE_ROWS = 100
GROUP_LABELS = {
    "day": "Day",
    "tenant": "Tenant",
    "project": "Project",
    "user": "User",
    "workload_type": "Workload type",
    "pool": "Pool",
    "gpu_model": "GPU model",
}


class UsageFilterForm(forms.Form):
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    group_by = forms.MultipleChoiceField(
        required=False,
        choices=[(d, GROUP_LABELS[d]) for d in usage.GROUP_BY_CHOICES],
        widget=forms.CheckboxSelectMultiple,
        label="Group by",
    )
    tenant = forms.ChoiceField(required=False)
    project = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    pool = forms.ChoiceField(required=False)
    user = forms.CharField(required=False, max_length=150, label="User name")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        tenants = list(tenants_visible_to(user).order_by("slug").values_list("slug", flat=True))
        self.fields["tenant"].choices = [("", "all"), *((t, t) for t in tenants)]
        projects = projects_visible_to(user).order_by("tenant__slug", "slug")
        self.fields["project"].choices = [
            ("", "all"),
            *((p.pk, f"{p.tenant.slug}/{p.slug}") for p in projects),
        ]
        pools = pools_visible_to(user).order_by("name").values_list("name", flat=True)
        self.fields["pool"].choices = [("", "all"), *((p, p) for p in pools)]

    def clean(self):
        data = super().clean()
        end = data.get("end") or usage.default_range()[1]
        start = data.get("start") or usage.default_start(end)
        for name, messages in usage.range_errors(start, end).items():
            self.add_error(name, messages)
        data["start"], data["end"] = start, end
        return data

    def to_query(self) -> usage.UsageQuery:
        data = self.cleaned_data
        return usage.UsageQuery(
            start=data["start"],
            end=data["end"],
            group_by=usage.canonical_group_by(data.get("group_by") or usage.DEFAULT_GROUP_BY),
            tenants=(data["tenant"],) if data.get("tenant") else (),
            projects=(data["project"],) if data.get("project") else (),
            pools=(data["pool"],) if data.get("pool") else (),
            users=(data["user"].strip(),) if (data.get("user") or "").strip() else (),
        )


def _display(column: str, value) -> str:
    if value is None:
        return "—"
    if column == "workload_type":
        return WorkloadType(value).label if value in WorkloadType.values else value
    return str(value)


def _chart(days: list[dict], guaranteed: list[float]) -> dict:
    """Daily allocated and used GPU-hours, and each day's guarantee (as in force that day)
    as a line."""
    return {
        "type": "bar",
        "data": {
            "labels": [d["day"].strftime("%m-%d") for d in days],
            "datasets": [
                {
                    "type": "line",
                    "label": "Guaranteed",
                    "data": guaranteed,
                    "borderColor": "#141a26",
                    "borderDash": [4, 4],
                    "pointRadius": 0,
                    "borderWidth": 1.5,
                },
                {
                    "label": "Allocated",
                    "data": [d["allocated"] for d in days],
                    "backgroundColor": "#9db5ef",
                },
                {"label": "Used", "data": [d["used"] for d in days], "backgroundColor": "#1f8a4c"},
            ],
        },
        "options": {
            "plugins": {"legend": {"position": "bottom"}},
            "scales": {
                "x": {"grid": {"display": False}},
                "y": {"beginAtZero": True, "title": {"display": True, "text": "GPU-hours"}},
            },
        },
    }


@login_required
def usage_page(request):
    data = request.GET.copy()
    # The form shows the range it reports on, defaults included.
    default_end = usage.default_range()[1]
    if not data.get("end"):
        data["end"] = default_end.isoformat()
    if not data.get("start"):
        try:
            end = dt.date.fromisoformat(data["end"])
        except ValueError:
            end = default_end
        data["start"] = usage.default_start(end).isoformat()
    if not data.getlist("group_by"):
        data.setlist("group_by", list(usage.DEFAULT_GROUP_BY))
    form = UsageFilterForm(data, user=request.user)
    if not form.is_valid():
        return render(request, "insights/usage.html", {"form": form}, status=400)
    query = form.to_query()
    report = usage.usage_report(request.user, query)
    page = Paginator(report.rows, PAGE_ROWS).get_page(request.GET.get("page"))
    rows = [
        {
            "cells": [_display(c, row.get(c)) for c in report.columns],
            **{k: row[k] for k in usage.FIGURE_COLUMNS},
        }
        for row in page.object_list
    ]
    params = request.GET.copy()
    params.pop("page", None)
    params.pop("format", None)
    csv_params = params.copy()
    csv_params["format"] = "csv"
    days = usage.usage_by_day(request.user, query)
    return render(
        request,
        "insights/usage.html",
        {
            "form": form,
            "query": query,
            "report": report,
            "headers": [GROUP_LABELS[c] for c in report.columns],
            "rows": rows,
            "page": page,
            "params": params.urlencode(),
            "csv_url": f"{reverse('api-usage')}?{csv_params.urlencode()}",
            "chart": _chart(days, report.guaranteed_by_day()),
        },
    )
