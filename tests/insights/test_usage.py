"""Usage accounting: exact GPU-hours from hand-made UsageDay rows, grouping, the guarantee
share, CSV, bad input, scoping (nlp vs vision) and constant query counts."""

from __future__ import annotations

import csv
import datetime as dt
import io

import pytest
from freezegun import freeze_time

from insights import usage
from insights.models import UsageDay
from tests import factories as f
from tests.insights.usage_helpers import busy_range, query_count, usage_day, world_usage

pytestmark = pytest.mark.django_db
NOW = "2026-11-15 12:00:00"
RANGE = {"start": "2026-11-01", "end": "2026-11-10"}  # 10 whole days: 240 hours


@pytest.fixture
def history(world):
    """nlp: 960 GPU-h allocated, 480 used in the range; vision: 192 and 48; plus rows just
    outside the range that must not count."""
    w = world
    world_usage(w, day="2026-11-01", allocated=600, used=300)
    world_usage(
        w,
        day="2026-11-02",
        user=w.tenant_admin,
        workload_type="fine_tuning",
        allocated=360,
        used=180,
    )
    world_usage(w, day="2026-11-10", vision=True, allocated=192, used=48)
    world_usage(w, day="2026-10-31", allocated=1000, used=1000)
    usage_day(tenant=w.other, day="2026-11-11", pool=w.pool, allocated=1000, used=1000)
    return w


def get(api, who, **params):
    return api(who).get("/api/v1/usage", {**RANGE, **params})


def rows_by(body, key):
    return {r[key]: r for r in body["results"]}


@freeze_time(NOW)
def test_exact_hours_and_guarantee_per_tenant(api, history):
    body = get(api, history.platform_admin).json()
    assert body["group_by"] == ["tenant"]
    assert body["hours"] == 240.0
    nlp, vision = rows_by(body, "tenant")["nlp"], rows_by(body, "tenant")["vision"]
    assert nlp == {
        "tenant": "nlp",
        "allocated_gpu_hours": 960.0,
        "used_gpu_hours": 480.0,
        "utilization_pct": 50.0,
        "guaranteed_gpu_hours": 1920.0,  # 8 guaranteed GPUs × 240 h
        "guarantee_allocated_pct": 50.0,
        "guarantee_used_pct": 25.0,
        "sampled_gpu_hours": 0.0,  # rows written by hand: used, so sampled
        "utilization_note": None,
    }
    assert (vision["allocated_gpu_hours"], vision["used_gpu_hours"]) == (192.0, 48.0)
    assert (vision["utilization_pct"], vision["guarantee_allocated_pct"]) == (25.0, 10.0)
    assert vision["guarantee_used_pct"] == 2.5
    totals = body["totals"]
    assert (totals["allocated_gpu_hours"], totals["used_gpu_hours"]) == (1152.0, 528.0)
    assert totals["guaranteed_gpu_hours"] == 3840.0
    assert totals["utilization_pct"] == 45.8  # 528 / 1152
    assert totals["guarantee_allocated_pct"] == 30.0
    assert body["count"] == 2


@freeze_time(NOW)
def test_defaults_are_the_last_30_days_by_tenant(api, history):
    body = api(history.platform_admin).get("/api/v1/usage").json()
    assert (body["start"], body["end"]) == ("2026-10-17", "2026-11-15")
    assert body["hours"] == 29 * 24 + 12  # today counts the hours gone so far
    # every row of the fixture is in these 30 days
    assert body["totals"]["allocated_gpu_hours"] == 960 + 192 + 1000 + 1000


@freeze_time(NOW)
def test_group_by_project_user_workload_type(api, history):
    body = get(api, history.platform_admin, group_by="project,user,workload_type").json()
    # a project names its tenant: the tenant column comes along
    assert body["group_by"] == ["tenant", "project", "user", "workload_type"]
    got = {(r["tenant"], r["project"], r["user"], r["workload_type"]): r for r in body["results"]}
    assert set(got) == {
        ("nlp", "llm", "nlp-member", "training"),
        ("nlp", "llm", "nlp-admin", "fine_tuning"),
        ("vision", "detector", "vision-member", "training"),
    }
    row = got[("nlp", "llm", "nlp-admin", "fine_tuning")]
    assert (row["allocated_gpu_hours"], row["used_gpu_hours"]) == (360.0, 180.0)
    # a project's rows are measured against its tenant's guarantee
    assert row["guaranteed_gpu_hours"] == 1920.0
    assert row["guarantee_allocated_pct"] == 18.8  # 360 / 1920 = 18.75 %


