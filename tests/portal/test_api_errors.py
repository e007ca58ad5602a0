"""The uniform API error shape: ``{"detail": ..., "errors": {field: [messages]}}``."""

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions

from portal.api.errors import _flatten, exception_handler
from portal.errors import BusinessError, NotFoundError, PermissionDeniedError


def test_flatten_names_fields_keys_and_positions():
    detail = {
        "name": ["Too long."],
        "env": {"EPOCHS": ["Not a valid string."]},
        "jobs": [{}, {"command": ["Bad."]}],
        "array_like": {2: ["Bad item."]},
        "non_field_errors": ["Nope."],
    }

    assert _flatten(detail) == {
        "name": ["Too long."],
        "env.EPOCHS": ["Not a valid string."],
        "jobs[1].command": ["Bad."],
        "array_like[2]": ["Bad item."],
        "non_field_errors": ["Nope."],
    }
    assert _flatten(["a", "b"]) == {"non_field_errors": ["a", "b"]}


def test_business_error_keeps_status_code_and_fields():
    response = exception_handler(BusinessError("No.", code="x", field="queue"), {})

    assert response.status_code == 400
    assert response.data == {"detail": "No.", "code": "x", "errors": {"queue": ["No."]}}


def test_permission_and_not_found_errors():
    assert exception_handler(PermissionDeniedError(), {}).status_code == 403
    assert exception_handler(PermissionDeniedError("No.", field="project"), {}).data["errors"] == {
        "project": ["No."]
    }
    assert exception_handler(NotFoundError(), {}).status_code == 404


def test_django_errors_map_to_http_statuses():
    validation = exception_handler(DjangoValidationError({"slug": ["Bad slug."]}), {})
    assert validation.status_code == 400
    assert validation.data["errors"] == {"slug": ["Bad slug."]}
    assert exception_handler(Http404(), {}).status_code == 404
    assert exception_handler(PermissionDenied(), {}).status_code == 403


def test_drf_validation_error_gets_a_detail_naming_the_first_problem():
    response = exception_handler(exceptions.ValidationError({"name": ["Required."]}), {})

    assert response.status_code == 400
    assert response.data == {
        "detail": "Invalid input: name: Required.",
        "errors": {"name": ["Required."]},
    }
    anonymous = exception_handler(exceptions.ValidationError(["Nope."]), {})
    assert anonymous.data["detail"] == "Invalid input: Nope."


def test_other_errors_have_an_empty_errors_object():
    response = exception_handler(exceptions.MethodNotAllowed("PUT"), {})

    assert response.status_code == 405
    assert response.data["errors"] == {}


def test_unexpected_errors_are_left_to_django():
    assert exception_handler(RuntimeError("boom"), {}) is None


def test_model_validation_non_field_errors_use_the_api_name():
    business = exception_handler(BusinessError("Invalid input.", errors={"__all__": ["Dup."]}), {})
    django = exception_handler(DjangoValidationError({"__all__": ["Dup."]}), {})

    assert business.data["errors"] == {"non_field_errors": ["Dup."]}
    assert django.data["errors"] == {"non_field_errors": ["Dup."]}
