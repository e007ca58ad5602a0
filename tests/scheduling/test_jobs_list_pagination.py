"""Lists that stay fast at a million jobs: ``GET /api/v1/jobs?cursor=`` pages by keyset
(next and previous links, no count, bad cursors refused by name), and the pages count
their rows only up to a limit (portal.api.pagination.CountCappedPaginator)."""

import base64
import json
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from portal.api.pagination import CountCappedPagination, CountCappedPaginator, cursor_encode
from scheduling import views
from scheduling.choices import JobState
from scheduling.models import Job
from tests import factories as f


def _jobs(world, n, **fields):
    return [f.JobFactory(project=world.project, queue=world.queue, **fields) for _ in range(n)]


def _follow(client, url):
    """The answer at ``url`` (a link the API gave, or a path)."""
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    response = client.get(parts.path, query)
    assert response.status_code == 200, response.content
    return response.json()


def _ids(answer):
    return [row["id"] for row in answer["results"]]


def test_cursor_pages_walk_forward_and_back_without_a_count(world, api):
    jobs = _jobs(world, 7)
    newest_first = sorted((j.pk for j in jobs), reverse=True)
    client = api(world.member)
    first = _follow(client, "/api/v1/jobs/?cursor=&page_size=3")
    assert "count" not in first and first["previous"] is None
    second = _follow(client, first["next"])
    third = _follow(client, second["next"])
    assert _ids(first) + _ids(second) + _ids(third) == newest_first
    assert third["next"] is None
    back = _follow(client, third["previous"])
    assert _ids(back) == _ids(second)
    front = _follow(client, back["previous"])
    assert _ids(front) == _ids(first) and front["previous"] is None
    assert _ids(_follow(client, front["next"])) == _ids(second)


def test_cursor_pages_by_submission_time_visit_tied_jobs_once(world, api):
    at = timezone.now()
    jobs = _jobs(world, 3, submitted_at=at) + _jobs(world, 2, submitted_at=at - timedelta(1))
    jobs += _jobs(world, 2, submitted_at=at + timedelta(1))
    expected = [j.pk for j in sorted(jobs, key=lambda j: (j.submitted_at, j.pk))]
    client = api(world.member)
    answer = _follow(client, "/api/v1/jobs/?cursor=&page_size=2&ordering=submitted_at")
    seen = _ids(answer)
    while answer["next"]:
        answer = _follow(client, answer["next"])
        seen += _ids(answer)
    assert seen == expected
    back = _follow(client, answer["previous"])
    assert _ids(back) == expected[-3:-1]


def test_cursor_pages_keep_the_filters_and_the_tenant_scope(world, api):
    mine = _jobs(world, 3, state=JobState.FAILED) + _jobs(world, 2)
    theirs = f.JobFactory(project=world.other_project, queue=world.other_queue)
    client = api(world.member)
    answer = _follow(client, "/api/v1/jobs/?cursor=&state=FAILED")
    assert _ids(answer) == sorted((j.pk for j in mine[:3]), reverse=True)
    # a cursor placed after the other tenant's job shows only the member's own
    cursor = cursor_encode({"o": "-id", "id": theirs.pk + 1}, reverse=False)
    answer = _follow(client, f"/api/v1/jobs/?cursor={cursor}")
    assert set(_ids(answer)) == {j.pk for j in mine}
    assert _ids(_follow(api(world.outsider), "/api/v1/jobs/?cursor=")) == [theirs.pk]


def test_page_numbers_still_answer_the_count(world, api):
    _jobs(world, 5)
    answer = _follow(api(world.member), "/api/v1/jobs/?page_size=2&page=2")
    assert answer["count"] == 5 and len(answer["results"]) == 2
    assert answer["count_capped"] is False
    assert "page=3" in answer["next"]


# --- page numbers: counted up to a limit ----------------------------------------------------


