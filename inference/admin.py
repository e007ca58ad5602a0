from django.contrib import admin

from .models import ScaleDecision, Service, ServiceReplica


@admin.register(Service)
class ServiceAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "tenant",
        "project",
        "queue",
        "state",
        "min_replicas",
        "max_replicas",
        "desired_replicas",
        "spec_version",
        "near_capacity",
    ]
    list_filter = ["state", "near_capacity", "tenant"]
    search_fields = ["name"]
    # Changes go through the services (audited): the admin only reads.
    readonly_fields = [f.name for f in Service._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ServiceReplica)
class ServiceReplicaAdmin(admin.ModelAdmin):
    list_display = ["service", "job", "spec_version", "created_at", "retired_at", "retire_reason"]
    list_filter = ["retired_at"]
    raw_id_fields = ["service", "job"]


@admin.register(ScaleDecision)
class ScaleDecisionAdmin(admin.ModelAdmin):
    list_display = ["service", "at", "current", "desired", "reason_code", "blocked_reason_code"]
    list_filter = ["reason_code", "blocked_reason_code"]
    raw_id_fields = ["service"]
