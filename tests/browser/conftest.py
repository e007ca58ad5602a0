"""Headless Chromium (Debian's /usr/bin/chromium) driven by Playwright against ``live_server``.

The browser tests skip when Chromium is missing, unless SLUICE_REQUIRE_BROWSER=1 (CI), where
a missing browser is a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Playwright's sync API keeps an event loop in this thread; the test's own database access
# (fixtures, assertions) is still synchronous and safe.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]


def _require_chromium() -> None:
    if CHROMIUM.exists():
        return
    reason = f"{CHROMIUM} not found: install Debian's chromium package to run the browser tests"
    if os.environ.get("SLUICE_REQUIRE_BROWSER") == "1":
        pytest.fail(reason + " (SLUICE_REQUIRE_BROWSER=1)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    _require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server, transactional_db):
    context = browser.new_context(base_url=live_server.url)
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


@pytest.fixture
def log_in(page):
    """Log in through the login form, as a person would."""
    from tests.factories import PASSWORD

    def do(username: str, password: str = PASSWORD) -> None:
        page.goto("/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click("button[type=submit]:has-text('Log in')")
        page.wait_for_url(lambda url: "/login/" not in url)

    return do
