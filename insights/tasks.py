"""Celery tasks of the insights, thin: each part keeps its own in a module imported here so
that Celery's autodiscovery (which reads ``tasks.py``) registers them all."""

from . import tasks_metrics, tasks_recommendations, tasks_reviews, tasks_rollups  # noqa: F401
