"""Sign-in with the company's identity, in headless Chromium: the whole OIDC redirect flow
against a real provider process (django-oauth-toolkit, tests/identity/oidc_provider) and the
local form against a real slapd (tests/identity/ldap), with roles from directory groups.

The login page with the provider's button goes to $SLUICE_SCREENSHOTS (docs/screenshots)
when it is set.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from identity.choices import GrantedRole, MappingSource
from identity.models import DirectoryGroupRole
from tenants.models import Membership
from tests import factories as f
from tests.identity.conftest import configure_sluice, start_provider
from tests.identity.ldap.conftest import ldap_on, slapd  # noqa: F401 (fixtures)
from tests.identity.oidc_provider import setup as op

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def provider(live_server, tmp_path_factory):
    """The provider, with the live server's callback as Sluice's redirect URI."""
    yield from start_provider(
        tmp_path_factory.mktemp("oidc-provider"), [f"{live_server.url}/oidc/callback/"]
    )


@pytest.fixture
def oidc_on(provider, settings, transactional_db):
    """Sluice pointed at the provider, with groups nlp-members (member of nlp) and
    vision-viewers (viewer of vision) mapped."""
    from identity.oidc import discovery_clear

    configure_sluice(settings, provider)
    nlp = f.TenantFactory(slug="nlp", name="Language")
    vision = f.TenantFactory(slug="vision", name="Vision")
    DirectoryGroupRole.objects.create(
        source=MappingSource.OIDC, group="nlp-members", tenant=nlp, role=GrantedRole.MEMBER
    )
    DirectoryGroupRole.objects.create(
        source=MappingSource.OIDC, group="vision-viewers", tenant=vision, role=GrantedRole.VIEWER
    )
    yield provider
    discovery_clear()


def _screenshots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("SLUICE_SCREENSHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _at_sluice(live_server, path: str):
    return re.compile("^" + re.escape(live_server.url + path) + r"(\?.*)?$")


def sign_in_at_provider(page, provider, username: str) -> None:
    """From Sluice's login page: the provider's button, the provider's own form."""
    page.goto("/login/")
    page.click("#oidc-sign-in")
    page.wait_for_url(re.compile("^" + re.escape(f"{provider.url}/accounts/login/")))
    expect(page.locator("h1")).to_have_text("Test identity provider")
    page.fill("#op-username", username)
    page.fill("#op-password", op.PASSWORD)
    page.click("#op-submit")


def log_out(page) -> None:
    page.click("header form[action='/logout/'] button[type=submit]")


def test_oidc_sign_in_in_the_browser_grants_the_roles_of_the_groups(
    oidc_on, page, live_server, tmp_path
):
    page.set_viewport_size(VIEWPORT)
    page.goto("/login/")
    button = page.locator("#oidc-sign-in")
    expect(button).to_have_text("Sign in with your organization")
    expect(page.locator("#id_username")).to_be_visible()  # the local form stays, by default
    page.screenshot(path=str(_screenshots(tmp_path) / "login-oidc.png"))

    sign_in_at_provider(page, oidc_on, "alice")

    page.wait_for_url(_at_sluice(live_server, "/"))
    expect(page.locator("header .user")).to_contain_text("alice")
    page.click("nav >> text=Tenants")
    expect(page.locator("a[href='/tenants/nlp/']")).to_be_visible()
    expect(page.locator("a[href='/tenants/vision/']")).to_be_visible()
    page.click("a[href='/tenants/vision/']")
    expect(page.locator("h1")).to_contain_text("Vision")
    expect(page.locator("main")).to_contain_text("Your role: viewer")
    row = page.locator("tr[data-member='alice']")
    expect(row).to_have_attribute("data-source", "directory")
    page.goto("/tenants/nlp/")
    expect(page.locator("main")).to_contain_text("Your role: member")
    memberships = {
        m.tenant.slug: (m.role, m.source)
        for m in Membership.objects.filter(user__username="alice").select_related("tenant")
    }
    assert memberships == {"nlp": ("member", "directory"), "vision": ("viewer", "directory")}


