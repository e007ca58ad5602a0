"""Reports in batches across messages: the task that receives a report message also takes
the report messages waiting behind it on the reports queue and applies them together.

A Celery task per report message costs more than most reports it carries (the task's own
overhead, then a transaction of its own for a report or two). A worker that receives one
(``scheduling.agent_reports``, ``scheduling.agent_report`` or ``scheduling.reports_probe``
off the ``reports`` queue) looks whether more messages wait there; when none does, it
applies its own message at once, as before: nothing waits for a batch to fill. When some
do, it takes up to :data:`MESSAGES_PER_BATCH` of them with kombu (a broker pop each, no
Celery task), applies their reports after its own as one batch
(:func:`scheduling.services.reports.agent_reports_process`: job reports set-based, a
transaction per group), records the probes among them, and only then acknowledges them.

Kept as they were:

- **Delivery at least once.** A taken message is acknowledged once its reports are
  applied. The messages of a worker killed meanwhile go back to the queue (Redis: after the
  broker's visibility timeout, as the task's own message; kombu restores them at once when
  the connection closes); a batch that fails puts its taken messages back on the queue,
  in their order, before it raises. Every report is idempotent: applied twice, harmless.
- **Order.** Reports are applied in the order they were queued: the received message's
  first, then the taken ones in queue order. One worker process at a time takes messages
  (:data:`REPORTS_BATCH_KEY`, held until its batch is acknowledged): two batches applied at
  once could otherwise apply a job's ``exited`` before the ``started`` queued ahead of it.
  A process that receives a message while another applies a batch taken before it waits
  for that batch (its message came after all of the batch's); one received before the
  batch was taken is older than the batch's messages and is applied at once, alone. A key
  left by a killed worker is not waited on (:func:`_after_older_batch`).
- **Heartbeats drained apart.** A batch holds reports that no longer wait on the queue and
  are not yet applied; while the key is held the heartbeat drain counts the reports as
  waiting (``scheduling.services.heartbeats``), so that a heartbeat does not repair from
  its own view what one of those reports is about to do (``nodes.heartbeats_apart``).
- **The embedded default.** Any kombu broker (Redis, the embedded filesystem one); eager
  tasks (the tests, ``CELERY_TASK_ALWAYS_EAGER``) and calls outside a worker take nothing.

A message on the queue that is no report task (or one with an ETA) is put back (at the
queue's end) and ends the taking: a Celery worker runs it. One that cannot be decoded is
dropped (Celery would drop it too).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import Any

from django.conf import settings
from django.core.cache import cache
from kombu.exceptions import ChannelError
from kombu.serialization import prepare_accept_content

from scheduling.agent.protocol import REPORT_TASK, REPORTS_QUEUE, REPORTS_TASK

from .nodes import REPORTS_BATCH_KEY, reports_probe_record
from .reports import agent_report_handle, agent_reports_process

log = logging.getLogger(__name__)

#: Messages taken behind the received one at most. About as many reports as one
#: transaction applies together (``reports.REPORTS_PER_TRANSACTION``): a larger batch
#: saves little more, and holds the worker process longer, ahead of the heartbeat drains
#: and sweeps that wait for a free process.
MESSAGES_PER_BATCH = 50

#: How long a received message waits at most for a batch taken before it (a batch older
#: than this is taken for one whose worker was killed: its messages come back anyway). A
#: batch of 50 takes well under a second on an idle machine, a few seconds on a loaded one.
BATCH_WAIT_SECONDS = 10.0
#: How long the batch key outlives a worker killed while it held it.
BATCH_KEY_SECONDS = 30
#: How often a waiting message looks whether that batch is done.
BATCH_POLL_SECONDS = 0.02

#: The task that records a probe of the reports queue (``nodes.reports_probe_record``).
PROBE_TASK = "scheduling.reports_probe"

_ACCEPT = prepare_accept_content(["json"])


def reports_receive(
    *,
    reports: list | None = None,
    report: dict | None = None,
    probe: float | None = None,
    take: bool,
) -> dict[str, Any]:
    """Apply what a message a worker received from the reports queue carries (a batch of
    ``reports``, one ``report`` of an agent that does not batch, or a ``probe``), together
    with the report messages waiting behind it when ``take`` (see the module); returns
    counts: ``reports`` (all applied), those of
    :func:`~scheduling.services.reports.agent_reports_process` and, when ``take``,
    ``messages`` (how many were taken)."""
    reports = [*(reports or []), *([report] if report is not None else [])]
    probes = [probe] if probe is not None else []
    if not take:  # as before batches across messages
        if report is not None:
            agent_report_handle(report=report)
            return {"reports": 1}
        return _apply(reports, probes)
    received_at = time.time()
    _after_older_batch(received_at)
    batch = _Batch.open()
    if batch is None:
        if report is not None:  # alone, as such a report always was
            agent_report_handle(report=report)
            return {"reports": 1, "messages": 0}
        return {**_apply(reports, probes), "messages": 0}
    try:
        taken, taken_probes = batch.take(MESSAGES_PER_BATCH)
        counts = {**_apply([*reports, *taken], [*probes, *taken_probes]), "messages": batch.count}
        batch.ack()
    except BaseException:
        batch.requeue()
        raise
    finally:
        batch.close()
    return counts


def _apply(reports: list, probes: list[float]) -> dict[str, Any]:
    counts: dict[str, Any] = dict(agent_reports_process(reports=reports)) if reports else {}
    counts.setdefault("reports", 0)
    if probes:  # everything queued before them was applied just now
        reports_probe_record(sent_at=max(probes))
        counts["probes"] = len(probes)
    return counts


class _Batch:
    """The messages one worker process takes off the reports queue, under the batch key."""

    def __init__(self, channel, token: str) -> None:
        self.channel = channel
        self.token = token
        self.messages: list = []  # taken, neither acknowledged nor put back yet
        self.count = 0

    @classmethod
    def open(cls) -> _Batch | None:
        """A batch to take messages into, or None: nothing waits on the queue, another
        process is taking messages, or the broker does not answer (the received message is
        then applied alone)."""
        try:
            channel = _channel()
            if not _waiting(channel):
                return None
        except Exception as exc:  # the received message must not fail for the broker's sake
            log.warning("could not look at the reports queue (%s); a report applied alone", exc)
            _reset()
            return None
        token = f"{time.time():.6f} {socket.gethostname()} {os.getpid()} {uuid.uuid4().hex}"
        try:
            if not cache.add(REPORTS_BATCH_KEY, token, timeout=BATCH_KEY_SECONDS):
                return None
        except Exception as exc:  # no key, no batch: another process might take one too
            log.warning("could not hold the reports batch key (%s); a report applied alone", exc)
            return None
        return cls(channel, token)

    def take(self, limit: int) -> tuple[list, list[float]]:
        """Up to ``limit`` messages: the reports they carry in queue order, and the probes'
        times. Stops at the first message that is no report task (put back) or when the
        queue is empty."""
        reports: list = []
        probes: list[float] = []
        while self.count < limit:
            try:
                message = self.channel.basic_get(queue=REPORTS_QUEUE, no_ack=False)
            except Exception as exc:
                log.warning("could not take from the reports queue (%s)", exc)
                break
            if message is None:
                break
            message.accept = _ACCEPT
            kind, value = _content(message)
            if kind == "foreign":
                message.requeue()
                break
            self.messages.append(message)
            self.count += 1
            if kind == "reports":
                reports.extend(value)
            elif kind == "probe":
                probes.append(value)
        return reports, probes

    def ack(self) -> None:
        while self.messages:
            self.messages.pop(0).ack()

    def requeue(self) -> None:
        """Put back what was taken and not acknowledged, in its order, at the end of the
        queue (where kombu puts a message given back, on Redis and on the filesystem);
        should that fail, closing the connection puts them back."""
        try:
            while self.messages:
                self.messages.pop(0).requeue()
        except Exception:
            log.exception("could not put taken reports back; the broker restores them")
            _reset()

    def close(self) -> None:
        try:
            if cache.get(REPORTS_BATCH_KEY) == self.token:
                cache.delete(REPORTS_BATCH_KEY)
        except Exception:  # it expires on its own (BATCH_KEY_SECONDS)
            log.warning("could not release the reports batch key", exc_info=True)


def _after_older_batch(received_at: float) -> None:
    """Wait while another process applies a batch it took before this message was received
    (up to :data:`BATCH_WAIT_SECONDS` after it took it): this message came after all of
    that batch's messages on the queue, and applied beside them it could put a job's
    ``exited`` before its ``started``. A batch taken after the message was received holds
    only later messages, and one whose process is gone (a worker killed on this host) will
    not be applied here: no wait."""
    try:
        while (held := cache.get(REPORTS_BATCH_KEY)) is not None:
            taken_at = _taken_at(held)
            if (
                not taken_at < received_at
                or time.time() - taken_at > BATCH_WAIT_SECONDS
                or _holder_gone(held)
            ):
                return
            time.sleep(BATCH_POLL_SECONDS)
    except Exception as exc:  # the received message must not fail for the cache's sake
        log.warning("could not look at the reports batch key (%s)", exc)


def _holder_gone(token: Any) -> bool:
    """Whether the process that holds the batch key ran on this host and is gone (a worker
    killed and started again: its messages come back, there is nothing to wait for)."""
    try:
        _, host, pid, _ = str(token).split()
        if host != socket.gethostname():
            return False
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (ValueError, PermissionError, OSError):
        return False
    return False


def _taken_at(token: Any) -> float:
    """When the batch that holds the key took its messages (0 for a key it cannot read)."""
    try:
        return float(str(token).split()[0])
    except (IndexError, ValueError):
        return 0.0


def _content(message) -> tuple[str, Any]:
    """("reports", [report, ...]), ("probe", sent_at), ("dropped", None) for a message that
    cannot be read, or ("foreign", None) for any other task (left to a Celery worker)."""
    headers = message.headers or {}
    if headers.get("eta") or headers.get("countdown"):
        return "foreign", None
    try:
        body = message.payload
    except Exception as exc:  # undecodable: Celery would drop it too
        log.warning("dropped an unreadable message on the reports queue (%s)", exc)
        return "dropped", None
    if isinstance(body, dict):  # protocol 1: the task's name and arguments in the body
        task, args = body.get("task"), body.get("args") or []
    elif isinstance(body, list | tuple) and body and isinstance(body[0], list | tuple):
        task, args = headers.get("task"), body[0]  # protocol 2: [args, kwargs, embed]
    else:
        return "foreign", None
    if not args:
        return "foreign", None
    if task == REPORTS_TASK and isinstance(args[0], list):
        return "reports", list(args[0])
    if task == REPORT_TASK and isinstance(args[0], dict):
        return "reports", [args[0]]
    if task == PROBE_TASK and isinstance(args[0], int | float):
        return "probe", float(args[0])
    return "foreign", None


# --- one broker connection per worker process ----------------------------------------------

_connection: dict[str, Any] = {}


def _channel():
    """The channel this process takes report messages with (opened once, again after a
    fork or a change of broker)."""
    from scheduling.agent.transport import broker_connection

    key = (os.getpid(), settings.CELERY_BROKER_URL, settings.SLUICE_BROKER_DIR)
    if _connection.get("key") != key:
        _connection.clear()
        connection = broker_connection(settings.CELERY_BROKER_URL, settings.SLUICE_BROKER_DIR)
        _connection.update(key=key, connection=connection, channel=connection.default_channel)
    return _connection["channel"]


def _reset() -> None:
    """Drop this process's connection (its unacknowledged messages go back to the queue)."""
    connection = _connection.get("connection")
    _connection.clear()
    if connection is not None:
        try:
            connection.release()
        except Exception:  # already broken
            log.debug("closing the reports connection failed", exc_info=True)


def _waiting(channel) -> bool:
    """Whether messages wait on the reports queue: on Redis one ``LLEN`` of its list
    (report messages carry no priority, so kombu's priority lists stay empty), elsewhere
    kombu's passive declaration."""
    if getattr(channel.connection, "driver_type", "") == "redis":
        return bool(channel.client.llen(REPORTS_QUEUE))
    try:
        return channel.queue_declare(queue=REPORTS_QUEUE, passive=True)[1] > 0
    except ChannelError:  # kombu's Redis transport: no such queue while its list is empty
        return False
