"""What node agents report (register, heartbeat, started, exited, log) and lost-node handling."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import F, Subquery
from django.utils import timezone

from audit.services import audit_record
from scheduling.agent.protocol import stop_message

from ..choices import (
    ACTIVE_STATES,
    DEFAULT_IDLE_THRESHOLD,
    STOP_REASON_END_STATE,
    WAITING_STATES,
    GpuHealth,
    JobState,
    NodeState,
    ReclaimKind,
    StopReason,
)
from ..models import Allocation, Gpu, Job, JobEvent, Node, ResourcePool, WorkloadPolicy
from . import enqueue
from .enqueue import dispatch_on_commit, reports_probe_enqueue
from .lifecycle import (
    ConcurrentChange,
    IllegalTransition,
    Step,
    job_event,
    job_transition,
    jobs_transition_steps,
    requeue_fields,
)
from .messaging import send_node_message, send_node_messages
from .waste import gpu_hours_left, reclaim_record_add

#: Log cap of a job whose workload type has no policy (the policy's default).
DEFAULT_LOG_CAP_MB = 100

log = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ts(value: float | None) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC) if value else timezone.now()


def _stop_orphan(node_name: str, job_id: int, attempt: int, why: str) -> None:
    """The agent runs something the portal no longer places there: stop it (nothing keeps GPUs it should not)."""
    message = stop_message(job_id=job_id, attempt=attempt, reason=StopReason.LOST, grace_seconds=10)
    log.warning("stopping orphan job %s attempt %s on %s: %s", job_id, attempt, node_name, why)
    transaction.on_commit(lambda: send_node_message(node_name, message))


# --- one dispatch request per batch of reports -----------------------------------------------

#: Set while a batch of reports is handled (see :func:`one_dispatch_per_batch`): the
#: dispatch requests of its reports are collected there instead of being sent one by one.
_batch_dispatch: ContextVar[list[bool] | None] = ContextVar("sluice_batch_dispatch", default=None)


def _dispatch_on_commit() -> None:
    """Ask for a dispatch cycle once this transaction commits; inside a batch of reports,
    only remember that one is wanted (the batch asks once, at its end)."""
    wanted = _batch_dispatch.get()
    if wanted is None:
        dispatch_on_commit()
    else:
        transaction.on_commit(lambda: wanted.append(True))


@contextmanager
def one_dispatch_per_batch() -> Iterator[None]:
    """Reports handled inside this block ask for at most one dispatch cycle, after the
    block and once what asked for it has committed (a rolled-back report asks nothing)."""
    wanted: list[bool] = []
    token = _batch_dispatch.set(wanted)
    try:
        yield
    finally:
        _batch_dispatch.reset(token)
        # Registered last, so it runs after the reports' own on-commit callbacks; outside
        # any transaction (a worker) it runs at once.
        transaction.on_commit(lambda: enqueue.request_dispatch() if wanted else None)


# --- register and heartbeat -----------------------------------------------------------------


@transaction.atomic
def node_register(report: dict) -> Node:
    """Create or update the node and its GPUs from the agent's discovery."""
    now = timezone.now()
    pool_name = report.get("pool") or "general"
    pool, created = ResourcePool.objects.get_or_create(name=pool_name)
    if created:
        log.warning("node %s registered into new pool %s", report["node"], pool_name)
    node, _ = Node.objects.select_for_update().get_or_create(
        name=report["node"], defaults={"pool": pool}
    )
    was_down = node.state == NodeState.DOWN
    node.pool = pool
    node.hostname = report.get("hostname", "")[:255]
    node.agent_version = str(report.get("agent_version", ""))[:40]
    node.backend = report.get("backend", "")[:20]
    node.cpus = int(report.get("cpus") or 0)
    node.memory_mb = int(report.get("memory_mb") or 0)
    node.isolation = _isolation(report.get("isolation"))
    labels = report.get("labels")
    if isinstance(labels, dict):  # what the node says of itself; labels set by hand stay
        node.labels = {**node.labels, **{str(k)[:63]: str(v)[:255] for k, v in labels.items()}}
    capabilities = report.get("capabilities")
    if (
        isinstance(capabilities, dict)
        and report.get("executor") == pool.executor
        and pool.executor_capabilities != capabilities
    ):
        pool.executor_capabilities = capabilities
        pool.save(update_fields=["executor_capabilities"])
    node.registered_at = node.last_heartbeat = now
    if was_down:
        node.state = NodeState.READY
    node.save()
    seen = set()
    for item in report.get("gpus", []):
        gpu = (
            Gpu.objects.filter(uuid=item["uuid"]).first()
            or Gpu.objects.filter(node=node, index=item["index"]).first()
        )
        gpu = gpu or Gpu(node=node, index=item["index"], uuid=item["uuid"])
        gpu.node, gpu.index, gpu.uuid = node, item["index"], item["uuid"]
        gpu.model, gpu.memory_mb, gpu.health = (
            item["model"],
            int(item["memory_mb"]),
            GpuHealth.HEALTHY,
        )
        gpu.save()
        seen.add(gpu.pk)
    # A GPU the agent no longer sees is unhealthy (fell off the bus), not deleted: allocations refer to it.
    node.gpus.exclude(pk__in=seen).update(health=GpuHealth.UNHEALTHY)
    if was_down:
        audit_record(action="node.up", target=node, reason="agent registered again")
    _reconcile_jobs(node, report.get("jobs", []), _ts(report.get("sent_at")))
    _dispatch_on_commit()
    return node


def _isolation(reported) -> dict:
    """What the agent said it enforces; an agent too old to say enforces nothing known."""
    if not isinstance(reported, dict):
        return {"reported": False, "notes": ["the agent did not report what it enforces"]}
    notes = reported.get("notes")
    return {
        "reported": True,
        "run_as_user": bool(reported.get("run_as_user")),
        "cgroup": bool(reported.get("cgroup")),
        "cgroup_controllers": [str(c)[:20] for c in reported.get("cgroup_controllers") or []][:10],
        "device_isolation": bool(reported.get("device_isolation")),
        "notes": [str(n)[:300] for n in notes][:10] if isinstance(notes, list) else [],
    }