def test_a_group_removed_at_the_provider_is_a_role_gone_at_the_next_sign_in(
    oidc_on, page, live_server
):
    sign_in_at_provider(page, oidc_on, "alice")
    page.wait_for_url(_at_sluice(live_server, "/"))
    assert page.goto("/tenants/vision/").status == 200

    oidc_on.set_groups("alice", ["nlp-members"])
    try:
        # Logging out ends the provider's session too: the provider asks for the password
        # again, and sends the browser back to Sluice's login page.
        log_out(page)
        page.wait_for_url(_at_sluice(live_server, "/login/"))
        sign_in_at_provider(page, oidc_on, "alice")
        page.wait_for_url(_at_sluice(live_server, "/"))
    finally:
        oidc_on.set_groups("alice", ["nlp-members", "vision-viewers"])

    refused = page.goto("/tenants/vision/")
    assert refused.status == 404
    page.goto("/tenants/")
    expect(page.locator("a[href='/tenants/nlp/']")).to_be_visible()
    expect(page.locator("a[href='/tenants/vision/']")).to_have_count(0)
    assert list(
        Membership.objects.filter(user__username="alice").values_list("tenant__slug", flat=True)
    ) == ["nlp"]


def test_a_user_deactivated_in_sluice_is_signed_out_and_refused_with_a_message(
    oidc_on, page, live_server, tmp_path
):
    from tenants.services import user_deactivate

    page.set_viewport_size(VIEWPORT)
    sign_in_at_provider(page, oidc_on, "erin")
    page.wait_for_url(_at_sluice(live_server, "/"))
    erin = Membership.objects.get(user__username="erin").user
    user_deactivate(actor=f.UserFactory(username="root", is_staff=True), user=erin)

    # The session ends with the account: the next page is the login page.
    page.goto("/tenants/")
    expect(page).to_have_url(_at_sluice(live_server, "/login/"))
    # The provider still knows erin (its session is alive): its button comes straight back
    # to Sluice, which refuses the account with a message, not an error page.
    page.click("#oidc-sign-in")
    page.wait_for_url(_at_sluice(live_server, "/login/"))
    expect(page.locator(".flash-error")).to_contain_text("The account erin is disabled in Sluice")
    page.screenshot(path=str(_screenshots(tmp_path) / "login-oidc-refused.png"))
    page.goto("/")
    expect(page).to_have_url(_at_sluice(live_server, "/login/"))


def test_a_user_without_a_mapped_group_is_told_so_on_the_login_page(oidc_on, page, live_server):
    sign_in_at_provider(page, oidc_on, "nogroups")

    page.wait_for_url(_at_sluice(live_server, "/login/"))
    expect(page.locator(".flash-error")).to_contain_text(
        "none of your groups at the identity provider grants a role in Sluice"
    )
    expect(page.locator("header nav")).to_have_count(0)  # not signed in


def test_ldap_sign_in_through_the_login_form_with_roles_from_groups(
    ldap_on,  # noqa: F811 (the fixture imported above)
    page,
    live_server,
):
    page.goto("/login/")
    expect(page.locator("#oidc-sign-in")).to_have_count(0)  # no OIDC on this site
    page.fill("#id_username", "alice")
    page.fill("#id_password", "alice-pass-1")
    page.click("button[type=submit]:has-text('Log in')")

    page.wait_for_url(_at_sluice(live_server, "/"))
    expect(page.locator("header .user")).to_contain_text("alice")
    page.goto("/tenants/nlp/")
    expect(page.locator("main")).to_contain_text("Your role: admin")
    expect(page.locator("#add-member")).to_be_visible()  # only a tenant admin has the form
    expect(page.locator("tr[data-member='alice']")).to_have_attribute("data-source", "directory")
    expect(page.locator("header nav")).not_to_contain_text("Admin")

    log_out(page)
    page.wait_for_url(_at_sluice(live_server, "/login/"))
    page.fill("#id_username", "erin")
    page.fill("#id_password", "erin-pass-5")
    page.click("button[type=submit]:has-text('Log in')")
    page.wait_for_url(_at_sluice(live_server, "/"))
    expect(page.locator("header .user")).to_contain_text("erin · platform admin")
    expect(page.locator("header nav a[href='/admin/']")).to_be_visible()


def test_a_user_disabled_in_ldap_is_refused_on_the_login_page(
    ldap_on,  # noqa: F811 (the fixture imported above)
    page,
    live_server,
):
    page.goto("/login/")
    page.fill("#id_username", "carol")
    page.fill("#id_password", "carol-pass-3")
    page.click("button[type=submit]:has-text('Log in')")

    expect(page).to_have_url(_at_sluice(live_server, "/login/"))
    expect(page.locator(".errors")).to_be_visible()
    expect(page.locator("header nav")).to_have_count(0)
