"""Simulate, apply and dismiss a recommendation, on the pages and through the API; who may
see and do what."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEvent
from insights.choices import RecommendationKind, RecommendationState
from insights.models import Recommendation
from insights.services import recommendations as recommendation_services
from portal.errors import BusinessError
from scheduling.choices import NodeState, SimulationState, WorkloadType
from scheduling.models import Node, Notification, Quota, SimulationRun, WorkloadPolicy
from tests import factories as f
from tests.insights import recommendations_helpers as h

pytestmark = pytest.mark.django_db


def _make(kind, key, change, *, tenant=None, score=1.0, impact=10.0, title="a recommendation"):
    now = timezone.now()
    return Recommendation.objects.create(
        kind=kind,
        key=key,
        tenant=tenant,
        title=title,
        evidence={
            "period": {
                "start": (now - timedelta(days=7)).isoformat(),
                "end": now.isoformat(),
                "days": 7,
            },
            "impact_gpu_hours": impact,
            "score": score,
            "facts": [["Figure", "42"]],
        },
        change=change,
        created_at=now,
        updated_at=now,
    )


@pytest.fixture
def lower_nlp(world):
    """A real recommendation from the rule: lower nlp's guarantee 8 -> 4, borrow 8 -> 12."""
    h.usage_hours(world.pool, {world.tenant: [1.0] * 90 + [3.0] * 10, world.other: 8.0}, hours=100)
    recommendation_services.recommendations_refresh()
    return Recommendation.objects.get(kind=RecommendationKind.LOWER_GUARANTEE)


# -- simulate ---------------------------------------------------------------------------------


def test_simulate_replays_the_recorded_jobs_with_the_change(
    client, world, lower_nlp, django_capture_on_commit_callbacks
):
    h.history_jobs(world, 12)
    quota = Quota.objects.get(tenant=world.tenant)
    client.force_login(world.platform_admin)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("recommendation-simulate", args=[lower_nlp.pk]))

    run = SimulationRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("simulate-run", args=[run.pk])
    assert run.params == {
        "days": 7,
        "policy": "sluice",
        "quotas": {str(quota.pk): {"guaranteed": 4, "borrow_limit": 12}},
        "classes": {},
    }
    assert run.state == SimulationState.DONE, run.error
    assert run.result["jobs"] == 12  # the recorded jobs, replayed by the real engine
    assert run.result["baseline"]["summary"]["completed"] == 12
    assert "guaranteed 8 -> 4, borrow limit 8 -> 12" in run.result["changes"][0]
    nlp = next(row for row in run.result["comparison"] if row["tenant"] == "nlp")
    assert (nlp["guaranteed_before"], nlp["guaranteed_after"]) == (8, 4)
    lower_nlp.refresh_from_db()
    assert lower_nlp.simulation_id == run.pk

    page = client.get(reverse("recommendation", args=[lower_nlp.pk]))
    assert page.status_code == 200
    assert b"Simulated effect" in page.content
    assert b"nlp: guaranteed GPUs" in page.content and b"<td>8</td><td>4</td>" in page.content


def test_simulate_replays_a_queue_class_and_cordoned_nodes(
    world, django_capture_on_commit_callbacks
):
    h.history_jobs(world, 12)
    rec = _make(
        RecommendationKind.QUEUE_WAIT,
        "queue_wait:queue:x",
        {
            "summary": "x",
            "action": "queue_class",
            "queue": world.queue.pk,
            "priority_class": "high",
            "whatif": {"queue_classes": {str(world.queue.pk): "high"}, "cordon": ["gpu-02"]},
        },
        tenant=world.tenant,
    )

    with django_capture_on_commit_callbacks(execute=True):
        run = recommendation_services.recommendation_simulate(
            user=world.platform_admin, recommendation=rec
        )

    run.refresh_from_db()
    assert run.state == SimulationState.DONE, run.error
    assert run.params["queue_classes"] == {str(world.queue.pk): "high"}
    assert run.params["cordon"] == ["gpu-02"]
    assert run.result["changes"] == [
        "queue nlp/train: jobs run at class high",
        "node gpu-02: cordoned (its GPUs left out of the replay)",
    ]
    # Half the GPUs: the same jobs wait longer with the change.
    before = run.result["baseline"]["summary"]["wait_avg_s"]
    assert run.result["changed"]["summary"]["wait_avg_s"] > before


