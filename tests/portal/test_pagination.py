"""Pages of a joined queryset are read keys first (portal.api.pagination.KeysFirstPaginator):
the same rows in the same order as one query would give, on every page."""

from __future__ import annotations

import pytest

from portal.api.pagination import KeysFirstPaginator
from scheduling.models import Job
from tests import factories as f


@pytest.fixture
def jobs(world):
    return [f.JobFactory(project=world.project, queue=world.queue) for _ in range(7)]


@pytest.mark.parametrize("order", ["-id", "id", "state", "-submitted_at"])
def test_every_page_holds_what_slicing_the_queryset_gives(jobs, order):
    rows = Job.objects.select_related("project", "queue__pool").order_by(order, "id")
    paginator = KeysFirstPaginator(rows, 3)
    seen = []
    for number in paginator.page_range:
        page = paginator.page(number)
        assert [j.pk for j in page] == [j.pk for j in rows[(number - 1) * 3 : number * 3]]
        assert all(j.project.slug == "llm" for j in page)  # the joins came with the rows
        seen += page
    assert len(seen) == 7 and paginator.page(3).has_next() is False


def test_a_job_deleted_between_the_two_reads_is_left_out(jobs, monkeypatch):
    rows = Job.objects.select_related("project").order_by("id")
    paginator = KeysFirstPaginator(rows, 5)
    real = type(rows).filter
    deleted = []

    def filter_after_a_delete(self, *args, **kwargs):
        if "pk__in" in kwargs and not deleted:  # the second read: a job went meanwhile
            deleted.append(Job.objects.get(pk=jobs[1].pk).delete())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(rows), "filter", filter_after_a_delete)
    assert [j.pk for j in paginator.page(1)] == [j.pk for j in jobs[:5] if j != jobs[1]]
    assert deleted


def test_querysets_without_joins_and_lists_are_paged_as_django_does(jobs):
    plain = KeysFirstPaginator(Job.objects.order_by("id"), 4)
    assert [j.pk for j in plain.page(2)] == [j.pk for j in jobs[4:]]
    distinct = KeysFirstPaginator(
        Job.objects.select_related("project").distinct().order_by("id"), 4
    )
    assert [j.pk for j in distinct.page(1)] == [j.pk for j in jobs[:4]]
    assert list(KeysFirstPaginator(list(range(10)), 4).page(3)) == [8, 9]


def test_the_jobs_api_pages_through_every_job_once(world, api, jobs):
    client = api(world.member)
    first = client.get("/api/v1/jobs/", {"page_size": 4}).json()
    second = client.get("/api/v1/jobs/", {"page_size": 4, "page": 2}).json()
    ids = [j["id"] for j in first["results"] + second["results"]]
    assert first["count"] == 7 and ids == sorted((j.pk for j in jobs), reverse=True)
