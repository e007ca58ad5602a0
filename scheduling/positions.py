"""Where waiting jobs stand: positions and estimated starts, read from the last cycle.

The dispatch loop stores each waiting job's place in its scheduling order as a sort key,
``Job.pending_rank`` (see :mod:`scheduling.services.pending_ranks`), and rewrites only the
keys whose relative order changed. A job's position in its queue or pool is the number of
waiting jobs there with a smaller key, plus one, counted here when a page or the API
reads it: a job leaving the head of a queue of 10,000 costs one row, not 10,000.
Estimated starts move for most waiting jobs in most cycles; they are kept per pool in one
row (``PoolEstimates``) and looked up here.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from django.db import connection

from .choices import JobState

if TYPE_CHECKING:
    from .models import Job

WAITING = (JobState.PENDING, JobState.HELD)


class PositionsNotAttached(RuntimeError):
    """A job's position or estimated start was read without :func:`positions_attach`.

    A programming error, not a user's: the code that loaded the job must attach positions
    for all the jobs it shows at once (two queries for a whole page), not let each job
    fetch its own. It is not an ``AttributeError``, so a template that reads the property
    fails loudly instead of rendering it empty."""

    def __init__(self, job: Job) -> None:
        super().__init__(
            f"Position of job {job.pk} read without positions_attach: attach the positions "
            "of the jobs where they are loaded (scheduling.positions.positions_attach)."
        )
        self.job_id = job.pk


def positions_attached(job: Job) -> bool:
    """Whether the job's positions were attached (or set)."""
    return "_standing_cache" in job.__dict__


def positions_attach(jobs: Iterable[Job]) -> list[Job]:
    """Set ``queue_position``, ``pool_position``, ``estimated_start`` and
    ``guaranteed_start`` of every job, two queries whatever their number (none when no
    job waits); returns the jobs as a list."""
    from .models import PoolEstimates

    jobs = list(jobs)
    ranked = [j for j in jobs if j.pending_rank is not None and j.state in WAITING]
    found: dict[int, tuple[int, int, int]] = {}
    ids = [j.pk for j in ranked]
    for start in range(0, len(ids), 400):  # each id twice; SQLite may allow ~1000 variables
        found.update(_positions(ids[start : start + 400]))
    # A job has an estimate once a cycle planned it, and that cycle ranked it too: the
    # pools to read estimates from are those of the ranked jobs found waiting.
    waiting = {j.pk for j in ranked if j.state == JobState.PENDING and j.pk in found}
    starts: dict[int, tuple[dict, dict]] = {}
    if waiting:
        pools = {found[pk][2] for pk in waiting}
        rows = PoolEstimates.objects.filter(pool_id__in=pools)
        starts = {
            pool: (row, bounds)
            for pool, row, bounds in rows.values_list("pool_id", "starts", "guaranteed")
        }
    for job in jobs:
        queue_position, pool_position, pool_id = found.get(job.pk, (None, None, None))
        estimate = bound = None
        if job.pk in waiting:
            pool_starts, pool_bounds = starts.get(pool_id, ({}, {}))
            estimate = _when(pool_starts.get(str(job.pk)))
            bound = _when(pool_bounds.get(str(job.pk)))
        job.__dict__["_standing_cache"] = (queue_position, pool_position, estimate, bound)
    return jobs


def _when(value: int | None) -> datetime | None:
    return datetime.fromtimestamp(value, tz=UTC) if value is not None else None


def _positions(job_ids: list[int]) -> dict[int, tuple[int, int, int]]:
    """{job id: (position in its queue, position in its pool, pool id)} of the waiting
    jobs among ``job_ids`` that have a rank."""
    from .models import Job, Queue

    job_table = connection.ops.quote_name(Job._meta.db_table)
    queue_table = connection.ops.quote_name(Queue._meta.db_table)
    marks = ", ".join(["%s"] * len(job_ids))
    # Window functions over the waiting jobs only (the partial index on pending_rank), and
    # of those only the ones that can stand before a job asked about: in its pools, up to
    # the highest rank asked about there. A page near the head of a queue of 15,000
    # waiting jobs ranks a few hundred rows, not all of them. SQLite has window functions
    # since 3.25, PostgreSQL always.
    sql = f"""
        WITH asked AS (
            SELECT q.pool_id AS pool_id, MAX(j.pending_rank) AS top
            FROM {job_table} j JOIN {queue_table} q ON q.id = j.queue_id
            WHERE j.id IN ({marks}) AND j.pending_rank IS NOT NULL AND j.state IN (%s, %s)
            GROUP BY q.pool_id
        )
        SELECT id, queue_position, pool_position, pool_id FROM (
            SELECT j.id AS id, q.pool_id AS pool_id,
                   ROW_NUMBER() OVER (PARTITION BY j.queue_id ORDER BY j.pending_rank, j.id)
                       AS queue_position,
                   ROW_NUMBER() OVER (PARTITION BY q.pool_id ORDER BY j.pending_rank, j.id)
                       AS pool_position
            FROM {job_table} j
            JOIN {queue_table} q ON q.id = j.queue_id
            JOIN asked a ON a.pool_id = q.pool_id
            WHERE j.pending_rank IS NOT NULL AND j.state IN (%s, %s)
                AND j.pending_rank <= a.top
        ) ranked WHERE id IN ({marks})
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [*job_ids, *WAITING, *WAITING, *job_ids])
        return {row[0]: (row[1], row[2], row[3]) for row in cursor.fetchall()}
