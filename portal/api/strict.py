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
"""

from __future__ import annotations

from collections.abc import Mapping

from rest_framework import serializers
from rest_framework.exceptions import ValidationError

from portal.middleware import current_request_context

UNKNOWN_FIELD = "Unknown field."
# Sent with every POST by the browsable API's HTML forms; no serializer declares it.
FORM_EXTRAS = frozenset({"csrfmiddlewaretoken"})

_original_to_internal_value = serializers.Serializer.to_internal_value


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


def install() -> None:
    """Make every serializer strict about unknown fields (idempotent)."""
    serializers.Serializer.to_internal_value = _strict_to_internal_value
