"""``/api/v1/priority-raises``, ``/tenants/{slug}/raise-ceiling`` and ``/notifications``."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditEvent
from scheduling.choices import RaiseState
from scheduling.models import JobEvent, Notification, PriorityRaise
from scheduling.services import raises
from tests import factories as f
from tests.raise_helpers import ask

URL = "/api/v1/priority-raises"


@pytest.fixture
def job(member_job):
    return member_job


def create(api, user, **body):
    return api(user).post(URL, body, format="json")


def step(api, user, raise_, name, comment=""):
    return api(user).post(f"{URL}/{raise_.pk}/{name}", {"comment": comment}, format="json")


# --- the whole flow --------------------------------------------------------------------------


def test_member_requests_tenant_admin_approves_and_the_job_runs_at_the_new_class(
    world, api, ceiling, job, dispatch_requests, django_capture_on_commit_callbacks
):
    response = create(
        api, world.member, job=job.pk, to_class="high", reason="demo tomorrow", hours=6
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "pending"
    assert (body["scope"], body["job"], body["from_class"], body["to_class"]) == (
        "job",
        job.pk,
        "normal",
        "high",
    )
    assert body["requested_by"] == "nlp-member"

    inbox = api(world.tenant_admin).get(URL, {"decidable": "true"}).json()
    assert [r["id"] for r in inbox["results"]] == [body["id"]]
    admin_notes = api(world.tenant_admin).get("/api/v1/notifications").json()["results"]
    assert [n["kind"] for n in admin_notes] == ["raise_requested"]

    with django_capture_on_commit_callbacks(execute=True):
        response = api(world.tenant_admin).post(
            f"{URL}/{body['id']}/approve", {"comment": "go"}, format="json"
        )

    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "approved"
    assert response.json()["decided_by"] == "nlp-admin"
    assert response.json()["comment"] == "go"
    assert dispatch_requests == [1]
    detail = api(world.member).get(f"/api/v1/jobs/{job.pk}").json()
    assert (detail["priority_class"], detail["base_priority_class"]) == ("high", "normal")
    kinds = [
        e["kind"] for e in api(world.member).get(f"/api/v1/jobs/{job.pk}/events").json()["results"]
    ]
    assert kinds == ["raise_requested", "raise_approved"]
    actions = list(AuditEvent.objects.order_by("id").values_list("action", flat=True))
    assert actions == ["priority_raise.request", "priority_raise.approve"]
    notes = api(world.member).get("/api/v1/notifications").json()["results"]
    assert [n["kind"] for n in notes] == ["raise_approved"]
    assert notes[0]["priority_raise"] == body["id"]


def test_project_window_raise_through_the_api(world, api, ceiling, job):
    start = timezone.now()
    response = create(
        api,
        world.member,
        project=world.project.pk,
        to_class="high",
        reason="release push",
        window_start=start.isoformat(),
        window_end=(start + timedelta(hours=8)).isoformat(),
    )
    assert response.status_code == 201, response.json()
    assert response.json()["scope"] == "project"
    assert response.json()["project_slug"] == "llm"

    response = step(api, world.tenant_admin, PriorityRaise.objects.get(), "approve")

    assert response.status_code == 200, response.json()
    job.refresh_from_db()
    assert job.priority_class == world.high


# --- bad input: 400 with the field ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"to_class": "nope"}, "to_class"),
        ({"to_class": "low"}, "to_class"),
        ({"to_class": "normal"}, "to_class"),
        ({"reason": ""}, "reason"),
        ({"reason": None}, "reason"),
        ({"hours": 0}, "hours"),
        ({"hours": -1}, "hours"),
        ({"hours": "many"}, "hours"),
        ({"job": None}, "job"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(world, api, job, body, field):
    payload = {"job": job.pk, "to_class": "high", "reason": "demo", **body}
    payload = {k: v for k, v in payload.items() if not (k == "reason" and v is None)}

    response = create(api, world.member, **payload)

    assert response.status_code == 400, response.json()
    assert field in response.json()["errors"], response.json()
    assert response.json()["detail"]
    assert not PriorityRaise.objects.exists()


def test_window_end_before_start_is_a_400(world, api):
    start = timezone.now() + timedelta(hours=2)
    response = create(
        api,
        world.member,
        project=world.project.pk,
        to_class="high",
        reason="push",
        window_start=start.isoformat(),
        window_end=(start - timedelta(hours=1)).isoformat(),
    )

    assert response.status_code == 400
    assert "window_end" in response.json()["errors"]


# --- who may act: 403 and 404 ---------------------------------------------------------------


def test_viewer_requesting_is_a_403(world, api, job):
    response = create(api, world.viewer, job=job.pk, to_class="high", reason="please")

    assert response.status_code == 403
    assert "Viewers" in response.json()["detail"]


def test_outsider_requesting_for_another_tenants_job_or_project_is_a_404(world, api, job):
    assert create(api, world.outsider, job=job.pk, to_class="high", reason="x").status_code == 404
    response = create(
        api,
        world.outsider,
        project=world.project.pk,
        to_class="high",
        reason="x",
        window_end=(timezone.now() + timedelta(hours=1)).isoformat(),
    )
    assert response.status_code == 404


def test_self_approval_is_a_403_with_a_clear_message(world, api, ceiling):
    own = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.tenant_admin)
    raise_ = ask(world, own, user=world.tenant_admin)

    response = step(api, world.tenant_admin, raise_, "approve")

    assert response.status_code == 403
    assert response.json()["detail"] == (
        "You cannot approve or reject your own raise request; another approver must."
    )
    assert PriorityRaise.objects.get(pk=raise_.pk).state == RaiseState.PENDING


def test_tenant_admin_above_the_ceiling_is_a_403_and_platform_admin_approves(
    world, api, ceiling, urgent, job
):
    raise_ = ask(world, job, urgent)

    response = step(api, world.tenant_admin, raise_, "approve")
    assert response.status_code == 403
    assert "a platform admin must decide" in response.json()["detail"]

    assert step(api, world.platform_admin, raise_, "approve").status_code == 200
    job.refresh_from_db()
    assert job.priority_class == urgent


@pytest.mark.parametrize("name", ["approve", "reject", "revoke", "cancel"])
def test_viewer_steps_are_403_and_outsider_steps_are_404(world, api, ceiling, job, name):
    raise_ = ask(world, job)
    if name == "revoke":
        raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)

    assert step(api, world.viewer, raise_, name).status_code == 403
    assert step(api, world.outsider, raise_, name).status_code == 404
    assert api(world.outsider).get(f"{URL}/{raise_.pk}").status_code == 404
    assert api(world.outsider).get(f"{URL}/{raise_.pk}/impact").status_code == 404


def test_reject_revoke_and_cancel_through_the_api(world, api, ceiling, job):
    first = ask(world, job)
    assert step(api, world.member, first, "cancel").json()["state"] == "cancelled"
    second = ask(world, job)
    response = step(api, world.tenant_admin, second, "reject", "no")
    assert (response.json()["state"], response.json()["comment"]) == ("rejected", "no")
    third = ask(world, job)
    step(api, world.tenant_admin, third, "approve")

    response = step(api, world.platform_admin, third, "revoke", "freed up")

    assert response.json()["state"] == "revoked"
    assert response.json()["ended_by"] == "root"
    job.refresh_from_db()
    assert job.priority_class == world.normal
    assert (
        step(api, world.platform_admin, third, "revoke").status_code == 400
    )  # not active any more


# --- lists are scoped ------------------------------------------------------------------------


def test_lists_are_scoped_to_requester_tenant_admins_and_platform_admins(world, api, ceiling, job):
    colleague = f.UserFactory(username="nlp-colleague")
    f.MembershipFactory(user=colleague, tenant=world.tenant, role="member")
    mine = ask(world, job)
    theirs_job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=colleague)
    theirs = ask(world, theirs_job, user=colleague)
    vision_job = f.JobFactory(
        queue=world.other_queue, project=world.other_project, submitted_by=world.outsider
    )
    vision = ask(world, vision_job, user=world.outsider)

    def ids(user, **params):
        response = api(user).get(URL, params)
        assert response.status_code == 200
        return sorted(r["id"] for r in response.json()["results"])

    assert ids(world.member) == [mine.pk]
    assert ids(colleague) == [theirs.pk]
    assert ids(world.viewer) == []
    assert ids(world.tenant_admin) == sorted([mine.pk, theirs.pk])
    assert ids(world.outsider) == [vision.pk]
    assert ids(world.platform_admin) == sorted([mine.pk, theirs.pk, vision.pk])
    assert ids(world.platform_admin, tenant="vision") == [vision.pk]
    assert ids(world.platform_admin, requested_by="nlp-colleague") == [theirs.pk]
    assert ids(world.tenant_admin, decidable="true") == sorted([mine.pk, theirs.pk])
    assert ids(world.outsider, decidable="true") == []  # vision has no ceiling
    # A raise of one's own tenant can be fetched by id; another tenant's cannot.
    assert api(colleague).get(f"{URL}/{mine.pk}").status_code == 200
    assert api(world.member).get(f"{URL}/{vision.pk}").status_code == 404


def test_list_query_count_does_not_grow_with_rows(world, api, ceiling):
    def count():
        with CaptureQueriesContext(connection) as ctx:
            assert api(world.tenant_admin).get(URL).status_code == 200
        return len(ctx.captured_queries)

    ask(world, f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member))
    few = count()
    for _ in range(5):
        ask(
            world, f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
        )

    assert count() == few


def test_impact_endpoint_answers_for_a_pending_raise(world, api, ceiling, job):
    raise_ = ask(world, job)

    response = api(world.tenant_admin).get(f"{URL}/{raise_.pk}/impact")

    assert response.status_code == 200, response.json()
    [row] = response.json()["jobs"]
    assert row["job_id"] == job.pk
    assert row["queue_position_now"] is None or row["queue_position_now"] >= 1


# --- the ceiling -----------------------------------------------------------------------------


def test_raise_ceiling_api(world, api, urgent):
    url = "/api/v1/tenants/nlp/raise-ceiling"
    assert api(world.member).get(url).json() == {"tenant": "nlp", "ceiling": None}
    assert api(world.outsider).get(url).status_code == 404
    assert api(world.tenant_admin).put(url, {"ceiling": "high"}, format="json").status_code == 403
    response = api(world.platform_admin).put(url, {"ceiling": "nope"}, format="json")
    assert response.status_code == 400
    assert "ceiling" in response.json()["errors"]

    response = api(world.platform_admin).put(url, {"ceiling": "high"}, format="json")

    assert response.status_code == 200
    assert response.json() == {"tenant": "nlp", "ceiling": "high"}
    assert api(world.member).get(url).json()["ceiling"] == "high"
    audit = AuditEvent.objects.get(action="tenant.raise_ceiling")
    assert (audit.before, audit.after, audit.actor) == (
        {"ceiling": None},
        {"ceiling": "high"},
        world.platform_admin,
    )
    cleared = api(world.platform_admin).patch(url, {"ceiling": None}, format="json")
    assert cleared.json()["ceiling"] is None


# --- notifications ---------------------------------------------------------------------------


def test_notifications_list_read_and_read_all(world, api, ceiling, job):
    raise_ = ask(world, job)
    raises.priority_raise_reject(raise_=raise_, user=world.tenant_admin)
    raises.priority_raise_approve(raise_=ask(world, job), user=world.tenant_admin)
    mine = list(Notification.objects.filter(user=world.member).order_by("id"))
    admin_note = Notification.objects.filter(user=world.tenant_admin).first()

    listed = api(world.member).get("/api/v1/notifications").json()
    assert [n["id"] for n in listed["results"]] == [n.pk for n in reversed(mine)]
    assert api(world.member).post(f"/api/v1/notifications/{admin_note.pk}/read").status_code == 404

    response = api(world.member).post(f"/api/v1/notifications/{mine[0].pk}/read")

    assert response.status_code == 200
    assert response.json()["read_at"] is not None
    unread = api(world.member).get("/api/v1/notifications", {"read_at__isnull": "true"}).json()
    assert [n["id"] for n in unread["results"]] == [mine[1].pk]
    assert api(world.member).post("/api/v1/notifications/read-all").json() == {"marked_read": 1}
    assert not Notification.objects.filter(user=world.member, read_at__isnull=True).exists()
    assert Notification.objects.filter(user=world.tenant_admin, read_at__isnull=True).exists()


def test_job_events_record_each_step(world, api, ceiling, job):
    raise_ = ask(world, job)
    raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)
    raises.priority_raise_revoke(raise_=raise_, user=world.tenant_admin)

    kinds = list(JobEvent.objects.filter(job=job).values_list("kind", flat=True))

    assert kinds == ["raise_requested", "raise_approved", "raise_revoked"]
