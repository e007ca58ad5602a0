"""Hand-made UsageDay rows for the usage accounting tests (the rollup writer is not needed)."""

from __future__ import annotations

import datetime as dt

from insights.models import UsageDay


def usage_day(
    *,
    tenant,
    day: dt.date | str,
    pool,
    allocated: float,
    used: float,
    project=None,
    user=None,
    workload_type: str = "training",
    gpu_model: str = "H100-80GB",
) -> UsageDay:
    if isinstance(day, str):
        day = dt.date.fromisoformat(day)
    return UsageDay.objects.create(
        day=day,
        tenant=tenant,
        project=project,
        user=user,
        workload_type=workload_type,
        pool=pool,
        gpu_model=gpu_model,
        allocated_gpu_hours=allocated,
        used_gpu_hours=used,
    )


def world_usage(world, *, day, allocated: float, used: float, vision=False, **fields):
    """A UsageDay of the world's nlp project and member, or (``vision``) of the other
    tenant's project and the outsider, in the world's pool; ``fields`` override."""
    owner = {
        "tenant": world.other if vision else world.tenant,
        "project": world.other_project if vision else world.project,
        "user": world.outsider if vision else world.member,
        **fields,
    }
    return usage_day(day=day, pool=world.pool, allocated=allocated, used=used, **owner)


def busy_range(*, tenant, pool, users_of_day, project=None) -> None:
    """Rows of 2 allocated and 1 used GPU-hour for each user ``users_of_day()`` returns on
    each day of 1-10 November 2026: data enough to show a query count that does not grow."""
    for day in range(1, 11):
        for user in users_of_day():
            usage_day(
                tenant=tenant,
                day=dt.date(2026, 11, day),
                pool=pool,
                project=project,
                user=user,
                allocated=2,
                used=1,
            )


