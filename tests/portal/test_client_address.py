"""The client address recorded in the audit log and by the sign-in lockout.

``X-Forwarded-For`` counts only when the connection's peer is one of
``SLUICE_TRUSTED_PROXIES``; then the right-most hop no trusted proxy vouches for is the
client. A header sent straight to the portal is the client's own writing and is ignored.
"""

import pytest
from django.test import RequestFactory
from rest_framework.test import APIClient

from audit.models import AuditEvent
from portal.middleware import client_address

JOBS = "/api/v1/jobs"
FORGED = "203.0.113.77, 127.0.0.1"


def _job_body(world) -> dict:
    return {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "training",
        "command": ["python", "train.py"],
    }


def _address(settings, trusted, remote, forwarded=None) -> str | None:
    settings.SLUICE_TRUSTED_PROXIES = trusted
    extra = {"REMOTE_ADDR": remote}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return client_address(RequestFactory().get("/", **extra))


def test_a_forwarded_header_from_an_untrusted_peer_is_ignored(settings):
    assert _address(settings, [], "127.0.0.1", FORGED) == "127.0.0.1"
    assert _address(settings, ["10.0.0.5"], "198.51.100.4", FORGED) == "198.51.100.4"


def test_from_a_trusted_proxy_the_right_most_untrusted_hop_is_the_client(settings):
    # nginx appends the address it saw to what the client sent.
    assert _address(settings, ["127.0.0.1"], "127.0.0.1", "203.0.113.77, 198.51.100.9") == (
        "198.51.100.9"
    )
    # Two trusted proxies (a network and an address): both hops skipped.
    assert (
        _address(
            settings,
            ["10.0.0.0/24", "127.0.0.1"],
            "127.0.0.1",
            "203.0.113.77, 198.51.100.9, 10.0.0.3",
        )
        == "198.51.100.9"
    )
    # A trusted proxy that sent no header: the proxy itself is what is known.
    assert _address(settings, ["127.0.0.1"], "127.0.0.1") == "127.0.0.1"
    # A malformed hop is not believed; the last address a trusted proxy vouched for stands.
    assert _address(settings, ["127.0.0.1"], "127.0.0.1", "198.51.100.9, not-an-ip") == (
        "127.0.0.1"
    )
    # Ports and IPv4-mapped forms are understood.
    assert _address(settings, ["::1"], "::1", "198.51.100.9:4711") == "198.51.100.9"


@pytest.mark.django_db
def test_a_job_submitted_with_a_forged_header_is_audited_with_the_peer(
    world, settings, dispatch_requests
):
    settings.SLUICE_TRUSTED_PROXIES = []
    client = APIClient(REMOTE_ADDR="127.0.0.1")
    client.force_authenticate(world.member)
    response = client.post(JOBS, _job_body(world), format="json", HTTP_X_FORWARDED_FOR=FORGED)
    assert response.status_code == 201, response.content
    event = AuditEvent.objects.get(action="job.submit")
    assert event.source_address == "127.0.0.1"


@pytest.mark.django_db
def test_a_job_submitted_through_a_trusted_proxy_is_audited_with_the_client(
    world, settings, dispatch_requests
):
    settings.SLUICE_TRUSTED_PROXIES = ["127.0.0.1"]
    client = APIClient(REMOTE_ADDR="127.0.0.1")
    client.force_authenticate(world.member)
    response = client.post(
        JOBS, _job_body(world), format="json", HTTP_X_FORWARDED_FOR="203.0.113.77, 198.51.100.9"
    )
    assert response.status_code == 201, response.content
    assert AuditEvent.objects.get(action="job.submit").source_address == "198.51.100.9"


@pytest.mark.django_db
def test_the_lockout_records_the_peer_not_a_forged_header(world, settings):
    settings.AXES_ENABLED = True
    settings.AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
    settings.SLUICE_TRUSTED_PROXIES = []
    from axes.models import AccessAttempt

    client = APIClient(REMOTE_ADDR="127.0.0.1")
    for n in range(settings.AXES_FAILURE_LIMIT):
        client.post(
            "/api/v1/auth/token",
            {"username": "nlp-member", "password": f"wrong-{n}"},
            format="json",
            HTTP_X_FORWARDED_FOR=f"203.0.113.{n + 1}, 127.0.0.1",
        )
    event = AuditEvent.objects.get(action="auth.lockout")
    assert event.source_address == "127.0.0.1"
    addresses = set(AccessAttempt.objects.values_list("ip_address", flat=True))
    assert addresses == {"127.0.0.1"}
