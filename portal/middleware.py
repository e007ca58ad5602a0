"""Request context (request id, source address) for audit rows written during a request."""

import contextvars
import uuid

_request_context: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "sluice_request_context", default=None
)


def current_request_context() -> dict:
    """The id and source address of the request being served, or empty values outside one."""
    return _request_context.get() or {"request_id": "", "source_address": None}


class RequestContextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request_id = request.headers.get("X-Request-ID") or uuid.uuid4().hex
        # The proxy in front of gunicorn is trusted to set X-Forwarded-For; the first hop is the client.
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        address = forwarded.split(",")[0].strip() if forwarded else request.META.get("REMOTE_ADDR")
        token = _request_context.set(
            {"request_id": request_id[:64], "source_address": address or None}
        )
        try:
            response = self.get_response(request)
        finally:
            _request_context.reset(token)
        response["X-Request-ID"] = request_id[:64]
        return response
