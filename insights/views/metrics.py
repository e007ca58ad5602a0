"""``GET /metrics``: the Prometheus text exposition (insights.metrics), for a scraper only.

Access (docs/insights-metrics.md): a request with ``Authorization: Bearer <token>`` when
SLUICE_METRICS_TOKEN is set, or one from an address in SLUICE_METRICS_ALLOWED_NETWORKS
(default: loopback only). Anything else is a plain-text 403.

The address is the connection's (``REMOTE_ADDR``), never a header the client writes; and a
request that came through a proxy (it carries ``X-Forwarded-For``, ``Forwarded``,
``X-Real-IP``, ``X-Forwarded-Host``/``-Proto`` or ``Via``) is not
judged by its address at all: behind a proxy on the same machine every request would come
from the loopback. Through a proxy, use the token.
"""

from __future__ import annotations

import gzip
import hmac
import ipaddress
import logging
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from ..metrics import metrics_text

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Below this size an answer is not worth compressing.
GZIP_MIN_BYTES = 4096


@lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple:
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            log.error("SLUICE_METRICS_ALLOWED_NETWORKS: %r is not a network, ignored", entry)
    return tuple(networks)


def _token_ok(request: HttpRequest) -> bool:
    token = settings.SLUICE_METRICS_TOKEN
    if not token:
        return False
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    # Constant time: the comparison does not tell how much of a guess was right.
    return hmac.compare_digest(given.strip().encode(), token.encode())


#: Headers a reverse proxy adds (nginx's usual ``X-Real-IP`` without ``X-Forwarded-For``
#: among them); a scraper talking to the portal directly sends none of them.
PROXY_HEADERS = (
    "x-forwarded-for",
    "forwarded",
    "x-real-ip",
    "x-forwarded-host",
    "x-forwarded-proto",
    "via",
)


def _address_ok(request: HttpRequest) -> bool:
    if any(name in request.headers for name in PROXY_HEADERS):
        return False
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if getattr(address, "ipv4_mapped", None):
        address = address.ipv4_mapped
    networks = _networks(tuple(settings.SLUICE_METRICS_ALLOWED_NETWORKS))
    return any(address in network for network in networks)


def metrics_access_allowed(request: HttpRequest) -> bool:
    return _token_ok(request) or _address_ok(request)


@never_cache
@require_safe
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    if not metrics_access_allowed(request):
        return HttpResponse(
            "Forbidden: /metrics needs the metrics token or an allowed network address.\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    body = metrics_text().encode("utf-8")
    response = HttpResponse(content_type=CONTENT_TYPE)
    if len(body) >= GZIP_MIN_BYTES and "gzip" in request.headers.get("Accept-Encoding", ""):
        body = gzip.compress(body, compresslevel=1)  # the text repeats: level 1 is enough
        response["Content-Encoding"] = "gzip"
    response["Vary"] = "Accept-Encoding"
    response.content = body
    return response
