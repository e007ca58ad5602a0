"""Every task the beat schedule names is a registered Celery task (a typo there would only
show as an error in the worker's log, every interval)."""

from django.conf import settings

from portal.celery import app


def test_every_scheduled_task_is_registered():
    app.loader.import_default_modules()
    names = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"insights.rollup", "insights.recommendations", "insights.policy_review"} <= names
    assert names <= set(app.tasks), names - set(app.tasks)
