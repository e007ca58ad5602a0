"""Robot accounts: a tenant admin makes a service account with a member or viewer role in
one tenant and its own expiring tokens; it submits jobs with its token within its role, it
never signs in to the pages, and only the tenant's admins (or platform admins) manage it."""

from datetime import timedelta

import pytest
from django.utils import timezone
from freezegun import freeze_time

from accounts import robots
from accounts.models import ApiToken, RobotAccount
from audit.models import AuditEvent
from portal.errors import BusinessError, PermissionDeniedError
from tenants.models import Membership

URL = "/api/v1/tenants/nlp/robots"
JOB = {"workload_type": "training", "command": ["python", "train.py"]}


def _make(world, name="ci", role="member"):
    return robots.robot_create(actor=world.tenant_admin, tenant=world.tenant, name=name, role=role)


def test_tenant_admin_makes_a_robot_and_a_token_over_the_api(world, api):
    client = api(world.tenant_admin)

    made = client.post(URL, {"name": "ci", "role": "member", "description": "GitLab"}, "json")
    token = client.post(f"{URL}/ci/tokens", {"name": "gitlab", "expires_in_days": 7}, "json")

    assert made.status_code == 201, made.content
    assert made.json()["username"] == "robot.nlp.ci"
    assert made.json()["role"] == "member"
    assert token.status_code == 201, token.content
    assert len(token.json()["token"]) == 64
    robot = RobotAccount.objects.get(name="ci")
    assert not robot.user.has_usable_password()
    assert Membership.objects.get(user=robot.user, tenant=world.tenant).role == "member"
    listed = client.get(f"{URL}/ci/tokens").json()["results"]
    assert [t["name"] for t in listed] == ["gitlab"]
    assert "token" not in listed[0]
    actions = list(AuditEvent.objects.filter(tenant=world.tenant).values_list("action", flat=True))
    assert robots.ACTION_ROBOT_CREATE in actions
    assert robots.ACTION_ROBOT_TOKEN_CREATE in actions


def test_robot_submits_jobs_with_its_token_within_its_role(world, token_client, dispatch_requests):
    member_robot = _make(world, "ci", "member")
    viewer_robot = _make(world, "dash", "viewer")
    _, member_key = robots.robot_token_create(
        actor=world.tenant_admin, robot=member_robot, name="ci"
    )
    _, viewer_key = robots.robot_token_create(
        actor=world.tenant_admin, robot=viewer_robot, name="dash"
    )
    body = {**JOB, "project": world.project.pk, "queue": world.queue.pk}
    other = {**JOB, "project": world.other_project.pk, "queue": world.other_queue.pk}

    submitted = token_client(member_key).post("/api/v1/jobs", body, format="json")
    refused = token_client(viewer_key).post("/api/v1/jobs", body, format="json")
    elsewhere = token_client(member_key).post("/api/v1/jobs", other, format="json")
    read = token_client(viewer_key).get("/api/v1/jobs")

    assert submitted.status_code == 201, submitted.content
    assert submitted.json()["submitted_by"] == "robot.nlp.ci"
    assert refused.status_code == 403
    assert elsewhere.status_code in (400, 404)
    assert read.status_code == 200
    assert [j["id"] for j in read.json()["results"]] == [submitted.json()["id"]]


def test_robot_cannot_manage_robots_or_mint_tokens(world, token_client):
    robot = _make(world)
    _, key = robots.robot_token_create(actor=world.tenant_admin, robot=robot, name="ci")
    client = token_client(key)

    assert client.post(URL, {"name": "x", "role": "member"}, format="json").status_code == 403
    assert client.post("/api/v1/auth/tokens", {"name": "more"}, format="json").status_code == 403


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_robot_cannot_sign_in_to_the_pages_even_with_a_password(world, client, path):
    robot = _make(world)
    robot.user.set_password("a-long-enough-passphrase-42")
    robot.user.save()

    response = client.post(
        path, {"username": "robot.nlp.ci", "password": "a-long-enough-passphrase-42"}
    )

    assert response.status_code == 200  # the form again, with its error
    assert "_auth_user_id" not in client.session


def test_robot_cannot_get_a_token_with_a_password(world, api):
    robot = _make(world)
    robot.user.set_password("a-long-enough-passphrase-42")
    robot.user.save()

    response = api().post(
        "/api/v1/auth/token",
        {"username": "robot.nlp.ci", "password": "a-long-enough-passphrase-42"},
        format="json",
    )

    assert response.status_code == 400
    assert not ApiToken.objects.filter(user=robot.user).exists()


def test_people_still_sign_in(world, client):
    world.member.set_password("a-long-enough-passphrase-42")
    world.member.save()

    client.post("/login/", {"username": "nlp-member", "password": "a-long-enough-passphrase-42"})

    assert client.session["_auth_user_id"] == str(world.member.pk)


