"""Pages: submit, my jobs, job detail, queues, quotas, nodes."""

import logging
import shlex
from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from portal.api.pagination import CountCappedPaginator
from portal.errors import BusinessError, PermissionDeniedError
from portal.forms import add_business_error
from portal.steps import DecisionSteps, next_url
from tenants.selectors import (
    administers_any_tenant,
    is_platform_admin,
    projects_visible_to,
    tenant_get,
    tenants_visible_to,
)

from . import jobspec, selectors
from .choices import ACTIVE_STATES, FINAL_STATES, GpuHealth, JobState, NodeState
from .forms import (
    SORTS,
    BulkActionForm,
    JobFilterForm,
    JobSubmitForm,
    RaiseRequestForm,
    pretty_json,
)
from .models import Allocation, WorkloadPolicy
from .positions import positions_attach
from .raise_impact import raise_impacts
from .runtime_prediction import predict_runtime
from .services import config as config_services
from .services import jobs as job_services
from .services import notifications as notification_services
from .services import raises as raise_services
from .services.config import NODE_RETIRED_LABEL
from .services.jobs import JobSpec
from .services.pending_cache import takes_part_in_time_sharing
from .waits import job_wait

log = logging.getLogger(__name__)


def _initial_from_job(request) -> dict:
    """The submit form filled from a job the user sees ("submit again with changes")."""
    source = request.GET.get("from", "")
    job = (
        selectors.jobs_visible_to(request.user).filter(pk=source).first()
        if source.isdigit()
        else None
    )
    if job is None:
        return {"project": request.GET.get("project"), "queue": request.GET.get("queue")}
    return {
        "project": job.project_id,
        "queue": job.queue_id,
        "name": job.name,
        "workload_type": job.workload_type,
        "gpu_model": ",".join(job.gpu_models),
        "gpus_per_node": job.gpus_per_node,
        "nodes": job.nodes,
        "max_runtime_seconds": job.max_runtime_seconds,
        "priority_class": job.base_priority_class_id,
        "command": job.command[0] if job.shell else shlex.join(job.command),
        "shell": job.shell,
        "env": "\n".join(f"{k}={v}" for k, v in job.env.items()),
        "image": job.image,
        "image_pull_policy": job.image_pull_policy,
        "image_pull_secret": job.image_pull_secret,
    }


def _submit_form(request, data=None):
    user = request.user
    queues = list(selectors.queues_visible_to(user))
    return JobSubmitForm(
        data,
        projects=projects_visible_to(user).filter(active=True),
        queues=selectors.queues_visible_to(user),
        priority_classes=selectors.priority_classes_visible_to(user),
        pool_models=selectors.pool_models({q.pool_id for q in queues}),
        initial=_initial_from_job(request),
    )


def _spec_from_form(form) -> JobSpec:
    data = form.cleaned_data
    return JobSpec(**{field.attribute: data[field.name] for field in jobspec.FORM_FIELDS})


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
        {
            "form": form,
            "policies": WorkloadPolicy.objects.all(),
            "source_job": request.GET.get("from", ""),
        },
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


def _job_filter_form(request):
    user = request.user
    return JobFilterForm(
        request.GET or {"mine": "on"},
        queues=selectors.queues_visible_to(user),
        projects=projects_visible_to(user),
        tenants=tenants_visible_to(user),
    )


def _filtered_jobs(request, form):
    jobs = selectors.jobs_visible_to(request.user)
    if not form.is_valid():
        return jobs.none()  # the form shows what to correct
    data = form.cleaned_data
    for field in ("state", "workload_type", "queue", "project", "tenant"):
        if data[field]:
            jobs = jobs.filter(**{field: data[field]})
    if data["mine"]:
        jobs = jobs.filter(submitted_by=request.user)
    if data["user"]:
        jobs = jobs.filter(submitted_by__username=data["user"].strip())
    if data["q"]:
        jobs = jobs.filter(name__icontains=data["q"])
    since = form.since_delta()
    if since:
        jobs = jobs.filter(submitted_at__gte=timezone.now() - since)
    return jobs.order_by(*form.order_by())


