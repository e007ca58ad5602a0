from django.urls import path

from portal.api.routers import OptionalSlashRouter

from . import views

router = OptionalSlashRouter()
router.register("auth/tokens", views.ApiTokenViewSet, basename="api-token-manage")

urlpatterns = [
    path("auth/token", views.TokenView.as_view(), name="api-token"),
    *router.urls,
]