def test_a_change_the_simulator_cannot_replay_says_so(client, api, world):
    rec = _make(
        RecommendationKind.SHORT_IDLE_WINDOW,
        "short_idle_window:policy:interactive",
        {
            "summary": "shorter",
            "action": "policy_update",
            "policy": WorkloadType.INTERACTIVE,
            "fields": {"idle_window_seconds": 1800},
            "not_simulated": "The simulator does not model utilization.",
        },
    )
    client.force_login(world.platform_admin)

    page = client.get(reverse("recommendation", args=[rec.pk]))
    assert b"Not simulated: The simulator does not model utilization." in page.content
    assert b'id="rec-simulate"' not in page.content

    response = api(world.platform_admin).post(f"/api/v1/recommendations/{rec.pk}/simulate")
    assert response.status_code == 400
    assert response.json()["code"] == "not_simulatable"
    assert not SimulationRun.objects.exists()


# -- apply ------------------------------------------------------------------------------------


def test_apply_changes_the_quota_and_audits_it_with_the_simulated_effect(client, world, lower_nlp):
    run = SimulationRun.objects.create(
        created_by=world.platform_admin,
        params={},
        created_at=timezone.now(),
        state=SimulationState.DONE,
        result={
            "baseline": {"summary": {"wait_avg_s": 60.0, "wait_p95_s": 120.0}},
            "changed": {"summary": {"wait_avg_s": 90.0, "wait_p95_s": 300.0}},
            "comparison": [],
        },
    )
    Recommendation.objects.filter(pk=lower_nlp.pk).update(simulation=run)
    client.force_login(world.platform_admin)

    response = client.post(reverse("recommendation-apply", args=[lower_nlp.pk]))

    assert response.status_code == 302
    quota = Quota.objects.get(tenant=world.tenant)
    assert (quota.guaranteed_gpus, quota.borrow_limit_gpus) == (4, 12)
    lower_nlp.refresh_from_db()
    assert lower_nlp.state == RecommendationState.APPLIED
    assert lower_nlp.decided_by == world.platform_admin and lower_nlp.decided_at
    quota_event = AuditEvent.objects.get(action="quota.update")
    assert quota_event.before["guaranteed_gpus"] == 8 and quota_event.after["guaranteed_gpus"] == 4
    assert f"Recommendation #{lower_nlp.pk}" in quota_event.reason
    event = AuditEvent.objects.get(action="recommendation.apply")
    assert event.target_id == str(lower_nlp.pk) and event.tenant == world.tenant
    assert event.after["simulation"]["run"] == run.pk
    assert event.after["simulation"]["overall"]["wait_p95_s"] == [120.0, 300.0]
    assert event.after["changed"] == "quota nlp@training:any"


def test_apply_each_kind_of_change(world):
    admin = world.platform_admin
    policy = _make(
        RecommendationKind.SHORT_IDLE_WINDOW,
        "k1",
        {
            "action": "policy_update",
            "policy": WorkloadType.INTERACTIVE,
            "fields": {"idle_window_seconds": 1800, "idle_warning_lead_seconds": 600},
        },
    )
    notify = _make(
        RecommendationKind.REPEATED_FAILURE,
        "k2",
        {"action": "notify", "users": [world.member.pk], "message": "fix it", "link": "/jobs/"},
        tenant=world.tenant,
    )
    cordon = _make(
        RecommendationKind.IDLE_GPUS, "k3", {"action": "node_cordon", "nodes": ["gpu-02"]}
    )
    queue = _make(
        RecommendationKind.FREQUENT_RAISES,
        "k4",
        {"action": "queue_class", "queue": world.queue.pk, "priority_class": "high"},
        tenant=world.tenant,
    )

    for rec in (policy, notify, cordon, queue):
        recommendation_services.recommendation_apply(user=admin, recommendation=rec)

    assert WorkloadPolicy.objects.get(workload_type="interactive").idle_window_seconds == 1800
    [note] = Notification.objects.filter(user=world.member)
    assert note.message == "fix it" and note.link == "/jobs/"
    assert Node.objects.get(name="gpu-02").state == NodeState.CORDONED
    world.queue.refresh_from_db()
    assert world.queue.default_priority_class == world.high
    assert world.queue.max_self_service_class == world.high
    actions = sorted(AuditEvent.objects.values_list("action", flat=True))
    assert actions.count("recommendation.apply") == 4
    assert {"policy.update", "node.update", "queue.update"} <= set(actions)


