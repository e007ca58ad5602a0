"""Lists and pages keep a constant query count however many rows they show (NetBox's habit).

Each test renders a list with N rows, triples the rows, renders it again and expects the
same number of queries (and stays under a fixed bound).
"""

import itertools
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling.models import Gpu, WorkloadPolicy
from tenants.choices import Role
from tests import factories as f

_serial = itertools.count()
MAX_QUERIES = 15


def grow(world, n: int) -> None:
    """Add n of everything the lists show: tenants with quotas, users, projects, queues, pools,
    nodes with GPUs, and for each a running job holding two GPUs plus a pending job."""
    for _ in range(n):
        k = next(_serial)
        tenant = f.TenantFactory(slug=f"extra-{k}")
        f.MembershipFactory(user=world.member, tenant=tenant, role=Role.MEMBER)
        f.MembershipFactory(user=f.UserFactory(username=f"extra-user-{k}"), tenant=world.tenant)
        f.QuotaFactory(tenant=tenant, pool=world.pool)
        f.QuotaFactory(tenant=world.tenant, pool=world.pool, gpu_model=f"model-{k}")
        f.ProjectFactory(tenant=world.tenant, slug=f"extra-{k}")
        f.QueueFactory(
            tenant=world.tenant,
            name=f"extra-{k}",
            pool=world.pool,
            default_priority_class=world.normal,
        )
        pool = f.PoolFactory(name=f"extra-{k}")
        WorkloadPolicy.objects.get(workload_type="training").allowed_pools.add(pool)
        node = f.NodeFactory(name=f"extra-{k}", pool=world.pool)
        gpus = [f.GpuFactory(node=node, index=i, uuid=f"GPU-extra-{k}-{i}") for i in range(2)]
        own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
        f.placed_job(gpus=gpus, **own)
        f.JobFactory(pending_reason_code="WAITING_FOR_GPUS", pending_rank=k + 1.0, **own)


def count_queries(fetch) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = fetch()
    assert response.status_code == 200
    return len(ctx.captured_queries)


def assert_constant(world, fetch) -> None:
    grow(world, 2)
    small = count_queries(fetch)
    size_small = len(fetch().content)
    grow(world, 4)
    large = count_queries(fetch)
    assert len(fetch().content) > size_small  # the list did show more
    assert small == large, f"{small} queries with few rows, {large} with three times as many"
    assert large <= MAX_QUERIES


API_LISTS = [
    "/api/v1/jobs",
    "/api/v1/projects",
    "/api/v1/tenants",
    "/api/v1/queues",
    "/api/v1/quotas",
    "/api/v1/nodes",
    "/api/v1/gpus",
    "/api/v1/users",
    "/api/v1/tenants/nlp/members",
    "/api/v1/pools",
    "/api/v1/workload-policies",
]


@pytest.mark.parametrize("who", ["member", "platform_admin"])
@pytest.mark.parametrize("url", API_LISTS)
def test_api_list_query_count_is_constant(world, api, url, who):
    client = api(getattr(world, who))

    assert_constant(world, lambda: client.get(url, {"page_size": 500}))


def test_job_list_filtered_by_state_has_constant_queries(world, api):
    client = api(world.member)

    assert_constant(world, lambda: client.get("/api/v1/jobs", {"state": ["RUNNING", "PENDING"]}))


def test_job_events_list_has_constant_queries(world, api):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    client = api(world.member)

    def add_events():
        from scheduling.services.lifecycle import job_event

        for _ in range(5):
            job_event(job, "note", "x", actor=world.member)

    add_events()
    small = count_queries(lambda: client.get(f"/api/v1/jobs/{job.pk}/events"))
    add_events()
    add_events()
    assert count_queries(lambda: client.get(f"/api/v1/jobs/{job.pk}/events")) == small


PAGES = [
    "/jobs/",
    "/jobs/?mine=&state=RUNNING",
    "/queues/",
    "/nodes/",
    "/",
    "/tenants/",
    "/projects/",
]


@pytest.mark.parametrize("url", PAGES)
def test_page_query_count_is_constant(world, client, url):
    client.force_login(world.member)

    assert_constant(world, lambda: client.get(url))


def test_queue_page_query_count_is_constant(world, client):
    client.force_login(world.member)

    assert_constant(world, lambda: client.get(f"/queues/{world.queue.pk}/"))


