"""Pages of the recommendations: ``/recommendations/`` (open ones ranked by impact, and the
history of those applied or dismissed) and ``/recommendations/<pk>/`` (evidence, change,
simulate / apply / dismiss).

Platform admins see every recommendation and act on them; tenant admins read their
tenants' (read-only); members and viewers get 403; another tenant's recommendation is 404.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from portal.errors import BusinessError, NotFoundError, PermissionDeniedError
from scheduling.simulator.report import duration
from tenants.selectors import is_platform_admin

from .. import recommendations as recs
from ..choices import RecommendationKind, RecommendationState
from ..forms import DismissForm, RecommendationFilterForm
from ..selectors import (
    recommendation_get,
    recommendations_check_access,
    recommendations_visible_to,
)
from ..services import recommendations as services

HISTORY_ROWS = 50


def _check_access(user) -> None:
    try:
        recommendations_check_access(user)
    except PermissionDeniedError as exc:
        raise PermissionDenied(exc.message) from None


def _get(request, pk: int):
    try:
        return recommendation_get(request.user, pk)
    except PermissionDeniedError as exc:
        raise PermissionDenied(exc.message) from None
    except NotFoundError:
        raise Http404("No such recommendation.") from None


@login_required
def recommendation_list(request):
    """Open recommendations ranked by impact; applied and dismissed ones below."""
    _check_access(request.user)
    form = RecommendationFilterForm(request.GET or None)
    kind = state = ""
    if form.is_valid():
        kind, state = form.cleaned_data["kind"], form.cleaned_data["state"]
    visible = recommendations_visible_to(request.user)
    if kind:
        visible = visible.filter(kind=kind)
    open_recs = []
    if state in ("", RecommendationState.OPEN):
        open_recs = recs.recommendations_ranked(visible.filter(state=RecommendationState.OPEN))
    history = []
    if state != RecommendationState.OPEN:
        decided = visible.exclude(state=RecommendationState.OPEN)
        if state:
            decided = decided.filter(state=state)
        history = list(decided.order_by("-decided_at", "-id")[:HISTORY_ROWS])
    return render(
        request,
        "insights/recommendations.html",
        {
            "form": form,
            "open_recs": open_recs,
            "history": history,
            "state": state,
            "kinds": RecommendationKind.choices,
            "can_act": is_platform_admin(request.user),
            "last_run": recs.recommendations_last_run(),
            "schedule": recs.recommendations_schedule(),
        },
        # A filter it does not know is a form error (shown), the list unfiltered below it.
        status=400 if form.is_bound and form.errors else 200,
    )


@login_required
def recommendation_detail(request, pk: int):
    """Evidence, change, its simulated effect, and the steps."""
    rec = _get(request, pk)
    return render(request, "insights/recommendation.html", _detail_context(request, rec))


def _detail_context(request, rec, dismiss_form=None) -> dict:
    effect = recs.simulation_effect(rec)
    return {
        "rec": rec,
        "facts": rec.evidence.get("facts", []),
        "period": rec.evidence.get("period", {}),
        "effect": effect,
        "effect_rows": _effect_rows(effect),
        "dismiss_form": dismiss_form or DismissForm(),
        "can_act": is_platform_admin(request.user) and rec.state == RecommendationState.OPEN,
        "cooldown_days": recs.threshold("COOLDOWN_DAYS"),
    }


def _effect_rows(effect: dict | None) -> list[tuple[str, str, str]]:
    """(figure, as configured, with the change) for a finished simulation."""
    if not effect or "overall" not in effect:
        return []
    rows = []
    labels = {
        "wait_avg_s": ("average wait", "time"),
        "wait_p95_s": ("95th percentile wait", "time"),
        "utilization": ("GPU utilization", "percent"),
        "preemptions": ("preemptions", "count"),
        "unschedulable": ("jobs that could never start", "count"),
    }
    for key, (before, after) in effect["overall"].items():
        label, kind = labels[key]
        rows.append((f"All jobs: {label}", _show(before, kind), _show(after, kind)))
    tenant = effect.get("tenant")
    if tenant:
        slug = tenant["tenant"]
        for key, label, kind in (
            ("guaranteed", "guaranteed GPUs", "count"),
            ("wait_avg_s", "average wait", "time"),
            ("wait_p95_s", "95th percentile wait", "time"),
            ("gpu_hours", "GPU-hours received", "count"),
        ):
            before, after = tenant[key]
            rows.append((f"{slug}: {label}", _show(before, kind), _show(after, kind)))
    return rows


def _show(value, kind: str) -> str:
    if value is None:
        return "—"
    if kind == "time":
        return duration(value)
    if kind == "percent":
        return f"{value:.1%}"
    return f"{value:,.0f}"


@login_required
@require_POST
def recommendation_simulate(request, pk: int):
    """Queue the what-if replay of the change and open its run page."""
    rec = _get(request, pk)
    try:
        run = services.recommendation_simulate(user=request.user, recommendation=rec)
    except PermissionDeniedError as exc:
        raise PermissionDenied(exc.message) from None
    except BusinessError as exc:
        messages.error(request, exc.message)
        return redirect("recommendation", pk=rec.pk)
    return redirect("simulate-run", pk=run.pk)


@login_required
@require_POST
def recommendation_apply(request, pk: int):
    """Make the change (platform admins), audited with the recommendation."""
    rec = _get(request, pk)
    try:
        services.recommendation_apply(user=request.user, recommendation=rec)
    except PermissionDeniedError as exc:
        raise PermissionDenied(exc.message) from None
    except BusinessError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Applied: {rec.change.get('summary', rec.title)}")
    return redirect("recommendation", pk=rec.pk)


@login_required
@require_POST
def recommendation_dismiss(request, pk: int):
    """Close it with a reason (required: the form comes back with an error without one)."""
    rec = _get(request, pk)
    if not is_platform_admin(request.user):
        raise PermissionDenied("Only platform admins dismiss recommendations.")
    form = DismissForm(request.POST)
    if form.is_valid():
        try:
            services.recommendation_dismiss(
                user=request.user, recommendation=rec, reason=form.cleaned_data["reason"]
            )
        except BusinessError as exc:
            form.add_error("reason" if "reason" in exc.errors else None, exc.message)
        else:
            messages.success(request, f"Recommendation #{rec.pk} dismissed.")
            return redirect("recommendation", pk=rec.pk)
    context = _detail_context(request, rec, dismiss_form=form)
    return render(request, "insights/recommendation.html", context, status=400)


@login_required
@require_POST
def recommendations_run_now(request):
    """Compute the recommendations now (platform admins), then back to the list."""
    _check_access(request.user)
    try:
        counts = services.recommendations_run_now(user=request.user)
    except PermissionDeniedError as exc:
        raise PermissionDenied(exc.message) from None
    messages.success(
        request,
        "Recommendations computed: {created} new, {refreshed} refreshed, {held} held back by "
        "their cooldown, {closed} closed.".format(**counts),
    )
    return redirect("recommendations")
