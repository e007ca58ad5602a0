"""DELETE /api/v1/auth/token: a token revokes itself (a logout) without looking up its id."""

import pytest
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from accounts.models import ApiToken
from audit.models import AuditEvent
from tests.factories import PASSWORD


def test_the_token_made_by_sign_in_ends_itself_the_same_simple_way(world, token_client):
    made = APIClient().post(
        "/api/v1/auth/token", {"username": "nlp-member", "password": PASSWORD}, format="json"
    )
    key = made.json()["token"]
    client = token_client(key)

    response = client.delete("/api/v1/auth/token")

    assert response.status_code == 204
    assert response.content == b""
    assert not ApiToken.objects.filter(pk=made.json()["id"]).exists()
    assert client.get("/api/v1/jobs").status_code == 401
    # A second logout with the same key: the key no longer authenticates.
    assert client.delete("/api/v1/auth/token").status_code == 401


def test_only_the_presented_token_is_revoked(world, api_token, token_client):
    kept, kept_key = api_token(world.member, name="laptop")
    ended, ended_key = api_token(world.member, name="ci")

    assert token_client(ended_key).delete("/api/v1/auth/token").status_code == 204

    assert list(ApiToken.objects.values_list("pk", flat=True)) == [kept.pk]
    assert token_client(kept_key).get("/api/v1/jobs").status_code == 200


@pytest.mark.parametrize("role", ["platform_admin", "tenant_admin", "member", "viewer", "outsider"])
def test_every_role_may_end_its_own_token(world, api_token, token_client, role):
    """Viewers may not write to tenants, but their own token is theirs to end."""
    user = getattr(world, role)
    token, key = api_token(user)

    assert token_client(key).delete("/api/v1/auth/token").status_code == 204
    assert not ApiToken.objects.filter(pk=token.pk).exists()


def test_the_logout_is_audited_like_other_revocations(world, api_token, token_client):
    token, key = api_token(world.member, name="ci")

    token_client(key).delete("/api/v1/auth/token")

    event = AuditEvent.objects.get(action="token.revoke")
    assert event.actor == world.member
    assert event.target_id == str(token.pk)
    assert event.before["prefix"] == token.prefix
    assert event.reason == "logout"
    assert key not in str(event.before) and key not in event.target_label


def test_without_credentials_it_is_401(world):
    response = APIClient().delete("/api/v1/auth/token")

    assert response.status_code == 401
    assert response.json()["detail"]
    assert response.json()["errors"] == {}


def test_an_unknown_token_is_401_and_revokes_nothing(world, api_token, token_client):
    api_token(world.member)

    assert token_client("0" * 64).delete("/api/v1/auth/token").status_code == 401
    assert ApiToken.objects.count() == 1


def test_a_session_caller_is_told_to_revoke_by_id(world, api_token):
    token, _ = api_token(world.member)
    client = APIClient()
    client.force_login(world.member)

    response = client.delete("/api/v1/auth/token")

    assert response.status_code == 400
    assert "/api/v1/auth/tokens/{id}" in response.json()["detail"]
    assert ApiToken.objects.filter(pk=token.pk).exists()


def test_signing_in_still_needs_no_credentials(world):
    response = APIClient().post(
        "/api/v1/auth/token", {"username": "nlp-viewer", "password": PASSWORD}, format="json"
    )

    assert response.status_code == 200


def test_the_schema_documents_the_logout():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    operations = schema["paths"]["/api/v1/auth/token"]

    logout = operations["delete"]
    assert "204" in logout["responses"]
    assert {"400", "401"} <= set(logout["responses"])
    assert logout.get("security"), "the logout needs a token"
    assert "revoke" in logout["description"].lower()
    # Signing in stays anonymous, with its lockout answer.
    assert not operations["post"].get("security")
    assert "429" in operations["post"]["responses"]
