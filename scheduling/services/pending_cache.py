"""The dispatch leader's copy of the waiting jobs, kept between cycles.

Reading every waiting job whole each cycle (its spec, times, JSON fields) costs tens of
microseconds a job: with 10,000 waiting, a cycle would spend most of a second only reading.
What the engine needs of a waiting job hardly changes while it waits, so each cycle reads
a narrow row per waiting job (ids, state, class, attempt, reason code, limit, sort key:
no dates, no JSON) and reads whole only the jobs that are new or whose narrow row changed.

The copy lives in the dispatch worker's process (one leader at a time). It is dropped when
the small tables it depends on change (classes, policies, queues, tenants, projects) and
every ``FULL_RELOAD_SECONDS`` anyway, so a change it does not watch is picked up soon.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from .. import engine
from ..choices import JobState
from ..models import Allocation, Job, PriorityClass, Queue, WorkloadPolicy
from ..runtime_prediction import expected_runtimes

FULL_RELOAD_SECONDS = 60.0
#: Runtime predictions (one query over the submitters' histories and a pass over every
#: waiting job) are refreshed this often; a new job gets its prediction at once.
EXPECTED_REFRESH_SECONDS = 10.0
_WAITING = [JobState.PENDING, JobState.HELD]
# What decides whether a cached job is still right; with the sort key last.
_NARROW = (
    "id",
    "state",
    "priority_class_id",
    "requeue_count",
    "pending_reason_code",
    "max_runtime_seconds",
    "pending_rank",
)
_WHOLE = (
    "id",
    "name",
    "state",
    "tenant_id",
    "project_id",
    "queue_id",
    "workload_type",
    "priority_class_id",
    "submitted_by_id",
    "gpus_per_node",
    "nodes",
    "gpu_models",
    "min_gpu_memory_mb",
    "submitted_at",
    "max_runtime_seconds",
    "pending_reason_code",
    "pending_reason_message",
    "requeue_count",
    "checkpoint_dir",
)


@dataclass(slots=True)
class PendingRow:
    """What a cycle knows of a waiting job besides the engine's record of it: plain
    values (no model object per waiting job), and the reason the last cycle wrote."""

    id: int
    name: str
    project_id: int
    pool_id: int
    tenant: str
    priority: int
    rank: float | None
    reason: tuple[str, str]  # code, message


@dataclass(slots=True)
class _Entry:
    key: tuple
    row: PendingRow
    job: engine.PendingJob
    submitter_id: int | None
    workload_type: str


class PendingCache:
    """See the module docstring. ``load`` returns the rows and the engine's records."""

    def __init__(self, *, full_reload_seconds: float = FULL_RELOAD_SECONDS) -> None:
        self._full_reload_seconds = full_reload_seconds
        self._entries: dict[int, _Entry] = {}
        self._fingerprint: tuple = ()
        self._loaded_at = 0.0
        self._expected_at = 0.0
        self.whole_reads = 0  # jobs read whole by the last load (for the cycle's figures)
        #: Pool positions of the last committed cycle's plan (see ``previous_positions``).
        self.positions: dict[int, int] = {}
        #: The estimates and guaranteed starts last written, by pool id: an unchanged pool
        #: is not rewritten.
        self.estimates: dict[int, tuple[dict[str, int | None], dict[str, int]]] = {}
        #: When the last cycle that wrote every waiting job's sort key and estimate began
        #: (time.monotonic(); see dispatch._explain_now); None: none since the copy was
        #: cleared.
        self.explained_at: float | None = None
        #: How long that cycle took (seconds; see dispatch._explain_interval).
        self.explained_seconds = 0.0
        #: ``enqueue.WAITING_VERSION_KEY`` as it was before the waiting jobs were last
        #: read (see ``waiting_unchanged``).
        self.waiting_version = None
        #: The runtime predicted for each placed job when the dispatch loop first saw it
        #: placed (seconds; 0: none), kept while it stays placed, for the minimum
        #: preemption gain (see dispatch._running_expected).
        self.running_expected: dict[int, float] = {}

    def clear(self) -> None:
        """Forget everything (a failed cycle, a new test)."""
        self._reset_copy()
        self.waiting_version = None
        self.running_expected.clear()

    def _reset_copy(self) -> None:
        """Forget the copy of the waiting jobs and what was written of them (a full
        reload); the placed jobs' predictions stay."""
        self._entries.clear()
        self._fingerprint = ()
        self.positions = {}
        self.estimates = {}
        self.explained_at = None
        self.explained_seconds = 0.0

    @property
    def size(self) -> int:
        """The number of waiting jobs in the copy (as last read)."""
        return len(self._entries)

    def waiting_unchanged(self, version) -> bool:
        """Whether no waiting job changed since they were last read, but by this leader's
        own writes, which the copy follows: ``version`` (the counter now) is the one seen
        then, and there is a copy."""
        return bool(self._entries) and version is not None and version == self.waiting_version

    def forget(self, job_ids) -> None:
        """These jobs left the waiting ones by this leader's cycle (placed), which
        committed."""
        for job_id in job_ids:
            self._entries.pop(job_id, None)
            self.positions.pop(job_id, None)

    def explained(self, monotonic: float, seconds: float = 0.0) -> None:
        """A cycle that began at ``monotonic``, took ``seconds`` and wrote every waiting
        job's sort key and estimate committed."""
        self.explained_at = monotonic
        self.explained_seconds = seconds

    def load(
        self, policies: dict[str, WorkloadPolicy], *, read_waiting: bool = True
    ) -> tuple[dict[int, PendingRow], list[engine.PendingJob]]:
        """The waiting jobs' rows and engine records. ``read_waiting=False`` (the caller
        checked ``waiting_unchanged``) takes them from the copy without reading them."""
        from tenants.models import Project, Tenant

        tenants = dict(Tenant.objects.values_list("id", "slug"))
        projects = dict(Project.objects.values_list("id", "slug"))
        pools = {}
        sharing_queues = set()
        for q, pool_id, name, time_sharing in Queue.objects.values_list(
            "id", "pool_id", "pool__name", "time_sharing"
        ):
            pools[q] = (pool_id, name)
            if time_sharing:
                sharing_queues.add(q)
        classes = {
            c[0]: c
            for c in PriorityClass.objects.values_list(
                "id", "value", "name", "preemptible", "can_preempt"
            )
        }
        fingerprint = (
            tuple(sorted(tenants.items())),
            tuple(sorted(projects.items())),
            tuple(sorted(pools.items())),
            tuple(sorted(sharing_queues)),
            tuple(sorted(classes.values())),
            tuple(
                sorted(
                    (
                        t,
                        p.preemptible,
                        p.max_wait_seconds,
                        p.topology_wait_seconds,
                        p.stop_grace_seconds,
                    )
                    for t, p in policies.items()
                )
            ),
        )
        stale = time.monotonic() - self._loaded_at > self._full_reload_seconds
        if fingerprint != self._fingerprint or stale:
            self._reset_copy()
            self._fingerprint = fingerprint
            self._loaded_at = time.monotonic()
        if not read_waiting and self._entries:
            self.whole_reads = 0
            rows = {job_id: entry.row for job_id, entry in self._entries.items()}
            self._refresh_expected_when_due(rows, set())
            return rows, [entry.job for entry in self._entries.values()]
        narrow = _narrow_rows()
        entries = self._entries
        get = entries.get
        # (row[1:-1] is _key(row), inlined: this runs for every waiting job every cycle.)
        wanted = [row[0] for row in narrow if (e := get(row[0])) is None or e.key != row[1:-1]]
        self.whole_reads = len(wanted)
        for start in range(0, len(wanted), 900):  # SQLite allows ~1000 variables a statement
            for whole in (
                Job.objects.filter(pk__in=wanted[start : start + 900])
                .order_by()
                .values_list(*_WHOLE)
            ):
                entries[whole[0]] = _entry(
                    whole, tenants, projects, pools, classes, policies, sharing_queues
                )
        _attain([entries[job_id].job for job_id in wanted if job_id in entries])
        waiting = {row[0] for row in narrow}
        for job_id in [j for j in entries if j not in waiting]:
            del entries[job_id]
        fresh = set(wanted)
        rows: dict[int, PendingRow] = {}
        pending: list[engine.PendingJob] = []
        for row in narrow:
            entry = get(row[0])
            if entry is None or entry.key != row[1:-1]:
                continue  # changed again between the two reads: next cycle
            entry.row.rank = row[-1]
            rows[row[0]] = entry.row
            pending.append(entry.job)
        self._refresh_expected_when_due(rows, fresh)
        return rows, pending

    def _refresh_expected_when_due(self, rows: dict[int, PendingRow], fresh: set[int]) -> None:
        if time.monotonic() - self._expected_at > EXPECTED_REFRESH_SECONDS:
            self._expected_at = time.monotonic()
            self._refresh_expected(rows)
        elif fresh:
            self._refresh_expected({job_id: rows[job_id] for job_id in fresh if job_id in rows})

    def retold(self, job_id: int, code: str, message: str) -> None:
        """The cycle wrote this reason: the copy follows, so that the next cycle does not
        take its own write for a change. (A cycle that fails clears the whole copy.)"""
        entry = self._entries.get(job_id)
        if entry is not None:
            entry.row.reason = (code, message)
            state, class_id, requeue_count, _, max_runtime = entry.key
            entry.key = (state, class_id, requeue_count, code, max_runtime)

    def previous_positions(self, rows: dict[int, PendingRow]) -> dict[int, int]:
        """Each waiting job's pool position in the last cycle: the last committed plan's
        (kept by ``positions``), else counted from the sort keys."""
        return self.positions or pool_positions(rows)

    def _refresh_expected(self, rows: dict[int, PendingRow]) -> None:
        """Runtime predictions move as jobs finish (one query for the given jobs)."""
        entries = self._entries
        expected = expected_runtimes(
            (
                job_id,
                row.project_id,
                entries[job_id].workload_type,
                entries[job_id].submitter_id,
                entries[job_id].job.max_runtime_seconds,
            )
            for job_id, row in rows.items()
        )
        for job_id, seconds in expected.items():
            entries[job_id].job.expected_runtime_seconds = seconds if seconds is not None else 0.0


