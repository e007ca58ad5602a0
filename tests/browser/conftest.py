"""Headless Chromium (Debian's /usr/bin/chromium) driven by Playwright against ``live_server``.

The browser tests skip when Chromium is missing, unless SLUICE_REQUIRE_BROWSER=1 (CI), where
a missing browser is a failure.
"""

from __future__ import annotations

import os
import threading
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


class _Connections:
    """The live server's connections being served (one thread each, a keep-alive
    connection's requests included), counted so that a test's database is only emptied
    once none is left: a request still running its view while the flush truncates the
    tables can deadlock with it on PostgreSQL (seen in CI: an htmx preview request of the
    submit form in flight at the end of a test)."""

    def __init__(self, httpd) -> None:
        self.count = 0
        self.changed = threading.Condition()
        accept, serve = httpd.process_request, httpd.process_request_thread

        def process_request(request, client_address) -> None:
            with self.changed:
                self.count += 1
            try:
                accept(request, client_address)  # starts the thread that serves it
            except BaseException:
                self._done()
                raise

        def process_request_thread(request, client_address) -> None:
            try:
                serve(request, client_address)
            finally:
                self._done()

        httpd.process_request = process_request
        httpd.process_request_thread = process_request_thread

    def _done(self) -> None:
        with self.changed:
            self.count -= 1
            self.changed.notify_all()

    def wait_until_none(self, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.count <= 0, timeout)


@pytest.fixture(autouse=True)
def _no_request_left_at_the_flush(request):
    """For a test on the live server: set up after its database (so torn down before the
    flush) and after its pages are closed, wait (up to 10 s) until the server serves no
    connection any more."""
    if "live_server" not in request.fixturenames:
        yield
        return
    request.getfixturevalue("transactional_db")
    httpd = request.getfixturevalue("live_server").thread.httpd
    connections = getattr(httpd, "sluice_connections", None)
    if connections is None:
        connections = httpd.sluice_connections = _Connections(httpd)
    yield
    connections.wait_until_none(timeout=10.0)


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
