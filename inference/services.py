"""Writes of inference services: create, update, pause, resume, delete (audited), and the
control loop's steps: ``service_autoscale`` (the pure autoscaler on the replicas'
samples), ``service_reconcile`` (replica jobs submitted and cancelled towards the desired
count, within the tenant's quota) and ``service_tick`` (both, with the timeline's line).

Replicas are inference jobs submitted through ``scheduling.services.jobs.job_submit`` as
the service's creator, and cancelled through ``job_cancel``: quota, pools, priority,
preemption rules and pending reasons are the scheduler's, unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import audit_record
from portal.errors import BusinessError, NotFoundError
from scheduling.choices import JobState, QueueState, WorkloadType
from scheduling.models import Gpu, Job, PriorityClass, Queue, WorkloadPolicy
from scheduling.selectors import pool_gpu_shapes, quota_for
from scheduling.services.jobs import JobSpec, job_cancel, job_submit, job_validate
from tenants.choices import Role
from tenants.models import Project
from tenants.selectors import require_role

from . import autoscaler
from .choices import BlockedReason, ServiceState
from .models import LIVE_JOB_STATES, ScaleDecision, Service, ServiceReplica
from .scaling import NAMES as SCALING_NAMES
from .scaling import SETTINGS_BY_NAME as SCALING
from .scaling import ScalingSettings
from .spec import DEFAULTS as SPEC_DEFAULTS
from .spec import SPEC_FIELDS

log = logging.getLogger(__name__)

#: Fields that only change how many replicas run.
SCALING_FIELDS = ("description", *SCALING_NAMES)
EDITABLE_FIELDS = SPEC_FIELDS + SCALING_FIELDS
#: The replicas' environment carries the service's latency SLO (seconds) under this name,
#: for a model server to make it one of its histogram's bucket bounds (the sample model
#: server does): the share of requests within the SLO is then exact, not interpolated.
SLO_ENV = "SERVE_LATENCY_SLO_SECONDS"
#: Job field names that the service calls otherwise (errors of the dry-run submission).
_JOB_FIELD_NAMES = {"gpu_model": "gpu_models", "serve": "health_path", "nodes": "gpus_per_node"}


@dataclass(frozen=True, kw_only=True)
class ServiceSpec(ScalingSettings):
    """What a user asks for; the API serializer and the form both build one. Its scaling
    settings and their defaults are ``ScalingSettings``' (``inference/scaling.py``)."""

    project: Project
    queue: Queue
    name: str
    command: list
    # The replica's spec: defaults from inference/spec.py.
    env: dict = field(default_factory=dict)
    working_dir: str = SPEC_DEFAULTS["working_dir"]
    gpus_per_node: int = SPEC_DEFAULTS["gpus_per_node"]
    gpu_models: list = field(default_factory=list)
    priority_class: PriorityClass | None = SPEC_DEFAULTS["priority_class"]
    health_path: str = SPEC_DEFAULTS["health_path"]
    metrics_path: str = SPEC_DEFAULTS["metrics_path"]
    image: str = SPEC_DEFAULTS["image"]
    image_pull_policy: str = SPEC_DEFAULTS["image_pull_policy"]
    image_pull_secret: str = SPEC_DEFAULTS["image_pull_secret"]
    description: str = SPEC_DEFAULTS["description"]


def _fail(field_name: str | None, message: str, code: str = "invalid") -> None:
    raise BusinessError(message, code=code, field=field_name)


def _require_member(user, tenant_id: int) -> None:
    """Viewers may read (403 on writes); someone outside the tenant sees nothing (404)."""
    require_role(
        user,
        tenant_id,
        Role.MEMBER,
        not_found="Service not found.",
        denied="Viewers cannot change services; members and admins can.",
    )


# --- validation -----------------------------------------------------------------------------


