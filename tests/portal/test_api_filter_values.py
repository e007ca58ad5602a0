"""Filter parameters the API cannot read are a 400 naming them, for every filterset: a
boolean filter given ``null`` or ``maybe`` no longer answers the whole list unfiltered."""

import pytest
from django.urls import get_resolver
from django_filters import BooleanFilter
from django_filters.rest_framework import DjangoFilterBackend

pytestmark = pytest.mark.django_db


def _boolean_filters():
    """(list URL, filter name) for every boolean filter of every API list."""
    from drf_spectacular.generators import EndpointEnumerator

    found = set()
    for path, _pattern, method, callback in EndpointEnumerator().get_api_endpoints():
        view_class = getattr(callback, "cls", None)
        if method != "GET" or view_class is None or "{" in path:
            continue
        view = view_class()
        view.action_map = getattr(callback, "actions", None) or {}
        view.action = view.action_map.get("get")
        view.request = None
        view.format_kwarg = None
        if view.action not in (None, "list"):
            continue
        queryset = getattr(view_class, "queryset", None)
        if queryset is None:
            meta = getattr(getattr(view_class, "serializer_class", None), "Meta", None)
            model = getattr(meta, "model", None)
            queryset = model._default_manager.all() if model is not None else None
        if queryset is None:
            continue
        filterset_class = DjangoFilterBackend().get_filterset_class(view, queryset)
        if filterset_class is None:
            continue
        for name, filter_ in filterset_class.base_filters.items():
            if isinstance(filter_, BooleanFilter):
                found.add((path, name))
    return sorted(found)


BOOLEAN_FILTERS = _boolean_filters()


def test_the_walk_finds_the_boolean_filters():
    assert ("/api/v1/tenants/", "active") in BOOLEAN_FILTERS
    assert ("/api/v1/users/", "is_active") in BOOLEAN_FILTERS


@pytest.mark.parametrize("value", ["null", "maybe", "yes", "2"])
@pytest.mark.parametrize(("path", "name"), BOOLEAN_FILTERS)
def test_a_boolean_filter_refuses_what_is_not_true_or_false(api, world, path, name, value):
    response = api(world.platform_admin).get(path, {name: value})

    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {name: ["Give true or false."]}


@pytest.mark.parametrize("value", ["true", "false", "True", "0", "1", ""])
def test_true_and_false_still_filter(api, world, value):
    world.other.active = False
    world.other.save(update_fields=["active"])

    response = api(world.platform_admin).get("/api/v1/tenants/", {"active": value})

    assert response.status_code == 200
    slugs = {t["slug"] for t in response.json()["results"]}
    expected = {"true": {"nlp"}, "1": {"nlp"}, "false": {"vision"}, "0": {"vision"}}
    assert slugs == expected.get(value.lower(), {"nlp", "vision"})


def test_choice_filters_refuse_unknown_values(api, world):
    response = api(world.member).get("/api/v1/jobs/", {"state": "BOGUS"})
    assert response.status_code == 400
    assert "state" in response.json()["errors"]


def test_the_resolver_still_has_the_lists():
    assert get_resolver().resolve("/api/v1/tenants/")
