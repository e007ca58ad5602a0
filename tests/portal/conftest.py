"""Fixtures of the portal tests."""

import pytest


@pytest.fixture(autouse=True)
def _audit_anchor_per_test(settings, tmp_path):
    """Each test its own audit anchor file: an anchor left by one test's log would report the
    next test's (different) log as tampered with. It starts as ``migrate`` leaves it for a
    new installation: the empty log anchored at its start."""
    from django.utils import timezone

    from audit.anchor import Anchor, anchor_write

    settings.SLUICE_AUDIT_ANCHOR = tmp_path / "audit-anchor.json"
    settings.SLUICE_AUDIT_ANCHOR_COPY = None
    anchor_write(Anchor.genesis(timezone.now().isoformat(timespec="seconds")))
