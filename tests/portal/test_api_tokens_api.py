"""/api/v1/auth/tokens: list your tokens (never a key), make one (key shown once), revoke.

A platform admin lists and revokes anyone's tokens; anyone else's token id is a 404.
"""

import hashlib
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time

from accounts.models import ApiToken
from audit.models import AuditEvent

URL = "/api/v1/auth/tokens"


def _row_text(token_id: int) -> str:
    """Every stored column of the token's row, as the database has it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM accounts_apitoken WHERE id = %s", [token_id])
        return " ".join(str(value) for value in cursor.fetchone())


def test_created_token_is_shown_once_and_only_its_hash_is_stored(world, api, token_client):
    client = api(world.member)

    response = client.post(URL, {"name": "laptop", "expires_in_days": 30}, format="json")

    assert response.status_code == 201
    body = response.json()
    key = body["token"]
    assert len(key) == 64
    assert body["name"] == "laptop"
    assert body["prefix"] == key[:8]
    stored = _row_text(body["id"])
    assert key not in stored
    assert hashlib.sha512(key.encode()).hexdigest() in stored
    listed = client.get(URL)
    assert key not in listed.content.decode()
    assert "digest" not in listed.json()["results"][0]
    detail = client.get(f"{URL}/{body['id']}")
    assert key not in detail.content.decode()
    assert token_client(key).get("/api/v1/jobs").status_code == 200


def test_list_shows_my_tokens_with_name_prefix_dates_and_last_use(world, api, api_token):
    token, key = api_token(world.member, name="ci")
    api_token(world.viewer, name="not mine")

    body = api(world.member).get(URL).json()

    assert [t["id"] for t in body["results"]] == [token.pk]
    row = body["results"][0]
    assert set(row) == {"id", "prefix", "name", "user", "created", "expiry", "last_used_at"}
    assert row["prefix"] == key[:8]
    assert row["user"] == "nlp-member"
    assert row["last_used_at"] is None


def test_last_used_time_is_recorded_at_most_once_a_minute(world, api_token, token_client):
    token, key = api_token(world.member)
    start = timezone.now()
    with freeze_time(start) as clock:
        token_client(key).get("/api/v1/jobs")
        token.refresh_from_db()
        assert token.last_used_at == start

        clock.tick(timedelta(seconds=30))
        token_client(key).get("/api/v1/jobs")
        token.refresh_from_db()
        assert token.last_used_at == start

        clock.tick(timedelta(seconds=31))
        token_client(key).get("/api/v1/jobs")
        token.refresh_from_db()
        assert token.last_used_at == start + timedelta(seconds=61)


def test_default_lifetime_is_the_setting_and_the_maximum_is_enforced(world, api, settings):
    settings.SLUICE_API_TOKEN_DAYS = 10
    settings.SLUICE_API_TOKEN_MAX_DAYS = 20
    client = api(world.member)

    made = client.post(URL, {"name": "default"}, format="json").json()
    too_long = client.post(URL, {"name": "long", "expires_in_days": 21}, format="json")
    zero = client.post(URL, {"name": "zero", "expires_in_days": 0}, format="json")

    token = ApiToken.objects.get(pk=made["id"])
    assert timedelta(days=9, hours=23) < token.expiry - token.created <= timedelta(days=10)
    assert too_long.status_code == 400
    assert too_long.json()["errors"]["expires_in_days"] == ["At most 20 days."]
    assert zero.status_code == 400
    assert "expires_in_days" in zero.json()["errors"]
    assert ApiToken.objects.filter(user=world.member).count() == 1


def test_name_is_required(world, api):
    response = api(world.member).post(URL, {}, format="json")

    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"name"}
    assert not ApiToken.objects.exists()


def test_expired_token_is_401_and_is_deleted(world, api_token, token_client):
    token, key = api_token(world.member, days=1)

    with freeze_time(timezone.now() + timedelta(days=1, seconds=1)):
        response = token_client(key).get("/api/v1/jobs")

    assert response.status_code == 401
    assert not ApiToken.objects.filter(pk=token.pk).exists()


def test_expired_tokens_are_not_listed(world, api, api_token):
    api_token(world.member, days=1)
    fresh, _ = api_token(world.member, days=30)

    with freeze_time(timezone.now() + timedelta(days=2)):
        body = api(world.member).get(URL).json()

    assert [t["id"] for t in body["results"]] == [fresh.pk]


def test_token_works_until_it_expires(world, api_token, token_client):
    _, key = api_token(world.member, days=1)

    with freeze_time(timezone.now() + timedelta(hours=23, minutes=59)):
        assert token_client(key).get("/api/v1/jobs").status_code == 200


def test_revoked_token_is_401_and_the_revocation_is_audited(world, api, api_token, token_client):
    token, key = api_token(world.member)
    assert token_client(key).get("/api/v1/jobs").status_code == 200

    response = api(world.member).delete(f"{URL}/{token.pk}")

    assert response.status_code == 204
    assert not ApiToken.objects.filter(pk=token.pk).exists()
    assert token_client(key).get("/api/v1/jobs").status_code == 401
    event = AuditEvent.objects.get(action="token.revoke")
    assert event.actor == world.member
    assert event.target_type == "accounts.apitoken"
    assert event.target_id == str(token.pk)
    assert event.before["user"] == "nlp-member"
    assert event.before["prefix"] == key[:8]


def test_a_token_can_revoke_itself(world, api_token, token_client):
    token, key = api_token(world.member)

    assert token_client(key).delete(f"{URL}/{token.pk}").status_code == 204
    assert token_client(key).get("/api/v1/jobs").status_code == 401


@pytest.mark.parametrize("who", ["outsider", "viewer", "tenant_admin"])
def test_another_users_token_is_404_to_read_and_to_revoke(world, api, api_token, who):
    token, _ = api_token(world.member)
    client = api(getattr(world, who))

    assert client.get(f"{URL}/{token.pk}").status_code == 404
    response = client.delete(f"{URL}/{token.pk}")

    assert response.status_code == 404
    assert response.json()["detail"]
    assert ApiToken.objects.filter(pk=token.pk).exists()
    assert not AuditEvent.objects.filter(action="token.revoke").exists()


def test_others_cannot_list_my_tokens_by_username(world, api, api_token):
    api_token(world.member)

    body = api(world.outsider).get(URL, {"user": "nlp-member"}).json()

    assert body["results"] == []


def test_platform_admin_lists_and_revokes_another_users_tokens(world, api, api_token, token_client):
    token, key = api_token(world.member)
    api_token(world.viewer)
    client = api(world.platform_admin)

    mine = client.get(URL).json()["results"]
    members = client.get(URL, {"user": "nlp-member"}).json()["results"]
    response = client.delete(f"{URL}/{token.pk}")

    assert mine == []
    assert [t["id"] for t in members] == [token.pk]
    assert response.status_code == 204
    assert token_client(key).get("/api/v1/jobs").status_code == 401
    event = AuditEvent.objects.get(action="token.revoke")
    assert event.actor == world.platform_admin
    assert event.before["user"] == "nlp-member"


def test_viewer_manages_own_tokens(world, api):
    client = api(world.viewer)

    made = client.post(URL, {"name": "read only scripts"}, format="json")

    assert made.status_code == 201
    assert client.delete(f"{URL}/{made.json()['id']}").status_code == 204


def test_a_token_cannot_make_tokens(world, api_token, token_client):
    """Otherwise a stolen token could renew itself forever, whatever its expiry."""
    _, key = api_token(world.member)

    response = token_client(key).post(URL, {"name": "more"}, format="json")

    assert response.status_code == 403
    assert "password" in response.json()["detail"]
    assert ApiToken.objects.filter(user=world.member).count() == 1


def test_creation_is_audited_in_the_same_transaction(world, api):
    made = api(world.member).post(URL, {"name": "laptop"}, format="json").json()

    event = AuditEvent.objects.get(action="token.create")
    assert event.actor == world.member
    assert event.target_id == str(made["id"])
    assert event.after["name"] == "laptop"
    assert made["token"] not in str(event.after)


def test_list_query_count_does_not_grow_with_tokens(world, api, api_token):
    client = api(world.platform_admin)
    api_token(world.member)
    with CaptureQueriesContext(connection) as one:
        client.get(URL, {"user": "nlp-member"})
    for n in range(5):
        api_token(world.member, name=f"t{n}")
    with CaptureQueriesContext(connection) as six:
        body = client.get(URL, {"user": "nlp-member"}).json()

    assert body["count"] == 6
    assert len(six) == len(one)


def test_a_request_reads_only_the_token_it_presents(world, api_token, token_client):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from accounts.services import api_tokens_expired_delete

    stale, _ = api_token(world.member, days=1)
    _, key = api_token(world.member, days=30)
    later = timezone.now() + timedelta(days=2)
    with freeze_time(later), CaptureQueriesContext(connection) as queries:
        assert token_client(key).get("/api/v1/jobs").status_code == 200
    token_reads = [q for q in queries.captured_queries if 'FROM "accounts_apitoken"' in q["sql"]]
    assert len(token_reads) == 1  # knox's per-request scan of the user's other tokens: gone
    # The other, expired token is refused if presented, and the hourly sweep deletes it.
    assert ApiToken.objects.filter(pk=stale.pk).exists()
    assert api_tokens_expired_delete(now=later) == 1
    assert not ApiToken.objects.filter(pk=stale.pk).exists()