def pool_positions(rows: dict[int, PendingRow]) -> dict[int, int]:
    """Each ranked job's pool position in the last cycle's order (from the sort keys)."""
    ranked = sorted(
        (row.rank, row.id, row.pool_id) for row in rows.values() if row.rank is not None
    )
    counts: dict[int, int] = defaultdict(int)
    positions = {}
    for _, job_id, pool in ranked:
        counts[pool] += 1
        positions[job_id] = counts[pool]
    return positions


def _narrow_rows() -> list[tuple]:
    """The narrow row of every waiting job, fetched at once from a cursor: the queryset's
    own iteration (chunks of 100, a converter pass per row) is most of the read's cost at
    10,000 waiting."""
    sql, params = (
        Job.objects.filter(state__in=_WAITING).order_by().values_list(*_NARROW).query
    ).sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _key(narrow: tuple) -> tuple:
    return narrow[1:-1]


def takes_part_in_time_sharing(
    queue_time_sharing: bool,
    checkpoint_dir: str,
    preemptible: bool,
    policy: WorkloadPolicy | None,
) -> bool:
    """Whether a job takes part in its queue's time-sharing (engine/order.py): the queue
    opts in, and the job declares it checkpoints: preemptible, with a checkpoint
    directory and a grace period to save one in."""
    grace = policy.stop_grace_seconds if policy else 30
    return queue_time_sharing and bool(checkpoint_dir) and preemptible and grace > 0


