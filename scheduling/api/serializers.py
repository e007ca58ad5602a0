from datetime import datetime, timedelta

from django.core.exceptions import ObjectDoesNotExist
from django.db import models
from django.utils import timezone
from django.utils.functional import cached_property
from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers
from rest_framework.settings import api_settings
from rest_framework.utils.serializer_helpers import BindingDict

from tenants.models import Project, Tenant

from .. import jobspec
from ..choices import ImagePullPolicy, StopReason, WorkloadType
from ..jobspec import MAX_INT32
from ..models import (
    Allocation,
    Gpu,
    Job,
    JobEvent,
    Node,
    Notification,
    PriorityClass,
    PriorityRaise,
    Queue,
    Quota,
    ResourcePool,
    WorkloadPolicy,
    clean_topology_label,
)
from ..positions import positions_attach, positions_attached
from ..runtime_prediction import predict_live_runtimes, predict_runtime
from ..selectors import active_allocations_attach, names_attach
from ..waits import job_wait


class StrictCharField(serializers.CharField):
    """A JSON string and nothing else: numbers and booleans are refused, not turned into text."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


# Durations the columns would hold but date arithmetic cannot (a grant of 2**31 hours, a
# retention of 2**31 days end past year 9999): the API stops well short.
MAX_GRANT_HOURS = 366 * 24
MAX_RETENTION_DAYS = 100 * 366
# How far ahead a raise's window may lie.
RAISE_WINDOW_HORIZON = timedelta(days=10 * 366)

# --- platform objects -----------------------------------------------------------------------


class CapabilitiesSerializer(serializers.Serializer):
    """What a pool's executor runs and enforces (scheduling.executors.base.Capabilities)."""

    images = serializers.BooleanField()
    gpu_isolation = serializers.CharField()
    run_as = serializers.CharField()
    limits = serializers.ListField(child=serializers.CharField())
    serving = serializers.BooleanField()
    notes = serializers.ListField(child=serializers.CharField())


class PoolSerializer(serializers.ModelSerializer):
    allowed_workload_types = serializers.ListField(
        child=serializers.ChoiceField(choices=WorkloadType.choices), required=False, max_length=6
    )
    capabilities = serializers.SerializerMethodField(
        help_text="What the pool's executor runs and enforces: as it registered, else the "
        "static capabilities of its kind."
    )

    class Meta:
        model = ResourcePool
        fields = [
            "id",
            "name",
            "purpose",
            "allowed_workload_types",
            "description",
            "executor",
            "container_runtime",
            "topology_label",
            "capabilities",
        ]

    def validate_topology_label(self, value):
        return clean_topology_label(value)

    @extend_schema_field(CapabilitiesSerializer)
    def get_capabilities(self, pool):
        return pool.capabilities()


class GpuSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = Gpu
        fields = [
            "id",
            "node",
            "index",
            "uuid",
            "model",
            "memory_mb",
            "health",
            "utilization",
            "memory_used_mb",
            "temperature_c",
            "power_w",
            "sampled_at",
        ]
        read_only_fields = fields


class NodeSerializer(serializers.ModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="name", queryset=ResourcePool.objects.all())
    labels = serializers.DictField(
        child=StrictCharField(max_length=200, allow_blank=True), required=False
    )
    block = serializers.CharField(
        source="topology_block",
        read_only=True,
        help_text="The topology block the node is in: the value of its pool's "
        "topology_label among its labels (empty: none).",
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "pool",
            "state",
            "labels",
            "block",
            "cpus",
            "memory_mb",
            "hostname",
            "backend",
            "agent_version",
            "last_heartbeat",
            "registered_at",
            "zombies",
            "isolation",
        ]
        read_only_fields = [
            "id",
            "name",
            "isolation",
            "cpus",
            "memory_mb",
            "hostname",
            "backend",
            "agent_version",
            "last_heartbeat",
            "registered_at",
            "zombies",
        ]

    def validate_labels(self, value):
        if any("\x00" in key for key in value):  # PostgreSQL's jsonb cannot store it
            raise serializers.ValidationError("Label names must not contain NUL characters.")
        return value