def _check_scaling(values: dict) -> None:
    """The bounds and targets: each error names its field."""
    lo, hi = values["min_replicas"], values["max_replicas"]
    least = SCALING["max_replicas"].min_value
    if hi < least:
        _fail("max_replicas", f"max_replicas must be at least {least}.")
    if lo > hi:
        _fail("min_replicas", f"min_replicas ({lo}) must not be above max_replicas ({hi}).")
    if values["scale_to_zero"] and lo != 0:
        _fail("min_replicas", "With scale to zero, min_replicas must be 0.")
    if not values["scale_to_zero"] and lo < 1:
        _fail("min_replicas", "min_replicas 0 needs scale_to_zero (else at least 1).")
    if not values["target_running_per_replica"] or values["target_running_per_replica"] <= 0:
        _fail("target_running_per_replica", "The target per replica must be positive.")
    if values["panic_window_s"] >= values["stable_window_s"]:
        _fail(
            "panic_window_s",
            f"The panic window ({values['panic_window_s']} s) must be shorter than the "
            f"stable window ({values['stable_window_s']} s).",
        )
    least = SCALING["panic_threshold"].min_value
    if values["panic_threshold"] < least:
        _fail(
            "panic_threshold",
            f"panic_threshold must be at least {least} (at 1 the service would panic at "
            "steady load).",
        )
    slo = values["latency_slo_ms"]
    if slo is not None and slo <= 0:
        _fail("latency_slo_ms", "The latency SLO must be positive (or empty).")
    err = values["error_rate_max"]
    if err is not None and not 0 <= err <= 1:
        _fail("error_rate_max", "error_rate_max is a share between 0 and 1.")
    util = values["gpu_util_max"]
    if util is not None and not 0 < util <= 100:
        _fail("gpu_util_max", "gpu_util_max is a percentage above 0, at most 100.")
    for name in ("health_path", "metrics_path"):
        path = values[name]
        if not isinstance(path, str) or not path.startswith("/") or any(c.isspace() for c in path):
            _fail(name, f"{name} must be a URL path starting with '/', without spaces.")


def _replica_env(values: dict):
    """The service's env, with its latency SLO for the model server (unless set there)."""
    env = values["env"]
    if not isinstance(env, dict):
        return env  # refused by the job's checks, with the field named
    env = dict(env)
    if values.get("latency_slo_ms") and SLO_ENV not in env:
        env[SLO_ENV] = f"{values['latency_slo_ms'] / 1000:g}"
    return env


def _replica_spec(values: dict, *, name: str, version: int, runtime: int | None) -> JobSpec:
    return JobSpec(
        queue=values["queue"],
        project=values["project"],
        name=name,
        workload_type=WorkloadType.INFERENCE,
        command=list(values["command"])
        if isinstance(values["command"], list)
        else values["command"],
        env=_replica_env(values),
        working_dir=values["working_dir"],
        gpus_per_node=values["gpus_per_node"],
        gpu_models=list(values["gpu_models"]),
        priority_class=values["priority_class"],
        max_runtime_seconds=runtime,
        labels={"sluice.service": values.get("service_label", ""), "sluice.version": str(version)},
        serve={"health_path": values["health_path"], "metrics_path": values["metrics_path"]},
        image=values.get("image", ""),
        image_pull_policy=values.get("image_pull_policy", ""),
        image_pull_secret=values.get("image_pull_secret", ""),
    )


def _check_replica(user, values: dict) -> None:
    """A replica must be a job the user may submit: the scheduler's own checks (queue,
    pool, GPU model, size against quota, env, paths), run without storing anything."""
    queue, project = values["queue"], values["project"]
    if queue.tenant_id != project.tenant_id:
        _fail("queue", f"Queue {queue} belongs to another tenant than project {project}.")
    if not queue.allows(WorkloadType.INFERENCE) or not queue.pool.allows(WorkloadType.INFERENCE):
        _fail("queue", f"Queue {queue} does not take online inference jobs.", code="not_inference")
    if isinstance(values["env"], dict) and "PORT" in values["env"]:
        _fail("env", "PORT is set by the node agent: the replica listens on the port it gives.")
    spec = _replica_spec(values, name=values["name"], version=1, runtime=_runtime())
    try:
        job_validate(user=user, spec=spec)
    except BusinessError as exc:
        if exc.status_code != 400:
            raise
        errors = {_JOB_FIELD_NAMES.get(k, k): v for k, v in exc.errors.items()}
        raise BusinessError(exc.message, code=exc.code, errors=errors) from None
    values["working_dir"] = spec.working_dir  # normalized


