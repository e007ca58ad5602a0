"""Celery tasks of the insights, thin: each calls a service. The beat schedule
(``CELERY_BEAT_SCHEDULE`` in the settings) names them by their registered ``name=``, which
stays as it is whatever module holds them: queued messages carry it."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="insights.rollup", ignore_result=True, acks_late=False)
def rollup() -> dict:
    """One run of the rollup writer (every SLUICE_ROLLUP_INTERVAL seconds, by beat)."""
    from .services.rollups import rollup_write

    run = rollup_write()
    return run.as_dict() if run is not None else {"skipped": "another run holds the lock"}


@shared_task(name="insights.metrics_totals", ignore_result=True, acks_late=False)
def metrics_totals() -> None:
    """Recount the totals ``/metrics`` serves (job outcomes, preemptions, reclaims) from
    the database: one pass over the history, here rather than in every scrape."""
    from .metrics import totals_refresh

    totals_refresh()


@shared_task(name="insights.recommendations", ignore_result=True)
def recommendations() -> dict:
    """The daily recommendations run (control queue): the rules over the recorded history,
    the open recommendations refreshed."""
    from .services.recommendations import recommendations_refresh

    return recommendations_refresh()


@shared_task(
    name="insights.policy_review",
    ignore_result=True,
    acks_late=False,
    time_limit=900,
    soft_time_limit=870,
)
def policy_review() -> str:
    """The review of the week that ended last. Safe to run daily (or hourly): a week's review
    is written, and its admins notified, once."""
    from .reviews import last_completed_week
    from .services.reviews import policy_review_write

    week_start = last_completed_week()
    policy_review_write(week_start=week_start)
    return week_start.isoformat()
