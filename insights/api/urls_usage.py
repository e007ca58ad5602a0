"""``/api/v1/usage``: chargeback (see insights.api.usage); with or without the slash."""

from django.urls import path

from .usage import UsageSlashView, UsageView

urlpatterns = [
    path("usage", UsageView.as_view(), name="api-usage"),
    path("usage/", UsageSlashView.as_view()),
]
