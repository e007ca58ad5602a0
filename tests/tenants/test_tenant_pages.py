"""The tenant page: members table, adding a member, changing roles, creating projects."""

import pytest

from audit.models import AuditEvent
from tenants.choices import Role
from tenants.models import Membership, Project
from tests import factories as f


@pytest.fixture
def admin_client(world, client):
    client.force_login(world.tenant_admin)
    return client


def test_tenant_page_shows_members_and_projects(world, admin_client):
    response = admin_client.get("/tenants/nlp/")

    body = response.content.decode()
    assert 'data-member="nlp-viewer"' in body
    assert f"/projects/{world.project.pk}/" in body
    assert 'id="add-member"' in body
    assert "Your role: <strong>admin</strong>" in body


def test_non_admins_see_no_member_forms(world, client):
    client.force_login(world.member)

    body = client.get("/tenants/nlp/").content.decode()

    assert 'id="add-member"' not in body
    assert "/remove" not in body
    assert 'data-member="nlp-admin"' in body


def test_admin_adds_a_member(world, admin_client):
    f.UserFactory(username="newcomer")

    response = admin_client.post(
        "/tenants/nlp/", {"add-username": "newcomer", "add-role": "viewer"}, follow=True
    )

    assert response.redirect_chain == [("/tenants/nlp/", 302)]
    assert Membership.objects.get(user__username="newcomer").role == Role.VIEWER
    assert AuditEvent.objects.get().action == "membership.add"
    body = response.content.decode()
    assert 'data-member="newcomer"' in body
    assert "newcomer added as viewer." in body


def test_unknown_user_is_a_form_error(world, admin_client):
    before = Membership.objects.count()

    response = admin_client.post("/tenants/nlp/", {"add-username": "ghost", "add-role": "member"})

    assert response.status_code == 200
    assert response.context["add_form"].errors["username"] == ["No user with this username."]
    assert "No user with this username." in response.content.decode()
    assert Membership.objects.count() == before
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"add-username": "nlp-member", "add-role": "member"}, "username"),  # already a member
        ({"add-username": "newcomer", "add-role": "owner"}, "role"),
        ({"add-username": "", "add-role": "member"}, "username"),
    ],
)
def test_bad_member_form_input_shows_errors(world, admin_client, data, field):
    f.UserFactory(username="newcomer")

    response = admin_client.post("/tenants/nlp/", data)

    assert response.status_code == 200
    assert field in response.context["add_form"].errors
    assert not AuditEvent.objects.exists()


def test_member_cannot_add_through_the_page(world, client):
    f.UserFactory(username="newcomer")
    client.force_login(world.member)

    response = client.post("/tenants/nlp/", {"add-username": "newcomer", "add-role": "admin"})

    assert response.status_code == 200
    assert not Membership.objects.filter(user__username="newcomer").exists()


def test_admin_changes_a_role(world, admin_client):
    response = admin_client.post("/tenants/nlp/members/nlp-viewer/role", {"role": "member"})

    assert response.status_code == 302
    assert Membership.objects.get(user=world.viewer).role == Role.MEMBER
    assert AuditEvent.objects.get().action == "membership.change_role"


def test_demoting_the_last_admin_shows_an_error(world, admin_client):
    response = admin_client.post(
        "/tenants/nlp/members/nlp-admin/role", {"role": "viewer"}, follow=True
    )

    assert "at least one admin" in response.content.decode()
    assert Membership.objects.get(user=world.tenant_admin).role == Role.ADMIN


def test_admin_removes_a_member(world, admin_client):
    response = admin_client.post("/tenants/nlp/members/nlp-member/remove", follow=True)

    assert "nlp-member removed from nlp." in response.content.decode()
    assert not Membership.objects.filter(user=world.member, tenant=world.tenant).exists()


def test_member_cannot_change_roles_or_remove(world, client):
    client.force_login(world.member)

    client.post("/tenants/nlp/members/nlp-viewer/role", {"role": "admin"})
    client.post("/tenants/nlp/members/nlp-viewer/remove")

    assert Membership.objects.get(user=world.viewer).role == Role.VIEWER
    assert not AuditEvent.objects.exists()


def test_outsider_gets_404_on_member_actions(world, client):
    client.force_login(world.outsider)

    assert client.post("/tenants/nlp/members/nlp-viewer/role", {"role": "admin"}).status_code == 404
    assert client.post("/tenants/nlp/members/nlp-viewer/remove").status_code == 404
    assert client.post("/tenants/nlp/projects/new", {"project-slug": "x"}).status_code == 404


def test_member_actions_need_post(world, admin_client):
    assert admin_client.get("/tenants/nlp/members/nlp-viewer/remove").status_code == 405


def test_admin_creates_a_project(world, admin_client):
    response = admin_client.post(
        "/tenants/nlp/projects/new",
        {"project-slug": "asr", "project-name": "Speech", "project-restricted": "on"},
    )

    project = Project.objects.get(tenant=world.tenant, slug="asr")
    assert response.status_code == 302
    assert response["Location"] == f"/projects/{project.pk}/"
    assert project.restricted is True


def test_duplicate_project_slug_is_shown_as_an_error(world, admin_client):
    response = admin_client.post(
        "/tenants/nlp/projects/new", {"project-slug": "llm", "project-name": "Again"}, follow=True
    )

    assert "already has a project with this slug" in response.content.decode()
    assert Project.objects.filter(tenant=world.tenant, slug="llm").count() == 1


def test_member_cannot_create_projects(world, client):
    client.force_login(world.member)

    response = client.post(
        "/tenants/nlp/projects/new", {"project-slug": "asr", "project-name": "Speech"}, follow=True
    )

    assert "Only admins of tenant nlp" in response.content.decode()
    assert not Project.objects.filter(slug="asr").exists()


def test_project_page_says_whether_the_user_may_submit(world, client):
    world.project.restricted = True
    world.project.save()
    client.force_login(world.member)

    assert (
        "you may not submit jobs here"
        in client.get(f"/projects/{world.project.pk}/").content.decode()
    )

    client.force_login(world.tenant_admin)
    assert (
        "you may submit jobs here" in client.get(f"/projects/{world.project.pk}/").content.decode()
    )
