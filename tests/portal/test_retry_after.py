"""429 answers say when to try again (``Retry-After``, seconds): the sign-in lockout on the
token endpoint, the login page, and any DRF throttle through the API's error handler."""

import pytest
from freezegun import freeze_time
from rest_framework.exceptions import Throttled
from rest_framework.test import APIClient

from portal.api.errors import exception_handler


@pytest.fixture(autouse=True)
def _axes_on(settings):
    settings.AXES_ENABLED = True
    settings.AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"


def _lock(world):
    client = APIClient()
    for n in range(10):
        client.post(
            "/api/v1/auth/token",
            {"username": "nlp-member", "password": f"wrong-{n}"},
            format="json",
        )
    return client


@freeze_time("2026-03-01 12:00:00")
def test_the_token_endpoint_locked_out_says_when_to_retry(world):
    client = _lock(world)

    response = client.post(
        "/api/v1/auth/token", {"username": "nlp-member", "password": "x"}, format="json"
    )

    assert response.status_code == 429
    assert response["Retry-After"] == str(15 * 60)
    assert response.json()["detail"].startswith("Too many failed sign-ins")


def test_the_retry_after_counts_down(world):
    with freeze_time("2026-03-01 12:00:00") as clock:
        client = _lock(world)
        clock.tick(600)
        response = client.post(
            "/api/v1/auth/token", {"username": "nlp-member", "password": "x"}, format="json"
        )

    assert response.status_code == 429
    assert response["Retry-After"] == str(5 * 60)


@freeze_time("2026-03-01 12:00:00")
def test_the_login_page_locked_out_says_when_to_retry(world, client):
    for n in range(10):
        client.post("/login/", {"username": "nlp-member", "password": f"wrong-{n}"})

    response = client.post("/login/", {"username": "nlp-member", "password": "x"})

    assert response.status_code == 429
    assert response["Retry-After"] == str(15 * 60)


def test_a_throttled_api_answer_carries_retry_after():
    response = exception_handler(Throttled(wait=42), {})

    assert response.status_code == 429
    assert response["Retry-After"] == "42"
    assert set(response.data) == {"detail", "errors"}