def test_an_applied_recommendation_cannot_be_applied_again(api, world, lower_nlp):
    recommendation_services.recommendation_apply(
        user=world.platform_admin, recommendation=lower_nlp
    )

    response = api(world.platform_admin).post(f"/api/v1/recommendations/{lower_nlp.pk}/apply")

    assert response.status_code == 400 and response.json()["code"] == "not_open"
    assert AuditEvent.objects.filter(action="recommendation.apply").count() == 1


def test_a_quota_edited_since_the_recommendation_is_not_overwritten(client, api, world, lower_nlp):
    # The borrow limit 12 was computed as 8 + what the guarantee gives up (8 -> 4); once an
    # admin set the quota to 6 / 2 by hand, applying would write 4 / 12 over it.
    assert lower_nlp.change["from"] == {"guaranteed": 8, "borrow_limit": 8}
    Quota.objects.filter(tenant=world.tenant).update(guaranteed_gpus=6, borrow_limit_gpus=2)

    response = api(world.platform_admin).post(f"/api/v1/recommendations/{lower_nlp.pk}/apply")

    assert response.status_code == 400 and response.json()["code"] == "stale"
    client.force_login(world.platform_admin)
    page = client.post(reverse("recommendation-apply", args=[lower_nlp.pk]), follow=True)
    assert "was changed since this recommendation was computed" in page.content.decode()
    quota = Quota.objects.get(tenant=world.tenant)
    assert (quota.guaranteed_gpus, quota.borrow_limit_gpus) == (6, 2)
    lower_nlp.refresh_from_db()
    assert lower_nlp.state == RecommendationState.OPEN
    assert not AuditEvent.objects.filter(action__in=["quota.update", "recommendation.apply"])
    # The daily run recomputes it from the quota as it is now.
    recommendation_services.recommendations_refresh()
    lower_nlp.refresh_from_db()
    assert lower_nlp.change["from"] == {"guaranteed": 6, "borrow_limit": 2}
    assert (lower_nlp.change["guaranteed"], lower_nlp.change["borrow_limit"]) == (4, 4)
    recommendation_services.recommendation_apply(
        user=world.platform_admin, recommendation=lower_nlp
    )
    quota.refresh_from_db()
    assert (quota.guaranteed_gpus, quota.borrow_limit_gpus) == (4, 4)


def test_a_policy_edited_since_the_recommendation_is_not_overwritten(world):
    WorkloadPolicy.objects.filter(workload_type=WorkloadType.INTERACTIVE).update(
        idle_window_seconds=3600, idle_warning_lead_seconds=600
    )
    rec = _make(
        RecommendationKind.SHORT_IDLE_WINDOW,
        "short_idle_window:policy:interactive",
        {
            "action": "policy_update",
            "policy": WorkloadType.INTERACTIVE,
            "fields": {"idle_window_seconds": 1800, "idle_warning_lead_seconds": 600},
            "from": {"idle_window_seconds": 7200, "idle_warning_lead_seconds": 600},
        },
    )

    with pytest.raises(BusinessError) as raised:
        recommendation_services.recommendation_apply(user=world.platform_admin, recommendation=rec)

    assert raised.value.code == "stale"
    policy = WorkloadPolicy.objects.get(workload_type=WorkloadType.INTERACTIVE)
    assert policy.idle_window_seconds == 3600


def test_a_queue_class_raised_since_the_recommendation_is_not_lowered(world):
    # Computed when the queue ran at normal: "run it at high". An admin set it to high
    # and then to a class above it; applying would lower it again.
    urgent = f.PriorityClassFactory(name="urgent", value=800)
    rec = _make(
        RecommendationKind.QUEUE_WAIT,
        f"queue_wait:queue:{world.queue.pk}",
        {
            "action": "queue_class",
            "queue": world.queue.pk,
            "priority_class": "high",
            "from": {"default_priority_class": "normal"},
        },
        tenant=world.tenant,
    )
    world.queue.default_priority_class = urgent
    world.queue.max_self_service_class = urgent
    world.queue.save()

    with pytest.raises(BusinessError) as raised:
        recommendation_services.recommendation_apply(user=world.platform_admin, recommendation=rec)

    assert raised.value.code == "stale"
    world.queue.refresh_from_db()
    assert world.queue.default_priority_class == urgent


