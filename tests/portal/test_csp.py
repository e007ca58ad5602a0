"""The Content-Security-Policy header (django-csp), and pages that need no exception to it."""

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from portal.templatetags.sluice_tags import pct

STRICT = {
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "object-src 'none'",
    "base-uri 'self'",
    "frame-ancestors 'none'",
    "form-action 'self'",
}
TEMPLATES = Path(settings.BASE_DIR) / "templates"
# What the policy refuses in a page: inline styles and scripts, inline event handlers,
# javascript: URLs, htmx's inline handlers (hx-on).
INLINE = re.compile(
    r"""style\s*=|<style|<script(?![^>]*\ssrc=)[^>]*>|\son[a-z]+\s*=|javascript:|hx-on""",
    re.IGNORECASE,
)


def policy_of(response) -> set[str]:
    return set(response["Content-Security-Policy"].split("; "))


def test_every_page_carries_the_strict_policy(db):
    response = Client().get("/login/")

    assert response.status_code == 200
    assert policy_of(response) == STRICT
    assert "Content-Security-Policy-Report-Only" not in response


def test_pages_load_htmx_without_its_inline_indicator_style(world):
    client = Client()
    client.force_login(world.member)

    page = client.get("/").content.decode()

    assert """<meta name="htmx-config" content='{"includeIndicatorStyles": false}'>""" in page
    assert re.search(r'<script src="/static/js/sluice\.js" defer></script>', page)


@pytest.mark.parametrize(
    "template", sorted(TEMPLATES.rglob("*.html")), ids=lambda p: str(p.relative_to(TEMPLATES))
)
def test_no_template_has_inline_script_style_or_handlers(template):
    found = [m.group(0) for m in INLINE.finditer(template.read_text())]

    assert found == [], f"{template}: move these to static/ (the CSP refuses them): {found}"


def test_the_api_docs_need_no_exception_to_the_policy(world):
    client = Client()
    client.force_login(world.member)

    page = client.get("/api/docs/")
    script = client.get("/api/docs/", {"script": ""})

    assert page.status_code == 200
    assert policy_of(page) == STRICT
    html = page.content.decode()
    assert not INLINE.search(html), INLINE.search(html).group(0)
    assert 'src="/api/docs/?script="' in html
    assert "/static/css/api_docs.css" in html
    assert script.status_code == 200
    assert script["Content-Type"].startswith("application/javascript")
    assert "SwaggerUIBundle(" in script.content.decode()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, 0),
        ("", 0),
        (0, 0),
        (0.4, 0),
        (0.5, 1),
        (33.33, 33),
        ("58", 58),
        (99.6, 100),
        (150, 100),
        (-3, 0),
        (float("nan"), 0),
        (float("inf"), 100),
    ],
)
def test_pct_gives_the_whole_percent_of_a_width_class(value, expected):
    assert pct(value) == expected