def _sort_links(request, form) -> dict:
    """For each sortable column: the URL that sorts by it (again: the other way) and an arrow."""
    current = form.cleaned_data.get("sort", "") if form.is_valid() else ""
    links = {}
    for column in SORTS:
        query = request.GET.copy()
        query.pop("page", None)
        query["sort"] = f"-{column}" if current == column else column
        if not request.GET:
            query["mine"] = "on"
        arrow = "▲" if current == column else "▼" if current == f"-{column}" else ""
        links[column] = {"url": "?" + query.urlencode(), "arrow": arrow}
    return links


@login_required
def job_list(request):
    form = _job_filter_form(request)
    page = CountCappedPaginator(_filtered_jobs(request, form), 50).get_page(request.GET.get("page"))
    positions_attach(page.object_list)
    query = request.GET.copy()
    query.pop("page", None)
    template = "scheduling/_job_list_live.html" if request.htmx else "scheduling/job_list.html"
    return render(
        request,
        template,
        {
            "page": page,
            "form": form,
            "query": query.urlencode(),
            "sort_links": _sort_links(request, form),
            "live_url": request.get_full_path(),
        },
    )


BULK_STEPS = {
    "cancel": job_services.job_cancel,
    "hold": job_services.job_hold,
    "release": job_services.job_release,
}


@login_required
@require_POST
def job_bulk(request):
    """Cancel, hold or release the jobs ticked in the list (each alone: one refusal does not
    stop the others), then back to the list."""
    form = BulkActionForm(request.POST)
    back = next_url(request, reverse("job-list"))
    if not form.is_valid():
        messages.error(request, "Tick at least one job, then choose what to do.")
        return redirect(back)
    step = form.cleaned_data["step"]
    service = BULK_STEPS[step]
    done, refused = [], []
    jobs = selectors.jobs_visible_to(request.user).filter(pk__in=form.cleaned_data["job"])
    for job in jobs.order_by("id"):
        try:
            service(user=request.user, job=job, reason=request.POST.get("reason", "")[:1000])
            done.append(job.pk)
        except BusinessError as exc:
            refused.append(f"{job.pk}: {exc.message}")
    if done:
        messages.success(request, f"{step.capitalize()} done for {len(done)} job(s).")
    for line in refused[:10]:
        messages.error(request, line)
    if len(refused) > 10:
        messages.error(request, f"… and {len(refused) - 10} more refused.")
    return redirect(back)


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
        **_class_aging(job, now),
        "size_order": settings.SLUICE_SIZE_ORDER,
        "halving_seconds": settings.SLUICE_SIZE_HALVING_SECONDS,
        "fair_share_band": settings.SLUICE_FAIR_SHARE_BAND,
        "band_factor": 1 + settings.SLUICE_FAIR_SHARE_BAND,
        "max_wait_seconds": max_wait,
        "front_at": front_at,
        "front_reached": front_at <= now,
    }


def _class_aging(job, now) -> dict:
    """What class aging (SLUICE_CLASS_AGING_SECONDS, engine.order.age_classes) does for
    the job: the class it is ordered with once it has waited long enough (as the engine
    takes it: the next class up among the waiting jobs, unless that one may preempt, while
    its tenant's guarantee in the pool has room for it: the page states that bound, it does
    not work out the room), or why it does not move. Nothing for a job that no longer
    waits, a class that may preempt, or with aging off."""
    aging = settings.SLUICE_CLASS_AGING_SECONDS
    own = job.priority_class
    if aging <= 0 or own.can_preempt or job.state not in (JobState.PENDING, JobState.HELD):
        return {"class_aging_seconds": 0}
    above = selectors.class_waiting_above(own)
    aged_at = job.submitted_at + timedelta(seconds=aging)
    return {
        "class_aging_seconds": aging,
        "ages_into": above if above is not None and not above.can_preempt else None,
        "class_above": above,
        "aged_at": aged_at,
        "aged": aged_at <= now,
    }


def _job_context(request, job) -> dict:
    positions_attach([job])
    policy = WorkloadPolicy.objects.filter(workload_type=job.workload_type).first()
    now = timezone.now()
    return {
        "job": job,
        "policy": policy,
        "prediction": predict_runtime(job),
        "wait": job_wait(job, now),
        "order": _order_explanation(job, policy, now),
        # Whether a waiting job may stop this one for time-sharing (the dispatcher's rule).
        "takes_part_in_time_sharing": job.queue.time_sharing
        and takes_part_in_time_sharing(
            True, job.checkpoint_dir, job.priority_class.preemptible, policy
        ),
        "events": selectors.job_events_of(job),
        "allocation_rows": selectors.allocations_by_node(selectors.job_allocations(job)),
        "can_manage": selectors.can_manage_job(request.user, job),
        "is_active": job.state in ACTIVE_STATES,
        # The live part polls until the job has ended (then its last answer has no trigger).
        "live": job.state not in FINAL_STATES,
    }


