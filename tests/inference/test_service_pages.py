"""The services' pages: list (near capacity flagged), detail (charts, endpoints,
decisions), the form with field errors, pause / resume / delete; 404 for outsiders."""

from datetime import timedelta

import pytest
from django.utils import timezone

from inference.choices import ServiceState
from inference.models import Service
from scheduling.choices import JobState
from tests.inference.factories import ScaleDecisionFactory, ServiceFactory, replica

pytestmark = pytest.mark.usefixtures("dispatch_requests")


@pytest.fixture
def login(client):
    def as_(user):
        client.force_login(user)
        return client

    return as_


@pytest.mark.parametrize(
    ("who", "status"),
    [
        ("platform_admin", 200),
        ("tenant_admin", 200),
        ("member", 200),
        ("viewer", 200),
        ("outsider", 404),
    ],
)
def test_detail_for_members_404_for_outsiders(login, world, service, who, status):
    response = login(getattr(world, who)).get(f"/services/{service.pk}/")
    assert response.status_code == status
    list_page = login(getattr(world, who)).get("/services/")
    assert list_page.status_code == 200
    assert (f"/services/{service.pk}/" in list_page.content.decode()) == (status == 200)


def test_list_flags_near_capacity(login, world, service):
    Service.objects.filter(pk=service.pk).update(
        near_capacity=True,
        blocked_reason_code="WAITING_FOR_QUOTA",
        blocked_reason_message="At quota: nlp uses 4/4 guaranteed",
    )
    html = login(world.member).get("/services/").content.decode()
    assert 'id="near-capacity-count"' in html and "1 service near capacity" in html
    assert "near capacity</span>" in html and "WAITING_FOR_QUOTA" in html
    assert 'id="nav-services"' in html


def test_detail_shows_charts_endpoints_and_decisions(login, world, service):
    Service.objects.filter(pk=service.pk).update(latency_slo_ms=250)
    replica(service, state=JobState.RUNNING, ready=True, port=31000)
    now = timezone.now()
    for i in range(3):
        ScaleDecisionFactory(
            service=service,
            at=now - timedelta(seconds=30 * (3 - i)),
            current=1 + i,
            desired=2 + i,
            reason_code="panic",
            reason=f"panic number {i}",
            inputs={"stable_concurrency": 8.0 + i, "p95_ms": 300.0, "error_rate": 0.01},
        )
    html = login(world.viewer).get(f"/services/{service.pk}/").content.decode()
    for chart in ("chart-replicas", "chart-load", "chart-latency", "chart-errors"):
        assert f'id="{chart}"' in html and f'data-chart="{chart}"' in html
    assert '"SLO"' in html and "panic number 2" in html
    assert "31000" in html
    assert 'id="service-edit"' not in html  # a viewer gets no buttons
    member_html = login(world.member).get(f"/services/{service.pk}/").content.decode()
    assert 'id="service-edit"' in member_html and 'id="service-pause"' in member_html


def test_requests_per_second_have_their_own_axis(world, service):
    from inference.views import service_charts

    decision = ScaleDecisionFactory(
        service=service,
        current=2,
        desired=2,
        inputs={"stable_concurrency": 3.0, "request_rate": 60.0},
    )
    load = service_charts(service, [decision])["load"]
    by_label = {ds["label"]: ds for ds in load["data"]["datasets"]}
    assert by_label["requests/s (right axis)"]["yAxisID"] == "rate"
    assert by_label["requests/s (right axis)"]["data"] == [60.0]
    assert "yAxisID" not in by_label["ongoing requests (stable window)"]
    assert load["options"]["scales"]["rate"]["position"] == "right"


def test_create_form_shows_field_errors_then_creates(login, world, serving):
    client = login(world.member)
    assert client.get("/services/new/").status_code == 200
    form = {
        "project": world.project.pk,
        "queue": serving.queue.pk,
        "name": "chat",
        "command": "python -m server --model 7b",
        "gpus_per_node": 1,
        "health_path": "/health",
        "metrics_path": "/metrics",
        "min_replicas": 3,
        "max_replicas": 2,
        "target_running_per_replica": 4,
        "stable_window_s": 60,
        "panic_window_s": 6,
        "panic_threshold": 2,
        "scale_up_max_step": 2,
        "scale_down_delay_s": 60,
        "scale_to_zero_grace_s": 300,
    }
    response = client.post("/services/new/", form)
    assert response.status_code == 200
    assert "Must not be above max replicas." in response.content.decode()
    response = client.post("/services/new/", {**form, "min_replicas": 1, "panic_window_s": 90})
    assert "panic window" in response.content.decode()
    response = client.post("/services/new/", {**form, "min_replicas": 1})
    service = Service.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/services/{service.pk}/"
    assert service.command == ["python", "-m", "server", "--model", "7b"]


def test_viewer_cannot_open_the_edit_form_or_act(login, world, service):
    client = login(world.viewer)
    assert client.get(f"/services/{service.pk}/edit/").status_code == 403
    assert client.post(f"/services/{service.pk}/pause").status_code == 403
    assert login(world.outsider).get(f"/services/{service.pk}/edit/").status_code == 404


def test_edit_pause_resume_delete(login, world, service):
    client = login(world.member)
    page = client.get(f"/services/{service.pk}/edit/")
    assert page.status_code == 200 and "python -m server" in page.content.decode()
    form = {
        "queue": service.queue_id,
        "command": "python -m server --v2",
        "gpus_per_node": 1,
        "health_path": "/health",
        "metrics_path": "/metrics",
        "min_replicas": 1,
        "max_replicas": 6,
        "target_running_per_replica": 4,
        "stable_window_s": 60,
        "panic_window_s": 6,
        "panic_threshold": 2,
        "scale_up_max_step": 4,
        "scale_down_delay_s": 60,
        "scale_to_zero_grace_s": 300,
    }
    assert client.post(f"/services/{service.pk}/edit/", form).status_code == 302
    service.refresh_from_db()
    assert (service.max_replicas, service.spec_version, service.name) == (6, 2, "chat")
    client.post(f"/services/{service.pk}/pause")
    service.refresh_from_db()
    assert service.state == ServiceState.PAUSED
    client.post(f"/services/{service.pk}/resume")
    service.refresh_from_db()
    assert service.state == ServiceState.ACTIVE
    response = client.post(f"/services/{service.pk}/delete")
    assert response.status_code == 302 and response["Location"] == "/services/"
    assert client.get(f"/services/{service.pk}/").status_code == 404


def test_other_tenants_services_are_not_listed(login, world, serving):
    ServiceFactory(queue=serving.other_queue, project=world.other_project, name="theirs")
    html = login(world.member).get("/services/").content.decode()
    assert "theirs" not in html
