"""Sign-in through a real slapd (StartTLS, a self-signed CA): users created just in time
without a local password, roles from groups, the Unix identity from uid/uidNumber, and
every refusal a clear answer (no 500)."""

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured

from audit.models import AuditEvent
from identity.choices import DirectorySource
from identity.ldap_config import ldap_settings
from identity.models import DirectoryIdentity
from tenants.models import Membership

from .slapd import PEOPLE

pytestmark = pytest.mark.django_db
User = get_user_model()


def _token(api_client, username, password):
    return api_client.post(
        "/api/v1/auth/token", {"username": username, "password": password}, format="json"
    )


def test_login_page_signs_in_an_ldap_user_with_roles_from_groups(ldap_on, client):
    response = client.post("/login/", {"username": "alice", "password": "alice-pass-1"})

    assert response.status_code == 302, response.content[:500]
    alice = User.objects.get(username="alice")
    assert client.session["_auth_user_id"] == str(alice.pk)
    assert not alice.has_usable_password()
    assert alice.email == "alice@example.org"
    membership = Membership.objects.get(user=alice, tenant=ldap_on.tenant)
    assert (membership.role, membership.source) == ("admin", "directory")
    identity = DirectoryIdentity.objects.get(user=alice)
    assert (identity.source, identity.subject) == (DirectorySource.LDAP, f"uid=alice,{PEOPLE}")
    assert (identity.unix_account, identity.unix_uid) == ("alice", 10001)
    granted = AuditEvent.objects.get(action="identity.role_granted")
    assert "cn=nlp-admins" in str(granted.after).lower()


def test_platform_admin_from_a_group_and_viewer_role(ldap_on, api):
    assert _token(api(), "erin", "erin-pass-5").status_code == 200

    erin = User.objects.get(username="erin")
    assert erin.is_staff
    assert Membership.objects.get(user=erin).role == "viewer"


def test_token_endpoint_signs_in_an_ldap_user(ldap_on, api, token_client):
    response = _token(api(), "bob", "bob-pass-2")

    assert response.status_code == 200, response.content
    assert token_client(response.json()["token"]).get("/api/v1/jobs").status_code == 200
    assert Membership.objects.get(user__username="bob").role == "member"


@pytest.mark.parametrize(
    ("username", "password"),
    [("bob", "wrong"), ("carol", "carol-pass-3"), ("nobody", "x"), ("bob", "")],
    ids=["wrong-password", "disabled", "unknown", "empty"],
)
def test_refused_sign_ins_are_clear_answers(ldap_on, api, client, username, password):
    token = _token(api(), username, password)
    page = client.post("/login/", {"username": username, "password": password})

    assert token.status_code == 400
    assert token.json()["detail"]
    assert page.status_code == 200
    assert "_auth_user_id" not in client.session
    assert not User.objects.filter(username=username).exists()


def test_group_removed_role_gone_at_next_sign_in(ldap_on, api):
    assert _token(api(), "bob", "bob-pass-2").status_code == 200
    assert Membership.objects.filter(user__username="bob").exists()

    ldap_on.remove_from_group("bob", "nlp-users")
    assert _token(api(), "bob", "bob-pass-2").status_code == 200

    assert not Membership.objects.filter(user__username="bob").exists()
    removed = AuditEvent.objects.get(action="identity.role_removed")
    assert removed.before["role"] == "member"


def test_local_break_glass_admin_still_signs_in(ldap_on, client):
    admin = User.objects.create_user("root", password="a-long-enough-passphrase-42", is_staff=True)

    client.post("/login/", {"username": "root", "password": "a-long-enough-passphrase-42"})

    assert client.session["_auth_user_id"] == str(admin.pk)


def test_directory_down_is_a_refusal_not_a_500(ldap_on, api):
    ldap_on.stop()

    response = _token(api(), "bob", "bob-pass-2")

    assert response.status_code == 400


def test_plain_ldap_is_refused_unless_allowed():
    env = {
        "SLUICE_LDAP_URI": "ldap://ldap.example.org",
        "SLUICE_LDAP_START_TLS": "false",
        "SLUICE_LDAP_USER_SEARCH_BASE": PEOPLE,
    }
    with pytest.raises(ImproperlyConfigured, match="StartTLS"):
        ldap_settings(env)
    assert ldap_settings({**env, "SLUICE_LDAP_ALLOW_PLAIN": "1"})["AUTH_LDAP_START_TLS"] is False
    assert ldap_settings({})["SLUICE_LDAP_ENABLED"] is False


def test_server_requiring_tls_refuses_a_plain_client(ldap_on, api, settings):
    settings.AUTH_LDAP_START_TLS = False

    assert _token(api(), "bob", "bob-pass-2").status_code == 400
    assert not User.objects.filter(username="bob").exists()
