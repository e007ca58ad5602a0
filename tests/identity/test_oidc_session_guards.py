"""What keeps an OIDC session honest in a browser: a session ends with its deactivated
account, and every page's Content-Security-Policy lets the logout form reach the provider's
end-session endpoint (browsers check a form's redirects against ``form-action``)."""

import pytest
from django.test import Client

from tenants.services import user_deactivate
from tests import factories as f

pytestmark = pytest.mark.django_db

ISSUER = "https://sso.example.org/realms/company"
BACKEND = "identity.oidc.SluiceOIDCBackend"


@pytest.fixture
def oidc_configured(settings):
    settings.SLUICE_OIDC_ISSUER = ISSUER
    settings.OIDC_RP_CLIENT_ID = "sluice"
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, BACKEND]


def _form_action(response) -> list[str]:
    policy = response["Content-Security-Policy"]
    directive = next(d.strip() for d in policy.split(";") if d.strip().startswith("form-action"))
    return directive.split()[1:]


def test_a_session_signed_in_through_the_provider_ends_when_the_user_is_deactivated(
    oidc_configured,
):
    member = f.UserFactory(username="alice")
    f.MembershipFactory(user=member)
    client = Client()
    client.force_login(member, backend=BACKEND)
    assert client.get("/").status_code == 200

    user_deactivate(actor=f.UserFactory(username="root", is_staff=True), user=member)

    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_every_page_lets_its_forms_lead_to_the_provider(oidc_configured):
    member = f.UserFactory(username="alice")
    client = Client()
    client.force_login(member, backend=BACKEND)

    for path in ["/login/", "/"]:
        response = Client().get(path) if path == "/login/" else client.get(path)
        assert _form_action(response) == ["'self'", "https://sso.example.org"], path


def test_without_oidc_forms_go_to_this_site_only(settings):
    settings.SLUICE_OIDC_ISSUER = ""
    assert _form_action(Client().get("/login/")) == ["'self'"]
