"""Reads of inference services, always scoped to the user asking: another tenant's service
does not exist for them (404)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Prefetch, Q, QuerySet

from portal.errors import NotFoundError
from scheduling.models import Allocation
from tenants.choices import Role
from tenants.scoping import has_role, restrict

from .choices import ServiceState
from .models import LIVE_JOB_STATES, ScaleDecision, Service, ServiceReplica


def services_visible_to(user) -> QuerySet[Service]:
    """The services (not deleted) of the user's tenants; every one for platform admins."""
    qs = Service.objects.select_related(
        "tenant", "project", "queue", "queue__pool", "priority_class", "created_by"
    ).exclude(state=ServiceState.DELETED)
    return restrict(qs, user)


def service_get(user, service_id) -> Service:
    """One service the user may see, or NotFoundError."""
    service = services_visible_to(user).filter(pk=service_id).first()
    if service is None:
        raise NotFoundError("Service not found.")
    return service


def can_manage_service(user, service: Service) -> bool:
    """Members (and admins) of the service's tenant change its services; viewers read."""
    return has_role(user, service.tenant_id, Role.MEMBER)


def live_replicas(service: Service) -> QuerySet[ServiceReplica]:
    """The replicas not retired, with their jobs (and the nodes they hold GPUs on)."""
    active = Allocation.objects.filter(released_at__isnull=True).select_related("node")
    return (
        service.replicas.filter(retired_at__isnull=True)
        .select_related("job")
        .prefetch_related(Prefetch("job__allocations", queryset=active, to_attr="active_allocs"))
        .order_by("id")
    )


def replica_node(replica: ServiceReplica):
    """The node a replica runs on (its first active allocation), or None while it waits."""
    allocs = getattr(replica.job, "active_allocs", None)
    if allocs is None:
        allocs = list(replica.job.allocations.filter(released_at__isnull=True)[:1])
    return allocs[0].node if allocs else None


def service_endpoints(service: Service) -> list[dict]:
    """Where the service's replicas answer: node hostname (or name), port, readiness."""
    out = []
    for replica in live_replicas(service):
        job = replica.job
        node = replica_node(replica)
        if job.state not in LIVE_JOB_STATES:
            continue
        out.append(
            {
                "replica": replica.pk,
                "job": job.pk,
                "spec_version": replica.spec_version,
                "state": job.state,
                "node": node.name if node else None,
                "host": (node.hostname or node.name) if node else None,
                "port": getattr(job, "serve_port", None),
                "ready": bool(getattr(job, "serve_ready", False)) and job.state == "RUNNING",
                "pending_reason_code": job.pending_reason_code,
            }
        )
    return out


def service_decisions(service: Service, since: datetime | None = None) -> QuerySet[ScaleDecision]:
    qs = service.decisions.all()
    if since is not None:
        qs = qs.filter(at__gte=since)
    return qs.order_by("-at", "-id")


def services_near_capacity(user) -> QuerySet[Service]:
    """The user's services at their max replicas or quota while above target (insights)."""
    return services_visible_to(user).filter(state=ServiceState.ACTIVE, near_capacity=True)


def with_replica_counts(qs: QuerySet[Service]) -> QuerySet[Service]:
    """Each service with ``live_replicas`` and ``ready_replicas`` (one query for a page)."""
    live = Q(replicas__retired_at__isnull=True, replicas__job__state__in=LIVE_JOB_STATES)
    ready = live & Q(replicas__job__state="RUNNING", replicas__job__serve_ready=True)
    return qs.annotate(
        live_replicas=Count("replicas", filter=live),
        ready_replicas=Count("replicas", filter=ready),
    ).order_by("tenant__slug", "project__slug", "name", "id")  # aggregates drop Meta.ordering