def _reconcile_jobs(
    node: Node,
    reported: list,
    sent_at: datetime,
    *,
    stale: bool = False,
    placed: dict[tuple[int, int], tuple] | None = None,
) -> bool:
    """Make the database agree with what the agent says it runs (DESIGN §12: the agent is
    the truth about processes, the portal about intent). ``reported`` is the ``jobs`` list
    of a register or heartbeat sent at ``sent_at``; for each job attempt with GPUs on this
    node:

    - listed as running while the portal still waits for its start: started (a lost
      ``started`` report);
    - listed as finished, with its exit: ended as the ``exited`` report would have (a lost
      ``exited`` report). A summary without the exit (an older agent) does not end the job:
      the ``exited`` report may only be late, and guessing the outcome could fail a job
      that succeeded. The agent is asked for it again instead (a ``stop`` of an attempt
      that ended is answered with its ``exited`` report, see the protocol);
    - RUNNING or STOPPING and not listed at all, though the report was sent after the job
      started here: the agent does not know it, so it is LOST (requeued by policy). An
      ADMITTED job not listed may not have reached the node yet: the stuck-launch sweep
      handles it; a report sent before the job started says nothing about it.

    A heartbeat that came apart from the other reports (:func:`heartbeats_apart`) may
    overtake the job's ``started`` or ``exited`` report: each of these repairs is then made
    only once the reports sent before the first heartbeat that called for it have been
    handled, and the job still needs it (else the report did it, set-based and once).

    A job the agent runs that the portal does not place here is stopped (unless the report
    is ``stale``: a newer one was applied already). Each repair is tried on its own: one
    failing leaves the others and the rest of the report applied.

    ``placed`` is what :func:`_placed_jobs` returns for the node when the caller read it
    already (several nodes' heartbeats at once). Returns whether a repair was tried.
    """
    summaries: dict[tuple[int, int], dict] = {}
    for item in reported:
        try:
            summaries[(int(item["job_id"]), int(item["attempt"]))] = item
        except (KeyError, TypeError, ValueError):
            log.warning("job summary without job id and attempt from %s: %r", node.name, item)
    if placed is None:
        placed = _placed_jobs([node.pk]).get(node.pk, {})
    repaired = False
    for key, item in summaries.items():
        if key not in placed:
            if item.get("running") and not stale:
                _stop_orphan(node.name, key[0], key[1], "not allocated here")
        elif item.get("running"):
            if placed[key][0] == JobState.ADMITTED and _reports_caught_up(
                "started", key, node, sent_at
            ):
                _repair(job_started, _started_report(node, item, sent_at))
                repaired = True
        elif _has_exit(item):
            if _reports_caught_up("exited", key, node, sent_at):
                _repair(job_exited, _exited_report(node, item))
                repaired = True
        else:
            _ask_exit_again(node.name, *key)
    for key, (state, started_at, nodes, admitted_at, _gpus, _threshold) in placed.items():
        if (
            key not in summaries
            and state in (JobState.RUNNING, JobState.STOPPING)
            and started_at is not None
            and sent_at > started_at + STARTED_AT_RESOLUTION
            and (nodes == 1 or _started_on(key[0], node.name, admitted_at))
            and _reports_caught_up("missing", key, node, sent_at)
        ):
            _repair(_job_lost_here, key[0], key[1], node, sent_at)
            repaired = True
    return repaired


#: How coarse a start time from an executor may be: Slurm's StartTime and a Pod's start
#: are whole seconds, truncated, so a heartbeat sent less than this after the start it
#: reports may have been produced before the executor saw the job start; it says nothing
#: about the job (a job really gone is found by the next heartbeat).
STARTED_AT_RESOLUTION = timedelta(seconds=1)

#: Set while heartbeats that travelled apart from the other reports are applied (see
#: :func:`heartbeats_apart`), true while reports are waiting on the reports queue.
_apart: ContextVar[bool | None] = ContextVar("sluice_heartbeats_apart", default=None)

#: How long the first heartbeat that called for a repair of a job attempt is remembered.
MISSING_SINCE_SECONDS = 3600


@contextmanager
def heartbeats_apart(*, reports_waiting: bool) -> Iterator[None]:
    """Heartbeats applied inside this block came on a queue of their own, ahead of the
    reports their node sent before them when the reports queue is behind: a job one lists
    running may have its ``started`` report still waiting, one it lists ended its
    ``exited`` report, and one it does not list (an executor that lists only running jobs,
    as the Kubernetes one does) its ``exited`` report too. Each repair (started, ended,
    LOST) is made only once the reports queue has handled everything sent before the
    first heartbeat that called for it (a probe sent after it came back,
    :data:`REPORTS_PROBE_KEY`), by a later heartbeat; meanwhile the report, if any, does
    it. Without that, a reports queue that falls behind would have every job's start and
    end repaired one by one from the heartbeats, then applied again from the reports.

    ``reports_waiting``: whether the reports queue held messages when the heartbeats were
    taken. When it held none, nothing sent before them is still to come (but a report
    lost with a killed worker, which the heartbeat is there to repair): repairs are made
    at once, as for heartbeats that came with the other reports."""
    token = _apart.set(reports_waiting)
    try:
        yield
    finally:
        _apart.reset(token)


def _reports_caught_up(kind: str, key: tuple[int, int], node: Node, sent_at: datetime) -> bool:
    """Whether the ``kind`` repair ("started", "exited", "missing": LOST) of a job attempt
    that a heartbeat sent at ``sent_at`` calls for can be made now (see
    :func:`heartbeats_apart`)."""
    if not _apart.get():
        return True  # not apart, or nothing waiting on the reports queue
    probe = cache.get(REPORTS_PROBE_KEY)
    if probe is None:
        return True  # nothing known of the reports queue (first start, cache emptied)
    since = cache.get_or_set(
        f"sluice:{kind}:{node.pk}:{key[0]}:{key[1]}",
        sent_at.timestamp(),
        timeout=MISSING_SINCE_SECONDS,
    )
    return float(probe) >= float(since)


#: A job attempt placed on a node: its state, started at, node count, admitted at, the ids
#: of its GPUs there and its workload policy's idle utilization threshold.
Placed = tuple[str, datetime | None, int, datetime | None, list[int], float]


def _placed_jobs(node_ids: Sequence[int]) -> dict[int, dict[tuple[int, int], Placed]]:
    """{node id: {(job id, attempt): Placed}} of the jobs holding GPUs on these nodes, in
    one query (written out: the ORM's compiling of it cost more than running it, once
    per heartbeat)."""
    placed: dict[int, dict[tuple[int, int], Placed]] = {pk: {} for pk in node_ids}
    if not node_ids:
        return placed
    qn = connection.ops.quote_name
    a, j, w = (qn(m._meta.db_table) for m in (Allocation, Job, WorkloadPolicy))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.node_id, a.job_id, j.requeue_count, j.state, j.started_at, j.nodes,"
            " j.admitted_at, a.gpu_id, w.idle_utilization_threshold"
            f" FROM {a} a JOIN {j} j ON j.id = a.job_id"
            f" LEFT JOIN {w} w ON w.workload_type = j.workload_type"
            f" WHERE a.node_id IN ({', '.join(['%s'] * len(node_ids))})"
            " AND a.released_at IS NULL",
            list(node_ids),
        )
        rows = cursor.fetchall()
    for node_id, job_id, attempt, state, started, nodes, admitted, gpu, threshold in rows:
        on_node = placed.setdefault(node_id, {})
        known = on_node.get((job_id, attempt))
        if known is None:
            threshold = DEFAULT_IDLE_THRESHOLD if threshold is None else threshold
            on_node[(job_id, attempt)] = (
                state,
                _aware(started),
                nodes,
                _aware(admitted),
                [gpu],
                threshold,
            )
        else:
            known[4].append(gpu)
    return placed


