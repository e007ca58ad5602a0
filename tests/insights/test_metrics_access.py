"""Who may read /metrics: the token, or an allowed network address; else a plain 403."""

from __future__ import annotations

import gzip

import pytest
from django.core.cache import cache

from insights import metrics
from insights.views import metrics as views_metrics

TOKEN = "s3cret-metrics-token"


@pytest.fixture(autouse=True)
def _setup(db, settings):
    cache.delete(metrics.TOTALS_CACHE_KEY)
    settings.SLUICE_METRICS_TOKEN = ""
    settings.SLUICE_METRICS_ALLOWED_NETWORKS = ["127.0.0.0/8", "::1/128"]
    yield
    cache.delete(metrics.TOTALS_CACHE_KEY)


def get(client, address, **headers):
    return client.get("/metrics", REMOTE_ADDR=address, **headers)


def assert_forbidden(response):
    assert response.status_code == 403
    assert response["Content-Type"].startswith("text/plain")
    assert b"sluice_" not in response.content


@pytest.mark.parametrize("address", ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"])
def test_loopback_is_allowed_by_default(client, address):
    response = get(client, address)
    assert response.status_code == 200
    assert b"# TYPE sluice_pool_gpus gauge" in response.content


@pytest.mark.parametrize("address", ["10.1.2.3", "192.168.0.7", "2001:db8::1", "not-an-ip", ""])
def test_other_addresses_are_refused(client, address):
    assert_forbidden(get(client, address))


def test_a_signed_in_user_gains_nothing(client, world):
    client.force_login(world.platform_admin)
    assert_forbidden(get(client, "10.1.2.3"))


def test_the_token_opens_it_from_anywhere(client, settings):
    settings.SLUICE_METRICS_TOKEN = TOKEN
    response = get(client, "10.1.2.3", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert b"sluice_pool_gpus" in response.content
    # The scheme is case-insensitive, as in HTTP.
    assert get(client, "10.1.2.3", HTTP_AUTHORIZATION=f"bearer {TOKEN}").status_code == 200


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ", f"Token {TOKEN}", TOKEN, ""],
)
def test_a_wrong_token_is_refused(client, settings, authorization):
    settings.SLUICE_METRICS_TOKEN = TOKEN
    assert_forbidden(get(client, "10.1.2.3", HTTP_AUTHORIZATION=authorization))


def test_no_token_configured_means_no_token_works(client):
    assert_forbidden(get(client, "10.1.2.3", HTTP_AUTHORIZATION="Bearer "))
    assert_forbidden(get(client, "10.1.2.3", HTTP_AUTHORIZATION="Bearer anything"))


def test_the_token_is_compared_in_constant_time(client, settings, monkeypatch):
    settings.SLUICE_METRICS_TOKEN = TOKEN
    calls = []
    real = views_metrics.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(views_metrics.hmac, "compare_digest", spy)
    assert_forbidden(get(client, "10.1.2.3", HTTP_AUTHORIZATION="Bearer guess"))
    assert calls == [(b"guess", TOKEN.encode())]


def test_allowed_networks_are_configurable(client, settings):
    settings.SLUICE_METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8", "bad-entry", "2001:db8::/32"]
    assert get(client, "10.1.2.3").status_code == 200
    assert get(client, "2001:db8::1").status_code == 200
    # Loopback is no longer in the list.
    assert_forbidden(get(client, "127.0.0.1"))
    assert_forbidden(get(client, "11.0.0.1"))


def test_no_allowed_networks_means_token_only(client, settings):
    settings.SLUICE_METRICS_ALLOWED_NETWORKS = []
    settings.SLUICE_METRICS_TOKEN = TOKEN
    assert_forbidden(get(client, "127.0.0.1"))
    assert get(client, "127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200


@pytest.mark.parametrize(
    "header",
    [
        {"HTTP_X_FORWARDED_FOR": "127.0.0.1"},
        {"HTTP_X_FORWARDED_FOR": "203.0.113.9, 127.0.0.1"},
        {"HTTP_FORWARDED": "for=127.0.0.1"},
        # nginx's common "proxy_set_header X-Real-IP $remote_addr;" without X-Forwarded-For
        {"HTTP_X_REAL_IP": "203.0.113.9"},
        {"HTTP_X_FORWARDED_PROTO": "https"},
        {"HTTP_VIA": "1.1 proxy"},
    ],
)
def test_through_a_proxy_the_address_does_not_count(client, settings, header):
    """A proxy on the same machine makes every request come from the loopback."""
    assert_forbidden(get(client, "127.0.0.1", **header))
    settings.SLUICE_METRICS_TOKEN = TOKEN
    assert (
        get(client, "127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", **header).status_code == 200
    )


def test_only_reading(client):
    assert client.post("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 405
    assert client.head("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200


def test_gzip_when_asked(client, world):
    response = get(client, "127.0.0.1", HTTP_ACCEPT_ENCODING="gzip, deflate")
    assert response.status_code == 200
    assert response["Content-Encoding"] == "gzip"
    assert b"sluice_gpu_allocated{" in gzip.decompress(response.content)
    plain = get(client, "127.0.0.1")
    assert "Content-Encoding" not in plain
    assert b"sluice_gpu_allocated{" in plain.content
    assert plain["Cache-Control"].startswith("max-age=0")
