"""What the insights read: compact rollups written by a beat task, each job's GPU samples,
daily usage for chargeback, recommendations and weekly policy reviews.

Rollup rows are per bucket (a minute or an hour, ``Resolution``); a minute row holds the
values sampled in that minute, an hour row the mean of its minutes (counts: the sum).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from scheduling.choices import WorkloadType
from scheduling.models import Gpu, Job, Queue, ResourcePool, SimulationRun
from tenants.models import Project, Tenant

from .choices import RecommendationKind, RecommendationState, Resolution


class QueueRollup(models.Model):
    """One queue in one bucket: how deep it was and how long the jobs admitted then waited."""

    resolution = models.CharField(max_length=6, choices=Resolution.choices)
    bucket = models.DateTimeField(help_text="Start of the minute or hour.")
    # No index on the rollups' foreign keys (12.7 MB of 90 days at 1,000 GPUs on PostgreSQL):
    # rows are read by bucket, and deleting a queue, pool or tenant is rare.
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False)
    pool = models.ForeignKey(
        ResourcePool, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    # No index on the foreign keys (12.7 MB of 90 days at 1,000 GPUs on PostgreSQL): rows are
    # read by bucket, and deleting a queue, pool or tenant is rare.
    pending_jobs = models.FloatField(default=0.0)
    pending_gpus = models.FloatField(default=0.0)
    admitted_jobs = models.PositiveIntegerField(default=0, help_text="Admitted in the bucket.")
    wait_p50_seconds = models.FloatField(null=True, blank=True)
    wait_p95_seconds = models.FloatField(null=True, blank=True)
    wait_max_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["resolution", "bucket", "queue"], name="queue_rollup_once"
            )
        ]
        # Reads by (resolution, bucket) use the unique index above: no second index.

    def __str__(self) -> str:
        return f"{self.queue_id} at {self.bucket:%Y-%m-%d %H:%M} ({self.resolution})"


class UsageRollup(models.Model):
    """GPUs of one pool and GPU model in one bucket, per tenant (``tenant`` null: the pool's
    whole capacity, allocated, used and idle, whoever held them).

    ``capacity_gpus`` is the pool's schedulable GPUs (tenant null) or the tenant's guarantee;
    ``allocated_gpus`` the GPUs held, ``used_gpus`` the sum of their utilization (0-1 each),
    ``idle_gpus`` those held below their policy's idle threshold.
    """

    resolution = models.CharField(max_length=6, choices=Resolution.choices)
    bucket = models.DateTimeField()
    pool = models.ForeignKey(
        ResourcePool, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="+", db_index=False
    )
    gpu_model = models.CharField(max_length=64)
    capacity_gpus = models.FloatField(default=0.0)
    allocated_gpus = models.FloatField(default=0.0)
    used_gpus = models.FloatField(default=0.0)
    idle_gpus = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["resolution", "bucket", "pool", "tenant", "gpu_model"],
                condition=models.Q(tenant__isnull=False),
                name="usage_rollup_tenant_once",
            ),
            models.UniqueConstraint(
                fields=["resolution", "bucket", "pool", "gpu_model"],
                condition=models.Q(tenant__isnull=True),
                name="usage_rollup_pool_once",
            ),
        ]
        indexes = [models.Index(fields=["resolution", "bucket"], name="usage_rollup_bucket")]

    def __str__(self) -> str:
        return f"{self.pool_id}/{self.gpu_model}/{self.tenant_id} at {self.bucket:%Y-%m-%d %H:%M}"


class GpuActivity(models.Model):
    """When a GPU was last busy (held by a job at or above its idle threshold): the GPUs
    idle longest are those with the oldest ``busy_at``."""

    gpu = models.OneToOneField(Gpu, on_delete=models.CASCADE, primary_key=True, related_name="+")
    busy_at = models.DateTimeField(null=True, blank=True)
    idle_since = models.DateTimeField(null=True, blank=True)
    sampled_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} busy at {self.busy_at}"


class JobGpuSeries(models.Model):
    """A job's GPUs over its run, sampled once a minute by the rollup writer.

    ``gpus`` names them (``node:index``); each point is ``[unix seconds, [utilization % per
    GPU], [memory MiB per GPU]]``. When the points pass a limit, neighbours are merged and
    ``step_seconds`` doubles, so a week-long job keeps a chart of bounded size.
    """

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="+")
    gpus = models.JSONField(default=list)
    points = models.JSONField(default=list)
    step_seconds = models.PositiveIntegerField(default=60)
    allocated_gpu_seconds = models.FloatField(default=0.0)
    used_gpu_seconds = models.FloatField(default=0.0)

    def __str__(self) -> str:
        return f"GPU series of job {self.job_id} ({len(self.points)} points)"


class UsageDay(models.Model):
    """GPU-hours allocated and used in one day (UTC) by one tenant, project, user, workload
    type, pool and GPU model: what chargeback reads."""

    day = models.DateField()
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    workload_type = models.CharField(max_length=20, choices=WorkloadType.choices)
    pool = models.ForeignKey(ResourcePool, on_delete=models.CASCADE, related_name="+")
    gpu_model = models.CharField(max_length=64)
    allocated_gpu_hours = models.FloatField(default=0.0)
    used_gpu_hours = models.FloatField(default=0.0)
    #: The allocated GPU-hours with a known utilization sample: where it is 0, the used
    #: GPU-hours say nothing (no samples), not 0 % used.
    sampled_gpu_hours = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            # A deleted user's or project's rows keep their hours (null): the writer, one beat
            # task, finds a row before it adds to it, so nulls need no constraint.
            models.UniqueConstraint(
                fields=["day", "tenant", "project", "user", "workload_type", "pool", "gpu_model"],
                name="usage_day_once",
            )
        ]
        indexes = [models.Index(fields=["day", "tenant"], name="usage_day_tenant")]

    def __str__(self) -> str:
        return f"{self.day} {self.tenant_id}: {self.allocated_gpu_hours:.1f} GPU-h"


class Recommendation(models.Model):
    """A change the history argues for, with its evidence; simulated, applied or dismissed.

    ``key`` identifies what it is about (kind and target): one open recommendation per key,
    refreshed by each daily run. ``change`` holds the what-if parameters of the change
    (``scheduling.services.whatif.clean_params``) or, for changes the simulator cannot
    replay, what ``apply`` does.
    """

    kind = models.CharField(max_length=24, choices=RecommendationKind.choices)
    key = models.CharField(max_length=200)
    state = models.CharField(
        max_length=10, choices=RecommendationState.choices, default=RecommendationState.OPEN
    )
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    title = models.CharField(max_length=300)
    evidence = models.JSONField(default=dict)
    change = models.JSONField(default=dict)
    simulation = models.ForeignKey(
        SimulationRun, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    dismiss_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["key"],
                condition=models.Q(state="open"),
                name="recommendation_open_once",
            )
        ]

    def __str__(self) -> str:
        return self.title


class PolicyReview(models.Model):
    """The weekly policy review: this week against the last (``figures``), written once a
    week by a beat task."""

    week_start = models.DateField(unique=True, help_text="Monday (UTC) of the week reviewed.")
    created_at = models.DateTimeField()
    figures = models.JSONField(default=dict)

    class Meta:
        ordering = ["-week_start"]

    def __str__(self) -> str:
        return f"policy review of the week of {self.week_start}"
