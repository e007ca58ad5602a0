"""What and where: pools, nodes, GPUs, quotas, queues, priority classes, policies, jobs."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from scheduling.engine import defaults as order_defaults
from tenants.models import Project, Tenant, slug_validator

from .choices import (
    DEFAULT_IDLE_THRESHOLD,
    ContainerRuntime,
    Environment,
    ExecutorKind,
    ExtensionState,
    GpuHealth,
    ImagePullPolicy,
    JobState,
    NodeState,
    NotificationKind,
    PoolPurpose,
    QueueState,
    RaiseState,
    ReclaimKind,
    SimulationState,
    StopReason,
    WorkloadType,
)
from .jobspec import FIELDS_BY_NAME as JOB
from .jobspec import column_help

#: The longest duration a workload policy may set for its scheduling times (a year): more
#: is no policy, and date arithmetic on it must stay within the calendar.
MAX_POLICY_SECONDS = 366 * 24 * 3600


class ResourcePool(models.Model):
    """A set of GPU nodes with a purpose; it restricts which workload types may run on it."""

    name = models.CharField(max_length=50, unique=True, validators=[slug_validator])
    purpose = models.CharField(
        max_length=20, choices=PoolPurpose.choices, default=PoolPurpose.GENERAL
    )
    allowed_workload_types = models.JSONField(
        default=list, blank=True, help_text="Workload types allowed here; empty means all."
    )
    description = models.TextField(blank=True, max_length=2000)
    executor = models.CharField(
        max_length=20,
        choices=ExecutorKind.choices,
        default=ExecutorKind.AGENT,
        help_text="What runs this pool's jobs: Sluice's node agent, Slurm or Kubernetes.",
    )
    container_runtime = models.CharField(
        max_length=20,
        choices=ContainerRuntime.choices,
        default=ContainerRuntime.NONE,
        blank=True,
        help_text="Slurm pools: pyxis when the nodes run container images (--container-image).",
    )
    executor_capabilities = models.JSONField(
        null=True,
        blank=True,
        help_text="What the pool's executor said it enforces when it last registered.",
    )
    topology_label = models.CharField(
        max_length=100,
        blank=True,
        default="topology.sluice.io/block",
        help_text="Node label naming the block (switch, rack or NVLink domain) a node is in: "
        "a multi-node job is kept inside one block. Blank: the topology is ignored.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def capabilities(self) -> dict:
        """What the pool's executor runs and enforces: as it registered, else the static
        capabilities of its kind."""
        if self.executor_capabilities:
            return self.executor_capabilities
        from scheduling.executors.capabilities import static_capabilities

        return static_capabilities(
            self.executor, container_runtime=self.container_runtime
        ).as_dict()

    @property
    def runs_images(self) -> bool:
        from scheduling.executors.capabilities import can_run_images

        return can_run_images(self.executor, container_runtime=self.container_runtime)

    def allows(self, workload_type: str) -> bool:
        return not self.allowed_workload_types or workload_type in self.allowed_workload_types


def clean_topology_label(value: str) -> str:
    """A pool's topology label, stripped; ValidationError when it cannot be a label name
    (spaces or NUL characters)."""
    value = (value or "").strip()
    if any(ch.isspace() or ch == "\x00" for ch in value):
        raise ValidationError("A label name has no spaces or NUL characters.")
    return value


def topology_block(labels: object, topology_label: str) -> str:
    """The topology block a node is in: the value of its pool's topology label among the
    node's labels; "" (in no block) when the pool ignores the topology or the node lacks
    the label."""
    if not topology_label or not isinstance(labels, dict):
        return ""
    value = labels.get(topology_label)
    return str(value).strip() if value not in (None, "") else ""


class Node(models.Model):
    """A GPU machine running a node agent; registered and updated by the agent's reports."""

    name = models.CharField(max_length=100, unique=True, validators=[slug_validator])
    pool = models.ForeignKey(ResourcePool, on_delete=models.PROTECT, related_name="nodes")
    state = models.CharField(max_length=10, choices=NodeState.choices, default=NodeState.READY)
    labels = models.JSONField(default=dict, blank=True)
    cpus = models.PositiveIntegerField(default=0)
    memory_mb = models.PositiveIntegerField(default=0)
    hostname = models.CharField(max_length=255, blank=True)
    backend = models.CharField(max_length=20, blank=True, help_text="nvml or simulated")
    agent_version = models.CharField(max_length=40, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(null=True, blank=True)
    zombies = models.JSONField(
        default=list, blank=True, help_text="GPU processes of no job, last report."
    )
    isolation = models.JSONField(
        default=dict,
        blank=True,
        help_text="What the agent said at start it can enforce (accounts, cgroups, devices).",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue_name(self) -> str:
        return f"node.{self.name}"

    @property
    def topology_block(self) -> str:
        """The topology block the node is in ("" none; see :func:`topology_block`)."""
        return topology_block(self.labels, self.pool.topology_label)


class Gpu(models.Model):
    """One GPU device of a node, with its last utilization and memory sample."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=80, unique=True)
    model = models.CharField(max_length=40, db_index=True, help_text="Normalized, e.g. H100-80GB")
    memory_mb = models.PositiveIntegerField()
    health = models.CharField(max_length=10, choices=GpuHealth.choices, default=GpuHealth.HEALTHY)
    utilization = models.FloatField(null=True, blank=True)
    memory_used_mb = models.PositiveIntegerField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    sampled_at = models.DateTimeField(null=True, blank=True)
    held_outside = models.CharField(
        max_length=200,
        blank=True,
        help_text="What holds this GPU outside Sluice (a Slurm job of someone else), from "
        "the node's last heartbeat; empty: nothing. Sluice places no job on it meanwhile.",
    )

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node")
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index} ({self.model})"


class PriorityClass(models.Model):
    """A named priority level with rules about preemption and approval."""

    name = models.CharField(max_length=50, unique=True, validators=[slug_validator])
    value = models.IntegerField(unique=True)
    preemptible = models.BooleanField(default=False)
    can_preempt = models.BooleanField(default=False)
    requires_approval = models.BooleanField(default=False)
    max_grant_hours = models.PositiveIntegerField(
        default=24, validators=[MinValueValidator(1), MaxValueValidator(8784)]
    )
    description = models.TextField(blank=True, max_length=2000)

    class Meta:
        ordering = ["-value"]
        verbose_name_plural = "priority classes"

    def __str__(self) -> str:
        return self.name


class WorkloadPolicy(models.Model):
    """The rules for one workload type: preemption, runtime, grace, idle reclaim, retention."""

    workload_type = models.CharField(max_length=20, choices=WorkloadType.choices, unique=True)
    preemptible = models.BooleanField(default=True)
    default_runtime_seconds = models.PositiveIntegerField(
        default=4 * 3600, validators=[MinValueValidator(1)]
    )
    max_runtime_seconds = models.PositiveIntegerField(
        default=72 * 3600, validators=[MinValueValidator(1)]
    )
    stop_grace_seconds = models.PositiveIntegerField(default=30)
    min_runtime_before_preemption_seconds = models.PositiveIntegerField(default=300)
    requeue_on_preemption = models.BooleanField(default=True)
    requeue_on_lost = models.BooleanField(default=True)
    idle_reclaim_enabled = models.BooleanField(default=False)
    idle_utilization_threshold = models.FloatField(
        default=DEFAULT_IDLE_THRESHOLD,
        validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="Percent; a GPU below this is idle.",
    )
    idle_window_seconds = models.PositiveIntegerField(default=3600)
    idle_warning_lead_seconds = models.PositiveIntegerField(default=600)
    max_session_age_seconds = models.PositiveIntegerField(null=True, blank=True)
    extension_cap_seconds = models.PositiveIntegerField(
        default=0, help_text="Runtime extension granted at once; more needs an approval."
    )
    kill_zombies = models.BooleanField(default=False)
    retention_days = models.PositiveIntegerField(
        default=14,
        validators=[MaxValueValidator(36600)],
        help_text="Days logs and checkpoints are kept.",
    )
    # Enforced on the node by a cgroup v2 scope per job where the node supports it (the
    # nodes page says which nodes do); per GPU so that a bigger job gets more.
    cpu_limit_per_gpu = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.01)],
        help_text="CPU cores a job may use per GPU on a node (blank: no limit).",
    )
    memory_limit_mb_per_gpu = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(16)],
        help_text="Memory (MiB) a job may use per GPU on a node (blank: no limit).",
    )
    pids_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        default=4096,
        validators=[MinValueValidator(16)],
        help_text="Processes and threads a job may have on a node (blank: no limit).",
    )
    log_cap_mb = models.PositiveIntegerField(
        default=100,
        validators=[MinValueValidator(1)],
        help_text="Output kept per job attempt; beyond it the log is cut with a marker "
        "(the job goes on).",
    )
    allowed_pools = models.ManyToManyField(ResourcePool, blank=True, related_name="+")
    # Scheduling order and preemption churn (the engine's PendingJob.max_wait_seconds
    # and RunningJob.max_preemptions / preemption_protection_seconds).
    max_wait_seconds = models.PositiveIntegerField(
        default=int(order_defaults.MAX_WAIT_SECONDS),  # the engine's default, one definition
        validators=[MinValueValidator(60), MaxValueValidator(MAX_POLICY_SECONDS)],
        help_text="Maximum wait: after waiting this long (from its submission) a job goes "
        "before every job of its class and fair-share band that has waited less, whatever "
        "their size or runtime.",
    )
    max_preemptions = models.PositiveIntegerField(
        default=3,
        validators=[MaxValueValidator(1000)],
        help_text="Stops a job takes at most, every kind counted (preemption for a higher "
        "class, reclaim of borrowed GPUs); at the limit it runs on to its end (0: no limit).",
    )
    preemption_protection_seconds = models.PositiveIntegerField(
        default=0,
        validators=[MaxValueValidator(MAX_POLICY_SECONDS)],
        help_text="How long a job at its preemption limit is protected, from the start of "
        "its run (0: for the rest of the run).",
    )
    topology_wait_seconds = models.PositiveIntegerField(
        default=1800,
        validators=[MaxValueValidator(MAX_POLICY_SECONDS)],
        help_text="How long a multi-node job waits for one block that can hold it before it "
        "is spread over several blocks (0: spread at once when no block can hold it).",
    )

    class Meta:
        ordering = ["workload_type"]
        verbose_name_plural = "workload policies"

    def __str__(self) -> str:
        return f"policy:{self.workload_type}"


class Quota(models.Model):
    """A tenant's GPUs in a pool, for one GPU model (blank = any model)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey(ResourcePool, on_delete=models.CASCADE, related_name="quotas")
    gpu_model = models.CharField(
        max_length=40, blank=True, help_text="Blank: any model in the pool."
    )
    guaranteed_gpus = models.PositiveIntegerField(default=0)
    borrow_limit_gpus = models.PositiveIntegerField(default=0)
    max_running_jobs = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["tenant__slug", "pool__name", "gpu_model"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "pool", "gpu_model"], name="quota_unique_scope"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}@{self.pool.name}:{self.gpu_model or 'any'}"


class QuotaChange(models.Model):
    """A tenant's quota in a pool for a GPU model (blank: any), as in force from
    ``effective_from`` until the next change of the same scope: the history that usage bills
    each day against. Written by the quota services on every change of the guarantee or
    the borrow limit; a deleted quota (or one moved to another scope) ends with a change to
    0 GPUs. Keyed by scope, not by quota row, so that it outlives a deleted quota."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey(ResourcePool, on_delete=models.CASCADE, related_name="+")
    gpu_model = models.CharField(max_length=40, blank=True)
    guaranteed_gpus = models.PositiveIntegerField(default=0)
    borrow_limit_gpus = models.PositiveIntegerField(default=0)
    effective_from = models.DateTimeField()

    class Meta:
        ordering = ["tenant_id", "pool_id", "gpu_model", "effective_from", "id"]
        indexes = [
            models.Index(
                fields=["tenant", "pool", "gpu_model", "effective_from"], name="quota_change_scope"
            )
        ]

    def __str__(self) -> str:
        return (
            f"{self.tenant_id}@{self.pool_id}:{self.gpu_model or 'any'} from "
            f"{self.effective_from:%Y-%m-%d %H:%M}: {self.guaranteed_gpus} guaranteed"
        )


class ProjectQuota(models.Model):
    """An optional cap on a project's GPUs in a pool, inside its tenant's quota."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey(ResourcePool, on_delete=models.CASCADE, related_name="+")
    max_gpus = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "pool"], name="project_quota_unique")
        ]

    def __str__(self) -> str:
        return f"{self.project}@{self.pool.name} ≤ {self.max_gpus}"


