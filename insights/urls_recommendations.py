"""Pages of the recommendations (see insights/views_recommendations.py)."""

from django.urls import path

from . import views_recommendations as views

urlpatterns = [
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
]