def test_the_api_counts_up_to_the_limit_and_says_when_it_stopped(world, api, monkeypatch):
    monkeypatch.setattr(CountCappedPagination, "count_limit", 4)
    jobs = _jobs(world, 4)
    client = api(world.member)
    answer = _follow(client, "/api/v1/jobs/?page_size=3")
    assert answer["count"] == 4 and answer["count_capped"] is False
    jobs += _jobs(world, 3)
    answer = _follow(client, "/api/v1/jobs/?page_size=3")
    assert answer["count"] == 4 and answer["count_capped"] is True
    assert list(answer) == ["count", "count_capped", "next", "previous", "results"]
    seen = _ids(answer)
    while answer["next"]:  # next stays exact past the counted rows
        answer = _follow(client, answer["next"])
        seen += _ids(answer)
    assert seen == sorted((j.pk for j in jobs), reverse=True)
    assert len(answer["results"]) == 1 and "page=2" in answer["previous"]
    assert client.get("/api/v1/jobs/", {"page_size": 3, "page": 4}).status_code == 404


def test_the_api_refuses_the_last_page_of_a_list_counted_in_part(world, api, monkeypatch):
    monkeypatch.setattr(CountCappedPagination, "count_limit", 2)
    _jobs(world, 3)
    response = api(world.member).get("/api/v1/jobs/", {"page": "last"})
    assert response.status_code == 400, response.content
    assert "page" in json.dumps(response.json())
    monkeypatch.setattr(CountCappedPagination, "count_limit", 3)
    answer = _follow(api(world.member), "/api/v1/jobs/?page=last&page_size=2")
    assert answer["count"] == 3 and len(answer["results"]) == 1


def test_a_deep_page_reads_the_keys_before_the_rows(world, api, monkeypatch):
    monkeypatch.setattr(CountCappedPagination, "count_limit", 2)
    jobs = _jobs(world, 5)
    with CaptureQueriesContext(connection) as ctx:
        answer = _follow(api(world.member), "/api/v1/jobs/?page_size=2&page=2")
    assert _ids(answer) == [jobs[2].pk, jobs[1].pk] and answer["count_capped"] is True
    offsets = [q["sql"] for q in ctx.captured_queries if "OFFSET" in q["sql"]]
    assert len(offsets) == 1 and offsets[0].startswith('SELECT "scheduling_job"."id" AS "pk" FROM')


def test_the_schema_documents_the_capped_count(world, api):
    schema = api(world.member).get("/api/schema/", {"format": "json"}).json()
    envelope = schema["components"]["schemas"]["PaginatedJobList"]["properties"]
    assert envelope["count_capped"]["type"] == "boolean"
    assert "10,000" in envelope["count"]["description"]


def _garbage(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "query, field",
    [
        ({"cursor": "not a cursor"}, "cursor"),
        ({"cursor": "%%%"}, "cursor"),
        ({"cursor": _garbage("[1, 2]")}, "cursor"),
        ({"cursor": _garbage('{"o": "-id", "r": 0}')}, "cursor"),
        ({"cursor": _garbage('{"o": "-id", "id": "7", "r": 0}')}, "cursor"),
        ({"cursor": _garbage('{"o": "-id", "id": 7, "r": 2}')}, "cursor"),
        ({"cursor": cursor_encode({"o": "id", "id": 7}, reverse=False)}, "cursor"),
        (
            {
                "cursor": cursor_encode(
                    {"o": "submitted_at", "id": 7, "v": "2026-01-01T00:00:00"}, reverse=False
                ),
                "ordering": "submitted_at",
            },
            "cursor",
        ),
        (
            {
                "cursor": cursor_encode({"o": "submitted_at", "id": 7, "v": 5}, reverse=False),
                "ordering": "submitted_at",
            },
            "cursor",
        ),
        ({"cursor": "", "page": "2"}, "cursor"),
        ({"cursor": "", "ordering": "state"}, "ordering"),
        ({"cursor": "", "ordering": "queue_position"}, "ordering"),
        ({"cursor": "", "page_size": "0"}, "page_size"),
    ],
)
def test_bad_cursors_are_refused_by_name(world, api, query, field):
    _jobs(world, 2)
    response = api(world.member).get("/api/v1/jobs/", query)
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"] or field in response.json(), response.json()


def test_lists_without_cursors_say_so(world, api):
    response = api(world.member).get("/api/v1/projects/", {"cursor": ""})
    assert response.status_code == 400 and "cursor" in json.dumps(response.json())


