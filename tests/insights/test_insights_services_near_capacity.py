"""The insights count the inference services near capacity (at their max replicas or their
tenant's quota while the load asks for more), scoped like the rest of the page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time

from inference.choices import BlockedReason, ServiceState
from scheduling.choices import JobState
from tenants.choices import Role
from tests import factories as f
from tests.inference.factories import ScaleDecisionFactory, ServiceFactory, replica, serving
from tests.insights.test_insights_page import get, rows

pytestmark = pytest.mark.django_db

NOW = "2026-11-20 12:00:00"


def near(service, at, *, yes=True, recommended=6, current=4):
    return ScaleDecisionFactory(
        service=service,
        at=at,
        current=current,
        desired=min(recommended, service.max_replicas),
        reason_code="max_replicas" if yes else "steady",
        inputs={"recommended": recommended, "current": current, "near_capacity": yes},
    )


@pytest.fixture
def services(world):
    """nlp: chat at max replicas for 20 min (after a calm line), embed at quota, idle not
    near; vision: detect at max replicas (stored at ``NOW``)."""
    with freeze_time(NOW):
        return _services(world)


def _services(world):
    now = timezone.now()
    s = serving(world)
    chat = ServiceFactory(
        queue=s.queue, project=world.project, name="chat", max_replicas=4, near_capacity=True
    )
    for _ in range(4):
        replica(chat, state=JobState.RUNNING, ready=True)
    near(chat, now - timedelta(minutes=40), yes=False, recommended=3, current=3)
    near(chat, now - timedelta(minutes=20))
    near(chat, now - timedelta(minutes=5))
    embed = ServiceFactory(
        queue=s.queue,
        project=world.project,
        name="embed",
        max_replicas=8,
        desired_replicas=6,
        near_capacity=True,
        blocked_reason_code=BlockedReason.AT_QUOTA,
        blocked_reason_message="At quota: 8 of 8 GPUs of nlp in inference.",
    )
    replica(embed, state=JobState.RUNNING, ready=True)
    replica(embed, state=JobState.PENDING)
    ServiceFactory(queue=s.queue, project=world.project, name="idle", near_capacity=False)
    ServiceFactory(
        queue=s.queue, project=world.project, name="paused", near_capacity=True,
        state=ServiceState.PAUSED,
    )  # fmt: skip
    detect = ServiceFactory(
        queue=s.other_queue, project=world.other_project, name="detect", near_capacity=True
    )
    near(detect, now - timedelta(minutes=3))
    return {"chat": chat, "embed": embed, "detect": detect}


def count(body: str) -> int:
    stat = body.split('id="stat-services-near-capacity">')[1].split("<")[0]
    section = body.split('id="services-near-capacity-count">')[1].split("<")[0]
    assert stat == section
    return int(stat)


@freeze_time(NOW)
def test_tenant_admin_sees_their_tenants_services_near_capacity(world, client, services):
    _, body = get(client, world.tenant_admin)

    assert count(body) == 2
    table = rows(body, "table-services-near-capacity")
    assert table == [
        "llm/chat nlp 4 (4) / 4 max replicas 2026-11-20 11:40 UTC (20 minutes)",
        "llm/embed nlp 2 (1) / 8 quota not recorded",
    ]
    assert f'href="/services/{services["chat"].pk}/"' in body
    assert 'title="At quota: 8 of 8 GPUs of nlp in inference."' in body
    assert "detect" not in body


@freeze_time(NOW)
def test_platform_admin_counts_every_tenants(world, client, services):
    _, body = get(client, world.platform_admin)

    assert count(body) == 3
    names = [r.split()[0] for r in rows(body, "table-services-near-capacity")]
    assert names == ["llm/chat", "llm/embed", "detector/detect"]


@freeze_time(NOW)
def test_outsider_sees_none_of_another_tenants(world, client, services):
    _, body = get(client, world.outsider)  # vision's admin

    assert count(body) == 1
    assert [r.split()[0] for r in rows(body, "table-services-near-capacity")] == ["detector/detect"]
    assert "llm/chat" not in body and "llm/embed" not in body


@freeze_time(NOW)
def test_a_tenant_only_joined_as_member_is_not_in_the_admins_insights(world, client, services):
    """Insights cover the tenants one administers: vision's admin who is also a member of
    nlp still sees vision's service only."""
    f.MembershipFactory(user=world.outsider, tenant=world.tenant, role=Role.MEMBER)

    _, body = get(client, world.outsider)

    assert count(body) == 1 and "llm/chat" not in body


