"""The insights' API: metrics summary, usage (with CSV), recommendations."""

from django.urls import include, path

urlpatterns = [
    path("", include("insights.api.urls_metrics")),
    path("", include("insights.api.urls_usage")),
    path("", include("insights.api.urls_recommendations")),
]
