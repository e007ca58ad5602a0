"""``/api/v1/recommendations`` (see insights/api/recommendations.py)."""

from portal.api.routers import OptionalSlashRouter

from .recommendations import RecommendationViewSet

router = OptionalSlashRouter()
router.register("recommendations", RecommendationViewSet, basename="recommendation")

urlpatterns = router.urls
