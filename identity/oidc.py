"""OIDC sign-in with mozilla-django-oidc: endpoints from the provider's discovery document,
users and roles synced from the claims (``identity.services.directory_sync_user``), and
every failure a message on the login page.

mozilla-django-oidc reads fixed endpoint settings; here they come from
``<SLUICE_OIDC_ISSUER>/.well-known/openid-configuration``, fetched when first needed and
kept for ``SLUICE_OIDC_DISCOVERY_TTL`` seconds, so that a provider that is down when
Sluice starts only fails the OIDC sign-ins, never the password ones.
"""

from __future__ import annotations

import logging
import threading
import time
from urllib.parse import urlencode

import requests
from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.http import HttpResponseRedirect
from django.urls import reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from portal.errors import BusinessError

from .choices import DirectorySource
from .services import directory_sync_user

log = logging.getLogger(__name__)

#: Where a failed sign-in puts its reason for the callback view to show.
FAILURE_ATTR = "sluice_oidc_failure"


class ProviderUnavailable(Exception):
    """The provider's discovery document could not be read."""


_cache: dict[str, tuple[float, dict]] = {}
_lock = threading.Lock()


def oidc_enabled() -> bool:
    return bool(settings.SLUICE_OIDC_ISSUER)


def discovery(*, refresh: bool = False) -> dict:
    """The provider's discovery document (cached for ``SLUICE_OIDC_DISCOVERY_TTL`` s)."""
    issuer = settings.SLUICE_OIDC_ISSUER.rstrip("/")
    url = f"{issuer}/.well-known/openid-configuration"
    with _lock:
        hit = _cache.get(url)
        if hit and not refresh and time.monotonic() - hit[0] < settings.SLUICE_OIDC_DISCOVERY_TTL:
            return hit[1]
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT, verify=settings.OIDC_VERIFY_SSL)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        log.warning("OIDC discovery at %s failed: %s", url, exc)
        raise ProviderUnavailable(str(exc)) from exc
    missing = [
        key
        for key in ("authorization_endpoint", "token_endpoint", "jwks_uri", "issuer")
        if not document.get(key)
    ]
    if missing:
        raise ProviderUnavailable(f"the discovery document lacks {', '.join(missing)}")
    with _lock:
        _cache[url] = (time.monotonic(), document)
    return document


def discovery_clear() -> None:
    with _lock:
        _cache.clear()


def _fail(request, message: str) -> None:
    setattr(request, FAILURE_ATTR, message)


class SluiceOIDCBackend(OIDCAuthenticationBackend):
    """Signs in a user the provider vouches for and syncs their roles from its groups."""

    def __init__(self, *args, **kwargs):
        # Endpoints are resolved in ``authenticate`` (discovery), not here: Django builds
        # every backend for every sign-in, the password ones included.
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.OIDC_OP_TOKEN_ENDPOINT = self.OIDC_OP_USER_ENDPOINT = None
        self.OIDC_OP_JWKS_ENDPOINT = None
        self.UserModel = auth.get_user_model()

    def authenticate(self, request, **kwargs):
        if request is None or not oidc_enabled() or "code" not in request.GET:
            return None
        document = discovery()
        self.OIDC_OP_TOKEN_ENDPOINT = document["token_endpoint"]
        self.OIDC_OP_USER_ENDPOINT = document.get("userinfo_endpoint")
        self.OIDC_OP_JWKS_ENDPOINT = document["jwks_uri"]
        return super().authenticate(request, **kwargs)

    def verify_token(self, token, **kwargs):
        payload = super().verify_token(token, **kwargs)
        # The library checks the signature and nonce; the issuer, audience and expiry too.
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if payload.get("iss") != discovery()["issuer"]:
            raise SuspiciousOperation("The ID token comes from another issuer.")
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("The ID token is for another client.")
        if float(payload.get("exp", 0)) < time.time():
            raise SuspiciousOperation("The ID token has expired.")
        return payload

    def get_user(self, user_id):
        # A session signed in through the provider ends when the user is deactivated.
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None

    def get_userinfo(self, access_token, id_token, payload):
        # The ID token's claims, completed by the userinfo endpoint when there is one.
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT:
            claims.update(super().get_userinfo(access_token, id_token, payload))
        return claims

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        request = self.request
        username = str(claims.get(settings.SLUICE_OIDC_USERNAME_CLAIM) or "").strip()
        try:
            UnicodeUsernameValidator()(username)
        except ValidationError:
            username = ""
        if not username or len(username) > 150:
            _fail(
                request,
                f"The identity provider sent no usable user name (claim "
                f"{settings.SLUICE_OIDC_USERNAME_CLAIM!r}); ask an administrator.",
            )
            return None
        groups = claims.get(settings.SLUICE_OIDC_GROUPS_CLAIM) or []
        if isinstance(groups, str):
            groups = [groups]
        unix_account = None
        if settings.SLUICE_OIDC_UNIX_CLAIM:
            unix_account = str(claims.get(settings.SLUICE_OIDC_UNIX_CLAIM) or "") or None
        try:
            user = directory_sync_user(
                username=username,
                email=str(claims.get("email") or ""),
                name=str(claims.get("name") or ""),
                groups=[str(g) for g in groups],
                source=DirectorySource.OIDC,
                subject=str(claims.get("sub") or username),
                unix_account=unix_account,
                sign_in=True,
            )
        except BusinessError as exc:
            _fail(request, exc.message)
            return None
        if not user.is_active:
            _fail(
                request,
                f"The account {username} is disabled in Sluice. Ask a platform admin if "
                "you should still have access.",
            )
            return None
        if not user.is_staff and not user.memberships.exists():
            _fail(
                request,
                f"You signed in as {username}, but none of your groups at the identity "
                "provider grants a role in Sluice. Ask your team's admin to add you to "
                "the right group.",
            )
            return None
        return user


