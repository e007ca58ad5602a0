"""Agent reports in batches (``scheduling.agent.protocol.REPORTS_TASK``), and one at a time
for agents older than the batches (``REPORT_TASK``).

A batch is the list of reports an agent sent together, in the order it produced them.
It is handled in that order, with four economies and one guarantee:

- **Transactions.** Reports are applied in groups of :data:`REPORTS_PER_TRANSACTION`, one
  transaction per group and a savepoint per report: a group costs one commit instead of
  one per report, and a report that fails rolls back its savepoint only. Should a group's
  commit itself fail (a lost connection, a deadlock detected at commit), its reports are
  applied again one transaction each; every handler is idempotent, so applying a report
  twice changes nothing the second time.
- **Together.** The ``started`` and ``exited`` reports of a group (with the ``log``
  reports between them, which change no job state) are applied set-based by
  :func:`scheduling.services.nodes.job_reports_apply`: one lock of all their jobs, one read
  of their allocations, a few statements for all their changes, where one report alone
  costs six to eight. The uncommon cases (gang jobs, stopping jobs, requeues) it leaves to
  the handlers, one report at a time after it, in order. Should it fail, the reports are
  applied one at a time instead: none is lost for another.
- **Dispatch.** Ended jobs and nodes coming back ask for a dispatch cycle: once per batch
  (after the commits), not once per report.
- **Heartbeats.** Of a node's heartbeats in one batch only the newest is applied (GPU
  samples, zombies, reconciliation of its jobs); the older ones only add their GPU
  activity, so that a job busy in any of them counts as active at that moment. The
  heartbeats of several nodes (a runtime that serves many nodes sends them together) are
  applied together by :func:`scheduling.services.nodes.node_heartbeats_apply`: a few
  statements for all the nodes, where each alone costs as many.
- **Guarantee.** A report that cannot be applied is logged and dropped, never the others;
  what it would have told is repaired by the node's next heartbeat (see
  :func:`scheduling.services.nodes._reconcile_jobs`), which is why a report lost with a
  killed worker (acknowledged late: it comes back after the broker's visibility timeout,
  ``SLUICE_BROKER_VISIBILITY_TIMEOUT``) costs at most a heartbeat interval.

Delivery is at least once and unordered between batches (see the protocol): a batch
delivered twice, or two batches handled by two workers at once, leave the same state as
one delivery in order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.db import transaction

from scheduling.agent.protocol import (
    EXITED,
    HEARTBEAT,
    LOG,
    SERVE_METRICS,
    STARTED,
    ProtocolError,
    validate_report,
)

from . import nodes, serving
from .runtime_history import runtime_history_batch

log = logging.getLogger(__name__)

#: Reports applied in one transaction (each in its own savepoint).
REPORTS_PER_TRANSACTION = 50

HANDLERS: dict[str, Callable[..., Any]] = {
    "register": nodes.node_register,
    "heartbeat": nodes.node_heartbeat,
    "started": nodes.job_started,
    "exited": nodes.job_exited,
    "log": nodes.job_log_append,
    "serve_metrics": serving.serve_metrics_record,
    "samples": nodes.node_samples,
}


def agent_report_handle(*, report: dict) -> None:
    """One report from an agent that does not batch (the task ``scheduling.agent_report``)."""
    handler = HANDLERS.get(report.get("type"))  # type: ignore[arg-type]
    if handler is None:
        log.warning("unknown agent report type %r", report.get("type"))
        return
    handler(report)


def agent_reports_process(*, reports: list) -> dict[str, int]:
    """Apply a batch of reports from one agent in order (see the module); returns counts."""
    valid = [r for r in reports if _valid(r)]
    items = _newest_heartbeats(valid)
    failed = 0
    with runtime_history_batch(), nodes.one_dispatch_per_batch():
        for start in range(0, len(items), REPORTS_PER_TRANSACTION):
            failed += _apply_group(items[start : start + REPORTS_PER_TRANSACTION])
    return {
        "reports": len(reports),
        "invalid": len(reports) - len(valid),
        "superseded_heartbeats": len(valid) - len(items),
        "failed": failed,
    }


def _valid(report: Any) -> bool:
    try:
        validate_report(report)
    except ProtocolError as exc:
        log.warning("dropped an invalid agent report (%s): %.300r", exc, report)
        return False
    return True


Item = tuple[dict, list[dict]]


def _newest_heartbeats(reports: Iterable[dict]) -> list[Item]:
    """The batch as (report, older heartbeats it supersedes), each node's newest heartbeat
    in its own place and the node's older ones dropped."""
    reports = list(reports)
    newest: dict[str, int] = {}
    for position, report in enumerate(reports):
        if report["type"] == HEARTBEAT:
            known = newest.get(report["node"])
            if known is None or report["sent_at"] >= reports[known]["sent_at"]:
                newest[report["node"]] = position
    older: dict[int, list[dict]] = {position: [] for position in newest.values()}
    items: list[Item] = []
    for position, report in enumerate(reports):
        if report["type"] != HEARTBEAT:
            items.append((report, []))
        elif newest[report["node"]] == position:
            items.append((report, older[position]))
        else:
            older[newest[report["node"]]].append(report)
    return items


