"""``/api/v1/services/``: the permission matrix, validation 400s, endpoints and decisions."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inference.choices import ServiceState
from inference.models import Service
from scheduling.choices import JobState
from tests.inference.factories import ScaleDecisionFactory, ServiceFactory, replica, set_job

pytestmark = pytest.mark.usefixtures("dispatch_requests")

URL = "/api/v1/services/"


def _body(world, serving, **overrides):
    body = {
        "project": world.project.pk,
        "queue": serving.queue.pk,
        "name": "chat",
        "command": ["python", "-m", "server"],
        "min_replicas": 1,
        "max_replicas": 3,
        "target_running_per_replica": 8,
        "latency_slo_ms": 300,
    }
    body.update(overrides)
    return body


@pytest.mark.parametrize(
    ("who", "status"),
    [
        ("platform_admin", 201),
        ("tenant_admin", 201),
        ("member", 201),
        ("viewer", 403),
        ("outsider", 404),
    ],
)
def test_create_matrix(api, world, serving, who, status):
    response = api(getattr(world, who)).post(URL, _body(world, serving), format="json")
    assert response.status_code == status, response.json()
    if status == 201:
        data = response.json()
        assert data["name"] == "chat" and data["tenant"] == "nlp" and data["pool"] == "inference"
        assert data["replicas"] == 0 and data["state"] == "active" and data["spec_version"] == 1
        assert Service.objects.get(pk=data["id"]).created_by == getattr(world, who)
    else:
        assert not Service.objects.exists()


@pytest.mark.parametrize(
    ("who", "read", "write"),
    [
        ("platform_admin", 200, 200),
        ("tenant_admin", 200, 200),
        ("member", 200, 200),
        ("viewer", 200, 403),
        ("outsider", 404, 404),
    ],
)
def test_read_and_write_matrix(api, world, service, who, read, write):
    client = api(getattr(world, who))
    detail = f"{URL}{service.pk}/"
    assert client.get(detail).status_code == read
    assert client.get(f"{detail}endpoints").status_code == read
    assert client.get(f"{detail}decisions").status_code == read
    assert client.patch(detail, {"max_replicas": 5}, format="json").status_code == write
    assert client.post(f"{detail}pause", {}, format="json").status_code == write
    assert client.post(f"{detail}resume", {}, format="json").status_code == write
    delete = client.delete(detail).status_code
    assert delete == (204 if write == 200 else write)


def test_list_is_scoped_and_filtered(api, world, serving, service):
    theirs = ServiceFactory(
        queue=serving.other_queue, project=world.other_project, created_by=world.outsider
    )
    ServiceFactory(
        queue=serving.queue,
        project=world.project,
        created_by=world.member,
        name="gone",
        state=ServiceState.DELETED,
    )
    ids = [s["id"] for s in api(world.viewer).get(URL).json()["results"]]
    assert ids == [service.pk]
    ids = {s["id"] for s in api(world.platform_admin).get(URL).json()["results"]}
    assert ids == {service.pk, theirs.pk}
    ids = [
        s["id"] for s in api(world.platform_admin).get(URL, {"tenant": "vision"}).json()["results"]
    ]
    assert ids == [theirs.pk]
    assert api(world.member).get(f"{URL}{theirs.pk}/").status_code == 404
    assert api(world.member).get(f"{URL}abc/").status_code == 404


def test_list_query_count_does_not_grow_with_services(api, world, serving):
    def count():
        client = api(world.member)
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(URL).status_code == 200
        return len(ctx)

    ServiceFactory(queue=serving.queue, project=world.project, created_by=world.member)
    one = count()
    for _ in range(5):
        s = ServiceFactory(queue=serving.queue, project=world.project, created_by=world.member)
        replica(s, state=JobState.RUNNING, ready=True)
    assert count() == one


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"min_replicas": 4, "max_replicas": 2}, "min_replicas"),
        ({"max_replicas": 0}, "max_replicas"),
        ({"target_running_per_replica": 0}, "target_running_per_replica"),
        ({"target_running_per_replica": -1}, "target_running_per_replica"),
        ({"latency_slo_ms": 0}, "latency_slo_ms"),
        ({"error_rate_max": 2}, "error_rate_max"),
        ({"panic_window_s": 60, "stable_window_s": 30}, "panic_window_s"),
        ({"panic_threshold": 1}, "panic_threshold"),
        ({"name": "Not A Slug"}, "name"),
        ({"command": []}, "command"),
        ({"command": "python server.py"}, "command"),
        ({"health_path": "health"}, "health_path"),
        ({"min_replicas": 0}, "min_replicas"),
        ({"gpus_per_node": 16}, "gpus_per_node"),
        ({"priority_class": "nope"}, "priority_class"),
        ({"env": {"PORT": "1"}}, "env"),
    ],
)
def test_validation_400_names_the_field(api, world, serving, overrides, field):
    response = api(world.member).post(URL, _body(world, serving, **overrides), format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["errors"], response.json()


def test_others_project_or_queue_is_404(api, world, serving):
    client = api(world.member)
    body = _body(world, serving, project=world.other_project.pk)
    assert client.post(URL, body, format="json").status_code == 404
    body = _body(world, serving, queue=serving.other_queue.pk)
    assert client.post(URL, body, format="json").status_code == 404


def test_patch_changes_the_spec_version_and_checks_combined_bounds(api, world, service):
    client = api(world.member)
    detail = f"{URL}{service.pk}/"
    response = client.patch(detail, {"command": ["serve", "--v2"]}, format="json")
    assert response.status_code == 200 and response.json()["spec_version"] == 2
    response = client.patch(detail, {"min_replicas": 9}, format="json")
    assert response.status_code == 400 and "min_replicas" in response.json()["errors"]
    response = client.patch(detail, {"project": 1, "name": "x"}, format="json")
    # Not changeable: refused and named, never silently dropped.
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"project", "name"}
    service.refresh_from_db()
    assert service.name == "chat"


def test_endpoints_list_host_port_and_readiness(api, world, serving, service):
    from tests import factories as f

    ready = replica(service, state=JobState.RUNNING, ready=True, port=31001)
    f.AllocationFactory(job=ready.job, gpu=serving.node.gpus.first())
    waiting = replica(service)
    set_job(waiting, pending_reason_code="WAITING_FOR_GPUS")
    rows = api(world.viewer).get(f"{URL}{service.pk}/endpoints").json()
    assert rows == [
        {
            "replica": ready.pk,
            "job": ready.job_id,
            "spec_version": 1,
            "state": "RUNNING",
            "node": "gpu-infer-01",
            "host": "infer01.example.com",
            "port": 31001,
            "ready": True,
            "pending_reason_code": "",
        },
        {
            "replica": waiting.pk,
            "job": waiting.job_id,
            "spec_version": 1,
            "state": "PENDING",
            "node": None,
            "host": None,
            "port": None,
            "ready": False,
            "pending_reason_code": "WAITING_FOR_GPUS",
        },
    ]


def test_decisions_newest_first(api, world, service):
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    old = ScaleDecisionFactory(service=service, at=now - timedelta(minutes=1), desired=1)
    new = ScaleDecisionFactory(
        service=service,
        at=now,
        desired=3,
        reason_code="panic",
        blocked_reason_code="WAITING_FOR_QUOTA",
        blocked_reason_message="At quota",
    )
    data = api(world.viewer).get(f"{URL}{service.pk}/decisions").json()
    assert [d["id"] for d in data["results"]] == [new.pk, old.pk]
    assert data["results"][0]["blocked_reason_code"] == "WAITING_FOR_QUOTA"


def test_the_schema_documents_the_services(api, world):
    response = api(world.member).get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "/api/v1/services/{id}/endpoints" in paths or "/api/v1/services/{id}/endpoints/" in paths
    assert any(p.startswith("/api/v1/services/") for p in paths)
