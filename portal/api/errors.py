"""Uniform API errors: ``{"detail": "...", "errors": {"field": ["..."]}}`` with the right status."""

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from portal.errors import BusinessError


def _flatten(detail) -> dict[str, list[str]]:
    if isinstance(detail, dict):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            if isinstance(value, dict):
                for sub, msgs in _flatten(value).items():
                    out[f"{key}.{sub}"] = msgs
            elif isinstance(value, list):
                msgs: list[str] = []
                for i, item in enumerate(value):
                    if isinstance(item, dict):
                        for sub, sub_msgs in _flatten(item).items():
                            out[f"{key}[{i}].{sub}"] = sub_msgs
                    else:
                        msgs.append(str(item))
                if msgs:
                    out[key] = msgs
            else:
                out[key] = [str(value)]
        return out
    if isinstance(detail, list):
        return {"non_field_errors": [str(d) for d in detail]}
    return {}


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
