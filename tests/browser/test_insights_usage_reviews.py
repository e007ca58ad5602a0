"""The usage page and the weekly policy review in headless Chromium, as a tenant admin and
as a platform admin, on the demo with a month of usage and a fortnight of policy events.
The chart must be drawn; screenshots go to $SLUICE_SCREENSHOTS (docs/screenshots), else a
temporary folder."""

from __future__ import annotations

import datetime as dt
import io
import os
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from insights import reviews
from insights.services import reviews as review_services
from tests.insights.rollups_helpers import without_backfilled_history
from tests.insights.usage_helpers import demo_fortnight, demo_usage

pytestmark = pytest.mark.browser

DEMO_PASSWORD = "sluice-demo-2026"
VIEWPORT = {"width": 1280, "height": 900}


def test_usage_and_review_pages(browser, live_server, transactional_db, tmp_path):
    call_command("seed_demo", stdout=io.StringIO())
    without_backfilled_history()
    now = timezone.now()
    demo_usage(today=now.date())
    week = reviews.last_completed_week(now)
    demo_fortnight(week)
    review_services.policy_review_write(week_start=week - dt.timedelta(days=7))
    review_services.policy_review_write(week_start=week)
    out = Path(os.environ.get("SLUICE_SCREENSHOTS") or tmp_path / "shots")
    out.mkdir(parents=True, exist_ok=True)
    shots = [
        (
            "nlp-admin",
            "/usage/?group_by=project&group_by=user&group_by=workload_type",
            "usage-tenant-admin",
        ),
        ("admin", "/usage/?group_by=tenant&group_by=pool", "usage-platform-admin"),
        ("nlp-admin", f"/reviews/{week:%Y-%m-%d}/", "review-tenant-admin"),
        ("admin", f"/reviews/{week:%Y-%m-%d}/", "review-platform-admin"),
        ("admin", "/reviews/", "reviews-list"),
    ]
    for username, url, name in shots:
        context = browser.new_context(base_url=live_server.url, viewport=VIEWPORT)
        page = context.new_page()
        errors: list[str] = []
        page.on(
            "console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None
        )
        page.goto("/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", DEMO_PASSWORD)
        page.click("button[type=submit]:has-text('Log in')")
        page.wait_for_url(lambda u: "/login/" not in u)
        response = page.goto(url)
        assert response.status == 200, (url, response.status)
        if name.startswith("usage"):
            page.wait_for_selector("canvas[data-chart-drawn='1']")
            assert page.locator("#usage-table tbody tr").count() > 3
            if username == "nlp-admin":
                assert "vision" not in page.locator("#usage-table").inner_text()
            # the Download CSV link works with the page's session
            csv = page.request.get(page.locator("#usage-csv").get_attribute("href"))
            assert csv.status == 200 and csv.headers["content-type"].startswith("text/csv")
            lines = csv.text().splitlines()
            assert lines[0].startswith("tenant,") and lines[-1].startswith("total,")
        if name.startswith("review-"):
            assert page.locator("#review-verdict").count() == 1
        page.screenshot(path=str(out / f"{name}.png"), full_page=True)
        context.close()
        assert not errors, (url, errors)