def _aware(value: datetime | None) -> datetime | None:
    """A time read by a query of our own: aware (SQLite's driver gives it naive, in UTC)."""
    if value is not None and timezone.is_naive(value):
        return timezone.make_aware(value, UTC)
    return value


#: How often at most the agent is asked again for the exit of one job attempt.
ASK_EXIT_AGAIN_SECONDS = 10


def _ask_exit_again(node_name: str, job_id: int, attempt: int) -> None:
    """Ask the agent to send the ``exited`` report of an attempt it says has ended."""
    if not cache.add(f"sluice:ask-exit:{node_name}:{job_id}:{attempt}", 1, ASK_EXIT_AGAIN_SECONDS):
        return
    message = stop_message(job_id=job_id, attempt=attempt, reason=StopReason.LOST, grace_seconds=10)
    log.info("asking %s again for the exit of job %s attempt %s", node_name, job_id, attempt)
    transaction.on_commit(lambda: send_node_message(node_name, message))


def _repair(step, *args) -> None:
    """A repair that fails (the job changed meanwhile) is logged; the next report retries."""
    try:
        with transaction.atomic():
            step(*args)
    except (IllegalTransition, ConcurrentChange):
        log.warning("reconciliation step %s%r lost a race; the next report retries", step, args)


def _has_exit(item: dict) -> bool:
    """Whether a finished job's summary says how it ended (agents since the batches do)."""
    return any(field in item for field in ("exit_code", "signal", "finished_at"))


def _started_report(node: Node, item: dict, sent_at: datetime) -> dict:
    started_at = item.get("started_at")
    return {
        "type": "started",
        "node": node.name,
        "job_id": int(item["job_id"]),
        "attempt": int(item["attempt"]),
        "pid": item.get("pid"),
        "started_at": started_at if started_at else sent_at.timestamp(),
        "reconciled": True,
        **({"port": item["port"]} if item.get("port") is not None else {}),
    }


def _exited_report(node: Node, item: dict) -> dict:
    return {
        "type": "exited",
        "node": node.name,
        "job_id": int(item["job_id"]),
        "attempt": int(item["attempt"]),
        "exit_code": item.get("exit_code"),
        "signal": item.get("signal"),
        "stop_reason": item.get("stop_reason"),
        "message": str(item.get("message") or ""),
        "finished_at": item.get("finished_at"),
        "reconciled": True,
    }


def _started_on(job_id: int, node_name: str, admitted_at: datetime | None) -> bool:
    """Whether this attempt of a multi-node job started on ``node`` (its other nodes may
    start it later: only a node that started it can have lost it)."""
    events = JobEvent.objects.filter(job_id=job_id, kind="started", data__node=node_name)
    if admitted_at is not None:
        events = events.filter(created_at__gte=admitted_at)
    return events.exists()


def _job_lost_here(job_id: int, attempt: int, node: Node, sent_at: datetime) -> None:
    """The agent on ``node`` no longer knows this job attempt: its GPUs are released
    everywhere, its other nodes told to stop it, and it ends LOST (requeued by policy;
    a job stopping for another reason ends as that stop intended)."""
    job = (
        Job.objects.select_for_update(of=("self",))
        .select_related("tenant")
        .filter(pk=job_id, requeue_count=attempt, state__in=(JobState.RUNNING, JobState.STOPPING))
        .first()
    )
    if job is None:
        return
    now = timezone.now()
    held = job.allocations.filter(released_at__isnull=True)
    others = sorted(set(held.exclude(node=node).values_list("node__name", flat=True)))
    held.update(released_at=now)
    message = (
        f"The agent on {node.name} no longer runs it "
        f"(its report of {sent_at:%Y-%m-%d %H:%M:%S} does not list it)."
    )
    before = job.state
    _end_after_loss(job, now, message)
    audit_record(
        action="job.lost",
        target=job,
        tenant=job.tenant,
        before={"state": before, "attempt": attempt, "node": node.name},
        after={"state": job.state, "attempt": job.attempt},
        reason=message,
    )
    stops = [
        (name, stop_message(job_id=job_id, attempt=attempt, reason=StopReason.LOST))
        for name in others
    ]
    if stops:
        transaction.on_commit(lambda: send_node_messages(stops))
    _dispatch_on_commit()


@transaction.atomic
def node_heartbeat(report: dict, *, older: Sequence[dict] = ()) -> Node | None:
    """Store GPU samples, zombies and the last-active time of each running job, and
    reconcile the node's jobs (see :func:`_reconcile_jobs`). ``older`` are heartbeats of
    the same node this one supersedes (one batch): only their GPU activity counts."""
    return node_heartbeats_apply(beats=[(report, older)]).get(report["node"])


def node_heartbeats_apply(*, beats: Sequence[tuple[dict, Sequence[dict]]]) -> dict[str, Node]:
    """Apply heartbeats of several nodes together, each as :func:`node_heartbeat` would
    alone, in their order (a node's second heartbeat after its first); returns the nodes
    by name (an unregistered node's heartbeat is logged and left out). Each heartbeat
    comes with the older ones of its node it supersedes (see :func:`node_heartbeat`).

    What a heartbeat that changes nothing but samples costs is a few statements for all
    the nodes: their rows locked in one ``SELECT … FOR UPDATE`` (by id: two workers lock
    in the same order), their GPUs and the jobs placed on them read at once, one UPDATE
    of the nodes' last heartbeat, one of the GPU samples, one of the jobs' last active
    times. Zombies are written when they changed; a node coming back, GPUs held outside
    Sluice and the repairs of reconciliation are each node's own, as alone. Every node's
    writes come before the reconciliations (the order two workers could give them too);
    the jobs placed on the nodes are read again after a repair.

    Must run in a transaction; it either applies all it takes on or raises.
    """
    applied: dict[str, Node] = {}
    rest = list(beats)
    while rest:
        names: set[str] = set()
        now, later = [], []
        for beat in rest:
            (later if beat[0]["node"] in names else now).append(beat)
            names.add(beat[0]["node"])
        applied.update(_heartbeats_apply(now))
        rest = later
    return applied


