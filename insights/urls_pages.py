"""The insights page (charts and the five questions): insights.views."""

from django.urls import path

from . import views

urlpatterns: list = [
    path("insights/", views.insights, name="insights"),
]
