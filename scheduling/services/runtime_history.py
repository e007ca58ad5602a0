"""Keeps the runtime history that runtime prediction reads (``RuntimeHistory``) up to date.

Each job that ends ``SUCCEEDED`` or ``TIMED_OUT`` adds ``[finished_at, runtime / limit]`` to
two rows, in the transaction of its end (:func:`runtime_history_record`, called by
:func:`scheduling.services.lifecycle.job_transition`): its submitter's in its project for
its workload type, and its project's for its workload type (every submitter). Each row
keeps the newest :data:`HISTORY_JOBS` entries. Why these states and this ratio: see
:mod:`scheduling.runtime_prediction`.

:func:`runtime_history_rebuild` recomputes the rows from the jobs table, for jobs stored
without going through a transition (the demo's seeded history, an import) and for an
install upgraded from before the table existed (its migration runs it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..choices import JobState
from ..models import Job, RuntimeHistory
from ..runtime_rule import HISTORY_JOBS
from .sql import rows_update

#: Job states whose runtime says how long the work takes (see scheduling.runtime_prediction).
HISTORY_STATES = (JobState.SUCCEEDED, JobState.TIMED_OUT)


def finished_ratio(
    *, state: str, began: datetime | None, finished: datetime | None, limit: int
) -> float | None:
    """How much of its runtime limit a finished job used, between 0 and 1 (None: unknown).

    A timed-out job needed at least its whole limit: 1. The runtime is its last attempt's,
    from its start (or its admission, when the exit report overtook the start) to its end.
    """
    if state == JobState.TIMED_OUT:
        return 1.0
    if began is None or finished is None:
        return None
    if limit <= 0:
        return 1.0
    return min(max((finished - began).total_seconds() / limit, 0.0), 1.0)


def merged_entries(entries: list, entry: list) -> list:
    """``entries`` with ``entry`` in its place by finish time (newest first; a late report
    of an older job goes where it belongs), at most HISTORY_JOBS."""
    merged = sorted([*entries, entry], key=lambda item: item[0], reverse=True)
    return merged[:HISTORY_JOBS]


#: Set inside ``runtime_history_batch``: the entries of jobs whose end has committed.
_batch: ContextVar[list | None] = ContextVar("runtime_history_batch", default=None)


@contextmanager
def runtime_history_batch() -> Iterator[None]:
    """Jobs ending inside this block (a batch of agent reports) add their entries after it,
    in one short transaction. Recorded at each end, the two rows every job of a project
    shares would stay locked until the end of the reports' transaction, and two workers
    handling reports at once would wait on each other for that long."""
    entries: list[tuple[tuple, list]] = []
    token = _batch.set(entries)
    try:
        yield
    finally:
        _batch.reset(token)
        # Registered last: runs after the ends' own on-commit callbacks that fill
        # ``entries`` (at once in a worker, where each group has committed already).
        transaction.on_commit(lambda: _add_entries(entries) if entries else None)


@transaction.atomic
def _add_entries(entries: list[tuple[tuple, list]]) -> None:
    """Merge entries into their rows: the existing rows locked in one ``SELECT … FOR
    UPDATE`` in id order (no deadlock between two workers doing the same), the missing
    ones created after, in key order; all written in one UPDATE."""
    by_key: dict[tuple, list[list]] = defaultdict(list)
    for key, entry in entries:
        by_key[key].append(entry)
    now = timezone.now()
    keys = sorted(by_key, key=_key_order)
    rows = _rows_locked(keys)
    for key in keys:
        if key not in rows:  # a first entry (the row is created, or was just now)
            project_id, workload_type, submitter_id = key
            rows[key], _ = RuntimeHistory.objects.select_for_update().get_or_create(
                project_id=project_id,
                workload_type=workload_type,
                submitted_by_id=submitter_id,
                defaults={"updated_at": now},
            )
    changes = []
    for key in keys:
        merged = rows[key].entries or []
        for entry in by_key[key]:
            merged = merged_entries(merged, entry)
        changes.append([rows[key].pk, merged, now])
    rows_update(RuntimeHistory, ["entries", "updated_at"], changes)


def _key_order(key: tuple) -> tuple:
    return (key[0], key[1], key[2] or 0)


def _rows_locked(keys: list[tuple]) -> dict[tuple, RuntimeHistory]:
    """The existing rows of ``keys``, locked in id order (any one order will do, as long
    as every worker takes the same). Plain SQL: the ORM took a millisecond to build it,
    once per batch of reports that ended a job."""
    qn = connection.ops.quote_name
    match, params = [], []
    for project_id, workload_type, submitter_id in keys:
        submitter = "submitted_by_id IS NULL" if submitter_id is None else "submitted_by_id = %s"
        match.append(f"(project_id = %s AND workload_type = %s AND {submitter})")
        params += [project_id, workload_type, *([] if submitter_id is None else [submitter_id])]
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    locked = RuntimeHistory.objects.raw(
        f"SELECT id, project_id, workload_type, submitted_by_id, entries"
        f" FROM {qn(RuntimeHistory._meta.db_table)} WHERE {' OR '.join(match)}"
        f" ORDER BY id{lock}",
        params,
    )
    return {(r.project_id, r.workload_type, r.submitted_by_id): r for r in locked}


def runtime_history_record(job: Job, *, now: datetime | None = None) -> None:
    """Add a job that has just succeeded or timed out to its submitter's and its project's
    runtime history (the rows are locked: two jobs ending at once both count). Inside
    ``runtime_history_batch`` the entries wait for the end of the batch (and for the
    job's end to commit)."""
    if job.state not in HISTORY_STATES:
        return
    ratio = finished_ratio(
        state=job.state,
        began=job.started_at or job.admitted_at,
        finished=job.finished_at,
        limit=job.max_runtime_seconds,
    )
    if ratio is None:
        return
    now = now or timezone.now()
    entry = [(job.finished_at or now).timestamp(), round(ratio, 6)]
    batch = _batch.get()
    if batch is not None:
        keys = [(job.project_id, job.workload_type, s) for s in (job.submitted_by_id, None)]
        # Only once the end commits: a report rolled back (its savepoint) adds nothing.
        transaction.on_commit(lambda: batch.extend((key, entry) for key in keys))
        return
    with transaction.atomic():
        for submitter_id in (job.submitted_by_id, None):
            row, _ = RuntimeHistory.objects.select_for_update().get_or_create(
                project_id=job.project_id,
                workload_type=job.workload_type,
                submitted_by_id=submitter_id,
                defaults={"updated_at": now},
            )
            row.entries = merged_entries(row.entries or [], entry)
            row.updated_at = now
            row.save(update_fields=["entries", "updated_at"])


@transaction.atomic
def runtime_history_rebuild(*, now: datetime | None = None) -> int:
    """Recompute every row from the jobs table; returns how many rows there are now."""
    now = now or timezone.now()
    newest: dict[tuple, list] = defaultdict(list)
    finished = (
        Job.objects.filter(state__in=HISTORY_STATES, finished_at__isnull=False)
        .annotate(began=Coalesce("started_at", "admitted_at"))
        .filter(Q(began__isnull=False) | Q(state=JobState.TIMED_OUT))
        .order_by("-finished_at", "-id")
        .values_list(
            "project_id",
            "workload_type",
            "submitted_by_id",
            "state",
            "began",
            "finished_at",
            "max_runtime_seconds",
        )
    )
    for project, wtype, user, state, began, end, limit in finished.iterator(chunk_size=2000):
        keys = [(project, wtype, user), (project, wtype, None)]
        if all(len(newest[key]) >= HISTORY_JOBS for key in keys):
            continue
        ratio = finished_ratio(state=state, began=began, finished=end, limit=limit)
        for key in keys:
            if len(newest[key]) < HISTORY_JOBS:
                newest[key].append([end.timestamp(), round(ratio, 6)])
    RuntimeHistory.objects.all().delete()
    RuntimeHistory.objects.bulk_create(
        [
            RuntimeHistory(
                project_id=project,
                workload_type=wtype,
                submitted_by_id=user,
                entries=entries,
                updated_at=now,
            )
            for (project, wtype, user), entries in newest.items()
        ],
        batch_size=1000,
    )
    return len(newest)
