"""/api/v1/tenants/{slug}/members: tenant admins add, change and remove members, audited."""

import pytest

from audit.models import AuditEvent
from tenants.choices import Role
from tenants.models import Membership
from tests import factories as f

URL = "/api/v1/tenants/nlp/members"


@pytest.fixture
def newcomer(world):
    return f.UserFactory(username="newcomer")


def test_members_list(world, api):
    response = api(world.viewer).get(URL)

    assert response.status_code == 200
    rows = {m["username"]: m["role"] for m in response.json()["results"]}
    assert rows == {"nlp-admin": "admin", "nlp-member": "member", "nlp-viewer": "viewer"}


def test_members_filter_by_role(world, api):
    response = api(world.member).get(URL, {"role": "admin"})

    assert [m["username"] for m in response.json()["results"]] == ["nlp-admin"]


def test_member_detail(world, api):
    response = api(world.member).get(f"{URL}/nlp-viewer")

    assert response.status_code == 200
    assert response.json()["role"] == "viewer"
    assert api(world.member).get(f"{URL}/vision-member").status_code == 404


def test_tenant_admin_adds_a_member(world, api, newcomer):
    response = api(world.tenant_admin).post(
        URL, {"username": "newcomer", "role": "member"}, format="json"
    )

    assert response.status_code == 201, response.json()
    membership = Membership.objects.get(tenant=world.tenant, user=newcomer)
    assert membership.role == Role.MEMBER
    event = AuditEvent.objects.get()
    assert event.action == "membership.add"
    assert event.actor == world.tenant_admin
    assert event.tenant == world.tenant
    assert event.before is None
    assert event.after == {"user": "newcomer", "role": "member"}
    assert api(newcomer).get("/api/v1/tenants/nlp").status_code == 200


def test_platform_admin_adds_a_member_to_any_tenant(world, api, newcomer):
    response = api(world.platform_admin).post(
        URL, {"username": "newcomer", "role": "admin"}, format="json"
    )

    assert response.status_code == 201
    assert Membership.objects.get(user=newcomer).role == Role.ADMIN


@pytest.mark.parametrize(("who", "status"), [("member", 403), ("viewer", 403), ("outsider", 404)])
def test_non_admins_cannot_add_members(world, api, newcomer, who, status):
    response = api(getattr(world, who)).post(
        URL, {"username": "newcomer", "role": "member"}, format="json"
    )

    assert response.status_code == status
    assert not Membership.objects.filter(user=newcomer).exists()
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"username": "newcomer"}, "role"),
        ({"role": "member"}, "username"),
        ({"username": "newcomer", "role": "boss"}, "role"),
        ({"username": "newcomer", "role": ""}, "role"),
        ({"username": "nobody-by-that-name", "role": "member"}, "username"),
        ({"username": "bad name!", "role": "member"}, "username"),
        ({"username": "u" * 151, "role": "member"}, "username"),
        ({"username": ["newcomer"], "role": "member"}, "username"),
        ({"username": "newcomer", "role": 3}, "role"),
        ({"username": "nlp-member", "role": "viewer"}, "username"),  # already a member
    ],
)
def test_bad_member_input_is_a_400_and_stores_nothing(world, api, newcomer, body, field):
    before = Membership.objects.count()

    response = api(world.tenant_admin).post(URL, body, format="json")

    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert Membership.objects.count() == before
    assert not AuditEvent.objects.exists()


def test_deactivated_user_cannot_be_added(world, api, newcomer):
    newcomer.is_active = False
    newcomer.save()

    response = api(world.tenant_admin).post(
        URL, {"username": "newcomer", "role": "member"}, format="json"
    )

    assert response.status_code == 400
    assert not Membership.objects.filter(user=newcomer).exists()


def test_tenant_admin_changes_a_role(world, api):
    response = api(world.tenant_admin).patch(f"{URL}/nlp-viewer", {"role": "member"}, format="json")

    assert response.status_code == 200
    assert Membership.objects.get(user=world.viewer).role == Role.MEMBER
    event = AuditEvent.objects.get()
    assert event.action == "membership.change_role"
    assert event.before == {"user": "nlp-viewer", "role": "viewer"}
    assert event.after == {"user": "nlp-viewer", "role": "member"}


def test_role_change_takes_effect_on_the_next_request(world, api):
    viewer = api(world.viewer)
    body = {"slug": "speech", "name": "Speech"}
    assert (
        viewer.post("/api/v1/projects", {**body, "tenant": "nlp"}, format="json").status_code == 403
    )

    api(world.tenant_admin).patch(f"{URL}/nlp-viewer", {"role": "admin"}, format="json")

    assert (
        viewer.post("/api/v1/projects", {**body, "tenant": "nlp"}, format="json").status_code == 201
    )


def test_unknown_role_in_a_change_is_a_400(world, api):
    response = api(world.tenant_admin).patch(f"{URL}/nlp-viewer", {"role": "owner"}, format="json")

    assert response.status_code == 400
    assert "role" in response.json()["errors"]
    assert Membership.objects.get(user=world.viewer).role == Role.VIEWER
    assert not AuditEvent.objects.exists()


def test_tenant_admin_removes_a_member(world, api):
    response = api(world.tenant_admin).delete(f"{URL}/nlp-member")

    assert response.status_code == 204
    assert not Membership.objects.filter(user=world.member).exists()
    event = AuditEvent.objects.get()
    assert event.action == "membership.remove"
    assert event.before == {"user": "nlp-member", "role": "member"}
    assert event.after is None
    assert api(world.member).get("/api/v1/tenants/nlp").status_code == 404


def test_last_admin_cannot_be_demoted(world, api):
    response = api(world.tenant_admin).patch(f"{URL}/nlp-admin", {"role": "member"}, format="json")

    assert response.status_code == 400
    assert "at least one admin" in response.json()["detail"]
    assert Membership.objects.get(user=world.tenant_admin).role == Role.ADMIN
    assert not AuditEvent.objects.exists()


def test_last_admin_cannot_be_removed(world, api):
    response = api(world.platform_admin).delete(f"{URL}/nlp-admin")

    assert response.status_code == 400
    assert Membership.objects.filter(user=world.tenant_admin, role=Role.ADMIN).exists()
    assert not AuditEvent.objects.exists()


def test_an_admin_may_step_down_when_another_admin_remains(world, api):
    api(world.tenant_admin).patch(f"{URL}/nlp-member", {"role": "admin"}, format="json")

    response = api(world.tenant_admin).patch(f"{URL}/nlp-admin", {"role": "viewer"}, format="json")

    assert response.status_code == 200
    assert Membership.objects.get(user=world.tenant_admin).role == Role.VIEWER
    assert AuditEvent.objects.filter(action="membership.change_role").count() == 2


@pytest.mark.parametrize(("who", "status"), [("member", 403), ("viewer", 403), ("outsider", 404)])
def test_non_admins_cannot_change_or_remove(world, api, who, status):
    client = api(getattr(world, who))

    assert client.patch(f"{URL}/nlp-viewer", {"role": "admin"}, format="json").status_code == status
    assert client.delete(f"{URL}/nlp-viewer").status_code == status
    assert Membership.objects.get(user=world.viewer).role == Role.VIEWER
    assert not AuditEvent.objects.exists()


def test_unknown_tenant_is_404(world, api):
    assert api(world.platform_admin).get("/api/v1/tenants/nope/members").status_code == 404
