"""Unknown fields in a request body are a 400 naming them, for every serializer of the API.

DRF drops keys a serializer does not declare. A client that misspells a field
(``"gpu_models"`` for ``gpu_model``) then gets its job accepted without the constraint it
asked for. ``install()`` (called once, from the portal app's ``ready``) makes every
``Serializer`` refuse keys it has no field for: ``{"gpu_models": ["Unknown field."]}``
beside whatever else is wrong, also inside nested serializers and list items
(``jobs[0].gpu_models``). Read-only fields are known (a body copied from a GET answer is
not refused for them; they stay unchanged). Free-form objects (``env``, ``parameters``,
``labels``: dict and JSON fields) are values, not serializers, and stay free.

Query strings are not bodies: a serializer that validates ``request.query_params`` (the
logs' ``tail``) keeps DRF's leniency, as filters do for parameters they do not know.
A serializer may opt out with ``unknown_fields_allowed = True``.

Operations that take no body (deletes, ``notifications/{id}/read``, ``users/{id}/deactivate``)
run no serializer, so ``install()`` also refuses a body sent to them: after authentication
and permissions and before the handler runs, a write whose body has fields is a 400 naming
each one. Whether an operation takes a body is what the OpenAPI schema says of it
(drf-spectacular's view schema for that route and method: no ``requestBody``), derived once
per route and method and cached, so the schema and the API cannot disagree and a new action
needs no marking. An empty body, ``{}`` or no Content-Type is no body. Routes the schema
does not describe (excluded operations) keep DRF's leniency.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from portal.errors import BusinessError
from portal.middleware import current_request_context

log = logging.getLogger(__name__)

UNKNOWN_FIELD = "Unknown field."
NO_BODY = "This operation takes no body."
NO_BODY_DETAIL = "Invalid input: this operation takes no body."
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Sent with every POST by the browsable API's HTML forms; no serializer declares it.
FORM_EXTRAS = frozenset({"csrfmiddlewaretoken"})

_original_to_internal_value = serializers.Serializer.to_internal_value
_original_initial = APIView.initial


def unknown_fields(serializer: serializers.Serializer, data) -> list[str]:
    """The keys of ``data`` that ``serializer`` has no field for (empty when it allows any)."""
    if getattr(serializer, "unknown_fields_allowed", False) or not isinstance(data, Mapping):
        return []
    if data is current_request_context().get("query"):
        return []
    known = {field.field_name for field in serializer.fields.values()}
    return [str(key) for key in data if key not in known and key not in FORM_EXTRAS]


def _strict_to_internal_value(self, data):
    unknown = unknown_fields(self, data)
    if not unknown:
        return _original_to_internal_value(self, data)
    errors: dict = {name: [UNKNOWN_FIELD] for name in unknown}
    try:
        _original_to_internal_value(self, data)
    except ValidationError as exc:
        if isinstance(exc.detail, Mapping):
            errors.update({k: v for k, v in exc.detail.items() if k not in errors})
    raise ValidationError(errors)


# (route callback, method) -> whether its operation has a request body; None: not described.
_takes_body: dict[tuple, bool | None] = {}
_takes_body_lock = threading.Lock()


def _schema_says_takes_body(callback, method: str) -> bool | None:
    """What the OpenAPI schema says of this route and method, by the generator's own steps
    (``SchemaGenerator.parse``) for that one endpoint: True when its operation has a request
    body, False when not, None when the schema does not describe it."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.settings import spectacular_settings

    generator = SchemaGenerator()
    generator._initialise_endpoints()
    for path, path_regex, endpoint_method, endpoint_callback in generator.endpoints:
        if endpoint_callback is not callback or endpoint_method != method:
            continue
        view = generator.create_view(callback, method)
        view.request = spectacular_settings.GET_MOCK_REQUEST(method, path, view, None)
        operation = view.schema.get_operation(path, path_regex, "^/", method, generator.registry)
        if operation is None:  # excluded from the schema
            return None
        return "requestBody" in operation
    return None


def operation_takes_body(callback, method: str) -> bool | None:
    """Cached ``_schema_says_takes_body``: derived once per route and method."""
    key = (callback, method)
    if key not in _takes_body:
        with _takes_body_lock:
            if key not in _takes_body:
                try:
                    _takes_body[key] = _schema_says_takes_body(callback, method)
                except Exception:  # a view the schema cannot describe keeps DRF's leniency
                    log.exception("cannot tell whether %s %s takes a body", method, callback)
                    _takes_body[key] = None
    return _takes_body[key]


def body_fields(data) -> list[str] | None:
    """The fields of a request body (the CSRF token of a form is none); ``[]`` for no body
    (nothing sent, ``{}``, an empty form), None for a body that is not an object."""
    if data is None or (isinstance(data, list) and not data):
        return []
    if isinstance(data, Mapping):
        return [str(key) for key in data if key not in FORM_EXTRAS]
    return None


def refuse_body_where_none_is_taken(request) -> None:
    """A write with a body, to an operation that takes none, is a 400 naming its fields."""
    if request.method not in WRITE_METHODS:
        return
    match = getattr(request, "resolver_match", None)
    if match is None or operation_takes_body(match.func, request.method) is not False:
        return
    fields = body_fields(request.data)
    if fields is None:
        errors = {api_settings.NON_FIELD_ERRORS_KEY: [NO_BODY]}
    elif fields:
        errors = {name: [UNKNOWN_FIELD] for name in fields}
    else:
        return
    raise BusinessError(NO_BODY_DETAIL, code="no_body", errors=errors)


def _initial_refusing_bodies(self, request, *args, **kwargs):
    _original_initial(self, request, *args, **kwargs)
    refuse_body_where_none_is_taken(request)


def install() -> None:
    """Make every serializer strict about unknown fields, and every operation that takes
    no body refuse one (idempotent)."""
    serializers.Serializer.to_internal_value = _strict_to_internal_value
    APIView.initial = _initial_refusing_bodies
