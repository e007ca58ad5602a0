from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter(trailing_slash="/?")
router.register("users", views.UserViewSet, basename="user")
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("projects", views.ProjectViewSet, basename="project")

member_list = views.MemberViewSet.as_view({"get": "list", "post": "create"})
member_detail = views.MemberViewSet.as_view(
    {"get": "retrieve", "patch": "partial_update", "delete": "destroy"}
)

urlpatterns = [
    path("tenants/<slug:tenant_slug>/members", member_list, name="tenant-members"),
    path(
        "tenants/<slug:tenant_slug>/members/<str:username>",
        member_detail,
        name="tenant-member-detail",
    ),
    *router.urls,
]
