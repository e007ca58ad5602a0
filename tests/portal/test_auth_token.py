"""POST /api/v1/auth/token and token/session authentication: who gets in, and deactivated
users never do. Tokens are stored hashed (accounts.ApiToken)."""

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken
from audit.models import AuditEvent
from tenants import services as tenant_services
from tests.factories import PASSWORD

# Every API route (list and detail forms); without credentials each answers 401.
ANONYMOUS_REQUESTS = [
    ("get", "/api/v1/users"),
    ("post", "/api/v1/users"),
    ("get", "/api/v1/users/1"),
    ("get", "/api/v1/tenants"),
    ("post", "/api/v1/tenants"),
    ("get", "/api/v1/tenants/nlp"),
    ("get", "/api/v1/tenants/nlp/members"),
    ("post", "/api/v1/tenants/nlp/members"),
    ("get", "/api/v1/tenants/nlp/members/nlp-member"),
    ("get", "/api/v1/projects"),
    ("post", "/api/v1/projects"),
    ("get", "/api/v1/pools"),
    ("post", "/api/v1/pools"),
    ("get", "/api/v1/nodes"),
    ("get", "/api/v1/gpus"),
    ("get", "/api/v1/quotas"),
    ("post", "/api/v1/quotas"),
    ("get", "/api/v1/queues"),
    ("post", "/api/v1/queues"),
    ("get", "/api/v1/priority-classes"),
    ("get", "/api/v1/workload-policies"),
    ("get", "/api/v1/jobs"),
    ("post", "/api/v1/jobs"),
    ("post", "/api/v1/jobs/bulk"),
    ("get", "/api/v1/jobs/1"),
    ("post", "/api/v1/jobs/1/cancel"),
    ("post", "/api/v1/jobs/1/hold"),
    ("post", "/api/v1/jobs/1/release"),
    ("get", "/api/v1/jobs/1/events"),
    ("get", "/api/v1/jobs/1/logs"),
    ("get", "/api/v1/auth/tokens"),
    ("post", "/api/v1/auth/tokens"),
    ("get", "/api/v1/auth/tokens/1"),
    ("delete", "/api/v1/auth/tokens/1"),
]


def _sign_in(username="nlp-member", password=PASSWORD, **extra):
    return APIClient().post(
        "/api/v1/auth/token", {"username": username, "password": password, **extra}, format="json"
    )


def test_token_for_username_and_password_authenticates_api_calls(world, token_client):
    response = _sign_in()

    assert response.status_code == 200
    body = response.json()
    key = body["token"]
    token = ApiToken.objects.get(user=world.member)
    assert body["id"] == token.pk
    assert body["name"] == "auth/token"
    assert token.digest == hashlib.sha512(key.encode()).hexdigest()
    me = token_client(key).get("/api/v1/tenants")
    assert me.status_code == 200
    assert [t["slug"] for t in me.json()["results"]] == ["nlp"]
    assert me.json()["results"][0]["my_role"] == "member"


def test_form_encoded_sign_in_works_as_the_readme_shows(world, token_client):
    """``curl -d username=... -d password=...`` sends a form, not JSON."""
    response = APIClient().post(
        "/api/v1/auth/token", {"username": "nlp-member", "password": PASSWORD}
    )

    assert response.status_code == 200
    assert token_client(response.json()["token"]).get("/api/v1/jobs").status_code == 200


def test_token_answer_has_the_expiry_default_ninety_days(world, settings):
    before = timezone.now()

    body = _sign_in().json()

    token = ApiToken.objects.get(user=world.member)
    assert body["expiry"] is not None
    assert settings.SLUICE_API_TOKEN_DAYS == 90
    expected = before + timedelta(days=90)
    assert expected - timedelta(seconds=5) <= token.expiry <= expected + timedelta(seconds=5)


def test_token_request_names_its_token_and_asks_for_a_lifetime(world):
    body = _sign_in(name="ci pipeline", expires_in_days=7).json()

    token = ApiToken.objects.get(pk=body["id"])
    assert token.name == "ci pipeline"
    assert timedelta(days=6, hours=23) < token.expiry - token.created <= timedelta(days=7)


def test_token_request_over_the_maximum_lifetime_is_refused_before_any_token(world, settings):
    settings.SLUICE_API_TOKEN_MAX_DAYS = 30

    response = _sign_in(expires_in_days=31)

    assert response.status_code == 400
    assert "expires_in_days" in response.json()["errors"]
    assert not ApiToken.objects.exists()


