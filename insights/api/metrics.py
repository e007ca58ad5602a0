"""``GET /api/v1/metrics/summary``: the cluster now, in numbers, for dashboards and scripts.

Pools' totals are the same for everybody (capacity is no tenant's secret); queues and the
inference services near capacity are those the user may see (a platform admin: all; others:
their tenants')."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduling.selectors import queues_visible_to
from tenants.selectors import is_platform_admin

from ..metrics import metrics_summary
from ..selectors import NEAR_CAPACITY_WHY, services_near_capacity_for


class GpuFiguresSerializer(serializers.Serializer):
    total = serializers.IntegerField(help_text="GPUs of the pool (every node, every state).")
    allocated = serializers.IntegerField(help_text="GPUs held by a job.")
    used = serializers.FloatField(
        help_text="Sum of the allocated GPUs' utilization (0-1 each) in the agents' last "
        "samples: how many GPUs' worth of the allocation is used."
    )
    idle = serializers.IntegerField(
        help_text="Allocated GPUs sampled below their job's idle threshold."
    )
    free = serializers.IntegerField(help_text="Schedulable GPUs no job holds.")
    unavailable = serializers.IntegerField(
        help_text="GPUs no job holds on nodes not ready, or unhealthy."
    )


class GpuModelFiguresSerializer(GpuFiguresSerializer):
    gpu_model = serializers.CharField()


class PoolJobsSerializer(serializers.Serializer):
    pending = serializers.IntegerField()
    held = serializers.IntegerField()
    running = serializers.IntegerField(help_text="Jobs holding GPUs (admitted, running, stopping).")


class PoolSummarySerializer(serializers.Serializer):
    name = serializers.CharField()
    gpus = GpuFiguresSerializer()
    gpu_models = GpuModelFiguresSerializer(many=True)
    jobs = PoolJobsSerializer()


class QueueSummarySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    tenant = serializers.CharField()
    pool = serializers.CharField()
    depth = serializers.IntegerField(help_text="Pending jobs.")
    held = serializers.IntegerField(help_text="Held jobs (not considered until released).")
    pending_gpus = serializers.IntegerField(help_text="GPUs the pending jobs ask for.")
    running = serializers.IntegerField(help_text="Jobs of the queue holding GPUs.")
    longest_wait_seconds = serializers.FloatField(
        help_text="How long its longest-waiting pending job has waited (0: none waits)."
    )
    waiting_since = serializers.DateTimeField(
        allow_null=True, help_text="When that job's wait began."
    )
    reasons = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Pending jobs by reason code (NEW: not yet seen by a dispatch cycle).",
    )


class ServiceNearCapacitySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    project = serializers.CharField(source="project.slug")
    tenant = serializers.CharField(source="tenant.slug")
    replicas = serializers.IntegerField(source="live_replicas", help_text="Live replicas.")
    ready_replicas = serializers.IntegerField()
    max_replicas = serializers.IntegerField()
    why = serializers.ListField(
        source="why_codes",
        child=serializers.ChoiceField(choices=list(NEAR_CAPACITY_WHY)),
        help_text="What holds it: max_replicas (the load asks for more), quota (the tenant's "
        "quota in the pool stops more replicas), or both.",
    )
    near_since = serializers.DateTimeField(
        allow_null=True,
        help_text="First line of its timeline in the current stretch near capacity (null: "
        "not recorded).",
    )


class MetricsSummarySerializer(serializers.Serializer):
    generated_at = serializers.DateTimeField()
    pools = PoolSummarySerializer(many=True)
    queues = QueueSummarySerializer(many=True)
    services_near_capacity = ServiceNearCapacitySerializer(
        many=True,
        help_text="Inference services at their max replicas or their tenant's quota while "
        "the load asks for more, now (the insights page's count).",
    )


class MetricsSummaryView(APIView):
    """The cluster now: per pool its GPUs (total, allocated, used, idle, free) and jobs;
    per queue you can see, its depth and longest current wait."""

    @extend_schema(
        responses=MetricsSummarySerializer,
        summary="Cluster summary now",
        description="Per pool: GPUs total / allocated / used / idle / free / unavailable (also "
        "per GPU model) and pending / held / running jobs, for every signed-in user. Per "
        "queue (platform admins: all; others: their tenants' queues): depth, held jobs, GPUs "
        "asked for, running jobs, the longest current wait and the pending jobs by reason. "
        "The inference services near capacity now (of the same tenants).",
    )
    def get(self, request):
        user = request.user
        queue_ids = (
            None
            if is_platform_admin(user)
            else set(queues_visible_to(user).values_list("id", flat=True))
        )
        summary = metrics_summary(queue_ids=queue_ids)
        summary["services_near_capacity"] = services_near_capacity_for(user)
        return Response(MetricsSummarySerializer(summary).data)