@login_required
def job_detail(request, pk):
    job = _job_or_404(request.user, pk)
    context = _job_context(request, job)
    context["spec_json"] = pretty_json(
        {
            "command": job.command,
            "shell": job.shell,
            "env": job.env,
            "gpu_models": job.gpu_models,
            "labels": job.labels,
            "parameters": job.parameters,
        }
    )
    return render(request, "scheduling/job_detail.html", context)


@login_required
def job_live(request, pk):
    """htmx: the job page's live part (state, reason, position, estimate, allocations,
    timeline, buttons), polled every 2 s while the job has not ended."""
    job = _job_or_404(request.user, pk)
    return render(request, "scheduling/_job_live.html", _job_context(request, job))


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
    return redirect(next_url(request, reverse("job-detail", args=[job.pk])))


QUEUE_RUNNING_SHOWN = 100


@login_required
def queue_list(request):
    queues = selectors.queues_visible_to(request.user)
    return render(request, "scheduling/queue_list.html", {"queues": queues})


@login_required
def queue_detail(request, pk):
    queue = get_object_or_404(selectors.queues_visible_to(request.user), pk=pk)
    page = CountCappedPaginator(selectors.queue_pending_jobs(queue), 100).get_page(
        request.GET.get("page")
    )
    positions_attach(page.object_list)
    active = selectors.jobs_visible_to(request.user).filter(queue=queue, state__in=ACTIVE_STATES)
    # The newest of them: a busy queue runs thousands (rendering them took seconds); the
    # jobs list shows the others. Their ids first, then those rows with their joins: in
    # one query PostgreSQL joined all of the queue's running jobs before cutting the list.
    newest = list(active.values_list("pk", flat=True)[: QUEUE_RUNNING_SHOWN + 1])
    running_more = len(newest) > QUEUE_RUNNING_SHOWN
    running = positions_attach(active.filter(pk__in=newest[:QUEUE_RUNNING_SHOWN]))
    template = "scheduling/_queue_live.html" if request.htmx else "scheduling/queue_detail.html"
    return render(
        request,
        template,
        {
            "queue": queue,
            "page": page,
            "running": running,
            "running_total": active.count() if running_more else len(running),
            "live_url": request.get_full_path(),
        },
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


def _pool_summary(rows) -> list[dict]:
    """Per pool and GPU model, from the rows the page already holds (no query but the
    policies'): GPUs in total, allocated, used and idle (allocated, below the holding job's
    idle threshold in the last sample, or not sampled), free, and down (on a down,
    draining or cordoned node, or unhealthy, and not allocated). Retired nodes are left out."""
    thresholds = dict(
        WorkloadPolicy.objects.values_list("workload_type", "idle_utilization_threshold")
    )
    found: dict[tuple[str, str], dict] = {}
    for row in rows:
        node = row["node"]
        if NODE_RETIRED_LABEL in node.labels:
            continue
        for g in row["gpus"]:
            gpu, allocation = g["gpu"], g["allocation"]
            s = found.setdefault(
                (node.pool.name, gpu.model),
                {
                    "pool": node.pool,
                    "model": gpu.model,
                    "total": 0,
                    "allocated": 0,
                    "used": 0,
                    "idle": 0,
                    "free": 0,
                    "down": 0,
                    "outside": 0,
                    "utilization": 0.0,
                },
            )
            s["total"] += 1
            if allocation is not None:
                s["allocated"] += 1
                threshold = thresholds.get(allocation.job.workload_type, 5.0)
                if gpu.utilization is not None and gpu.utilization >= threshold:
                    s["used"] += 1
                else:
                    s["idle"] += 1
                s["utilization"] += gpu.utilization or 0.0
            elif node.state != NodeState.READY or gpu.health != GpuHealth.HEALTHY:
                s["down"] += 1
            elif gpu.held_outside:
                s["outside"] += 1
            else:
                s["free"] += 1
    summary = sorted(found.values(), key=lambda s: (s["pool"].name, s["model"]))
    for s in summary:
        total = s["total"] or 1
        for key in ("used", "idle", "free", "down", "outside"):
            s[f"pct_{key}"] = 100 * s[key] / total
        s["mean_utilization"] = s["utilization"] / s["allocated"] if s["allocated"] else None
    return summary


@login_required
def node_list(request):
    show_retired = request.GET.get("retired") == "1"
    nodes = selectors.nodes_visible_to(request.user).prefetch_related("gpus")
    active = {
        a.gpu_id: a
        for a in Allocation.objects.filter(released_at__isnull=True).select_related("job")
    }
    # A GPU held by a job of a tenant the user cannot see shows as busy, without the job.
    visible_tenants = set(tenants_visible_to(request.user).values_list("pk", flat=True))
    rows = []
    retired = 0
    for node in nodes:
        if node.state == NodeState.DOWN and NODE_RETIRED_LABEL in node.labels:
            retired += 1
            if not show_retired:
                continue
        gpus = []
        for g in node.gpus.all():
            allocation = active.get(g.pk)
            job_visible = allocation is not None and allocation.job.tenant_id in visible_tenants
            gpus.append({"gpu": g, "allocation": allocation, "job_visible": job_visible})
        rows.append(
            {
                "node": node,
                "gpus": gpus,
                "busy": any(g["allocation"] for g in gpus),
                "block": node.topology_block,
            }
        )
    # A pool has a topology where one of its nodes is in a block: its other nodes show
    # that they are in none (a multi-node job is never kept inside one on them).
    with_blocks = {row["node"].pool_id for row in rows if row["block"]}
    for row in rows:
        row["topology"] = row["node"].pool_id in with_blocks
    template = "scheduling/_nodes_table.html" if request.htmx else "scheduling/node_list.html"
    # Which executor runs each pool and what it enforces (the full page only: it rarely changes).
    pools = (
        []
        if request.htmx
        else [
            {"pool": pool, "capabilities": pool.capabilities()}
            for pool in selectors.pools_visible_to(request.user)
        ]
    )
    return render(
        request,
        template,
        {
            "rows": rows,
            "pools": pools,
            "summary": _pool_summary(rows),
            "is_admin": is_platform_admin(request.user),
            "retired_count": retired,
            "show_retired": show_retired,
            "live_url": request.get_full_path(),
        },
    )


@login_required
@require_POST
def node_remove(request, pk):
    """Platform admins remove a down node (deleted, or retired when it has a history)."""
    node = get_object_or_404(selectors.nodes_visible_to(request.user), pk=pk)
    try:
        deleted = config_services.node_remove(actor=request.user, node=node)
    except BusinessError as exc:
        if isinstance(exc, PermissionDeniedError):
            raise PermissionDenied(exc.message) from None
        messages.error(request, exc.message)
    else:
        messages.success(
            request,
            f"Node {node.name} removed."
            if deleted
            else f"Node {node.name} retired: its jobs' history is kept; it is listed again "
            "if its agent registers.",
        )
    return redirect("node-list")


# --- priority raises, approvals inbox, notifications ----------------------------------------

RAISE_STEPS = DecisionSteps(
    {
        "approve": (raise_services.priority_raise_approve, "approved"),
        "reject": (raise_services.priority_raise_reject, "rejected"),
        "revoke": (raise_services.priority_raise_revoke, "revoked"),
        "cancel": (raise_services.priority_raise_cancel, "cancelled"),
    },
    argument="raise_",
    noun="Raise",
    back="approvals",
)


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
    above = list(selectors.raises_above_ceiling_for(request.user)[:20])
    ceilings = {t: selectors.raise_ceiling_of(t) for t in {r.tenant_id for r in above}}
    template = "scheduling/_approvals_live.html" if request.htmx else "scheduling/approvals.html"
    return render(
        request,
        template,
        {
            "page": page,
            "rows": [{"raise": r, "impact": impacts.get(r.pk)} for r in pending],
            "grants": selectors.raises_revocable_by(request.user)[:50],
            "above_ceiling": [{"raise": r, "ceiling": ceilings[r.tenant_id]} for r in above],
            "live_url": request.get_full_path(),
        },
    )


@login_required
@require_POST
def raise_action(request, pk, step):
    """Approve, reject, revoke or cancel a raise from the inbox or the job page."""
    return RAISE_STEPS.post(
        request, step=step, objects=selectors.raises_visible_to(request.user), pk=pk
    )


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
