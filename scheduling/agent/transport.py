"""Broker plumbing for both sides of the agent protocol (kombu and Celery, no Django).

- :func:`broker_connection` / :func:`broker_transport_options`: the kombu connection both
  sides use, with the filesystem broker's folders set (the embedded default).
- :func:`send_control_messages`: how the control side puts messages on ``node.<name>``.
- :class:`KombuMessageSource`: the agent's consumer of its queue (a thread that wakes the
  agent's loop), reconnecting with backoff.
- :class:`CeleryReportSender`: the agent's sender of reports, in batches, as Celery task
  messages on the ``reports`` queue (heartbeats on the ``heartbeats`` queue).
- :class:`AtomicFilesystemTransport`: the embedded ``filesystem://`` broker, with complete-file
  writes and readers that wake when a message arrives (inotify) instead of sleeping a
  polling interval, for the agents and the Celery workers alike.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import queue as stdqueue
import select
import shutil
import struct
import sys
import threading
import time
import uuid
from pathlib import Path
from queue import Empty
from typing import Any

from celery import Celery
from kombu import Connection, Exchange, Queue
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

from scheduling.agent.protocol import (
    HEARTBEAT,
    HEARTBEATS_QUEUE,
    REPORTS_QUEUE,
    REPORTS_TASK,
    node_queue_name,
    validate_control_message,
)
from scheduling.agent.wakeups import Wakeup

logger = logging.getLogger(__name__)

DEFAULT_BROKER_URL = "filesystem://"
DEFAULT_BROKER_DIR = "var/broker"
#: How often a filesystem-broker reader looks at the folder when nothing told it to: the
#: whole latency where inotify is missing (not Linux, a network filesystem), a safety net
#: where it works (a message is then seen within milliseconds).
FILESYSTEM_POLLING_SECONDS = 0.2


def default_broker_url() -> str:
    """``CELERY_BROKER_URL``, else the embedded filesystem broker."""
    return os.environ.get("CELERY_BROKER_URL") or DEFAULT_BROKER_URL


def default_broker_dir() -> str:
    """``SLUICE_BROKER_DIR``, else ``broker`` in ``SLUICE_VAR_DIR``, else ``var/broker``: the
    folder the portal's settings choose from the same variables."""
    var_dir = os.environ.get("SLUICE_VAR_DIR")
    return os.environ.get("SLUICE_BROKER_DIR") or (
        os.path.join(var_dir, "broker") if var_dir else DEFAULT_BROKER_DIR
    )


# inotify(7), through the C library: no dependency, Linux only (elsewhere: polling).
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_Q_OVERFLOW = 0x00004000
_INOTIFY_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then the name


