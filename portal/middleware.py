"""Request context (request id, client address) for audit rows written during a request,
and the one place that decides a request's client address.

The client address is the connection's peer (``REMOTE_ADDR``) unless that peer is one of
``SLUICE_TRUSTED_PROXIES``. Only then is ``X-Forwarded-For`` read, from the right: each hop a
trusted proxy appended is skipped, and the first hop no trusted proxy vouches for is the
client. Hops to the left of it were written by the client and may say anything. Addresses
are parsed by python-ipware (the library behind django-ipware): ports, brackets and
IPv4-mapped IPv6 forms are understood, malformed hops are not trusted.
"""

from __future__ import annotations

import contextvars
import ipaddress
import uuid
from functools import lru_cache
from http import HTTPStatus

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import JsonResponse
from python_ipware.modern.parsers import parse_ip

_request_context: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "sluice_request_context", default=None
)


def current_request_context() -> dict:
    """The id and source address of the request being served, or empty values outside one;
    ``query`` is the request's query string (``request.GET``), see portal.api.strict."""
    return _request_context.get() or {"request_id": "", "source_address": None, "query": None}


@lru_cache(maxsize=8)
def _trusted_networks(entries: tuple[str, ...]) -> tuple:
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"SLUICE_TRUSTED_PROXIES: {entry!r} is not an IP address or network"
            ) from None
    return tuple(networks)


def trusted_proxy_networks() -> tuple:
    """``SLUICE_TRUSTED_PROXIES`` as networks (an address alone is a /32 or /128)."""
    return _trusted_networks(tuple(getattr(settings, "SLUICE_TRUSTED_PROXIES", ()) or ()))


def _is_trusted(address, networks) -> bool:
    return any(address.version == net.version and address in net for net in networks)


def client_address(request) -> str | None:
    """The client's address: the peer, or the right-most hop no trusted proxy vouches for.

    Every place that records where a request came from (audit events, the sign-in lockout)
    uses this, so they agree and none of them believes a header a client wrote itself.
    """
    remote = request.META.get("REMOTE_ADDR") or None
    networks = trusted_proxy_networks()
    peer = parse_ip(remote) if remote else None
    if peer is None or not networks or not _is_trusted(peer, networks):
        return str(peer) if peer is not None else remote
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    client = peer
    for hop in reversed(forwarded.split(",")):
        address = parse_ip(hop)
        if address is None:
            # A hop that is not an address cannot be vouched for; the last good one stands.
            break
        client = address
        if not _is_trusted(address, networks):
            break
    return str(client)


class RequestContextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request_id = request.headers.get("X-Request-ID") or uuid.uuid4().hex
        token = _request_context.set(
            {
                "request_id": request_id[:64],
                "source_address": client_address(request),
                "query": request.GET,
            }
        )
        try:
            response = self.get_response(request)
        finally:
            _request_context.reset(token)
        response["X-Request-ID"] = request_id[:64]
        return response


API_PREFIX = "/api/"
# Headers of an error answer that still mean something in its JSON form.
_KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate", "X-Request-ID", "Vary")


def _is_json(response) -> bool:
    return response.get("Content-Type", "").split(";")[0].strip() == "application/json"


# The words DRF uses for the same answers.
_DETAILS = {404: "Not found.", 500: "A server error occurred."}


def _detail(status: int) -> str:
    if status in _DETAILS:
        return _DETAILS[status]
    try:
        return f"{HTTPStatus(status).phrase}."
    except ValueError:
        return "Error."


class ApiJsonErrorsMiddleware:
    """Every error under ``/api/`` answers in the API's one error shape, ``{"detail": ...,
    "errors": {}}``, with its status: also those no API view wrote (a path that matches no
    route, such as ``/api/v1/jobs/0.5/``, a CSRF refusal, an unhandled exception), which
    Django answers with an HTML page (under DEBUG, its technical pages)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            response.status_code < 400
            or not request.path.startswith(API_PREFIX)
            or _is_json(response)
        ):
            return response
        answer = JsonResponse(
            {"detail": _detail(response.status_code), "errors": {}}, status=response.status_code
        )
        for name in _KEPT_HEADERS:
            if name in response:
                answer[name] = response[name]
        return answer
