from django.urls import path

from portal.api.routers import OptionalSlashRouter

from . import views

router = OptionalSlashRouter()
router.register("pools", views.PoolViewSet, basename="pool")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("quotas", views.QuotaViewSet, basename="quota")
router.register("queues", views.QueueViewSet, basename="queue")
router.register("priority-classes", views.PriorityClassViewSet, basename="priority-class")
router.register("workload-policies", views.WorkloadPolicyViewSet, basename="workload-policy")
router.register("jobs", views.JobViewSet, basename="job")
router.register("priority-raises", views.PriorityRaiseViewSet, basename="priority-raise")
router.register("notifications", views.NotificationViewSet, basename="notification")

urlpatterns = [
    path(
        "tenants/<slug:tenant_slug>/raise-ceiling",
        views.RaiseCeilingView.as_view(),
        name="tenant-raise-ceiling",
    ),
    *router.urls,
]
