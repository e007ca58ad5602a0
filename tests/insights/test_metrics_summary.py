"""GET /api/v1/metrics/summary: pools' totals for everyone, queues scoped to the user."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from freezegun import freeze_time

from scheduling.choices import JobState, NodeState
from scheduling.models import Gpu, Node
from tests import factories as f
from tests.insights.metrics_helpers import job, placed, sample

URL = "/api/v1/metrics/summary"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def cluster(world):
    with freeze_time(NOW):
        gpus = list(Gpu.objects.filter(node=world.nodes[0]).order_by("index"))
        placed(world, gpus[0:2])  # nlp: one busy, one idle
        sample(gpus[0], 70.0)
        sample(gpus[1], 1.0)
        placed(world, gpus[2:3], queue=world.other_queue)  # vision: not sampled
        Node.objects.filter(pk=world.nodes[1].pk).update(state=NodeState.DOWN)
        job(
            world,
            gpus_per_node=2,
            pending_reason_code="WAITING_FOR_QUOTA",
            submitted_at=NOW - timedelta(minutes=30),
        )
        job(world, gpus_per_node=1, submitted_at=NOW - timedelta(minutes=5))
        job(world, state=JobState.HELD)
        job(
            world,
            queue=world.other_queue,
            pending_reason_code="WAITING_FOR_GPUS",
            submitted_at=NOW - timedelta(hours=3),
        )
        job(world, state=JobState.SUCCEEDED)
    return world


def summary(api, user):
    with freeze_time(NOW):
        response = api(user).get(URL)
    assert response.status_code == 200, response.content
    return response.json()


def test_pools_totals(api, cluster):
    body = summary(api, cluster.member)
    assert body["generated_at"].startswith("2026-12-01T12:00:00")
    [pool] = body["pools"]
    assert pool["name"] == "training"
    assert pool["gpus"] == {
        "total": 16,
        "allocated": 3,
        "used": 0.71,
        "idle": 1,
        "free": 5,
        "unavailable": 8,
    }
    assert pool["gpu_models"] == [{"gpu_model": "H100-80GB", **pool["gpus"]}]
    # Both tenants' jobs: totals are no tenant's secret.
    assert pool["jobs"] == {"pending": 3, "held": 1, "running": 2}


def test_queues_depth_and_longest_wait(api, cluster):
    body = summary(api, cluster.platform_admin)
    queues = {(q["tenant"], q["name"]): q for q in body["queues"]}
    assert set(queues) == {("nlp", "train"), ("vision", "train")}
    nlp = queues["nlp", "train"]
    assert nlp == {
        "id": cluster.queue.pk,
        "name": "train",
        "tenant": "nlp",
        "pool": "training",
        "depth": 2,
        "held": 1,
        "pending_gpus": 3,
        "running": 1,
        "longest_wait_seconds": 1800.0,
        "waiting_since": "2026-12-01T11:30:00Z",
        "reasons": {"NEW": 1, "WAITING_FOR_QUOTA": 1},
    }
    vision = queues["vision", "train"]
    assert (vision["depth"], vision["running"], vision["longest_wait_seconds"]) == (1, 1, 10800.0)
    assert vision["reasons"] == {"WAITING_FOR_GPUS": 1}


@pytest.mark.parametrize(
    "who, tenants",
    [
        ("platform_admin", {"nlp", "vision"}),
        ("tenant_admin", {"nlp"}),
        ("member", {"nlp"}),
        ("viewer", {"nlp"}),
        ("outsider", {"vision"}),
    ],
)
def test_queues_are_scoped_to_the_user(api, cluster, who, tenants):
    body = summary(api, getattr(cluster, who))
    assert {q["tenant"] for q in body["queues"]} == tenants
    assert body["pools"][0]["gpus"]["allocated"] == 3


def test_a_user_of_no_tenant_sees_pools_only(api, cluster):
    body = summary(api, f.UserFactory(username="loner"))
    assert body["queues"] == []
    assert body["pools"][0]["jobs"]["pending"] == 3


def test_anonymous_is_refused(api, cluster):
    response = api().get(URL)
    assert response.status_code in (401, 403)
    assert "detail" in response.json()


def test_trailing_slash_is_optional(api, cluster):
    assert api(cluster.member).get(URL + "/").status_code == 200


def test_query_count_does_not_grow_with_the_cluster(api, cluster, django_assert_num_queries):
    client = api(cluster.platform_admin)
    with CaptureQueriesContext(connection) as before:
        client.get(URL)
    node = f.NodeFactory(name="gpu-03", pool=cluster.pool)
    for i in range(8):
        f.GpuFactory(node=node, index=i)
    for _ in range(10):
        job(cluster, pending_reason_code="WAITING_FOR_GPUS")
    with django_assert_num_queries(len(before.captured_queries)):
        body = client.get(URL).json()
    assert body["pools"][0]["gpus"]["total"] == 24


def test_documented_in_the_schema(api, cluster):
    schema = api(cluster.member).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/v1/metrics/summary/"]["get"]
    ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/MetricsSummary"}
    for code in ("401", "403"):
        error = operation["responses"][code]["content"]["application/json"]["schema"]
        assert error == {"$ref": "#/components/schemas/Error"}
    components = schema["components"]["schemas"]
    assert {"pools", "queues", "generated_at"} <= set(components["MetricsSummary"]["properties"])
    queue = components["QueueSummary"]["properties"]
    assert {"depth", "longest_wait_seconds", "reasons"} <= set(queue)
