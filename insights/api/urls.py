"""The insights' API: ``/api/v1/metrics/summary``, ``/api/v1/usage`` (with CSV) and
``/api/v1/recommendations``; a trailing slash is optional, as everywhere in the API."""

from django.urls import path, re_path

from portal.api.routers import OptionalSlashRouter

from .views import MetricsSummaryView, RecommendationViewSet, UsageSlashView, UsageView

router = OptionalSlashRouter()
router.register("recommendations", RecommendationViewSet, basename="recommendation")

urlpatterns = [
    re_path(r"^metrics/summary/?$", MetricsSummaryView.as_view(), name="metrics-summary"),
    path("usage", UsageView.as_view(), name="api-usage"),
    path("usage/", UsageSlashView.as_view()),
    *router.urls,
]
