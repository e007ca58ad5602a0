"""Tasks of the metrics (see insights/tasks.py)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="insights.metrics_totals", ignore_result=True, acks_late=False)
def metrics_totals() -> None:
    """Recount the totals ``/metrics`` serves (job outcomes, preemptions, reclaims) from
    the database: one pass over the history, here rather than in every scrape."""
    from .metrics import totals_refresh

    totals_refresh()
