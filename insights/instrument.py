"""Event metrics: what is best observed when it happens, in the process where it happens.

Two events are counted here: a job's admission (how long it waited, by queue and priority
class) and a dispatch cycle (how long it took). Both happen in the dispatch leader, a Celery
process, while ``/metrics`` is answered by the web processes: the metrics live in
prometheus-client's multiprocess mode, one small memory-mapped file per process and kind
in ``PROMETHEUS_MULTIPROC_DIR`` (exported to the environment by the settings before
prometheus-client is first imported), which ``/metrics`` merges (insights.metrics).

What the database knows exactly (job outcomes, preemptions, reclaims, everything that is
state) is read from it at scrape time instead: those totals survive restarts and need no
shared directory (see docs/insights-metrics.md).

The scheduling sends a signal where the event happens (scheduling.signals: it sits below
the insights and imports nothing of them); the insights' app config connects the receivers
below to those signals. The functions never raise (a metric must not break a dispatch
cycle) and do no database query.

This module imports nothing of Django at import time: ``gunicorn.conf.py`` imports it in
the gunicorn master for the directory helpers.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from prometheus_client import Histogram

log = logging.getLogger(__name__)

#: A wait is seconds to days: buckets from 1 s to 4 days.
ADMISSION_WAIT_BUCKETS = (
    1,
    5,
    15,
    30,
    60,
    120,
    300,
    600,
    1800,
    3600,
    2 * 3600,
    4 * 3600,
    8 * 3600,
    12 * 3600,
    24 * 3600,
    48 * 3600,
    96 * 3600,
)
#: A cycle is milliseconds (nothing changed) to seconds (thousands placed).
DISPATCH_CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

ADMISSION_WAIT = "sluice_admission_wait_seconds"
DISPATCH_CYCLE = "sluice_dispatch_cycle_duration_seconds"


class _Metrics:
    """The metric objects, made on first use (so that a process that observes nothing,
    the gunicorn master for one, opens no file) and not registered in prometheus-client's
    global registry: ``/metrics`` reads the files of every process, not this one's objects."""

    def __init__(self) -> None:
        self.admission_wait = Histogram(
            ADMISSION_WAIT,
            "How long jobs waited from submission (or requeue) to admission, observed at "
            "admission.",
            ["pool", "tenant", "queue", "priority_class"],
            buckets=ADMISSION_WAIT_BUCKETS,
            registry=None,
        )
        self.dispatch_cycle = Histogram(
            DISPATCH_CYCLE,
            "How long a dispatch cycle took (snapshot, plan, apply), observed by the leader.",
            buckets=DISPATCH_CYCLE_BUCKETS,
            registry=None,
        )


_metrics: _Metrics | None = None


def _get() -> _Metrics:
    global _metrics
    if _metrics is None:
        _metrics = _Metrics()
    return _metrics


def metrics_reset() -> None:
    """Forget the metric objects: the next observation makes new ones, with the value class
    and directory prometheus-client has then (tests point the directory at a tmp dir)."""
    global _metrics
    _metrics = None


# --- what the scheduling's signals call --------------------------------------------------


def admissions_observe(jobs, now) -> None:
    """Jobs admitted at ``now`` (their tenant, queue, queue's pool and priority class
    loaded): each one's wait, observed once the admission commits (a rolled-back cycle
    admitted nobody)."""
    try:
        waits = [
            (
                (
                    job.queue.pool.name,
                    job.tenant.slug,
                    f"{job.tenant.slug}/{job.queue.name}",
                    job.priority_class.name,
                ),
                max((now - (job.queued_at or job.submitted_at)).total_seconds(), 0.0),
            )
            for job in jobs
        ]
    except Exception:  # a metric never breaks a cycle
        log.exception("metrics: admission waits not observed")
        return
    from django.db import transaction

    transaction.on_commit(lambda: _observe_waits(waits), robust=True)


def _observe_waits(waits: list[tuple[tuple[str, str, str, str], float]]) -> None:
    try:
        histogram = _get().admission_wait
        for labels, seconds in waits:
            histogram.labels(*labels).observe(seconds)
    except Exception:
        log.exception("metrics: admission waits not observed")


def dispatch_cycle_observe(seconds: float) -> None:
    """A dispatch cycle that ran (as leader) took ``seconds``."""
    try:
        _get().dispatch_cycle.observe(seconds)
    except Exception:
        log.exception("metrics: dispatch cycle not observed")


def on_jobs_admitted(sender, *, jobs, now, **kwargs) -> None:
    """Receiver of ``scheduling.signals.jobs_admitted``."""
    admissions_observe(jobs, now)


def on_dispatch_cycle_finished(sender, *, seconds, **kwargs) -> None:
    """Receiver of ``scheduling.signals.dispatch_cycle_finished``."""
    dispatch_cycle_observe(seconds)


# --- the multiprocess directory ---------------------------------------------------------


def multiprocess_dir() -> Path | None:
    """The directory of the multiprocess files (None: not in multiprocess mode)."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(path) if path else None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def multiprocess_dir_prepare(path: Path | None = None) -> int:
    """Create the directory and remove the files of processes that no longer run: called
    when a service starts (the gunicorn master, a Celery worker's main process), so that a
    fresh start begins from zero while the files of the other services' live processes
    stay. Returns the number of files removed."""
    path = path or multiprocess_dir()
    if path is None:
        return 0
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    removed = 0
    for file in path.glob("*.db"):
        # <kind>_<pid>.db, <kind> may hold underscores (gauge_livesum_123.db).
        pid = file.stem.rpartition("_")[2]
        if pid.isdigit() and not _alive(int(pid)):
            file.unlink(missing_ok=True)
            removed += 1
    return removed


def process_dead(pid: int, path: Path | None = None) -> None:
    """A process that wrote metrics has exited (a gunicorn worker, a Celery pool child):
    its live gauges go; its counters and histograms stay, so that totals never go down
    while the service runs."""
    path = path or multiprocess_dir()
    if path is None or not path.is_dir():
        return
    from prometheus_client import multiprocess

    try:
        multiprocess.mark_process_dead(pid, str(path))
    except OSError:
        log.warning("metrics: could not mark process %s dead in %s", pid, path)
