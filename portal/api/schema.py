"""OpenAPI: the error answers of every operation, in the one error shape of portal.api.errors.

drf-spectacular documents the success answers it can see in a view; the errors come from
shared places (the exception handler, parsers, filters, pagination, permissions), so this
postprocessing hook adds them to every operation:

- 400 everywhere: request bodies, query parameters (filters, ``page``) and NUL in any text;
- 401 and 403 where the operation needs credentials; 404 there too (objects of other
  tenants do not exist for you, nor do pages past the last);
- 409 on writes (a job that changed state meanwhile);
- 413 and 415 where a request body is read (too large, a content type not parsed);
- 429 on operations that take no credentials (the token endpoint throttles and locks out).

Request bodies are documented as JSON only: the form encodings the parsers also take (for
the browsable API) cannot spell the lists and objects many bodies hold (``command``,
``env``, ``parameters``).
"""

from __future__ import annotations

ERROR_COMPONENT = "Error"
ERROR_SCHEMA = {
    "type": "object",
    "description": "What went wrong; `errors` names each field at fault (may be empty).",
    "properties": {
        "detail": {"type": "string", "description": "One line for a person."},
        "code": {"type": "string", "description": "A machine-readable code, when given."},
        "errors": {
            "type": "object",
            "description": "Messages by field: `field`, `field.key`, `field[i]`, "
            "`non_field_errors`.",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        },
    },
    "required": ["detail", "errors"],
}
DESCRIPTIONS = {
    "400": "Invalid input; `errors` names the fields.",
    "401": "No credentials, or credentials that are not valid.",
    "403": "Not allowed for this user.",
    "404": "Not found (or not visible to this user).",
    "409": "The object changed meanwhile; read it again and retry.",
    "413": "Request body too large.",
    "415": "Unsupported content type of the request body.",
    "429": "Too many requests; try again later.",
}
METHODS = {"get", "put", "post", "patch", "delete", "head", "options", "trace"}
WRITES = {"put", "post", "patch", "delete"}
FORM_MEDIA_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _needs_credentials(operation: dict, default_security: list) -> bool:
    security = operation.get("security", default_security)
    # An empty requirement ({}) means "anonymous is fine".
    return bool(security) and all(requirement for requirement in security)


def error_codes(method: str, operation: dict, default_security: list) -> list[str]:
    codes = ["400"]
    if _needs_credentials(operation, default_security):
        codes += ["401", "403", "404"]
        if method in WRITES:
            codes.append("409")
    else:
        codes.append("429")
    if "requestBody" in operation:
        codes += ["413", "415"]
    return codes


def _close_request_bodies(schemas: dict) -> None:
    """Request bodies take no field they do not name (portal.api.strict refuses unknown
    ones): ``additionalProperties: false`` on each request object. Free-form objects
    (``env``, ``parameters``) are properties with their own schema and stay open."""
    for name, schema in schemas.items():
        if (
            name.endswith("Request")
            and schema.get("type") == "object"
            and "properties" in schema
            and "additionalProperties" not in schema
        ):
            schema["additionalProperties"] = False


def document_error_responses(result, generator, request, public):
    """Postprocessing hook (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"])."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas[ERROR_COMPONENT] = ERROR_SCHEMA
    _close_request_bodies(schemas)
    reference = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
    default_security = result.get("security", [])
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if method not in METHODS:
                continue
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                for media_type in FORM_MEDIA_TYPES:
                    content.pop(media_type, None)
            responses = operation.setdefault("responses", {})
            for code in error_codes(method, operation, default_security):
                responses.setdefault(
                    code,
                    {
                        "description": DESCRIPTIONS[code],
                        "content": {"application/json": {"schema": reference}},
                    },
                )
    return result