class Queue(models.Model):
    """Where jobs are submitted: a tenant's (optionally a project's) lane into a pool."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="queues")
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="queues"
    )
    name = models.CharField(max_length=50, validators=[slug_validator])
    environment = models.CharField(
        max_length=12, choices=Environment.choices, default=Environment.EXPERIMENT
    )
    pool = models.ForeignKey(ResourcePool, on_delete=models.PROTECT, related_name="queues")
    allowed_workload_types = models.JSONField(
        default=list, blank=True, help_text="Empty means all."
    )
    default_priority_class = models.ForeignKey(
        PriorityClass, on_delete=models.PROTECT, related_name="+"
    )
    max_self_service_class = models.ForeignKey(
        PriorityClass,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Highest class a member may choose without approval.",
    )
    strict_fifo = models.BooleanField(default=False)
    time_sharing = models.BooleanField(
        default=False,
        help_text="Time-sharing: within one class, a job that has used more GPU-time may be "
        "stopped for a waiting job that has used less (least attained service). Only "
        "preemptible jobs that checkpoint (a checkpoint directory) are stopped for it.",
    )
    state = models.CharField(max_length=10, choices=QueueState.choices, default=QueueState.OPEN)
    description = models.TextField(blank=True, max_length=2000)

    class Meta:
        ordering = ["tenant__slug", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="queue_unique_name_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"

    def allows(self, workload_type: str) -> bool:
        return not self.allowed_workload_types or workload_type in self.allowed_workload_types


class Job(models.Model):
    """A unit of GPU work: its spec, where it stands, and what happened to it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="jobs")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="jobs")
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, related_name="jobs")
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs"
    )
    name = models.CharField(max_length=JOB["name"].max_length, help_text=column_help("name"))
    workload_type = models.CharField(
        max_length=20, choices=WorkloadType.choices, help_text=column_help("workload_type")
    )
    base_priority_class = models.ForeignKey(
        PriorityClass, on_delete=models.PROTECT, related_name="+"
    )
    priority_class = models.ForeignKey(
        PriorityClass,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Effective class (raises change it).",
    )
    state = models.CharField(max_length=10, choices=JobState.choices, default=JobState.PENDING)

    # --- spec (help texts, bounds and defaults declared in scheduling/jobspec.py) ---
    command = models.JSONField(help_text=column_help("command"))
    shell = models.BooleanField(default=JOB["shell"].default, help_text=column_help("shell"))
    env = models.JSONField(default=dict, blank=True, help_text=column_help("env"))
    working_dir = models.CharField(
        max_length=JOB["working_dir"].max_length, blank=True, help_text=column_help("working_dir")
    )
    gpus_per_node = models.PositiveSmallIntegerField(
        default=JOB["gpus_per_node"].default, help_text=column_help("gpus_per_node")
    )
    nodes = models.PositiveSmallIntegerField(
        default=JOB["nodes"].default, help_text=column_help("nodes")
    )
    gpu_models = models.JSONField(default=list, blank=True, help_text=column_help("gpu_model"))
    min_gpu_memory_mb = models.PositiveIntegerField(
        default=JOB["min_gpu_memory_mb"].default, help_text=column_help("min_gpu_memory_mb")
    )
    cpus = models.PositiveIntegerField(default=JOB["cpus"].default, help_text=column_help("cpus"))
    memory_mb = models.PositiveIntegerField(
        default=JOB["memory_mb"].default, help_text=column_help("memory_mb")
    )
    max_runtime_seconds = models.PositiveIntegerField(help_text=column_help("max_runtime_seconds"))
    checkpoint_dir = models.CharField(
        max_length=JOB["checkpoint_dir"].max_length,
        blank=True,
        help_text=column_help("checkpoint_dir"),
    )
    labels = models.JSONField(default=dict, blank=True, help_text=column_help("labels"))
    array_id = models.CharField(max_length=32, blank=True, db_index=True)
    array_index = models.PositiveIntegerField(null=True, blank=True)
    dataset = models.CharField(max_length=JOB["dataset"].max_length, blank=True)
    dataset_version = models.CharField(max_length=JOB["dataset_version"].max_length, blank=True)
    code_ref = models.CharField(
        max_length=JOB["code_ref"].max_length, blank=True, help_text=column_help("code_ref")
    )
    parameters = models.JSONField(default=dict, blank=True, help_text=column_help("parameters"))
    seed = models.BigIntegerField(null=True, blank=True)

    # --- container (executors that run images: kubernetes, slurm with pyxis) ---
    image = models.CharField(
        max_length=JOB["image"].max_length, blank=True, help_text=column_help("image")
    )
    image_pull_policy = models.CharField(
        max_length=20,
        choices=ImagePullPolicy.choices,
        blank=True,
        help_text=column_help("image_pull_policy"),
    )
    image_pull_secret = models.CharField(
        max_length=JOB["image_pull_secret"].max_length,
        blank=True,
        help_text=column_help("image_pull_secret"),
    )

    # --- times ---
    submitted_at = models.DateTimeField(db_index=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # --- where it stands (written by the dispatch loop) ---
    pending_reason_code = models.CharField(max_length=40, blank=True)
    pending_reason_message = models.TextField(blank=True)
    # The job's place in the last cycle's scheduling order, as a sort key: its positions in
    # its queue and pool are counted from it when read (scheduling.positions), so a job
    # leaving the head does not rewrite every job behind it. Kept only while PENDING or HELD.
    pending_rank = models.FloatField(null=True, blank=True)

    # --- waits (a requeued job waits again; see scheduling.waits) ---
    queued_at = models.DateTimeField(
        null=True, blank=True, help_text="When the current wait began (empty: at submission)."
    )
    waited_seconds = models.FloatField(
        default=0.0, help_text="The waits of the job's earlier attempts, summed."
    )
    first_wait_seconds = models.FloatField(
        null=True, blank=True, help_text="The first attempt's wait (set at the first requeue)."
    )

    # --- outcome and counters ---
    exit_code = models.IntegerField(null=True, blank=True)
    exit_signal = models.IntegerField(null=True, blank=True)
    failure_message = models.TextField(blank=True)
    requeue_count = models.PositiveIntegerField(default=0)
    preemption_count = models.PositiveIntegerField(default=0)
    stop_reason = models.CharField(max_length=12, choices=StopReason.choices, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    last_active_at = models.DateTimeField(
        null=True, blank=True, help_text="Last GPU sample above the idle threshold."
    )
    runtime_warnings_sent = models.JSONField(default=list, blank=True)
    idle_warning_sent_at = models.DateTimeField(null=True, blank=True)
    idle_exempt_until = models.DateTimeField(null=True, blank=True)
    log_size = models.PositiveBigIntegerField(default=0)

    # --- serving: a job that is an HTTP replica, scraped by its node's agent ---
    serve = models.JSONField(default=dict, blank=True, help_text=column_help("serve"))
    serve_port = models.PositiveIntegerField(
        null=True, blank=True, help_text="The port the agent gave the replica (latest sample)."
    )
    serve_ready = models.BooleanField(
        default=False, help_text="Whether the replica's health path answered 2xx (latest sample)."
    )

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["state", "queue"]),
            models.Index(fields=["tenant", "state"]),
            models.Index(fields=["submitted_by", "-id"]),
            # Jobs that ended in a period (failures on the insights page, reviews, rules).
            models.Index(fields=["state", "finished_at"], name="job_state_finished"),
            # The waiting jobs in scheduling order, per queue: positions are counted on it,
            # index only (scheduling.positions).
            models.Index(
                fields=["queue", "pending_rank", "id"],
                name="job_waiting_rank",
                condition=models.Q(
                    pending_rank__isnull=False, state__in=[JobState.PENDING, JobState.HELD]
                ),
            ),
            # A tenant's jobs newest first, and its deep pages (a member's lists).
            models.Index(fields=["tenant", "id"], name="job_tenant_id"),
            # The jobs list filtered by state and sorted by GPUs (ties by id, the same way).
            models.Index(fields=["state", "gpus_per_node", "id"], name="job_state_gpus"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name}"

    # Where a waiting job stands is read, not stored per job (see scheduling.positions):
    # positions are counted from ``pending_rank``, the estimate is in its pool's
    # ``PoolEstimates``. The reader attaches them first, with ``positions_attach`` (two
    # queries for a whole page); the properties never query: a read without it raises
    # ``PositionsNotAttached``. The setters are for code that builds a job with known values.
    @property
    def queue_position(self) -> int | None:
        """1-based place among the waiting jobs of its queue in the last cycle's order."""
        return self._standing()[0]

    @queue_position.setter
    def queue_position(self, value: int | None) -> None:
        self._set_standing(0, value)

    @property
    def pool_position(self) -> int | None:
        """1-based place among the waiting jobs of its pool in the last cycle's order."""
        return self._standing()[1]

    @pool_position.setter
    def pool_position(self, value: int | None) -> None:
        self._set_standing(1, value)

    @property
    def estimated_start(self):
        """When the last cycle expected the job to start at the latest (None: unknown, or
        the job does not wait)."""
        return self._standing()[2]

    @estimated_start.setter
    def estimated_start(self, value) -> None:
        self._set_standing(2, value)

    @property
    def guaranteed_start(self):
        """When the job is guaranteed to start by: set once it has waited its maximum wait
        and holds a reservation that backfill and later jobs may not take (None
        otherwise; scheduling/engine/reservations.py says what the bound does not cover)."""
        return self._standing()[3]

    @guaranteed_start.setter
    def guaranteed_start(self, value) -> None:
        self._set_standing(3, value)

    def _standing(self) -> tuple:
        cached = self.__dict__.get("_standing_cache")
        if cached is None:
            from .positions import PositionsNotAttached

            raise PositionsNotAttached(self)
        return cached

    def _set_standing(self, index: int, value) -> None:
        values = list(self.__dict__.get("_standing_cache") or (None, None, None, None))
        values[index] = value
        self.__dict__["_standing_cache"] = tuple(values)

    def refresh_from_db(self, *args, **kwargs) -> None:
        self.__dict__.pop("_standing_cache", None)
        super().refresh_from_db(*args, **kwargs)

    @property
    def attempt(self) -> int:
        """Each requeue starts a new attempt; node messages carry it so stale reports are ignored."""
        return self.requeue_count

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


class PoolEstimates(models.Model):
    """The estimated starts of a pool's waiting jobs as the last dispatch cycle computed
    them: one row per pool, rewritten whole when any changed. Most estimates move in most
    cycles (every job that starts or ends early shifts those behind it), so one row per
    pool costs a cycle far less than one row per waiting job."""

    pool = models.OneToOneField(
        ResourcePool, on_delete=models.CASCADE, primary_key=True, related_name="estimates"
    )
    computed_at = models.DateTimeField()
    starts = models.JSONField(
        default=dict, help_text='{"<job id>": unix seconds, or null when unknown}'
    )
    guaranteed = models.JSONField(
        default=dict,
        help_text='{"<job id>": unix seconds} of the jobs holding a bounded reservation',
    )

    class Meta:
        verbose_name_plural = "pool estimates"

    def __str__(self) -> str:
        return f"estimates of {self.pool_id} at {self.computed_at:%H:%M:%S}"


class Allocation(models.Model):
    """One GPU held by an admitted job; at most one active allocation per GPU (database constraint)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocations")
    borrowed = models.BooleanField(default=False)
    granted_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"],
                condition=Q(released_at__isnull=True),
                name="allocation_one_active_per_gpu",
            )
        ]
        indexes = [models.Index(fields=["job", "released_at"])]

    def __str__(self) -> str:
        return f"{self.job_id} on {self.gpu_id}"


class JobEvent(models.Model):
    """A line of a job's timeline."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField()
    kind = models.CharField(max_length=40)
    message = models.TextField(blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind}"


class RuntimeHistory(models.Model):
    """How the last finished jobs of a submitter in a project, of one workload type, used
    their runtime limits (``submitted_by`` empty: every submitter of the project): what
    runtime prediction reads (see scheduling.runtime_prediction).

    ``entries``: ``[finished_at (epoch seconds), runtime / limit]`` pairs, newest first, at
    most ``HISTORY_JOBS``; added to as jobs succeed or time out, in the transaction of
    their end (scheduling.services.runtime_history), so that a dispatch cycle reads a row
    per submitter and project instead of their jobs.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    workload_type = models.CharField(max_length=20, choices=WorkloadType.choices)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="Empty: every submitter of the project.",
    )
    entries = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "runtime histories"
        constraints = [
            models.UniqueConstraint(
                fields=["project", "workload_type", "submitted_by"],
                condition=Q(submitted_by__isnull=False),
                name="runtime_history_one_per_submitter",
            ),
            models.UniqueConstraint(
                fields=["project", "workload_type"],
                condition=Q(submitted_by__isnull=True),
                name="runtime_history_one_per_project",
            ),
        ]

    def __str__(self) -> str:
        who = self.submitted_by_id or "all"
        return f"{self.project_id}/{self.workload_type}/{who}: {len(self.entries)} jobs"


class TenantUsage(models.Model):
    """Decayed GPU-seconds per tenant: the fair-share history the engine orders by."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="usage")
    gpu_seconds = models.FloatField(default=0.0)
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.tenant.slug}: {self.gpu_seconds:.0f} GPU-s"


