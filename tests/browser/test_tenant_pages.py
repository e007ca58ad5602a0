"""In a browser: log in, open the tenant page, add a member and see them in the table."""

import re

import pytest
from playwright.sync_api import expect

from tenants.models import Membership
from tests import factories as f

pytestmark = pytest.mark.browser


def test_admin_adds_a_member_on_the_tenant_page(world, page, log_in):
    f.UserFactory(username="newcomer")

    log_in("nlp-admin")
    page.click("nav >> text=Tenants")
    page.click("a[href='/tenants/nlp/']")

    expect(page.locator("h1")).to_contain_text("Language")
    expect(page.locator("tr[data-member='nlp-viewer']")).to_be_visible()
    page.fill("#id_add-username", "newcomer")
    page.select_option("#id_add-role", "viewer")
    page.click("#add-member button[type=submit]")

    row = page.locator("tr[data-member='newcomer']")
    expect(row).to_be_visible()
    expect(page.locator(".flash-success")).to_contain_text("newcomer added as viewer.")
    expect(row.locator("select[name=role]")).to_have_value("viewer")
    assert Membership.objects.get(user__username="newcomer").role == "viewer"


def test_unknown_user_shows_an_error_on_the_form(world, page, log_in):
    log_in("nlp-admin")
    page.goto("/tenants/nlp/")

    page.fill("#id_add-username", "ghost")
    page.click("#add-member button[type=submit]")

    expect(page.locator("#add-member")).to_contain_text("No user with this username.")
    expect(page.locator("tr[data-member='ghost']")).to_have_count(0)


def test_wrong_password_keeps_the_user_on_the_login_page(world, page):
    page.goto("/login/")
    page.fill("#id_username", "nlp-admin")
    page.fill("#id_password", "not-the-password")
    page.click("button[type=submit]:has-text('Log in')")

    expect(page).to_have_url(re.compile(r"/login/"))
    expect(page.locator(".errors")).to_be_visible()
