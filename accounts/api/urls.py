from django.urls import path

from portal.api.routers import OptionalSlashRouter

from . import views
from .robots import RobotTokenViewSet, RobotViewSet

router = OptionalSlashRouter()
router.register("auth/tokens", views.ApiTokenViewSet, basename="api-token-manage")

robot_list = RobotViewSet.as_view({"get": "list", "post": "create"})
robot_detail = RobotViewSet.as_view(
    {"get": "retrieve", "patch": "partial_update", "delete": "destroy"}
)
robot_token_list = RobotTokenViewSet.as_view({"get": "list", "post": "create"})
robot_token_detail = RobotTokenViewSet.as_view({"delete": "destroy"})

ROBOT = "tenants/<slug:tenant_slug>/robots/<slug:name>"
urlpatterns = [
    path("auth/token", views.TokenView.as_view(), name="api-token"),
    path("tenants/<slug:tenant_slug>/robots", robot_list, name="tenant-robots"),
    path(ROBOT, robot_detail, name="tenant-robot-detail"),
    path(f"{ROBOT}/tokens", robot_token_list, name="tenant-robot-tokens"),
    path(f"{ROBOT}/tokens/<int:pk>", robot_token_detail, name="tenant-robot-token-detail"),
    *router.urls,
]
