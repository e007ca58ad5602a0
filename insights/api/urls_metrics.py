"""``/api/v1/metrics/summary`` (a trailing slash is optional, as everywhere in the API)."""

from django.urls import re_path

from .metrics import MetricsSummaryView

urlpatterns: list = [
    re_path(r"^metrics/summary/?$", MetricsSummaryView.as_view(), name="metrics-summary"),
]