class PriorityRaise(models.Model):
    """A request to run one job, or a project's jobs during a window, at a higher class.

    Exactly one of ``job`` and ``project`` is set. A project raise (a release push) covers
    the project's jobs from ``window_start`` to ``window_end``, including jobs submitted
    while it is active. An approved raise is a grant that ends at ``expires_at``; while it
    lasts the covered jobs run at ``to_class`` (their ``priority_class``), and afterwards they
    go back to their ``base_priority_class`` (or the highest other grant still active).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="priority_raises")
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.CASCADE, related_name="priority_raises"
    )
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="priority_raises"
    )
    from_class = models.ForeignKey(
        PriorityClass,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The job's class when requested; empty for a project raise.",
    )
    to_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT, related_name="+")
    reason = models.TextField(max_length=2000)
    hours = models.FloatField(
        null=True, blank=True, help_text="Requested duration; empty: the class's maximum."
    )
    window_start = models.DateTimeField(null=True, blank=True)
    window_end = models.DateTimeField(null=True, blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="priority_raises"
    )
    state = models.CharField(
        max_length=10, choices=RaiseState.choices, default=RaiseState.PENDING, db_index=True
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True, max_length=2000)
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    ended_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Who revoked or cancelled it; empty when it expired.",
    )
    ended_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(job__isnull=False, project__isnull=True)
                | Q(job__isnull=True, project__isnull=False, window_end__isnull=False),
                name="priority_raise_one_scope",
            )
        ]
        indexes = [
            models.Index(fields=["tenant", "state"]),
            models.Index(fields=["state", "expires_at"]),
            models.Index(fields=["project", "state"]),
        ]

    def __str__(self) -> str:
        scope = f"job {self.job_id}" if self.job_id else f"project {self.project_id}"
        return f"raise {self.pk}: {scope} to {self.to_class.name}"

    @property
    def is_project_raise(self) -> bool:
        return self.project_id is not None


class TenantRaiseCeiling(models.Model):
    """The highest class a tenant's admins may approve raises to; above it, platform admins.

    No row for a tenant: its admins approve nothing, every raise goes to platform admins.
    """

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="raise_ceiling")
    ceiling = models.ForeignKey(PriorityClass, on_delete=models.PROTECT, related_name="+")

    def __str__(self) -> str:
        return f"{self.tenant.slug}: up to {self.ceiling.name}"


class Notification(models.Model):
    """A message to one user in the portal (and by e-mail when mail is enabled)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications"
    )
    created_at = models.DateTimeField()
    kind = models.CharField(max_length=30, choices=NotificationKind.choices)
    message = models.TextField(max_length=2000)
    link = models.CharField(max_length=300, blank=True)
    read_at = models.DateTimeField(null=True, blank=True)
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications"
    )
    priority_raise = models.ForeignKey(
        PriorityRaise,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="notifications",
    )

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["user", "read_at"])]

    def __str__(self) -> str:
        return f"{self.user_id} {self.kind}"