def _heartbeats_apply(beats: Sequence[tuple[dict, Sequence[dict]]]) -> dict[str, Node]:
    """:func:`node_heartbeats_apply` for heartbeats of distinct nodes."""
    received = timezone.now()
    nodes = {
        node.name: node
        for node in Node.objects.select_for_update()
        .filter(name__in=[report["node"] for report, _ in beats])
        .order_by("pk")
    }
    gpus_of: dict[int, dict[int, Gpu]] = {node.pk: {} for node in nodes.values()}
    for gpu in Gpu.objects.filter(node_id__in=list(gpus_of)).order_by():
        gpus_of[gpu.node_id][gpu.index] = gpu
    placed_of = _placed_jobs(list(gpus_of))
    applied: list[tuple[dict, Node, datetime, bool]] = []
    last_heartbeat_only: list[int] = []
    sampled: list[Gpu] = []
    active_at: dict[int, datetime] = {}
    for report, older in beats:
        node = nodes.get(report["node"])
        if node is None:
            log.warning("heartbeat from unregistered node %s", report["node"])
            continue
        now = _ts(report.get("sent_at"))
        gpus = gpus_of[node.pk]
        # Two workers may handle a node's heartbeats out of order: an older one must not
        # overwrite what a newer one stored.
        stale = any(g.sampled_at is not None and g.sampled_at > now for g in gpus.values())
        applied.append((report, node, now, stale))
        node.last_heartbeat = received
        if not _node_fields_save(node, report, now, stale):
            last_heartbeat_only.append(node.pk)
        if not stale:
            sampled += _samples_set(gpus, report.get("gpus", []), now)
            _hold_outside(node, gpus, report.get("outside_jobs") or [])
        _active_moments(
            placed_of.get(node.pk, {}),
            [_utilization(gpus, beat) for beat in (*older, report)],
            active_at,
        )
    _rows_update(Node, {"last_heartbeat": dict.fromkeys(last_heartbeat_only, received)})
    _gpu_samples_store(sampled)
    _jobs_active_store(active_at)
    fresh = True  # no repair yet: what was read of the placed jobs still holds
    for report, node, now, stale in applied:
        placed = placed_of.get(node.pk, {}) if fresh else None
        if _reconcile_jobs(node, report.get("jobs", []), now, stale=stale, placed=placed):
            fresh = False
    return {node.name: node for _, node, _, _ in applied}


def _node_fields_save(node: Node, report: dict, sent_at: datetime, stale: bool) -> bool:
    """Save what a heartbeat changes of the node besides its last heartbeat: its zombies
    (when they changed) and its state (a down node whose heartbeats resumed); returns
    whether the node was saved (its last heartbeat with them)."""
    fields = []
    if not stale and "zombies" in report:  # a bridge leaves them to the node's sampler
        zombies = report["zombies"][:100]
        if zombies != node.zombies:
            node.zombies = zombies
            fields.append("zombies")
    if node.state == NodeState.DOWN and _sent_after_down(node, sent_at):
        node.state = NodeState.READY
        fields.append("state")
        audit_record(action="node.up", target=node, reason="heartbeats resumed")
        _dispatch_on_commit()
    if fields:
        node.save(update_fields=["last_heartbeat", *fields])
    return bool(fields)


def _samples_set(gpus: dict[int, Gpu], samples: list, sampled_at: datetime) -> list[Gpu]:
    """Set a heartbeat's samples on the node's GPUs ({index: GPU}); returns those it sets."""
    changed = []
    for sample in samples:
        gpu = gpus.get(sample["index"])
        if gpu is None:
            continue
        gpu.utilization = sample.get("utilization")
        gpu.memory_used_mb = sample.get("memory_used_mb")
        gpu.temperature_c = sample.get("temperature_c")
        gpu.power_w = sample.get("power_w")
        gpu.sampled_at = sampled_at
        changed.append(gpu)
    return changed


#: What a GPU sample sets.
SAMPLE_FIELDS = ("utilization", "memory_used_mb", "temperature_c", "power_w", "sampled_at")


def _gpu_samples_store(gpus: Sequence[Gpu]) -> None:
    """Write the samples set on ``gpus`` (any number of nodes' GPUs) in one UPDATE."""
    _rows_update(
        Gpu, {name: {gpu.pk: getattr(gpu, name) for gpu in gpus} for name in SAMPLE_FIELDS}
    )


#: Rows one UPDATE of :func:`_rows_update` changes at most (bounds its parameters).
ROWS_PER_UPDATE = 500


def _rows_update(model, values: dict[str, dict[int, Any]]) -> None:
    """UPDATE rows of ``model`` to ``values`` ({field name: {pk: value}}, every field the
    same pks) in one statement per ROWS_PER_UPDATE rows. Django's ``bulk_update`` writes
    the same, but builds an expression per row and field, which costs more than the
    statement."""
    pks = list(next(iter(values.values()), {}))
    qn = connection.ops.quote_name
    for start in range(0, len(pks), ROWS_PER_UPDATE):
        chunk = pks[start : start + ROWS_PER_UPDATE]
        sets, params = [], []
        for name, by_pk in values.items():
            field = model._meta.get_field(name)
            sql, field_params = _value_per_row(model, field, {pk: by_pk[pk] for pk in chunk})
            sets.append(f"{qn(field.column)} = {sql}")
            params += field_params
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {qn(model._meta.db_table)} SET {', '.join(sets)}"
                f" WHERE {qn(model._meta.pk.column)} IN ({', '.join(['%s'] * len(chunk))})",
                [*params, *chunk],
            )


def _value_per_row(model, field, values: dict[int, Any]) -> tuple[str, list]:
    """SQL for ``field``'s value in each row ({pk: value}): rows of one value share a
    ``WHEN pk IN (…)``, a single value needs no CASE; cast where the database needs it."""
    by_value: dict[Any, list[int]] = {}
    for pk, value in values.items():
        by_value.setdefault(value, []).append(pk)
    params: list = []
    if len(by_value) == 1:
        sql = "%s"
        params.append(field.get_db_prep_save(next(iter(by_value)), connection))
    else:
        pk_column = connection.ops.quote_name(model._meta.pk.column)
        whens = []
        for value, pks in by_value.items():
            whens.append(f"WHEN {pk_column} IN ({', '.join(['%s'] * len(pks))}) THEN %s")
            params += [*pks, field.get_db_prep_save(value, connection)]
        sql = f"CASE {' '.join(whens)} END"
    if connection.features.requires_casted_case_in_updates:
        sql = f"CAST({sql} AS {field.cast_db_type(connection)})"
    return sql, params


@transaction.atomic
def node_samples(report: dict) -> Node | None:
    """Store what a node's observe-only sampler saw (``samples`` report): GPU samples and
    zombies, and the last-active time of each running job. The executor (Slurm) chose each
    job's GPUs on the node, so the samples of the GPUs a job's processes hold are stored on
    the GPUs Sluice allocated to it, and the rest on the node's other GPUs in order. Nothing
    about jobs or liveness is concluded: that is the bridge's heartbeat."""
    now = _ts(report.get("sent_at"))
    node = Node.objects.filter(name=report["node"]).first()
    if node is None:
        log.warning("samples from unregistered node %s", report["node"])
        return None
    gpus = {g.index: g for g in node.gpus.all()}
    if any(g.sampled_at is not None and g.sampled_at > now for g in gpus.values()):
        return node  # an older report handled late
    to_sluice = _sampled_to_sluice_indices(node, gpus, report)
    changed = []
    for sample in report.get("gpus", []):
        gpu = gpus.get(to_sluice.get(sample.get("index"), -1))
        if gpu is None:
            continue
        gpu.utilization = sample.get("utilization")
        gpu.memory_used_mb = sample.get("memory_used_mb")
        gpu.temperature_c = sample.get("temperature_c")
        gpu.power_w = sample.get("power_w")
        gpu.sampled_at = now
        changed.append(gpu)
    Gpu.objects.bulk_update(
        changed, ["utilization", "memory_used_mb", "temperature_c", "power_w", "sampled_at"]
    )
    zombies = []
    for zombie in report.get("zombies", [])[:100]:
        if isinstance(zombie, dict) and zombie.get("gpu_index") in to_sluice:
            zombies.append({**zombie, "gpu_index": to_sluice[zombie["gpu_index"]]})
    node.zombies = zombies
    node.save(update_fields=["zombies"])
    _mark_active_jobs(node, [(now, {g.pk: g.utilization for g in changed})])
    return node


