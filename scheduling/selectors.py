"""Reads for scheduling objects, always scoped to the user asking."""

from __future__ import annotations

import functools
from collections import defaultdict

from django.contrib.auth import get_user_model
from django.db import connection, models
from django.db.models import Count, F, Max, Q, QuerySet, Sum

from portal.sqlrows import ModelColumns, row_instances
from tenants.choices import Role
from tenants.models import Membership, Project, Tenant
from tenants.scoping import has_role, is_active_user, is_platform_admin, restrict, tenant_ids_for

from .choices import ACTIVE_STATES, JobState, NodeState, RaiseState
from .models import (
    Allocation,
    Gpu,
    Job,
    JobEvent,
    Node,
    Notification,
    PriorityClass,
    PriorityRaise,
    Queue,
    Quota,
    ResourcePool,
    ServeSample,
    TenantRaiseCeiling,
    WorkloadPolicy,
)
from .positions import positions_attach


def _authenticated(user) -> bool:
    return is_active_user(user)


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
    return restrict(qs, user)


def queues_visible_to(user) -> QuerySet[Queue]:
    qs = Queue.objects.select_related(
        "tenant", "project", "pool", "default_priority_class", "max_self_service_class"
    )
    return restrict(qs, user)


#: The columns :func:`submission_targets` reads, in its row's order.
_TARGET_READERS = (
    ModelColumns(Project, "p"),
    ModelColumns(Tenant, "t"),
    ModelColumns(Queue, "q"),
    ModelColumns(Tenant, "qt"),
    ModelColumns(ResourcePool, "rp"),
    ModelColumns(PriorityClass, "dc"),
    ModelColumns(PriorityClass, "mc"),
    ModelColumns(WorkloadPolicy, "w"),
)


@functools.cache
def _submission_targets_sql(vendor: str) -> str:
    """The statement of :func:`submission_targets` for a database vendor (built once)."""
    table = {
        m: connection.ops.quote_name(m._meta.db_table)
        for m in (Project, Tenant, Queue, ResourcePool, PriorityClass, WorkloadPolicy, Membership)
    }
    pair = "CAST(m.tenant_id AS text) || ':' || m.role"
    roles = f"string_agg({pair}, ',')" if vendor == "postgresql" else f"group_concat({pair}, ',')"
    columns = ", ".join(reader.select(connection) for reader in _TARGET_READERS)
    return f"""
        SELECT {columns},
               (SELECT {roles} FROM {table[Membership]} m WHERE m.user_id = %s)
          FROM {table[Project]} p
          JOIN {table[Tenant]} t ON t.id = p.tenant_id
          LEFT JOIN {table[Queue]} q ON q.id = %s
          LEFT JOIN {table[Tenant]} qt ON qt.id = q.tenant_id
          LEFT JOIN {table[ResourcePool]} rp ON rp.id = q.pool_id
          LEFT JOIN {table[PriorityClass]} dc ON dc.id = q.default_priority_class_id
          LEFT JOIN {table[PriorityClass]} mc ON mc.id = q.max_self_service_class_id
          LEFT JOIN {table[WorkloadPolicy]} w ON w.workload_type = %s
         WHERE p.id = %s
    """


def submission_targets(
    user, *, project_id: int, queue_id: int, workload_type: str
) -> tuple[Project | None, Queue | None, WorkloadPolicy | None]:
    """What a submission reads before its checks, in one statement (it was four,
    each compiled by the ORM): the project (with its tenant) and the queue (with its
    tenant, pool and classes) as the user may see them to submit, None where not (as
    ``tenants.selectors.project_get_visible`` and a queue of a tenant the user is a member
    of, active user, active tenant), and the workload type's policy. The user's roles are
    read in the same statement and cached on the user as ``tenants.selectors`` does. A
    project that does not exist or is not visible answers (None, None, None): the
    submission stops there."""
    if not (user and user.is_authenticated):
        return None, None, None
    # An id no key column can hold names nothing (as the ORM answers such a lookup): the
    # database would refuse it as a parameter.
    low, high = connection.ops.integer_field_range("BigIntegerField")
    if not low <= project_id <= high:
        return None, None, None
    if not low <= queue_id <= high:
        queue_id = 0  # no queue has it: the project is answered, the queue not
    with connection.cursor() as cursor:
        cursor.execute(
            _submission_targets_sql(connection.vendor),
            [user.pk, queue_id, workload_type, project_id],
        )
        row = cursor.fetchone()
    if row is None:
        return None, None, None
    project, tenant, queue, queue_tenant, pool, default_class, max_class, policy = row_instances(
        row, _TARGET_READERS
    )
    if getattr(user, "_sluice_roles", None) is None:
        pairs = (item.partition(":") for item in (row[-1] or "").split(",") if item)
        user._sluice_roles = {int(tenant_id): role for tenant_id, _, role in pairs}
    admin = is_platform_admin(user)
    roles = user._sluice_roles
    project.tenant = tenant
    if not (admin or (tenant.pk in roles and tenant.active)):
        return None, None, None
    if queue is not None:
        queue.tenant = tenant if queue_tenant.pk == tenant.pk else queue_tenant
        queue.pool = pool
        queue.default_priority_class = default_class
        queue.max_self_service_class = max_class
        if not (admin or (user.is_active and queue.tenant_id in roles and queue_tenant.active)):
            queue = None
    return project, queue, policy