class PriorityClassSerializer(serializers.ModelSerializer):
    class Meta:
        model = PriorityClass
        fields = [
            "id",
            "name",
            "value",
            "preemptible",
            "can_preempt",
            "requires_approval",
            "max_grant_hours",
            "description",
        ]
        extra_kwargs = {"max_grant_hours": {"max_value": MAX_GRANT_HOURS}}


class WorkloadPolicySerializer(serializers.ModelSerializer):
    allowed_pools = serializers.SlugRelatedField(
        slug_field="name", many=True, queryset=ResourcePool.objects.all(), required=False
    )

    class Meta:
        model = WorkloadPolicy
        fields = [
            "id",
            "workload_type",
            "preemptible",
            "default_runtime_seconds",
            "max_runtime_seconds",
            "stop_grace_seconds",
            "min_runtime_before_preemption_seconds",
            "requeue_on_preemption",
            "requeue_on_lost",
            "idle_reclaim_enabled",
            "idle_utilization_threshold",
            "idle_window_seconds",
            "idle_warning_lead_seconds",
            "max_session_age_seconds",
            "extension_cap_seconds",
            "kill_zombies",
            "retention_days",
            "cpu_limit_per_gpu",
            "memory_limit_mb_per_gpu",
            "pids_limit",
            "log_cap_mb",
            "max_wait_seconds",
            "max_preemptions",
            "preemption_protection_seconds",
            "topology_wait_seconds",
            "allowed_pools",
        ]
        extra_kwargs = {"retention_days": {"max_value": MAX_RETENTION_DAYS}}

    def validate(self, attrs):
        default = attrs.get(
            "default_runtime_seconds", getattr(self.instance, "default_runtime_seconds", None)
        )
        maximum = attrs.get(
            "max_runtime_seconds", getattr(self.instance, "max_runtime_seconds", None)
        )
        if default and maximum and default > maximum:
            raise serializers.ValidationError(
                {"default_runtime_seconds": ["Must not exceed max_runtime_seconds."]}
            )
        return attrs


class QuotaSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", queryset=Tenant.objects.all())
    pool = serializers.SlugRelatedField(slug_field="name", queryset=ResourcePool.objects.all())

    class Meta:
        model = Quota
        fields = [
            "id",
            "tenant",
            "pool",
            "gpu_model",
            "guaranteed_gpus",
            "borrow_limit_gpus",
            "max_running_jobs",
        ]
        validators = []  # uniqueness is checked by the service with a clear message


class QueueSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", queryset=Tenant.objects.all())
    project = serializers.PrimaryKeyRelatedField(
        queryset=Project.objects.all(), required=False, allow_null=True
    )
    pool = serializers.SlugRelatedField(slug_field="name", queryset=ResourcePool.objects.all())
    default_priority_class = serializers.SlugRelatedField(
        slug_field="name", queryset=PriorityClass.objects.all()
    )
    max_self_service_class = serializers.SlugRelatedField(
        slug_field="name", queryset=PriorityClass.objects.all()
    )
    allowed_workload_types = serializers.ListField(
        child=serializers.ChoiceField(choices=WorkloadType.choices), required=False, max_length=6
    )

    class Meta:
        model = Queue
        fields = [
            "id",
            "tenant",
            "project",
            "name",
            "environment",
            "pool",
            "allowed_workload_types",
            "default_priority_class",
            "max_self_service_class",
            "strict_fifo",
            "time_sharing",
            "state",
            "description",
        ]
        validators = []


# --- jobs -----------------------------------------------------------------------------------


def _to_list_of_str(values):
    return [str(v) if v is not None else None for v in values]


def _identity(value):
    return value