def test_members_and_viewers_get_no_insights(world, client, services):
    for user in (world.member, world.viewer):
        response, _ = get(client, user)
        assert response.status_code == 403


def test_none_near_capacity_renders_an_empty_state(world, client):
    serving(world)

    response, body = get(client, world.tenant_admin)

    assert response.status_code == 200
    assert count(body) == 0
    assert 'id="table-services-near-capacity"' not in body
    assert "No inference service of nlp is at its max replicas" in body


def test_the_services_cost_one_query_whatever_their_number(world, client, services):
    client.force_login(world.platform_admin)
    with CaptureQueriesContext(connection) as small:
        client.get("/insights/")
    s = services["chat"]
    for i in range(5):
        other = ServiceFactory(
            queue=s.queue, project=world.project, name=f"more{i}", near_capacity=True
        )
        replica(other, state=JobState.RUNNING, ready=True)
        near(other, timezone.now())
    with CaptureQueriesContext(connection) as large:
        body = client.get("/insights/").content.decode()
    assert count(body) == 8
    assert len(large) == len(small), [q["sql"][:120] for q in large.captured_queries]


@freeze_time(NOW)
def test_what_holds_a_service(world, client):
    """The quota alone when the quota holds it (even at a desired count equal to max); both
    when the load also asks for more than max."""
    s = serving(world)
    quota = {"near_capacity": True, "blocked_reason_code": BlockedReason.AT_QUOTA}
    ServiceFactory(queue=s.queue, project=world.project, name="a", max_replicas=6,
                   desired_replicas=6, **quota)  # fmt: skip
    both = ServiceFactory(queue=s.queue, project=world.project, name="b", max_replicas=2, **quota)
    near(both, timezone.now(), recommended=5, current=1)

    _, body = get(client, world.tenant_admin)

    table = rows(body, "table-services-near-capacity")
    assert [r.split(" / ")[1] for r in table] == [
        "6 quota not recorded",
        "2 max replicas and quota 2026-11-20 12:00 UTC (0 minutes)",
    ]


# --- the same now in GET /api/v1/metrics/summary ----------------------------------------------


def api_services(api, user) -> list[dict]:
    response = api(user).get("/api/v1/metrics/summary")
    assert response.status_code == 200
    return response.json()["services_near_capacity"]


@freeze_time(NOW)
def test_the_summary_lists_the_services_near_capacity_the_user_sees(api, world, services):
    got = api_services(api, world.member)
    assert [(s["tenant"], s["project"], s["name"]) for s in got] == [
        ("nlp", "llm", "chat"),
        ("nlp", "llm", "embed"),
    ]
    chat, embed = got
    assert chat == {
        "id": services["chat"].pk,
        "name": "chat",
        "project": "llm",
        "tenant": "nlp",
        "replicas": 4,
        "ready_replicas": 4,
        "max_replicas": 4,
        "why": ["max_replicas"],
        "near_since": "2026-11-20T11:40:00Z",
    }
    assert (embed["why"], embed["near_since"]) == (["quota"], None)
    assert [s["name"] for s in api_services(api, world.viewer)] == ["chat", "embed"]
    assert [s["name"] for s in api_services(api, world.outsider)] == ["detect"]
    assert [s["name"] for s in api_services(api, world.platform_admin)] == [
        "chat",
        "embed",
        "detect",
    ]
    assert api_services(api, f.UserFactory(username="loner")) == []


def test_the_summarys_services_cost_the_same_queries_whatever_their_number(api, world, services):
    client = api(world.member)
    with CaptureQueriesContext(connection) as small:
        assert client.get("/api/v1/metrics/summary").status_code == 200
    chat = services["chat"]
    for i in range(5):
        other = ServiceFactory(
            queue=chat.queue, project=world.project, name=f"more{i}", near_capacity=True
        )
        replica(other, state=JobState.RUNNING, ready=True)
        near(other, timezone.now())
    with CaptureQueriesContext(connection) as large:
        body = client.get("/api/v1/metrics/summary").json()
    assert len(body["services_near_capacity"]) == 7
    assert len(large) == len(small), [q["sql"][:120] for q in large.captured_queries]
