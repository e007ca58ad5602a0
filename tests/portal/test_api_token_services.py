"""accounts.services: api_token_create, api_token_revoke, api_tokens_revoke_all."""

from datetime import timedelta

import pytest

from accounts import services
from accounts.models import ApiToken
from audit.models import AuditEvent
from portal.errors import BusinessError, PermissionDeniedError


def test_create_stores_the_hash_and_returns_the_key(world):
    token, key = services.api_token_create(user=world.member, name="laptop")

    token.refresh_from_db()
    assert key not in (token.digest, token.token_key, token.name)
    assert key.startswith(token.token_key)
    assert token.expiry - token.created == pytest.approx(
        timedelta(days=90), abs=timedelta(seconds=5)
    )


@pytest.mark.parametrize(
    ("name", "days", "field"),
    [
        ("", None, "name"),
        (" ", 5, "name"),
        ("x", 0, "expires_in_days"),
        ("x", 366, "expires_in_days"),
    ],
)
def test_create_refuses_bad_input(world, name, days, field):
    with pytest.raises(BusinessError) as exc:
        services.api_token_create(user=world.member, name=name, expires_in_days=days)

    assert field in exc.value.errors
    assert not ApiToken.objects.exists()
    assert not AuditEvent.objects.exists()


def test_inactive_user_gets_no_token(world):
    world.member.is_active = False
    world.member.save()

    with pytest.raises(PermissionDeniedError):
        services.api_token_create(user=world.member, name="x")


def test_only_the_owner_or_a_platform_admin_revokes(world):
    token, _ = services.api_token_create(user=world.member, name="x")
    token_id = token.pk

    with pytest.raises(PermissionDeniedError):
        services.api_token_revoke(actor=world.tenant_admin, token=token)
    assert ApiToken.objects.filter(pk=token.pk).exists()

    services.api_token_revoke(actor=world.platform_admin, token=token, reason="leaked")

    assert not ApiToken.objects.filter(pk=token_id).exists()
    event = AuditEvent.objects.get(action="token.revoke")
    assert event.reason == "leaked"
    assert event.actor == world.platform_admin
    assert event.target_id == str(token_id)


def test_revoke_all_revokes_each_token_of_that_user_only(world):
    for n in range(3):
        services.api_token_create(user=world.member, name=f"t{n}")
    other, _ = services.api_token_create(user=world.viewer, name="v")

    count = services.api_tokens_revoke_all(
        actor=world.platform_admin, user=world.member, reason="User deactivated"
    )

    assert count == 3
    assert list(ApiToken.objects.all()) == [other]
    assert AuditEvent.objects.filter(action="token.revoke").count() == 3
