"""Celery tasks of inference services: thin, idempotent, one leader at a time."""

from __future__ import annotations

import contextlib

from celery import shared_task
from django.db import connection

from scheduling.services.leader import file_leader_lock

# Any constant works; it only has to differ from the dispatch loop's.
_LEADER_LOCK_KEY = 0x51_1CE_5E7


@contextlib.contextmanager
def _leader_lock():
    """Yield True if this process runs the services' control loop for the block (a
    PostgreSQL advisory lock; a file lock on the embedded default), like the dispatch loop."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [_LEADER_LOCK_KEY])
            got = bool(cursor.fetchone()[0])
        try:
            yield got
        finally:
            if got:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [_LEADER_LOCK_KEY])
        return
    with file_leader_lock("services") as leader:
        yield leader


@shared_task(
    name="inference.services_tick",
    ignore_result=True,
    acks_late=False,
    soft_time_limit=50,
    time_limit=60,
)
def services_tick() -> dict:
    """Autoscale and reconcile every service (beat, every SLUICE_SERVICE_INTERVAL s)."""
    from .services import services_tick as run

    with _leader_lock() as leader:
        if not leader:
            return {"leader": False}
        return {"leader": True, **run()}


@shared_task(name="inference.decisions_prune", ignore_result=True)
def decisions_prune() -> int:
    """Drop timeline lines older than SLUICE_SERVICE_DECISION_DAYS (hourly)."""
    from .services import decisions_prune as run

    return run()
