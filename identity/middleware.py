"""The Content-Security-Policy of every page lets its forms lead to the OIDC provider.

The logout button is a form on every page; with OIDC, Sluice answers it with a redirect to
the provider's end-session endpoint, and browsers check a form's redirects against the
page's ``form-action`` too. ``'self'`` alone would leave the browser on an error page with
the provider's session still open.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings


def provider_origin() -> str | None:
    """The OIDC provider's origin (its end-session endpoint is on the issuer's host at
    Keycloak, Entra ID, Okta, Auth0, Dex), or None without OIDC."""
    parts = urlsplit(settings.SLUICE_OIDC_ISSUER or "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}"


class ProviderFormActionMiddleware:
    """Adds the provider's origin to ``form-action`` (placed after django-csp's middleware,
    so that it runs before it on the way out)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        origin = provider_origin()
        if origin:
            update = dict(getattr(response, "_csp_update", None) or {})
            existing = update.get("form-action") or []
            if isinstance(existing, str):
                existing = [existing]
            update["form-action"] = [*existing, origin]
            response._csp_update = update
        return response