def _runtime() -> int | None:
    """Replicas run as long as the inference policy allows (then they are replaced)."""
    policy = WorkloadPolicy.objects.filter(workload_type=WorkloadType.INFERENCE).first()
    return policy.max_runtime_seconds if policy else None


def _values_of(service: Service) -> dict:
    values = {name: getattr(service, name) for name in EDITABLE_FIELDS}
    values.update(project=service.project, name=service.name)
    return values


def _audit_view(values: dict) -> dict:
    out = {}
    for key, value in values.items():
        if isinstance(value, (Queue, PriorityClass, Project)):
            value = str(value)
        out[key] = value
    return out


# --- the user's steps -----------------------------------------------------------------------


@transaction.atomic
def service_create(*, user, spec: ServiceSpec) -> Service:
    """Create a service; its replicas are submitted by the next control tick."""
    _require_member(user, spec.project.tenant_id)
    values = {name: getattr(spec, name) for name in EDITABLE_FIELDS}
    values.update(project=spec.project, name=spec.name)
    if spec.queue.state != QueueState.OPEN:
        _fail("queue", f"Queue {spec.queue} is {spec.queue.state}.", code="queue_closed")
    if (
        Service.objects.filter(project=spec.project, name=spec.name)
        .exclude(state=ServiceState.DELETED)
        .exists()
    ):
        _fail("name", f"Project {spec.project} already has a service named {spec.name}.")
    _check_scaling(values)
    _check_replica(user, values)
    now = timezone.now()
    service = Service.objects.create(
        tenant=spec.project.tenant,
        created_by=user,
        created_at=now,
        updated_at=now,
        desired_replicas=0,
        **values,
    )
    audit_record(
        action="service.create",
        target=service,
        actor=user,
        tenant=service.tenant,
        after=_audit_view(values),
    )
    return service


@transaction.atomic
def service_update(*, user, service: Service, changes: dict) -> Service:
    """Change a service; a change of its spec (SPEC_FIELDS) starts a rolling update."""
    _require_member(user, service.tenant_id)
    service = (
        Service.objects.select_for_update().select_related("project", "queue").get(pk=service.pk)
    )
    if service.state == ServiceState.DELETED:
        raise NotFoundError("Service not found.")
    unknown = sorted(set(changes) - set(EDITABLE_FIELDS))
    if unknown:
        _fail(unknown[0], f"{unknown[0]} cannot be changed.")
    before = _values_of(service)
    values = {**before, **changes}
    changed = sorted(k for k in changes if before.get(k) != values[k])
    if not changed:
        return service
    _check_scaling(values)
    if any(k in SPEC_FIELDS for k in changed):
        _check_replica(user, values)
        if values["queue"].pk != before["queue"].pk and values["queue"].state != QueueState.OPEN:
            _fail("queue", f"Queue {values['queue']} is {values['queue'].state}.")
        service.spec_version += 1
    for key in EDITABLE_FIELDS:
        setattr(service, key, values[key])
    service.updated_at = timezone.now()
    service.save()
    audit_record(
        action="service.update",
        target=service,
        actor=user,
        tenant=service.tenant,
        before=_audit_view({k: before[k] for k in changed}),
        after={
            **_audit_view({k: values[k] for k in changed}),
            "spec_version": service.spec_version,
        },
    )
    return service


def _set_state(*, user, service: Service, state: str, action: str, reason: str) -> Service:
    _require_member(user, service.tenant_id)
    service = Service.objects.select_for_update().get(pk=service.pk)
    if service.state == ServiceState.DELETED:
        raise NotFoundError("Service not found.")
    before = service.state
    if before == state:
        return service
    service.state = state
    service.updated_at = timezone.now()
    service.save(update_fields=["state", "updated_at"])
    audit_record(
        action=action,
        target=service,
        actor=user,
        tenant=service.tenant,
        before={"state": before},
        after={"state": state},
        reason=reason,
    )
    return service


