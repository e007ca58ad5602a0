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
            reason = "python-ldap is not installed (pip install -r requirements.txt)"
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
