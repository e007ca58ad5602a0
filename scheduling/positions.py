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
    # A position is one plus the number of waiting jobs before the job in (rank, id). The
    # jobs asked about are put in that order per queue (and per pool), and the waiting jobs
    # between each one and the one before it are counted on the index of waiting ranks
    # (job_waiting_rank: queue, rank, id; an index-only range scan per queue, and per queue
    # of the pool for pool positions); running sums of those counts are the positions.
    # What is read is the ranks up to the last job asked about in each queue and pool, once,
    # and nothing is sorted but the jobs asked about: a page near the head of a queue of
    # 15,000 waiting jobs reads a few hundred index entries.
    # The jobs asked about are read by id first (MATERIALIZED, on PostgreSQL: otherwise it
    # filters the whole index of waiting ranks for the ids, as its estimates make that look
    # cheaper). Row values need SQLite 3.15, window functions 3.25.
    materialized = "MATERIALIZED" if connection.vendor == "postgresql" else ""
    waiting = "w.pending_rank IS NOT NULL AND w.state IN (%s, %s)"
    sql = f"""
        WITH named AS {materialized} (
            SELECT j.id AS id, j.queue_id AS queue_id, q.pool_id AS pool_id,
                   j.pending_rank AS pending_rank, j.state AS state
            FROM {job_table} j JOIN {queue_table} q ON q.id = j.queue_id
            WHERE j.id IN ({marks})
        ), steps AS (
            SELECT id, queue_id, pool_id, pending_rank,
                LAG(pending_rank) OVER (PARTITION BY queue_id ORDER BY pending_rank, id)
                    AS queue_after_rank,
                LAG(id) OVER (PARTITION BY queue_id ORDER BY pending_rank, id) AS queue_after_id,
                LAG(pending_rank) OVER (PARTITION BY pool_id ORDER BY pending_rank, id)
                    AS pool_after_rank,
                LAG(id) OVER (PARTITION BY pool_id ORDER BY pending_rank, id) AS pool_after_id
            FROM named
            WHERE pending_rank IS NOT NULL AND state IN (%s, %s)
        ), gaps AS (
            SELECT s.id AS id, s.queue_id AS queue_id, s.pool_id AS pool_id,
                s.pending_rank AS pending_rank,
                (SELECT COUNT(*) FROM {job_table} w
                 WHERE w.queue_id = s.queue_id AND {waiting}
                    AND (w.pending_rank, w.id) < (s.pending_rank, s.id)
                    AND (w.pending_rank, w.id)
                        >= (COALESCE(s.queue_after_rank, %s), COALESCE(s.queue_after_id, 0))
                ) AS queue_gap,
                (SELECT COALESCE(SUM(
                    (SELECT COUNT(*) FROM {job_table} w
                     WHERE w.queue_id = pq.id AND {waiting}
                        AND (w.pending_rank, w.id) < (s.pending_rank, s.id)
                        AND (w.pending_rank, w.id)
                            >= (COALESCE(s.pool_after_rank, %s), COALESCE(s.pool_after_id, 0)))
                 ), 0) FROM {queue_table} pq WHERE pq.pool_id = s.pool_id
                ) AS pool_gap
            FROM steps s
        )
        SELECT id,
            1 + SUM(queue_gap) OVER (
                PARTITION BY queue_id ORDER BY pending_rank, id
                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW),
            1 + SUM(pool_gap) OVER (
                PARTITION BY pool_id ORDER BY pending_rank, id
                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW),
            pool_id
        FROM gaps
    """
    lowest = float("-inf")
    params = [*job_ids, *WAITING, *WAITING, lowest, *WAITING, lowest]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0]: (int(row[1]), int(row[2]), row[3]) for row in cursor.fetchall()}
