"""The API token check reads its tokens with one hand-written statement
(accounts.auth._tokens_with_key) and keeps knox's rules: the digest of the
whole key must match, an expired token is refused and deleted, an inactive user is refused."""

from datetime import timedelta

import pytest
from django.utils import timezone
from knox.crypto import hash_token

from accounts.auth import _tokens_with_key
from accounts.models import ApiToken

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs"


def test_a_valid_token_authenticates(world, api_token, token_client):
    token, key = api_token(world.member)
    client = token_client(key)
    assert client.get(URL).status_code == 200  # sets last_used_at (once a minute)
    found = _tokens_with_key(token.token_key)
    assert [t.pk for t in found] == [token.pk]
    assert found[0].user.username == world.member.username
    assert found[0].digest == ApiToken.objects.get(pk=token.pk).digest


def test_the_right_key_prefix_with_the_wrong_rest_is_refused(world, api_token, token_client):
    _, key = api_token(world.member)
    forged = key[:-4] + ("0000" if not key.endswith("0000") else "1111")
    assert token_client(forged).get(URL).status_code == 401


def test_of_two_tokens_sharing_a_key_prefix_the_one_whose_digest_matches_wins(
    world, api_token, token_client
):
    first, first_key = api_token(world.member)
    second, second_key = api_token(world.viewer)
    # Make the second token's stored key (its first characters) collide with the first's,
    # as knox allows: the digest of the whole key decides.
    ApiToken.objects.filter(pk=second.pk).update(token_key=first.token_key)
    assert len(_tokens_with_key(first.token_key)) == 2
    assert token_client(first_key).get(URL).status_code == 200
    # The token that matched is the one marked used.
    assert ApiToken.objects.get(pk=first.pk).last_used_at is not None
    assert ApiToken.objects.get(pk=second.pk).last_used_at is None
    assert hash_token(first_key) == ApiToken.objects.get(pk=first.pk).digest


def test_an_expired_token_is_refused_and_deleted(world, api_token, token_client):
    token, key = api_token(world.member)
    ApiToken.objects.filter(pk=token.pk).update(expiry=timezone.now() - timedelta(seconds=1))
    assert token_client(key).get(URL).status_code == 401
    assert not ApiToken.objects.filter(pk=token.pk).exists()


def test_an_inactive_users_token_is_refused(world, api_token, token_client):
    token, key = api_token(world.member)
    type(world.member).objects.filter(pk=world.member.pk).update(is_active=False)
    assert token_client(key).get(URL).status_code == 401