def _is_plain_datetime(field) -> bool:
    """A DateTimeField answering ISO 8601 in the current time zone (DRF's default)."""
    output = getattr(field, "format", api_settings.DATETIME_FORMAT)
    return (
        type(field) is serializers.DateTimeField
        and isinstance(output, str)
        and output.lower() == ISO_8601
        and not hasattr(field, "timezone")
    )


def _fast_converter(field):
    """What DRF's ``field.to_representation`` does, as a plain function where that is
    cheaper: its own bound method otherwise (it reads nothing of the serializer)."""
    kind = type(field)
    if kind is serializers.IntegerField:
        return int
    if kind is serializers.CharField:
        return str
    if kind is serializers.JSONField and not field.binary:
        return _identity
    if (
        kind is serializers.ListField
        and type(field.child) is serializers.CharField
        and not field.child.allow_null
    ):
        return _to_list_of_str
    return field.to_representation


class FastRepresentationMixin:
    """DRF's ``to_representation`` without building the serializer's fields for each
    serializer made (a job's ~60 fields were instantiated, deep-copied and bound
    on every request, a fifth of an API call's CPU).

    The fields are built once per class, on a template instance, and each readable field
    becomes (name, source attributes, converter); the answer is the same dict DRF makes
    (tests/scheduling/test_api_costs.py compares them). Method fields call this
    serializer's own ``get_<name>``. Declared and model fields only: a serializer whose
    fields depend on its context or instance must not use this."""

    @classmethod
    def _representation_plan(cls) -> list:
        plan = cls.__dict__.get("_fast_plan")
        if plan is None:
            plan = []
            for field in cls()._readable_fields:
                if isinstance(field, serializers.SerializerMethodField):
                    plan.append((field.field_name, None, field.method_name, field, False))
                else:
                    attrs = tuple(field.source_attrs)
                    convert = _fast_converter(field)
                    dated = _is_plain_datetime(field)
                    plan.append((field.field_name, attrs, convert, field, dated))
            cls._fast_plan = plan
        return plan

    def to_representation(self, instance):
        ret = {}
        zone = None
        for name, attrs, convert, field, dated in self._representation_plan():
            if attrs is None:
                ret[name] = getattr(self, convert)(instance)
                continue
            value = instance
            try:
                for attr in attrs:
                    value = getattr(value, attr)
            except (AttributeError, ObjectDoesNotExist):
                value = _SLOW
            if value is _SLOW or callable(value):
                # What DRF does for what the plain attribute walk cannot answer: a
                # missing object, a callable attribute, a default.
                try:
                    value = field.get_attribute(instance)
                except serializers.SkipField:
                    continue
            if dated and type(value) is datetime and value.tzinfo is not None:
                # DRF's DateTimeField, without looking the time zone up for each value.
                zone = zone or timezone.get_current_timezone()
                text = value.astimezone(zone).isoformat()
                ret[name] = text[:-6] + "Z" if text.endswith("+00:00") else text
                continue
            ret[name] = None if value is None else convert(value)
        return ret


_SLOW = object()


