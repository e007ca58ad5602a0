"""The insights' pages: ``/metrics`` (Prometheus; no trailing slash, where scrapers look by
default), the insights page, usage accounting, the recommendations and the weekly policy
review."""

from django.urls import path

from . import views

urlpatterns = [
    path("metrics", views.prometheus_metrics, name="metrics"),
    path("insights/", views.insights, name="insights"),
    path("usage/", views.usage_page, name="usage"),
    path("recommendations/", views.recommendation_list, name="recommendations"),
    path("recommendations/run", views.recommendations_run_now, name="recommendations-run"),
    path("recommendations/<int:pk>/", views.recommendation_detail, name="recommendation"),
    path(
        "recommendations/<int:pk>/simulate",
        views.recommendation_simulate,
        name="recommendation-simulate",
    ),
    path("recommendations/<int:pk>/apply", views.recommendation_apply, name="recommendation-apply"),
    path(
        "recommendations/<int:pk>/dismiss",
        views.recommendation_dismiss,
        name="recommendation-dismiss",
    ),
    path("reviews/", views.policy_reviews, name="policy-reviews"),
    path("reviews/compute/", views.policy_review_compute, name="policy-review-compute"),
    path("reviews/<str:week_start>/", views.policy_review, name="policy-review"),
]
