"""Pages of the what-if simulator, for platform admins only: ``/simulate/`` and its runs.

A platform admin edits quotas or the class of a tenant's jobs, starts a replay of the
recorded jobs (a Celery task), watches its progress (htmx, every 2 s) and compares the
waits and GPU-hours per tenant with and without the change. Others get 403 on the form
and 404 on runs (which are not theirs to see).
"""

from __future__ import annotations

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render

from portal.errors import BusinessError, NotFoundError
from portal.forms import add_business_error
from tenants.models import Tenant
from tenants.selectors import is_platform_admin

from .models import PriorityClass, Quota, SimulationRun
from .services import whatif
from .simulator import POLICIES
from .simulator.report import duration

RECENT_RUNS = 20


class WhatIfForm(forms.Form):
    """History window, policy, and one field per quota number and per tenant's class."""

    days = forms.IntegerField(min_value=1, max_value=whatif.MAX_DAYS, initial=whatif.DEFAULT_DAYS)
    policy = forms.ChoiceField(
        choices=[(name, name) for name in POLICIES], initial=whatif.DEFAULT_POLICY
    )

    def __init__(self, *args, quotas, tenants, classes, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.quotas = list(quotas)
        self.tenants = list(tenants)
        for quota in self.quotas:
            self.fields[f"quota_{quota.pk}_guaranteed"] = forms.IntegerField(
                min_value=0, initial=quota.guaranteed_gpus
            )
            self.fields[f"quota_{quota.pk}_borrow"] = forms.IntegerField(
                min_value=0, initial=quota.borrow_limit_gpus
            )
        choices = [("", "as recorded")] + [(cls.name, cls.name) for cls in classes]
        for tenant in self.tenants:
            self.fields[f"class_{tenant.slug}"] = forms.ChoiceField(choices=choices, required=False)

    def quota_rows(self) -> list[tuple]:
        """(quota, guaranteed field, borrow field) for the template."""
        return [
            (quota, self[f"quota_{quota.pk}_guaranteed"], self[f"quota_{quota.pk}_borrow"])
            for quota in self.quotas
        ]

    def tenant_rows(self) -> list[tuple]:
        """(tenant, class field) for the template."""
        return [(tenant, self[f"class_{tenant.slug}"]) for tenant in self.tenants]

    def params(self) -> dict:
        """The what-if parameters: only quotas that differ from the current ones."""
        data = self.cleaned_data
        quotas = {}
        for quota in self.quotas:
            guaranteed = data[f"quota_{quota.pk}_guaranteed"]
            borrow = data[f"quota_{quota.pk}_borrow"]
            if (guaranteed, borrow) != (quota.guaranteed_gpus, quota.borrow_limit_gpus):
                quotas[str(quota.pk)] = {"guaranteed": guaranteed, "borrow_limit": borrow}
        classes = {
            tenant.slug: data[f"class_{tenant.slug}"]
            for tenant in self.tenants
            if data.get(f"class_{tenant.slug}")
        }
        return {
            "days": data["days"],
            "policy": data["policy"],
            "quotas": quotas,
            "classes": classes,
        }


def _require_platform_admin(user) -> None:
    if not is_platform_admin(user):
        raise PermissionDenied("Only platform admins run what-if simulations.")


def _run_or_404(user, pk: int) -> SimulationRun:
    try:
        return whatif.simulation_run_get(user, pk)
    except NotFoundError:
        raise Http404("No such simulation.") from None


@login_required
def simulate_index(request):
    """The what-if form and the latest runs."""
    _require_platform_admin(request.user)
    form = WhatIfForm(
        request.POST or None,
        quotas=Quota.objects.select_related("tenant", "pool").order_by(
            "tenant__slug", "pool__name", "gpu_model"
        ),
        tenants=Tenant.objects.order_by("slug"),
        classes=PriorityClass.objects.all(),
    )
    if request.method == "POST" and form.is_valid():
        try:
            run = whatif.simulation_run_create(user=request.user, params=form.params())
            return redirect("simulate-run", pk=run.pk)
        except BusinessError as exc:
            add_business_error(form, exc)
    runs = whatif.simulation_runs_visible_to(request.user)[:RECENT_RUNS]
    return render(request, "scheduling/simulator.html", {"form": form, "runs": runs})


@login_required
def simulate_run(request, pk: int):
    """One run: its parameters, its progress while it runs, the comparison when done."""
    run = _run_or_404(request.user, pk)
    return render(request, "scheduling/simulator_run.html", _run_context(run))


@login_required
def simulate_run_status(request, pk: int):
    """htmx: the progress or the result of a run (polled every 2 s until it ends)."""
    run = _run_or_404(request.user, pk)
    return render(request, "scheduling/simulator_status.html", _run_context(run))


def _run_context(run: SimulationRun) -> dict:
    context: dict = {"run": run}
    result = run.result or {}
    if run.state == "done" and result:
        context["overall"] = _overall_rows(result)
        context["tenants"] = _tenant_rows(result.get("comparison", []))
    return context


def _overall_rows(result: dict) -> list[tuple[str, str, str]]:
    """(figure, baseline, changed) for the headline figures. Waits count every re-wait
    after a preemption; figures a run stored before they existed are left out."""
    before, after = result["baseline"]["summary"], result["changed"]["summary"]
    rows = []
    for label, key, kind in (
        ("average wait", "wait_avg_s", "time"),
        ("median wait", "wait_p50_s", "time"),
        ("95th percentile wait", "wait_p95_s", "time"),
        ("longest wait", "wait_max_s", "time"),
        ("jobs that waited more than a day", "waited_over_day", "count"),
        ("average wait for the first start", "wait_first_avg_s", "time"),
        ("average re-wait of a preempted job", "rewait_preempted_avg_s", "time"),
        ("average wait of jobs over 8 GPUs", "wait_big_avg_s", "time"),
        ("average completion time", "jct_avg_s", "time"),
        ("GPU utilization", "utilization", "percent"),
        ("fairness (Jain, per day)", "fairness_daily", "ratio"),
        ("fairness (Jain, per hour)", "fairness_hourly", "ratio"),
        ("preemptions", "preemptions", "count"),
        ("jobs preempted 5 times or more", "preempted_5_plus", "count"),
        ("most preemptions of one job", "max_preemptions", "count"),
        ("GPU-hours lost to preemption", "lost_gpu_hours", "count"),
        ("share of GPU-hours lost to preemption", "lost_share", "percent"),
        ("jobs that could never start", "unschedulable", "count"),
    ):
        if key in before and key in after:
            rows.append((label, _show(before[key], kind), _show(after[key], kind)))
    return rows


def _tenant_rows(comparison: list[dict]) -> list[dict]:
    return [
        {
            "tenant": row["tenant"],
            "jobs": row["jobs"],
            "guaranteed": _pair(row["guaranteed_before"], row["guaranteed_after"], "count"),
            "wait_avg": _pair(row["wait_avg_before_s"], row["wait_avg_after_s"], "time"),
            "wait_p95": _pair(row["wait_p95_before_s"], row["wait_p95_after_s"], "time"),
            "gpu_hours": _pair(row["gpu_hours_before"], row["gpu_hours_after"], "count"),
            "use": _pair(row["use_before"], row["use_after"], "percent"),
        }
        for row in comparison
    ]


def _pair(before: float, after: float, kind: str) -> str:
    if _show(before, kind) == _show(after, kind):
        return _show(before, kind)
    return f"{_show(before, kind)} → {_show(after, kind)}"


def _show(value: float, kind: str) -> str:
    if kind == "time":
        return duration(value)
    if kind == "percent":
        return f"{value:.1%}"
    if kind == "ratio":
        return f"{value:.3f}"
    return f"{value:,.0f}"
