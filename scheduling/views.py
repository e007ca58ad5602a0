"""Pages: submit, my jobs, job detail, queues, quotas, nodes."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from portal.errors import BusinessError
from portal.forms import add_business_error
from tenants.selectors import projects_visible_to, tenant_get, tenants_visible_to

from . import selectors
from .choices import ACTIVE_STATES, JobState
from .forms import JobFilterForm, JobSubmitForm, pretty_json
from .models import Allocation, WorkloadPolicy
from .services import jobs as job_services
from .services.jobs import JobSpec


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


@login_required
def job_detail(request, pk):
    job = _job_or_404(request.user, pk)
    policy = WorkloadPolicy.objects.filter(workload_type=job.workload_type).first()
    return render(
        request,
        "scheduling/job_detail.html",
        {
            "job": job,
            "policy": policy,
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
    running = queue.jobs.filter(state__in=ACTIVE_STATES).select_related(
        "submitted_by", "priority_class"
    )
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
    rows = []
    for node in nodes:
        gpus = [{"gpu": g, "allocation": active.get(g.pk)} for g in node.gpus.all()]
        rows.append({"node": node, "gpus": gpus})
    template = "scheduling/_nodes_table.html" if request.htmx else "scheduling/node_list.html"
    return render(request, template, {"rows": rows, "is_admin": request.user.is_staff})