class AllocationSerializer(FastRepresentationMixin, serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")
    gpu_index = serializers.IntegerField(source="gpu.index")
    gpu_uuid = serializers.CharField(source="gpu.uuid")
    gpu_model = serializers.CharField(source="gpu.model")

    class Meta:
        model = Allocation
        fields = [
            "node",
            "gpu_index",
            "gpu_uuid",
            "gpu_model",
            "borrowed",
            "granted_at",
            "released_at",
        ]


class PendingReasonSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class ExpectedRuntimeSerializer(serializers.Serializer):
    """What the scheduler expects a job to run (see scheduling.runtime_prediction)."""

    seconds = serializers.IntegerField(
        allow_null=True, help_text="Expected runtime; null: no prediction, the limit is used."
    )
    declared_seconds = serializers.IntegerField(help_text="The job's runtime limit.")
    basis = serializers.ChoiceField(
        choices=["submitter", "project", "none"],
        help_text="submitter: the submitter's finished jobs of the project and workload "
        "type; project: the project's (every submitter); none: too few of either.",
    )
    jobs = serializers.IntegerField(help_text="Finished jobs the prediction read.")
    ratio = serializers.FloatField(
        allow_null=True, help_text="75th percentile of their runtime / limit ratios."
    )
    message = serializers.CharField()


class JobWaitSerializer(serializers.Serializer):
    """How long a job has waited for GPUs, re-waits after requeues included."""

    total_seconds = serializers.IntegerField(help_text="All its waits (first + re-waits).")
    first_seconds = serializers.IntegerField(help_text="Its first wait, submit to admission.")
    rewait_seconds = serializers.IntegerField(
        help_text="Its waits after requeues (preemptions, lost nodes, stuck launches)."
    )
    current_seconds = serializers.IntegerField(help_text="The current attempt's wait.")
    waiting = serializers.BooleanField(help_text="It waits now (the totals still grow).")
    since = serializers.DateTimeField(help_text="When the current attempt's wait began.")
    requeues = serializers.IntegerField()
    preemptions = serializers.IntegerField()
    message = serializers.CharField()


_DATETIME = serializers.DateTimeField()


class JobListSerializer(serializers.ListSerializer):
    """Predicts the runtimes and counts the positions of a whole page of jobs in one query
    each, not one per job; reads the names and the GPUs held of the jobs that were loaded
    without them (``names_attach``, ``active_allocations_attach``)."""

    def to_representation(self, data):
        jobs = list(data.all() if isinstance(data, models.manager.BaseManager) else data)
        names_attach(jobs)
        active_allocations_attach(jobs)
        self.child.predictions = predict_live_runtimes(jobs)
        positions_attach(jobs)
        return super().to_representation(jobs)


class JobSerializer(FastRepresentationMixin, serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug")
    project = serializers.CharField(source="project.slug")
    project_id = serializers.IntegerField()
    queue = serializers.CharField(source="queue.name")
    queue_id = serializers.IntegerField()
    pool = serializers.CharField(source="queue.pool.name")
    submitted_by = serializers.CharField(source="submitted_by.username")
    priority_class = serializers.CharField(source="priority_class.name")
    base_priority_class = serializers.CharField(source="base_priority_class.name")
    gpu_model = serializers.ListField(source="gpu_models", child=serializers.CharField())
    pending_reason = serializers.SerializerMethodField()
    # Counted from the last cycle's order when read (scheduling.positions).
    queue_position = serializers.IntegerField(read_only=True, allow_null=True)
    pool_position = serializers.IntegerField(read_only=True, allow_null=True)
    estimated_start = serializers.DateTimeField(read_only=True, allow_null=True)
    # Set once the job has waited its maximum wait and holds a bounded reservation.
    guaranteed_start = serializers.DateTimeField(read_only=True, allow_null=True)
    allocations = serializers.SerializerMethodField()
    expected_runtime = serializers.SerializerMethodField()
    wait = serializers.SerializerMethodField()
    # Blank while the job has not stopped (read-only model fields lose allow_blank).
    stop_reason = serializers.ChoiceField(
        choices=StopReason.choices, allow_blank=True, read_only=True
    )
    image_pull_policy = serializers.ChoiceField(
        choices=ImagePullPolicy.choices, allow_blank=True, read_only=True
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "state",
            "tenant",
            "project",
            "project_id",
            "queue",
            "queue_id",
            "pool",
            "submitted_by",
            "workload_type",
            "priority_class",
            "base_priority_class",
            "command",
            "shell",
            "env",
            "working_dir",
            "gpus_per_node",
            "nodes",
            "gpu_model",
            "min_gpu_memory_mb",
            "cpus",
            "memory_mb",
            "max_runtime_seconds",
            "checkpoint_dir",
            "labels",
            "array_id",
            "array_index",
            "dataset",
            "dataset_version",
            "code_ref",
            "parameters",
            "seed",
            "submitted_at",
            "admitted_at",
            "started_at",
            "finished_at",
            "pending_reason",
            "queue_position",
            "pool_position",
            "estimated_start",
            "guaranteed_start",
            "expected_runtime",
            "wait",
            "exit_code",
            "exit_signal",
            "failure_message",
            "stop_reason",
            "requeue_count",
            "preemption_count",
            "runtime_warnings_sent",
            "last_active_at",
            "idle_warning_sent_at",
            "idle_exempt_until",
            "allocations",
            "serve",
            "serve_port",
            "serve_ready",
            "image",
            "image_pull_policy",
            "image_pull_secret",
        ]
        read_only_fields = fields
        list_serializer_class = JobListSerializer

    #: Set by JobListSerializer for a page of jobs; a single job is predicted on its own.
    predictions: dict | None = None

    def to_representation(self, instance):
        # A page of jobs has its positions attached by JobListSerializer; one job here.
        if not positions_attached(instance):
            positions_attach([instance])
        return super().to_representation(instance)

    @extend_schema_field(ExpectedRuntimeSerializer(allow_null=True))
    def get_expected_runtime(self, job):
        """Null once the job has ended."""
        if self.predictions is not None:
            prediction = self.predictions.get(job.pk)
        else:
            prediction = predict_runtime(job)
        return prediction.as_dict() if prediction else None

    @extend_schema_field(JobWaitSerializer)
    def get_wait(self, job):
        wait = job_wait(job)
        return {
            "total_seconds": round(wait.total_seconds),
            "first_seconds": round(wait.first_seconds),
            "rewait_seconds": round(wait.rewait_seconds),
            "current_seconds": round(wait.current_seconds),
            "waiting": wait.waiting,
            "since": _DATETIME.to_representation(wait.since),
            "requeues": wait.requeues,
            "preemptions": wait.preemptions,
            "message": wait.message,
        }

    @extend_schema_field(PendingReasonSerializer(allow_null=True))
    def get_pending_reason(self, job):
        if not job.pending_reason_code:
            return None
        return {"code": job.pending_reason_code, "message": job.pending_reason_message}

    @extend_schema_field(AllocationSerializer(many=True))
    def get_allocations(self, job):
        # Uses the prefetched active allocations (see the view) to keep the query count flat.
        allocations = getattr(job, "active_allocations", None)
        if allocations is None:
            allocations = job.allocations.filter(released_at__isnull=True).select_related(
                "node", "gpu"
            )
        if not allocations:
            return []
        one = AllocationSerializer()
        return [one.to_representation(allocation) for allocation in allocations]


@extend_schema_field(
    {
        "oneOf": [
            {"type": "array", "items": {"type": "string"}, "minItems": 1},
            {"type": "string"},
        ]
    }
)
class CommandField(serializers.JSONField):
    """A list of argument strings, or (with shell=true) one shell string."""


_GPU_MODEL_LENGTH = jobspec.FIELDS_BY_NAME["gpu_model"].max_length


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "maxLength": _GPU_MODEL_LENGTH},
            {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": _GPU_MODEL_LENGTH},
            },
        ]
    }
)
class GpuModelField(serializers.JSONField):
    """One GPU model key or a list of acceptable ones; empty = any."""

    def to_internal_value(self, data):
        data = super().to_internal_value(data)
        if isinstance(data, str):
            data = [data] if data else []
        if not isinstance(data, list) or not all(
            isinstance(v, str) and 0 < len(v) <= _GPU_MODEL_LENGTH for v in data
        ):
            raise serializers.ValidationError(
                'Give one GPU model key or a list of them, e.g. "H100-80GB".'
            )
        return data