@transaction.atomic
def service_pause(*, user, service: Service, reason: str = "") -> Service:
    """Pause: every replica is cancelled (the next tick), the service keeps its settings."""
    return _set_state(
        user=user, service=service, state=ServiceState.PAUSED, action="service.pause", reason=reason
    )


@transaction.atomic
def service_resume(*, user, service: Service, reason: str = "") -> Service:
    """Resume a paused service: the autoscaler brings its replicas back."""
    return _set_state(
        user=user,
        service=service,
        state=ServiceState.ACTIVE,
        action="service.resume",
        reason=reason,
    )


@transaction.atomic
def service_delete(*, user, service: Service, reason: str = "") -> Service:
    """Delete: the replicas are cancelled now; the service and its timeline are kept
    (state ``deleted``, hidden) and its name can be used again."""
    service = _set_state(
        user=user,
        service=service,
        state=ServiceState.DELETED,
        action="service.delete",
        reason=reason,
    )
    service_reconcile(service=service, drain=False)
    return service


# --- the control loop -----------------------------------------------------------------------


def _policy_of(service: Service) -> autoscaler.Policy:
    return autoscaler.Policy(**{name: getattr(service, name) for name in SCALING_NAMES})


def _serve_samples(job_ids: list[int], since: datetime) -> list:
    """The agent's samples of these jobs since ``since`` (scheduling's selector)."""
    from scheduling import selectors

    reader = getattr(selectors, "serve_samples", None)
    if reader is not None:
        return list(reader(job_ids, since))
    from scheduling.models import ServeSample

    return list(ServeSample.objects.filter(job_id__in=job_ids, at__gte=since).order_by("at"))


def _gpu_utilization(job_ids: list[int]) -> dict[int, float]:
    """{job id: mean utilization (%) of the GPUs it holds, as last sampled}."""
    rows = Gpu.objects.filter(
        allocations__job_id__in=job_ids,
        allocations__released_at__isnull=True,
        utilization__isnull=False,
    ).values_list("allocations__job_id", "utilization")
    sums: dict[int, list[float]] = {}
    for job_id, util in rows:
        sums.setdefault(job_id, []).append(util)
    return {j: sum(v) / len(v) for j, v in sums.items() if v}  # percent, as agents send it


def _to_samples(rows: list, utils: dict[int, float]) -> list[autoscaler.Sample]:
    out = []
    last_of: dict[int, int] = {}
    for row in rows:
        buckets = tuple(
            (autoscaler._le(le if le is not None else "inf"), float(n))
            for le, n in (row.latency_buckets or [])
        )
        out.append(
            autoscaler.Sample(
                replica=row.job_id,
                at=row.at.timestamp(),
                ready=row.ready,
                running=row.running,
                waiting=row.waiting,
                requests_total=row.requests_total,
                errors_total=row.errors_total,
                latency_buckets=buckets,
            )
        )
        last_of[row.job_id] = len(out) - 1
    for job_id, index in last_of.items():
        if job_id in utils:
            s = out[index]
            out[index] = autoscaler.Sample(**{**_sample_dict(s), "gpu_util": utils[job_id]})
    return out


def _sample_dict(s: autoscaler.Sample) -> dict:
    return {name: getattr(s, name) for name in autoscaler.Sample.__slots__}


def _is_ready(job: Job) -> bool:
    return job.state == JobState.RUNNING and bool(job.serve_ready)


def _is_waiting(job: Job) -> bool:
    """Not placed by the scheduler yet: it holds no GPU."""
    return job.state in (JobState.PENDING, JobState.HELD)


def _live(service: Service) -> list[ServiceReplica]:
    return list(
        service.replicas.filter(retired_at__isnull=True).select_related("job").order_by("id")
    )


