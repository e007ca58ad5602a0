"""Submitting jobs and the user's own steps on them (cancel, hold, release)."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from audit.services import audit_chain_head_locked_sql, audit_insert_sql, audit_record
from portal.errors import BusinessError, PermissionDeniedError
from portal.sqlrows import ModelInsert
from portal.text import holds_bad_text
from scheduling.agent.protocol import RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES
from tenants.choices import Role
from tenants.models import Project
from tenants.selectors import can_submit_to_project, has_role, job_unix_account, require_role

from ..choices import (
    ExecutorKind,
    GpuHealth,
    ImagePullPolicy,
    JobState,
    NodeState,
    QueueState,
    RaiseState,
    StopReason,
    WorkloadType,
)
from ..jobspec import FIELDS_BY_NAME
from ..models import (
    Allocation,
    Gpu,
    Job,
    JobEvent,
    Node,
    PriorityClass,
    PriorityRaise,
    ProjectQuota,
    Queue,
    Quota,
    RuntimeHistory,
    WorkloadPolicy,
)
from ..runtime_prediction import RuntimePrediction, history_ratios, predict_runtimes
from ..selectors import can_manage_job
from .enqueue import dispatch_on_commit, jobs_added_on_commit
from .lifecycle import job_event, job_transition
from .raises import higher_class, project_grant_classes

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_COMMAND_BYTES = FIELDS_BY_NAME["command"].max_length
MAX_JSON_BYTES = 64 * 1024
MAX_ARRAY = FIELDS_BY_NAME["array"].max_value


@dataclass
class JobSpec:
    """What a user asks for; the API serializer and the submit form both build one."""

    queue: Queue
    project: Project
    name: str
    workload_type: str
    command: Any
    shell: bool = False
    env: dict = field(default_factory=dict)
    working_dir: str = ""
    gpus_per_node: int = 1
    nodes: int = 1
    gpu_models: list[str] = field(default_factory=list)
    min_gpu_memory_mb: int = 0
    cpus: int = 1
    memory_mb: int = 0
    max_runtime_seconds: int | None = None
    priority_class: PriorityClass | None = None
    checkpoint_dir: str = ""
    labels: dict = field(default_factory=dict)
    dataset: str = ""
    dataset_version: str = ""
    code_ref: str = ""
    parameters: dict = field(default_factory=dict)
    seed: int | None = None
    array: int | None = None
    #: Empty: not a serving job; else {"health_path": "/health", "metrics_path": "/metrics"}.
    serve: dict = field(default_factory=dict)
    #: A container image (only on pools whose executor runs images), its pull policy and
    #: the name of its registry credential secret.
    image: str = ""
    image_pull_policy: str = ""
    image_pull_secret: str = ""


@dataclass
class Admission:
    """How a validated spec would be admitted now: for the submit preview and the checks."""

    pool: str
    model_quotas: list[dict]
    preemptible: bool
    outlook: str  # "guaranteed", "borrowed" or "waits"
    message: str


class Lookups:
    """Reads that validation needs, memoized for one request: a bulk submit of thousands of
    similar specs costs a handful of queries instead of a dozen per spec."""

    def __init__(self) -> None:
        self._values: dict = {}

    def get(self, key, load):
        if key not in self._values:
            self._values[key] = load()
        return self._values[key]


@dataclass
class AdmissionContext:
    """What admitting a job to a pool reads, for one tenant and project: the pool's GPU
    shapes, the tenant's quotas and GPUs in use there, the project's cap in the pool and
    the classes granted to the project now, the pools each workload policy allows. One
    query (:func:`_admission_context`)."""

    #: {model: (most GPUs on one node, memory MiB, total GPUs)}, as ``pool_gpu_shapes``.
    shapes: dict[str, tuple[int, int, int]]
    #: {model or "": (guaranteed, borrow limit, max running jobs)}
    quotas: dict[str, tuple[int, int, int | None]]
    #: {model: [guaranteed GPUs in use, borrowed GPUs in use]}
    used: dict[str, list[int]]
    #: The project's most GPUs in the pool (None: no cap).
    project_cap: int | None
    #: (value, class id) of the highest class granted to the project now, if any.
    grant: tuple[int, int] | None
    #: {workload type: ids of the pools its policy allows} (absent: every pool).
    policy_pools: dict[str, set[int]]
    #: The runtime histories of the project and of the submitter in it, every workload
    #: type, as ``runtime_prediction`` reads them: {(project, type, submitter or None):
    #: ratios}. A submission's answer predicts the new job's runtime from these.
    histories: dict[tuple[int, str, int | None], list[float]] = field(default_factory=dict)

    def quota(self, gpu_model: str) -> dict:
        """What ``scheduling.selectors.quota_for`` answers (model-specific quota wins over
        the any-model one; usage counted for the quota's scope)."""
        quota = self.quotas.get(gpu_model) if gpu_model in self.quotas else None
        scoped = quota is not None
        if quota is None:
            quota = self.quotas.get("")
        if scoped:
            guaranteed_used, borrowed_used = self.used.get(gpu_model, (0, 0))
        else:
            guaranteed_used = sum(u[0] for u in self.used.values())
            borrowed_used = sum(u[1] for u in self.used.values())
        return {
            "guaranteed": quota[0] if quota else 0,
            "borrow_limit": quota[1] if quota else 0,
            "max_running_jobs": quota[2] if quota else None,
            "used": guaranteed_used + borrowed_used,
            "borrowed_used": borrowed_used,
        }


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _admission_context(
    *, tenant_id: int, project_id: int, pool_id: int, submitter_id: int | None = None
) -> AdmissionContext:
    """The reads of ``scheduling.selectors.pool_gpu_shapes`` and ``quota_for`` (every model),
    the project's cap (``ProjectQuota``), ``raises.project_grant_classes``, the workload
    policies' allowed pools and the runtime histories a prediction for the submitter's job
    reads, in one statement: a submission paid seven queries for them. Kept
    equal to those by tests/scheduling/test_api_costs.py.

    The GPUs in use are the pool's active allocations, each job's tenant looked up by its
    key: a join on the tenant's jobs let the planner scan every job the tenant ever had
    (all of them where one tenant submits most), a cost that grew with the history."""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    gpu, node, alloc = _table(Gpu), _table(Node), _table(Allocation)
    through = WorkloadPolicy.allowed_pools.through
    sql = f"""
        SELECT 's', g.model, g.node_id, COUNT(*), MAX(g.memory_mb)
          FROM {gpu} g JOIN {node} n ON n.id = g.node_id
         WHERE n.pool_id = %s AND g.health = %s AND n.state <> %s
         GROUP BY g.node_id, g.model
        UNION ALL
        SELECT 'q', q.gpu_model, q.guaranteed_gpus, q.borrow_limit_gpus, q.max_running_jobs
          FROM {_table(Quota)} q WHERE q.tenant_id = %s AND q.pool_id = %s
        UNION ALL
        SELECT 'u', g.model, CASE WHEN a.borrowed THEN 1 ELSE 0 END, COUNT(*), 0
          FROM {alloc} a
          JOIN {node} n ON n.id = a.node_id
          JOIN {gpu} g ON g.id = a.gpu_id
         WHERE n.pool_id = %s AND a.released_at IS NULL
           AND (SELECT j.tenant_id FROM {_table(Job)} j WHERE j.id = a.job_id) = %s
         GROUP BY g.model, CASE WHEN a.borrowed THEN 1 ELSE 0 END
        UNION ALL
        SELECT 'c', '', p.max_gpus, 0, 0
          FROM {_table(ProjectQuota)} p WHERE p.project_id = %s AND p.pool_id = %s
        UNION ALL
        SELECT 'r', '', r.to_class_id, c.value, 0
          FROM {_table(PriorityRaise)} r JOIN {_table(PriorityClass)} c ON c.id = r.to_class_id
         WHERE r.project_id = %s AND r.state = %s AND r.expires_at > %s
           AND (r.window_start IS NULL OR r.window_start <= %s)
        UNION ALL
        SELECT 'p', w.workload_type, t.resourcepool_id, 0, 0
          FROM {_table(through)} t JOIN {_table(WorkloadPolicy)} w ON w.id = t.workloadpolicy_id
        UNION ALL
        SELECT 'h' || h.workload_type, CAST(h.entries AS TEXT), h.submitted_by_id, 0, 0
          FROM {_table(RuntimeHistory)} h
         WHERE h.project_id = %s AND (h.submitted_by_id IS NULL OR h.submitted_by_id = %s)
    """
    params = [pool_id, GpuHealth.HEALTHY, NodeState.DOWN, tenant_id, pool_id, pool_id, tenant_id]
    params += [project_id, pool_id, project_id, RaiseState.APPROVED, now, now]
    params += [project_id, submitter_id]
    shapes: dict[str, list[int]] = {}
    quotas: dict[str, tuple[int, int, int | None]] = {}
    used: dict[str, list[int]] = {}
    policy_pools: dict[str, set[int]] = {}
    histories: dict[tuple[int, str, int | None], list[float]] = {}
    cap, grant = None, None
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    for kind, model, a, b, c in rows:
        if kind == "s":
            per_node, mem, total = shapes.get(model, [0, 0, 0])
            shapes[model] = [max(per_node, b), max(mem, c), total + b]
        elif kind == "q":
            quotas[model] = (a, b, c)
        elif kind == "u":
            used.setdefault(model, [0, 0])[1 if a else 0] += b
        elif kind == "c":
            cap = a
        elif kind == "p":
            policy_pools.setdefault(model, set()).add(a)
        elif kind[0] == "h":  # "h" and the workload type; the entries as text
            histories[(project_id, kind[1:], a)] = history_ratios(model)
        elif grant is None or b > grant[0]:
            grant = (b, a)
    return AdmissionContext(
        shapes={m: (v[0], v[1], v[2]) for m, v in shapes.items()},
        quotas=quotas,
        used=used,
        project_cap=cap,
        grant=grant,
        policy_pools=policy_pools,
        histories=histories,
    )


def _fail(field_name: str, message: str, code: str = "invalid") -> None:
    raise BusinessError(message, code=code, field=field_name)


def _json_size(value) -> int:
    return len(json.dumps(value, default=str))


def _validate_shapes(spec: JobSpec) -> None:
    """Command, env and metadata: malformed input is refused with the field named."""
    if spec.shell:
        if isinstance(spec.command, str):
            spec.command = [spec.command]
        if not (
            isinstance(spec.command, list)
            and len(spec.command) == 1
            and isinstance(spec.command[0], str)
        ):
            _fail("command", "With shell=true, command must be one shell string.")
    else:
        if isinstance(spec.command, str):
            _fail(
                "command",
                'command must be a list of arguments, e.g. ["python", "train.py"]; '
                "a shell string needs shell=true.",
            )
        if not isinstance(spec.command, list) or not all(isinstance(a, str) for a in spec.command):
            _fail("command", "command must be a list of strings.")
    if not spec.command or not spec.command[0].strip():
        _fail("command", "command must not be empty.")
    if any(holds_bad_text(a) for a in spec.command):
        _fail("command", "command must not contain NUL characters or lone surrogates.")
    if sum(len(a.encode()) for a in spec.command) > MAX_COMMAND_BYTES:
        _fail("command", f"command is longer than {MAX_COMMAND_BYTES} bytes.")
    if not isinstance(spec.env, dict):
        _fail("env", "env must be an object of NAME: value strings.")
    for key, value in spec.env.items():
        if not isinstance(key, str) or not ENV_NAME.match(key):
            _fail("env", f"{key!r} is not a valid environment variable name.")
        if key in RESERVED_ENV_NAMES or key.startswith(RESERVED_ENV_PREFIXES):
            _fail(
                "env",
                f"{key} is set by Sluice on the node and cannot be given "
                f"(reserved: {', '.join(sorted(RESERVED_ENV_NAMES))} and SLUICE_*).",
                code="reserved_env",
            )
        if not isinstance(value, str) or holds_bad_text(value):
            _fail("env", f"The value of {key} must be a string without NUL or lone surrogates.")
    if _json_size(spec.env) > MAX_JSON_BYTES:
        _fail("env", "env is too large.")
    for name in ("labels", "parameters"):
        value = getattr(spec, name)
        if not isinstance(value, dict):
            _fail(name, f"{name} must be an object.")
        if _json_size(value) > MAX_JSON_BYTES:
            _fail(name, f"{name} is too large (over {MAX_JSON_BYTES} bytes).")
        if holds_bad_text(value):  # PostgreSQL's jsonb cannot store it
            _fail(name, f"{name} must not contain NUL characters.")
    if not isinstance(spec.gpu_models, list) or not all(
        isinstance(m, str) and m and not holds_bad_text(m) for m in spec.gpu_models
    ):
        _fail("gpu_model", "gpu_model must be a list of GPU model names.")
    if any(not isinstance(v, str) for v in spec.labels.values()):
        _fail("labels", "label values must be strings.")
    if spec.gpus_per_node < 0 or spec.nodes < 1:
        _fail("gpus_per_node", "gpus_per_node must be ≥ 0 and nodes ≥ 1.")
    if spec.nodes > 1 and spec.gpus_per_node < 1:
        _fail("nodes", "A multi-node job needs at least one GPU per node.")
    if spec.array is not None and not (1 <= spec.array <= MAX_ARRAY):
        _fail("array", f"array must be between 1 and {MAX_ARRAY}.")


#: Workload types whose jobs may be HTTP replicas (``JobSpec.serve``).
SERVING_WORKLOAD_TYPES = (
    WorkloadType.INFERENCE,
    WorkloadType.BATCH_INFERENCE,
    WorkloadType.INTERACTIVE,
)
SERVE_PATH_DEFAULTS = {"health_path": "/health", "metrics_path": "/metrics"}
MAX_SERVE_PATH = 200


def _check_serve(spec: JobSpec) -> None:
    """A serving job: the paths its node's agent scrapes, filled with the defaults."""
    serve = spec.serve
    if serve is None:
        serve = {}
    if not isinstance(serve, dict):
        _fail("serve", 'serve must be an object, e.g. {"health_path": "/health"}.')
    if not serve:
        spec.serve = {}
        return
    if spec.workload_type not in SERVING_WORKLOAD_TYPES:
        _fail(
            "serve",
            f"Only {', '.join(SERVING_WORKLOAD_TYPES)} jobs can serve; "
            f"this is a {spec.workload_type} job.",
            code="serve_not_allowed",
        )
    unknown = sorted(str(k) for k in serve if k not in SERVE_PATH_DEFAULTS)
    if unknown:
        _fail(
            "serve",
            f"Unknown serve key {', '.join(unknown)}; serve takes "
            f"{', '.join(SERVE_PATH_DEFAULTS)}.",
        )
    checked = {}
    for key, default in SERVE_PATH_DEFAULTS.items():
        value = serve.get(key, default)
        if (
            not isinstance(value, str)
            or not value.startswith("/")
            or len(value) > MAX_SERVE_PATH
            or holds_bad_text(value)
            or any(c.isspace() or not c.isprintable() for c in value)
        ):
            _fail(
                "serve",
                f"serve.{key} must be a URL path starting with '/', without spaces, "
                f"of at most {MAX_SERVE_PATH} characters.",
            )
        checked[key] = value
    spec.serve = checked


def _check_access(user, spec: JobSpec, lookups: Lookups) -> None:
    queue, project = spec.queue, spec.project
    if queue.tenant_id != project.tenant_id:
        _fail("queue", f"Queue {queue} belongs to another tenant than project {project}.")
    if queue.project_id and queue.project_id != project.pk:
        _fail("queue", f"Queue {queue} only takes jobs of project {queue.project}.")
    if not has_role(user, project.tenant_id, Role.MEMBER):
        raise PermissionDeniedError(f"Viewers cannot submit jobs to {project.tenant}.")
    if not project.active:
        _fail("project", f"Project {project} is inactive: it takes no new jobs.")
    if not lookups.get(("can_submit", project.pk), lambda: can_submit_to_project(user, project)):
        raise PermissionDeniedError(
            f"You may not submit to project {project}: it is restricted; "
            "ask a tenant admin for the submit right.",
            code="forbidden_project",
            field="project",
        )
    if queue.state != QueueState.OPEN:
        _fail(
            "queue", f"Queue {queue} is {queue.state}: it takes no new jobs.", code="queue_closed"
        )


def _check_node_path(field_name: str, value: str, tenant_slug: str) -> str:
    """A directory on the node: relative inside the job's own directory, or absolute under
    one of the site's roots for the tenant (``SLUICE_JOB_PATH_ROOTS``). Returns it
    normalized; the agent checks again where it resolves links."""
    if not isinstance(value, str):
        _fail(field_name, f"{field_name} must be a path.")
    if not value:
        return ""
    if "\x00" in value or len(value) > 500:
        _fail(field_name, f"{field_name} must be a path of at most 500 characters.")
    path = PurePosixPath(value)
    if ".." in path.parts:
        _fail(
            field_name, f"{field_name} must not contain '..': it stays inside the job's directory."
        )
    if not path.is_absolute():
        return str(path)
    roots = [r.replace("{tenant}", tenant_slug) for r in settings.SLUICE_JOB_PATH_ROOTS]
    if any(path == PurePosixPath(r) or PurePosixPath(r) in path.parents for r in roots):
        return str(path)
    where = f" or a path under {', '.join(roots)}" if roots else ""
    _fail(
        field_name,
        f"{field_name} {value!r} is outside the job's directory: give a relative path "
        f"(it is created inside the job's own directory){where}.",
        code="path_not_allowed",
    )
    return ""  # not reached: _fail raises


def _check_node_paths(spec: JobSpec) -> None:
    slug = spec.project.tenant.slug
    spec.working_dir = _check_node_path("working_dir", spec.working_dir, slug)
    spec.checkpoint_dir = _check_node_path("checkpoint_dir", spec.checkpoint_dir, slug)


def _check_unix_account(user, spec: JobSpec, lookups: Lookups) -> None:
    from identity.selectors import unix_user_name

    tenant = spec.project.tenant

    def account_of_user() -> str:
        # The directory's account is read only where accounts are per user ({user}).
        per_user = "{user}" in settings.SLUICE_JOB_ACCOUNT
        username = unix_user_name(user) if per_user else user.get_username()
        return job_unix_account(tenant=tenant, username=username)

    account = lookups.get(("unix_account", tenant.pk, user.pk), account_of_user)
    if not account:
        _fail(
            "project",
            f"No Unix account on the nodes maps to you in {tenant}: the site runs jobs as "
            f"{settings.SLUICE_JOB_ACCOUNT!r} and your user name is not a valid account name. "
            "Ask a platform admin to set the tenant's Unix account.",
            code="no_unix_account",
        )


def _check_priority(user, spec: JobSpec) -> PriorityClass:
    queue = spec.queue
    chosen = spec.priority_class or queue.default_priority_class
    ceiling = queue.max_self_service_class
    if chosen.value > ceiling.value and not has_role(user, queue.tenant_id, Role.ADMIN):
        _fail(
            "priority_class",
            f"Priority class {chosen.name} ({chosen.value}) is above this queue's self-service "
            f"maximum {ceiling.name} ({ceiling.value}). Submit at {ceiling.name} or lower and "
            "request a priority raise for the job.",
            code="priority_needs_approval",
        )
    return chosen


def _check_runtime(spec: JobSpec, policy: WorkloadPolicy) -> int:
    runtime = spec.max_runtime_seconds or policy.default_runtime_seconds
    if runtime < 1:
        _fail("max_runtime_seconds", "max_runtime_seconds must be at least 1.")
    if runtime > policy.max_runtime_seconds:
        _fail(
            "max_runtime_seconds",
            f"max_runtime_seconds {runtime} is above the {spec.workload_type} policy's maximum of "
            f"{policy.max_runtime_seconds} s ({policy.max_runtime_seconds / 3600:g} h).",
        )
    return runtime


def _context_for(spec: JobSpec, lookups: Lookups, user) -> AdmissionContext:
    tenant_id, project_id, pool_id = spec.project.tenant_id, spec.project.pk, spec.queue.pool_id
    return lookups.get(
        ("admission", tenant_id, project_id, pool_id, user.pk),
        lambda: _admission_context(
            tenant_id=tenant_id, project_id=project_id, pool_id=pool_id, submitter_id=user.pk
        ),
    )


def submitted_prediction(job: Job, spec: JobSpec, lookups: Lookups, user) -> RuntimePrediction:
    """The runtime prediction of a job just submitted, from the histories its admission
    read (no query); what ``runtime_prediction.predict_runtime`` answers."""
    histories = _context_for(spec, lookups, user).histories
    return predict_runtimes([job], histories=histories)[job.pk]


def _check_placement(
    spec: JobSpec, policy: WorkloadPolicy, preemptible: bool, lookups: Lookups, user
) -> Admission:
    """Pool, model, size and quota: can this job ever run, and how would it run now?"""
    queue, pool = spec.queue, spec.queue.pool
    wt = spec.workload_type
    if not queue.allows(wt):
        _fail(
            "workload_type",
            f"Queue {queue} does not take {wt} jobs; it takes "
            f"{', '.join(queue.allowed_workload_types)}.",
        )
    if not pool.allows(wt):
        _fail(
            "workload_type",
            f"Pool {pool} does not run {wt} jobs; it runs "
            f"{', '.join(pool.allowed_workload_types)}.",
        )
    context = _context_for(spec, lookups, user)
    allowed_pools = context.policy_pools.get(wt)
    if allowed_pools and pool.pk not in allowed_pools:
        names = [p.name for p in policy.allowed_pools.all()]
        _fail("workload_type", f"The {wt} policy allows pools {', '.join(names)}, not {pool}.")
    shapes = context.shapes  # {model: (max GPUs on one node, memory MiB, total GPUs)}
    if spec.gpus_per_node == 0:
        return Admission(pool.name, [], preemptible, "guaranteed", "Needs no GPU.")
    if not shapes:
        _fail("gpu_model", f"Pool {pool} has no GPUs registered yet.")
    unknown = [m for m in spec.gpu_models if m not in shapes]
    if unknown and len(unknown) == len(spec.gpu_models):
        _fail(
            "gpu_model",
            f"GPU model {', '.join(unknown)} is not in pool {pool}; models there: "
            f"{', '.join(sorted(shapes))}.",
        )
    candidates = [m for m in (spec.gpu_models or sorted(shapes)) if m in shapes]
    candidates = [m for m in candidates if shapes[m][1] >= spec.min_gpu_memory_mb]
    if not candidates:
        _fail(
            "min_gpu_memory_mb",
            f"No GPU in pool {pool} has {spec.min_gpu_memory_mb} MiB; the largest has "
            f"{max(s[1] for s in shapes.values())} MiB.",
        )
    fits_node = [m for m in candidates if shapes[m][0] >= spec.gpus_per_node]
    if not fits_node:
        _fail(
            "gpus_per_node",
            f"{spec.gpus_per_node} GPUs per node is more than any node of pool {pool} has "
            f"(at most {max(shapes[m][0] for m in candidates)}).",
        )
    total = spec.gpus_per_node * spec.nodes
    quotas, best = [], None
    for model in fits_node:
        quota = context.quota(model)
        limit = quota["guaranteed"] + quota["borrow_limit"]
        quotas.append({"gpu_model": model, **quota})
        if (
            total <= shapes[model][2]
            and total <= limit
            and (preemptible or total <= quota["guaranteed"])
        ):
            best = best or (model, quota)
    if best is None:
        q = quotas[0]
        if not preemptible and all(total <= x["guaranteed"] + x["borrow_limit"] for x in quotas):
            _fail(
                "gpus_per_node",
                f"This job is not preemptible, so it must fit the guaranteed quota: it needs {total} GPUs, "
                f"{spec.project.tenant} is guaranteed {q['guaranteed']} {q['gpu_model']} in pool {pool}. "
                "Use a preemptible priority class to borrow idle GPUs.",
                code="exceeds_guarantee",
            )
        _fail(
            "gpus_per_node",
            f"The job needs {total} GPUs; {spec.project.tenant} may use at most "
            f"{q['guaranteed']} guaranteed + {q['borrow_limit']} borrowed {q['gpu_model']} in pool {pool} "
            f"(the pool has {shapes[q['gpu_model']][2]}).",
            code="exceeds_quota_limit",
        )
    model, quota = best
    used = quota["used"]
    if used + total <= quota["guaranteed"]:
        outlook, msg = (
            "guaranteed",
            f"Runs as guaranteed: {used}+{total} ≤ {quota['guaranteed']} {model}.",
        )
    elif preemptible:
        outlook, msg = (
            "borrowed",
            (
                f"Runs as borrowed (reclaimable): {used}+{total} > {quota['guaranteed']} "
                f"guaranteed, borrowing up to {quota['borrow_limit']} when GPUs are idle."
            ),
        )
    else:
        outlook, msg = (
            "waits",
            (
                f"Waits for quota: {used}/{quota['guaranteed']} guaranteed {model} in use, "
                "and this job is not preemptible so it cannot borrow."
            ),
        )
    return Admission(pool.name, quotas, preemptible, outlook, msg)


def _project_cap(spec: JobSpec, lookups: Lookups, user) -> None:
    cap = _context_for(spec, lookups, user).project_cap
    total = spec.gpus_per_node * spec.nodes
    if cap is not None and total > cap:
        _fail(
            "gpus_per_node",
            f"Project {spec.project} may use at most {cap} GPUs in pool "
            f"{spec.queue.pool}; the job needs {total}.",
            code="exceeds_project_cap",
        )


#: A container image reference (the grammar of the distribution project's reference
#: package): [registry[:port]/]path[:tag][@algorithm:digest].
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_DOMAIN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"(?::[0-9]+)?"
)
IMAGE_REFERENCE = re.compile(
    rf"^(?:{_IMAGE_DOMAIN}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
MAX_IMAGE = 255
#: A Kubernetes secret's name (a DNS subdomain).
SECRET_NAME = re.compile(r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$")
MAX_SECRET_NAME = 253


def image_fields_check(*, image: str, pull_policy: str, pull_secret: str, pool) -> None:
    """A container image, its pull policy and secret name: well formed, and only on a pool
    whose executor runs images. Raises BusinessError naming the field."""
    for name, value in (
        ("image", image),
        ("image_pull_policy", pull_policy),
        ("image_pull_secret", pull_secret),
    ):
        if not isinstance(value, str):
            _fail(name, f"{name} must be a string.")
    if not image:
        if pull_policy or pull_secret:
            field_name = "image_pull_policy" if pull_policy else "image_pull_secret"
            _fail(field_name, f"{field_name} needs an image.")
        return
    if len(image) > MAX_IMAGE or not IMAGE_REFERENCE.match(image):
        _fail(
            "image",
            f"{image[:80]!r} is not an image reference such as "
            "registry.example.com/team/image:tag or image@sha256:<digest> "
            f"(at most {MAX_IMAGE} characters).",
        )
    if pull_policy and pull_policy not in ImagePullPolicy.values:
        _fail(
            "image_pull_policy",
            f"image_pull_policy must be one of {', '.join(ImagePullPolicy.values)}.",
        )
    if pull_secret and (len(pull_secret) > MAX_SECRET_NAME or not SECRET_NAME.match(pull_secret)):
        _fail(
            "image_pull_secret",
            "image_pull_secret must be a secret's name: lower-case letters, digits, '-' and "
            f"'.', at most {MAX_SECRET_NAME} characters.",
        )
    if not pool.runs_images:
        if pool.executor == ExecutorKind.SLURM:
            why = "is run by Slurm without a container runtime (pyxis/enroot)"
        else:
            why = "is run by Sluice's node agent, which runs jobs as host processes"
        _fail(
            "image",
            f"Pool {pool.name} {why} and cannot run container images; submit to a queue "
            "whose pool runs images, or leave image empty.",
            code="image_not_supported",
        )


def _check_image(spec: JobSpec) -> None:
    if spec.image or spec.image_pull_policy or spec.image_pull_secret:
        image_fields_check(
            image=spec.image,
            pull_policy=spec.image_pull_policy,
            pull_secret=spec.image_pull_secret,
            pool=spec.queue.pool,
        )


def _policy(workload_type: str, lookups: Lookups) -> WorkloadPolicy | None:
    return lookups.get(
        ("policy", workload_type),
        lambda: WorkloadPolicy.objects.filter(workload_type=workload_type).order_by().first(),
    )


def job_validate(*, user, spec: JobSpec, lookups: Lookups | None = None) -> tuple[dict, Admission]:
    """Every check of DESIGN §4 step 1; returns the Job field values and the admission outlook."""
    lookups = lookups or Lookups()
    _validate_shapes(spec)
    _check_serve(spec)
    _check_access(user, spec, lookups)
    _check_image(spec)
    _check_node_paths(spec)
    _check_unix_account(user, spec, lookups)
    policy = _policy(spec.workload_type, lookups)
    if policy is None:
        _fail(
            "workload_type",
            f"No policy is configured for {spec.workload_type} jobs; ask a platform admin.",
        )
    priority = _check_priority(user, spec)
    runtime = _check_runtime(spec, policy)
    preemptible = priority.preemptible and policy.preemptible
    admission = _check_placement(spec, policy, preemptible, lookups, user)
    _project_cap(spec, lookups, user)
    values = {
        "tenant": spec.project.tenant,
        "project": spec.project,
        "queue": spec.queue,
        "submitted_by": user,
        "name": spec.name or spec.command[0][:120],
        "workload_type": spec.workload_type,
        "base_priority_class": priority,
        "priority_class": priority,
        "command": spec.command,
        "shell": spec.shell,
        "env": spec.env,
        "working_dir": spec.working_dir,
        "gpus_per_node": spec.gpus_per_node,
        "nodes": spec.nodes,
        "gpu_models": spec.gpu_models,
        "min_gpu_memory_mb": spec.min_gpu_memory_mb,
        "cpus": spec.cpus,
        "memory_mb": spec.memory_mb,
        "max_runtime_seconds": runtime,
        "checkpoint_dir": spec.checkpoint_dir,
        "labels": spec.labels,
        "dataset": spec.dataset,
        "dataset_version": spec.dataset_version,
        "code_ref": spec.code_ref,
        "parameters": spec.parameters,
        "seed": spec.seed,
        "serve": spec.serve,
        "image": spec.image,
        "image_pull_policy": spec.image_pull_policy,
        "image_pull_secret": spec.image_pull_secret,
    }
    return values, admission


#: A submission's two inserts without the ORM compiling them each time.
_JOB_INSERT = ModelInsert(Job)
_EVENT_INSERT = ModelInsert(JobEvent)


def job_submit(*, user, spec: JobSpec, lookups: Lookups | None = None) -> Job:
    """Validate and store one job as PENDING (or an array, see ``job_submit_bulk``).
    ``lookups``: the reads the caller made for this request (the API's
    ``spec_from_input`` reads the workload policy with the project and queue).

    On PostgreSQL the job, its event and its audit row are written by one statement,
    which locks the audit chain and reads its head too (``_job_event_audit_insert``): a
    statement is atomic, so it needs no transaction around it (no BEGIN and COMMIT),
    and a client submitting jobs one after another waits on two database round trips
    fewer per job. Elsewhere, in one transaction, a statement each."""
    if spec.array:
        return job_submit_bulk(user=user, specs=[spec], lookups=lookups)[0]
    if connection.vendor != "postgresql":
        return _job_submit_atomic(user=user, spec=spec, lookups=lookups or Lookups())
    job, event = _job_and_event(user, spec, lookups or Lookups())
    _job_event_audit_insert(job, event, user, spec)
    jobs_added_on_commit()
    return job


def _job_and_event(user, spec: JobSpec, lookups: Lookups) -> tuple[Job, JobEvent]:
    """The job ``spec`` makes (validated against its queue, policy and quota) and its
    submitted event, not stored yet."""
    values, _ = job_validate(user=user, spec=spec, lookups=lookups)
    now = timezone.now()
    # A project raise active now (a release push) applies to new jobs from the start.
    grant = _context_for(spec, lookups, user).grant
    if grant is not None and grant[0] > values["priority_class"].value:
        values["priority_class"] = PriorityClass.objects.get(pk=grant[1])
    job = Job(submitted_at=now, **values)
    event = JobEvent(
        created_at=now,
        kind="submitted",
        actor=user,
        message=f"Submitted to queue {spec.queue} by {user.username}.",
    )
    return job, event


def _submit_audit_after(job: Job, spec: JobSpec) -> dict:
    return {
        "queue": str(spec.queue),
        "gpus": job.total_gpus,
        "priority_class": job.priority_class.name,
    }


@transaction.atomic
def _job_submit_atomic(*, user, spec: JobSpec, lookups: Lookups) -> Job:
    job, event = _job_and_event(user, spec, lookups)
    _JOB_INSERT.insert(job)
    event.job = job
    _EVENT_INSERT.insert(event)
    audit_record(
        action="job.submit",
        target=job,
        actor=user,
        tenant=spec.project.tenant,
        after=_submit_audit_after(job, spec),
    )
    jobs_added_on_commit()
    return job


def _job_event_audit_insert(job: Job, event: JobEvent, user, spec: JobSpec) -> None:
    """PostgreSQL: insert the job, its event and its audit row in one statement, which
    locks the audit chain (until it commits) and reads its head for the audit row."""
    job_columns, job_values = _JOB_INSERT.columns_and_values(job)
    event_columns, event_values = _EVENT_INSERT.columns_and_values(event, leave_out=("job",))
    job_table, event_table = _table(Job), _table(JobEvent)
    quote = connection.ops.quote_name
    job_id, pk_column = quote(JobEvent._meta.get_field("job").column), quote(Job._meta.pk.column)
    audit = audit_insert_sql(
        action="job.submit",
        target_type=Job._meta.label_lower,
        id_sql=f"j.{pk_column}",
        # str(job): "job <id> <name>"
        target_label=("job ", f" {job.name}"),
        head_sql="h.head",
        actor=user,
        tenant=spec.project.tenant,
        after=_submit_audit_after(job, spec),
    )
    sql = (
        f"WITH h AS MATERIALIZED (SELECT {audit_chain_head_locked_sql()} AS head), "
        f"j AS (INSERT INTO {job_table} ({', '.join(job_columns)}) "
        f"VALUES ({', '.join(['%s'] * len(job_values))}) RETURNING {pk_column}), "
        f"e AS (INSERT INTO {event_table} ({job_id}, {', '.join(event_columns)}) "
        f"SELECT j.{pk_column}, {', '.join(['%s'] * len(event_values))} FROM j), "
        f"a AS ({audit.sql} FROM j, h) "
        f"SELECT j.{pk_column} FROM j"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*job_values, *event_values, *audit.params])
        (pk,) = cursor.fetchone()
    _JOB_INSERT.inserted(job, pk)


@transaction.atomic
def job_submit_bulk(*, user, specs: list[JobSpec], lookups: Lookups | None = None) -> list[Job]:
    """Validate every spec first, then store all (or none). ``array: N`` expands to N jobs."""
    if not specs:
        _fail("jobs", "Give at least one job.")
    prepared: list[tuple[dict, JobSpec]] = []
    errors: dict[str, list[str]] = {}
    lookups = lookups or Lookups()
    for i, spec in enumerate(specs):
        try:
            values, _ = job_validate(user=user, spec=spec, lookups=lookups)
        except BusinessError as exc:
            if exc.status_code != 400:
                raise
            for key, msgs in (exc.errors or {"non_field_errors": [exc.message]}).items():
                errors[f"jobs[{i}].{key}"] = msgs
            continue
        prepared.append((values, spec))
    if errors:
        where, messages = next(iter(errors.items()))
        raise BusinessError(f"No job was submitted: {where}: {messages[0]}", errors=errors)
    total = sum(spec.array or 1 for _, spec in prepared)
    if total > MAX_ARRAY:
        _fail("jobs", f"At most {MAX_ARRAY} jobs per request; this asks for {total}.")
    now = timezone.now()
    granted = project_grant_classes({spec.project.pk for _, spec in prepared}, now)
    rows: list[Job] = []
    for values, spec in prepared:
        values["priority_class"] = higher_class(
            values["priority_class"], granted.get(spec.project.pk)
        )
        if spec.array:
            array_id = uuid.uuid4().hex
            for index in range(spec.array):
                rows.append(
                    Job(
                        submitted_at=now,
                        array_id=array_id,
                        array_index=index,
                        **{**values, "name": f"{values['name']}[{index}]"},
                    )
                )
        else:
            rows.append(Job(submitted_at=now, **values))
    jobs = Job.objects.bulk_create(rows, batch_size=500)
    if any(j.pk is None for j in jobs):  # backends without RETURNING: fetch the ids back
        jobs = list(Job.objects.filter(submitted_by=user, submitted_at=now).order_by("id"))
    JobEvent.objects.bulk_create(
        [
            JobEvent(
                job=j,
                created_at=now,
                kind="submitted",
                actor=user,
                message=f"Submitted to queue {j.queue} by {user.username} (bulk).",
            )
            for j in jobs
        ],
        batch_size=1000,
    )
    tenants = {spec.project.tenant_id: spec.project.tenant for _, spec in prepared}
    for tenant in tenants.values():
        ids = [j.pk for j in jobs if j.tenant_id == tenant.pk]
        audit_record(
            action="job.submit_bulk",
            target_type="scheduling.job",
            target_id=ids[0],
            target_label=f"{len(ids)} jobs {ids[0]}..{ids[-1]}",
            actor=user,
            tenant=tenant,
            after={"count": len(ids), "first_id": ids[0], "last_id": ids[-1]},
        )
    jobs_added_on_commit()
    return jobs


# --- the owner's (or an admin's) steps ------------------------------------------------------


def _require_manage(user, job: Job) -> None:
    require_role(user, job.tenant_id, Role.VIEWER, not_found="Job not found.")
    if not can_manage_job(user, job):
        raise PermissionDeniedError("Only the job's owner or a tenant admin may do this.")


def _audit_if_not_owner(user, job: Job, action: str, before: str, reason: str = "") -> None:
    if job.submitted_by_id != user.pk:
        audit_record(
            action=action,
            target=job,
            actor=user,
            tenant=job.tenant,
            before={"state": before},
            after={"state": job.state},
            reason=reason,
        )


@transaction.atomic
def job_cancel(*, user, job: Job, reason: str = "") -> Job:
    """Cancel: a waiting job ends at once; a placed one is stopped with its grace period."""
    _require_manage(user, job)
    job = Job.objects.select_for_update().get(pk=job.pk)
    before = job.state
    who = f"Cancelled by {user.username}" + (f": {reason}" if reason else ".")
    if job.state in (JobState.PENDING, JobState.HELD):
        job_transition(
            job,
            JobState.CANCELLED,
            message=who,
            actor=user,
            finished_at=timezone.now(),
            pending_reason_code="",
        )
    elif job.state in (JobState.ADMITTED, JobState.RUNNING):
        from .stopping import job_stop

        job_stop(job=job, reason=StopReason.CANCELLED, message=who, actor=user)
    elif job.state == JobState.STOPPING:
        job_event(job, "cancel_requested", f"{who} The job is already stopping.", actor=user)
    else:
        _fail("state", f"Job {job.pk} has already ended ({job.state}).", code="already_ended")
    _audit_if_not_owner(user, job, "job.cancel", before, reason)
    dispatch_on_commit()
    return job


@transaction.atomic
def job_hold(*, user, job: Job, reason: str = "") -> Job:
    """Hold a pending job: the scheduler skips it until released."""
    _require_manage(user, job)
    if job.state != JobState.PENDING:
        _fail("state", f"Only pending jobs can be held; job {job.pk} is {job.state}.")
    job_transition(
        job,
        JobState.HELD,
        message=f"Held by {user.username}." + (f" {reason}" if reason else ""),
        actor=user,
        pending_reason_code="HELD",
        pending_reason_message=f"Held by {user.username}.",
    )
    _audit_if_not_owner(user, job, "job.hold", JobState.PENDING, reason)
    return job


@transaction.atomic
def job_release(*, user, job: Job, reason: str = "") -> Job:
    """Release a held job back into its queue (it keeps its original submit time)."""
    _require_manage(user, job)
    if job.state != JobState.HELD:
        _fail("state", f"Only held jobs can be released; job {job.pk} is {job.state}.")
    job_transition(
        job,
        JobState.PENDING,
        kind="released",
        message=f"Released by {user.username}.",
        actor=user,
        pending_reason_code="",
        pending_reason_message="",
    )
    _audit_if_not_owner(user, job, "job.release", JobState.HELD, reason)
    dispatch_on_commit()
    return job
