"""Sign-in through LDAP or Active Directory (django-auth-ldap) and the leavers sync.

At each sign-in (the login page and ``POST /api/v1/auth/token``) the directory's groups go
through ``directory_sync_user``: the user is created just in time (no local password) and
their roles follow the group mapping. ``ldap_sync_all`` (the ``identity.ldap_sync`` beat
task) looks every LDAP user up again: disabled or gone, they are deactivated, their
sessions ended and their tokens revoked; otherwise their roles are synced.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import ldap
from django.conf import settings
from django_auth_ldap.backend import LDAPBackend

from accounts.models import RobotAccount
from portal.errors import BusinessError

from .choices import DirectorySource
from .models import DirectoryIdentity
from .services import directory_sync_user, directory_user_disable

log = logging.getLogger(__name__)


class DirectoryUnavailable(Exception):
    """The directory did not answer (or refused the bind account): nothing is changed."""


def _first(attrs: dict, name: str) -> str:
    values = attrs.get(name) or attrs.get(name.lower()) or []
    return str(values[0]) if values else ""


def _uid_number(attrs: dict) -> int | None:
    raw = _first(attrs, settings.SLUICE_LDAP_UID_NUMBER_ATTR)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


class SluiceLDAPBackend(LDAPBackend):
    """django-auth-ldap's bind and group lookup; Sluice's own user and role sync."""

    signing_in = False

    def authenticate_ldap_user(self, ldap_user, password):
        self.signing_in = True
        return super().authenticate_ldap_user(ldap_user, password)

    def get_user(self, user_id):
        # A session signed in through LDAP ends when the user is deactivated.
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None

    def get_or_build_user(self, username, ldap_user):
        """The user, created or updated from the directory entry, roles synced."""
        if RobotAccount.objects.filter(user__username=username).exists():
            raise ldap_user.AuthenticationFailed(f"{username} is a robot account")
        attrs = ldap_user.attrs or {}
        name = _first(attrs, "displayName") or _first(attrs, "cn")
        try:
            user = directory_sync_user(
                username=username,
                email=_first(attrs, "mail"),
                name=name,
                groups=sorted(ldap_user.group_dns),
                source=DirectorySource.LDAP,
                subject=ldap_user.dn,
                unix_account=_first(attrs, settings.SLUICE_LDAP_UNIX_ATTR) or None,
                unix_uid=_uid_number(attrs),
                sign_in=self.signing_in,
            )
        except BusinessError as exc:
            log.warning("LDAP sign-in of %s refused: %s", username, exc.message)
            raise ldap_user.AuthenticationFailed(exc.message) from None
        if user is None or not user.is_active:
            raise ldap_user.AuthenticationFailed(f"{username} is deactivated in Sluice")
        return user, False


def _connection():
    """A connection bound as SLUICE_LDAP_BIND_DN, with the sign-in's TLS settings."""
    conn = ldap.initialize(settings.AUTH_LDAP_SERVER_URI)
    for option, value in settings.AUTH_LDAP_CONNECTION_OPTIONS.items():
        conn.set_option(option, value)
    try:
        if settings.AUTH_LDAP_START_TLS:
            conn.start_tls_s()
        conn.simple_bind_s(settings.AUTH_LDAP_BIND_DN, settings.AUTH_LDAP_BIND_PASSWORD)
    except ldap.LDAPError as exc:
        raise DirectoryUnavailable(f"LDAP bind failed: {exc}") from exc
    return conn


def _entry_state(conn, dn: str) -> str:
    """ "active", "disabled" or "gone" (no such entry, or it no longer matches the user
    filter) for the entry ``dn``."""
    disabled = settings.SLUICE_LDAP_DISABLED_FILTER
    try:
        found = conn.search_s(dn, ldap.SCOPE_BASE, "(objectClass=*)", ["1.1"])
        if not found:
            return "gone"
        if disabled and conn.search_s(dn, ldap.SCOPE_BASE, disabled, ["1.1"]):
            return "disabled"
    except ldap.NO_SUCH_OBJECT:
        return "gone"
    except ldap.LDAPError as exc:
        raise DirectoryUnavailable(f"LDAP search of {dn} failed: {exc}") from exc
    return "active"


@dataclass
class SyncResult:
    synced: int = 0
    disabled: int = 0
    gone: int = 0


def ldap_sync_all() -> SyncResult:
    """Look every LDAP user up again (the leavers sync): deactivate those disabled in or
    gone from the directory (sessions ended, tokens revoked, audited), sync the roles of
    the others. Raises ``DirectoryUnavailable`` (changing nothing more) when the directory
    does not answer: an unreachable server never deactivates anyone."""
    result = SyncResult()
    conn = _connection()
    try:
        identities = DirectoryIdentity.objects.select_related("user").filter(
            source=DirectorySource.LDAP, user__is_active=True
        )
        backend = SluiceLDAPBackend()
        for identity in identities.order_by("pk"):
            user = identity.user
            state = _entry_state(conn, identity.subject)
            if state == "active" and backend.populate_user(user.username) is None:
                # Not found by the user filter (moved out of the search base, or a filter
                # that now excludes it); an error would have failed _entry_state first.
                state = _entry_state(conn, identity.subject)
                state = "gone" if state == "active" else state
            if state == "active":
                result.synced += 1
                continue
            reason = (
                "Disabled in the directory"
                if state == "disabled"
                else "No longer in the directory (or outside SLUICE_LDAP_USER_FILTER)"
            )
            directory_user_disable(user=user, source=DirectorySource.LDAP, reason=reason)
            if state == "disabled":
                result.disabled += 1
            else:
                result.gone += 1
    finally:
        conn.unbind_s()
    return result
