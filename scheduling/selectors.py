"""Reads for scheduling objects, always scoped to the user asking."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, Max, Q, QuerySet, Sum

from tenants.choices import Role
from tenants.models import Membership, Tenant
from tenants.selectors import has_role, is_platform_admin

from .choices import ACTIVE_STATES, JobState, NodeState
from .models import (
    Allocation,
    Gpu,
    Job,
    JobEvent,
    Node,
    PriorityClass,
    Queue,
    Quota,
    ResourcePool,
    WorkloadPolicy,
)


def _member_tenant_ids(user, min_role: str = Role.VIEWER):
    roles = {
        Role.VIEWER: Role.values,
        Role.MEMBER: [Role.MEMBER, Role.ADMIN],
        Role.ADMIN: [Role.ADMIN],
    }[min_role]
    return Membership.objects.filter(user=user, role__in=roles, tenant__active=True).values(
        "tenant_id"
    )


def _authenticated(user) -> bool:
    return bool(user and user.is_authenticated and user.is_active)


# --- platform objects: every logged-in user may read them -----------------------------------


def pools_visible_to(user) -> QuerySet[ResourcePool]:
    return ResourcePool.objects.all() if _authenticated(user) else ResourcePool.objects.none()


def nodes_visible_to(user) -> QuerySet[Node]:
    qs = Node.objects.select_related("pool")
    return qs if _authenticated(user) else qs.none()


def gpus_visible_to(user) -> QuerySet[Gpu]:
    qs = Gpu.objects.select_related("node", "node__pool")
    return qs if _authenticated(user) else qs.none()


def priority_classes_visible_to(user) -> QuerySet[PriorityClass]:
    return PriorityClass.objects.all() if _authenticated(user) else PriorityClass.objects.none()


def workload_policies_visible_to(user) -> QuerySet[WorkloadPolicy]:
    qs = WorkloadPolicy.objects.prefetch_related("allowed_pools")
    return qs if _authenticated(user) else qs.none()


# --- tenant objects -------------------------------------------------------------------------


def quotas_visible_to(user) -> QuerySet[Quota]:
    qs = Quota.objects.select_related("tenant", "pool")
    if is_platform_admin(user):
        return qs
    if not _authenticated(user):
        return qs.none()
    return qs.filter(tenant_id__in=_member_tenant_ids(user))


def queues_visible_to(user) -> QuerySet[Queue]:
    qs = Queue.objects.select_related(
        "tenant", "project", "pool", "default_priority_class", "max_self_service_class"
    )
    if is_platform_admin(user):
        return qs
    if not _authenticated(user):
        return qs.none()
    return qs.filter(tenant_id__in=_member_tenant_ids(user))


def jobs_visible_to(user) -> QuerySet[Job]:
    qs = Job.objects.select_related(
        "tenant",
        "project",
        "queue",
        "queue__pool",
        "submitted_by",
        "priority_class",
        "base_priority_class",
    )
    if is_platform_admin(user):
        return qs
    if not _authenticated(user):
        return qs.none()
    return qs.filter(tenant_id__in=_member_tenant_ids(user))


def job_events_of(job: Job) -> QuerySet[JobEvent]:
    return job.events.select_related("actor").order_by("id")


def job_allocations(job: Job) -> QuerySet[Allocation]:
    return job.allocations.select_related("gpu", "node").order_by("node__name", "gpu__index")


def can_manage_job(user, job: Job) -> bool:
    own = job.submitted_by_id == user.pk and has_role(user, job.tenant_id, Role.MEMBER)
    return own or has_role(user, job.tenant_id, Role.ADMIN)


# --- capacity and quota ---------------------------------------------------------------------


def pool_gpu_shapes(pool: ResourcePool) -> dict[str, tuple[int, int, int]]:
    """Per GPU model in a pool: (most GPUs on one node, memory MiB, total GPUs), live nodes only."""
    rows = (
        Gpu.objects.filter(node__pool=pool, health="healthy")
        .exclude(node__state=NodeState.DOWN)
        .values("node_id", "model")
        .annotate(n=Count("id"), mem=Max("memory_mb"))
    )
    shapes: dict[str, list[int]] = {}
    for row in rows:
        per_node, mem, total = shapes.get(row["model"], [0, 0, 0])
        shapes[row["model"]] = [max(per_node, row["n"]), max(mem, row["mem"]), total + row["n"]]
    return {model: (v[0], v[1], v[2]) for model, v in shapes.items()}


def tenant_gpus_in_use(tenant, pool, gpu_model: str | None = None) -> tuple[int, int]:
    """(guaranteed, borrowed) GPUs the tenant holds now in a pool (optionally one model)."""
    qs = Allocation.objects.filter(job__tenant=tenant, node__pool=pool, released_at__isnull=True)
    if gpu_model:
        qs = qs.filter(gpu__model=gpu_model)
    agg = qs.aggregate(total=Count("id"), borrowed=Count("id", filter=Q(borrowed=True)))
    return agg["total"] - agg["borrowed"], agg["borrowed"]


def quota_for(tenant, pool, gpu_model: str) -> dict:
    """The quota that applies to a tenant in a pool for a model (model-specific wins over 'any')."""
    quotas = {
        q.gpu_model: q
        for q in Quota.objects.filter(tenant=tenant, pool=pool, gpu_model__in=[gpu_model, ""])
    }
    quota = quotas.get(gpu_model) or quotas.get("")
    scope_model = gpu_model if quota is not None and quota.gpu_model else None
    guaranteed_used, borrowed_used = tenant_gpus_in_use(tenant, pool, scope_model)
    return {
        "guaranteed": quota.guaranteed_gpus if quota else 0,
        "borrow_limit": quota.borrow_limit_gpus if quota else 0,
        "max_running_jobs": quota.max_running_jobs if quota else None,
        "used": guaranteed_used + borrowed_used,
        "borrowed_used": borrowed_used,
    }


def tenant_quota_usage(user, tenant: Tenant) -> list[dict]:
    """Quota bars for a tenant: per pool and model, guaranteed, borrow limit, used, jobs."""
    if not (is_platform_admin(user) or has_role(user, tenant, Role.VIEWER)):
        return []
    active = defaultdict(lambda: [0, 0])
    for row in (
        Allocation.objects.filter(job__tenant=tenant, released_at__isnull=True)
        .values("node__pool__name", "gpu__model", "borrowed")
        .annotate(n=Count("id"))
    ):
        key = (row["node__pool__name"], row["gpu__model"])
        active[key][1 if row["borrowed"] else 0] += row["n"]
    jobs = defaultdict(lambda: {"running": 0, "pending": 0})
    for row in (
        Job.objects.filter(tenant=tenant, state__in=[*ACTIVE_STATES, JobState.PENDING])
        .values("queue__pool__name", "state")
        .annotate(n=Count("id"))
    ):
        bucket = "pending" if row["state"] == JobState.PENDING else "running"
        jobs[row["queue__pool__name"]][bucket] += row["n"]
    rows = []
    for quota in (
        Quota.objects.filter(tenant=tenant)
        .select_related("pool")
        .order_by("pool__name", "gpu_model")
    ):
        if quota.gpu_model:
            guaranteed_used, borrowed = active.get((quota.pool.name, quota.gpu_model), [0, 0])
        else:
            guaranteed_used = sum(v[0] for k, v in active.items() if k[0] == quota.pool.name)
            borrowed = sum(v[1] for k, v in active.items() if k[0] == quota.pool.name)
        limit = quota.guaranteed_gpus + quota.borrow_limit_gpus
        scale = max(limit, guaranteed_used + borrowed, 1)
        rows.append(
            {
                "quota": quota,
                "pool": quota.pool.name,
                "gpu_model": quota.gpu_model or "any",
                "guaranteed": quota.guaranteed_gpus,
                "borrow_limit": quota.borrow_limit_gpus,
                "guaranteed_used": guaranteed_used,
                "borrowed_used": borrowed,
                "free": max(quota.guaranteed_gpus - guaranteed_used, 0),
                "pct_guaranteed": 100 * guaranteed_used / scale,
                "pct_borrowed": 100 * borrowed / scale,
                "pct_limit": 100 * quota.guaranteed_gpus / scale,
                "running": jobs[quota.pool.name]["running"],
                "pending": jobs[quota.pool.name]["pending"],
            }
        )
    return rows


def queue_pending_jobs(queue: Queue) -> QuerySet[Job]:
    """The queue's waiting jobs in scheduling order (as the last dispatch cycle ranked them)."""
    return (
        queue.jobs.filter(state__in=[JobState.PENDING, JobState.HELD])
        .select_related("submitted_by", "priority_class", "project")
        .order_by("queue_position", "-priority_class__value", "submitted_at", "id")
    )


def dashboard_summary(user) -> dict:
    jobs = jobs_visible_to(user)
    counts = dict(jobs.values_list("state").annotate(n=Count("id")).order_by())
    mine = jobs.filter(submitted_by=user).order_by("-id")[:10]
    gpus = gpus_visible_to(user).exclude(node__state=NodeState.DOWN)
    total_gpus = gpus.count()
    busy = (
        Allocation.objects.filter(released_at__isnull=True).count() if _authenticated(user) else 0
    )
    return {
        "job_counts": counts,
        "pending_count": counts.get(JobState.PENDING, 0),
        "running_count": sum(counts.get(s, 0) for s in ACTIVE_STATES),
        "my_recent_jobs": mine,
        "total_gpus": total_gpus,
        "allocated_gpus": busy,
        "gpu_hours_running": jobs.filter(state__in=ACTIVE_STATES).aggregate(n=Sum("gpus_per_node"))[
            "n"
        ]
        or 0,
    }