def _sampled_to_sluice_indices(node: Node, gpus: dict[int, Gpu], report: dict) -> dict[int, int]:
    """{the node's GPU index: Sluice's index of that GPU}: each job's GPUs as its processes
    say, paired in order with the GPUs Sluice allocated to it; the others in order."""
    allocated: dict[tuple[int, int], list[int]] = {}
    for job_id, attempt, index in (
        Allocation.objects.filter(node=node, released_at__isnull=True)
        .order_by("gpu__index")
        .values_list("job_id", "job__requeue_count", "gpu__index")
    ):
        allocated.setdefault((job_id, attempt), []).append(index)
    mapping: dict[int, int] = {}
    for item in report.get("jobs", []):
        if not isinstance(item, dict):
            continue
        mine = allocated.get((item.get("job_id"), item.get("attempt")), [])
        physical = sorted(i for i in item.get("gpu_indices") or [] if isinstance(i, int))
        for index, sluice_index in zip(physical, mine, strict=False):
            if index not in mapping and sluice_index not in mapping.values():
                mapping[index] = sluice_index
    rest = iter(sorted(set(gpus) - set(mapping.values())))
    for sample in sorted(report.get("gpus", []), key=lambda g: g.get("index", 0)):
        index = sample.get("index")
        if isinstance(index, int) and index not in mapping:
            sluice_index = next(rest, None)
            if sluice_index is None:
                break
            mapping[index] = sluice_index
    return mapping


def _hold_outside(node: Node, gpus: dict[int, Gpu], outside_jobs: list) -> None:
    """Mark the node's GPUs that work outside Sluice holds (``outside_jobs`` of a Slurm
    bridge's heartbeat) so the engine places nothing on them, and free those it no longer
    holds. The counts are what matters: Slurm picks a job's GPUs on the node, so its indices
    need not be Sluice's. A reported index is marked where no Sluice job holds it, else
    another GPU no Sluice job holds (the highest first)."""
    wanted: dict[int, str] = {}
    if outside_jobs:
        taken = set(
            Allocation.objects.filter(node=node, released_at__isnull=True).values_list(
                "gpu_id", flat=True
            )
        )
        spare = [g for i, g in sorted(gpus.items(), reverse=True) if g.pk not in taken]
        for item in outside_jobs:
            if not isinstance(item, dict):
                continue
            holder = _outside_holder(item)
            indices = [i for i in item.get("gpu_indices") or [] if isinstance(i, int)]
            count = item.get("gpus") if isinstance(item.get("gpus"), int) else len(indices)
            for _ in range(max(count, 0)):
                named = [g for g in spare if g.index in indices]
                if not spare:
                    break
                gpu = named[0] if named else spare[0]
                spare.remove(gpu)
                wanted[gpu.index] = holder
    changed = []
    for index, gpu in gpus.items():
        holder = wanted.get(index, "")
        if gpu.held_outside != holder:
            gpu.held_outside = holder
            changed.append(gpu)
    if changed:
        Gpu.objects.bulk_update(changed, ["held_outside"])
        if any(not g.held_outside for g in changed):
            _dispatch_on_commit()  # GPUs came free


def _outside_holder(item: dict) -> str:
    """How the nodes page names what holds a GPU outside Sluice."""
    pod = str(item.get("pod") or "").strip()
    if pod:  # a Kubernetes bridge's: namespace/name
        return f"Pod {pod}"[:200]
    job = str(item.get("slurm_job_id") or "").strip()
    user = str(item.get("user") or "").strip()
    what = f"Slurm job {job}" if job else "work outside Sluice"
    return (f"{what} of {user}" if user else what)[:200]


def _utilization(gpus: dict[int, Gpu], beat: dict) -> tuple[datetime, dict[int, float | None]]:
    """(sent at, {GPU id: utilization}) of one heartbeat."""
    samples = {}
    for sample in beat.get("gpus", []):
        gpu = gpus.get(sample.get("index"))
        if gpu is not None:
            samples[gpu.pk] = sample.get("utilization")
    return _ts(beat.get("sent_at")), samples


def _sent_after_down(node: Node, sent_at: datetime) -> bool:
    """A heartbeat revives a down node only if it was sent after the node was marked down
    (a late message from before the outage must not bring a dead node back)."""
    from audit.models import AuditEvent

    down_at = (
        AuditEvent.objects.filter(
            action="node.down", target_type="scheduling.node", target_id=str(node.pk)
        )
        .order_by("-id")
        .values_list("created_at", flat=True)
        .first()
    )
    return down_at is None or sent_at > down_at


def _mark_active_jobs(
    node: Node, samples: Sequence[tuple[datetime, dict[int, float | None]]]
) -> None:
    """Mark the node's running jobs active as ``samples`` say (see :func:`_active_moments`)."""
    placed = _placed_jobs([node.pk]).get(node.pk, {})
    active_at: dict[int, datetime] = {}
    _active_moments(placed, samples, active_at)
    _jobs_active_store(active_at)


def _active_moments(
    placed: dict[tuple[int, int], Placed],
    samples: Sequence[tuple[datetime, dict[int, float | None]]],
    active_at: dict[int, datetime],
) -> None:
    """A job is active when any of its GPUs is at or above its policy's idle threshold;
    ``samples`` are (sent at, {GPU id: utilization}) of one or more heartbeats of the node
    ``placed`` (see :func:`_placed_jobs`). Sets in ``active_at`` each running job's latest
    active moment."""
    for (job_id, _), (state, _, _, _, gpu_ids, threshold) in placed.items():
        if state != JobState.RUNNING:
            continue
        for sent_at, utilization in samples:
            if sent_at <= active_at.get(job_id, _EPOCH):
                continue
            for gpu_id in gpu_ids:
                value = utilization.get(gpu_id)
                if value is not None and value >= threshold:
                    active_at[job_id] = sent_at
                    break


