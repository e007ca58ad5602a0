"""Django admin for platform configuration. Every change made here is audited like one made in the API."""

from django import forms
from django.contrib import admin

from audit.services import audit_record

from .models import (
    Allocation,
    Gpu,
    Job,
    Node,
    PriorityClass,
    PriorityRaise,
    ProjectQuota,
    Queue,
    Quota,
    ReclaimRecord,
    ResourcePool,
    RuntimeExtension,
    RuntimeHistory,
    TenantRaiseCeiling,
    WorkloadPolicy,
    clean_topology_label,
)
from .services.config import object_state


class AuditedAdmin(admin.ModelAdmin):
    """Writes an audit event (with before and after) for each save and delete in the admin."""

    def save_model(self, request, obj, form, change):
        before = object_state(type(obj).objects.get(pk=obj.pk)) if change else None
        super().save_model(request, obj, form, change)
        name = obj._meta.model_name
        audit_record(
            action=f"{name}.{'update' if change else 'create'}",
            target=obj,
            actor=request.user,
            tenant=getattr(obj, "tenant", None),
            before=before,
            after=object_state(obj),
            reason="Django admin",
        )

    def delete_model(self, request, obj):
        audit_record(
            action=f"{obj._meta.model_name}.delete",
            target=obj,
            actor=request.user,
            tenant=getattr(obj, "tenant", None),
            before=object_state(obj),
            reason="Django admin",
        )
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    readonly_fields = ["utilization", "memory_used_mb", "sampled_at"]


class ResourcePoolForm(forms.ModelForm):
    class Meta:
        model = ResourcePool
        fields = ["topology_label"]  # the admin adds the others

    def clean_topology_label(self):
        return clean_topology_label(self.cleaned_data.get("topology_label", ""))


@admin.register(ResourcePool)
class ResourcePoolAdmin(AuditedAdmin):
    form = ResourcePoolForm
    list_display = [
        "name",
        "purpose",
        "executor",
        "container_runtime",
        "allowed_workload_types",
        "topology_label",
    ]
    list_filter = ["executor"]
    readonly_fields = ["executor_capabilities"]


@admin.register(Node)
class NodeAdmin(AuditedAdmin):
    list_display = ["name", "pool", "state", "backend", "last_heartbeat"]
    list_filter = ["pool", "state"]
    inlines = [GpuInline]


@admin.register(PriorityClass)
class PriorityClassAdmin(AuditedAdmin):
    list_display = [
        "name",
        "value",
        "preemptible",
        "can_preempt",
        "requires_approval",
        "max_grant_hours",
    ]


@admin.register(WorkloadPolicy)
class WorkloadPolicyAdmin(AuditedAdmin):
    list_display = [
        "workload_type",
        "preemptible",
        "default_runtime_seconds",
        "max_runtime_seconds",
        "stop_grace_seconds",
        "idle_reclaim_enabled",
        "max_wait_seconds",
        "max_preemptions",
        "preemption_protection_seconds",
        "topology_wait_seconds",
    ]
    filter_horizontal = ["allowed_pools"]


@admin.register(Quota)
class QuotaAdmin(AuditedAdmin):
    list_display = [
        "tenant",
        "pool",
        "gpu_model",
        "guaranteed_gpus",
        "borrow_limit_gpus",
        "max_running_jobs",
    ]
    list_filter = ["pool", "tenant"]

    # The quota history (QuotaChange) follows edits made here too.
    def save_model(self, request, obj, form, change):
        from .services.config import quota_history_record, quota_scope

        before = quota_scope(Quota.objects.get(pk=obj.pk)) if change else None
        super().save_model(request, obj, form, change)
        quota_history_record(before=before, after=quota_scope(obj))

    def delete_model(self, request, obj):
        from .services.config import quota_history_record, quota_scope

        quota_history_record(before=quota_scope(obj), after=None)
        super().delete_model(request, obj)


@admin.register(ProjectQuota)
class ProjectQuotaAdmin(AuditedAdmin):
    list_display = ["project", "pool", "max_gpus"]


@admin.register(Queue)
class QueueAdmin(AuditedAdmin):
    list_display = [
        "name",
        "tenant",
        "project",
        "environment",
        "pool",
        "strict_fifo",
        "time_sharing",
        "state",
    ]
    list_filter = ["tenant", "pool", "environment", "state", "time_sharing"]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Read-only: jobs change state only through the lifecycle services."""

    list_display = ["id", "name", "tenant", "queue", "state", "priority_class", "submitted_at"]
    list_filter = ["state", "workload_type", "tenant"]
    search_fields = ["name"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Allocation)
class AllocationAdmin(JobAdmin):
    list_display = ["id", "job", "node", "gpu", "borrowed", "granted_at", "released_at"]
    list_filter = ["borrowed"]
    search_fields = []


@admin.register(TenantRaiseCeiling)
class TenantRaiseCeilingAdmin(admin.ModelAdmin):
    """Saved through the same audited service as ``/api/v1/tenants/{slug}/raise-ceiling``."""

    list_display = ["tenant", "ceiling"]

    def get_readonly_fields(self, request, obj=None):
        return ["tenant"] if obj else []

    def save_model(self, request, obj, form, change):
        from .services.raises import tenant_raise_ceiling_set

        row = tenant_raise_ceiling_set(actor=request.user, tenant=obj.tenant, ceiling=obj.ceiling)
        obj.pk = row.pk

    def delete_model(self, request, obj):
        from .services.raises import tenant_raise_ceiling_set

        tenant_raise_ceiling_set(actor=request.user, tenant=obj.tenant, ceiling=None)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


@admin.register(PriorityRaise)
class PriorityRaiseAdmin(JobAdmin):
    """Read-only: raises change only through their services (API, approvals inbox)."""

    list_display = ["id", "tenant", "job", "project", "to_class", "state", "expires_at"]
    list_filter = ["state", "tenant"]
    search_fields = ["reason"]


@admin.register(RuntimeExtension)
class RuntimeExtensionAdmin(JobAdmin):
    """Read-only: extensions change only through their services (job page, API)."""

    list_display = ["id", "job", "tenant", "seconds", "state", "requested_by", "decided_by"]
    list_filter = ["state", "tenant"]
    search_fields = ["reason"]


@admin.register(ReclaimRecord)
class ReclaimRecordAdmin(JobAdmin):
    """Read-only: what timeouts, reclaims, requeues and zombie kills freed."""

    list_display = ["id", "created_at", "kind", "tenant", "workload_type", "job", "gpu_hours_freed"]
    list_filter = ["kind", "tenant", "workload_type"]
    search_fields = []


@admin.register(RuntimeHistory)
class RuntimeHistoryAdmin(JobAdmin):
    """Read-only: what runtime prediction learns from, kept as jobs end."""

    list_display = ["id", "project", "workload_type", "submitted_by", "updated_at"]
    list_filter = ["workload_type"]
    search_fields = []
