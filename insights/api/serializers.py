"""Serializers of the insights' API: the metrics summary, the usage report (its query and
its rows) and the recommendations."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from .. import usage
from ..models import Recommendation
from ..recommendations import simulation_effect
from ..selectors import NEAR_CAPACITY_WHY

# -- the metrics summary ---------------------------------------------------------------------


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


# -- the usage report ---------------------------------------------------------------------------


class UsageQuerySerializer(serializers.Serializer):
    start = serializers.DateField(
        required=False, help_text="First day (UTC), included; default 29 days before the end."
    )
    end = serializers.DateField(
        required=False, help_text="Last day (UTC), included; default today."
    )
    group_by = serializers.ListField(
        child=serializers.CharField(max_length=40),
        required=False,
        max_length=len(usage.GROUP_BY_CHOICES) * 2,
        help_text="Any of " + ", ".join(usage.GROUP_BY_CHOICES) + " (repeat or comma-separate).",
    )
    tenant = serializers.ListField(
        child=serializers.SlugField(max_length=50), required=False, max_length=200
    )
    project = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
        required=False,
        max_length=200,
    )
    pool = serializers.ListField(
        child=serializers.CharField(max_length=50), required=False, max_length=200
    )
    user = serializers.ListField(
        child=serializers.CharField(max_length=150), required=False, max_length=200
    )

    def validate(self, attrs):
        end = attrs.get("end") or usage.default_range()[1]
        start = attrs.get("start") or usage.default_start(end)
        group_by = usage.split_values(attrs.get("group_by") or ()) or list(usage.DEFAULT_GROUP_BY)
        errors = {**usage.range_errors(start, end), **usage.group_by_errors(group_by)}
        if errors:
            raise serializers.ValidationError(errors)
        return usage.UsageQuery(
            start=start,
            end=end,
            group_by=usage.canonical_group_by(group_by),
            tenants=tuple(attrs.get("tenant") or ()),
            projects=tuple(attrs.get("project") or ()),
            pools=tuple(attrs.get("pool") or ()),
            users=tuple(attrs.get("user") or ()),
        )


class UsageRowSerializer(serializers.Serializer):
    """One row: the group columns asked for (others absent), then the figures."""

    day = serializers.DateField(required=False)
    tenant = serializers.CharField(required=False)
    project = serializers.CharField(required=False, allow_null=True)
    user = serializers.CharField(required=False, allow_null=True)
    workload_type = serializers.CharField(required=False)
    pool = serializers.CharField(required=False)
    gpu_model = serializers.CharField(required=False)
    allocated_gpu_hours = serializers.FloatField()
    used_gpu_hours = serializers.FloatField()
    sampled_gpu_hours = serializers.FloatField(
        help_text="Allocated GPU-hours with a known utilization sample."
    )
    utilization_pct = serializers.FloatField(
        allow_null=True,
        help_text="used / allocated; null when nothing was allocated or nothing was sampled "
        "(see utilization_note).",
    )
    utilization_note = serializers.CharField(
        allow_null=True,
        help_text='Why utilization_pct is null: "no samples" (GPU-hours held, no utilization '
        'sample: not 0 % used) or "nothing allocated"; null when it is a number.',
    )
    guaranteed_gpu_hours = serializers.FloatField(
        help_text="GPU-hours guaranteed by the matching quotas over the range (or day), each "
        "hour at the quota in force then (quota history)."
    )
    guarantee_allocated_pct = serializers.FloatField(allow_null=True)
    guarantee_used_pct = serializers.FloatField(allow_null=True)


class UsageReportSerializer(serializers.Serializer):
    start = serializers.DateField()
    end = serializers.DateField()
    hours = serializers.FloatField(help_text="Hours of the range gone so far.")
    group_by = serializers.ListField(child=serializers.CharField())
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = UsageRowSerializer(many=True)
    totals = UsageRowSerializer()


# -- the recommendations -------------------------------------------------------------------------


class RecommendationSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", allow_null=True, default=None)
    decided_by = serializers.CharField(source="decided_by.username", allow_null=True, default=None)
    impact_gpu_hours = serializers.SerializerMethodField()
    simulated_effect = serializers.SerializerMethodField()

    class Meta:
        model = Recommendation
        fields = [
            "id",
            "kind",
            "key",
            "state",
            "tenant",
            "title",
            "impact_gpu_hours",
            "evidence",
            "change",
            "simulation",
            "simulated_effect",
            "created_at",
            "updated_at",
            "decided_by",
            "decided_at",
            "dismiss_reason",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.FloatField())
    def get_impact_gpu_hours(self, rec) -> float:
        return float(rec.evidence.get("impact_gpu_hours") or 0)

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_simulated_effect(self, rec):
        """Null without a simulation; its state while it runs; figures before/after once done."""
        return simulation_effect(rec)


class DismissSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, allow_blank=False, trim_whitespace=True)


SimulationQueued = inline_serializer(
    "RecommendationSimulationQueued",
    {
        "simulation": serializers.IntegerField(),
        "state": serializers.CharField(),
        "url": serializers.CharField(),
        "recommendation": RecommendationSerializer(),
    },
)
