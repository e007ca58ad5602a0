"""Pages: submit, my jobs, job detail, queues, quotas, nodes."""

import logging
from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from portal.errors import BusinessError
from portal.forms import add_business_error
from tenants.selectors import (
    administers_any_tenant,
    projects_visible_to,
    tenant_get,
    tenants_visible_to,
)

from . import selectors
from .choices import ACTIVE_STATES, JobState
from .forms import JobFilterForm, JobSubmitForm, RaiseRequestForm, RaiseStepForm, pretty_json
from .models import Allocation, WorkloadPolicy
from .positions import positions_attach
from .raise_impact import raise_impacts
from .runtime_prediction import predict_runtime
from .services import jobs as job_services
from .services import notifications as notification_services
from .services import raises as raise_services
from .services.jobs import JobSpec
from .waits import job_wait

log = logging.getLogger(__name__)


def _submit_form(request, data=None):
    user = request.user
    return JobSubmitForm(
        data,
        projects=projects_visible_to(user).filter(active=True),
        queues=selectors.queues_visible_to(user),
        priority_classes=selectors.priority_classes_visible_to(user),
        initial={"project": request.GET.get("project"), "queue": request.GET.get("queue")},
    )


def _spec_from_form(form) -> JobSpec:
    data = form.cleaned_data
    return JobSpec(
        project=data["project"],
        queue=data["queue"],
        name=data["name"],
        workload_type=data["workload_type"],
        command=data["command"],
        shell=data["shell"],
        env=data["env"],
        gpus_per_node=data["gpus_per_node"],
        nodes=data["nodes"],
        gpu_models=data["gpu_model"],
        max_runtime_seconds=data["max_runtime_seconds"],
        priority_class=data["priority_class"],
    )


