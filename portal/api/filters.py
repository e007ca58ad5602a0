"""Filters that parse query strings strictly: a bad value is a 400 naming the parameter.

``IdFilter`` takes a whole number that fits a database id (``?queue=1e20`` or
``?project=99999999999999999999`` are refused, not passed to the database, where SQLite
overflows and PostgreSQL errs). ``FilterBackend`` (the default filter backend of every API
view, see REST_FRAMEWORK in settings) refuses NUL in any query parameter and answers 404
for a path that names an object with one, before any query runs: PostgreSQL cannot compare
text holding NUL. It runs for lists and for every ``get_object`` (which filters first).
"""

from __future__ import annotations

import django_filters
from django import forms
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema_field
from rest_framework.exceptions import ValidationError

from portal.errors import NotFoundError
from portal.text import BAD_TEXT

from .parsers import query_dict_errors, raise_for_bad_text

MAX_ID = 2**63 - 1  # BigAutoField


class IdField(forms.IntegerField):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(*args, **kwargs)


@extend_schema_field({"type": "integer", "format": "int64", "minimum": 1, "maximum": MAX_ID})
class IdFilter(django_filters.NumberFilter):
    """A database id: a whole number from 1 to 2**63-1."""

    field_class = IdField


def check_query_text(request, view) -> None:
    """400 for NUL in a query parameter; 404 for NUL in an object named by the path."""
    for value in (getattr(view, "kwargs", None) or {}).values():
        if isinstance(value, str) and BAD_TEXT.search(value):
            raise NotFoundError()
    raise_for_bad_text(query_dict_errors(request.query_params))


# What django-filter's boolean filters understand (any case); anything else, "null" or
# "maybe", it turns into "no filter" and the list answers unfiltered.
BOOLEAN_VALUES = frozenset({"true", "false", "1", "0", ""})
BOOLEAN_MESSAGE = "Give true or false."


def check_boolean_filters(filterset) -> None:
    """400 naming each boolean filter given a value that is not true or false."""
    if filterset is None:
        return
    errors = {}
    for name, filter_ in filterset.filters.items():
        if not isinstance(filter_, django_filters.BooleanFilter):
            continue
        for value in filterset.data.getlist(name) if hasattr(filterset.data, "getlist") else []:
            if value.lower() not in BOOLEAN_VALUES:
                errors[name] = [BOOLEAN_MESSAGE]
    if errors:
        raise ValidationError(errors)


class FilterBackend(DjangoFilterBackend):
    """The filter backend of every API list: NUL refused (above), and every filter strict:
    a value a filter cannot read is a 400 naming it, never a list left unfiltered."""

    def filter_queryset(self, request, queryset, view):
        check_query_text(request, view)
        return super().filter_queryset(request, queryset, view)

    def get_filterset(self, request, queryset, view):
        filterset = super().get_filterset(request, queryset, view)
        check_boolean_filters(filterset)
        return filterset


def path_id(value, message: str = "Not found.") -> int:
    """The database id a URL names; one that cannot be an id names nothing (404)."""
    text = str(value)
    if not (text.isascii() and text.isdigit() and len(text) <= 19) or not 1 <= int(text) <= MAX_ID:
        raise NotFoundError(message)
    return int(text)