def query_count(client, path: str, params) -> int:
    """The queries one GET of ``path`` makes (a streamed body read to the end); it must be a
    200."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path, params)
        if hasattr(response, "streaming_content"):
            b"".join(response.streaming_content)
    assert response.status_code == 200
    return len(ctx.captured_queries)


def demo_usage(*, days: int = 30, today: dt.date) -> int:
    """A month of plausible usage on the demo (``seed_demo``): each tenant's projects and
    members in each pool, busy on weekdays. Seeded; returns the number of rows."""
    import random

    from django.contrib.auth import get_user_model

    from scheduling.models import ResourcePool
    from tenants.models import Project, Tenant

    rng = random.Random(20)
    pools = {p.name: p for p in ResourcePool.objects.all()}
    plan = [
        # pool, model, workload type, GPUs held on a busy day, utilization
        ("training", "H100-80GB", "training", 7.0, 0.78),
        ("training", "H100-80GB", "fine_tuning", 2.5, 0.64),
        ("inference", "A100-40GB", "inference", 1.6, 0.41),
        ("interactive", "L4-24GB", "interactive", 1.1, 0.18),
    ]
    users = get_user_model().objects
    rows = 0
    for tenant in Tenant.objects.order_by("slug"):
        projects = list(Project.objects.filter(tenant=tenant).order_by("slug"))
        people = [users.get(username=f"{tenant.slug}-{r}") for r in ("member", "admin")]
        scale = 1.0 if tenant.slug == "nlp" else 0.55
        for offset in range(days):
            day = today - dt.timedelta(days=offset)
            busy = 0.45 if day.weekday() >= 5 else 1.0
            for i, (pool, model, wtype, gpus, util) in enumerate(plan):
                if pool not in pools:
                    continue
                held = gpus * scale * busy * rng.uniform(0.6, 1.25) * 24
                project = projects[i % len(projects)]
                user = people[0] if i % 2 == 0 else people[1]
                usage_day(
                    tenant=tenant,
                    day=day,
                    pool=pools[pool],
                    project=project,
                    user=user,
                    workload_type=wtype,
                    gpu_model=model,
                    allocated=round(held, 2),
                    used=round(held * util * rng.uniform(0.85, 1.1), 2),
                )
                rows += 1
    return rows


def demo_fortnight(week_start: dt.date) -> None:
    """Two weeks of policy events on the demo for a review of ``week_start``: the second
    with shorter waits for key work and fewer manual interventions in nlp, vision busier."""
    from django.contrib.auth import get_user_model
    from freezegun import freeze_time

    from audit.services import audit_record
    from scheduling.choices import ExtensionState, JobState, ReclaimKind
    from scheduling.models import (
        Job,
        PriorityClass,
        PriorityRaise,
        Queue,
        ReclaimRecord,
        RuntimeExtension,
    )
    from tenants.models import Tenant
    from tests import factories as f

    users = get_user_model().objects
    admin = users.get(username="admin")
    high = PriorityClass.objects.get(name="high")
    tenants = {t.slug: t for t in Tenant.objects.all()}
    start = dt.datetime.combine(week_start, dt.time.min, tzinfo=dt.UTC)
    previous = start - dt.timedelta(days=7)

    def when(base, day, hour=11):
        return base + dt.timedelta(days=day, hours=hour)

    def job(slug, queue_name, waited_min, admitted, **fields):
        queue = Queue.objects.get(tenant__slug=slug, name=queue_name)
        return f.JobFactory(
            queue=queue,
            project=queue.tenant.projects.order_by("slug").first(),
            submitted_by=users.get(username=f"{slug}-member"),
            submitted_at=admitted - dt.timedelta(minutes=waited_min),
            admitted_at=admitted,
            started_at=admitted,
            finished_at=admitted + dt.timedelta(hours=2),
            **{"state": JobState.SUCCEEDED, **fields},
        )

    def audit(at, action, actor=None, tenant=None):
        with freeze_time(at):
            audit_record(action=action, actor=actor, tenant=tenant, target_type="demo", target_id=1)

    waits = {
        "nlp": ([55, 70, 95, 140, 35], [20, 25, 30, 45, 15]),
        "vision": ([20, 30], [35, 60, 80]),
    }
    for slug, (before, now_) in waits.items():
        for base, minutes in ((previous, before), (start, now_)):
            for i, m in enumerate(minutes):
                job(slug, "train-prod", m, when(base, i % 5), priority_class=high)
                job(slug, "serve", m / 5, when(base, i % 5, 15), workload_type="inference")
    for slug, before, now_ in (("nlp", 6, 2), ("vision", 1, 2)):
        tenant = tenants[slug]
        member, tenant_admin = (users.get(username=f"{slug}-{r}") for r in ("member", "admin"))
        for base, count in ((previous, before), (start, now_)):
            for i in range(count):
                at = when(base, i % 5, 9)
                j = job(slug, "train", 10, at)
                PriorityRaise.objects.create(
                    tenant=tenant,
                    job=j,
                    to_class=high,
                    reason="deadline",
                    requested_by=member,
                    created_at=at,
                )
                audit(at + dt.timedelta(hours=1), "priority_raise.approve", tenant_admin, tenant)
        for base, count in ((previous, 3 if slug == "nlp" else 0), (start, 1)):
            for i in range(count):
                at = when(base, i, 16)
                RuntimeExtension.objects.create(
                    job=job(slug, "train", 5, at),
                    tenant=tenant,
                    seconds=7200,
                    reason="finishing",
                    requested_by=member,
                    state=ExtensionState.APPROVED,
                    decided_by=tenant_admin,
                    decided_at=at,
                    created_at=at,
                )
    for i in range(3):
        audit(when(previous, i + 1), "quota.update", admin, tenants["nlp"])
    audit(when(previous, 2, 14), "job.idle_exempt", users.get(username="nlp-admin"), tenants["nlp"])
    audit(when(start, 2), "queue.update", admin, tenants["vision"])
    for base, count in ((previous, 4), (start, 2)):
        for i in range(count):
            audit(when(base, i, 13), "job.preempt", None, tenants["nlp"])
    for base, hours in ((previous, [3.5, 2.0]), (start, [6.0, 4.5, 1.5])):
        for i, h in enumerate(hours):
            ReclaimRecord.objects.create(
                created_at=when(base, i + 1),
                kind=ReclaimKind.IDLE_RECLAIM,
                tenant=tenants["vision" if i % 2 else "nlp"],
                gpus=1,
                gpu_hours_freed=h,
            )
    ReclaimRecord.objects.create(
        created_at=when(start, 3), kind=ReclaimKind.ZOMBIE_KILL, gpus=1, gpu_hours_freed=0.8
    )
    for base, count in ((previous, 3), (start, 1)):
        for i in range(count):
            failed = job("nlp", "train", 5, when(base, i + 1, 8), state=JobState.FAILED)
            Job.objects.filter(pk=failed.pk).update(state=JobState.FAILED)