def jobs_visible_to(user) -> QuerySet[Job]:
    """The jobs ``user`` may see. A member's tenants are read first and named in the query,
    not a subquery: PostgreSQL then reads one tenant's jobs in id order from the index on
    (tenant, id), where with a subquery it read and sorted all of them for a deep page
    (page 2,000 of a tenant's 300,000 jobs: 400 ms against 50)."""
    qs = Job.objects.select_related(
        "tenant",
        "project",
        "queue",
        "queue__pool",
        "submitted_by",
        "priority_class",
        "base_priority_class",
    )
    return restrict(qs, user, tenants_named=True)


def serve_samples(job_ids, since=None, *, user=None) -> QuerySet[ServeSample]:
    """The scraped samples of serving jobs, oldest first, from ``since`` on
    (all kept when None). With ``user``, only those of jobs the user may see; without, for
    the control side (the services' autoscaler and reconciler)."""
    samples = ServeSample.objects.filter(job_id__in=list(job_ids))
    if since is not None:
        samples = samples.filter(at__gte=since)
    if user is not None:
        samples = restrict(samples, user, tenant_field="job__tenant")
    return samples.order_by("at", "id")


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
        .order_by(
            F("pending_rank").asc(nulls_last=True), "-priority_class__value", "submitted_at", "id"
        )
    )


def class_waiting_above(priority_class: PriorityClass) -> PriorityClass | None:
    """The lowest class above ``priority_class`` that has jobs waiting (pending or held):
    the class the engine's class aging orders an aged job of ``priority_class`` with,
    unless that one may preempt (scheduling.engine.order.age_classes). One query."""
    waiting = Job.objects.filter(state__in=[JobState.PENDING, JobState.HELD]).values(
        "priority_class_id"
    )
    return (
        PriorityClass.objects.filter(value__gt=priority_class.value, pk__in=waiting)
        .order_by("value")
        .first()
    )


def dashboard_summary(user) -> dict:
    jobs = jobs_visible_to(user)
    counts = dict(jobs.values_list("state").annotate(n=Count("id")).order_by())
    mine = list(jobs.filter(submitted_by=user).order_by("-id")[:10])
    positions_attach(mine)
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


# --- priority raises ------------------------------------------------------------------------

_RAISE_RELATED = (
    "tenant",
    "job",
    "project",
    "project__tenant",
    "from_class",
    "to_class",
    "requested_by",
    "decided_by",
    "ended_by",
)


def raise_ceiling_of(tenant: Tenant | int) -> PriorityClass | None:
    """The highest class the tenant's admins may approve; None: they approve nothing."""
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    row = TenantRaiseCeiling.objects.filter(tenant_id=tenant_id).select_related("ceiling").first()
    return row.ceiling if row else None


def raises_visible_to(user) -> QuerySet[PriorityRaise]:
    """Every raise of the user's tenants (all for platform admins); others' do not exist (404)."""
    qs = PriorityRaise.objects.select_related(*_RAISE_RELATED)
    return restrict(qs, user)


def raises_listed_for(user) -> QuerySet[PriorityRaise]:
    """What a user's list of raises shows: their own requests and raises on their jobs; for a
    tenant admin also every raise of that tenant; for a platform admin all of them."""
    qs = raises_visible_to(user)
    if is_platform_admin(user) or not _authenticated(user):
        return qs
    return qs.filter(
        Q(requested_by=user)
        | Q(job__submitted_by=user)
        | Q(tenant_id__in=tenant_ids_for(user, "admin"))
    )


