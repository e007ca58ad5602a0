"""Load every page of a running Sluice as each demo role, the way a browser would.

    python tools/check_production_pages.py --base-url http://127.0.0.1:8000

For a server started as production starts it (DEBUG=0, after `manage.py collectstatic`, the
demo seeded): anonymously it loads the login page and a missing page; then it signs in
through the login form as each user (`--users`, the demo's roles by default) and follows
every link of the site from the dashboard, GET only, never the API (its docs page aside),
the admin's internals or sign-out. Every static file a page names is fetched too. It fails
(exit 1) on any 5xx, a static file that does not load, a page without the site's CSS, a
failed sign-in, or a role that reached too few pages; it prints what it found.

It speaks plain HTTP and says it came through a TLS proxy (X-Forwarded-Proto: https), as
production's proxy does, so DEBUG=0's HTTPS redirects and secure cookies apply unchanged.
Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from http.cookies import SimpleCookie

DEMO_USERS = ("admin", "nlp-admin", "nlp-member", "nlp-viewer")
DEMO_PASSWORD = "sluice-demo-2026"  # seed_demo's
LINK = re.compile(r"""<a\b[^>]*\bhref\s*=\s*["']([^"'#]+)""", re.I)
STATIC = re.compile(r"""(?:href|src)\s*=\s*["']([^"']*/static/[^"']+)["']""", re.I)
CSRF_INPUT = re.compile(r"""name=["']csrfmiddlewaretoken["'][^>]*value=["']([^"']+)""")
SKIPPED = ("/logout/", "/api/", "/admin/", "/static/", "/metrics")
PAGES_UNDER_SKIPPED = ("/api/docs/", "/admin/")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


class Browser:
    """GET and POST with cookies kept by hand: the portal's cookies are Secure, which
    urllib's cookie jar would not send over the proxy's plain HTTP."""

    def __init__(self, base_url: str, timeout: float) -> None:
        self.base = base_url.rstrip("/")
        self.host = urllib.parse.urlsplit(self.base).netloc
        self.cookies: dict[str, str] = {}
        self.timeout = timeout
        self.opener = urllib.request.build_opener(_NoRedirect)

    def request(self, path: str, data: dict | None = None) -> tuple[int, dict, bytes]:
        headers = {
            "X-Forwarded-Proto": "https",
            "User-Agent": "sluice-check-production-pages",
            "Accept": "text/html,*/*",
        }
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if data is not None:
            body = urllib.parse.urlencode(data).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            headers["Origin"] = f"https://{self.host}"
            headers["Referer"] = f"https://{self.host}{path}"
        req = urllib.request.Request(self.base + path, data=body, headers=headers)
        try:
            with self.opener.open(req, timeout=self.timeout) as response:
                status, got, content = response.status, response.headers, response.read()
        except urllib.error.HTTPError as error:
            status, got, content = error.code, error.headers, error.read()
        for header in got.get_all("Set-Cookie") or []:
            for name, morsel in SimpleCookie(header).items():
                if morsel.value:
                    self.cookies[name] = morsel.value
                else:
                    self.cookies.pop(name, None)
        return status, dict(got.items()), content

    def log_in(self, username: str, password: str) -> str | None:
        """Signs in through the login form; returns what went wrong, or None."""
        status, _, body = self.request("/login/")
        if status != 200:
            return f"GET /login/ answered {status}"
        token = CSRF_INPUT.search(body.decode(errors="replace"))
        if token is None:
            return "the login page has no CSRF token"
        status, headers, _ = self.request(
            "/login/",
            {"csrfmiddlewaretoken": token.group(1), "username": username, "password": password},
        )
        if status != 302 or "sessionid" not in self.cookies:
            return f"sign-in as {username} failed (POST /login/ answered {status})"
        return None


def same_site_path(href: str, current: str, host: str) -> str | None:
    """The site path a link points to (query kept), or None for another site."""
    split = urllib.parse.urlsplit(urllib.parse.urljoin(f"https://{host}{current}", href))
    if split.netloc != host or split.scheme not in ("http", "https"):
        return None
    return split.path + (f"?{split.query}" if split.query else "")


def wanted(path: str) -> bool:
    bare = path.split("?", 1)[0]
    if bare in PAGES_UNDER_SKIPPED:
        return True
    return not bare.startswith(SKIPPED) and not bare.endswith((".csv", ".json"))


class Checker:
    def __init__(self, browser: Browser, who: str, static_seen: dict[str, int]) -> None:
        self.browser, self.who = browser, who
        self.static_seen = static_seen  # shared: each static file fetched once
        self.problems: list[str] = []
        self.pages_ok = 0

    def check_page(self, path: str, expect: int | None = None) -> str:
        status, headers, body = self.browser.request(path)
        where = f"{self.who} GET {path}"
        if status >= 500:
            self.problems.append(f"{where}: {status}")
            return ""
        if expect is not None and status != expect:
            self.problems.append(f"{where}: {status}, expected {expect}")
        if not headers.get("Content-Type", "").startswith("text/html") or status >= 300:
            return ""
        html = body.decode(errors="replace")
        refs = set(STATIC.findall(html))
        if "<html" in html and not any(ref.endswith(".css") for ref in refs):
            self.problems.append(f"{where}: names no stylesheet")
        for ref in sorted(refs):
            if ref not in self.static_seen:
                self.static_seen[ref] = self.browser.request(ref)[0]
            if self.static_seen[ref] != 200:
                self.problems.append(f"{where}: {ref} answered {self.static_seen[ref]}")
        self.pages_ok += status == 200
        return html

    def crawl(self, start: str, limit: int) -> None:
        """Follows the site's links breadth first; one visit per path (queries aside)."""
        queue, seen = deque([start]), {start.split("?", 1)[0]}
        while queue and len(seen) <= limit:
            path = queue.popleft()
            html = self.check_page(path)
            for href in LINK.findall(html):
                target = same_site_path(href, path, self.browser.host)
                if target is None or not wanted(target):
                    continue
                key = target.split("?", 1)[0]
                if key not in seen:
                    seen.add(key)
                    queue.append(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--users", default=",".join(DEMO_USERS), help="comma-separated")
    parser.add_argument("--password", default=DEMO_PASSWORD)
    parser.add_argument("--min-pages", type=int, default=15, help="pages each user must reach")
    parser.add_argument("--limit", type=int, default=400, help="most pages per user")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    args = parser.parse_args(argv)

    static_seen: dict[str, int] = {}
    problems: list[str] = []
    anonymous = Checker(Browser(args.base_url, args.timeout), "anonymous", static_seen)
    anonymous.check_page("/login/", expect=200)
    anonymous.check_page("/no-such-page/", expect=404)
    problems += anonymous.problems
    for username in [u.strip() for u in args.users.split(",") if u.strip()]:
        browser = Browser(args.base_url, args.timeout)
        failed = browser.log_in(username, args.password)
        if failed:
            problems.append(failed)
            continue
        checker = Checker(browser, username, static_seen)
        checker.crawl("/", args.limit)
        checker.check_page("/no-such-page/", expect=404)
        problems += checker.problems
        print(f"{username}: {checker.pages_ok} pages loaded")
        if checker.pages_ok < args.min_pages:
            problems.append(f"{username}: only {checker.pages_ok} pages (< {args.min_pages})")
    print(f"static files: {len(static_seen)} fetched")
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    if problems:
        return 1
    print("every page loaded, every static file served")
    return 0


if __name__ == "__main__":
    sys.exit(main())
