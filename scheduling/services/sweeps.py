"""The periodic control checks run by beat. Each check is idempotent and safe to run twice."""

from __future__ import annotations

import logging

from django.utils import timezone

from . import limits, reclaim, recovery, serving
from .idempotency import idempotency_keys_expire
from .nodes import nodes_sweep_lost
from .raises import priority_raises_expire

log = logging.getLogger(__name__)

# Later features append (name, function(now) -> result) here; order matters little.
CHECKS: list = [("lost_nodes", nodes_sweep_lost)]
CHECKS.append(("raise_expiry", priority_raises_expire))
CHECKS += [
    ("stuck_launches", recovery.stuck_launches_requeue),
    ("runtime_limits", limits.runtime_limits_check),
    ("idle_reclaim", reclaim.idle_reclaim_check),
    ("session_age", reclaim.session_age_check),
    ("zombie_kills", recovery.zombies_sweep),
    ("retention_cleanup", recovery.retention_cleanup),
    ("job_events_retention", recovery.job_events_retention),
    ("idempotency_keys", idempotency_keys_expire),
    ("serve_samples", serving.serve_samples_expire),
]


def control_sweep(now=None) -> dict:
    now = now or timezone.now()
    results = {}
    for name, check in CHECKS:
        try:
            results[name] = check(now)
        except Exception:  # one failing check must not stop the others
            log.exception("control check %s failed", name)
            results[name] = "error"
    return results
