"""The service page's advice names the limit that holds replicas back, and says how the
p95 against the SLO was obtained."""

from datetime import timedelta

import pytest
from django.utils import timezone

from inference.models import Service
from scheduling.choices import JobState
from tests.inference.factories import ScaleDecisionFactory, replica

pytestmark = pytest.mark.usefixtures("dispatch_requests")


def _page(client, user, service) -> str:
    client.force_login(user)
    return client.get(f"/services/{service.pk}/").content.decode()


def _near(service, code="", message=""):
    Service.objects.filter(pk=service.pk).update(
        near_capacity=True,
        desired_replicas=4,
        max_replicas=4,
        blocked_reason_code=code,
        blocked_reason_message=message,
    )


def test_waiting_replicas_are_not_told_to_raise_max_replicas(client, world, service):
    """Two of four wanted replicas wait behind jobs ahead of them: the advice names that,
    not max replicas."""
    for _ in range(2):
        replica(service, state=JobState.RUNNING, ready=True)
    for _ in range(2):
        replica(service)
    _near(service, "RESERVED_FOR_HIGHER_PRIORITY", "promised to jobs ahead of it")
    html = _page(client, world.member, service)
    assert "raise max replicas" not in html
    assert "jobs ahead of the replicas in the pool&#x27;s priority order" in html
    assert "4 replicas, 2 ready" in html
    assert "a higher priority class for its serve queues, or a pool of their own" in html


def test_replicas_waiting_for_quota_get_the_quota_link(client, world, service):
    replica(service)
    _near(service, "WAITING_FOR_QUOTA", "At quota")
    html = _page(client, world.member, service)
    assert "raise max replicas" not in html
    assert "held back by the tenant&#x27;s quota" in html
    assert f"/quotas/{service.tenant.slug}" in html or "quotas</a>" in html


def test_every_wanted_replica_running_at_max_is_told_to_raise_it(client, world, service):
    for _ in range(4):
        replica(service, state=JobState.RUNNING, ready=True)
    _near(service)
    html = _page(client, world.member, service)
    assert "held back by max replicas (4)" in html and "raise max replicas" in html


def test_the_page_says_how_the_p95_was_obtained(client, world, service):
    ScaleDecisionFactory(
        service=service,
        at=timezone.now() - timedelta(seconds=5),
        inputs={
            "p95_ms": 242.5,
            "p95_bucket_ms": [100.0, 250.0],
            "p95_method": "interpolated",
            "p95_words": "p95 ≈ 242 ms, interpolated inside the bucket 100–250 ms that "
            "holds the SLO 200 ms",
        },
    )
    html = _page(client, world.viewer, service)
    assert 'id="latency-method"' in html
    assert "interpolated inside the bucket 100–250 ms" in html
    assert "SERVE_LATENCY_SLO_SECONDS" in html