def service_autoscale(*, service: Service, now: datetime | None = None) -> autoscaler.Decision:
    """Decide the service's replica count now (``desired_replicas``), from its replicas'
    samples over the stable window; the autoscaler's state is kept on the service."""
    now = now or timezone.now()
    replicas = [r for r in _live(service) if r.job.state in LIVE_JOB_STATES]
    current = len(replicas)
    ready = sum(1 for r in replicas if _is_ready(r.job))
    started = sum(1 for r in replicas if not _is_waiting(r.job))
    job_ids = [r.job_id for r in replicas]
    since = now - timedelta(seconds=service.stable_window_s)
    # Replicas retired during the window carried load then: their samples count up to
    # their last one (autoscaler ``live``), or a scale-down would look like less load.
    left = list(service.replicas.filter(retired_at__gte=since).values_list("job_id", flat=True))
    rows = _serve_samples(job_ids + left, since) if job_ids or left else []
    samples = _to_samples(rows, _gpu_utilization(job_ids) if job_ids else {})
    if service.state != ServiceState.ACTIVE:
        decision = autoscaler.Decision(
            desired=0,
            reason_code=service.state,
            reason=f"service {service.state}: no replicas",
            panic=False,
            inputs={"current": current, "ready": ready},
            state=autoscaler.State.from_json(service.autoscaler_state),
        )
    else:
        decision = autoscaler.decide(
            now=now.timestamp(),
            current=current,
            ready=ready,
            samples=samples,
            policy=_policy_of(service),
            state=autoscaler.State.from_json(service.autoscaler_state),
            live=job_ids,
            started=started,
        )
    service.desired_replicas = decision.desired
    service.autoscaler_state = decision.state.to_json()
    Service.objects.filter(pk=service.pk).update(
        desired_replicas=decision.desired, autoscaler_state=service.autoscaler_state
    )
    return decision


@dataclass
class Reconciled:
    """What one reconciliation did, and why the service has fewer replicas than desired."""

    desired: int = 0
    live: int = 0
    ready: int = 0
    submitted: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    retired: list[int] = field(default_factory=list)
    taken_back: list[int] = field(default_factory=list)  # draining replicas back in service
    blocked_code: str = ""
    blocked_message: str = ""
    at_quota: bool = False


def _class_of(service: Service) -> PriorityClass:
    return service.priority_class or service.queue.default_priority_class


def _quota_room(service: Service, waiting_gpus: int) -> tuple[int, str]:
    """GPUs the tenant may still take for the service in its pool (guaranteed + borrow
    limit, or guaranteed alone when replicas are not preemptible), minus what the
    service's waiting replicas will take; with the figures in words."""
    pool = service.queue.pool
    policy = WorkloadPolicy.objects.filter(workload_type=WorkloadType.INFERENCE).first()
    preemptible = _class_of(service).preemptible and (policy.preemptible if policy else True)
    models = list(service.gpu_models) or sorted(pool_gpu_shapes(pool)) or [""]
    best: tuple[int, str] | None = None
    for model in models:
        q = quota_for(service.tenant, pool, model)
        limit = q["guaranteed"] + (q["borrow_limit"] if preemptible else 0)
        room = limit - q["used"] - waiting_gpus
        borrow = (
            f", borrowing up to {q['borrow_limit']}"
            if preemptible
            else " (replicas are not preemptible: they cannot borrow)"
        )
        words = (
            f"{service.tenant.slug} uses {q['used']}/{q['guaranteed']} guaranteed "
            f"{model or 'GPUs'} in pool {pool.name}{borrow}; {waiting_gpus} GPUs of replicas "
            "waiting to start"
        )
        if best is None or room > best[0]:
            best = (room, words)
    assert best is not None
    return best


def _newest_not_ready_first(replicas: list[ServiceReplica]) -> list[ServiceReplica]:
    """The order replicas leave in: waiting to start, then starting, then serving; newest
    first within each."""
    return sorted(replicas, key=lambda r: (_is_ready(r.job), not _is_waiting(r.job), -r.pk))


def _take_back_draining(service: Service, count: int) -> list[ServiceReplica]:
    """Up to ``count`` replicas of the current version draining after a scale-down, back
    in service: they serve now, with the GPUs and quota they still hold, where a new
    replica would wait for their quota and load its model."""
    draining = list(
        service.replicas.filter(
            retired_at__isnull=False,
            drain_until__isnull=False,
            spec_version=service.spec_version,
            job__state=JobState.RUNNING,
        )
        .select_related("job")
        .order_by("-job__serve_ready", "id")[: max(count, 0)]
    )
    for replica in draining:
        replica.retired_at = None
        replica.retire_reason = ""
        replica.drain_until = None
        replica.save(update_fields=["retired_at", "retire_reason", "drain_until"])
    return draining


