"""The leavers sync (identity.ldap_sync) against a real slapd: a user disabled in or gone
from the directory is deactivated, loses sessions and API tokens (refused after one sync),
audited; a group change syncs roles; an unreachable directory deactivates nobody."""

import pytest
from django.contrib.auth import get_user_model

from accounts.models import ApiToken
from audit.models import AuditEvent
from identity.ldap import DirectoryUnavailable, ldap_sync_all
from identity.tasks import ldap_sync
from tenants.models import Membership

pytestmark = pytest.mark.django_db
User = get_user_model()


def _sign_in(api, username, password) -> str:
    response = api().post(
        "/api/v1/auth/token", {"username": username, "password": password}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()["token"]


def test_disabled_user_tokens_refused_after_one_sync(ldap_on, api, token_client, client):
    key = _sign_in(api, "bob", "bob-pass-2")
    client.post("/login/", {"username": "bob", "password": "bob-pass-2"})
    assert client.get("/api/v1/jobs").status_code == 200
    _sign_in(api, "alice", "alice-pass-1")

    ldap_on.disable("bob")
    result = ldap_sync.delay()

    assert token_client(key).get("/api/v1/jobs").status_code == 401
    assert client.get("/api/v1/jobs").status_code in (401, 403)
    bob = User.objects.get(username="bob")
    assert not bob.is_active
    assert not ApiToken.objects.filter(user=bob).exists()
    disabled = AuditEvent.objects.get(action="identity.user_disabled")
    assert disabled.target_label == "bob"
    assert disabled.after["tokens_revoked"] == 1
    assert result.get() == {"synced": 1, "disabled": 1, "gone": 0}
    assert User.objects.get(username="alice").is_active


def test_user_gone_from_the_directory_is_deactivated(ldap_on, api):
    _sign_in(api, "bob", "bob-pass-2")

    ldap_on.delete("bob")
    result = ldap_sync_all()

    assert result.gone == 1
    assert not User.objects.get(username="bob").is_active


def test_group_change_syncs_roles_without_a_sign_in(ldap_on, api):
    _sign_in(api, "bob", "bob-pass-2")

    ldap_on.remove_from_group("bob", "nlp-users")
    ldap_on.add_to_group("bob", "nlp-viewers")
    ldap_sync_all()

    assert Membership.objects.get(user__username="bob").role == "viewer"
    assert AuditEvent.objects.filter(action="identity.role_changed").exists()


def test_unreachable_directory_deactivates_nobody(ldap_on, api):
    _sign_in(api, "bob", "bob-pass-2")

    ldap_on.stop()
    with pytest.raises(DirectoryUnavailable):
        ldap_sync_all()

    assert User.objects.get(username="bob").is_active


def test_user_signs_in_again_after_being_enabled(ldap_on, api):
    _sign_in(api, "bob", "bob-pass-2")
    ldap_on.disable("bob")
    ldap_sync_all()

    ldap_on.modify(
        "dn: uid=bob,ou=people,dc=example,dc=org\nchangetype: modify\ndelete: employeeType\n"
    )

    assert _sign_in(api, "bob", "bob-pass-2")
    assert User.objects.get(username="bob").is_active
