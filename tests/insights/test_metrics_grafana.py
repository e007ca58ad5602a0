"""docs/grafana/sluice-dashboard.json asks only for what /metrics exposes."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from insights import instrument, metrics
from scheduling.choices import JobState, ReclaimKind
from scheduling.models import Gpu, ReclaimRecord
from tests.insights.metrics_helpers import job, multiprocess_metrics, placed, sample, scrape

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "sluice-dashboard.json"
NAME = re.compile(r"\b(sluice_[a-z0-9_]+)")


def _panels(items):
    for panel in items:
        yield panel
        yield from _panels(panel.get("panels", []))


def _queries(dashboard) -> list[str]:
    found = [
        target["expr"]
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found.append(query["query"])
    return found


@pytest.fixture
def dashboard():
    return json.loads(DASHBOARD.read_text())


@pytest.fixture
def everything(world, tmp_path, monkeypatch, settings):
    """A cluster in which every family has samples, events included (in a tmp dir)."""
    with multiprocess_metrics(tmp_path, monkeypatch, settings):
        yield _fill(world)


def _fill(world):
    """Samples of every family in ``world``."""
    gpus = list(Gpu.objects.filter(node=world.nodes[0]).order_by("index"))
    placed(world, gpus[:2])
    sample(gpus[0], 60.0)
    sample(gpus[1], 1.0)
    job(
        world,
        pending_reason_code="WAITING_FOR_GPUS",
        submitted_at=timezone.now() - timedelta(hours=1),
    )
    job(world, state=JobState.FAILED, exit_code=2, preemption_count=1)
    ReclaimRecord.objects.create(
        created_at=timezone.now(), kind=ReclaimKind.IDLE_RECLAIM, tenant=world.tenant, gpus=1
    )
    instrument.dispatch_cycle_observe(0.05)
    instrument._observe_waits([(("training", "nlp", "nlp/train", "normal"), 30.0)])
    return world


def test_every_metric_the_dashboard_uses_is_exposed(dashboard, everything, client):
    exposed = {name for name, _labels in scrape(client)}
    used = {name for query in _queries(dashboard) for name in NAME.findall(query)}
    assert used, "the dashboard queries nothing"
    assert used - exposed == set()
    # And it shows every family of the database part.
    families = {n.removesuffix("_total") if k == "counter" else n for n, k, *_ in metrics.FAMILIES}
    shown = {n.removesuffix("_total") for n in used}
    assert families - shown == set()


def test_the_datasource_is_a_variable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in _panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_it_covers_what_the_issue_asks_for(dashboard):
    queries = " ".join(_queries(dashboard))
    assert (
        "histogram_quantile(0.95, sum by (le, queue) (rate(sluice_admission_wait_seconds_bucket"
        in queries
    )
    assert "histogram_quantile(0.50, sum by (le, queue)" in queries
    for name in (
        "sluice_pending_jobs",
        "sluice_allocated_gpus",
        "sluice_used_gpus",
        "sluice_gpu_utilization_percent",
        "sluice_jobs_finished_total",
        "sluice_job_preemptions_total",
        "sluice_reclaims_total",
        "sluice_reclaimed_gpu_hours_total",
        "sluice_dispatch_cycle_duration_seconds_bucket",
        "sluice_node_heartbeat_age_seconds",
    ):
        assert name in queries, name
    kinds = {panel["type"] for panel in _panels(dashboard["panels"])}
    assert {"timeseries", "heatmap", "table", "row"} <= kinds
    ids = [panel["id"] for panel in _panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))
