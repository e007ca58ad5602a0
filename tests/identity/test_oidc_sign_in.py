"""OIDC sign-in against a real provider (django-oauth-toolkit in a subprocess): the whole
code flow with PKCE, the browser's part played by a requests session at the provider and
Django's test client at Sluice."""

from urllib.parse import parse_qs, urlparse

import pytest
import requests
from django.test import Client

from audit.models import AuditEvent
from identity.choices import GrantedRole, MappingSource
from identity.models import DirectoryGroupRole, DirectoryIdentity
from tenants.choices import MembershipSource, Role
from tenants.models import Membership
from tests import factories as f
from tests.identity.oidc_provider import setup as op

pytestmark = pytest.mark.django_db


@pytest.fixture
def mapping():
    nlp = f.TenantFactory(slug="nlp")
    vision = f.TenantFactory(slug="vision")
    DirectoryGroupRole.objects.create(
        source=MappingSource.OIDC, group="nlp-members", tenant=nlp, role=GrantedRole.MEMBER
    )
    DirectoryGroupRole.objects.create(
        source=MappingSource.ANY, group="vision-viewers", tenant=vision, role=GrantedRole.VIEWER
    )
    return nlp, vision


def sign_in(client: Client, provider, username: str):
    """Start at Sluice's button, sign in at the provider, come back; Sluice's last answer."""
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302, start
    authorize = start["Location"]
    query = parse_qs(urlparse(authorize).query)
    assert query["code_challenge_method"] == ["S256"] and query["code_challenge"]
    browser = requests.Session()
    login = f"{provider.url}/accounts/login/"
    browser.get(login, timeout=10)
    answer = browser.post(
        login,
        data={
            "username": username,
            "password": op.PASSWORD,
            "next": authorize.removeprefix(provider.url),
            "csrfmiddlewaretoken": browser.cookies["op_csrf"],
        },
        headers={"Referer": login},
        allow_redirects=False,
        timeout=10,
    )
    assert answer.status_code == 302, answer.text[:500]
    back = browser.get(provider.url + answer.headers["Location"], allow_redirects=False, timeout=10)
    assert back.status_code == 302, back.text[:500]
    callback = back.headers["Location"]
    assert callback.startswith("http://testserver/oidc/callback/"), callback
    return client.get(callback.removeprefix("http://testserver"), follow=True)


def _page_messages(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_sign_in_creates_the_user_with_roles_from_the_groups_claim(oidc_settings, mapping):
    client = Client()
    response = sign_in(client, oidc_settings, "alice")
    assert response.redirect_chain[-1][0] == "/"
    assert response.status_code == 200
    alice = DirectoryIdentity.objects.get(subject__isnull=False, user__username="alice").user
    assert not alice.has_usable_password()
    assert {m.tenant.slug: (m.role, m.source) for m in alice.memberships.all()} == {
        "nlp": (Role.MEMBER, MembershipSource.DIRECTORY),
        "vision": (Role.VIEWER, MembershipSource.DIRECTORY),
    }
    assert alice.directory_identity.unix_account == "unix_alice"
    assert AuditEvent.objects.filter(action="identity.role_granted").count() == 2


def test_a_group_removed_at_the_provider_removes_the_role_at_the_next_sign_in(
    oidc_settings, mapping
):
    sign_in(Client(), oidc_settings, "alice")
    oidc_settings.set_groups("alice", ["nlp-members"])
    try:
        sign_in(Client(), oidc_settings, "alice")
    finally:
        oidc_settings.set_groups("alice", ["nlp-members", "vision-viewers"])
    assert list(
        Membership.objects.filter(user__username="alice").values_list("tenant__slug", flat=True)
    ) == ["nlp"]
    removed = AuditEvent.objects.get(action="identity.role_removed")
    assert removed.tenant.slug == "vision"
    assert removed.after["source"] == "oidc"


def test_a_user_disabled_in_sluice_is_refused_with_a_clear_message(oidc_settings, mapping):
    sign_in(Client(), oidc_settings, "erin")
    erin = DirectoryIdentity.objects.get(user__username="erin").user
    erin.is_active = False
    erin.save()
    client = Client()
    response = sign_in(client, oidc_settings, "erin")
    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == "/login/"
    assert any("disabled in Sluice" in m for m in _page_messages(response))
    assert "_auth_user_id" not in client.session


def test_no_group_that_grants_a_role_is_refused_with_a_clear_message(oidc_settings, mapping):
    client = Client()
    response = sign_in(client, oidc_settings, "nogroups")
    assert response.redirect_chain[-1][0] == "/login/"
    assert any("none of your groups" in m for m in _page_messages(response))
    assert "_auth_user_id" not in client.session


def test_a_state_that_is_not_this_browsers_is_refused_without_a_500(oidc_settings, mapping):
    client = Client()
    client.get("/oidc/authenticate/")
    response = client.get("/oidc/callback/?code=forged&state=not-mine", follow=True)
    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == "/login/"
    assert any("could not be verified" in m for m in _page_messages(response))


def test_a_refusal_at_the_provider_is_a_message(oidc_settings, mapping):
    client = Client()
    client.get("/oidc/authenticate/")
    response = client.get(
        "/oidc/callback/?error=access_denied&error_description=The+user+denied+access&state=x",
        follow=True,
    )
    assert response.redirect_chain[-1][0] == "/login/"
    assert _page_messages(response) == [
        "The identity provider refused the sign-in: The user denied access."
    ]


def test_a_provider_that_is_down_is_a_message(settings, mapping):
    from tests.identity.conftest import Provider, configure_sluice

    configure_sluice(settings, Provider(url="http://127.0.0.1:9", control_token=""))
    response = Client().get("/oidc/authenticate/", follow=True)
    assert response.redirect_chain[-1][0] == "/login/"
    assert any("cannot be reached" in m for m in _page_messages(response))


def test_the_login_page_shows_the_button_and_hides_the_form_when_local_login_is_off(
    oidc_settings, settings
):
    settings.SLUICE_LOCAL_LOGIN = False
    page = Client().get("/login/").content.decode()
    assert "oidc-sign-in" in page and 'name="password"' not in page
    staff = f.UserFactory(username="root", is_staff=True)
    member = f.UserFactory(username="bob")
    assert staff and member
    refused = Client().post("/login/", {"username": "bob", "password": f.PASSWORD})
    assert "break-glass" in refused.content.decode()
    breakglass = Client()
    assert (
        breakglass.post("/login/", {"username": "root", "password": f.PASSWORD}).status_code == 302
    )
    assert "_auth_user_id" in breakglass.session


def test_logout_ends_the_provider_session_too(oidc_settings, mapping):
    client = Client()
    sign_in(client, oidc_settings, "alice")
    response = client.post("/logout/")
    assert response.status_code == 302
    assert response["Location"].startswith(f"{oidc_settings.issuer}/logout/")
    assert "id_token_hint=" in response["Location"]
    assert "_auth_user_id" not in client.session
