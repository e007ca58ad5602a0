"""Token and session authentication: who gets in, and deactivated users never do."""

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

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
]


def _token_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_token_for_username_and_password_authenticates_api_calls(world):
    response = APIClient().post(
        "/api/v1/auth/token", {"username": "nlp-member", "password": PASSWORD}, format="json"
    )

    assert response.status_code == 200
    key = response.json()["token"]
    assert Token.objects.get(user=world.member).key == key
    me = _token_client(key).get("/api/v1/tenants")
    assert me.status_code == 200
    assert [t["slug"] for t in me.json()["results"]] == ["nlp"]
    assert me.json()["results"][0]["my_role"] == "member"


def test_token_request_is_idempotent(world):
    client = APIClient()
    body = {"username": "nlp-member", "password": PASSWORD}
    first = client.post("/api/v1/auth/token", body, format="json").json()["token"]
    second = client.post("/api/v1/auth/token", body, format="json").json()["token"]

    assert first == second
    assert Token.objects.filter(user=world.member).count() == 1


def test_wrong_password_is_a_400_with_the_uniform_error_shape(world):
    response = APIClient().post(
        "/api/v1/auth/token", {"username": "nlp-member", "password": "nope"}, format="json"
    )

    assert response.status_code == 400
    body = response.json()
    assert body["detail"]
    assert body["errors"]["non_field_errors"]
    assert not Token.objects.filter(user=world.member).exists()


def test_token_request_without_fields_names_them(world):
    response = APIClient().post("/api/v1/auth/token", {}, format="json")

    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"username", "password"}


def test_unknown_token_is_401(world):
    assert _token_client("0" * 40).get("/api/v1/jobs").status_code == 401


@pytest.mark.parametrize(("method", "url"), ANONYMOUS_REQUESTS)
def test_every_endpoint_answers_401_without_credentials(world, method, url):
    response = getattr(APIClient(), method)(url, {}, format="json")

    assert response.status_code == 401, url
    assert response.json()["detail"]
    assert response.json()["errors"] == {}


def test_deactivation_deletes_tokens_and_blocks_the_api(world):
    key = Token.objects.create(user=world.member).key
    client = _token_client(key)
    assert client.get("/api/v1/jobs").status_code == 200

    tenant_services.user_deactivate(actor=world.platform_admin, user=world.member)

    world.member.refresh_from_db()
    assert world.member.is_active is False
    assert not Token.objects.filter(user=world.member).exists()
    assert client.get("/api/v1/jobs").status_code == 401


def test_deactivated_user_with_a_token_recreated_raw_is_still_401(world):
    tenant_services.user_deactivate(actor=world.platform_admin, user=world.member)
    key = Token.objects.create(user=world.member).key

    response = _token_client(key).get("/api/v1/tenants")

    assert response.status_code == 401


def test_deactivated_user_cannot_get_a_token(world):
    tenant_services.user_deactivate(actor=world.platform_admin, user=world.member)

    response = APIClient().post(
        "/api/v1/auth/token", {"username": "nlp-member", "password": PASSWORD}, format="json"
    )

    assert response.status_code == 400
    assert not Token.objects.filter(user=world.member).exists()


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
