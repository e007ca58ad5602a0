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


@pytest.fixture(scope="session", autouse=True)
def _flush_past_the_audit_guard():
    """Empty the test database after each browser test although the audit log is
    append-only (see ``tests.audit_helpers.flushes_past_the_audit_guard``). Session-wide,
    because the flush runs after every function-scoped fixture has been torn down."""
    from tests.audit_helpers import flushes_past_the_audit_guard

    with flushes_past_the_audit_guard():
        yield


# Every page reports Content-Security-Policy violations to the console, where the fixture
# below collects them (Chromium's own "Refused to ..." messages are collected too).
_REPORT_CSP_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) => {
  console.error(`CSP violation: ${e.violatedDirective} blocked ${e.blockedURI || "inline"} ` +
                `in ${e.sourceFile || e.documentURI}:${e.lineNumber} ${e.sample || ""}`);
});
"""


def csp_violations_in(messages: list[str]) -> list[str]:
    return [m for m in messages if "CSP violation" in m or "Content Security Policy" in m]


@pytest.fixture
def page(browser, live_server, transactional_db):
    """A fresh browser page on the live server. Fails the test if any page it showed broke
    the Content-Security-Policy (``page.console_messages`` has what the console said)."""
    context = browser.new_context(base_url=live_server.url)
    context.add_init_script(_REPORT_CSP_VIOLATIONS)
    page = context.new_page()
    page.set_default_timeout(15_000)
    messages: list[str] = []
    page.on("console", lambda message: messages.append(f"{page.url}: {message.text}"))
    page.console_messages = messages
    yield page
    context.close()
    violations = csp_violations_in(messages)
    assert not violations, "Content-Security-Policy violations:\n" + "\n".join(violations)


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
