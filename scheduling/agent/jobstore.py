"""The node agent's job store: the records of the job attempts of this node, in memory and
in their directories' state files (see :mod:`scheduling.agent.runner`).

It keeps every record it knows (ended ones for a day, so a duplicate message is answered
from them), the set the loop still works on (not ended with their exit reported), and the
newest attempt of each job (an older attempt's launch is refused). State files are written
at once (:meth:`JobStore.save`: a job's pid, before anything else) or once at the end of a
pass for all of a record's changes in it (:meth:`JobStore.save_soon`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

from scheduling.agent import procfs
from scheduling.agent.runner import (
    JobPaths,
    JobRecord,
    clean_workspace,
    load_record,
    remove_job_dir,
    save_record,
)

logger = logging.getLogger(__name__)


class JobStore:
    """The job records of one work dir (``<work_dir>/jobs/<job>-<attempt>/state.json``)."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.jobs: dict[tuple[int, int], JobRecord] = {}
        #: The records the loop still works on (not ended with their exit reported): each
        #: pass looks at these only, so its work follows the jobs in flight, not the ended
        #: ones kept for a day (thousands after a burst).
        self._active: dict[tuple[int, int], JobRecord] = {}
        #: Records whose state file is written at the end of the pass (see save_soon).
        self._unsaved: dict[tuple[int, int], JobRecord] = {}
        #: The newest attempt of each job seen here (an older attempt's launch is refused).
        self.newest_attempt: dict[int, int] = {}

    @property
    def jobs_dir(self) -> Path:
        return self.work_dir / "jobs"

    def paths(self, record: JobRecord) -> JobPaths:
        return JobPaths.for_job(self.work_dir, record.job_id, record.attempt)

    def track(self, record: JobRecord) -> None:
        """Keep ``record`` (new, loaded from its directory or adopted)."""
        self.jobs[record.key] = record
        self._active[record.key] = record
        if record.attempt > self.newest_attempt.get(record.job_id, -1):
            self.newest_attempt[record.job_id] = record.attempt

    def active_records(self) -> list[JobRecord]:
        """The records still worked on, as a list (callers may change records); those
        that ended with their exit reported, or were forgotten, leave the set here."""
        for key, record in list(self._active.items()):
            if (record.finished and record.exit_reported) or self.jobs.get(key) is not record:
                del self._active[key]
        return list(self._active.values())

    def running(self) -> Iterator[JobRecord]:
        return (r for r in self.active_records() if r.running)

    def save(self, record: JobRecord) -> None:
        """Write the record's state file now (a job's pid, before anything else)."""
        self._unsaved.pop(record.key, None)
        save_record(record, self.paths(record))

    def save_soon(self, record: JobRecord) -> None:
        """Write the record's state file at the end of this pass (or before the message
        being handled is acknowledged), once for all its changes in the pass: a job's
        launch and start, or its end and its reported exit, are one write instead of two
        (each is a new file renamed into place: a third of the agent's time in a burst)."""
        self._unsaved[record.key] = record

    def save_unsaved(self) -> None:
        while self._unsaved:
            _, record = self._unsaved.popitem()
            save_record(record, self.paths(record))

    def load_forgotten(self, job_id: int, attempt: int) -> JobRecord | None:
        """A job attempt this node ran long ago, from its directory (never run it twice)."""
        record = load_record(JobPaths.for_job(self.work_dir, job_id, attempt))
        if record is not None and record.finished:
            self.track(record)
            return record
        return None

    def recover(self) -> None:
        """Load the jobs of a previous run. Running ones are adopted (their leader is the
        same process as recorded); the rest are found ended by the next pass and reported
        unless they were already."""
        for root in sorted(p for p in self.jobs_dir.iterdir() if p.is_dir()):
            record = load_record(JobPaths(root))
            if record is None or self.paths(record).root != root:
                continue
            self.track(record)
            if record.running and procfs.is_same_process(record.pid, record.pid_start_ticks):
                logger.info(
                    "adopted running job %s attempt %s (process group %s)",
                    record.job_id,
                    record.attempt,
                    record.pid,
                )

    def forget_old(self, forget_after_seconds: float) -> None:
        """Drop long-finished, reported jobs from memory (their directories stay), so the
        loop's work does not grow with the node's history."""
        horizon = time.time() - forget_after_seconds
        for key, record in list(self.jobs.items()):
            if record.exit_reported and (record.finished_at or 0) < horizon:
                del self.jobs[key]

    # --- clean-up of ended jobs ---

    @staticmethod
    def ended_before(record: JobRecord, moment: float) -> bool:
        """The job ended, its exit was reported, and that was before ``moment``."""
        return (
            record.finished
            and record.exit_reported
            and record.finished_at is not None
            and record.finished_at <= moment
        )

    def clean_workspace(self, record: JobRecord) -> None:
        """Empty an ended job's directory, all but its state and checkpoints."""
        paths = self.paths(record)
        keep = Path(record.checkpoint_path) if record.checkpoint_path else paths.checkpoints
        try:
            removed = clean_workspace(paths, keep)
        except OSError as exc:  # e.g. files the job made read-only: leave them, once
            logger.warning("cannot clean the directory of job %s: %s", record.job_id, exc)
            removed = 0
        record.workspace_cleaned = True
        self.save(record)
        if removed:
            logger.info(
                "job %s attempt %s: removed %d entries of its directory, kept its checkpoints",
                record.job_id,
                record.attempt,
                removed,
            )

    def remove_expired(self, now: float, default_days: float) -> None:
        """Remove the directories (checkpoints included) of jobs that ended more than their
        retention ago. Reads every job directory's state: done once an hour."""
        for root in sorted(p for p in self.jobs_dir.iterdir() if p.is_dir()):
            paths = JobPaths(root)
            record = load_record(paths)
            if record is None or self.paths(record).root != root:
                continue
            days = record.retention_days
            days = default_days if days is None else days
            if not self.ended_before(record, now - days * 86400):
                continue
            remove_job_dir(paths)
            self.jobs.pop(record.key, None)
            logger.info(
                "job %s attempt %s: removed its directory and checkpoints (kept %g days)",
                record.job_id,
                record.attempt,
                days,
            )