@freeze_time(NOW)
def test_group_by_day_uses_the_day_s_hours(api, history):
    body = get(api, history.platform_admin, group_by=["day", "tenant"], tenant="nlp").json()
    got = {(r["day"], r["tenant"]): r for r in body["results"]}
    assert set(got) == {("2026-11-01", "nlp"), ("2026-11-02", "nlp")}
    first = got[("2026-11-01", "nlp")]
    assert first["guaranteed_gpu_hours"] == 192.0  # 8 GPUs × 24 h
    assert first["guarantee_allocated_pct"] == 312.5  # borrowing: 600 of 192
    assert body["totals"]["guaranteed_gpu_hours"] == 1920.0


@freeze_time(NOW)
def test_today_counts_the_hours_gone_so_far(api, history):
    usage_day(tenant=history.tenant, day="2026-11-15", pool=history.pool, allocated=48, used=24)
    body = (
        api(history.platform_admin)
        .get("/api/v1/usage", {"start": "2026-11-15", "end": "2026-11-20", "tenant": "nlp"})
        .json()
    )
    assert body["hours"] == 12.0
    assert body["results"][0]["guaranteed_gpu_hours"] == 96.0  # 8 × 12 h
    assert body["results"][0]["guarantee_allocated_pct"] == 50.0


@freeze_time(NOW)
def test_guarantee_per_pool_and_gpu_model(api, history):
    w = history
    inference = f.PoolFactory(name="inference")
    f.QuotaFactory(tenant=w.tenant, pool=inference, gpu_model="A100-40GB", guaranteed_gpus=4)
    usage_day(
        tenant=w.tenant,
        day="2026-11-03",
        pool=inference,
        gpu_model="A100-40GB",
        workload_type="inference",
        allocated=480,
        used=240,
    )
    body = get(api, w.tenant_admin, group_by="tenant,pool,gpu_model").json()
    got = {(r["tenant"], r["pool"], r["gpu_model"]): r for r in body["results"]}
    a100 = got[("nlp", "inference", "A100-40GB")]
    assert a100["guaranteed_gpu_hours"] == 960.0  # 4 × 240 h
    assert (a100["guarantee_allocated_pct"], a100["guarantee_used_pct"]) == (50.0, 25.0)
    # the training quota is for any model: on a row of its own, the H100 row has none
    assert got[("nlp", "training", "any")]["guaranteed_gpu_hours"] == 1920.0
    assert got[("nlp", "training", "any")]["allocated_gpu_hours"] == 0.0
    h100 = got[("nlp", "training", "H100-80GB")]
    assert h100["allocated_gpu_hours"] == 960.0
    assert h100["guarantee_allocated_pct"] is None
    assert body["totals"]["guaranteed_gpu_hours"] == 1920.0 + 960.0
    assert not any(t == "vision" for t, _, _ in got)


@freeze_time(NOW)
def test_unused_guarantee_shows_as_a_row(api, world):
    usage_day(tenant=world.tenant, day="2026-11-01", pool=world.pool, allocated=24, used=12)
    body = get(api, world.platform_admin).json()
    vision = rows_by(body, "tenant")["vision"]
    assert vision["allocated_gpu_hours"] == 0.0
    assert vision["guaranteed_gpu_hours"] == 1920.0
    assert vision["guarantee_allocated_pct"] == 0.0


@freeze_time(NOW)
@pytest.mark.parametrize("who", ["tenant_admin", "member", "viewer"])
def test_nlp_users_see_nlp_only(api, history, who):
    body = get(api, getattr(history, who), group_by="tenant,project,user").json()
    assert {r["tenant"] for r in body["results"]} == {"nlp"}
    assert body["totals"]["allocated_gpu_hours"] == 960.0
    assert body["totals"]["guaranteed_gpu_hours"] == 1920.0
    # asking for the other tenant by name or by project gives nothing of it
    for params in ({"tenant": "vision"}, {"project": history.other_project.pk}):
        other = get(api, getattr(history, who), **params).json()
        assert other["results"] == []
        assert other["totals"]["allocated_gpu_hours"] == 0.0
        assert other["totals"]["guaranteed_gpu_hours"] == 0.0


