"""Every error under ``/api/`` is JSON in the API's error shape, with DEBUG on or off: also
paths no route matches, which Django answers with an HTML page of its own."""

import pytest
from django.test import Client

from tenants.api import views as tenant_views

MISSES = [
    "/api/v1/jobs/0.5/",
    "/api/v1/jobs/0.5",
    "/api/v1/no-such-thing",
    "/api/v2/jobs/",
    "/api/",
    "/api/v1/tenants/abc/quota/xyz/",
]


@pytest.mark.parametrize("debug", [False, True], ids=["DEBUG=0", "DEBUG=1"])
@pytest.mark.parametrize("path", MISSES)
def test_a_path_no_route_matches_is_a_json_404(world, settings, debug, path):
    settings.DEBUG = debug
    client = Client()
    client.force_login(world.member)

    response = client.get(path)

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not found.", "errors": {}}
    assert len(response.content) < 200


@pytest.mark.parametrize("debug", [False, True], ids=["DEBUG=0", "DEBUG=1"])
def test_an_anonymous_miss_is_json_too(db, settings, debug):
    settings.DEBUG = debug
    response = Client().get("/api/v1/jobs/0.5/")
    assert response.status_code == 404
    assert response.json()["detail"] == "Not found."


@pytest.mark.parametrize("debug", [False, True], ids=["DEBUG=0", "DEBUG=1"])
def test_an_unhandled_exception_in_an_api_view_is_a_json_500(world, settings, debug, monkeypatch):
    settings.DEBUG = debug

    def crash(self, request, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(tenant_views.TenantViewSet, "list", crash)
    client = Client(raise_request_exception=False)
    client.force_login(world.platform_admin)

    response = client.get("/api/v1/tenants/")

    assert response.status_code == 500
    assert response.json() == {"detail": "A server error occurred.", "errors": {}}
    assert b"boom" not in response.content


def test_a_csrf_refusal_under_api_is_json(world, settings):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.member)

    response = client.post("/api/v1/jobs", {}, content_type="application/json")

    assert response.status_code == 403
    assert response["Content-Type"] == "application/json"
    assert set(response.json()) == {"detail", "errors"}


def test_pages_outside_api_keep_their_html_404(world, settings):
    client = Client()
    client.force_login(world.member)

    response = client.get("/no-such-page/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_api_answers_that_were_json_are_left_alone(world, api):
    response = api(world.member).get("/api/v1/jobs/999999/")
    assert response.status_code == 404
    assert response.json()["detail"] == "Job not found."  # the view's own words, kept