def _cancel(replica: ServiceReplica, reason: str, now: datetime, *, drain: bool = True) -> None:
    """Retire a replica: out of the endpoints now; its job cancelled now, or, for a ready
    replica, after ``SLUICE_SERVICE_DRAIN_S`` (the balancers stop sending it requests
    first: requests in flight to a replica stopped at once would fail)."""
    replica.retired_at = now
    replica.retire_reason = reason[:200]
    drain_s = settings.SLUICE_SERVICE_DRAIN_S
    if drain and drain_s > 0 and _is_ready(replica.job):
        replica.drain_until = now + timedelta(seconds=drain_s)
        replica.save(update_fields=["retired_at", "retire_reason", "drain_until"])
        return
    replica.save(update_fields=["retired_at", "retire_reason"])
    _stop_job(replica.job, reason)


def _stop_job(job: Job, reason: str) -> None:
    if job.state in LIVE_JOB_STATES and job.state != JobState.STOPPING:
        try:
            job_cancel(user=job.submitted_by, job=job, reason=reason)
        except BusinessError as exc:
            # The replica's submitter lost the right: the service's control loop still
            # must take its replica back (it is a stop on the service's behalf). A 400 is
            # a job that ended meanwhile: nothing is left to do.
            if exc.status_code != 400:
                _system_cancel(job, reason)


def replicas_drained(now: datetime | None = None) -> list[int]:
    """Cancel the jobs of the replicas whose drain is over (any service, any state)."""
    now = now or timezone.now()
    done = []
    for replica in ServiceReplica.objects.filter(drain_until__lte=now).select_related("job"):
        with transaction.atomic():
            _stop_job(replica.job, replica.retire_reason or "drained")
            ServiceReplica.objects.filter(pk=replica.pk).update(drain_until=None)
        done.append(replica.job_id)
    return done


def _system_cancel(job: Job, reason: str) -> None:
    from scheduling.choices import StopReason
    from scheduling.services.lifecycle import job_transition
    from scheduling.services.stopping import job_stop

    job = Job.objects.select_for_update().get(pk=job.pk)
    message = f"Cancelled by the service's control loop: {reason}"
    if job.state in (JobState.PENDING, JobState.HELD):
        job_transition(
            job,
            JobState.CANCELLED,
            message=message,
            finished_at=timezone.now(),
            pending_reason_code="",
        )
    elif job.state in (JobState.ADMITTED, JobState.RUNNING):
        job_stop(job=job, reason=StopReason.CANCELLED, message=message)


def _submit(service: Service, count: int, now: datetime) -> tuple[list[int], BusinessError | None]:
    values = _values_of(service)
    values["service_label"] = str(service.pk)
    runtime = _runtime()
    done: list[int] = []
    for _ in range(count):
        number = service.replicas.count() + 1
        name = f"{service.name}-v{service.spec_version}-r{number}"
        spec = _replica_spec(values, name=name, version=service.spec_version, runtime=runtime)
        try:
            with transaction.atomic():
                job = job_submit(user=service.created_by, spec=spec)
                ServiceReplica.objects.create(
                    service=service, job=job, spec_version=service.spec_version, created_at=now
                )
        except BusinessError as exc:
            return done, exc
        done.append(job.pk)
    return done, None