def _jobs_active_store(active_at: dict[int, datetime]) -> None:
    """Write the jobs' last active times ({job id: moment}) in one UPDATE, each only
    forward: a heartbeat handled late must not move a last active time back."""
    if not active_at:
        return
    qn = connection.ops.quote_name
    field = Job._meta.get_field("last_active_at")
    column = qn(field.column)
    ids = list(active_at)
    for start in range(0, len(ids), ROWS_PER_UPDATE):
        chunk = ids[start : start + ROWS_PER_UPDATE]
        value, params = _value_per_row(Job, field, {pk: active_at[pk] for pk in chunk})
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {qn(Job._meta.db_table)} SET {column} = {value}"
                f" WHERE {qn(Job._meta.pk.column)} IN ({', '.join(['%s'] * len(chunk))})"
                f" AND ({column} IS NULL OR {column} < {value})",
                [*params, *chunk, *params],
            )


# --- job reports ----------------------------------------------------------------------------


def _current_job(report: dict) -> Job | None:
    """The job a report is about, or None if the report is about an older attempt."""
    job = Job.objects.select_for_update().filter(pk=report["job_id"]).first()
    if job is None or job.attempt != int(report.get("attempt", 0)):
        return None
    return job


def _allocated_here(job: Job, node_name: str) -> bool:
    return job.allocations.filter(node__name=node_name, released_at__isnull=True).exists()


@transaction.atomic
def job_started(report: dict) -> Job | None:
    """The job's process runs on the node: ADMITTED → RUNNING (a multi-node job's other
    nodes add a timeline line). Idempotent: a repeated report changes nothing, and one that
    comes after the attempt ended (its ``exited`` overtook it) is ignored; should the
    process still run, the node's next heartbeat has it stopped."""
    job = _current_job(report)
    node_name = report["node"]
    if job is not None and job.state not in (*ACTIVE_STATES, *WAITING_STATES):
        return job
    if job is None or not _allocated_here(job, node_name):
        _stop_orphan(
            node_name, report["job_id"], report.get("attempt", 0), "started but not placed here"
        )
        return None
    started_at = _ts(report.get("started_at"))
    data = _started_data(report)
    if job.state == JobState.ADMITTED:
        job_transition(
            job,
            JobState.RUNNING,
            kind="started",
            message=f"Started on {node_name} (pid {report.get('pid')}).",
            data=data,
            started_at=started_at,
            last_active_at=started_at,
            **_serve_port(report),
        )
    elif not _started_on(job.pk, node_name, job.admitted_at):
        job_event(job, "started", f"Started on {node_name} (pid {report.get('pid')}).", data=data)
    return job


def _end_state(job: Job, report: dict) -> tuple[str, str]:
    code, sig = report.get("exit_code"), report.get("signal")
    how = f"exit code {code}" if code is not None else (f"signal {sig}" if sig else "unknown exit")
    if job.state == JobState.STOPPING and job.stop_reason:
        return STOP_REASON_END_STATE[
            StopReason(job.stop_reason)
        ], f"Stopped ({job.stop_reason}), {how}."
    if report.get("stop_reason") == "launch_failed":
        return JobState.FAILED, f"Launch failed: {report.get('message', '')}"
    if code == 0:
        return JobState.SUCCEEDED, "Finished with exit code 0."
    return JobState.FAILED, f"Failed with {how}." + (
        f" {report['message']}" if report.get("message") else ""
    )


def _ending(job: Job, report: dict, now: datetime) -> tuple[str, str, dict, dict]:
    """For an ``exited`` report that ends the job: its end state, the message, the job's
    fields and the event's data."""
    state, message = _end_state(job, report)
    fields = {
        "finished_at": now,
        "exit_code": report.get("exit_code"),
        "exit_signal": report.get("signal"),
    }
    if state == JobState.FAILED:
        fields["failure_message"] = message[:2000]
    data = {"node": report["node"], **({"reconciled": True} if report.get("reconciled") else {})}
    return state, message, fields, data


@transaction.atomic
def job_exited(report: dict) -> Job | None:
    """Release the node's GPUs at once; when the job's last node exits, set its end state."""
    job = _current_job(report)
    node_name = report["node"]
    if job is None:
        return None
    now = _ts(report.get("finished_at"))
    released = Allocation.objects.filter(
        job=job, node__name=node_name, released_at__isnull=True
    ).update(released_at=now)
    remaining = job.allocations.filter(released_at__isnull=True)
    if not released and (job.state not in ACTIVE_STATES or remaining.exists()):
        return job  # a duplicate report (or one from a node that did not hold the job)
    if remaining.exists():
        job_event(
            job,
            "node_exited",
            f"Process on {node_name} exited ({report.get('exit_code')}).",
            data=report,
        )
        if report.get("exit_code") not in (0, None) and job.state in (
            JobState.ADMITTED,
            JobState.RUNNING,
        ):
            from .stopping import job_stop

            job_stop(
                job=job,
                reason=StopReason.CANCELLED,
                message=f"A process of the gang failed on {node_name}.",
            )
        return job
    state, message, fields, data = _ending(job, report, now)
    job_transition(job, state, kind=state.lower(), message=message, data=data, **fields)
    _requeue_if_allowed(job, now)
    _dispatch_on_commit()
    return job


def _requeue_if_allowed(job: Job, now: datetime) -> None:
    """A preempted or lost job whose policy allows it goes back to PENDING as a new attempt."""
    if job.state not in (JobState.PREEMPTED, JobState.LOST):
        return
    policy = WorkloadPolicy.objects.filter(workload_type=job.workload_type).first()
    allowed = policy is None or (
        policy.requeue_on_preemption if job.state == JobState.PREEMPTED else policy.requeue_on_lost
    )
    counter = (
        {"preemption_count": F("preemption_count") + 1} if job.state == JobState.PREEMPTED else {}
    )
    if counter:
        Job.objects.filter(pk=job.pk).update(**counter)
        job.preemption_count += 1
    if not allowed:
        return
    preempted = job.state == JobState.PREEMPTED
    why = "preempted" if preempted else "its node was lost"
    gpus = job.total_gpus
    hours = gpu_hours_left(job, gpus, now)
    job_transition(
        job,
        JobState.PENDING,
        kind="requeued",
        message=f"Requeued because {why}.",
        now=now,
        **requeue_fields(job, now),
    )
    reclaim_record_add(
        kind=ReclaimKind.PREEMPTION_REQUEUE if preempted else ReclaimKind.LOST_REQUEUE,
        job=job,
        now=now,
        gpus=gpus,
        gpu_hours=hours,
    )


# --- started and exited reports of a batch, set-based -----------------------------------------

#: What the set-based path reads of a job: its state, what ``_end_state`` and the
#: runtime history need (a field left out would cost a query per job).
_REPORTED_JOB_FIELDS = (
    "state",
    "requeue_count",
    "stop_reason",
    "admitted_at",
    "started_at",
    "finished_at",
    "project_id",
    "workload_type",
    "submitted_by_id",
    "max_runtime_seconds",
)


