"""Pages of inference services: list, detail (replicas, load, latency, errors and the
autoscaler's decisions over time), create and edit forms, pause / resume / delete."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from portal.errors import BusinessError
from portal.forms import add_business_error
from scheduling.choices import WorkloadType
from scheduling.selectors import priority_classes_visible_to, queues_visible_to
from tenants.choices import Role
from tenants.selectors import has_role, is_platform_admin, projects_visible_to

from . import selectors
from . import services as service_services
from .choices import ServiceState
from .forms import ServiceForm, initial_from

#: The detail page's charts: the last hour, at most this many points.
CHART_WINDOW = timedelta(hours=1)
CHART_POINTS = 720
_COLORS = ["#3867d6", "#20bf6b", "#fa8231", "#eb3b5a", "#8854d0", "#0fb9b1"]


def _service_or_404(user, pk):
    service = (
        selectors.with_replica_counts(selectors.services_visible_to(user)).filter(pk=pk).first()
    )
    if service is None:
        raise Http404("Service not found.")
    return service


def _writable_projects(user):
    projects = projects_visible_to(user).filter(active=True)
    if is_platform_admin(user):
        return projects
    return projects.filter(
        tenant__memberships__user=user, tenant__memberships__role__in=[Role.MEMBER, Role.ADMIN]
    )


def _form(request, data=None, *, service=None):
    user = request.user
    queues = [
        q.pk
        for q in queues_visible_to(user)
        if q.allows(WorkloadType.INFERENCE) and q.pool.allows(WorkloadType.INFERENCE)
    ]
    return ServiceForm(
        data,
        projects=_writable_projects(user),
        queues=queues_visible_to(user).filter(pk__in=queues),
        priority_classes=priority_classes_visible_to(user),
        editing=service is not None,
        initial=initial_from(service) if service is not None else {},
    )


@login_required
def service_list(request):
    services = list(
        selectors.with_replica_counts(selectors.services_visible_to(request.user)).order_by(
            "tenant__slug", "project__slug", "name"
        )
    )
    can_create = is_platform_admin(request.user) or _writable_projects(request.user).exists()
    return render(
        request,
        "inference/service_list.html",
        {
            "services": services,
            "near_capacity": sum(1 for s in services if s.near_capacity),
            "can_create": can_create,
        },
    )


def _line(labels, datasets, *, y_title="", stepped=False) -> dict:
    for i, ds in enumerate(datasets):
        ds.setdefault("borderColor", _COLORS[i % len(_COLORS)])
        ds.setdefault("backgroundColor", ds["borderColor"])
        if stepped:
            ds.setdefault("stepped", True)
    return {
        "type": "line",
        "data": {"labels": labels, "datasets": datasets},
        "options": {
            "spanGaps": True,
            "elements": {"point": {"radius": 0}, "line": {"borderWidth": 2}},
            "interaction": {"mode": "index", "intersect": False},
            "plugins": {"legend": {"position": "bottom", "labels": {"boxWidth": 12}}},
            "scales": {
                "x": {"ticks": {"maxTicksLimit": 8, "maxRotation": 0}},
                "y": {"beginAtZero": True, "title": {"display": bool(y_title), "text": y_title}},
            },
        },
    }


def _round(value, digits=2):
    return None if value is None else round(float(value), digits)


def service_charts(service, decisions) -> dict:
    """Chart.js configurations of the detail page from the timeline's lines (oldest first)."""
    if not decisions:
        return {}
    labels = [timezone.localtime(d.at).strftime("%H:%M:%S") for d in decisions]
    inputs = [d.inputs or {} for d in decisions]
    charts = {
        "replicas": _line(
            labels,
            [
                {"label": "replicas", "data": [d.current for d in decisions]},
                {"label": "ready", "data": [d.ready for d in decisions]},
                {"label": "desired", "data": [d.desired for d in decisions], "borderDash": [4, 4]},
            ],
            y_title="replicas",
            stepped=True,
        ),
        "load": _line(
            labels,
            [
                {
                    "label": "ongoing requests (stable window)",
                    "data": [_round(i.get("stable_concurrency")) for i in inputs],
                },
                {
                    "label": "target × replicas",
                    "data": [
                        _round(service.target_running_per_replica * d.current) for d in decisions
                    ],
                    "borderDash": [4, 4],
                },
                {
                    "label": "requests/s (right axis)",
                    "data": [_round(i.get("request_rate")) for i in inputs],
                    "yAxisID": "rate",
                },
                {
                    # The stable window's mean lags a load step by up to its length.
                    "label": "requests/s, panic window (right axis)",
                    "data": [_round(i.get("recent_request_rate")) for i in inputs],
                    "yAxisID": "rate",
                    "borderDash": [2, 2],
                },
            ],
            y_title="ongoing requests",
        ),
    }
    # Requests per second run an order of magnitude above ongoing requests: on one axis
    # they flatten the load against its target.
    charts["load"]["options"]["scales"]["rate"] = {
        "position": "right",
        "beginAtZero": True,
        "grid": {"drawOnChartArea": False},
        "title": {"display": True, "text": "requests/s"},
    }
    latency = [{"label": "p95 latency (ms)", "data": [_round(i.get("p95_ms"), 0) for i in inputs]}]
    if service.latency_slo_ms:
        latency.append(
            {
                "label": "SLO",
                "data": [service.latency_slo_ms] * len(decisions),
                "borderDash": [6, 4],
                "borderColor": "#eb3b5a",
            }
        )
    charts["latency"] = _line(labels, latency, y_title="ms")
    errors = [
        {
            "label": "error rate (%)",
            "data": [
                None if i.get("error_rate") is None else round(100 * i["error_rate"], 2)
                for i in inputs
            ],
            "borderColor": "#eb3b5a",
        }
    ]
    if service.error_rate_max is not None:
        errors.append(
            {
                "label": "ceiling",
                "data": [round(100 * service.error_rate_max, 2)] * len(decisions),
                "borderDash": [6, 4],
                "borderColor": "#8854d0",
            }
        )
    charts["errors"] = _line(labels, errors, y_title="%")
    return charts