@transaction.atomic
def service_reconcile(
    *, service: Service, now: datetime | None = None, drain: bool = True
) -> Reconciled:
    """Bring the service's replicas to ``desired_replicas`` (0 unless active):

    * a replica whose job ended is retired (and so replaced);
    * replicas of the current spec version are submitted up to the desired count, within
      the tenant's quota (guarantee + allowed borrowing): beyond it nothing is submitted
      and the service says it is at its quota (``WAITING_FOR_QUOTA``);
    * surplus replicas of the current version are cancelled, not-ready and newest first;
    * replicas of an older version are cancelled as replicas of the new one become ready
      (rolling update); with no quota left to start a new one beside them, one old
      replica at a time is cancelled once every new one is ready;
    * a ready replica that leaves is drained first (``drain``; see ``_cancel``).

    Idempotent: a second call with nothing changed does nothing.
    """
    now = now or timezone.now()
    service = (
        Service.objects.select_for_update()
        .select_related("queue__pool", "tenant")
        .get(pk=service.pk)
    )
    out = Reconciled()
    replicas = _live(service)
    for replica in replicas:
        if replica.job.state not in LIVE_JOB_STATES:
            replica.retired_at = now
            replica.retire_reason = f"job {replica.job.state.lower()}"[:200]
            replica.save(update_fields=["retired_at", "retire_reason"])
            out.retired.append(replica.job_id)
    live = [r for r in replicas if r.retired_at is None]
    desired = service.desired_replicas if service.state == ServiceState.ACTIVE else 0
    out.desired = desired
    new = [r for r in live if r.spec_version == service.spec_version]
    old = [r for r in live if r.spec_version != service.spec_version]
    ready_new = sum(1 for r in new if _is_ready(r.job))

    # Surplus of the current version.
    surplus = len(new) - desired
    if surplus > 0:
        for replica in _newest_not_ready_first(new)[:surplus]:
            _cancel(replica, f"scale down to {desired}", now, drain=drain)
            out.cancelled.append(replica.job_id)
        new = [r for r in new if r.retired_at is None]

    # Missing replicas of the current version: first those still draining (they hold
    # their GPUs and the tenant's quota until their drain ends), then new ones within
    # the quota.
    missing = desired - len(new)
    if missing > 0 and service.state == ServiceState.ACTIVE:
        back = _take_back_draining(service, missing)
        out.taken_back.extend(r.job_id for r in back)
        new.extend(back)
        live.extend(back)
        missing -= len(back)
        ready_new = sum(1 for r in new if _is_ready(r.job))
    if missing > 0:
        waiting = [r for r in live if r.retired_at is None and r.job.state in ("PENDING", "HELD")]
        per_replica = max(service.gpus_per_node, 0)
        room, words = _quota_room(service, sum(r.job.total_gpus for r in waiting))
        fits = missing if per_replica == 0 else max(0, min(missing, room // per_replica))
        if fits < missing:
            out.at_quota = True
            out.blocked_code = BlockedReason.AT_QUOTA
            out.blocked_message = (
                f"At quota: {words}. The service wants {desired} replicas of "
                f"{per_replica} GPU(s), has {len(new) + len(old)}; "
                f"{'no more can' if fits == 0 else f'only {fits} more can'} start."
            )
        if fits > 0:
            submitted, error = _submit(service, fits, now)
            out.submitted.extend(submitted)
            if error is not None:
                out.blocked_code = BlockedReason.SUBMIT_REFUSED
                out.blocked_message = f"A replica could not be submitted: {error.message}"
        new = [r for r in _live(service) if r.spec_version == service.spec_version]
        ready_new = sum(1 for r in new if _is_ready(r.job))

    # Older versions: leave once the new version serves in their place.
    keep_old = max(0, desired - ready_new)
    if out.at_quota and old and ready_new == len(new) and keep_old > 0:
        keep_old -= 1  # no room to surge: make room for one more new replica
    for replica in _newest_not_ready_first(old)[: max(0, len(old) - keep_old)]:
        _cancel(replica, f"rolling update to spec version {service.spec_version}", now, drain=drain)
        out.cancelled.append(replica.job_id)

    final = [r for r in _live(service) if r.job.state in LIVE_JOB_STATES]
    out.live = len(final)
    out.ready = sum(1 for r in final if _is_ready(r.job))
    if not out.blocked_code:
        waiting = [r.job for r in final if r.job.state in ("PENDING", "HELD")]
        for job in sorted(waiting, key=lambda j: j.pk):
            if job.pending_reason_code:
                out.blocked_code = job.pending_reason_code
                out.blocked_message = f"Replica job {job.pk} waits: {job.pending_reason_message or job.pending_reason_code}"
                break
    return out


def _record(
    service: Service, decision: autoscaler.Decision, result: Reconciled, now: datetime
) -> ScaleDecision | None:
    """The timeline's line, when something changed or the last line is old enough."""
    inputs = decision.inputs
    near = bool(
        service.state == ServiceState.ACTIVE
        and (
            inputs.get("recommended", 0) > service.max_replicas
            or (result.at_quota and inputs.get("recommended", 0) > result.live)
        )
    )
    every = timedelta(seconds=settings.SLUICE_SERVICE_DECISION_EVERY_S)
    # A service held short of replicas (quota, no GPUs) decides the same every tick: one
    # line when it starts, then one per interval, not one per tick.
    last = service.decisions.order_by("-at", "-id").values_list("current", "ready", "desired")
    last = last.first()
    numbers = (inputs.get("current"), inputs.get("ready"), decision.desired)
    changed = (
        last is None
        or tuple(last) != numbers
        or decision.reason_code != service.last_reason_code
        or result.blocked_code != service.blocked_reason_code
        or near != service.near_capacity
        or result.submitted
        or result.cancelled
        or result.retired
        or result.taken_back
        or service.decided_at is None
        or now - service.decided_at >= every
    )
    row = None
    if changed:
        reason = decision.reason
        if result.retired:
            reason += f"; replaced ended replica job(s) {', '.join(map(str, result.retired))}"
        if result.taken_back:
            jobs = ", ".join(map(str, result.taken_back))
            reason += f"; draining replica job(s) {jobs} back in service"
        row = ScaleDecision.objects.create(
            service=service,
            at=now,
            current=inputs.get("current", result.live),
            ready=inputs.get("ready", result.ready),
            desired=decision.desired,
            reason_code=decision.reason_code,
            reason=reason,
            inputs={
                **inputs,
                "submitted": result.submitted,
                "cancelled": result.cancelled,
                "retired": result.retired,
                "taken_back": result.taken_back,
                "near_capacity": near,
            },
            blocked_reason_code=result.blocked_code,
            blocked_reason_message=result.blocked_message,
        )
        service.decided_at = now
    Service.objects.filter(pk=service.pk).update(
        decided_at=service.decided_at,
        last_reason_code=decision.reason_code,
        blocked_reason_code=result.blocked_code,
        blocked_reason_message=result.blocked_message,
        near_capacity=near,
    )
    return row


@transaction.atomic
def service_tick(*, service_id: int, now: datetime | None = None) -> ScaleDecision | None:
    """One control step of a service: autoscale, reconcile, and the timeline's line."""
    now = now or timezone.now()
    service = (
        Service.objects.select_for_update()
        .select_related("queue__pool", "tenant", "project", "created_by")
        .filter(pk=service_id)
        .exclude(state=ServiceState.DELETED)
        .first()
    )
    if service is None:
        return None
    decision = service_autoscale(service=service, now=now)
    result = service_reconcile(service=service, now=now)
    return _record(service, decision, result, now)


def services_tick(now: datetime | None = None) -> dict:
    """Every active or paused service with replicas left, one transaction each (a failing
    service is logged, the others go on). Run by beat under a leader lock."""
    # A paused service is ticked only while it still has replicas to cancel.
    paused_with_replicas = Q(state=ServiceState.PAUSED, replicas__retired_at__isnull=True)
    ids = list(
        Service.objects.filter(Q(state=ServiceState.ACTIVE) | paused_with_replicas)
        .values_list("id", flat=True)
        .distinct()
        .order_by("id")
    )
    try:
        replicas_drained(now)
    except Exception:  # the scaling below must go on
        log.exception("draining replicas failed")
    done, failed = 0, 0
    for service_id in ids:
        try:
            service_tick(service_id=service_id, now=now)
            done += 1
        except Exception:  # one broken service must not stop the others' scaling
            log.exception("service %s: control tick failed", service_id)
            failed += 1
    return {"services": done, "failed": failed}


def decisions_prune(*, days: int | None = None) -> int:
    """Delete timeline lines older than ``SLUICE_SERVICE_DECISION_DAYS``."""
    days = days if days is not None else settings.SLUICE_SERVICE_DECISION_DAYS
    cutoff = timezone.now() - timedelta(days=days)
    deleted, _ = ScaleDecision.objects.filter(at__lt=cutoff).delete()
    return deleted
