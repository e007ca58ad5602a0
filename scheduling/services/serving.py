"""Serving jobs on the portal side: the agents' ``serve_metrics`` reports stored
as :class:`~scheduling.models.ServeSample` rows, the replica's current endpoint kept on
its job (``serve_port``, ``serve_ready``), and the samples' retention.

Idempotent and order-safe like the other reports: a sample is unique by (job, time), so a
report delivered twice stores nothing the second time, and a job's endpoint follows its
newest sample only, so an older report handled late does not flip ``serve_ready`` back.
Samples of another attempt than the job's current one, of a job that is not placed on
the reporting node, or of a job that is no longer active are dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db.models import Max
from django.utils import timezone

from ..choices import ACTIVE_STATES, JobState
from ..models import Allocation, Job, Node, ServeSample

log = logging.getLogger(__name__)

#: Retention of the samples when ``SLUICE_SERVE_SAMPLE_RETENTION_HOURS`` is not set.
DEFAULT_RETENTION_HOURS = 24.0
SERVE_SAMPLES_CLEANUP_KEY = "sluice:serve-samples-cleanup"
#: Rows deleted per statement by the retention sweep (bounded transactions).
DELETE_CHUNK = 5000


def _at(value: float) -> datetime:
    return datetime.fromtimestamp(float(value), tz=UTC)


def serve_metrics_record(report: dict) -> int:
    """Store the samples of one ``serve_metrics`` report; returns how many were kept
    (stored now or before: a repeat stores nothing twice).
    Updates ``serve_port`` / ``serve_ready`` of the jobs whose newest sample this is
    (a STOPPING replica is never ready: it is being drained)."""
    samples: Sequence[dict] = report.get("samples") or []
    if not samples:
        return 0
    node_id = Node.objects.filter(name=report["node"]).values_list("id", flat=True).first()
    if node_id is None:
        log.warning("serve_metrics from unknown node %r dropped", report["node"])
        return 0
    ids = sorted({int(s["job_id"]) for s in samples})
    jobs = {
        job.pk: job
        for job in Job.objects.filter(pk__in=ids, state__in=ACTIVE_STATES).only(
            "id", "state", "requeue_count", "serve_port", "serve_ready"
        )
    }
    placed_here = set(
        Allocation.objects.filter(
            job_id__in=list(jobs), node_id=node_id, released_at__isnull=True
        ).values_list("job_id", flat=True)
    )
    rows: dict[int, ServeSample] = {}
    for sample in samples:
        job = jobs.get(int(sample["job_id"]))
        if job is None or job.pk not in placed_here or job.attempt != int(sample["attempt"]):
            continue
        rows[job.pk] = ServeSample(
            job_id=job.pk,
            node_id=node_id,
            at=_at(sample["scraped_at"]),
            port=sample["port"],
            ready=bool(sample["ready"]),
            running=sample.get("running"),
            waiting=sample.get("waiting"),
            requests_total=sample.get("requests_total"),
            errors_total=sample.get("errors_total"),
            latency_buckets=sample.get("latency_buckets") or [],
        )
    if not rows:
        return 0
    ServeSample.objects.bulk_create(list(rows.values()), ignore_conflicts=True)
    newest = dict(
        ServeSample.objects.filter(job_id__in=list(rows))
        .values("job_id")
        .annotate(at=Max("at"))
        .values_list("job_id", "at")
    )
    for job_id, row in rows.items():
        if newest.get(job_id) != row.at:
            continue  # a newer sample is stored already
        job = jobs[job_id]
        ready = row.ready and job.state != JobState.STOPPING
        if (job.serve_port, job.serve_ready) != (row.port, ready):
            Job.objects.filter(pk=job_id, state__in=ACTIVE_STATES).update(
                serve_port=row.port, serve_ready=ready
            )
    return len(rows)


def serve_samples_expire(now: datetime | None = None) -> dict | str:
    """The control sweep's entry: delete samples older than
    ``SLUICE_SERVE_SAMPLE_RETENTION_HOURS`` (default 24), at most once every
    ``SLUICE_RETENTION_CLEANUP_SECONDS``."""
    period = getattr(settings, "SLUICE_RETENTION_CLEANUP_SECONDS", 3600)
    if not cache.add(SERVE_SAMPLES_CLEANUP_KEY, 1, timeout=period):
        return "not due"
    return serve_samples_delete_old(now=now)


def serve_samples_delete_old(now: datetime | None = None) -> dict:
    """Delete the samples past their retention, in chunks; returns how many."""
    hours = float(getattr(settings, "SLUICE_SERVE_SAMPLE_RETENTION_HOURS", DEFAULT_RETENTION_HOURS))
    cutoff = (now or timezone.now()) - timedelta(hours=hours)
    deleted = 0
    while True:
        chunk = list(
            ServeSample.objects.filter(at__lt=cutoff)
            .order_by("at")
            .values_list("id", flat=True)[:DELETE_CHUNK]
        )
        if not chunk:
            break
        deleted += ServeSample.objects.filter(pk__in=chunk).delete()[0]
        if len(chunk) < DELETE_CHUNK:
            break
    return {"serve_samples_deleted": deleted}
