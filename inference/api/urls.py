from portal.api.routers import OptionalSlashRouter

from . import views

router = OptionalSlashRouter()
router.register("services", views.ServiceViewSet, basename="service")

urlpatterns = router.urls
