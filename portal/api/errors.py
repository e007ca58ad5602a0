"""Uniform API errors: ``{"detail": "...", "errors": {"field": ["..."]}}`` with the right status."""

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from portal.errors import BusinessError


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
            out[path or "non_field_errors"] = messages
        return out
    return {path or "non_field_errors": [str(detail)]}


def exception_handler(exc, context):
    if isinstance(exc, BusinessError):
        return Response(
            {"detail": exc.message, "code": exc.code, "errors": exc.errors}, status=exc.status_code
        )
    if isinstance(exc, DjangoValidationError):
        errors = (
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
        return Response(
            {"detail": "Invalid input.", "errors": errors}, status=status.HTTP_400_BAD_REQUEST
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = _flatten(exc.detail)
        first = next(iter(errors.values()), ["Invalid input."])[0]
        response.data = {"detail": f"Invalid input: {first}", "errors": errors}
    else:
        detail = (
            response.data.get("detail", str(exc)) if isinstance(response.data, dict) else str(exc)
        )
        response.data = {"detail": str(detail), "errors": {}}
    return response