@login_required
def job_submit(request):
    form = _submit_form(request, request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            job = job_services.job_submit(user=request.user, spec=_spec_from_form(form))
            messages.success(request, f"Job {job.pk} submitted.")
            return redirect("job-detail", pk=job.pk)
        except BusinessError as exc:
            add_business_error(form, exc)
    return render(
        request,
        "scheduling/job_submit.html",
        {"form": form, "policies": WorkloadPolicy.objects.all()},
    )


@login_required
def job_submit_preview(request):
    """htmx: the tenant's quota for the chosen pool and model, and how the job would run."""
    form = _submit_form(request, request.POST)
    context = {}
    if form.is_valid():
        try:
            _, admission = job_services.job_validate(user=request.user, spec=_spec_from_form(form))
            policy = WorkloadPolicy.objects.filter(
                workload_type=form.cleaned_data["workload_type"]
            ).first()
            context = {"admission": admission, "policy": policy}
        except BusinessError as exc:
            context = {"error": exc.message}
    else:
        context = {"error": "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())}
    return render(request, "scheduling/_submit_preview.html", context)


@login_required
def job_list(request):
    form = JobFilterForm(request.GET or {"mine": "on"})
    jobs = selectors.jobs_visible_to(request.user)
    if form.is_valid():
        data = form.cleaned_data
        if data["state"]:
            jobs = jobs.filter(state=data["state"])
        if data["workload_type"]:
            jobs = jobs.filter(workload_type=data["workload_type"])
        if data["mine"]:
            jobs = jobs.filter(submitted_by=request.user)
        if data["q"]:
            jobs = jobs.filter(name__icontains=data["q"])
    page = Paginator(jobs.order_by("-id"), 50).get_page(request.GET.get("page"))
    positions_attach(page.object_list)
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "scheduling/job_list.html",
        {"page": page, "form": form, "query": query.urlencode()},
    )


def _job_or_404(user, pk):
    active = Allocation.objects.filter(released_at__isnull=True).select_related("node", "gpu")
    qs = selectors.jobs_visible_to(user).prefetch_related(
        Prefetch("allocations", queryset=active, to_attr="active_allocations")
    )
    return get_object_or_404(qs, pk=pk)


def _order_explanation(job, policy, now) -> dict:
    """How the scheduler orders the job inside its class (the "Why it waits" panel)."""
    max_wait = policy.max_wait_seconds if policy else settings.SLUICE_MAX_WAIT_SECONDS
    # The engine counts a job's wait for the max wait from its submission.
    front_at = job.submitted_at + timedelta(seconds=max_wait)
    return {
        "size_order": settings.SLUICE_SIZE_ORDER,
        "halving_seconds": settings.SLUICE_SIZE_HALVING_SECONDS,
        "fair_share_band": settings.SLUICE_FAIR_SHARE_BAND,
        "band_factor": 1 + settings.SLUICE_FAIR_SHARE_BAND,
        "max_wait_seconds": max_wait,
        "front_at": front_at,
        "front_reached": front_at <= now,
    }


@login_required
def job_detail(request, pk):
    job = _job_or_404(request.user, pk)
    policy = WorkloadPolicy.objects.filter(workload_type=job.workload_type).first()
    now = timezone.now()
    return render(
        request,
        "scheduling/job_detail.html",
        {
            "job": job,
            "policy": policy,
            "prediction": predict_runtime(job),
            "wait": job_wait(job, now),
            "order": _order_explanation(job, policy, now),
            "events": selectors.job_events_of(job),
            "allocations": selectors.job_allocations(job),
            "can_manage": selectors.can_manage_job(request.user, job),
            "is_active": job.state in ACTIVE_STATES,
            "spec_json": pretty_json(
                {
                    "command": job.command,
                    "shell": job.shell,
                    "env": job.env,
                    "gpu_models": job.gpu_models,
                    "labels": job.labels,
                    "parameters": job.parameters,
                }
            ),
        },
    )


@login_required
def job_log(request, pk):
    """htmx fragment: the tail of the job's log, refreshed while it runs."""
    from .services.nodes import job_log_path

    job = _job_or_404(request.user, pk)
    path = job_log_path(job.pk, job.attempt)
    text = ""
    if path.exists():
        with open(path, "rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - 32768))
            text = handle.read().decode("utf-8", errors="replace")
    return render(
        request,
        "scheduling/_job_log.html",
        {"job": job, "text": text, "live": job.state in (*ACTIVE_STATES, JobState.PENDING)},
    )


@login_required
@require_POST
def job_action(request, pk, step):
    job = _job_or_404(request.user, pk)
    service = {
        "cancel": job_services.job_cancel,
        "hold": job_services.job_hold,
        "release": job_services.job_release,
    }.get(step)
    if service is None:
        raise Http404
    try:
        service(user=request.user, job=job, reason=request.POST.get("reason", "")[:1000])
        messages.success(request, f"Job {job.pk}: {step} done.")
    except BusinessError as exc:
        messages.error(request, exc.message)
    return redirect("job-detail", pk=job.pk)


@login_required
def queue_list(request):
    queues = selectors.queues_visible_to(request.user)
    return render(request, "scheduling/queue_list.html", {"queues": queues})


@login_required
def queue_detail(request, pk):
    queue = get_object_or_404(selectors.queues_visible_to(request.user), pk=pk)
    page = Paginator(selectors.queue_pending_jobs(queue), 100).get_page(request.GET.get("page"))
    positions_attach(page.object_list)
    running = list(
        queue.jobs.filter(state__in=ACTIVE_STATES).select_related("submitted_by", "priority_class")
    )
    positions_attach(running)
    return render(
        request, "scheduling/queue_detail.html", {"queue": queue, "page": page, "running": running}
    )


@login_required
def quota_page(request, slug):
    try:
        tenant = tenant_get(request.user, slug)
    except BusinessError:
        raise Http404 from None
    return render(
        request,
        "scheduling/quota.html",
        {
            "tenant": tenant,
            "rows": selectors.tenant_quota_usage(request.user, tenant),
        },
    )


@login_required
def quota_index(request):
    tenants = tenants_visible_to(request.user)
    if tenants.count() == 1:
        return redirect("quota", slug=tenants.first().slug)
    return render(request, "scheduling/quota_index.html", {"tenants": tenants})


@login_required
def node_list(request):
    nodes = selectors.nodes_visible_to(request.user).prefetch_related("gpus")
    active = {
        a.gpu_id: a
        for a in Allocation.objects.filter(released_at__isnull=True).select_related("job")
    }
    # A GPU held by a job of a tenant the user cannot see shows as busy, without the job.
    visible_tenants = set(tenants_visible_to(request.user).values_list("pk", flat=True))
    rows = []
    for node in nodes:
        gpus = []
        for g in node.gpus.all():
            allocation = active.get(g.pk)
            job_visible = allocation is not None and allocation.job.tenant_id in visible_tenants
            gpus.append({"gpu": g, "allocation": allocation, "job_visible": job_visible})
        rows.append({"node": node, "gpus": gpus})
    template = "scheduling/_nodes_table.html" if request.htmx else "scheduling/node_list.html"
    return render(request, template, {"rows": rows, "is_admin": request.user.is_staff})


# --- priority raises, approvals inbox, notifications ----------------------------------------

RAISE_STEPS = {
    "approve": (raise_services.priority_raise_approve, "approved"),
    "reject": (raise_services.priority_raise_reject, "rejected"),
    "revoke": (raise_services.priority_raise_revoke, "revoked"),
    "cancel": (raise_services.priority_raise_cancel, "cancelled"),
}


@login_required
def raise_request(request, pk):
    """Ask for a higher class for a job (the job page's form posts here; errors show here)."""
    job = _job_or_404(request.user, pk)
    form = RaiseRequestForm(request.POST or None, user=request.user, job=job)
    if request.method == "POST" and form.is_valid():
        try:
            raise_ = raise_services.priority_raise_request(
                user=request.user, job=job, **form.cleaned_data
            )
            messages.success(
                request, f"Raise #{raise_.pk} requested; the approvers have been notified."
            )
            return redirect("job-detail", pk=job.pk)
        except BusinessError as exc:
            add_business_error(form, exc)
    return render(request, "scheduling/raise_request.html", {"job": job, "form": form})


def _impacts(raises) -> dict:
    """The engine's what-if for each raise; the inbox still works if it fails."""
    try:
        return raise_impacts(raises)
    except Exception:
        log.exception("could not compute the impact of raises %s", [r.pk for r in raises])
        return {}


@login_required
def approvals(request):
    """Pending raises the user may decide, each with what granting it would change."""
    if not administers_any_tenant(request.user):
        raise PermissionDenied("Only tenant admins and platform admins decide priority raises.")
    page = Paginator(selectors.raises_decidable_by(request.user), 10).get_page(
        request.GET.get("page")
    )
    pending = list(page.object_list)
    impacts = _impacts(pending)
    return render(
        request,
        "scheduling/approvals.html",
        {
            "page": page,
            "rows": [{"raise": r, "impact": impacts.get(r.pk)} for r in pending],
            "grants": selectors.raises_revocable_by(request.user)[:50],
        },
    )


def _next_url(request, default: str) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return default


@login_required
@require_POST
def raise_action(request, pk, step):
    """Approve, reject, revoke or cancel a raise from the inbox or the job page."""
    raise_ = get_object_or_404(selectors.raises_visible_to(request.user), pk=pk)
    if step not in RAISE_STEPS:
        raise Http404
    service, done = RAISE_STEPS[step]
    form = RaiseStepForm(request.POST)
    comment = form.cleaned_data["comment"] if form.is_valid() else ""
    try:
        service(raise_=raise_, user=request.user, comment=comment)
        messages.success(request, f"Raise #{raise_.pk} {done}.")
    except BusinessError as exc:
        messages.error(request, exc.message)
    return redirect(_next_url(request, "approvals"))


@login_required
def notification_list(request):
    page = Paginator(selectors.notifications_of(request.user), 50).get_page(request.GET.get("page"))
    return render(request, "scheduling/notification_list.html", {"page": page})


@login_required
@require_POST
def notification_read(request, pk):
    """Mark one notification read; with ``open`` go on to what it is about."""
    notification = get_object_or_404(selectors.notifications_of(request.user), pk=pk)
    notification_services.notification_mark_read(user=request.user, notification=notification)
    link = notification.link
    if request.POST.get("open") and url_has_allowed_host_and_scheme(link, allowed_hosts=None):
        return redirect(link)
    return redirect("notification-list")


@login_required
@require_POST
def notifications_read_all(request):
    count = notification_services.notifications_mark_all_read(user=request.user)
    messages.success(request, f"{count} notification(s) marked read.")
    return redirect("notification-list")
