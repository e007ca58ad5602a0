"""Fixtures of the portal tests."""

import pytest


@pytest.fixture(autouse=True)
def _audit_anchor_per_test(settings, tmp_path):
    """Each test its own audit anchor file: an anchor left by one test's log would report the
    next test's (different) log as tampered with."""
    settings.SLUICE_AUDIT_ANCHOR = tmp_path / "audit-anchor.json"
