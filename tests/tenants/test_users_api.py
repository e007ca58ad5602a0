"""/api/v1/users: platform admins create, change and deactivate users; others only read."""

import pytest
from django.contrib.auth import get_user_model

from accounts.models import ApiToken
from audit.models import AuditEvent

User = get_user_model()

GOOD = {"username": "new.user", "password": "a-long-enough-passphrase-42", "email": "n@example.com"}


def test_platform_admin_creates_a_user(world, api):
    response = api(world.platform_admin).post("/api/v1/users", GOOD, format="json")

    assert response.status_code == 201, response.json()
    user = User.objects.get(username="new.user")
    assert user.check_password(GOOD["password"])
    assert user.email == "n@example.com"
    assert "password" not in response.json()
    event = AuditEvent.objects.get(action="user.create")
    assert event.actor == world.platform_admin
    assert event.target_id == str(user.pk)
    assert event.after["username"] == "new.user"
    assert "password" not in event.after


@pytest.mark.parametrize("who", ["tenant_admin", "member", "viewer", "outsider"])
def test_only_platform_admins_create_users(world, api, who):
    before = User.objects.count()

    response = api(getattr(world, who)).post("/api/v1/users", GOOD, format="json")

    assert response.status_code == 403
    assert User.objects.count() == before
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"password": GOOD["password"]}, "username"),
        ({"username": "x"}, "password"),
        ({**GOOD, "username": "bad user!"}, "username"),
        ({**GOOD, "username": "u" * 151}, "username"),
        ({**GOOD, "username": ["list"]}, "username"),
        ({**GOOD, "username": "nlp-member"}, "username"),  # taken
        ({**GOOD, "username": "NLP-MEMBER"}, "username"),  # taken, other case
        ({**GOOD, "password": "short"}, "password"),
        ({**GOOD, "password": "new.user"}, "password"),
        ({**GOOD, "email": "not-an-email"}, "email"),
        ({**GOOD, "first_name": "x" * 151}, "first_name"),
        ({**GOOD, "is_staff": "perhaps"}, "is_staff"),
    ],
)
def test_bad_user_input_is_a_400_naming_the_field(world, api, body, field):
    before = User.objects.count()

    response = api(world.platform_admin).post("/api/v1/users", body, format="json")

    assert response.status_code == 400, response.json()
    assert field in response.json()["errors"]
    assert response.json()["detail"]
    assert User.objects.count() == before
    assert not AuditEvent.objects.exists()


def test_non_object_body_is_a_400(world, api):
    response = api(world.platform_admin).post("/api/v1/users", ["x"], format="json")

    assert response.status_code == 400


def test_users_list_is_scoped_to_the_callers_tenants(world, api):
    names = lambda user: {u["username"] for u in api(user).get("/api/v1/users").json()["results"]}  # noqa: E731

    assert names(world.member) == {"nlp-admin", "nlp-member", "nlp-viewer"}
    assert names(world.outsider) == {"vision-member"}
    assert "vision-member" in names(world.platform_admin)
    assert "root" in names(world.platform_admin)


def test_outsider_gets_404_on_a_user_of_another_tenant(world, api):
    assert api(world.outsider).get(f"/api/v1/users/{world.member.pk}").status_code == 404
    assert api(world.viewer).get(f"/api/v1/users/{world.member.pk}").status_code == 200


def test_platform_admin_changes_a_user_with_an_audit_row(world, api):
    response = api(world.platform_admin).patch(
        f"/api/v1/users/{world.member.pk}", {"first_name": "Ada"}, format="json"
    )

    assert response.status_code == 200
    world.member.refresh_from_db()
    assert world.member.first_name == "Ada"
    event = AuditEvent.objects.get(action="user.update")
    assert event.before["first_name"] == ""
    assert event.after["first_name"] == "Ada"


def test_tenant_admin_cannot_change_users(world, api):
    response = api(world.tenant_admin).patch(
        f"/api/v1/users/{world.member.pk}", {"is_staff": True}, format="json"
    )

    assert response.status_code == 403
    world.member.refresh_from_db()
    assert world.member.is_staff is False


def test_deactivate_through_the_api_revokes_tokens_and_is_audited(world, api, api_token):
    token, _ = api_token(world.member)

    response = api(world.platform_admin).post(f"/api/v1/users/{world.member.pk}/deactivate")

    assert response.status_code == 200
    assert response.json()["is_active"] is False
    world.member.refresh_from_db()
    assert world.member.is_active is False
    assert not ApiToken.objects.filter(user=world.member).exists()
    assert AuditEvent.objects.get(action="token.revoke").target_id == str(token.pk)
    event = AuditEvent.objects.get(action="user.deactivate")
    assert event.before["is_active"] is True
    assert event.after["is_active"] is False


def test_platform_admin_cannot_deactivate_themselves(world, api):
    response = api(world.platform_admin).post(f"/api/v1/users/{world.platform_admin.pk}/deactivate")

    assert response.status_code == 400
    world.platform_admin.refresh_from_db()
    assert world.platform_admin.is_active is True


@pytest.mark.parametrize("who", ["tenant_admin", "member", "viewer"])
def test_only_platform_admins_deactivate(world, api, who):
    response = api(getattr(world, who)).post(f"/api/v1/users/{world.member.pk}/deactivate")

    assert response.status_code == 403
    world.member.refresh_from_db()
    assert world.member.is_active is True
