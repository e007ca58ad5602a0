"""The job page's GPU chart in headless Chromium: drawn with data, under the CSP, for a job
on 2 GPUs (a line per GPU) and on 8 (mean ± σ); a screenshot goes to SLUICE_SCREENSHOTS."""

from __future__ import annotations

import math
import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from insights.models import JobGpuSeries
from tests.insights.rollups_helpers import gpus_of, placed

pytestmark = pytest.mark.browser


def _series(job, gpus: int, hours: int = 3) -> None:
    """A run that starts busy and goes idle after two thirds (the owner should see it)."""
    start = int((timezone.now() - timedelta(hours=hours)).timestamp())
    points = []
    minutes = hours * 60
    for m in range(minutes):
        busy = m < minutes * 2 / 3
        util = [
            round(max(0.0, 85 + 8 * math.sin(m / 7 + g)) if busy else 1.0 + g / 10, 1)
            for g in range(gpus)
        ]
        mem = [(61000 if busy else 60000) + 500 * g for g in range(gpus)]
        points.append([start + 60 * m, util, mem])
    allocated = gpus * minutes * 60.0
    used = sum(sum(p[1]) for p in points) / 100 * 60
    JobGpuSeries.objects.create(
        job=job,
        gpus=[f"gpu-01:{i}" for i in range(gpus)],
        points=points,
        allocated_gpu_seconds=allocated,
        used_gpu_seconds=used,
    )


def _drawn(page) -> dict:
    return page.evaluate(
        """() => {
        const canvas = document.querySelector("#job-gpu-chart");
        const chart = canvas && window.Chart && window.Chart.getChart(canvas);
        return {drawn: !!canvas && canvas.dataset.chartDrawn === "1",
                datasets: chart ? chart.data.datasets.length : 0,
                points: chart ? chart.data.datasets[0].data.filter((v) => v !== null).length : 0};
      }"""
    )


@pytest.mark.parametrize(("gpus", "datasets"), [(2, 4), (8, 4)])
def test_job_gpu_chart_draws(world, page, log_in, gpus, datasets):
    job = placed(
        world,
        gpus_of(world.nodes[0])[:gpus],
        granted_at=timezone.now() - timedelta(hours=3),
        name=f"bert-{gpus}gpu",
    )
    _series(job, gpus)
    page.set_viewport_size({"width": 1280, "height": 900})
    log_in("nlp-member")
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#gpu-usage-summary")).to_contain_text(f"{gpus} GPUs held for 3 h")
    expect(page.locator("#gpu-usage-summary")).to_contain_text(
        "partly used; idle (below 5 %) for the last 1 h"
    )
    page.wait_for_function(
        "() => document.querySelector('#job-gpu-chart').dataset.chartDrawn === '1'"
    )
    assert _drawn(page) == {"drawn": True, "datasets": datasets, "points": 180}
    errors = [m for m in page.console_messages if "error" in m.lower()]
    assert not errors, errors
    folder = os.environ.get("SLUICE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.locator("#gpu-usage").screenshot(path=str(Path(folder) / f"job-gpu-chart-{gpus}.png"))