class RuntimeExtension(models.Model):
    """A request for more runtime for one job (DESIGN §4 step 4).

    Granted at once (``auto_granted``) while the job's granted extensions stay within its
    policy's ``extension_cap_seconds``; beyond that it waits for a tenant admin or platform
    admin (never the requester). Approved and auto-granted extensions have been added to
    ``job.max_runtime_seconds``.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="runtime_extensions")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    seconds = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    reason = models.TextField(max_length=2000)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runtime_extensions"
    )
    state = models.CharField(
        max_length=12, choices=ExtensionState.choices, default=ExtensionState.PENDING
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True, max_length=2000)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["job", "state"]),
            models.Index(fields=["tenant", "state"]),
        ]

    def __str__(self) -> str:
        return f"extension {self.pk}: job {self.job_id} +{self.seconds} s"


class ReclaimRecord(models.Model):
    """GPUs taken back from work that wasted them: one row per timeout, reclaim, requeue or
    zombie kill, written in the transaction of the stop, for the recovery metrics.

    ``gpu_hours_freed``: for an idle reclaim, the job's GPUs × how long they had been idle;
    for a zombie kill, 1 × how long the zombie had been seen; for every other kind, the
    job's GPUs × the time left until its runtime limit (so 0 for a timeout: it used all of
    its time).
    """

    created_at = models.DateTimeField(db_index=True)
    kind = models.CharField(max_length=20, choices=ReclaimKind.choices)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    workload_type = models.CharField(max_length=20, choices=WorkloadType.choices, blank=True)
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="reclaim_records"
    )
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    gpus = models.PositiveIntegerField(default=0)
    gpu_hours_freed = models.FloatField(default=0.0)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["tenant", "created_at"])]

    def __str__(self) -> str:
        return f"{self.kind} job {self.job_id}: {self.gpu_hours_freed:.2f} GPU-h"


class ServeSample(models.Model):
    """One scrape of a serving job's health and metrics endpoints by its node's agent,
    normalised from the vLLM / TGI / Triton / Sluice conventions (null: not exposed).
    ``latency_buckets`` is a cumulative histogram: [[le seconds, count], ...]; counters
    are cumulative as the replica exposes them. Kept ``SLUICE_SERVE_SAMPLE_RETENTION_HOURS``."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="serve_samples")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField()
    port = models.PositiveIntegerField(null=True, blank=True)
    ready = models.BooleanField(default=False)
    running = models.FloatField(null=True, blank=True)
    waiting = models.FloatField(null=True, blank=True)
    requests_total = models.FloatField(null=True, blank=True)
    errors_total = models.FloatField(null=True, blank=True)
    latency_buckets = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["at", "id"]
        # The unique (job, at) is the index the selector reads by, and what makes a
        # replayed report insert nothing twice; ``at`` alone is for the retention sweep.
        indexes = [models.Index(fields=["at"], name="serve_sample_at")]
        constraints = [models.UniqueConstraint(fields=["job", "at"], name="serve_sample_job_at")]

    def __str__(self) -> str:
        return f"job {self.job_id} at {self.at:%H:%M:%S}"


