from django.contrib import admin

from .models import PolicyReview, QueueRollup, Recommendation, UsageDay, UsageRollup


@admin.register(QueueRollup)
class QueueRollupAdmin(admin.ModelAdmin):
    list_display = [
        "bucket",
        "resolution",
        "queue",
        "pending_jobs",
        "admitted_jobs",
        "wait_p95_seconds",
    ]
    list_filter = ["resolution", "pool"]


@admin.register(UsageRollup)
class UsageRollupAdmin(admin.ModelAdmin):
    list_display = [
        "bucket",
        "resolution",
        "pool",
        "tenant",
        "gpu_model",
        "allocated_gpus",
        "used_gpus",
    ]
    list_filter = ["resolution", "pool"]


@admin.register(UsageDay)
class UsageDayAdmin(admin.ModelAdmin):
    list_display = [
        "day",
        "tenant",
        "project",
        "user",
        "workload_type",
        "gpu_model",
        "allocated_gpu_hours",
    ]
    list_filter = ["tenant", "workload_type"]


@admin.register(Recommendation)
class RecommendationAdmin(admin.ModelAdmin):
    list_display = ["title", "kind", "state", "tenant", "updated_at"]
    list_filter = ["kind", "state"]


@admin.register(PolicyReview)
class PolicyReviewAdmin(admin.ModelAdmin):
    list_display = ["week_start", "created_at"]