class SluiceOIDCRequestView(OIDCAuthenticationRequestView):
    """Sends the browser to the provider (authorization code flow with PKCE)."""

    def __init__(self, *args, **kwargs):
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID

    def get(self, request):
        if not oidc_enabled():
            return HttpResponseRedirect(reverse("login"))
        try:
            self.OIDC_OP_AUTH_ENDPOINT = discovery()["authorization_endpoint"]
        except ProviderUnavailable:
            messages.error(
                request,
                "The identity provider cannot be reached right now; try again in a few minutes.",
            )
            return HttpResponseRedirect(reverse("login"))
        return super().get(request)


class SluiceOIDCCallbackView(OIDCAuthenticationCallbackView):
    """Where the provider sends the browser back; every failure is a message on the login
    page, never an error page."""

    @property
    def failure_url(self):
        return reverse("login")

    def get(self, request):
        error = request.GET.get("error")
        try:
            response = super().get(request)
        except ProviderUnavailable:
            _fail(request, "The identity provider cannot be reached right now; try again.")
            return self.login_failure()
        except SuspiciousOperation as exc:
            log.warning("OIDC sign-in refused: %s", exc)
            _fail(
                request,
                "The sign-in could not be verified (it may have expired or been started "
                "in another window); please sign in again.",
            )
            return self.login_failure()
        except requests.RequestException as exc:
            log.warning("OIDC token exchange failed: %s", exc)
            _fail(request, "The identity provider refused the sign-in; please try again.")
            return self.login_failure()
        if error and not hasattr(request, FAILURE_ATTR):
            description = request.GET.get("error_description", "")
            _fail(
                request,
                "The identity provider refused the sign-in"
                + (f": {description[:200]}" if description else f" ({error[:50]}).")
                + ("" if not description or description.endswith(".") else "."),
            )
            return self.login_failure()
        return response

    def login_failure(self):
        message = getattr(self.request, FAILURE_ATTR, None)
        if message is None and "code" in self.request.GET:
            message = "The sign-in through the identity provider failed; please try again."
        if message is not None:
            messages.error(self.request, message)
        return HttpResponseRedirect(self.failure_url)

    def login_success(self):
        response = super().login_success()
        from .models import DirectoryIdentity

        # Kept for the logout, which ends the provider's session too (id_token_hint).
        self.request.session["oidc_signed_in"] = DirectoryIdentity.objects.filter(
            user=self.user
        ).exists()
        return response


def provider_logout_url(request) -> str | None:
    """The provider's end-session URL for the signed-in user, if the provider has one."""
    if not oidc_enabled() or not request.session.get("oidc_id_token"):
        return None
    try:
        endpoint = discovery().get("end_session_endpoint")
    except ProviderUnavailable:
        return None
    if not endpoint:
        return None
    params = {
        "id_token_hint": request.session["oidc_id_token"],
        "client_id": settings.OIDC_RP_CLIENT_ID,
        "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
    }
    return f"{endpoint}?{urlencode(params)}"
