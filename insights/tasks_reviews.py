"""Tasks of the weekly policy review (see insights/tasks.py)."""

from __future__ import annotations

from celery import shared_task


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
    from .reviews import last_completed_week, policy_review_write

    week_start = last_completed_week()
    policy_review_write(week_start=week_start)
    return week_start.isoformat()
