"""The LDAP / Active Directory settings, read from SLUICE_LDAP_* (portal.settings calls
this; imports no model). docs/operator/identity.md explains each setting."""

from __future__ import annotations

from collections.abc import Mapping

from django.core.exceptions import ImproperlyConfigured

GROUP_TYPES = ("groupOfNames", "groupOfUniqueNames", "posixGroup", "ad", "ad-nested")


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, got {raw!r}")


def _group_type(name: str):
    from django_auth_ldap import config

    kinds = {
        "groupOfNames": config.GroupOfNamesType,
        "groupOfUniqueNames": config.GroupOfUniqueNamesType,
        "posixGroup": config.PosixGroupType,
        "ad": config.ActiveDirectoryGroupType,
        # Nested groups through LDAP_MATCHING_RULE_IN_CHAIN (1.2.840.113556.1.4.1941).
        "ad-nested": config.NestedActiveDirectoryGroupType,
    }
    if name not in kinds:
        raise ImproperlyConfigured(
            f"SLUICE_LDAP_GROUP_TYPE must be one of {', '.join(GROUP_TYPES)}, got {name!r}"
        )
    return kinds[name]()


def ldap_settings(env: Mapping[str, str]) -> dict:
    """The AUTH_LDAP_* settings of django-auth-ldap and Sluice's own SLUICE_LDAP_* ones;
    empty when SLUICE_LDAP_URI is not set (LDAP sign-in off)."""
    uri = env.get("SLUICE_LDAP_URI", "").strip()
    if not uri:
        return {"SLUICE_LDAP_ENABLED": False}
    try:
        import ldap
        from django_auth_ldap.config import LDAPSearch
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"SLUICE_LDAP_URI is set but LDAP sign-in is not installed ({exc}): apt-get install "
            "libldap2-dev libsasl2-dev, then pip install -r requirements-ldap.txt"
        ) from exc

    start_tls = _bool(env, "SLUICE_LDAP_START_TLS", not uri.lower().startswith("ldaps://"))
    allow_plain = _bool(env, "SLUICE_LDAP_ALLOW_PLAIN", False)
    if not (uri.lower().startswith("ldaps://") or start_tls or allow_plain):
        raise ImproperlyConfigured(
            "SLUICE_LDAP_URI is ldap:// without SLUICE_LDAP_START_TLS: passwords would cross "
            "the network in clear. Use ldaps:// or StartTLS (SLUICE_LDAP_ALLOW_PLAIN=1 only "
            "for a directory on this host)."
        )
    user_base = env.get("SLUICE_LDAP_USER_SEARCH_BASE", "").strip()
    if not user_base:
        raise ImproperlyConfigured("SLUICE_LDAP_URI is set: set SLUICE_LDAP_USER_SEARCH_BASE too.")
    user_filter = env.get("SLUICE_LDAP_USER_FILTER", "").strip() or "(uid=%(user)s)"
    disabled = env.get("SLUICE_LDAP_DISABLED_FILTER", "").strip()
    # A disabled account is not found at sign-in: its password is never even checked.
    sign_in_filter = f"(&{user_filter}(!{disabled}))" if disabled else user_filter
    group_base = env.get("SLUICE_LDAP_GROUP_SEARCH_BASE", "").strip() or user_base
    group_type_name = env.get("SLUICE_LDAP_GROUP_TYPE", "").strip() or "groupOfNames"
    group_type = _group_type(group_type_name)
    group_class = {
        "groupOfNames": "(objectClass=groupOfNames)",
        "groupOfUniqueNames": "(objectClass=groupOfUniqueNames)",
        "posixGroup": "(objectClass=posixGroup)",
    }.get(group_type_name, "(objectClass=group)")
    options: dict = {ldap.OPT_REFERRALS: 0, ldap.OPT_NETWORK_TIMEOUT: 10}
    ca_file = env.get("SLUICE_LDAP_CA_FILE", "").strip()
    if ca_file:
        options[ldap.OPT_X_TLS_CACERTFILE] = ca_file
    options[ldap.OPT_X_TLS_REQUIRE_CERT] = ldap.OPT_X_TLS_DEMAND
    options[ldap.OPT_X_TLS_NEWCTX] = 0  # last: makes the TLS options above take effect
    unix_attr = env.get("SLUICE_LDAP_UNIX_ATTR", "").strip() or "uid"
    uid_number_attr = env.get("SLUICE_LDAP_UID_NUMBER_ATTR", "").strip() or "uidNumber"
    return {
        "SLUICE_LDAP_ENABLED": True,
        "AUTH_LDAP_SERVER_URI": uri,
        "AUTH_LDAP_BIND_DN": env.get("SLUICE_LDAP_BIND_DN", ""),
        "AUTH_LDAP_BIND_PASSWORD": env.get("SLUICE_LDAP_BIND_PASSWORD", ""),
        "AUTH_LDAP_START_TLS": start_tls,
        "AUTH_LDAP_CONNECTION_OPTIONS": options,
        "AUTH_LDAP_USER_SEARCH": LDAPSearch(user_base, ldap.SCOPE_SUBTREE, sign_in_filter),
        "AUTH_LDAP_GROUP_SEARCH": LDAPSearch(group_base, ldap.SCOPE_SUBTREE, group_class),
        "AUTH_LDAP_GROUP_TYPE": group_type,
        "AUTH_LDAP_USER_ATTRLIST": ["*", "+"],
        # Sluice keeps no copy of the directory's groups as Django groups; identity's
        # services turn them into roles (identity.ldap.SluiceLDAPBackend).
        "AUTH_LDAP_MIRROR_GROUPS": False,
        "AUTH_LDAP_FIND_GROUP_PERMS": False,
        "AUTH_LDAP_ALWAYS_UPDATE_USER": False,
        "AUTH_LDAP_CACHE_TIMEOUT": 0,
        "SLUICE_LDAP_USER_FILTER": user_filter,
        "SLUICE_LDAP_DISABLED_FILTER": disabled,
        "SLUICE_LDAP_UNIX_ATTR": unix_attr,
        "SLUICE_LDAP_UID_NUMBER_ATTR": uid_number_attr,
    }
