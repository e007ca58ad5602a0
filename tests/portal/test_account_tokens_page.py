"""/account/tokens/: see your tokens, make one (the key shown once, with a copy hint),
revoke one after a confirmation page."""

import pytest

from accounts.models import ApiToken
from audit.models import AuditEvent

PAGE = "/account/tokens/"


def test_nav_links_to_the_token_page(world, client):
    client.force_login(world.member)

    body = client.get("/").content.decode()

    assert f'href="{PAGE}"' in body


def test_page_lists_my_tokens_only_and_never_a_key(world, client, api_token):
    mine, key = api_token(world.member, name="my laptop")
    theirs, _ = api_token(world.viewer, name="viewer laptop")
    client.force_login(world.member)

    response = client.get(PAGE)

    body = response.content.decode()
    assert response.status_code == 200
    assert list(response.context["tokens"]) == [mine]
    assert "my laptop" in body and key[:8] in body
    assert key not in body
    assert "viewer laptop" not in body


def test_make_a_token_shows_the_key_once(world, client, token_client):
    client.force_login(world.member)

    response = client.post(PAGE, {"name": "ci", "expires_in_days": 30})

    token = ApiToken.objects.get(user=world.member)
    key = response.context["created"]["key"]
    body = response.content.decode()
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    assert f'value="{key}"' in body
    assert "will not be shown again" in body
    assert token.name == "ci"
    assert key not in client.get(PAGE).content.decode()
    assert token_client(key).get("/api/v1/jobs").status_code == 200
    assert AuditEvent.objects.filter(action="token.create", actor=world.member).count() == 1


def test_make_a_token_with_a_bad_lifetime_shows_the_field_error(world, client, settings):
    settings.SLUICE_API_TOKEN_MAX_DAYS = 30
    client.force_login(world.member)

    response = client.post(PAGE, {"name": "ci", "expires_in_days": 31})

    assert response.status_code == 200
    assert response.context["form"].errors["expires_in_days"]
    assert response.context["created"] is None
    assert not ApiToken.objects.exists()


def test_revoke_asks_first_then_revokes(world, client, api_token, token_client):
    token, key = api_token(world.member, name="old")
    client.force_login(world.member)
    url = f"/account/tokens/{token.pk}/revoke"

    confirm = client.get(url)
    assert confirm.status_code == 200
    assert "Revoke token" in confirm.content.decode()
    assert ApiToken.objects.filter(pk=token.pk).exists()

    response = client.post(url)

    assert response.status_code == 302
    assert response["Location"] == PAGE
    assert not ApiToken.objects.filter(pk=token.pk).exists()
    assert token_client(key).get("/api/v1/jobs").status_code == 401
    assert AuditEvent.objects.get(action="token.revoke").actor == world.member


@pytest.mark.parametrize("who", ["outsider", "viewer", "tenant_admin"])
def test_another_users_token_is_404_on_the_page(world, client, api_token, who):
    token, _ = api_token(world.member)
    client.force_login(getattr(world, who))

    assert client.get(f"/account/tokens/{token.pk}/revoke").status_code == 404
    assert client.post(f"/account/tokens/{token.pk}/revoke").status_code == 404
    assert ApiToken.objects.filter(pk=token.pk).exists()


def test_platform_admin_may_revoke_anothers_token_on_the_page(world, client, api_token):
    token, _ = api_token(world.member)
    client.force_login(world.platform_admin)

    confirm = client.get(f"/account/tokens/{token.pk}/revoke")
    assert "nlp-member" in confirm.content.decode()
    client.post(f"/account/tokens/{token.pk}/revoke")

    assert not ApiToken.objects.filter(pk=token.pk).exists()


def test_page_needs_a_login(world, client):
    response = client.get(PAGE)

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")
