"""``/metrics`` (Prometheus; no trailing slash, where scrapers look by default)."""

from django.urls import path

from . import views_metrics

urlpatterns: list = [
    path("metrics", views_metrics.metrics, name="metrics"),
]
