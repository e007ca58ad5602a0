"""The OpenAPI schema documents the error answers of every operation, in the one error shape."""

import pytest
from drf_spectacular.generators import SchemaGenerator

from portal.api.schema import ERROR_SCHEMA

METHODS = {"get", "post", "put", "patch", "delete"}


@pytest.fixture(scope="module")
def schema():
    return SchemaGenerator().get_schema(request=None, public=True)


def operations(schema):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield path, method, operation


def test_error_shape_is_a_component(schema):
    assert schema["components"]["schemas"]["Error"] == ERROR_SCHEMA
    assert ERROR_SCHEMA["required"] == ["detail", "errors"]


def test_every_operation_documents_its_errors(schema):
    missing = []
    for path, method, operation in operations(schema):
        responses = operation["responses"]
        expected = {"400"}
        if path == "/api/v1/auth/token" and method == "post":
            expected |= {"429"}
        else:
            expected |= {"401", "403", "404"}
            if method != "get":
                expected |= {"409"}
        if "requestBody" in operation:
            expected |= {"413", "415"}
        missing += [f"{method.upper()} {path}: {code}" for code in expected - set(responses)]
        for code in expected:
            content = responses.get(code, {}).get("content", {})
            if code not in ("401", "429") and path.startswith("/api/v1/auth"):
                continue  # the token endpoints may describe their own errors
            assert "application/json" in content, (method, path, code)
    assert missing == []


def test_request_bodies_are_documented_as_json(schema):
    for path, method, operation in operations(schema):
        content = operation.get("requestBody", {}).get("content", {})
        if content:
            assert "application/json" in content, (method, path)
            assert "multipart/form-data" not in content, (method, path)


def test_lists_document_the_pagination_envelope_and_strict_page_numbers(schema):
    jobs = schema["paths"]["/api/v1/jobs/"]["get"]
    page = next(p for p in jobs["parameters"] if p["name"] == "page")
    size = next(p for p in jobs["parameters"] if p["name"] == "page_size")
    assert page["schema"]["minimum"] == 1
    assert size["schema"]["minimum"] == 1
    listed = jobs["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    envelope = schema["components"]["schemas"][listed.rsplit("/", 1)[-1]]
    # the jobs list counts up to a limit and says when it stopped; other lists count all
    assert set(envelope["properties"]) == {"count", "count_capped", "next", "previous", "results"}
    assert envelope["properties"]["next"]["nullable"] is True
    projects = schema["paths"]["/api/v1/projects/"]["get"]["responses"]["200"]["content"]
    listed = projects["application/json"]["schema"]["$ref"]
    envelope = schema["components"]["schemas"][listed.rsplit("/", 1)[-1]]
    assert set(envelope["properties"]) == {"count", "next", "previous", "results"}


def test_blank_and_null_values_the_api_returns_are_in_the_schema(schema):
    components = schema["components"]["schemas"]
    stop_reason = components["Job"]["properties"]["stop_reason"]
    assert {"$ref": "#/components/schemas/BlankEnum"} in stop_reason["oneOf"]
    assert "format" not in components["User"]["properties"]["email"]
    assert components["Job"]["properties"]["exit_code"]["nullable"] is True


def test_ids_in_filters_are_documented_as_database_ids(schema):
    jobs = schema["paths"]["/api/v1/jobs/"]["get"]["parameters"]
    queue = next(p for p in jobs if p["name"] == "queue")
    assert queue["schema"] == {
        "type": "integer",
        "format": "int64",
        "minimum": 1,
        "maximum": 2**63 - 1,
    }


def test_answers_without_a_serializer_are_documented(schema):
    paths = schema["paths"]
    for path, method, code in [
        ("/api/v1/jobs/{id}/logs/", "get", "200"),
        ("/api/v1/jobs/bulk/", "post", "201"),
        ("/api/v1/notifications/read-all/", "post", "200"),
        ("/api/v1/jobs/", "post", "201"),
    ]:
        assert "content" in paths[path][method]["responses"][code], (path, method)
