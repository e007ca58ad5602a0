"""The insights' pages; each part has its own module (see the modules for their views)."""

from django.urls import include, path

urlpatterns = [
    path("", include("insights.urls_metrics")),
    path("", include("insights.urls_pages")),
    path("", include("insights.urls_usage")),
    path("", include("insights.urls_recommendations")),
    path("", include("insights.urls_reviews")),
]
