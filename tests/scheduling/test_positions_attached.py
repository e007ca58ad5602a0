"""Positions are attached by whoever reads a list of jobs; the job's properties never query.

The job list page, the queue page and ``GET /api/v1/jobs`` attach positions for the whole
page (scheduling.positions.positions_attach): their query count does not depend on how
many waiting jobs they show, and no position is read unattached.
"""

import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling.models import Job
from scheduling.positions import positions_attach
from tests import factories as f

UNATTACHED = "read without positions_attach"


def _waiting(world, n: int) -> list[Job]:
    own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    start = Job.objects.count()
    return [
        f.JobFactory(pending_reason_code="WAITING_FOR_GPUS", pending_rank=start + k + 1.0, **own)
        for k in range(n)
    ]


def test_an_unattached_position_is_logged_once(world, caplog):
    (job,) = _waiting(world, 1)
    job = Job.objects.get(pk=job.pk)

    with caplog.at_level(logging.WARNING, logger="sluice.positions"):
        values = (job.queue_position, job.pool_position, job.estimated_start)

    assert values[:2] == (1, 1)
    assert caplog.text.count(UNATTACHED) == 1 and str(job.pk) in caplog.text


def test_an_attached_position_is_read_from_the_job(world, caplog):
    jobs = _waiting(world, 3)
    loaded = list(Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("pending_rank"))
    positions_attach(loaded)

    with CaptureQueriesContext(connection) as ctx:
        positions = [job.queue_position for job in loaded]

    assert positions == [1, 2, 3]
    assert ctx.captured_queries == []
    assert UNATTACHED not in caplog.text


def _page_client(client, user):
    client.force_login(user)
    return client


LISTS = {
    "job list page": lambda w, client, api: _page_client(client, w.member).get("/jobs/"),
    "queue page": lambda w, client, api: _page_client(client, w.member).get(
        f"/queues/{w.queue.pk}/"
    ),
    "GET /api/v1/jobs": lambda w, client, api: api(w.member).get("/api/v1/jobs"),
}


@pytest.mark.parametrize("name", LISTS)
def test_lists_attach_positions_in_a_bounded_number_of_queries(world, client, api, caplog, name):
    fetch = LISTS[name]

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            response = fetch(world, client, api)
        assert response.status_code == 200
        return len(ctx.captured_queries)

    _waiting(world, 5)
    fetch(world, client, api)  # sessions, caches: the first request's one-offs
    with caplog.at_level(logging.WARNING, logger="sluice.positions"):
        few = count()
        _waiting(world, 45)
        many = count()

    assert many == few, f"{name}: {few} queries for 5 waiting jobs, {many} for 50"
    assert UNATTACHED not in caplog.text, caplog.text


def test_the_api_list_shows_the_positions(world, api):
    jobs = _waiting(world, 5)

    rows = api(world.member).get("/api/v1/jobs").json()["results"]

    positions = {row["id"]: row["queue_position"] for row in rows}
    assert positions == {job.pk: k + 1 for k, job in enumerate(jobs)}


def test_the_job_api_and_page_attach_one_jobs_position(world, client, api, caplog):
    _, job = _waiting(world, 2)

    with caplog.at_level(logging.WARNING, logger="sluice.positions"):
        answer = api(world.member).get(f"/api/v1/jobs/{job.pk}").json()
        page = _page_client(client, world.member).get(f"/jobs/{job.pk}/")

    assert answer["queue_position"] == 2
    assert "<strong>#2</strong> in its queue" in page.content.decode()
    assert UNATTACHED not in caplog.text
