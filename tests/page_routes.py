"""The site's page routes, found by walking its URL resolver: what the page tests go through
(tests/portal/test_production_pages.py renders each with DEBUG off,
tests/portal/test_page_permissions.py checks who may open each). A route added to any
URLconf is found here; the JSON API and the admin's internals are not pages."""

from __future__ import annotations

from dataclasses import dataclass

from django.urls import URLPattern, URLResolver, get_resolver

# Not pages: the JSON API (its own tests), the admin's internals (its index and login are
# pages), the OpenAPI document.
PAGES_UNDER_EXCLUDED_PREFIXES = {"api/docs/", "admin/", "admin/login/"}
EXCLUDED_PREFIXES = ("api/", "admin/")


@dataclass
class Route:
    route: str  # as written in the URLconf, prefixes included
    name: str | None
    arguments: tuple[str, ...]


def page_routes(patterns=None) -> list[Route]:
    """Every page route of the site's URLconf (or of ``patterns``), walking its resolver."""
    found: list[Route] = []

    def walk(patterns, prefix: str, namespace: str) -> None:
        for entry in patterns:
            if isinstance(entry, URLResolver):
                inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
                walk(entry.url_patterns, prefix + str(entry.pattern), inner)
            elif isinstance(entry, URLPattern):
                route = prefix + str(entry.pattern).lstrip("^").rstrip("$")
                if route.startswith(EXCLUDED_PREFIXES) and (
                    route not in PAGES_UNDER_EXCLUDED_PREFIXES
                ):
                    continue
                arguments = tuple(entry.pattern.regex.groupindex)
                name = f"{namespace}{entry.name}" if entry.name else None
                found.append(Route(route=route, name=name, arguments=arguments))

    walk(get_resolver().url_patterns if patterns is None else patterns, "", "")
    return found
