from django.urls import path

from portal.api.routers import OptionalSlashRouter

from . import views

router = OptionalSlashRouter()
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
