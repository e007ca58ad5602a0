from django.urls import path

from . import views

urlpatterns = [
    path("tenants/", views.tenant_list, name="tenant-list"),
    path("tenants/<slug:slug>/", views.tenant_detail, name="tenant-detail"),
    path("tenants/<slug:slug>/members/<str:username>/role", views.member_role, name="member-role"),
    path(
        "tenants/<slug:slug>/members/<str:username>/remove",
        views.member_remove,
        name="member-remove",
    ),
    path("tenants/<slug:slug>/projects/new", views.project_create, name="project-create"),
    path("projects/", views.project_list, name="project-list"),
    path("projects/<int:pk>/", views.project_detail, name="project-detail"),
]