def raise_refusal(user, raise_: PriorityRaise, step: str) -> str | None:
    """Why ``user`` may not take ``step`` (approve, reject, revoke, cancel) on the raise, or None.

    Tenant admins decide raises up to their tenant's ceiling class, platform admins any
    class; nobody decides their own request. The requester cancels a pending request and
    may give back (revoke) a grant early.
    """
    own = raise_.requested_by_id == user.pk
    if step == "cancel":
        return None if own else "Only the requester may cancel a raise request."
    if step == "revoke" and own:
        return None
    if own:
        return "You cannot approve or reject your own raise request; another approver must."
    if is_platform_admin(user):
        return None
    tenant = raise_.tenant
    if not has_role(user, tenant, Role.ADMIN):
        return (
            f"Only admins of {tenant.slug} (up to its ceiling class) and platform admins "
            "may decide raises."
        )
    ceiling = raise_ceiling_of(tenant)
    if ceiling is None:
        return f"Tenant {tenant.slug} has no raise ceiling: only platform admins may decide its raises."
    if raise_.to_class.value > ceiling.value:
        return (
            f"Class {raise_.to_class.name} is above {tenant.slug}'s ceiling {ceiling.name}: "
            "a platform admin must decide this raise."
        )
    return None


def _decidable(user, state: str) -> QuerySet[PriorityRaise]:
    qs = raises_visible_to(user).filter(state=state)
    if not is_platform_admin(user):
        qs = qs.filter(
            tenant_id__in=tenant_ids_for(user, "admin"),
            tenant__raise_ceiling__ceiling__value__gte=F("to_class__value"),
        )
    return qs


def raises_decidable_by(user) -> QuerySet[PriorityRaise]:
    """Pending raises the user may approve or reject (never their own), oldest first."""
    return _decidable(user, RaiseState.PENDING).exclude(requested_by=user).order_by("id")


def raises_revocable_by(user) -> QuerySet[PriorityRaise]:
    """Active grants the user may revoke as an approver, soonest to expire first."""
    return _decidable(user, RaiseState.APPROVED).order_by("expires_at", "id")


def raise_approvers(raise_: PriorityRaise) -> list:
    """Who is asked to decide a raise: the tenant's admins when the class is within its
    ceiling, else (or when no other admin can) the platform admins. Never the requester."""
    from django.contrib.auth import get_user_model

    ceiling = raise_ceiling_of(raise_.tenant_id)
    users = []
    if ceiling is not None and raise_.to_class.value <= ceiling.value:
        users = list(
            get_user_model()
            .objects.filter(
                memberships__tenant_id=raise_.tenant_id,
                memberships__role=Role.ADMIN,
                is_active=True,
            )
            .exclude(pk=raise_.requested_by_id)
        )
    if not users:
        users = list(
            get_user_model()
            .objects.filter(is_staff=True, is_active=True)
            .exclude(pk=raise_.requested_by_id)
        )
    return users


# --- notifications --------------------------------------------------------------------------


def notifications_of(user) -> QuerySet[Notification]:
    if not _authenticated(user):
        return Notification.objects.none()
    return Notification.objects.filter(user=user).order_by("-id")


def notifications_unread_count(user) -> int:
    """The number in the top bar (one query)."""
    if not _authenticated(user):
        return 0
    return Notification.objects.filter(user=user, read_at__isnull=True).count()


# --- pages ----------------------------------------------------------------------------------


def pool_models(pool_ids) -> dict[int, dict[str, int]]:
    """Per pool: its GPU models and the most GPUs of each on one node (nodes not down), in
    one query; the submit form offers these."""
    rows = (
        Gpu.objects.filter(node__pool_id__in=set(pool_ids))
        .exclude(node__state=NodeState.DOWN)
        .values("node__pool_id", "node_id", "model")
        .annotate(n=Count("id"))
    )
    found: dict[int, dict[str, int]] = {}
    for row in rows:
        models = found.setdefault(row["node__pool_id"], {})
        models[row["model"]] = max(models.get(row["model"], 0), row["n"])
    return found


def allocations_by_node(allocations) -> list[dict]:
    """A job's allocations as one row per node and grant: GPUs listed together, not one row
    per GPU (an 8-GPU job on two nodes is two rows)."""
    rows: dict[tuple, dict] = {}
    for a in allocations:
        granted = a.granted_at.replace(microsecond=0) if a.granted_at else None
        released = a.released_at.replace(microsecond=0) if a.released_at else None
        key = (a.node_id, granted, released, a.borrowed)
        row = rows.setdefault(
            key,
            {
                "node": a.node,
                "gpus": [],
                "models": set(),
                "borrowed": a.borrowed,
                "granted_at": a.granted_at,
                "released_at": a.released_at,
            },
        )
        row["gpus"].append(a.gpu.index)
        row["models"].add(a.gpu.model)
    for row in rows.values():
        row["gpus"].sort()
        row["models"] = sorted(row["models"])
    return sorted(
        rows.values(), key=lambda r: (r["released_at"] is not None, r["node"].name, r["gpus"])
    )


