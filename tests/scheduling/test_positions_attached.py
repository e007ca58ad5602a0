"""Positions are attached by whoever loads jobs; the job's properties never query.

``Job.queue_position``, ``pool_position`` and ``estimated_start`` read what
``scheduling.positions.positions_attach`` set (two queries for a whole page). A read
without it raises ``PositionsNotAttached`` naming the job, in a template too (it is no
``AttributeError``, which a template would swallow into an empty cell): every page and
API answer that shows a position must attach, and the readers below prove they do. The
query counts of the lists are in test_list_query_counts.py.
"""

import json
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.template import Context, Template
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling.models import Job, PoolEstimates
from scheduling.positions import PositionsNotAttached, positions_attach
from tests import factories as f

START = datetime(2031, 5, 4, 3, 2, 1, tzinfo=UTC)


def _waiting(world, n: int) -> list[Job]:
    own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    start = Job.objects.count()
    return [
        f.JobFactory(pending_reason_code="WAITING_FOR_GPUS", pending_rank=start + k + 1.0, **own)
        for k in range(n)
    ]


@pytest.mark.parametrize("name", ["queue_position", "pool_position", "estimated_start"])
def test_an_unattached_read_raises_naming_the_job_without_a_query(world, name):
    (job,) = _waiting(world, 1)
    job = Job.objects.get(pk=job.pk)

    with CaptureQueriesContext(connection) as ctx, pytest.raises(PositionsNotAttached) as raised:
        getattr(job, name)

    assert ctx.captured_queries == []
    assert f"job {job.pk} " in str(raised.value) and "positions_attach" in str(raised.value)
    assert raised.value.job_id == job.pk


def test_a_template_that_forgot_fails_instead_of_showing_nothing(world):
    (job,) = _waiting(world, 1)
    template = Template("{{ job.queue_position|default:'none' }}")

    with pytest.raises(PositionsNotAttached):
        template.render(Context({"job": Job.objects.get(pk=job.pk)}))
    attached = positions_attach([Job.objects.get(pk=job.pk)])
    assert template.render(Context({"job": attached[0]})) == "1"


def test_attached_positions_and_estimates_are_read_from_the_job(world):
    jobs = _waiting(world, 3)
    PoolEstimates.objects.create(
        pool=world.pool, computed_at=timezone.now(), starts={str(jobs[1].pk): START.timestamp()}
    )
    loaded = list(Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("pending_rank"))
    with CaptureQueriesContext(connection) as attaching:
        returned = positions_attach(loaded)

    with CaptureQueriesContext(connection) as reading:
        positions = [(job.queue_position, job.pool_position) for job in loaded]
        estimates = [job.estimated_start for job in loaded]

    assert returned == loaded
    assert positions == [(1, 1), (2, 2), (3, 3)]
    assert estimates == [None, START, None]
    assert len(attaching.captured_queries) == 2 and reading.captured_queries == []


def test_a_job_that_does_not_wait_has_no_position_and_costs_no_query(world):
    job = f.placed_job(
        gpus=list(world.nodes[0].gpus.all()[:1]),
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
    )
    with CaptureQueriesContext(connection) as ctx:
        (job,) = positions_attach([Job.objects.get(pk=job.pk)])
    assert (job.queue_position, job.pool_position, job.estimated_start) == (None, None, None)
    assert len(ctx.captured_queries) == 1  # the job itself


def test_refresh_from_db_forgets_the_attached_positions(world):
    (job,) = positions_attach(_waiting(world, 1))
    assert job.queue_position == 1

    job.refresh_from_db()

    with pytest.raises(PositionsNotAttached):
        job.queue_position  # noqa: B018 (the read is the test)


def test_set_positions_are_read_back(world):
    job = Job(pk=None)
    job.queue_position, job.pool_position, job.estimated_start = 4, 9, START

    assert (job.queue_position, job.pool_position, job.estimated_start) == (4, 9, START)


# --- every reader attaches: a page or answer that forgot raises here ---------------------------

HTMX = {"HTTP_HX_REQUEST": "true"}


def _page(path, htmx=False):
    def fetch(world, client, api, job):
        client.force_login(world.member)
        return client.get(path(world, job), **(HTMX if htmx else {}))

    return fetch


def _api(method, path):
    def fetch(world, client, api, job):
        return getattr(api(world.member), method)(path(world, job))

    return fetch


def _in_job_table(body, world, job):
    return "#2 · #2 pool" in body and "≤ 05-04 03:02<" in body


def _in_queue_table(body, world, job):
    return f'<tr><td>2</td><td><a href="/jobs/{job.pk}/">' in body and "≤ 05-04 03:02:01" in body


def _in_job_page(body, world, job):
    return "<strong>#2</strong> in its queue, <strong>#2</strong> in pool" in body and (
        "2031-05-04 03:02:01" in body
    )


def _in_api_row(body, world, job):
    answer = json.loads(body)
    rows = answer.get("results", [answer])
    (row,) = [r for r in rows if r["id"] == job.pk]
    # A held job keeps its place but has no estimate (it would not start).
    estimated = row["estimated_start"] is not None
    return (row["queue_position"], row["pool_position"]) == (2, 2) and (
        estimated == (row["state"] == "PENDING")
    )


READERS = {
    "dashboard": (_page(lambda w, j: "/"), _in_job_table),
    "job list page": (_page(lambda w, j: "/jobs/"), _in_job_table),
    "job list, live part": (_page(lambda w, j: "/jobs/", htmx=True), _in_job_table),
    "queue page": (_page(lambda w, j: f"/queues/{w.queue.pk}/"), _in_queue_table),
    "queue page, live part": (
        _page(lambda w, j: f"/queues/{w.queue.pk}/", htmx=True),
        _in_queue_table,
    ),
    "job page": (_page(lambda w, j: f"/jobs/{j.pk}/"), _in_job_page),
    "job page, live part": (_page(lambda w, j: f"/jobs/{j.pk}/live"), _in_job_page),
    "GET /api/v1/jobs": (_api("get", lambda w, j: "/api/v1/jobs"), _in_api_row),
    "GET /api/v1/jobs/<id>": (_api("get", lambda w, j: f"/api/v1/jobs/{j.pk}"), _in_api_row),
    "POST /api/v1/jobs/<id>/hold": (
        _api("post", lambda w, j: f"/api/v1/jobs/{j.pk}/hold"),
        _in_api_row,
    ),
}


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_attaches_and_shows_the_position(world, client, api, reader):
    fetch, shows = READERS[reader]
    _, job = _waiting(world, 2)
    PoolEstimates.objects.create(
        pool=world.pool, computed_at=timezone.now(), starts={str(job.pk): START.timestamp()}
    )

    response = fetch(world, client, api, job)

    assert response.status_code == 200, response.content[:500]
    assert shows(response.content.decode(), world, job), response.content.decode()[-3000:]
