from portal.api.routers import OptionalSlashRouter

from . import views

router = OptionalSlashRouter()
router.register("audit-events", views.AuditEventViewSet, basename="audit-event")

urlpatterns = router.urls