# -- dismiss ----------------------------------------------------------------------------------


def test_dismiss_needs_a_reason(client, api, world, lower_nlp):
    client.force_login(world.platform_admin)

    page = client.post(reverse("recommendation-dismiss", args=[lower_nlp.pk]), {"reason": "  "})
    assert page.status_code == 400
    assert b"Say why the recommendation is dismissed." in page.content
    response = api(world.platform_admin).post(
        f"/api/v1/recommendations/{lower_nlp.pk}/dismiss", {"reason": ""}, format="json"
    )
    assert response.status_code == 400 and "reason" in response.json()["errors"]
    lower_nlp.refresh_from_db()
    assert lower_nlp.state == RecommendationState.OPEN

    response = api(world.platform_admin).post(
        f"/api/v1/recommendations/{lower_nlp.pk}/dismiss",
        {"reason": "nlp launches a big run next month"},
        format="json",
    )
    assert response.status_code == 200
    assert response.json()["state"] == "dismissed"
    lower_nlp.refresh_from_db()
    assert lower_nlp.dismiss_reason == "nlp launches a big run next month"
    assert lower_nlp.decided_by == world.platform_admin
    event = AuditEvent.objects.get(action="recommendation.dismiss")
    assert event.reason == "nlp launches a big run next month"
    assert Quota.objects.get(tenant=world.tenant).guaranteed_gpus == 8


# -- who sees and does what --------------------------------------------------------------------


@pytest.fixture
def three(world):
    """One recommendation of nlp, one of vision, one about the platform (no tenant)."""
    return (
        _make(
            RecommendationKind.REPEATED_FAILURE,
            "n",
            {"action": "notify"},
            tenant=world.tenant,
            impact=5,
        ),
        _make(
            RecommendationKind.REPEATED_FAILURE,
            "v",
            {"action": "notify"},
            tenant=world.other,
            impact=50,
        ),
        _make(
            RecommendationKind.IDLE_GPUS, "p", {"action": "node_cordon", "nodes": []}, impact=500
        ),
    )


def test_platform_admins_see_everything_ranked_by_impact(client, api, world, three):
    client.force_login(world.platform_admin)
    page = client.get(reverse("recommendations"))
    assert page.status_code == 200
    assert [r.key for r in page.context["open_recs"]] == ["p", "v", "n"]

    body = api(world.platform_admin).get("/api/v1/recommendations").json()
    assert [r["key"] for r in body["results"]] == ["p", "v", "n"]
    filtered = api(world.platform_admin).get("/api/v1/recommendations?kind=idle_gpus").json()
    assert [r["key"] for r in filtered["results"]] == ["p"]


def test_tenant_admins_read_their_tenants_recommendations_only(client, api, world, three):
    nlp, vision, platform = three
    client.force_login(world.tenant_admin)

    page = client.get(reverse("recommendations"))
    assert [r.key for r in page.context["open_recs"]] == ["n"]
    assert client.get(reverse("recommendation", args=[nlp.pk])).status_code == 200
    assert client.get(reverse("recommendation", args=[vision.pk])).status_code == 404
    assert client.get(reverse("recommendation", args=[platform.pk])).status_code == 404
    assert client.post(reverse("recommendation-apply", args=[nlp.pk])).status_code == 403
    assert client.post(reverse("recommendation-simulate", args=[nlp.pk])).status_code == 403
    assert (
        client.post(reverse("recommendation-dismiss", args=[nlp.pk]), {"reason": "x"}).status_code
        == 403
    )

    client_api = api(world.tenant_admin)
    assert [r["key"] for r in client_api.get("/api/v1/recommendations").json()["results"]] == ["n"]
    assert client_api.get(f"/api/v1/recommendations/{vision.pk}").status_code == 404
    assert client_api.post(f"/api/v1/recommendations/{nlp.pk}/apply").status_code == 403
    assert client_api.post(f"/api/v1/recommendations/{vision.pk}/apply").status_code == 404
    assert (
        client_api.post(f"/api/v1/recommendations/{nlp.pk}/dismiss", {"reason": "x"}).status_code
        == 403
    )
    nlp.refresh_from_db()
    assert nlp.state == RecommendationState.OPEN