def submit_field(field: jobspec.JobField) -> serializers.Field:
    """The submit API's field for a declared job field (scheduling/jobspec.py)."""
    kwargs: dict = {"help_text": jobspec.help_for_api(field)}
    if not field.required:
        default = field.default
        # A fresh empty object or list for every submission, never one shared.
        kwargs.update(required=False, default=type(default) if default in ({}, []) else default)
    if field.nullable:
        kwargs["allow_null"] = True
    kind = field.kind
    if kind in (jobspec.ID, jobspec.INT, jobspec.DURATION):
        return serializers.IntegerField(
            min_value=field.min_value, max_value=field.max_value, **kwargs
        )
    if kind in (jobspec.TEXT, jobspec.CLASS):
        return serializers.CharField(max_length=field.max_length, allow_blank=True, **kwargs)
    if kind == jobspec.CHOICE:
        return serializers.ChoiceField(
            choices=field.choices, allow_blank=not field.required, **kwargs
        )
    if kind == jobspec.BOOL:
        return serializers.BooleanField(**kwargs)
    if kind == jobspec.STRINGS:
        child = StrictCharField(allow_blank=True, max_length=field.max_length)
        return serializers.DictField(child=child, **kwargs)
    if kind == jobspec.OBJECT:
        return serializers.DictField(**kwargs)
    if kind == jobspec.COMMAND:
        return CommandField(**kwargs)  # its size in bytes is checked by the service
    if kind == jobspec.MODELS:
        return GpuModelField(**kwargs)
    raise ValueError(f"{field.name}: no API field for the kind {kind!r}")


