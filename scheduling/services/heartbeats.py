"""Node heartbeats in batches across messages: the ``heartbeats`` queue drained at once.

Agents send their heartbeats apart from their other reports, on the queue
:data:`scheduling.agent.protocol.HEARTBEATS_QUEUE` (same Celery task messages, a list of
heartbeats each). No Celery worker consumes that queue: every
``SLUICE_HEARTBEAT_DRAIN_SECONDS`` the task ``scheduling.heartbeats_drain`` takes every
message waiting there (in chunks of :data:`MESSAGES_PER_CHUNK`) and applies the heartbeats
of a chunk as one batch (:func:`scheduling.services.reports.agent_reports_process`): of
each node the newest is applied and its older ones add their GPU activity, and the nodes'
heartbeats are applied set-based together (:func:`scheduling.services.nodes.node_heartbeats_apply`).
A Celery task per message cost more than the heartbeat it carried (the task's own
overhead, then a transaction of its own); a message taken here costs a broker pop and an
acknowledgement.

Delivery is at least once, as for any report: a chunk's messages are acknowledged once its
heartbeats are applied, so the messages of a worker killed meanwhile go back to the queue
(the broker's visibility timeout on Redis; kombu puts them back at once when the drain
fails and closes its channel). A heartbeat that comes again, or late, is harmless: one
older than a heartbeat already applied changes none of its node's samples and only adds
its GPU activity. A heartbeat that cannot be applied is logged and dropped without the
others; the node's next heartbeat, one interval later, repairs what it would have told.

A heartbeat drained here may overtake a ``started`` or ``exited`` report of its node still
waiting on the reports queue. When reports were waiting there as the heartbeats were
taken (or taken off it by a worker and not yet applied: ``scheduling.services.reports_queue``),
what a heartbeat would repair of a job (started, ended, LOST) waits until the reports sent
before it are known to be handled: the report, if any, does it meanwhile
(``nodes.heartbeats_apart``). When none were waiting, it repairs at once.

Reports of other types on the queue (none is sent there) are applied in their order with
the heartbeats; a message that is no report task is logged and dropped.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache

from scheduling.agent.protocol import (
    HEARTBEAT,
    HEARTBEATS_QUEUE,
    REPORT_TASK,
    REPORTS_QUEUE,
    REPORTS_TASK,
)

from .nodes import HEARTBEATS_DRAINED_KEY, REPORTS_BATCH_KEY, heartbeats_apart
from .reports import agent_reports_process

log = logging.getLogger(__name__)

#: Messages taken and applied as one batch at most (one node's heartbeat each, or a
#: bridge's heartbeats of many nodes): about five seconds of a 1,000-node fleet at 10 s.
MESSAGES_PER_CHUNK = 500
#: A drain stops taking messages after this long (the next drain goes on), so that it
#: does not hold a worker while the agents fill the queue faster than it empties.
DRAIN_SECONDS = 10.0


def heartbeats_drain(*, queue: str = HEARTBEATS_QUEUE) -> dict[str, Any]:
    """Take the heartbeat messages waiting on ``queue`` and apply them, a chunk at a time
    (see the module); returns counts, the heartbeats' lag (seconds from ``sent_at`` to
    applied: the newest one's and the oldest one's) and the drain's CPU time in this
    process, for the benchmarks."""
    from scheduling.agent.transport import broker_connection

    began, cpu = time.time(), time.process_time()
    totals: dict[str, Any] = {"messages": 0, "heartbeats": 0, "failed": 0, "dropped": 0}
    oldest = newest = None
    emptied = False
    with broker_connection(settings.CELERY_BROKER_URL, settings.SLUICE_BROKER_DIR) as conn:
        source = conn.SimpleQueue(queue, accept=["json"])
        try:
            while time.time() - began < DRAIN_SECONDS:
                waiting = _reports_waiting(conn)
                messages, emptied = _take(source, MESSAGES_PER_CHUNK)
                if not messages:
                    break
                reports = [r for m in messages for r in _reports_of(m, totals)]
                with heartbeats_apart(reports_waiting=waiting):
                    counts = agent_reports_process(reports=reports)
                applied_at = time.time()
                for message in messages:
                    message.ack()
                totals["messages"] += len(messages)
                totals["failed"] += counts["failed"]
                totals["dropped"] += counts["invalid"]
                sent = [r["sent_at"] for r in reports if _is_heartbeat(r)]
                totals["heartbeats"] += len(sent)
                if sent:
                    oldest = max(oldest or 0.0, applied_at - min(sent))
                    newest = min(newest if newest is not None else 1e9, applied_at - max(sent))
                if emptied:
                    break
        finally:
            source.close()
    if emptied:
        _drained(began)
    totals["lag_max_s"] = None if oldest is None else round(oldest, 3)
    totals["lag_min_s"] = None if newest is None else round(newest, 3)
    totals["cpu_ms"] = round(1000 * (time.process_time() - cpu), 2)
    return totals


def _reports_waiting(conn) -> bool:
    """Whether reports wait to be applied (looked at before the heartbeats are taken: a
    report their agents sent before them may be among those): messages on the reports
    queue, or messages a worker took off it as a batch and has not applied yet
    (``REPORTS_BATCH_KEY``, scheduling.services.reports_queue)."""
    if cache.get(REPORTS_BATCH_KEY) is not None:
        return True
    try:
        return conn.default_channel.queue_declare(queue=REPORTS_QUEUE, passive=True)[1] > 0
    except Exception:  # kombu's Redis transport: no such queue while its list is empty
        return False


def _take(source, count: int) -> tuple[list, bool]:
    """Up to ``count`` messages from ``source``; and whether it ran out of messages."""
    messages = []
    while len(messages) < count:
        try:
            messages.append(source.get_nowait())
        except source.Empty:
            return messages, True
    return messages, False


def _reports_of(message, totals: dict[str, Any]) -> list:
    """The reports a Celery task message carries (``scheduling.agent_reports``: a list;
    ``scheduling.agent_report``: one), in either of Celery's message protocols."""
    try:
        body = message.payload
        if isinstance(body, dict):  # protocol 1: the task's name and arguments in the body
            task, args = body.get("task"), body.get("args") or []
        else:  # protocol 2: [args, kwargs, embed], the name in the headers
            task, args = (message.headers or {}).get("task"), body[0]
        if task == REPORTS_TASK and isinstance(args[0], list):
            return list(args[0])
        if task == REPORT_TASK and isinstance(args[0], dict):
            return [args[0]]
        raise ValueError(f"not a report task: {task!r}")
    except Exception as exc:  # undecodable or foreign: it would come back forever
        totals["dropped"] += 1
        log.warning("dropped a message on the heartbeats queue (%s)", exc)
        return []


def _is_heartbeat(report: Any) -> bool:
    return (
        isinstance(report, dict)
        and report.get("type") == HEARTBEAT
        and isinstance(report.get("sent_at"), int | float)
    )


def _drained(began: float) -> None:
    if began > (cache.get(HEARTBEATS_DRAINED_KEY) or 0.0):
        cache.set(HEARTBEATS_DRAINED_KEY, began, timeout=None)