@pytest.mark.parametrize("who", ["member", "viewer"])
def test_members_and_viewers_are_refused(client, api, world, three, who):
    user = getattr(world, who)
    nlp = three[0]
    client.force_login(user)

    assert client.get(reverse("recommendations")).status_code == 403
    assert client.get(reverse("recommendation", args=[nlp.pk])).status_code == 403
    assert api(user).get("/api/v1/recommendations").status_code == 403
    assert api(user).get(f"/api/v1/recommendations/{nlp.pk}").status_code == 403
    assert api(user).post(f"/api/v1/recommendations/{nlp.pk}/apply").status_code == 403


def test_the_outsider_gets_404_for_another_tenants_recommendation(client, api, world, three):
    nlp = three[0]
    client.force_login(world.outsider)  # admin of vision

    assert client.get(reverse("recommendation", args=[nlp.pk])).status_code == 404
    assert client.post(reverse("recommendation-apply", args=[nlp.pk])).status_code == 404
    assert api(world.outsider).get(f"/api/v1/recommendations/{nlp.pk}").status_code == 404
    assert api(world.outsider).post(f"/api/v1/recommendations/{nlp.pk}/dismiss").status_code == 404
    assert api(world.platform_admin).get("/api/v1/recommendations/abc").status_code == 404


def test_the_list_filters_by_kind_and_state(client, world, three):
    nlp = three[0]
    recommendation_services.recommendation_dismiss(
        user=world.platform_admin, recommendation=nlp, reason="handled"
    )
    client.force_login(world.platform_admin)

    page = client.get(reverse("recommendations"), {"state": "dismissed"})
    assert page.context["open_recs"] == []
    assert [r.key for r in page.context["history"]] == ["n"]
    assert b"handled" in page.content
    page = client.get(reverse("recommendations"), {"kind": "idle_gpus", "state": "open"})
    assert [r.key for r in page.context["open_recs"]] == ["p"] and page.context["history"] == []
    # An unknown filter value is a form error (400), not a 500.
    assert client.get(reverse("recommendations"), {"kind": "nope"}).status_code == 400
    api_bad = client.get("/api/v1/recommendations", {"state": "nope"})
    assert api_bad.status_code == 400 and "state" in api_bad.json()["errors"]


def test_the_schema_documents_the_endpoints(client, world):
    client.force_login(world.platform_admin)
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    for path in (
        "/api/v1/recommendations",
        "/api/v1/recommendations/{id}",
        "/api/v1/recommendations/{id}/simulate",
        "/api/v1/recommendations/{id}/apply",
        "/api/v1/recommendations/{id}/dismiss",
    ):
        assert any(p.rstrip("/") == path for p in schema["paths"]), path


def test_the_list_queries_do_not_grow_with_the_rows(
    client, api, world, django_assert_max_num_queries
):
    run = SimulationRun.objects.create(
        created_by=world.platform_admin, params={}, created_at=timezone.now()
    )
    for number in range(30):
        rec = _make(
            RecommendationKind.REPEATED_FAILURE,
            f"k{number}",
            {"action": "notify"},
            tenant=world.tenant if number % 2 else world.other,
            impact=number,
        )
        if number % 3 == 0:
            Recommendation.objects.filter(pk=rec.pk).update(simulation=run)
        if number % 5 == 0:
            recommendation_services.recommendation_dismiss(
                user=world.platform_admin, recommendation=rec, reason="r"
            )
    client.force_login(world.platform_admin)
    user_api = api(world.platform_admin)

    with django_assert_max_num_queries(8):
        assert client.get(reverse("recommendations")).status_code == 200
    with django_assert_max_num_queries(6):
        assert user_api.get("/api/v1/recommendations").status_code == 200


def test_an_unknown_filter_is_a_form_error(client, world):
    client.force_login(world.platform_admin)
    page = client.get("/recommendations/?kind=bogus&state=open")
    assert page.status_code == 400
    assert 'id="filter-errors"' in page.content.decode()
    assert client.get("/recommendations/?state=open").status_code == 200