def test_each_token_request_makes_a_new_token(world, token_client):
    """Keys are not stored, so an earlier key cannot be handed out again: each sign-in
    makes a new token, and both work until they expire or are revoked."""
    first = _sign_in().json()["token"]
    second = _sign_in().json()["token"]

    assert first != second
    assert ApiToken.objects.filter(user=world.member).count() == 2
    assert token_client(first).get("/api/v1/jobs").status_code == 200
    assert token_client(second).get("/api/v1/jobs").status_code == 200


def test_token_creation_is_audited_without_the_key(world):
    key = _sign_in().json()["token"]

    event = AuditEvent.objects.get(action="token.create")
    token = ApiToken.objects.get(user=world.member)
    assert event.actor == world.member
    assert event.target_id == str(token.pk)
    assert event.after["prefix"] == key[:8]
    assert key not in str(event.after) and key not in event.target_label


def test_wrong_password_is_a_400_with_the_uniform_error_shape(world):
    response = _sign_in(password="nope")

    assert response.status_code == 400
    body = response.json()
    assert body["detail"]
    assert body["errors"]["non_field_errors"]
    assert not ApiToken.objects.filter(user=world.member).exists()


def test_token_request_without_fields_names_them(world):
    response = APIClient().post("/api/v1/auth/token", {}, format="json")

    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"username", "password"}


def test_token_request_ignores_a_stale_authorization_header(world):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 64)

    response = client.post(
        "/api/v1/auth/token", {"username": "nlp-member", "password": PASSWORD}, format="json"
    )

    assert response.status_code == 200


def test_unknown_token_is_401(world, token_client):
    assert token_client("0" * 64).get("/api/v1/jobs").status_code == 401


def test_bearer_and_malformed_headers_are_401(world, api_token):
    _, key = api_token(world.member)
    for header in (f"Bearer {key}", "Token", f"Token {key} extra"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        assert client.get("/api/v1/jobs").status_code == 401, header


@pytest.mark.parametrize(("method", "url"), ANONYMOUS_REQUESTS)
def test_every_endpoint_answers_401_without_credentials(world, method, url):
    response = getattr(APIClient(), method)(url, {}, format="json")

    assert response.status_code == 401, url
    assert response.json()["detail"]
    assert response.json()["errors"] == {}


def test_deactivation_revokes_tokens_and_blocks_the_api(world, api_token, token_client):
    first, key = api_token(world.member)
    second, _ = api_token(world.member, name="second")
    client = token_client(key)
    assert client.get("/api/v1/jobs").status_code == 200

    tenant_services.user_deactivate(actor=world.platform_admin, user=world.member)

    world.member.refresh_from_db()
    assert world.member.is_active is False
    assert not ApiToken.objects.filter(user=world.member).exists()
    assert client.get("/api/v1/jobs").status_code == 401
    revoked = AuditEvent.objects.filter(action="token.revoke").order_by("id")
    assert [e.target_id for e in revoked] == [str(first.pk), str(second.pk)]
    assert {e.actor for e in revoked} == {world.platform_admin}
    assert {e.reason for e in revoked} == {"User deactivated"}


def test_deactivated_user_with_a_token_recreated_raw_is_still_401(world, token_client):
    tenant_services.user_deactivate(actor=world.platform_admin, user=world.member)
    _, key = ApiToken.objects.create(user=world.member, expiry=timedelta(days=1), name="raw")

    response = token_client(key).get("/api/v1/tenants")

    assert response.status_code == 401


def test_deactivated_user_cannot_get_a_token(world):
    tenant_services.user_deactivate(actor=world.platform_admin, user=world.member)

    response = _sign_in()

    assert response.status_code == 400
    assert not ApiToken.objects.filter(user=world.member).exists()


def test_deactivated_user_cannot_log_in_to_the_pages(world, client):
    tenant_services.user_deactivate(actor=world.platform_admin, user=world.member)

    response = client.post("/login/", {"username": "nlp-member", "password": PASSWORD})

    assert response.status_code == 200  # the form again, with an error
    assert response.context["form"].errors
    assert "_auth_user_id" not in client.session
    assert client.get("/").status_code == 302


def test_active_user_logs_in_to_the_pages(world, client):
    response = client.post("/login/", {"username": "nlp-member", "password": PASSWORD})

    assert response.status_code == 302
    assert int(client.session["_auth_user_id"]) == world.member.pk
    assert client.get("/").status_code == 200


def test_deactivated_user_loses_an_open_session(world, client):
    client.force_login(world.member)
    assert client.get("/").status_code == 200

    tenant_services.user_deactivate(actor=world.platform_admin, user=world.member)

    assert client.get("/").status_code == 302
    assert client.get("/api/v1/jobs").status_code == 401


def test_pages_redirect_anonymous_users_to_login(world, client):
    response = client.get("/jobs/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")
