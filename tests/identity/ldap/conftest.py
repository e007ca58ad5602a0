"""A real slapd per test (tests/identity/ldap/slapd.py). Without slapd the tests skip,
unless SLUICE_REQUIRE_LDAP=1 (set by .ci/run) makes that a failure."""

import os

import pytest

from .slapd import Slapd, slapd_missing_reason


def _missing() -> str | None:
    reason = slapd_missing_reason()
    if reason is None:
        try:
            import ldap  # noqa: F401
        except ImportError:
            reason = "python-ldap is not installed (apt-get install libldap2-dev libsasl2-dev, then .venv/bin/pip install -r requirements-ldap.txt)"
    return reason


@pytest.fixture
def slapd(tmp_path):
    reason = _missing()
    if reason:
        if os.environ.get("SLUICE_REQUIRE_LDAP") == "1":
            pytest.fail(f"SLUICE_REQUIRE_LDAP=1 but {reason}")
        pytest.skip(reason)
    server = Slapd(tmp_path / "slapd").start()
    yield server
    server.stop()


@pytest.fixture
def ldap_on(slapd, settings, db):
    """Sluice configured for the test slapd as an operator would (SLUICE_LDAP_* through
    identity.ldap_config), with group mappings for tenant nlp and platform admin."""
    from identity.choices import GrantedRole, MappingSource
    from identity.ldap_config import ldap_settings
    from identity.models import DirectoryGroupRole
    from tests import factories as f

    from .slapd import BASE, BIND_DN, BIND_PASSWORD, DISABLED_FILTER, GROUPS, PEOPLE, group_dn

    env = {
        "SLUICE_LDAP_URI": slapd.uri,
        "SLUICE_LDAP_BIND_DN": BIND_DN,
        "SLUICE_LDAP_BIND_PASSWORD": BIND_PASSWORD,
        "SLUICE_LDAP_USER_SEARCH_BASE": PEOPLE,
        "SLUICE_LDAP_GROUP_SEARCH_BASE": GROUPS,
        "SLUICE_LDAP_CA_FILE": str(slapd.ca_file),
        "SLUICE_LDAP_DISABLED_FILTER": DISABLED_FILTER,
    }
    for name, value in ldap_settings(env).items():
        setattr(settings, name, value)
    settings.AUTHENTICATION_BACKENDS = [
        *settings.AUTHENTICATION_BACKENDS,
        "identity.ldap.SluiceLDAPBackend",
    ]
    tenant = f.TenantFactory(slug="nlp", name="Language")
    for group, role in [
        ("nlp-admins", GrantedRole.ADMIN),
        ("nlp-users", GrantedRole.MEMBER),
        ("nlp-viewers", GrantedRole.VIEWER),
    ]:
        DirectoryGroupRole.objects.create(
            source=MappingSource.LDAP, group=group_dn(group), tenant=tenant, role=role
        )
    DirectoryGroupRole.objects.create(
        source=MappingSource.LDAP,
        group=group_dn("platform-admins").upper(),  # DNs match case-insensitively
        role=GrantedRole.PLATFORM_ADMIN,
    )
    slapd.base = BASE
    slapd.tenant = tenant
    return slapd
