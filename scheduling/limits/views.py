"""Pages: extend a job's runtime, exempt it from idle reclaim, decide extensions, recovery."""

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from portal.errors import BusinessError
from portal.steps import DecisionSteps
from tenants.selectors import administers_any_tenant

from .. import selectors as scheduling_selectors
from ..choices import ExtensionState
from ..services import limits, reclaim
from . import selectors
from .forms import ExtensionRequestForm, IdleExemptForm

EXTENSION_STEPS = DecisionSteps(
    {
        "approve": (limits.runtime_extension_approve, "approved"),
        "reject": (limits.runtime_extension_reject, "rejected"),
    },
    argument="extension",
    noun="Extension",
    back="extension-approvals",
)
RECOVERY_PERIODS = (1, 7, 30, 90)


def _job(request, pk):
    return get_object_or_404(scheduling_selectors.jobs_visible_to(request.user), pk=pk)


def _form_errors(form) -> str:
    return "; ".join(f"{name}: {' '.join(errors)}" for name, errors in form.errors.items())


@login_required
@require_POST
def extension_request(request, pk):
    """The job page's "extend runtime" form."""
    job = _job(request, pk)
    form = ExtensionRequestForm(request.POST)
    if not form.is_valid():
        messages.error(request, _form_errors(form))
        return redirect("job-detail", pk=job.pk)
    try:
        extension = limits.runtime_extension_request(
            user=request.user,
            job=job,
            seconds=form.cleaned_data["minutes"] * 60,
            reason=form.cleaned_data["reason"],
        )
    except BusinessError as exc:
        messages.error(request, exc.message)
    else:
        if extension.state == ExtensionState.PENDING:
            messages.success(request, f"Extension #{extension.pk} requested; the admins were told.")
        else:
            messages.success(request, f"Runtime extended by {form.cleaned_data['minutes']} min.")
    return redirect("job-detail", pk=job.pk)


@login_required
@require_POST
def job_idle_exempt(request, pk):
    """The job page's idle-reclaim exemption form (tenant and platform admins)."""
    job = _job(request, pk)
    form = IdleExemptForm(request.POST)
    if not form.is_valid():
        messages.error(request, _form_errors(form))
        return redirect("job-detail", pk=job.pk)
    hours = form.cleaned_data["hours"]
    until = timezone.now() + timedelta(hours=hours) if hours else None
    try:
        reclaim.job_idle_exempt(
            user=request.user, job=job, until=until, reason=form.cleaned_data["reason"]
        )
        messages.success(request, "Exemption saved." if until else "Exemption ended.")
    except BusinessError as exc:
        messages.error(request, exc.message)
    return redirect("job-detail", pk=job.pk)


@login_required
def extension_approvals(request):
    """Pending runtime extensions the user may decide."""
    if not administers_any_tenant(request.user):
        raise PermissionDenied("Only tenant admins and platform admins decide runtime extensions.")
    page = Paginator(selectors.extensions_decidable_by(request.user), 25).get_page(
        request.GET.get("page")
    )
    return render(request, "scheduling/extension_approvals.html", {"page": page})


@login_required
@require_POST
def extension_action(request, pk, step):
    """Approve or reject a runtime extension."""
    return EXTENSION_STEPS.post(
        request, step=step, objects=selectors.extensions_visible_to(request.user), pk=pk
    )


@login_required
def recovery(request):
    """Timeouts, reclaims, requeues and zombie kills, and the GPU-hours they freed."""
    try:
        days = int(request.GET.get("days", 7))
    except ValueError:
        days = 7
    days = days if days in RECOVERY_PERIODS else 7
    summary = selectors.waste_recovery_summary(request.user, timezone.now() - timedelta(days=days))
    return render(
        request,
        "scheduling/recovery.html",
        {"summary": summary, "days": days, "periods": RECOVERY_PERIODS},
    )
