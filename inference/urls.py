from django.urls import path

from . import views

urlpatterns = [
    path("services/", views.service_list, name="service-list"),
    path("services/new/", views.service_create, name="service-create"),
    path("services/<int:pk>/", views.service_detail, name="service-detail"),
    path("services/<int:pk>/edit/", views.service_edit, name="service-edit"),
    path("services/<int:pk>/<slug:step>", views.service_action, name="service-action"),
]