def attained_service(job_ids: Iterable[int]) -> dict[int, tuple[float, float]]:
    """Per job: (GPU-seconds used in its earlier runs, when the last of them ended), from
    its released allocations (one row per GPU held, granted to released); jobs without
    any are left out. One query."""
    found: dict[int, tuple[float, float]] = {}
    ids = list(job_ids)
    for start in range(0, len(ids), 900):  # SQLite allows ~1000 variables a statement
        rows = Allocation.objects.filter(
            job_id__in=ids[start : start + 900], released_at__isnull=False
        ).values_list("job_id", "granted_at", "released_at")
        for job_id, granted, released in rows.order_by():
            used, last = found.get(job_id, (0.0, 0.0))
            ended = released.timestamp()
            found[job_id] = (used + max(ended - granted.timestamp(), 0.0), max(last, ended))
    return found


def epoch(value: datetime | None) -> float:
    """Unix time of a stored moment, 0 for none (the engine's times)."""
    return value.timestamp() if value else 0.0


def _attain(jobs: list[engine.PendingJob]) -> None:
    """Set the attained GPU-seconds of the time-sharing jobs read whole (a job that ran
    before: a requeue makes it read again) and when each last entered the queue."""
    sharing = [job for job in jobs if job.time_sharing]
    if not sharing:
        return
    attained = attained_service(job.id for job in sharing)
    for job in sharing:
        used, last = attained.get(job.id, (0.0, 0.0))
        job.attained_gpu_seconds = used
        job.queued_at = last


def _entry(
    whole: tuple, tenants, projects, pools, classes, policies, sharing_queues=frozenset()
) -> _Entry:
    (
        job_id,
        name,
        state,
        tenant_id,
        project_id,
        queue_id,
        workload_type,
        class_id,
        submitter_id,
        gpus_per_node,
        nodes,
        gpu_models,
        min_memory,
        submitted_at,
        max_runtime,
        code,
        message,
        requeue_count,
        checkpoint_dir,
    ) = whole
    policy = policies.get(workload_type)
    _, value, class_name, preemptible, can_preempt = classes[class_id]
    tenant = tenants[tenant_id]
    pool_id, pool = pools[queue_id]
    job = engine.PendingJob(
        id=job_id,
        tenant=tenant,
        project=projects[project_id],
        queue_id=queue_id,
        pool=pool,
        workload_type=workload_type,
        priority=value,
        priority_class=class_name,
        preemptible=preemptible and (policy.preemptible if policy else True),
        can_preempt=can_preempt,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        gpu_models=tuple(gpu_models or ()),
        min_gpu_memory_mb=min_memory,
        submitted_at=epoch(submitted_at),
        max_runtime_seconds=max_runtime,
        held=state == JobState.HELD,
        max_wait_seconds=float(policy.max_wait_seconds) if policy else 0.0,
        topology_wait_seconds=float(policy.topology_wait_seconds) if policy else 0.0,
    )
    job.time_sharing = takes_part_in_time_sharing(
        queue_id in sharing_queues, checkpoint_dir, job.preemptible, policy
    )
    return _Entry(
        key=(state, class_id, requeue_count, code, max_runtime),
        row=PendingRow(job_id, name, project_id, pool_id, tenant, value, None, (code, message)),
        job=job,
        submitter_id=submitter_id,
        workload_type=workload_type,
    )