def test_quota_page_query_count_is_constant(world, client):
    client.force_login(world.member)

    assert_constant(world, lambda: client.get("/quotas/nlp/"))


def test_tenant_page_query_count_is_constant(world, client):
    client.force_login(world.tenant_admin)

    assert_constant(world, lambda: client.get("/tenants/nlp/"))


def test_job_page_query_count_does_not_grow_with_events(world, client):
    from scheduling.services.lifecycle import job_event

    job = f.placed_job(
        gpus=list(world.nodes[0].gpus.all()[:4]),
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
    )
    client.force_login(world.member)
    for _ in range(3):
        job_event(job, "note", "x", actor=world.member)
    small = count_queries(lambda: client.get(f"/jobs/{job.pk}/"))
    for _ in range(9):
        job_event(job, "note", "x", actor=world.tenant_admin)

    assert count_queries(lambda: client.get(f"/jobs/{job.pk}/")) == small


# --- the three lists that show where waiting jobs stand ---------------------------------------

POSITION_LISTS = {
    "job list page": lambda w: "/jobs/?mine=&state=&sort=",
    "queue page": lambda w: f"/queues/{w.queue.pk}/",
    "GET /api/v1/jobs": lambda w: "/api/v1/jobs",
}


def add_jobs(world, n: int) -> list:
    """n jobs in the queue, waiting and running mixed: pending with a rank and an estimate,
    running on a GPU of their own, held with a rank; submitted by two users, in two
    priority classes."""
    from scheduling.choices import JobState
    from scheduling.models import Allocation, Job, PoolEstimates

    free = list(
        Gpu.objects.filter(node__pool=world.pool)
        .exclude(pk__in=Allocation.objects.filter(released_at__isnull=True).values("gpu_id"))
        .order_by("pk")
    )
    rank = float(Job.objects.count())
    jobs = []
    for k in range(n):
        own = {
            "queue": world.queue,
            "project": world.project,
            "submitted_by": (world.member, world.tenant_admin)[k % 2],
            "priority_class": (world.normal, world.low)[k % 2],
        }
        if k % 3 == 1:
            jobs.append(f.placed_job(gpus=[free.pop(0)], **own))
            continue
        rank += 1
        state = JobState.PENDING if k % 3 == 0 else JobState.HELD
        jobs.append(
            f.JobFactory(
                state=state, pending_reason_code="WAITING_FOR_GPUS", pending_rank=rank, **own
            )
        )
    estimates, _ = PoolEstimates.objects.get_or_create(
        pool=world.pool, defaults={"computed_at": timezone.now()}
    )
    now = timezone.now().timestamp()
    for job in jobs:
        if job.state == JobState.PENDING:
            estimates.starts[str(job.pk)] = now + 3600 + job.pk
    estimates.save()
    return jobs


@pytest.mark.parametrize("who", ["member", "tenant_admin", "platform_admin"])
@pytest.mark.parametrize("name", POSITION_LISTS)
def test_position_lists_make_as_many_queries_for_30_jobs_as_for_3(world, client, api, name, who):
    user = getattr(world, who)
    url = POSITION_LISTS[name](world)
    if url.startswith("/api/"):
        fetch = lambda: api(user).get(url)  # noqa: E731
    else:
        client.force_login(user)
        fetch = lambda: client.get(url)  # noqa: E731

    def shown(response) -> set[int]:
        if url.startswith("/api/"):
            return {row["id"] for row in response.json()["results"]}
        return {int(pk) for pk in re.findall(r'href="/jobs/(\d+)/"', response.content.decode())}

    jobs = add_jobs(world, 3)
    fetch()  # the first request's one-offs (session, caches)
    with CaptureQueriesContext(connection) as few:
        response = fetch()
    assert response.status_code == 200 and shown(response) == {j.pk for j in jobs}

    jobs += add_jobs(world, 27)
    with CaptureQueriesContext(connection) as many:
        response = fetch()
    assert response.status_code == 200 and shown(response) == {j.pk for j in jobs}

    assert len(many) == len(few), (
        f"{name} as {who}: {len(few)} queries for 3 jobs, {len(many)} for 30:\n"
        + "\n".join(q["sql"][:200] for q in many.captured_queries)
    )
    assert len(many) <= MAX_QUERIES
