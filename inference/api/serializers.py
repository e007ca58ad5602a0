"""Serializers of the services' API: input (create, change) and output kept apart."""

from __future__ import annotations

from rest_framework import serializers

from portal.api.filters import MAX_ID

from ..choices import ServiceState
from ..models import ScaleDecision, Service
from ..scaling import NAMES as SCALING_NAMES
from ..scaling import serializer_field as scaling_field
from ..scaling import with_settings
from ..spec import FIELDS_BY_NAME as SPEC
from ..spec import NAMES as SPEC_NAMES

SLUG = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"


class ServiceInputChecks(serializers.Serializer):
    """A service's own fields as the API takes them, and the checks that need two fields;
    ``ServiceInputSerializer`` adds the scaling settings (inference/scaling.py)."""

    project = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    queue = serializers.IntegerField(
        min_value=1, max_value=MAX_ID, help_text=SPEC["queue"].help_text
    )
    name = serializers.RegexField(SLUG, max_length=SPEC["name"].max_length)
    description = serializers.CharField(
        max_length=SPEC["description"].max_length, required=False, allow_blank=True
    )
    command = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        allow_empty=False,
        help_text=SPEC["command"].help_text,
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=SPEC["env"].max_length),
        required=False,
    )
    working_dir = serializers.CharField(
        max_length=SPEC["working_dir"].max_length, required=False, allow_blank=True
    )
    gpus_per_node = serializers.IntegerField(
        min_value=SPEC["gpus_per_node"].min_value,
        max_value=SPEC["gpus_per_node"].max_value,
        required=False,
        help_text=SPEC["gpus_per_node"].help_text,
    )
    gpu_models = serializers.ListField(
        child=serializers.CharField(max_length=SPEC["gpu_models"].max_length),
        required=False,
        max_length=SPEC["gpu_models"].max_items,
        help_text=SPEC["gpu_models"].help_text,
    )
    priority_class = serializers.CharField(
        max_length=SPEC["priority_class"].max_length,
        required=False,
        allow_blank=True,
        allow_null=True,
        help_text=SPEC["priority_class"].help_text,
    )
    health_path = serializers.CharField(max_length=SPEC["health_path"].max_length, required=False)
    metrics_path = serializers.CharField(max_length=SPEC["metrics_path"].max_length, required=False)
    image = serializers.CharField(
        max_length=SPEC["image"].max_length,
        required=False,
        allow_blank=True,
        help_text=SPEC["image"].help_text,
    )
    image_pull_policy = serializers.ChoiceField(
        choices=SPEC["image_pull_policy"].choices, required=False, allow_blank=True
    )
    image_pull_secret = serializers.CharField(
        max_length=SPEC["image_pull_secret"].max_length, required=False, allow_blank=True
    )

    def validate(self, attrs):
        """The checks that need two fields, where both are given (the service checks them
        again against the stored values)."""
        errors = {}
        lo, hi = attrs.get("min_replicas"), attrs.get("max_replicas")
        if lo is not None and hi is not None and lo > hi:
            errors["min_replicas"] = [f"min_replicas ({lo}) must not be above max_replicas ({hi})."]
        panic, stable = attrs.get("panic_window_s"), attrs.get("stable_window_s")
        if panic is not None and stable is not None and panic >= stable:
            errors["panic_window_s"] = ["The panic window must be shorter than the stable window."]
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


ServiceInputSerializer = with_settings(
    ServiceInputChecks,
    scaling_field,
    name="ServiceInputSerializer",
    doc="What a user gives to create a service (all of it) or change one (any part).",
)


class ServiceChangeSerializer(ServiceInputSerializer):
    """A change: every field optional; the project and name stay."""

    project = None
    name = None
    queue = serializers.IntegerField(
        min_value=1, max_value=MAX_ID, required=False, help_text=SPEC["queue"].help_text
    )
    command = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        allow_empty=False,
        required=False,
        help_text=SPEC["command"].help_text,
    )


class ServiceSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug")
    project_slug = serializers.CharField(source="project.slug")
    queue_name = serializers.CharField(source="queue.name")
    pool = serializers.CharField(source="queue.pool.name")
    priority_class = serializers.CharField(source="priority_class.name", allow_null=True)
    created_by = serializers.CharField(source="created_by.username")
    # Blank (no image) or one of the policies: documented so (a model field's blank is not).
    image_pull_policy = serializers.ChoiceField(
        choices=SPEC["image_pull_policy"].choices, allow_blank=True, read_only=True
    )
    replicas = serializers.IntegerField(
        source="live_replicas", read_only=True, help_text="Replicas alive (any spec version)."
    )
    ready_replicas = serializers.IntegerField(
        read_only=True, help_text="Replicas running and answering their health path."
    )
    state = serializers.ChoiceField(choices=ServiceState.choices, read_only=True)

    class Meta:
        model = Service
        fields = [
            "id",
            "tenant",
            "project",
            "project_slug",
            "queue",
            "queue_name",
            "pool",
            *(name for name in SPEC_NAMES if name != "queue"),
            *SCALING_NAMES,
            "spec_version",
            "state",
            "created_by",
            "created_at",
            "updated_at",
            "desired_replicas",
            "replicas",
            "ready_replicas",
            "decided_at",
            "last_reason_code",
            "blocked_reason_code",
            "blocked_reason_message",
            "near_capacity",
        ]
        read_only_fields = fields


class EndpointSerializer(serializers.Serializer):
    replica = serializers.IntegerField()
    job = serializers.IntegerField()
    spec_version = serializers.IntegerField()
    state = serializers.CharField(help_text="The replica job's state.")
    node = serializers.CharField(allow_null=True, help_text="Node name; null while waiting.")
    host = serializers.CharField(
        allow_null=True, help_text="The node's hostname (its name when it reported none)."
    )
    port = serializers.IntegerField(allow_null=True, help_text="The port the agent gave it.")
    ready = serializers.BooleanField(help_text="Running and answering its health path.")
    pending_reason_code = serializers.CharField(allow_blank=True)


class ScaleDecisionSerializer(serializers.ModelSerializer):
    class Meta:
        model = ScaleDecision
        fields = [
            "id",
            "at",
            "current",
            "ready",
            "desired",
            "reason_code",
            "reason",
            "inputs",
            "blocked_reason_code",
            "blocked_reason_message",
        ]
        read_only_fields = fields


class ServiceActionSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
