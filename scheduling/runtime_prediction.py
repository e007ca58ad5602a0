"""How long a job is expected to run, predicted from its owner's finished jobs.

The engine orders short and small work first inside a priority class and fair-share band
(``PendingJob.expected_runtime_seconds``); users declare generous runtime limits, so the
limit alone says little. The prediction:

1. **History**: the last :data:`HISTORY_JOBS` (20) finished jobs of the same submitter,
   project and workload type; with fewer than :data:`MIN_JOBS` (3) of them, the last 20 of
   the project and workload type (every submitter); with fewer than 3 of those, none.
   Finished means ``SUCCEEDED`` or ``TIMED_OUT``:

   - a *timed-out* job needed at least its whole limit: it counts as a ratio of 1, which
     keeps the prediction of a user whose jobs run out of time at their declared limit;
   - a *failed* job is left out: a crash after a minute says nothing about how long the
     work takes, and counting it would move the jobs of users whose code fails fast ahead
     of everyone else's; *cancelled*, *reclaimed* (idle), *preempted* and *lost* runs were
     cut short by someone or something else, and are left out for the same reason.

2. **Statistic**: for each of those jobs the ratio ``runtime / runtime limit`` (its last
   attempt, from its start to its end; at most 1), and the prediction is the declared
   limit × the 75th percentile of the ratios: three quarters of the comparable jobs
   finished within it. A percentile, not a mean, so that one odd job does not move it; the
   75th rather than the median because a prediction too short lets long work pass short
   work, while one too long only costs the job its own place. The ratio, not the runtime
   itself, because the limit a user declares carries what they know of this job's size
   (a 2 h evaluation and a 20 h one): what history teaches is by how much they over-declare.

3. **Bounds**: never above the declared limit, never below one second (the engine reads
   ``<= 0`` as "unknown").

Cost: the ratios are kept, 20 at most per submitter/project/workload type and per
project/workload type, in ``RuntimeHistory`` rows updated as jobs end
(:mod:`scheduling.services.runtime_history`). :func:`predict_runtimes` reads the rows of
any number of jobs in **one query** whose size follows the submitters and projects
involved, not the jobs stored: the dispatch loop pays one query per cycle however many
jobs wait, a page of the job API one query per page.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connection
from django.db.models import CharField, Value
from django.db.models.functions import Cast, Coalesce, Concat

from .choices import JobState, WorkloadType
from .models import Job, RuntimeHistory
from .runtime_rule import (
    HISTORY_JOBS,
    MIN_JOBS,
    PERCENTILE,
    predicted_seconds,
    ratio_statistic,
)
from .services.runtime_history import HISTORY_STATES
from .services.waste import human_duration

#: Jobs in these states get a prediction (it orders the waiting ones; running ones show it).
PREDICTED_STATES = (
    JobState.PENDING,
    JobState.HELD,
    JobState.ADMITTED,
    JobState.RUNNING,
    JobState.STOPPING,
)
# Up to this many history rows are looked up one by one through the unique indexes; more
# (the dispatch loop's thousands of pending jobs) by a key computed in one pass.
_MAX_KEYS_BY_INDEX = 60
_KEY = Concat(
    Cast("project_id", CharField()),
    Value(":"),
    "workload_type",
    Value(":"),
    Coalesce(Cast("submitted_by_id", CharField()), Value("")),
    output_field=CharField(),
)

BASIS_SUBMITTER = "submitter"
BASIS_PROJECT = "project"
BASIS_NONE = "none"


@dataclass(frozen=True)
class RuntimePrediction:
    """A job's expected runtime and where it comes from.

    ``seconds`` is None when there is no prediction (the engine then uses the declared
    limit). ``basis``: ``submitter`` (the submitter's own jobs in the project), ``project``
    (the project's jobs, every submitter) or ``none``; ``jobs`` is how many finished jobs
    it read and ``ratio`` the statistic of their runtime/limit ratios.
    """

    seconds: float | None
    declared_seconds: int
    basis: str
    jobs: int
    ratio: float | None
    submitter: str
    project: str
    workload_type: str

    @property
    def message(self) -> str:
        """``expected ~40 min from the last 20 finished training jobs of alice in project
        llm (declared 2 h)``."""
        declared = human_duration(self.declared_seconds)
        kind = f"finished {WorkloadType(self.workload_type).label.lower()} jobs"
        project = f"project {self.project}" if self.project else "its project"
        submitter = self.submitter or "its submitter"
        if self.seconds is None:
            return (
                f"no prediction: fewer than {MIN_JOBS} {kind} in {project}; "
                f"the declared limit ({declared}) is used"
            )
        whose = (
            f"of {submitter} in {project}"
            if self.basis == BASIS_SUBMITTER
            else f"in {project}, every submitter (fewer than {MIN_JOBS} of {submitter}'s own)"
        )
        return (
            f"expected ~{human_duration(self.seconds)} from the last {self.jobs} {kind} "
            f"{whose} (declared {declared})"
        )

    def as_dict(self) -> dict:
        return {
            "seconds": round(self.seconds) if self.seconds is not None else None,
            "declared_seconds": self.declared_seconds,
            "basis": self.basis,
            "jobs": self.jobs,
            "ratio": round(self.ratio, 4) if self.ratio is not None else None,
            "message": self.message,
        }


def expected_runtimes(
    jobs: Iterable[tuple[int, int, str, int | None, int]],
) -> dict[int, float | None]:
    """What :func:`predict_runtimes` predicts, in seconds, for plain rows ``(job id,
    project id, workload type, submitter id, declared limit)``: the dispatch loop's form
    (no model object per waiting job, no message), one query."""
    jobs = list(jobs)
    if not jobs:
        return {}
    histories = _histories(_keys((row[1], row[2], row[3]) for row in jobs))
    statistics_of: dict[tuple, tuple[float, int] | None] = {}
    expected: dict[int, float | None] = {}
    for job_id, project_id, workload_type, submitter_id, declared in jobs:
        found = None
        for key in ((project_id, workload_type, submitter_id), (project_id, workload_type, None)):
            if key not in statistics_of:
                statistics_of[key] = ratio_statistic(histories.get(key))
            found = statistics_of[key]
            if found is not None:
                break
        expected[job_id] = None if found is None else predicted_seconds(declared, found[0])
    return expected


def _keys(jobs: Iterable[tuple[int, str, int | None]]) -> set[tuple]:
    """The history keys ``(project, workload type, submitter or None)`` jobs need: their
    submitter's and their project's."""
    keys = set()
    for project_id, workload_type, submitter_id in jobs:
        keys.add((project_id, workload_type, submitter_id))
        keys.add((project_id, workload_type, None))
    return keys


def _histories(keys: set[tuple]) -> dict[tuple, list[float]]:
    """The ratios of the submitters' and projects' histories wanted, by ``(project,
    workload type, submitter or None)``: one query that reads those rows only (a few keys
    by the table's unique indexes; many, as the dispatch loop asks, by their key in one
    pass over the table)."""
    if not keys:
        return {}
    if len(keys) <= _MAX_KEYS_BY_INDEX:
        found = _rows_by_index(keys)
    else:
        found = (
            RuntimeHistory.objects.annotate(key=_KEY)
            .filter(
                key__in=[f"{p}:{t}:{u or ''}" for p, t, u in keys],
                workload_type__in={t for _, t, _ in keys},
            )
            .values_list("project_id", "workload_type", "submitted_by_id", "entries")
        )
    return {
        (project, wtype, submitter): history_ratios(entries)
        for project, wtype, submitter, entries in found
    }


def history_ratios(entries: list | str | bytes) -> list[float]:
    """The runtime/limit ratios of a ``RuntimeHistory.entries`` value, newest first (the
    JSON as text, as SQLite and a cast answer it, or decoded)."""
    if isinstance(entries, str | bytes):
        entries = json.loads(entries)
    return [ratio for _, ratio in entries[:HISTORY_JOBS]]


def _rows_by_index(keys: set[tuple]) -> list[tuple]:
    """The rows of a few keys, each found through its unique index, in plain SQL: a page of
    jobs or a submission's answer asks for a handful, and the ORM spent ten times the
    query's own cost building it."""
    table = connection.ops.quote_name(RuntimeHistory._meta.db_table)
    wanted, params = [], []
    for project, wtype, submitter in keys:
        if submitter is None:
            wanted.append("(project_id = %s AND workload_type = %s AND submitted_by_id IS NULL)")
            params += [project, wtype]
        else:
            wanted.append("(project_id = %s AND workload_type = %s AND submitted_by_id = %s)")
            params += [project, wtype, submitter]
    sql = (
        f"SELECT project_id, workload_type, submitted_by_id, entries FROM {table} "
        f"WHERE {' OR '.join(wanted)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return rows


def predict_runtimes(
    jobs: Iterable[Job], histories: dict[tuple, list[float]] | None = None
) -> dict[int, RuntimePrediction]:
    """The prediction of each job, by id, in one query (none when ``jobs`` is empty, or
    with ``histories``: the ratios of every key the jobs need, read already, a key absent
    having no history).

    Reads ``submitted_by.username`` and ``project.slug`` for the messages: select them
    with the jobs (``select_related``) to keep the caller's query count flat.
    """
    jobs = list(jobs)
    if not jobs:
        return {}
    if histories is None:
        keys = _keys((j.project_id, j.workload_type, j.submitted_by_id) for j in jobs)
        histories = _histories(keys)
    statistics_of: dict[tuple, tuple[float, int] | None] = {}
    predictions = {}
    for job in jobs:
        user_key = (job.project_id, job.workload_type, job.submitted_by_id)
        project_key = (job.project_id, job.workload_type, None)
        for key in (user_key, project_key):
            if key not in statistics_of:
                statistics_of[key] = ratio_statistic(histories.get(key))
        basis, found = BASIS_SUBMITTER, statistics_of[user_key]
        if found is None:
            basis, found = BASIS_PROJECT, statistics_of[project_key]
        declared = job.max_runtime_seconds
        if found is None:
            seconds, ratio, count, basis = None, None, 0, BASIS_NONE
        else:
            ratio, count = found
            seconds = predicted_seconds(declared, ratio)
        predictions[job.pk] = RuntimePrediction(
            seconds=seconds,
            declared_seconds=declared,
            basis=basis,
            jobs=count,
            ratio=ratio,
            submitter=_loaded(job, "submitted_by", "username"),
            project=_loaded(job, "project", "slug"),
            workload_type=job.workload_type,
        )
    return predictions


def _loaded(job: Job, relation: str, attribute: str) -> str:
    """A related object's name if it was loaded with the job, else "" (no query: the
    dispatch loop does not load the submitters)."""
    if not Job._meta.get_field(relation).is_cached(job):
        return ""
    return getattr(getattr(job, relation), attribute)


def predict_runtime(job: Job) -> RuntimePrediction | None:
    """One job's prediction (one query); None for a job that has ended."""
    if job.state not in PREDICTED_STATES:
        return None
    return predict_runtimes([job])[job.pk]


def predict_live_runtimes(jobs: Iterable[Job]) -> dict[int, RuntimePrediction]:
    """Predictions of the jobs that have not ended (no query when none is left)."""
    return predict_runtimes(job for job in jobs if job.state in PREDICTED_STATES)


__all__ = [
    "HISTORY_JOBS",
    "HISTORY_STATES",
    "MIN_JOBS",
    "PERCENTILE",
    "RuntimePrediction",
    "expected_runtimes",
    "history_ratios",
    "predict_live_runtimes",
    "predict_runtime",
    "predict_runtimes",
]
