from django.urls import path

from . import robot_views, views

ROBOT = "tenants/<slug:slug>/robots/<slug:name>"
urlpatterns = [
    path("account/tokens/", views.token_list, name="account-tokens"),
    path("account/tokens/<int:pk>/revoke", views.token_revoke, name="account-token-revoke"),
    path("tenants/<slug:slug>/robots/", robot_views.robot_list, name="tenant-robots-page"),
    path(f"{ROBOT}/tokens", robot_views.robot_token_create, name="tenant-robot-token-create"),
    path(
        f"{ROBOT}/tokens/<int:pk>/revoke",
        robot_views.robot_token_revoke,
        name="tenant-robot-token-revoke",
    ),
    path(f"{ROBOT}/delete", robot_views.robot_delete, name="tenant-robot-delete"),
]