def _reported_jobs_locked(ids: list[int]) -> tuple[dict[int, Job], dict[int, dict[str, list[int]]]]:
    """The jobs of ``ids`` locked (in id order: two workers lock in the same order), and
    their open allocations by node name.

    Two statements, not one with a join: a row locked after waiting for another worker
    is read again as that worker committed it, but rows joined to it would be read as
    they were when the statement began (PostgreSQL's READ COMMITTED): the allocations
    are read once the locks are held."""
    if not ids:
        return {}, {}
    qn = connection.ops.quote_name
    columns = ", ".join(
        qn(Job._meta.get_field(name).column) for name in ("id", *_REPORTED_JOB_FIELDS)
    )
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    in_ids = ", ".join(["%s"] * len(ids))
    jobs = {
        job.pk: job
        for job in Job.objects.raw(
            f"SELECT {columns} FROM {qn(Job._meta.db_table)}"
            f" WHERE id IN ({in_ids}) ORDER BY id{lock}",
            ids,
        )
    }
    held: dict[int, dict[str, list[int]]] = {job_id: {} for job_id in jobs}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT a.job_id, a.id, n.name FROM {qn(Allocation._meta.db_table)} a"
            f" JOIN {qn(Node._meta.db_table)} n ON n.id = a.node_id"
            f" WHERE a.job_id IN ({in_ids}) AND a.released_at IS NULL ORDER BY a.id",
            ids,
        )
        for job_id, pk, node_name in cursor.fetchall():
            held.setdefault(job_id, {}).setdefault(node_name, []).append(pk)
    return jobs, held


def job_reports_apply(*, reports: Sequence[dict]) -> list[int]:
    """Apply ``started`` and ``exited`` reports of one batch together, in their order, as
    :func:`job_started` and :func:`job_exited` would one after the other; returns the
    positions in ``reports`` of those left to them, to apply next, in order.

    The common cases are applied here with a few statements for all the jobs: their rows
    locked in one ``SELECT … FOR UPDATE`` (by id: two workers lock in the same order),
    their open allocations read at once, the released ones updated at once, the state
    changes and events written by :func:`~.lifecycle.jobs_transition_steps`. That is a
    start of an ADMITTED job, an exit that ends an ADMITTED or RUNNING job (the last node
    of a gang included), and every report that changes nothing (a repeat, an older
    attempt, a start after the exit) or stops an orphan. The rest (a start on another node
    of a running gang, a gang member's exit while others still run, the end of a STOPPING
    job with its requeue) is left to the handlers, with every later report of that job.

    Must run in a transaction; it either applies all it takes on or raises.
    """
    jobs, held = _reported_jobs_locked(sorted({int(r["job_id"]) for r in reports}))
    steps: list[Step] = []
    states = {job_id: job.state for job_id, job in jobs.items()}  # as the steps leave them
    releases: dict[datetime, list[int]] = {}
    started: set[tuple[int, str]] = set()
    left: list[int] = []
    left_jobs: set[int] = set()
    for position, report in enumerate(reports):
        job_id = int(report["job_id"])
        if job_id in left_jobs:
            left.append(position)
            continue
        job = jobs.get(job_id)
        if job is not None and job.attempt != int(report.get("attempt", 0)):
            job = None  # a report about an older attempt
        on_nodes = held.get(job_id, {})
        if report["type"] == "started":
            step = _batch_started(job, states.get(job_id), report, on_nodes, started)
        else:
            step = _batch_exited(job, states.get(job_id), report, on_nodes, releases)
        if isinstance(step, Step):
            steps.append(step)
            states[job_id] = step.to_state
        elif not step:
            left_jobs.add(job_id)
            left.append(position)
    _allocations_release(releases)
    jobs_transition_steps(steps)
    if any(step.to_state != JobState.RUNNING for step in steps):
        _dispatch_on_commit()
    return left


def _batch_started(
    job: Job | None,
    state: str | None,
    report: dict,
    held: dict[str, list[int]],
    started: set[tuple[int, str]],
) -> Step | bool:
    """A ``started`` report of a job in ``state`` as :func:`job_started` applies it: its
    step, True (nothing to change) or False (left to it)."""
    node_name = report["node"]
    if job is not None and state not in (*ACTIVE_STATES, *WAITING_STATES):
        return True  # the attempt ended already
    if job is None or not held.get(node_name):
        _stop_orphan(
            node_name, report["job_id"], report.get("attempt", 0), "started but not placed here"
        )
        return True
    if state == JobState.ADMITTED:
        started_at = _ts(report.get("started_at"))
        started.add((job.pk, node_name))
        return Step(
            job,
            JobState.RUNNING,
            kind="started",
            message=f"Started on {node_name} (pid {report.get('pid')}).",
            data=_started_data(report),
            fields={"started_at": started_at, "last_active_at": started_at, **_serve_port(report)},
        )
    return (job.pk, node_name) in started  # a repeat of a start this batch applied


def _started_data(report: dict) -> dict:
    data = {"node": report["node"], "pid": report.get("pid")}
    if report.get("reconciled"):
        data["reconciled"] = True
    if report.get("port") is not None:
        data["port"] = report["port"]
    return data


def _serve_port(report: dict) -> dict:
    """A serving job's port, from its ``started`` report: its endpoint, not
    ready until a scrape says so (a requeued replica's last attempt may have been)."""
    port = report.get("port")
    if not (isinstance(port, int) and 0 < port < 65536):
        return {}
    return {"serve_port": port, "serve_ready": False}


def _batch_exited(
    job: Job | None,
    state: str | None,
    report: dict,
    held: dict[str, list[int]],
    releases: dict[datetime, list[int]],
) -> Step | bool:
    """An ``exited`` report of a job in ``state`` as :func:`job_exited` applies it: its
    step, True (nothing to change) or False (left to it)."""
    if job is None:
        return True
    node_name = report["node"]
    now = _ts(report.get("finished_at"))
    here = held.get(node_name, [])
    elsewhere = any(pks for name, pks in held.items() if name != node_name)
    if not here and (state not in ACTIVE_STATES or elsewhere):
        return True  # a duplicate report (or one from a node that did not hold the job)
    if elsewhere or state not in (JobState.ADMITTED, JobState.RUNNING):
        return False  # a gang member's exit, or the end of a stopping job
    releases.setdefault(now, []).extend(here)
    held[node_name] = []
    # Locked ADMITTED or RUNNING too (nothing here makes a job STOPPING): _end_state's
    # stopping case does not apply, its outcome is the report's.
    end, message, fields, data = _ending(job, report, now)
    return Step(job, end, kind=end.lower(), message=message, data=data, fields=fields)


def _allocations_release(releases: dict[datetime, list[int]]) -> None:
    """Release the allocations ``{released at: [allocation id]}`` in one UPDATE; raises
    if any was released meanwhile (the caller's reports are then applied one by one)."""
    pks = [pk for group in releases.values() for pk in group]
    if not pks:
        return
    prepare = Allocation._meta.get_field("released_at").get_db_prep_save
    whens, params = [], []
    for at, group in releases.items():
        whens.append(f"WHEN id IN ({', '.join(['%s'] * len(group))}) THEN %s")
        params += [*group, prepare(at, connection)]
    value = "%s" if len(releases) == 1 else f"CASE {' '.join(whens)} END"
    if len(releases) == 1:
        params = params[-1:]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {connection.ops.quote_name(Allocation._meta.db_table)}"
            f" SET released_at = {value}"
            f" WHERE id IN ({', '.join(['%s'] * len(pks))}) AND released_at IS NULL",
            [*params, *pks],
        )
        updated = cursor.rowcount
    if updated != len(pks):
        raise RuntimeError(
            f"{len(pks) - updated} of {len(pks)} allocations were released meanwhile"
        )


