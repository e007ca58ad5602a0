"""Uniform API errors: ``{"detail": "...", "errors": {"field": ["..."]}}`` with the right status."""

from django.core.exceptions import (
    NON_FIELD_ERRORS,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from portal.errors import BusinessError

NON_FIELD_KEY = api_settings.NON_FIELD_ERRORS_KEY


def _flatten(detail, path: str = "") -> dict[str, list[str]]:
    """Field messages keyed by where they belong: ``field``, ``field.key`` inside an object,
    ``field[i].sub`` inside a list (DRF reports list items by position, as a list or a dict)."""
    if isinstance(detail, dict):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            if isinstance(key, int):
                sub = f"{path}[{key}]"
            else:
                sub = f"{path}.{key}" if path else str(key)
            out.update(_flatten(value, sub))
        return out
    if isinstance(detail, list):
        out, messages = {}, []
        for i, item in enumerate(detail):
            if isinstance(item, (dict, list)):
                out.update(_flatten(item, f"{path}[{i}]"))
            else:
                messages.append(str(item))
        if messages:
            out[path or NON_FIELD_KEY] = messages
        return out
    return {path or NON_FIELD_KEY: [str(detail)]}


def _api_field_names(errors: dict[str, list[str]]) -> dict[str, list[str]]:
    """Django's model validation says ``__all__`` where the API says ``non_field_errors``."""
    return {(NON_FIELD_KEY if k == NON_FIELD_ERRORS else k): v for k, v in errors.items()}


def exception_handler(exc, context):
    if isinstance(exc, BusinessError):
        return Response(
            {"detail": exc.message, "code": exc.code, "errors": _api_field_names(exc.errors)},
            status=exc.status_code,
        )
    if isinstance(exc, DjangoValidationError):
        errors = exc.message_dict if hasattr(exc, "error_dict") else {NON_FIELD_KEY: exc.messages}
        return Response(
            {"detail": "Invalid input.", "errors": _api_field_names(errors)},
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, RequestDataTooBig):
        return Response(
            {"detail": "Request body too large.", "errors": {}},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, SuspiciousOperation):  # e.g. too many form fields
        return Response({"detail": str(exc), "errors": {}}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = _flatten(exc.detail)
        where, messages = next(iter(errors.items()), (NON_FIELD_KEY, ["Invalid input."]))
        first = messages[0] if where == NON_FIELD_KEY else f"{where}: {messages[0]}"
        response.data = {"detail": f"Invalid input: {first}", "errors": errors}
    else:
        detail = (
            response.data.get("detail", str(exc)) if isinstance(response.data, dict) else str(exc)
        )
        response.data = {"detail": str(detail), "errors": {}}
    return response
