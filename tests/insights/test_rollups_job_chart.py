"""The job page's GPU chart (``{% job_gpu_chart job %}``) from the writer's series."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.urls import reverse

from insights.models import JobGpuSeries
from insights.services.rollups import rollup_write
from insights.templatetags.insights_jobs import chart_config, usage_summary, usage_verdict
from scheduling.choices import JobState

from .rollups_helpers import T0, at, gpus_of, pending, placed, sample

pytestmark = pytest.mark.django_db


def page(client, user, job) -> str:
    client.force_login(user)
    response = client.get(reverse("job-detail", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def chart_json(html: str, job) -> dict:
    marker = f'<script id="job-gpu-chart-{job.pk}" type="application/json">'
    start = html.index(marker) + len(marker)
    return json.loads(html[start : html.index("</script>", start)])


def test_a_running_job_shows_its_gpus_and_whether_they_are_used(world, client):
    g = gpus_of(world.nodes[0])
    for gpu, util in zip(g[:2], (10.0, 4.0), strict=True):
        sample(gpu, util, 2048, sampled_at=T0 - timedelta(seconds=5))
    job = placed(world, g[:2], granted_at=at(10, 0))
    rollup_write(now=T0)  # [10:04, 10:05): 2 GPUs × 60 s, 7 % used
    for minute in range(1, 3):
        rollup_write(now=T0 + timedelta(minutes=minute))

    html = page(client, world.member, job)

    assert 'id="gpu-usage"' in html
    assert "2 GPUs held for 3 min, used 7 % on average — mostly idle." in html
    assert "vendor/chartjs/chart.umd.min.js" in html
    config = chart_json(html, job)
    labels = [d["label"] for d in config["data"]["datasets"]]
    assert labels == [
        "gpu-01:0 utilization",
        "gpu-01:0 memory",
        "gpu-01:1 utilization",
        "gpu-01:1 memory",
    ]
    assert config["data"]["datasets"][0]["data"] == [10.0, 10.0, 10.0]
    assert config["data"]["datasets"][1]["data"] == [2.0, 2.0, 2.0]  # GiB
    assert config["data"]["labels"] == ["10:05", "10:06", "10:07"]
    # Outside the part htmx swaps every 2 s.
    assert html.index('id="gpu-usage"') > html.index('id="job-live"')


def test_many_gpus_are_drawn_as_mean_and_band(world):
    series = JobGpuSeries(
        job_id=1,
        gpus=[f"n:{i}" for i in range(8)],
        points=[[0, [10, 20, 30, 40, 50, 60, 70, 80], [1024] * 8], [60, [None] * 8, [None] * 8]],
        allocated_gpu_seconds=8 * 3600 * 3,
        used_gpu_seconds=8 * 3600 * 3 * 0.12,
    )
    config = chart_config(series)
    datasets = {d["label"]: d["data"] for d in config["data"]["datasets"]}
    assert datasets["mean utilization of 8 GPUs"] == [45.0, None]
    assert datasets["mean + 1 σ"][0] == pytest.approx(45 + 22.9, abs=0.1)
    assert datasets["mean memory"] == [1.0, None]
    summary, verdict, _ = usage_summary(series, 8)
    assert summary == "8 GPUs held for 3 h, used 12 % on average — mostly idle."


def test_the_sentence_says_how_long_the_gpus_have_been_idle():
    points = [[60 * m, [90.0, 80.0] if m < 30 else [1.0, None], [1, 1]] for m in range(60)]
    series = JobGpuSeries(
        job_id=1,
        gpus=["n:0", "n:1"],
        points=points,
        allocated_gpu_seconds=2 * 3600,
        used_gpu_seconds=2 * 3600 * 0.43,
    )
    summary, verdict, _ = usage_summary(series, 2, threshold=5.0)
    assert summary == (
        "2 GPUs held for 1 h, used 43 % on average — partly used; "
        "idle (below 5 %) for the last 30 min."
    )
    assert usage_summary(series, 2, threshold=1.0)[0].endswith("partly used.")


@pytest.mark.parametrize(
    ("percent", "verdict"),
    [
        (0, "idle"),
        (4.9, "idle"),
        (5, "mostly idle"),
        (29, "mostly idle"),
        (50, "partly used"),
        (70, "well used"),
    ],
)
def test_usage_verdicts(percent, verdict):
    assert usage_verdict(percent) == verdict


def test_a_job_that_never_ran_shows_nothing(world, client):
    job = pending(world)
    html = page(client, world.member, job)
    assert 'id="gpu-usage"' not in html


def test_a_job_that_ran_without_samples_says_so(world, client):
    job = pending(
        world,
        state=JobState.SUCCEEDED,
        admitted_at=at(9, 0),
        started_at=at(9, 0),
        finished_at=at(10, 0),
    )
    html = page(client, world.member, job)
    assert "No GPU samples were recorded for this run." in html
    assert "data-chart" not in html


def test_other_tenants_job_page_is_still_404(world, client):
    job = placed(world, gpus_of(world.nodes[1])[:1], granted_at=at(10, 0), queue=world.other_queue)
    client.force_login(world.member)
    assert client.get(reverse("job-detail", args=[job.pk])).status_code == 404