def job_log_path(job_id: int, attempt: int) -> Path:
    return Path(settings.SLUICE_LOG_DIR) / str(job_id) / f"attempt-{attempt}.log"


def job_log_append(report: dict) -> None:
    """Write a chunk of a job's output at its offset (idempotent: a resent chunk overwrites
    itself). What lies beyond the job's log cap (its policy's ``log_cap_mb``) is dropped and
    a marker says so; the agent stops shipping there too, this bounds what any agent sends."""
    job_id, attempt = int(report["job_id"]), int(report.get("attempt", 0))
    cap = _log_cap_bytes(job_id)
    data = str(report.get("data", "")).encode("utf-8", errors="replace")
    offset = int(report.get("offset", 0))
    if offset >= cap:
        data, offset = log_truncated_marker(cap), cap
    elif offset + len(data) > cap:
        data = data[: cap - offset] + log_truncated_marker(cap)
    path = job_log_path(job_id, attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "r+b" if path.exists() else "w+b") as handle:
        handle.seek(offset)
        handle.write(data)
        size = handle.seek(0, 2)
    Job.objects.filter(pk=job_id, requeue_count=attempt).update(log_size=size)


def log_truncated_marker(cap: int) -> bytes:
    return f"\n[sluice: log truncated at {cap} bytes; the job goes on running]\n".encode()


def _log_cap_bytes(job_id: int) -> int:
    cap_mb = (
        WorkloadPolicy.objects.filter(
            workload_type=Subquery(Job.objects.filter(pk=job_id).values("workload_type")[:1])
        )
        .values_list("log_cap_mb", flat=True)
        .first()
    )
    return (cap_mb or DEFAULT_LOG_CAP_MB) * 1024 * 1024


# --- lost nodes -----------------------------------------------------------------------------


@transaction.atomic
def node_mark_down(*, node: Node, reason: str, actor=None) -> list[Job]:
    """The node is gone: release its GPUs, and requeue or fail its jobs by policy (LOST)."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.state == NodeState.DOWN:
        return []
    before = node.state
    node.state = NodeState.DOWN
    node.save(update_fields=["state"])
    now = timezone.now()
    job_ids = Allocation.objects.filter(node=node, released_at__isnull=True).values("job_id")
    affected = list(Job.objects.filter(pk__in=job_ids, state__in=ACTIVE_STATES).select_for_update())
    audit_record(
        action="node.down",
        target=node,
        actor=actor,
        reason=reason,
        before={"state": before},
        after={"state": NodeState.DOWN, "jobs": [j.pk for j in affected]},
    )
    for job in affected:
        job.allocations.filter(released_at__isnull=True).update(released_at=now)
        try:
            _end_after_loss(job, now, f"Node {node.name} is down: {reason}.")
        except (IllegalTransition, ConcurrentChange):
            log.exception("could not end job %s after node %s was lost", job.pk, node.name)
    dispatch_on_commit()
    return affected


def _end_after_loss(job: Job, now: datetime, message: str) -> None:
    """End a job whose process is gone: as its stop intended if it was stopping for a
    reason of its own, else LOST (PREEMPTED if preempted), requeued by policy."""
    if job.state == JobState.STOPPING and job.stop_reason not in (
        "",
        StopReason.PREEMPTED,
        StopReason.LOST,
    ):
        job_transition(
            job,
            STOP_REASON_END_STATE[StopReason(job.stop_reason)],
            message=message,
            finished_at=now,
        )
        return
    target = JobState.PREEMPTED if job.stop_reason == StopReason.PREEMPTED else JobState.LOST
    job_transition(job, target, message=message, finished_at=now, failure_message=message)
    _requeue_if_allowed(job, now)


#: When the last probe handled by a reports worker was sent (unix time; see below).
REPORTS_PROBE_KEY = "sluice:reports:probe"
#: When the last drain of the heartbeats queue that emptied it began (unix time): every
#: heartbeat sent before then was applied (scheduling.services.heartbeats).
HEARTBEATS_DRAINED_KEY = "sluice:heartbeats:drained"
#: Held while a worker process applies report messages it took off the reports queue
#: (scheduling.services.reports_queue): they wait no longer there and are not yet applied.
REPORTS_BATCH_KEY = "sluice:reports:batch"


def reports_probe_record(*, sent_at: float) -> None:
    """A reports worker handled a probe sent at ``sent_at``: reports queued before it
    have been handled."""
    if sent_at > (cache.get(REPORTS_PROBE_KEY) or 0.0):
        cache.set(REPORTS_PROBE_KEY, sent_at, timeout=None)


def reports_handled_until(now: datetime) -> datetime:
    """Up to when the node heartbeats in the database are complete.

    A heartbeat is recorded when a reports worker handles it: while no worker reads the
    reports queue (workers down, restarting, or far behind), every node's last heartbeat
    ages although the agents keep sending. Each sweep sends a probe through the queue; a
    probe that has not come back for a while means the reports are not flowing, and nodes
    are then judged by the time of the last probe that did come back, not by the clock.
    Heartbeats sent apart, on the heartbeats queue, count up to the last drain that
    emptied that queue (``HEARTBEATS_DRAINED_KEY``), judged the same way."""
    stale_after = timedelta(seconds=3 * settings.SLUICE_CONTROL_INTERVAL + 10)
    until = now
    for key in (REPORTS_PROBE_KEY, HEARTBEATS_DRAINED_KEY):
        mark = cache.get(key)
        if mark is None:
            continue  # nothing known yet (first start, or the cache was emptied)
        handled = datetime.fromtimestamp(mark, tz=UTC)
        if now - handled > stale_after:
            until = min(until, handled)
    return until


def nodes_sweep_lost(now: datetime | None = None) -> list[str]:
    """Mark nodes without a heartbeat for SLUICE_NODE_LOST_SECONDS as down: counted up to
    when the reports were last known to flow (``reports_handled_until``), so that a
    control worker that was down itself does not take every node for lost."""
    now = now or timezone.now()
    until = reports_handled_until(now)
    transaction.on_commit(lambda: reports_probe_enqueue(now.timestamp()))
    cutoff = until - timedelta(seconds=settings.SLUICE_NODE_LOST_SECONDS)
    lost = Node.objects.exclude(state=NodeState.DOWN).filter(last_heartbeat__lt=cutoff)
    names = []
    for node in lost:
        node_mark_down(
            node=node, reason=f"no heartbeat since {node.last_heartbeat:%Y-%m-%d %H:%M:%S}"
        )
        names.append(node.name)
    return names
