"""``/usage/``: usage accounting (chargeback)."""

from django.urls import path

from .views_usage import usage_page

urlpatterns = [
    path("usage/", usage_page, name="usage"),
]
