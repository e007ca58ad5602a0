"""Tasks of this part of the insights (see insights/tasks.py): the rollup writer."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="insights.rollup", ignore_result=True, acks_late=False)
def rollup() -> dict:
    """One run of the rollup writer (every SLUICE_ROLLUP_INTERVAL seconds, by beat)."""
    from .rollups import rollup_write

    run = rollup_write()
    return run.as_dict() if run is not None else {"skipped": "another run holds the lock"}