def _inotify_watch(folder: str) -> int | None:
    """An inotify descriptor that reports files completed in or renamed into ``folder``,
    or None where inotify is not available."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init, add = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError):
        return None
    add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
    fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        return None
    if add(fd, os.fsencode(folder), _IN_CLOSE_WRITE | _IN_MOVED_TO) < 0:
        logger.debug("inotify on %s: %s", folder, os.strerror(ctypes.get_errno()))
        os.close(fd)
        return None
    return fd


class FolderChanges:
    """What a filesystem-broker reader waits on between two looks at the folder: a message
    file appearing (inotify), or a message being acknowledged in this process (which lets a
    reader whose prefetch was full take the next one). Without inotify it waits out the
    polling interval, still woken by acknowledgements."""

    def __init__(self, folder: str) -> None:
        self.inotify = _inotify_watch(folder)
        self.acked = Wakeup()

    def wait(self, timeout: float) -> bool:
        """Sleep until a message may be there, at most ``timeout`` seconds; True if woken."""
        fds = [self.acked.fileno()]
        if self.inotify is not None:
            fds.append(self.inotify)
        ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
        woken = False
        if self.acked.fileno() in ready:
            self.acked.clear()
            woken = True
        if self.inotify is not None and self.inotify in ready:
            woken = self._new_messages() or woken
        return woken

    def _new_messages(self) -> bool:
        """Read the pending events; True if one is about a message file (not a temporary
        file being written, nor a message another reader is taking)."""
        assert self.inotify is not None
        found = False
        while True:
            try:
                data = os.read(self.inotify, 65536)
            except BlockingIOError:
                return found
            offset = 0
            while offset + _INOTIFY_EVENT.size <= len(data):
                _, mask, _, length = _INOTIFY_EVENT.unpack_from(data, offset)
                name = data[offset + _INOTIFY_EVENT.size : offset + _INOTIFY_EVENT.size + length]
                offset += _INOTIFY_EVENT.size + length
                if mask & _IN_Q_OVERFLOW or name.rstrip(b"\0").endswith(b".msg"):
                    found = True

    def close(self) -> None:
        if self.inotify is not None:
            os.close(self.inotify)
            self.inotify = None
        self.acked.close()


_SEQUENCE = itertools.count()


class _AtomicFilesystemChannel(filesystem.Channel):
    """kombu's filesystem channel, but a message file appears only once it is complete,
    and taking one costs a rename in the folder.

    kombu writes a message straight into its final file name, so a reader polling the
    folder can take the file while it is still empty and lose the message (a JSON decode
    error on the reader's side; seen under load). Writing a temporary name that readers
    ignore and renaming it closes that window.

    kombu reads by sorting the whole folder for each queue, and claims a file by moving it
    to the system's temporary folder (a copy where that is another filesystem). Here the
    folder is filtered before sorting and the claim is a rename within it: atomic, so one
    reader wins, and cheap.
    """

    def _put(self, queue, payload, **kwargs):
        # Readers take the files in name order: the millisecond (zero-padded, so that the
        # order holds when the number grows a digit), then this process's sequence number,
        # so that messages one process writes within a millisecond keep their order too.
        name = f"{round(time.monotonic() * 1000):013d}_{next(_SEQUENCE):09d}_{uuid.uuid4()}"
        name = f"{name}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # Readers pick files named "<anything>.<queue>.msg"; ".tmp" never matches.
        tmp = f"{final}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(tmp, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue):
        folder = self.data_folder_in
        wanted = f"{queue}.msg"
        # Oldest first: names start with the millisecond they were written.
        names = sorted(n for n in os.listdir(folder) if n.partition(".")[2] == wanted)
        for name in names:
            path = os.path.join(folder, name)
            # ".claimed" matches no queue: renamed, the message is this reader's alone.
            claimed = f"{path}.{os.getpid()}.claimed"
            try:
                os.rename(path, claimed)
            except OSError:
                continue  # another reader took it first
            try:
                with open(claimed, "rb") as f:
                    payload = f.read()
                if self.store_processed:
                    shutil.move(claimed, os.path.join(self.processed_folder, name))
                else:
                    os.remove(claimed)
            except OSError as exc:
                raise ChannelError(f"Cannot read file {claimed!r} from queue.") from exc
            return loads(bytes_to_str(payload))
        raise Empty()

    def basic_ack(self, delivery_tag, multiple=False):
        super().basic_ack(delivery_tag, multiple=multiple)
        self.connection.message_settled()

    def basic_reject(self, delivery_tag, requeue=False):
        super().basic_reject(delivery_tag, requeue=requeue)
        self.connection.message_settled()


class AtomicFilesystemTransport(filesystem.Transport):
    """The ``filesystem://`` transport with complete-file-only writes (see above), and
    readers that wait for the folder to change instead of sleeping.

    kombu's virtual transport looks at every queue, then sleeps ``polling_interval`` when
    none had a message: a message waits up to that long, and a Celery worker whose prefetch
    is full sleeps it after each acknowledgement too (about 0.1 s of idle per task, ~10
    tasks/s per worker whatever their cost). Here the sleep ends as soon as a message file
    appears in the folder (inotify) or a message is acknowledged in this process; the
    interval stays as the safety net.

    The control side should use it too (``CELERY_BROKER_TRANSPORT =
    "scheduling.agent.transport:AtomicFilesystemTransport"`` when the broker is
    ``filesystem://``); :func:`broker_connection` always does.
    """

    Channel = _AtomicFilesystemChannel

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        self._changes: FolderChanges | None = None
        self._changes_lock = threading.Lock()

    def _folder_changes(self) -> FolderChanges:
        with self._changes_lock:
            if self._changes is None:
                folder = self.client.transport_options.get("data_folder_in", "data_in")
                self._changes = FolderChanges(folder)
            return self._changes

    def message_settled(self) -> None:
        """A message was acknowledged or rejected: a reader waiting for room may go on."""
        if self._changes is not None:
            self._changes.acked.set()

    def drain_events(self, connection, timeout=None):
        # kombu's loop, with the sleep replaced by a wait for a change. The watch exists
        # before the first look, so a message written in between is not missed.
        changes = self._folder_changes()
        started = time.monotonic()
        while True:
            try:
                self.cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                elapsed = time.monotonic() - started
                if timeout is not None and elapsed >= timeout:
                    raise TimeoutError() from None
                wait = self.polling_interval
                if wait is None:
                    continue
                if timeout is not None:
                    wait = min(wait, timeout - elapsed)
                changes.wait(wait)

    def close_connection(self, connection):
        super().close_connection(connection)
        with self._changes_lock:
            if self._changes is not None:
                self._changes.close()
                self._changes = None


def broker_transport(url: str) -> type | None:
    """The transport class for ``url`` where kombu's own must be replaced, else None."""
    return AtomicFilesystemTransport if url.startswith("filesystem://") else None


def broker_transport_options(url: str, broker_dir: str | os.PathLike | None = None) -> dict:
    """kombu/Celery transport options for ``url``.

    For ``filesystem://`` every process on the machine must use the same folder for
    messages, and for the exchange tables (``control_folder``, which kombu otherwise puts
    in the current directory); the folders are created. Other transports need nothing.
    """
    if not url.startswith("filesystem://"):
        return {}
    folder = Path(broker_dir or default_broker_dir()).resolve()
    control = folder / "control"
    control.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "control_folder": str(control),
        "polling_interval": FILESYSTEM_POLLING_SECONDS,
    }


def broker_connection(
    url: str | None = None, broker_dir: str | os.PathLike | None = None
) -> Connection:
    """A kombu Connection to the broker (not yet connected)."""
    url = url or default_broker_url()
    return Connection(
        url,
        transport=broker_transport(url),
        transport_options=broker_transport_options(url, broker_dir),
    )


def node_queue(node: str) -> Queue:
    """The queue ``node.<name>``, laid out as kombu's SimpleQueue lays it out."""
    name = node_queue_name(node)
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


#: How a publish retries while the broker reconnects.
_PUBLISH_RETRY = {"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5}


def send_control_message(connection: Connection, node: str, message: dict[str, Any]) -> None:
    """Validate ``message`` and publish it (JSON, persistent) to the node's queue."""
    send_control_messages(connection, [(node, message)])


def send_control_messages(connection: Connection, messages: list[tuple[str, dict]]) -> None:
    """Validate and publish (node, message) pairs in order, through one producer.

    Each message goes to the default exchange with its node's queue name as routing key:
    the message is put on ``node.<name>`` directly, where the queue's own direct exchange
    made the broker look up the exchange's bindings first (on Redis a SMEMBERS per
    message, a third of the wall time of a dispatch cycle launching hundreds of jobs,
    though little of its CPU). The queue needs no declaration for that: on Redis and in
    the filesystem transport a queue is its list (or its files), which the agent's
    consumer reads whoever declared it. On
    Redis the pushes of one call travel in one pipeline (kombu's ``Producer.batch``);
    transports without batches publish each message at once."""
    for _, message in messages:
        validate_control_message(message)
    with connection.Producer(serializer="json") as producer, producer.batch():
        for node, message in messages:
            producer.publish(
                message,
                exchange="",
                routing_key=node_queue_name(node),
                delivery_mode="persistent",
                retry=True,
                retry_policy=_PUBLISH_RETRY,
            )


class _Received:
    """A message handed from the consumer thread to the agent; :meth:`ack` hands it back
    (the thread acknowledges it to the broker)."""

    def __init__(self, message: Any, acks: stdqueue.Queue[Any]) -> None:
        self.message = message
        self._acks = acks

    @property
    def payload(self) -> Any:
        return self.message.payload

    def ack(self) -> None:
        self._acks.put(self.message)


class KombuMessageSource:
    """The agent's end of ``node.<name>``: messages one at a time, never blocking longer
    than asked, reconnecting with exponential backoff (1 s … 30 s) when the broker drops.

    A consumer thread owns the broker connection and blocks in the broker's own wait; it
    hands each message over through a queue and pokes a pipe (:meth:`fileno`) that the
    agent's loop selects on together with its jobs' pidfds. Why a thread: kombu offers no
    descriptor to wait on that works for every transport (the filesystem and Redis
    transports wait inside ``drain_events``), and the agent must learn of a job's exit at
    once, not after its broker wait. Short broker waits in the loop instead would trade
    latency against idle CPU; the thread costs neither. Only the thread touches the
    connection (kombu connections are not thread-safe): the agent's ``ack`` is handed back
    to it.

    Up to ``prefetch`` messages are handed over before the first is acknowledged, so that a
    burst of launches is handled in one pass of the agent, not one message per pass. They
    are acknowledged once handled (see the protocol); the price is that an agent that dies
    leaves up to ``prefetch`` messages for the broker to deliver again (Redis: after its
    visibility timeout), where one used to wait.
    """

    def __init__(
        self,
        node: str,
        url: str | None = None,
        broker_dir: str | os.PathLike | None = None,
        *,
        max_backoff: float = 30.0,
        wait_seconds: float = 1.0,
        prefetch: int = 32,
    ) -> None:
        self.url = url or default_broker_url()
        self.broker_dir = broker_dir
        self.node = node
        self._max_backoff = max_backoff
        #: Longest broker wait of the thread (how soon it notices close()).
        self._wait_seconds = wait_seconds
        self._prefetch = max(1, prefetch)
        #: Messages the agent has handled, for the thread to acknowledge.
        self._acks: stdqueue.Queue[Any] = stdqueue.Queue()
        #: Messages handed over and not yet acknowledged (the thread's count).
        self._unacked = 0
        self._connection: Connection | None = None
        self._queue: Any = None
        self._failures = 0
        self._retry_at = 0.0
        self._inbox: stdqueue.Queue[_Received] = stdqueue.Queue()
        self._wakeup = Wakeup()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def fileno(self) -> int:
        """Readable when a message may be waiting (then :meth:`get` it)."""
        return self._wakeup.fileno()

    def get(self, timeout: float) -> Any:
        """The next message (``.payload``, ``.ack()``) or None."""
        self._start()
        # Clear, then look: a message handed over meanwhile keeps the pipe readable.
        self._wakeup.clear()
        try:
            if timeout <= 0:
                return self._inbox.get_nowait()
            return self._inbox.get(timeout=timeout)
        except Empty:
            return None

    def _start(self) -> None:
        if self._thread is None and not self._closing.is_set():
            self._thread = threading.Thread(
                target=self._consume, name=f"sluice-agent-{self.node}-consumer", daemon=True
            )
            self._thread.start()

    def _consume(self) -> None:
        try:
            while not self._closing.is_set():
                if not self._connected():
                    self._closing.wait(max(0.0, self._retry_at - time.monotonic()))
                    continue
                self._acknowledge(wait=0.0)
                if self._unacked >= self._prefetch:
                    self._acknowledge(wait=self._wait_seconds)  # the agent is busy
                    continue
                # While messages are with the agent, come back soon to acknowledge them.
                wait = 0.01 if self._unacked else self._wait_seconds
                try:
                    message = self._queue.get(block=True, timeout=wait)
                except self._queue.Empty:
                    continue
                except Exception as exc:  # connection and channel errors of any transport
                    self._lost(exc)
                    continue
                self._unacked += 1
                self._inbox.put(_Received(message, self._acks))
                self._wakeup.set()
        finally:
            if self._queue is not None:
                self._acknowledge(wait=0.0)
            self._disconnect()

    def _acknowledge(self, wait: float) -> None:
        """Acknowledge what the agent has handled (waiting ``wait`` seconds for one)."""
        try:
            message = self._acks.get(timeout=wait) if wait > 0 else self._acks.get_nowait()
        except Empty:
            return
        while True:
            self._unacked -= 1
            try:
                message.ack()
            except Exception as exc:  # broker gone: the message comes again; idempotent
                logger.warning("cannot acknowledge a message: %s", exc)
                self._lost(exc)
                return
            try:
                message = self._acks.get_nowait()
            except Empty:
                return

    def _connected(self) -> bool:
        if self._queue is not None:
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            connection = broker_connection(self.url, self.broker_dir)
            connection.ensure_connection(max_retries=1)
            simple = connection.SimpleQueue(node_queue(self.node), accept=["json"])
            simple.consumer.qos(prefetch_count=self._prefetch)
        except Exception as exc:
            self._lost(exc)
            return False
        self._connection, self._queue = connection, simple
        if self._failures:
            logger.info("reconnected to the broker after %d failures", self._failures)
        self._failures = 0
        logger.info("consuming %s", node_queue_name(self.node))
        return True

    def _lost(self, exc: Exception) -> None:
        # Unacknowledged messages die with the connection (the broker delivers them
        # again); acknowledgements still to come for them are void.
        self._unacked = 0
        while True:
            try:
                self._acks.get_nowait()
            except Empty:
                break
        self._failures += 1
        backoff = min(self._max_backoff, 2.0 ** (self._failures - 1))
        self._retry_at = time.monotonic() + backoff
        logger.warning("broker unavailable (%s); reconnecting in %.0f s", exc, backoff)
        self._disconnect()

    def _disconnect(self) -> None:
        for closer in (self._queue, self._connection):
            if closer is not None:
                try:
                    closer.close()
                except Exception as exc:  # already broken: nothing left to release
                    logger.debug("error while closing the broker connection: %s", exc)
        self._queue = self._connection = None

    def close(self) -> None:
        """Stop the consumer thread (within about ``wait_seconds``) and its connection."""
        self._closing.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=self._wait_seconds + 10.0)
            if thread.is_alive():  # stuck in the broker: the daemon thread dies with us
                logger.warning("the broker consumer did not stop in time")
                return
        self._wakeup.close()


class CeleryReportSender:
    """Sends reports in batches: one ``scheduling.agent_reports`` Celery task message, whose
    one argument is the list of reports, to the reports queue; the batch's heartbeats go
    as a message of their own to ``heartbeats_queue`` (see the protocol), unless that is
    empty (then they stay with the other reports, as agents before that queue sent them).

    The Celery app is the agent's own: no Django fix-up (which would import Django when
    ``DJANGO_SETTINGS_MODULE`` is set) and not made the current app, so it cannot disturb
    a Django process that calls the agent's ``main``. Publishing is not retried here: a
    failure raises, and the agent's outbox retries later without blocking its loop.
    """

    def __init__(
        self,
        url: str | None = None,
        broker_dir: str | os.PathLike | None = None,
        *,
        reports_queue: str = REPORTS_QUEUE,
        heartbeats_queue: str = HEARTBEATS_QUEUE,
    ) -> None:
        url = url or default_broker_url()
        self.reports_queue = reports_queue
        self.heartbeats_queue = heartbeats_queue
        self.app = Celery("sluice-agent", broker=url, set_as_current=False, fixups=[])
        self.app.conf.update(
            broker_transport=broker_transport(url),
            broker_transport_options=broker_transport_options(url, broker_dir),
            broker_connection_timeout=2.0,
            task_serializer="json",
            accept_content=["json"],
            task_ignore_result=True,
            result_backend=None,
        )

        # Celery lets the CELERY_BROKER_URL environment variable override the app's broker;
        # an explicit connection keeps the URL this sender was given.
        self.connection = broker_connection(url, broker_dir)
        self.connection.connect_timeout = 2.0

    def send_batch(self, reports: list[dict[str, Any]]) -> None:
        """Publish ``reports`` (in order) as one task message, and their heartbeats as
        another to the heartbeats queue (after the rest: a heartbeat that lists a job the
        agent just reported started or exited is handled either way, see
        ``scheduling.services.nodes._reconcile_jobs``). Either publish may raise; the
        caller then sends the whole batch again (every report is idempotent)."""
        beats: list[dict[str, Any]] = []
        if self.heartbeats_queue:
            beats = [r for r in reports if r.get("type") == HEARTBEAT]
            if beats:
                reports = [r for r in reports if r.get("type") != HEARTBEAT]
        if reports:
            self._publish(reports, self.reports_queue)
        if beats:
            self._publish(beats, self.heartbeats_queue)

    def _publish(self, reports: list[dict[str, Any]], queue: str) -> None:
        self.app.send_task(
            REPORTS_TASK,
            args=[reports],
            queue=queue,
            retry=False,
            ignore_result=True,
            connection=self.connection,
        )

    def __call__(self, report: dict[str, Any]) -> None:
        self.send_batch([report])

    def close(self) -> None:
        self.connection.release()
        self.app.close()