def raises_above_ceiling_for(user) -> QuerySet[PriorityRaise]:
    """Pending raises of the tenants the user administers that only a platform admin may
    decide (their class is above the tenant's ceiling, or the tenant has none)."""
    if is_platform_admin(user) or not _authenticated(user):
        return PriorityRaise.objects.none()
    admin_of = tenant_ids_for(user, "admin")
    decidable = _decidable(user, RaiseState.PENDING).values("pk")
    return (
        PriorityRaise.objects.filter(tenant_id__in=admin_of, state=RaiseState.PENDING)
        .exclude(pk__in=decidable)
        .exclude(requested_by=user)
        .select_related(*_RAISE_RELATED)
        .order_by("id")
    )


# --- what a page of jobs shows, read for the whole page -------------------------------------


#: The relations of a job its answer names, and the column naming each (see names_attach).
_NAMED_RELATIONS = (
    ("tenant", Tenant, "slug"),
    ("project", Project, "slug"),
    ("queue", Queue, "name"),
    ("submitted_by", get_user_model(), "username"),
    ("priority_class", PriorityClass, "name"),
    ("base_priority_class", PriorityClass, "name"),
)


def names_attach(jobs: list[Job]) -> None:
    """Give each job the related objects its answer names (tenant, project, queue and its
    pool, submitter, classes) where they were not loaded with it, read in one statement
    and made once each: ``select_related`` made seven objects per job, every column of
    them read and converted, a sixth of a page's CPU. Each object holds its id
    and name only; another attribute read is loaded on demand."""
    wanted: dict[type, set[int]] = {}
    for job in jobs:
        for relation, model, _ in _NAMED_RELATIONS:
            if not Job._meta.get_field(relation).is_cached(job):
                wanted.setdefault(model, set()).add(getattr(job, f"{relation}_id"))
    if not wanted:
        return
    parts, params = [], []
    for kind, (model, column) in enumerate(
        (model, column) for _, model, column in _NAMED_RELATIONS[:5] if model in wanted
    ):
        ids = sorted(wanted[model])
        table = connection.ops.quote_name(model._meta.db_table)
        pool = "pool_id" if model is Queue else "CAST(NULL AS BIGINT)"
        marks = ", ".join(["%s"] * len(ids))
        parts.append(
            f"SELECT {kind}, id, {connection.ops.quote_name(column)}, {pool} "
            f"FROM {table} WHERE id IN ({marks})"
        )
        params += ids
    pool_table = connection.ops.quote_name(ResourcePool._meta.db_table)
    queue_table = connection.ops.quote_name(Queue._meta.db_table)
    if Queue in wanted:
        marks = ", ".join(["%s"] * len(wanted[Queue]))
        parts.append(
            f"SELECT -1, id, name, CAST(NULL AS BIGINT) FROM {pool_table} "
            f"WHERE id IN (SELECT pool_id FROM {queue_table} WHERE id IN ({marks}))"
        )
        params += sorted(wanted[Queue])
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        rows = cursor.fetchall()
    models_in_order = [m for _, m, _ in _NAMED_RELATIONS[:5] if m in wanted]
    columns = {model: column for _, model, column in _NAMED_RELATIONS}
    db = connection.alias
    found: dict[tuple, models.Model] = {}
    pools = {}
    for kind, pk, name, pool_id in rows:
        if kind == -1:
            pools[pk] = ResourcePool.from_db(db, ["id", "name"], (pk, name))
        elif (model := models_in_order[kind]) is Queue:
            found[model, pk] = Queue.from_db(db, ["id", "name", "pool_id"], (pk, name, pool_id))
        else:
            found[model, pk] = model.from_db(db, ["id", columns[model]], (pk, name))
    for (model, _), obj in found.items():
        if model is Queue:
            Queue._meta.get_field("pool").set_cached_value(obj, pools.get(obj.pool_id))
    for job in jobs:
        for relation, model, _ in _NAMED_RELATIONS:
            field = Job._meta.get_field(relation)
            if not field.is_cached(job):
                obj = found.get((model, getattr(job, f"{relation}_id")))
                if obj is not None:
                    field.set_cached_value(job, obj)


def active_allocations_attach(jobs: list[Job]) -> None:
    """Set ``active_allocations`` (the GPUs held now, with their nodes) of the jobs that
    were loaded without, in one query; none for a page where no job is admitted, running
    or stopping (a job leaving those states releases its GPUs in the same transaction)."""
    missing = [job for job in jobs if not hasattr(job, "active_allocations")]
    for job in missing:
        job.active_allocations = []
    placed = {job.pk: job for job in missing if job.state in ACTIVE_STATES}
    if not placed:
        return
    for allocation in Allocation.objects.filter(
        job_id__in=list(placed), released_at__isnull=True
    ).select_related("node", "gpu"):
        placed[allocation.job_id].active_allocations.append(allocation)