@freeze_time(NOW)
def test_vision_sees_vision_only(api, history):
    body = get(api, history.outsider, group_by="user").json()
    assert [r["user"] for r in body["results"]] == ["vision-member"]
    assert body["totals"]["allocated_gpu_hours"] == 192.0


@freeze_time(NOW)
def test_user_without_tenant_sees_nothing(api, history):
    body = get(api, f.UserFactory(username="loner")).json()
    assert body["results"] == [] and body["totals"]["allocated_gpu_hours"] == 0.0


def test_anonymous_is_refused(api, history):
    assert api().get("/api/v1/usage").status_code in (401, 403)


@freeze_time(NOW)
def test_filters_by_project_pool_and_user(api, history):
    by_project = get(api, history.platform_admin, project=history.project.pk).json()
    assert by_project["totals"]["allocated_gpu_hours"] == 960.0
    # the guarantee is the project's tenant's
    assert by_project["totals"]["guaranteed_gpu_hours"] == 1920.0
    by_user = get(api, history.platform_admin, user="nlp-admin").json()
    assert by_user["totals"]["allocated_gpu_hours"] == 360.0
    by_pool = get(api, history.platform_admin, pool="nowhere").json()
    assert by_pool["totals"]["allocated_gpu_hours"] == 0.0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"start": "2026-13-01"}, "start"),
        ({"end": "yesterday"}, "end"),
        ({"start": "2026-11-10", "end": "2026-11-01"}, "end"),
        ({"start": "2020-01-01", "end": "2026-01-01"}, "end"),
        ({"group_by": "tenant,colour"}, "group_by"),
        ({"project": "abc"}, "project"),
        # the range's hours (or its default start) would leave the dates Python represents
        ({"end": "9999-12-31"}, "end"),
        ({"start": "9999-12-30", "end": "9999-12-31"}, "end"),
        ({"end": "0001-01-01"}, "end"),
        ({"start": "0001-01-01", "end": "0001-01-05"}, "start"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api, world, params, field):
    response = api(world.member).get("/api/v1/usage", params)
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert any(name.split("[")[0] == field for name in errors), errors


def test_bad_input_with_csv_asked_is_a_json_400(api, world):
    response = api(world.member).get("/api/v1/usage", {"start": "nope", "format": "csv"})
    assert response.status_code == 400
    assert response["Content-Type"].startswith("application/json")
    assert "start" in response.json()["errors"]


def test_days_outside_the_range_with_csv_asked_are_a_json_400(api, world):
    response = api(world.member).get(
        "/api/v1/usage", {"start": "9999-12-30", "end": "9999-12-31", "format": "csv"}
    )
    assert response.status_code == 400
    assert "end" in response.json()["errors"]


@freeze_time(NOW)
def test_an_end_near_the_first_day_starts_the_default_range_there(api, world):
    response = api(world.member).get("/api/v1/usage", {"end": "1970-01-10"})
    assert response.status_code == 200, response.json()
    assert (response.json()["start"], response.json()["end"]) == ("1970-01-01", "1970-01-10")


def _csv(response) -> list[list[str]]:
    text = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(text)))


@freeze_time(NOW)
def test_csv_export(api, history):
    response = get(api, history.platform_admin, group_by="tenant,day", format="csv")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == (
        'attachment; filename="sluice-usage-20261101-20261110.csv"'
    )
    lines = _csv(response)
    assert lines[0] == ["day", "tenant", *usage.FIGURE_COLUMNS]
    assert lines[1] == [
        *["2026-11-01", "nlp", "600.0", "300.0", "50.0", "192.0", "312.5", "156.2"],
        *["0.0", ""],  # sampled GPU-hours (rows written by hand), no note: a number
    ]
    assert [line[:2] for line in lines[1:-1]] == [
        ["2026-11-01", "nlp"],
        ["2026-11-02", "nlp"],
        ["2026-11-10", "vision"],
    ]
    assert lines[-1][:4] == ["total", "", "1152.0", "528.0"]
    assert lines[-1][5] == "3840.0"