def test_revoked_token_is_refused_at_once(world, api, token_client):
    robot = _make(world)
    token, key = robots.robot_token_create(actor=world.tenant_admin, robot=robot, name="ci")
    assert token_client(key).get("/api/v1/jobs").status_code == 200

    response = api(world.tenant_admin).delete(f"{URL}/ci/tokens/{token.pk}")

    assert response.status_code == 204
    assert token_client(key).get("/api/v1/jobs").status_code == 401
    assert AuditEvent.objects.filter(action=robots.ACTION_ROBOT_TOKEN_REVOKE).count() == 1


def test_deleted_robot_loses_tokens_and_role(world, api, token_client):
    robot = _make(world)
    _, key = robots.robot_token_create(actor=world.tenant_admin, robot=robot, name="ci")

    response = api(world.tenant_admin).delete(f"{URL}/ci")

    assert response.status_code == 204
    robot.user.refresh_from_db()
    assert not robot.user.is_active
    assert not Membership.objects.filter(user=robot.user).exists()
    assert token_client(key).get("/api/v1/jobs").status_code == 401
    assert api(world.tenant_admin).get(URL).json()["results"] == []
    again = api(world.tenant_admin).post(URL, {"name": "ci", "role": "member"}, format="json")
    assert again.status_code == 400
    assert "name" in again.json()["errors"]


def test_token_expires(world, token_client):
    robot = _make(world)
    _, key = robots.robot_token_create(
        actor=world.tenant_admin, robot=robot, name="ci", expires_in_days=1
    )

    with freeze_time(timezone.now() + timedelta(days=2)):
        assert token_client(key).get("/api/v1/jobs").status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "ci", "role": "admin"}, "role"),
        ({"name": "Not A Slug", "role": "member"}, "name"),
        ({"role": "member"}, "name"),
    ],
)
def test_bad_robot_input_is_a_400_naming_the_field(world, api, body, field):
    response = api(world.tenant_admin).post(URL, body, format="json")

    assert response.status_code == 400
    assert field in response.json()["errors"]


def test_robot_role_is_member_or_viewer_only(world):
    with pytest.raises(BusinessError):
        _make(world, role="admin")


@pytest.mark.parametrize("who", ["member", "viewer", "outsider"])
def test_only_tenant_admins_manage_robots(world, who):
    robot = _make(world)
    actor = getattr(world, who)
    with pytest.raises(PermissionDeniedError):
        robots.robot_create(actor=actor, tenant=world.tenant, name="x", role="member")
    with pytest.raises(PermissionDeniedError):
        robots.robot_token_create(actor=actor, robot=robot, name="t")
    with pytest.raises(PermissionDeniedError):
        robots.robot_delete(actor=actor, robot=robot)


def test_robots_page_lists_makes_and_shows_the_key_once(world, client):
    client.force_login(world.tenant_admin)

    made = client.post(
        "/tenants/nlp/robots/", {"action": "create", "name": "ci", "role": "member"}, follow=True
    )
    page = client.post(
        "/tenants/nlp/robots/ci/tokens",
        {"name": "gitlab", "expires_in_days": 30},
    )

    assert made.status_code == 200
    assert "robot.nlp.ci" in made.content.decode()
    token = ApiToken.objects.get(user__username="robot.nlp.ci")
    assert page.status_code == 200
    assert page["Cache-Control"] == "no-store"
    assert token.prefix in page.content.decode()


@pytest.mark.parametrize(("who", "status"), [("viewer", 403), ("outsider", 404)])
def test_robots_page_refuses_writes_of_non_admins(world, client, who, status):
    client.force_login(getattr(world, who))

    response = client.post(
        "/tenants/nlp/robots/", {"action": "create", "name": "ci", "role": "member"}
    )

    assert response.status_code == status
    assert not RobotAccount.objects.exists()


def test_tenant_page_links_to_its_robots(world, client):
    client.force_login(world.viewer)

    page = client.get("/tenants/nlp/")

    assert 'href="/tenants/nlp/robots/"' in page.content.decode()


def test_a_robot_membership_is_managed_on_the_robots_page_not_among_members(world, client, api):
    robot = _make(world, "ci", "member")
    membership = Membership.objects.get(user=robot.user, tenant=world.tenant)
    client.force_login(world.tenant_admin)

    page = client.get(f"/tenants/{world.tenant.slug}/")
    changed = api(world.tenant_admin).patch(
        f"/api/v1/tenants/{world.tenant.slug}/members/{robot.user.username}",
        {"role": "viewer"},
        "json",
    )
    removed = api(world.tenant_admin).delete(
        f"/api/v1/tenants/{world.tenant.slug}/members/{robot.user.username}"
    )

    row = page.content.decode().split(f'data-member="{robot.user.username}"')[1].split("</tr>")[0]
    assert ">robot</a>" in row and "<form" not in row
    assert changed.status_code == 400 and "Robot accounts page" in str(changed.json())
    assert removed.status_code == 400
    membership.refresh_from_db()
    assert membership.role == "member"
    with pytest.raises(BusinessError):
        from tenants import services as tenant_services

        tenant_services.membership_remove(actor=world.tenant_admin, membership=membership)
