"""Inference services: a spec, scaling bounds and targets, its replicas (inference jobs) and
the autoscaler's decisions (the service's timeline)."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator
from django.db import models
from django.db.models import Q

from scheduling.models import Job, PriorityClass, Queue
from tenants.models import Project, Tenant, slug_validator

from .choices import ServiceState
from .scaling import model_field as scaling_field
from .spec import FIELDS_BY_NAME as SPEC

#: A replica whose job is in one of these states is alive (it holds or waits for GPUs).
LIVE_JOB_STATES = ("PENDING", "HELD", "ADMITTED", "RUNNING", "STOPPING")


class Service(models.Model):
    """An online inference service: replicas of one spec, as many as its load asks for,
    between ``min_replicas`` and ``max_replicas`` and within its tenant's quota.

    Each replica is an inference job placed by the engine like any other (queue, pool,
    quota, priority, reasons). Changing the spec (command, env, GPUs...) bumps
    ``spec_version``: replicas of the new version replace the old ones (rolling update).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="services")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="services")
    queue = models.ForeignKey(
        Queue,
        on_delete=models.PROTECT,
        related_name="services",
        help_text=SPEC["queue"].help_text,
    )
    name = models.CharField(max_length=SPEC["name"].max_length, validators=[slug_validator])
    description = models.TextField(blank=True, max_length=SPEC["description"].max_length)

    # --- the replica's spec (as a job's; declared in inference/spec.py) ---
    command = models.JSONField(help_text=SPEC["command"].help_text)
    env = models.JSONField(default=dict, blank=True)
    working_dir = models.CharField(max_length=SPEC["working_dir"].max_length, blank=True)
    gpus_per_node = models.PositiveSmallIntegerField(
        default=SPEC["gpus_per_node"].default,
        validators=[MaxValueValidator(SPEC["gpus_per_node"].max_value)],
        help_text=SPEC["gpus_per_node"].help_text,
    )
    gpu_models = models.JSONField(default=list, blank=True, help_text=SPEC["gpu_models"].help_text)
    priority_class = models.ForeignKey(
        PriorityClass,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text=SPEC["priority_class"].help_text,
    )
    health_path = models.CharField(
        max_length=SPEC["health_path"].max_length, default=SPEC["health_path"].default
    )
    metrics_path = models.CharField(
        max_length=SPEC["metrics_path"].max_length, default=SPEC["metrics_path"].default
    )
    image = models.CharField(
        max_length=SPEC["image"].max_length, blank=True, help_text=SPEC["image"].help_text
    )
    image_pull_policy = models.CharField(
        max_length=20, choices=SPEC["image_pull_policy"].choices, blank=True
    )
    image_pull_secret = models.CharField(
        max_length=SPEC["image_pull_secret"].max_length, blank=True
    )

    # --- scaling bounds and targets (declared in inference/scaling.py) ---
    min_replicas = scaling_field("min_replicas")
    max_replicas = scaling_field("max_replicas")
    target_running_per_replica = scaling_field("target_running_per_replica")
    latency_slo_ms = scaling_field("latency_slo_ms")
    error_rate_max = scaling_field("error_rate_max")
    gpu_util_max = scaling_field("gpu_util_max")
    stable_window_s = scaling_field("stable_window_s")
    panic_window_s = scaling_field("panic_window_s")
    panic_threshold = scaling_field("panic_threshold")
    scale_up_max_step = scaling_field("scale_up_max_step")
    scale_down_delay_s = scaling_field("scale_down_delay_s")
    scale_to_zero = scaling_field("scale_to_zero")
    scale_to_zero_grace_s = scaling_field("scale_to_zero_grace_s")

    # --- where it stands ---
    spec_version = models.PositiveIntegerField(default=1)
    state = models.CharField(
        max_length=10, choices=ServiceState.choices, default=ServiceState.ACTIVE, db_index=True
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="services"
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # Written by the autoscale task (derived: losing it only restarts the windows).
    autoscaler_state = models.JSONField(default=dict, blank=True)
    desired_replicas = models.PositiveIntegerField(default=0)
    decided_at = models.DateTimeField(null=True, blank=True)
    last_reason_code = models.CharField(max_length=40, blank=True)
    blocked_reason_code = models.CharField(max_length=40, blank=True)
    blocked_reason_message = models.TextField(blank=True)
    near_capacity = models.BooleanField(
        default=False,
        help_text="At max_replicas or the quota while the load is above target.",
    )

    class Meta:
        ordering = ["tenant__slug", "project__slug", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"],
                condition=~Q(state=ServiceState.DELETED),
                name="service_unique_name_per_project",
            ),
            models.CheckConstraint(
                condition=Q(min_replicas__lte=models.F("max_replicas")),
                name="service_min_le_max",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}"

    @property
    def serve(self) -> dict:
        """What a replica job carries in ``Job.serve``."""
        return {"health_path": self.health_path, "metrics_path": self.metrics_path}


class ServiceReplica(models.Model):
    """One replica of a service: the inference job that runs it. Retired when its job
    ended (replaced) or when the service cancelled it (scale-down, rolling update)."""

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="replicas")
    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="service_replica")
    spec_version = models.PositiveIntegerField()
    created_at = models.DateTimeField()
    retired_at = models.DateTimeField(null=True, blank=True)
    retire_reason = models.CharField(max_length=200, blank=True)
    drain_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="A ready replica leaving: out of the endpoints at once, its job cancelled "
        "at this time (once the load balancers have read the endpoints again).",
    )

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["service", "retired_at"], name="replica_service_live"),
            models.Index(
                fields=["drain_until"],
                condition=Q(drain_until__isnull=False),
                name="replica_draining",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.service_id}: job {self.job_id} (v{self.spec_version})"


class ScaleDecision(models.Model):
    """A line of the service's timeline: what the autoscaler decided and from what.

    Written when the desired count, the reason or the blocked reason changes, and at
    least every ``SLUICE_SERVICE_DECISION_EVERY_S`` (the charts' points)."""

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="decisions")
    at = models.DateTimeField()
    current = models.PositiveIntegerField()
    ready = models.PositiveIntegerField(default=0)
    desired = models.PositiveIntegerField()
    reason_code = models.CharField(max_length=40)
    reason = models.TextField()
    inputs = models.JSONField(default=dict, blank=True)
    blocked_reason_code = models.CharField(max_length=40, blank=True)
    blocked_reason_message = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["service", "-at"], name="scale_decision_service_at")]

    def __str__(self) -> str:
        return f"{self.service_id} at {self.at:%H:%M:%S}: {self.current} → {self.desired}"
