"""The insights page in headless Chromium: every chart is drawn with data, as a tenant admin
and as a platform admin, with no console error (a CSP violation would be one); screenshots
of the page and of the nodes page's per-pool summary go to docs/screenshots when
SLUICE_SCREENSHOTS names a folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.utils import timezone

from tests.insights import insights_helpers as h

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 1280, "height": 900}


def _shoot(page, name: str, full_page: bool = True) -> None:
    folder = os.environ.get("SLUICE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name), full_page=full_page)


def _charts_drawn(page) -> dict:
    """Per canvas id: drawn by charts.js, and the number of points of its datasets."""
    return page.evaluate(
        """() => {
        const found = {};
        for (const canvas of document.querySelectorAll("canvas[data-chart]")) {
          const chart = window.Chart && window.Chart.getChart(canvas);
          const points = chart ? chart.data.datasets.reduce(
            (n, d) => n + d.data.filter((v) => v !== null && v !== 0).length, 0) : 0;
          found[canvas.dataset.chart] = {drawn: canvas.dataset.chartDrawn === "1", points};
        }
        return found;
      }"""
    )


def _errors(page) -> list[str]:
    return [m for m in page.console_messages if "error" in m.lower() or "refused" in m.lower()]


@pytest.mark.parametrize(
    ("username", "expected", "absent"),
    [
        ("nlp-admin", {"chart-wait", "chart-depth", "chart-tenants", "chart-idle"}, "vision/"),
        ("root", {"chart-wait", "chart-depth", "chart-tenants", "chart-idle"}, None),
    ],
)
def test_insights_charts_render_with_data(world, page, log_in, username, expected, absent):
    h.rich_history(world, timezone.now())
    page.set_viewport_size(VIEWPORT)
    log_in(username)

    page.click("#nav-insights")
    page.wait_for_selector("canvas[data-chart-drawn='1']")

    charts = _charts_drawn(page)
    assert expected | {"chart-fail-project", "chart-fail-type", "chart-recovery"} <= set(charts)
    assert any(key.startswith("chart-pool-") for key in charts)
    for key, chart in charts.items():
        assert chart["drawn"] and chart["points"] > 0, (key, chart)
    assert page.evaluate("Object.keys(window.Chart.instances).length") == len(charts)
    if absent:
        assert absent not in page.inner_text("main")
    assert not _errors(page), page.console_messages
    _shoot(page, f"insights-{'tenant-admin' if username == 'nlp-admin' else 'platform-admin'}.png")

    page.click("#period-24h")
    page.wait_for_url("**/insights/?period=24h")
    # hour rows only: the 24 h view reads them (no minute rows reach back a day) and says so
    assert "nlp/train" in page.inner_text("#table-waits")
    assert "hourly history" in page.inner_text("main")
    assert page.locator("#period-24h.active").count() == 1
    assert not _errors(page), page.console_messages


def test_nodes_summary_in_the_browser(world, page, log_in):
    h.rich_history(world, timezone.now())
    page.set_viewport_size(VIEWPORT)
    log_in("root")

    page.goto("/nodes/")
    page.wait_for_selector("#pool-summary")

    assert page.locator("#pool-summary tbody tr").count() == 2
    assert not _errors(page), page.console_messages
    folder = os.environ.get("SLUICE_SCREENSHOTS")
    if folder:
        page.locator("#pool-summary").screenshot(path=str(Path(folder) / "nodes-summary.png"))