def test_a_cursor_page_costs_the_same_queries_for_few_and_many_jobs(world, api):
    client = api(world.member)

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            _follow(client, "/api/v1/jobs/?cursor=&page_size=50")
        return len(ctx.captured_queries)

    _jobs(world, 3)
    _jobs(world, 2, state=JobState.PENDING, pending_rank=1.0)
    few = queries()
    _jobs(world, 30)
    _jobs(world, 20, state=JobState.PENDING, pending_rank=2.0)
    assert queries() == few
    # no count of the list (the positions of the waiting jobs are counted, not the list)
    assert not any('AS "__count"' in q["sql"] for q in _captured(client))


def _captured(client):
    with CaptureQueriesContext(connection) as ctx:
        _follow(client, "/api/v1/jobs/?cursor=")
    return ctx.captured_queries


# --- pages: counted up to a limit -----------------------------------------------------------


def test_a_list_past_the_count_limit_pages_on_by_reading_one_row_more(world, monkeypatch):
    monkeypatch.setattr(CountCappedPaginator, "count_limit", 5)
    jobs = _jobs(world, 12)
    rows = Job.objects.select_related("project").order_by("id")
    paginator = CountCappedPaginator(rows, 3)
    assert paginator.count_capped and paginator.count == 6
    seen = []
    for number in range(1, 5):
        page = paginator.page(number)
        seen += [j.pk for j in page]
        assert page.has_next() is (number < 4)
        assert all(j.project.slug == "llm" for j in page)  # the joins came with the rows
    assert seen == [j.pk for j in jobs]
    assert [j.pk for j in paginator.get_page(9)] == seen[:3]  # past the end: the first
    assert [j.pk for j in paginator.get_page("x")] == seen[:3]


def test_a_list_within_the_limit_is_paged_as_before(world, monkeypatch):
    monkeypatch.setattr(CountCappedPaginator, "count_limit", 5)
    jobs = _jobs(world, 5)
    paginator = CountCappedPaginator(Job.objects.order_by("id"), 2)
    assert not paginator.count_capped and paginator.num_pages == 3
    assert [j.pk for j in paginator.get_page(9)] == [jobs[4].pk]  # the last page


def test_the_job_list_page_says_more_than_the_limit(world, client, monkeypatch):
    monkeypatch.setattr(CountCappedPaginator, "count_limit", 60)
    _jobs(world, 61)
    client.force_login(world.member)
    response = client.get("/jobs/", {"state": "", "page": 2})
    text = response.content.decode()
    assert "more than 60 jobs" in text and "← previous" in text and "next →" not in text
    first = client.get("/jobs/", {"state": ""}).content.decode()
    assert "more than 60 jobs" in first and "page=2" in first


def test_the_queue_page_shows_the_newest_running_jobs_and_links_to_all(world, client, monkeypatch):
    monkeypatch.setattr(views, "QUEUE_RUNNING_SHOWN", 2)
    running = _jobs(world, 3, state=JobState.RUNNING)
    client.force_login(world.member)
    text = client.get(f"/queues/{world.queue.pk}/").content.decode()
    assert f"job-row-{running[2].pk}" in text and f"job-row-{running[1].pk}" in text
    assert f"job-row-{running[0].pk}" not in text
    assert "The 2 newest of 3" in text and f"queue={world.queue.pk}&amp;state=RUNNING" in text


@pytest.mark.parametrize("sort, ties", [("gpus", "oldest first"), ("-gpus", "newest first")])
def test_the_job_list_breaks_ties_in_the_direction_of_its_sort(world, client, sort, ties):
    small = _jobs(world, 2, gpus_per_node=1)
    large = _jobs(world, 2, gpus_per_node=2)
    client.force_login(world.member)
    text = client.get("/jobs/", {"state": "", "sort": sort}).content.decode()
    shown = sorted((j for j in small + large), key=lambda j: text.index(f"job-row-{j.pk}"))
    if ties == "oldest first":
        expected = [small[0], small[1], large[0], large[1]]
    else:
        expected = [large[1], large[0], small[1], small[0]]
    assert [j.pk for j in shown] == [j.pk for j in expected]