#: What holds replicas back, by the waiting replica's reason code: (the limit, the advice).
_LIMITS = {
    "WAITING_FOR_QUOTA": ("the tenant's quota", "quota"),
    "EXCEEDS_QUOTA_LIMIT": ("the tenant's quota", "quota"),
    "RESERVED_FOR_HIGHER_PRIORITY": (
        "jobs ahead of the replicas in the pool's priority order",
        "priority",
    ),
    "WAITING_FOR_GPUS": ("the pool's GPUs", "gpus"),
    "WAITING_FOR_PREEMPTION": ("the pool's GPUs", "gpus"),
    "NO_MATCHING_NODES": ("the pool's nodes", "gpus"),
    "SUBMIT_REFUSED": ("a refused submission", "submit"),
}


def capacity_advice(service) -> dict | None:
    """What a service near capacity is held back by, in words: max replicas only when
    every wanted replica runs; otherwise what its waiting replicas wait for (raising max
    replicas would only add more waiting replicas)."""
    if not service.near_capacity:
        return None
    code = service.blocked_reason_code
    if code:
        limit, kind = _LIMITS.get(code, (f"replicas waiting to start ({code})", "other"))
        return {"limit": limit, "kind": kind, "code": code}
    return {"limit": f"max replicas ({service.max_replicas})", "kind": "max_replicas", "code": ""}


@login_required
def service_detail(request, pk):
    service = _service_or_404(request.user, pk)
    since = timezone.now() - CHART_WINDOW
    recent = list(selectors.service_decisions(service, since)[:CHART_POINTS])
    recent.reverse()
    return render(
        request,
        "inference/service_detail.html",
        {
            "service": service,
            "endpoints": selectors.service_endpoints(service),
            "decisions": list(selectors.service_decisions(service)[:50]),
            "charts": service_charts(service, recent),
            "advice": capacity_advice(service),
            "latest": recent[-1] if recent else None,
            "can_manage": selectors.can_manage_service(request.user, service),
        },
    )


@login_required
def service_create(request):
    form = _form(request, request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        spec = service_services.ServiceSpec(
            project=data["project"], name=data["name"], **form.changes()
        )
        try:
            service = service_services.service_create(user=request.user, spec=spec)
        except BusinessError as exc:
            if exc.status_code == 403:
                raise PermissionDenied(exc.message) from None
            add_business_error(form, exc)
        else:
            messages.success(request, f"Service {service} created; replicas start shortly.")
            return redirect("service-detail", pk=service.pk)
    return render(request, "inference/service_form.html", {"form": form, "service": None})


@login_required
def service_edit(request, pk):
    service = _service_or_404(request.user, pk)
    if not selectors.can_manage_service(request.user, service):
        raise PermissionDenied("Viewers cannot change services.")
    form = _form(request, request.POST or None, service=service)
    if request.method == "POST" and form.is_valid():
        try:
            updated = service_services.service_update(
                user=request.user, service=service, changes=form.changes()
            )
        except BusinessError as exc:
            add_business_error(form, exc)
        else:
            note = (
                f" Spec version {updated.spec_version}: new replicas replace the old ones."
                if updated.spec_version != service.spec_version
                else ""
            )
            messages.success(request, f"Service {updated} saved.{note}")
            return redirect("service-detail", pk=service.pk)
    return render(request, "inference/service_form.html", {"form": form, "service": service})


_STEPS = {
    "pause": service_services.service_pause,
    "resume": service_services.service_resume,
    "delete": service_services.service_delete,
}


@login_required
@require_POST
def service_action(request, pk, step):
    service = _service_or_404(request.user, pk)
    action = _STEPS.get(step)
    if action is None:
        raise Http404("No such step.")
    if not has_role(request.user, service.tenant_id, Role.MEMBER):
        raise PermissionDenied("Viewers cannot change services.")
    try:
        action(user=request.user, service=service, reason=request.POST.get("reason", "")[:2000])
    except BusinessError as exc:
        messages.error(request, exc.message)
        return redirect("service-detail", pk=service.pk)
    if step == "delete":
        messages.success(request, f"Service {service} deleted; its replicas are stopping.")
        return redirect("service-list")
    state = ServiceState.PAUSED if step == "pause" else ServiceState.ACTIVE
    messages.success(request, f"Service {service} is {state.label.lower()}.")
    return redirect("service-detail", pk=service.pk)