def _apply(item: Item) -> None:
    report, older = item
    handler = HANDLERS.get(report["type"])
    if handler is None:
        log.warning("unknown agent report type %r", report["type"])
    elif report["type"] == HEARTBEAT:
        handler(report, older=older)
    else:
        handler(report)


def _apply_group(group: list[Item]) -> int:
    """One transaction for the group: runs of job reports together, runs of heartbeats
    together, other reports each in a savepoint; returns how many failed."""
    failed: list[Item] = []
    try:
        with transaction.atomic():
            segments = _segments(group)
            for kind, items in segments:
                if kind == _JOBS:
                    failed += _apply_together(items, savepoint=len(segments) > 1)
                elif kind == HEARTBEAT:
                    failed += _apply_heartbeats(items, savepoint=len(segments) > 1)
                else:
                    failed += _apply_each(items)
    except SoftTimeLimitExceeded:
        raise
    except Exception:
        log.exception("a group of %d agent reports failed as a whole; one by one now", len(group))
        failed = list(group)
    return sum(not _apply_alone(item) for item in failed)


#: Reports applied together, set-based (see nodes.job_reports_apply).
TOGETHER = (STARTED, EXITED)
#: Reports that may come between them: they change no job state, so their order against
#: the reports applied together does not matter (a log chunk is written by offset; a
#: serving job's sample, applied after the run's starts and exits, is kept only for a job
#: still active, and its newest sample sets its endpoint).
ALONGSIDE = (LOG, SERVE_METRICS)


#: A run of job reports (TOGETHER and ALONGSIDE) in :func:`_segments`.
_JOBS = "jobs"


def _segments(group: list[Item]) -> list[tuple[str, list[Item]]]:
    """The group as runs of job reports applied together (``_JOBS``), runs of heartbeats
    (applied together too: ``HEARTBEAT``) and the reports between them (their type), in
    order."""
    segments: list[tuple[str, list[Item]]] = []
    for item in group:
        kind = item[0]["type"]
        kind = _JOBS if kind in (*TOGETHER, *ALONGSIDE) else kind
        if segments and segments[-1][0] == kind and kind in (_JOBS, HEARTBEAT):
            segments[-1][1].append(item)
        else:
            segments.append((kind, [item]))
    return segments


def _apply_heartbeats(items: list[Item], *, savepoint: bool) -> list[Item]:
    """Apply a run of heartbeats (each with the older ones it supersedes) together
    (:func:`scheduling.services.nodes.node_heartbeats_apply`); returns those that failed.
    Should that fail, they are applied one by one. Without ``savepoint`` (the run is the
    whole group) a failure fails the group, whose reports are then applied one by one."""
    if not savepoint:
        nodes.node_heartbeats_apply(beats=items)
        return []
    try:
        with transaction.atomic():
            nodes.node_heartbeats_apply(beats=items)
    except SoftTimeLimitExceeded:
        raise
    except Exception:
        log.exception("%d heartbeats failed together; one by one now", len(items))
        return _apply_each(items)
    return []


def _apply_together(items: list[Item], *, savepoint: bool) -> list[Item]:
    """Apply a run of job reports set-based, then what it leaves (and the log reports)
    one by one; returns the reports that failed. Without ``savepoint`` (the run is the
    whole group) a failure fails the group, whose reports are then applied one by one."""
    positions = [i for i, (report, _) in enumerate(items) if report["type"] in TOGETHER]
    reports = [items[i][0] for i in positions]
    if not reports:
        return _apply_each(items)
    if savepoint:
        try:
            with transaction.atomic():
                left = nodes.job_reports_apply(reports=reports)
        except SoftTimeLimitExceeded:
            raise
        except Exception:
            log.exception("%d job reports failed together; one by one now", len(reports))
            return _apply_each(items)
    else:
        left = nodes.job_reports_apply(reports=reports)
    applied = set(positions) - {positions[i] for i in left}
    return _apply_each([item for i, item in enumerate(items) if i not in applied])


def _apply_each(items: list[Item]) -> list[Item]:
    """Apply reports one by one, each in a savepoint; returns those that failed."""
    failed: list[Item] = []
    for item in items:
        try:
            with transaction.atomic():
                _apply(item)
        except SoftTimeLimitExceeded:
            raise
        except Exception:
            failed.append(item)
    return failed


def _apply_alone(item: Item) -> bool:
    try:
        with transaction.atomic():
            _apply(item)
    except SoftTimeLimitExceeded:
        raise
    except Exception:
        report = item[0]
        log.exception(
            "agent report %s from %s (job %s) failed; the node's next heartbeat repairs it",
            report.get("type"),
            report.get("node"),
            report.get("job_id"),
        )
        return False
    return True