class ZombieProcess(models.Model):
    """A GPU process of no job, as the node's heartbeats report it; tracked by the zombie
    sweep so that it is killed once (and only after it has been seen for a while)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="zombie_processes")
    gpu_index = models.PositiveSmallIntegerField()
    pid = models.PositiveIntegerField()
    name = models.CharField(max_length=200, blank=True)
    memory_mb = models.PositiveIntegerField(null=True, blank=True)
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    kill_requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node_id", "gpu_index", "pid"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "gpu_index", "pid"], name="zombie_unique_per_gpu"
            )
        ]

    def __str__(self) -> str:
        return f"{self.node_id}/gpu{self.gpu_index} pid {self.pid}"


class SimulationRun(models.Model):
    """A what-if replay of the cluster's recorded jobs, asked for by a platform admin.

    ``params`` says what to replay and what to change (quotas, classes); the Celery task
    fills ``progress`` (0-100) while it runs and ``result`` (baseline vs changed) when done.
    """

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="simulation_runs"
    )
    params = models.JSONField(default=dict)
    state = models.CharField(
        max_length=10, choices=SimulationState.choices, default=SimulationState.QUEUED
    )
    progress = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(100)])
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"simulation {self.pk} ({self.state})"

    @property
    def finished(self) -> bool:
        return self.state in (SimulationState.DONE, SimulationState.FAILED)


class IdempotencyKey(models.Model):
    """A client's ``Idempotency-Key`` on a job submission and the answer it got, so that a
    retry with the same key (by the same user) gets the same answer instead of new jobs.

    The row is written in the transaction that creates the jobs: a request that fails
    leaves no key behind, and a concurrent request with the same key waits on the unique
    constraint, then replays the stored answer. Keys expire (``expires_at``)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="idempotency_keys"
    )
    key = models.CharField(max_length=255)
    endpoint = models.CharField(max_length=40, help_text="Which submission the key was used on.")
    request_hash = models.CharField(max_length=64, help_text="SHA-256 of the request body.")
    status_code = models.PositiveSmallIntegerField()
    response = models.JSONField()
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="idempotency_key_unique_per_user")
        ]

    def __str__(self) -> str:
        return f"{self.user_id}:{self.key}"
