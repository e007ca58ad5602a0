"""``/reviews/``: the weekly policy review."""

from django.urls import path

from .views_reviews import policy_review, policy_review_compute, policy_reviews

urlpatterns = [
    path("reviews/", policy_reviews, name="policy-reviews"),
    path("reviews/compute/", policy_review_compute, name="policy-review-compute"),
    path("reviews/<str:week_start>/", policy_review, name="policy-review"),
]