@freeze_time(NOW)
def test_csv_by_accept_header(api, history):
    response = api(history.member).get("/api/v1/usage", RANGE, HTTP_ACCEPT="text/csv")
    assert response["Content-Type"].startswith("text/csv")
    lines = _csv(response)
    assert lines[1][:3] == ["nlp", "960.0", "480.0"]
    assert all("vision" not in line for line in lines)


@freeze_time(NOW)
def test_csv_defuses_formulas_in_names(api, world):
    evil = f.UserFactory(username='=HYPERLINK("http://x")')
    f.MembershipFactory(user=evil, tenant=world.tenant)
    usage_day(
        tenant=world.tenant,
        day="2026-11-01",
        pool=world.pool,
        user=evil,
        gpu_model="+cmd|' /C calc'!A0",
        allocated=1,
        used=1,
    )
    response = get(api, world.platform_admin, group_by="user,gpu_model", format="csv")
    row = _csv(response)[1]
    assert row[0] == '\'=HYPERLINK("http://x")'
    assert row[1] == "'+cmd|' /C calc'!A0"
    assert usage_day  # numbers stay numbers:
    assert row[2] == "1.0"


@freeze_time(NOW)
def test_json_is_paginated(api, history):
    body = get(api, history.platform_admin, group_by="user", page_size=1).json()
    assert body["count"] == 3 and len(body["results"]) == 1 and body["next"]
    assert body["totals"]["allocated_gpu_hours"] == 1152.0


def _queries(client, params) -> int:
    return query_count(client, "/api/v1/usage", params)


@freeze_time(NOW)
@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_query_count_does_not_grow_with_the_data(api, world, fmt):
    params = {**RANGE, "group_by": "day,project,user", "format": fmt}
    client = api(world.tenant_admin)
    world_usage(world, day="2026-11-01", allocated=1, used=1)
    few = _queries(client, params)
    users = [f.UserFactory() for _ in range(5)]
    busy_range(
        tenant=world.tenant, pool=world.pool, project=world.project, users_of_day=lambda: users
    )
    many = _queries(api(world.tenant_admin), params)
    assert many == few


def test_schema_documents_the_endpoint(api, world):
    response = api(world.platform_admin).get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    operation = response.json()["paths"]["/api/v1/usage"]["get"]
    names = {p["name"] for p in operation["parameters"]}
    assert {"start", "end", "group_by", "tenant", "project", "pool", "user", "format"} <= names
    assert "text/csv" in operation["responses"]["200"]["content"]


@freeze_time(NOW)
def test_hours_held_without_samples_say_no_samples_not_0_percent(api, world):
    """GPU-hours allocated with no utilization sample (a history rebuilt from the jobs, a
    node whose agent sends none): the API, the CSV and the page say "no samples", not 0 %;
    sampled hours at 0 % used are 0 %."""
    day = dt.date(2026, 11, 5)
    UsageDay.objects.create(
        day=day,
        tenant=world.tenant,
        workload_type="training",
        pool=world.pool,
        gpu_model="H100-80GB",
        allocated_gpu_hours=1052.0,
    )
    UsageDay.objects.create(
        day=day,
        tenant=world.other,
        workload_type="training",
        pool=world.pool,
        gpu_model="H100-80GB",
        allocated_gpu_hours=10.0,
        sampled_gpu_hours=10.0,
    )
    body = get(api, world.platform_admin).json()
    nlp, vision = rows_by(body, "tenant")["nlp"], rows_by(body, "tenant")["vision"]
    assert (nlp["utilization_pct"], nlp["utilization_note"]) == (None, "no samples")
    assert (vision["utilization_pct"], vision["utilization_note"]) == (0.0, None)
    assert (body["totals"]["utilization_pct"], body["totals"]["utilization_note"]) == (0.0, None)

    lines = _csv(get(api, world.platform_admin, format="csv"))
    nlp_line = next(line for line in lines if line[0] == "nlp")
    assert nlp_line[-1] == "no samples" and nlp_line[3] == ""

    from django.test import Client

    client = Client()
    client.force_login(world.platform_admin)
    page = client.get("/usage/", {"start": "2026-11-01", "end": "2026-11-10"}).content.decode()
    assert "no samples" in page