def submit_fields(fields=jobspec.JOB_FIELDS) -> dict[str, serializers.Field]:
    return {field.name: submit_field(field) for field in fields}


class JobSubmitChecks(serializers.Serializer):
    """How a submitted spec is read; ``JobSubmitSerializer`` adds the declared fields.

    DRF copies and binds every declared field for each serializer made: for a submission,
    more than its validation. These fields are made and bound once per class, to a
    serializer of their own, and shared: a submission's serializer is only validated, no
    field reads the context or the serializer it is bound to, and validating changes no
    field. A partial serializer (none is made today) gets its own, as DRF makes them."""

    @cached_property
    def fields(self):
        if self.partial:
            return super().fields
        cls = type(self)
        shared = cls.__dict__.get("_shared_fields")
        if shared is None:
            owner = cls()
            shared = BindingDict(owner)
            for name, field in owner.get_fields().items():
                shared[name] = field
            cls._shared_fields = shared
        return shared


def submit_serializer_class(fields=jobspec.JOB_FIELDS) -> type[serializers.Serializer]:
    """The submit serializer with one field per declared job field, made through DRF's
    metaclass as a class statement would be."""
    return type(JobSubmitChecks)(
        "JobSubmitSerializer",
        (JobSubmitChecks,),
        {
            "__module__": __name__,
            "__qualname__": "JobSubmitSerializer",
            "__doc__": "One job's spec, as POST /jobs takes it and each item of POST /jobs/bulk.",
            **submit_fields(fields),
        },
    )


JobSubmitSerializer = submit_serializer_class()


class JobBulkSerializer(serializers.Serializer):
    # As many jobs per request as one array may have.
    jobs = JobSubmitSerializer(
        many=True, allow_empty=False, max_length=jobspec.FIELDS_BY_NAME["array"].max_value
    )


class JobSubmitResultSerializer(serializers.Serializer):
    """What submitting many jobs (a list, or one spec with ``array``) answers."""

    count = serializers.IntegerField()
    ids = serializers.ListField(child=serializers.IntegerField())
    array_id = serializers.CharField(required=False, help_text="Only for an array.")


class JobLogsQuerySerializer(serializers.Serializer):
    tail = serializers.IntegerField(
        min_value=1, required=False, help_text="Last N bytes (default 65536, at most 10 MiB)."
    )
    attempt = serializers.IntegerField(
        min_value=0, max_value=MAX_INT32, required=False, help_text="Attempt (default: current)."
    )


class JobLogsSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    attempt = serializers.IntegerField()
    size = serializers.IntegerField(help_text="Bytes of output of that attempt.")
    truncated = serializers.BooleanField(help_text="Only the last `tail` bytes are shown.")
    text = serializers.CharField(allow_blank=True)
    running = serializers.BooleanField()


class JobActionSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


class JobEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", allow_null=True, default=None)

    class Meta:
        model = JobEvent
        fields = ["id", "created_at", "kind", "message", "actor", "data"]


# --- priority raises, ceilings, notifications ---------------------------------------------------


class PriorityRaiseSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug")
    scope = serializers.SerializerMethodField()
    project_slug = serializers.SerializerMethodField()
    from_class = serializers.CharField(source="from_class.name", allow_null=True, default=None)
    to_class = serializers.CharField(source="to_class.name")
    requested_by = serializers.CharField(source="requested_by.username")
    decided_by = serializers.CharField(source="decided_by.username", allow_null=True, default=None)
    ended_by = serializers.CharField(source="ended_by.username", allow_null=True, default=None)

    class Meta:
        model = PriorityRaise
        fields = [
            "id",
            "tenant",
            "scope",
            "job",
            "project",
            "project_slug",
            "from_class",
            "to_class",
            "reason",
            "hours",
            "window_start",
            "window_end",
            "requested_by",
            "state",
            "decided_by",
            "decided_at",
            "comment",
            "expires_at",
            "ended_by",
            "ended_at",
            "created_at",
        ]
        read_only_fields = fields

    def get_scope(self, raise_) -> str:
        return "project" if raise_.project_id else "job"

    def get_project_slug(self, raise_) -> str | None:
        return raise_.project.slug if raise_.project_id else None


class PriorityRaiseCreateSerializer(serializers.Serializer):
    job = serializers.IntegerField(required=False, allow_null=True, default=None)
    project = serializers.IntegerField(
        required=False, allow_null=True, default=None, help_text="Project id, for a window raise."
    )
    to_class = serializers.CharField(max_length=50, help_text="Name of the target class.")
    reason = serializers.CharField(max_length=2000)
    hours = serializers.FloatField(
        required=False,
        allow_null=True,
        default=None,
        max_value=MAX_GRANT_HOURS,
        help_text="Empty: the class's maximum.",
    )
    window_start = serializers.DateTimeField(required=False, allow_null=True, default=None)
    window_end = serializers.DateTimeField(required=False, allow_null=True, default=None)

    def _within_horizon(self, value):
        if value is not None and value > timezone.now() + RAISE_WINDOW_HORIZON:
            raise serializers.ValidationError("At most 10 years ahead.")
        return value

    validate_window_start = _within_horizon
    validate_window_end = _within_horizon


class RaiseStepSerializer(serializers.Serializer):
    comment = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class JobImpactSerializer(serializers.Serializer):
    job_id = serializers.IntegerField()
    name = serializers.CharField()
    starts_now = serializers.BooleanField()
    starts_after = serializers.BooleanField()
    queue_position_now = serializers.IntegerField(allow_null=True)
    queue_position_after = serializers.IntegerField(allow_null=True)
    pool_position_now = serializers.IntegerField(allow_null=True)
    pool_position_after = serializers.IntegerField(allow_null=True)
    passes = serializers.IntegerField()


class RaiseImpactSerializer(serializers.Serializer):
    jobs = JobImpactSerializer(many=True)
    preempts = serializers.SerializerMethodField()
    running = serializers.ListField(child=serializers.IntegerField())
    note = serializers.CharField()

    def get_preempts(self, impact) -> list[dict]:
        return [
            {"job": j.pk, "name": j.name, "tenant": j.tenant.slug, "class": j.priority_class.name}
            for j in impact.preempts
        ]


class RaiseCeilingSerializer(serializers.Serializer):
    ceiling = serializers.CharField(
        max_length=50, allow_null=True, help_text="Class name; null: tenant admins approve nothing."
    )


class MarkedReadSerializer(serializers.Serializer):
    marked_read = serializers.IntegerField()


class NotificationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Notification
        fields = ["id", "created_at", "kind", "message", "link", "read_at", "job", "priority_raise"]
        read_only_fields = fields
