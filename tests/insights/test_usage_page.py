"""The usage page: the report as a table and a chart, the CSV link, form errors, scoping."""

from __future__ import annotations

import datetime as dt

import pytest
from freezegun import freeze_time

from tests import factories as f
from tests.insights.usage_helpers import busy_range, query_count, usage_day, world_usage

pytestmark = pytest.mark.django_db
NOW = "2026-11-15 12:00:00"


@pytest.fixture
def history(world):
    world_usage(world, day="2026-11-01", allocated=600, used=300)
    world_usage(world, day="2026-11-02", vision=True, allocated=192, used=48)
    return world


@freeze_time(NOW)
def test_platform_admin_sees_every_tenant_and_totals(client, history):
    client.force_login(history.platform_admin)
    response = client.get("/usage/", {"start": "2026-11-01", "end": "2026-11-10"})
    assert response.status_code == 200
    html = response.content.decode()
    rows = {r["cells"][0]: r for r in response.context["rows"]}
    assert set(rows) == {"nlp", "vision"}
    assert rows["nlp"]["allocated_gpu_hours"] == 600.0
    assert rows["nlp"]["guarantee_allocated_pct"] == 31.2  # 600 of 8 × 240 h
    assert response.context["report"].totals["allocated_gpu_hours"] == 792.0
    assert 'id="usage-csv"' in html
    assert "/api/v1/usage?start=2026-11-01&amp;end=2026-11-10&amp;format=csv" in html
    assert 'data-chart="usage-chart-data"' in html
    chart = response.context["chart"]
    assert chart["data"]["labels"][0] == "11-01" and len(chart["data"]["labels"]) == 10
    assert chart["data"]["datasets"][1]["data"][0] == 600.0  # allocated on Nov 1
    assert chart["data"]["datasets"][0]["data"][0] == 384.0  # 16 guaranteed GPUs × 24 h


@freeze_time(NOW)
def test_member_sees_their_tenant_only(client, history):
    client.force_login(history.member)
    response = client.get(
        "/usage/", {"start": "2026-11-01", "end": "2026-11-10", "group_by": ["tenant", "user"]}
    )
    assert [r["cells"] for r in response.context["rows"]] == [["nlp", "nlp-member"]]
    html = response.content.decode()
    assert "vision" not in html
    assert response.context["report"].totals["allocated_gpu_hours"] == 600.0


@freeze_time(NOW)
def test_default_page_is_the_last_30_days(client, history):
    client.force_login(history.tenant_admin)
    response = client.get("/usage/")
    assert response.status_code == 200
    query = response.context["query"]
    assert (query.start, query.end) == (dt.date(2026, 10, 17), dt.date(2026, 11, 15))
    assert "?format=csv" in response.content.decode()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"start": "2026-02-30"}, "Enter a valid date."),
        ({"start": "2026-11-10", "end": "2026-11-01"}, "The end must be on or after the start."),
        ({"group_by": "colour"}, "Select a valid choice."),
        ({"end": "9999-12-31"}, "Pick a day from 1970-01-01 to 9998-12-31."),
        ({"end": "0001-01-01"}, "Pick a day from 1970-01-01 to 9998-12-31."),
        ({"start": "9999-12-30", "end": "9999-12-31"}, "Pick a day from"),
    ],
)
def test_bad_input_is_a_form_error(client, world, params, message):
    client.force_login(world.member)
    response = client.get("/usage/", params)
    assert response.status_code == 400
    assert message in response.content.decode()


def test_anonymous_goes_to_login(client, world):
    response = client.get("/usage/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def _count(client, params) -> int:
    return query_count(client, "/usage/", params)


@freeze_time(NOW)
def test_query_count_does_not_grow_with_the_data(client, world):
    client.force_login(world.platform_admin)
    params = {"start": "2026-11-01", "end": "2026-11-10", "group_by": ["day", "user"]}
    usage_day(tenant=world.tenant, day="2026-11-01", pool=world.pool, allocated=1, used=1)
    few = _count(client, params)
    busy_range(
        tenant=world.other,
        pool=world.pool,
        users_of_day=lambda: [f.UserFactory() for _ in range(4)],
    )
    assert _count(client, params) == few
