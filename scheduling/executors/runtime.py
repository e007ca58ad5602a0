"""The runtime: the loop between the node wire protocol and an :class:`Executor`.

One runtime serves one node (the node agent) or several (a bridge in front of a Slurm
partition or a Kubernetes cluster), with one executor. Each pass of :meth:`Runtime.tick`
takes the waiting messages of every node (``launch``, ``stop``, ``kill_process``,
``extend``) and hands
them to the executor, lets the executor do what is due (:meth:`Executor.work`), turns what
it observed (:meth:`Executor.poll`: starts, exits, output, serving samples) into reports,
sends each node's heartbeat when one is due and flushes the report outbox (in batches).

Between passes the loop sleeps in one ``select`` (:mod:`scheduling.agent.wakeups`) until a
message arrives on any node's queue, the executor's descriptors wake it (a job process
ended, a wrapper answered), or something is due (heartbeat, the executor's deadlines, a
report retry).

Delivery drives state: an event's :meth:`Executor.delivered` is called once the broker
message carrying its report is out, so an exit or output is re-sent after a restart until
it was delivered, never lost.

Pure standard library (no Django): the runtime runs on nodes and bridges.
"""

from __future__ import annotations

import json
import logging
import queue
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from scheduling.agent.protocol import (
    AGENT_VERSION,
    EXTEND,
    HEARTBEAT,
    KILL_PROCESS,
    LAUNCH,
    PROTOCOL_VERSION,
    REGISTER,
    STOP,
    ProtocolError,
    exited_report,
    log_report,
    report,
    serve_metrics_report,
    started_report,
    validate_control_message,
    validate_node_name,
)
from scheduling.agent.wakeups import LoopWaiter, Wakeup
from scheduling.executors.base import (
    Event,
    Executor,
    Exited,
    LogChunk,
    ServeSamples,
    Started,
)

logger = logging.getLogger(__name__)

#: Sends one report (tests, embedding): the outbox then sends one report at a time.
SendReport = Callable[[dict[str, Any]], None]
#: Sends a list of reports as one message, in order.
SendReports = Callable[[list[dict[str, Any]]], None]


class BatchReportSender(Protocol):
    """A report sender that can send many reports in one message (the broker's)."""

    def send_batch(self, reports: list[dict[str, Any]]) -> None: ...


# --- message sources ----------------------------------------------------------------------


class IncomingMessage(Protocol):
    """A received message: its decoded payload, acknowledged once handled."""

    @property
    def payload(self) -> Any: ...

    def ack(self) -> None: ...


class MessageSource(Protocol):
    """Where control messages come from."""

    def get(self, timeout: float) -> IncomingMessage | None:
        """The next message, waiting at most ``timeout`` seconds; None if there is none."""
        ...

    def close(self) -> None: ...


@dataclass
class LocalMessage:
    payload: Any
    acked: bool = False

    def ack(self) -> None:
        self.acked = True


class LocalMessageSource:
    """An in-process message source (tests, and embedding without a broker). Like the
    broker's, it offers a descriptor (:meth:`fileno`) that is readable when a message
    may be waiting, so the agent's loop sleeps in one select over it and its jobs."""

    def __init__(self) -> None:
        self._queue: queue.Queue[LocalMessage] = queue.Queue()
        self._wakeup = Wakeup()

    def put(self, payload: Any) -> None:
        self._queue.put(LocalMessage(payload))
        self._wakeup.set()

    def fileno(self) -> int:
        return self._wakeup.fileno()

    def get(self, timeout: float) -> LocalMessage | None:
        self._wakeup.clear()
        try:
            if timeout <= 0:
                return self._queue.get_nowait()
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._wakeup.close()


# --- outbox ---------------------------------------------------------------------------------


@dataclass
class _Queued:
    report: dict[str, Any]
    on_sent: Callable[[], None] | None
    #: Its JSON size, for the per-message byte bound.
    size: int


class Outbox:
    """Reports waiting to be sent, in order, in batches, retried with backoff while sending
    fails.

    :meth:`flush` sends everything due as few messages as the bounds allow (at most
    ``max_batch_reports`` reports and about ``max_batch_bytes`` of JSON each, never less
    than one report), in order. ``on_sent`` callbacks run once the message carrying their
    report is out, which is when the agent records it as delivered (log offset, exit
    reported) so nothing is lost if the agent stops first; when sending fails, the whole
    batch stays queued. Only the newest heartbeat of each node is kept: an old sample is worthless once a
    newer one exists.
    """

    def __init__(
        self,
        send: SendReports,
        *,
        max_batch_reports: int = 200,
        max_batch_bytes: int = 512 * 1024,
        max_backoff: float = 30.0,
        max_size: int = 100_000,
        on_recovered: Callable[[], None] | None = None,
    ) -> None:
        self._send = send
        self._items: deque[_Queued] = deque()
        self._max_batch_reports = max(1, max_batch_reports)
        self._max_batch_bytes = max_batch_bytes
        self._max_backoff = max_backoff
        self._max_size = max_size
        self._failures = 0
        self._retry_at = 0.0
        self._on_recovered = on_recovered

    def __len__(self) -> int:
        return len(self._items)

    @property
    def healthy(self) -> bool:
        return self._failures == 0

    @property
    def retry_in(self) -> float:
        """Seconds until the next delivery attempt is due (0 when due or empty)."""
        if not self._items:
            return float("inf")
        return max(0.0, self._retry_at - time.monotonic())

    def put(self, item: dict[str, Any], on_sent: Callable[[], None] | None = None) -> None:
        if item["type"] == HEARTBEAT:  # of the same node: a bridge sends one per node
            self._items = deque(
                i
                for i in self._items
                if i.report["type"] != HEARTBEAT or i.report.get("node") != item.get("node")
            )
        size = len(json.dumps(item, default=str)) if self._max_batch_reports > 1 else 0
        self._items.append(_Queued(item, on_sent, size))
        if len(self._items) > self._max_size:
            dropped = self._items.popleft()
            logger.error("report outbox full; dropped a %s report", dropped.report["type"])

    def flush(self, *, force: bool = False) -> bool:
        """Send what is due, in order; True when the outbox is empty afterwards."""
        if self._items and not force and time.monotonic() < self._retry_at:
            return False
        while self._items:
            count = self._batch_length()
            batch = [self._items[i] for i in range(count)]
            try:
                self._send([queued.report for queued in batch])
            except Exception as exc:  # any broker or transport error: keep it, retry later
                self._failed(exc)
                return False
            for _ in range(count):
                self._items.popleft()
            if self._failures:
                logger.info("reports are delivered again after %d failures", self._failures)
                self._failures = 0
                if self._on_recovered:
                    self._on_recovered()
            for queued in batch:
                if queued.on_sent:
                    queued.on_sent()
        return True

    def _batch_length(self) -> int:
        """How many reports from the head go in the next message."""
        count, size = 0, 0
        for queued in self._items:
            if count >= self._max_batch_reports:
                break
            if count and size + queued.size > self._max_batch_bytes:
                break
            count += 1
            size += queued.size
        return count

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        backoff = min(self._max_backoff, 2.0 ** (self._failures - 1))
        self._retry_at = time.monotonic() + backoff
        logger.warning(
            "cannot send reports (%s; %d waiting); retrying in %.0f s", exc, len(self), backoff
        )


# --- the runtime ------------------------------------------------------------------------------


@dataclass
class RuntimeNode:
    """A node the runtime serves: its name, its message queue, its pool."""

    name: str
    messages: MessageSource | None = None
    pool: str | None = None


@dataclass
class RuntimeConfig:
    """How the runtime's loop runs (the agent fills it from its own options)."""

    heartbeat_seconds: float = 10.0
    #: Messages handled per pass at most, so deadlines are enforced even under a flood.
    max_messages_per_pass: int = 100
    #: Seconds a pass spends taking messages at most (at least one is taken): in a burst
    #: of launches, the first jobs' ``started`` (and any exit) go out while the rest are
    #: started, and the next pass goes on without waiting.
    max_receive_seconds: float = 0.1
    #: Reports per broker message at most, and JSON bytes per message at most (a report
    #: bigger than that goes alone).
    max_batch_reports: int = 200
    max_batch_bytes: int = 512 * 1024
    #: How long the loop waits at most when it serves several nodes whose message sources
    #: offer no descriptor to select on (it then looks at each in turn).
    poll_seconds: float = 0.05


class Runtime:
    """Serves the nodes of one executor: messages in, reports out, heartbeats per node."""

    def __init__(
        self,
        executor: Executor,
        nodes: Sequence[RuntimeNode],
        send_report: SendReport | BatchReportSender,
        config: RuntimeConfig | None = None,
    ) -> None:
        if not nodes:
            raise ValueError("a runtime serves at least one node")
        for node in nodes:
            validate_node_name(node.name)
        self.executor = executor
        self.nodes = list(nodes)
        self.runtime_config = config or RuntimeConfig()
        self.outbox = self._make_outbox(send_report)
        #: Where the loop sleeps between passes (messages, the executor's descriptors).
        self.waiter = LoopWaiter()
        self._sources = [n for n in self.nodes if n.messages is not None]
        #: Every source offers a descriptor: the loop selects on them with the executor's.
        #: Else (a source of another kind) the loop waits in the source, as it used to.
        self._selectable = all(callable(getattr(n.messages, "fileno", None)) for n in self._sources)
        if self._selectable:
            for node in self._sources:
                self.waiter.add_reader(node.messages.fileno(), ("messages", node.name))  # type: ignore[union-attr]
        self._next_source = 0
        #: The last pass stopped at max_messages_per_pass: the next one must not wait.
        self._more_messages = False
        self._next_heartbeat = {node.name: 0.0 for node in self.nodes}
        self._stop_requested = False
        executor.attach(
            self.waiter,
            backlog=lambda: len(self.outbox),
            exits_wake=self._selectable or not self._sources,
        )

    def _make_outbox(self, send_report: SendReport | BatchReportSender) -> Outbox:
        """A sender with ``send_batch`` (the broker's) gets batches; a plain callable gets
        one report at a time, each confirmed on its own."""
        send_batch = getattr(send_report, "send_batch", None)
        if callable(send_batch):
            return Outbox(
                send_batch,
                max_batch_reports=self.runtime_config.max_batch_reports,
                max_batch_bytes=self.runtime_config.max_batch_bytes,
                on_recovered=self._register,
            )
        send_one = send_report
        return Outbox(
            lambda reports: send_one(reports[0]),  # type: ignore[operator]
            max_batch_reports=1,
            on_recovered=self._register,
        )

    # --- lifecycle ---

    def start(self) -> None:
        """Start the executor (it takes over what a previous run left), register every
        node, send the first heartbeats."""
        self.executor.start()
        self._register()
        self._drain()
        self._heartbeat()
        self.outbox.flush()
        self.executor.settle()

    def run(self) -> None:
        """Start, then loop until :meth:`request_stop`; jobs keep running afterwards."""
        try:
            self.start()
            while not self._stop_requested:
                try:
                    self.tick()
                except Exception:  # e.g. a full disk: keep supervising, do not spin
                    logger.exception("error in the runtime loop")
                    time.sleep(1.0)
            self.before_exit()
        finally:
            self.close()

    def before_exit(self) -> None:
        """What to do once the loop has ended, before :meth:`close` (nothing here)."""
        return None

    def request_stop(self, *_: Any) -> None:
        """Ask the loop to end after the current pass (safe from a signal handler, and
        from another thread: the loop's wait is cut short)."""
        self._stop_requested = True
        self.waiter.wakeup.set()

    def close(self) -> None:
        """Deliver what can be delivered now and release the broker and the executor.

        Jobs are left running: the executor takes them over on its next start.
        """
        self._drain()
        self.outbox.flush(force=True)
        self.executor.settle(end_of_pass=False)
        if len(self.outbox):
            logger.warning(
                "%d reports not delivered; exits and output are re-sent on restart",
                len(self.outbox),
            )
        for node in self._sources:
            node.messages.close()  # type: ignore[union-attr]
        self.executor.close()
        self.waiter.close()

    def tick(self, timeout: float | None = None) -> None:
        """One pass of the loop. It first waits, at most ``timeout`` seconds (default:
        until something is due), for a message or a wake-up of the executor's."""
        wait = self._wait_time() if timeout is None else timeout
        self._receive(wait)
        self.executor.work()
        self._drain()
        now = time.monotonic()
        for node in self.nodes:
            if now >= self._next_heartbeat[node.name]:
                self._heartbeat(node.name)
        self.outbox.flush()
        self.executor.settle()

    def _wait_time(self) -> float:
        """How long the next pass may wait without missing anything due. Messages and the
        executor's descriptors wake the wait anyway."""
        if self._more_messages:
            return 0.0
        monotonic = time.monotonic()
        waits = [
            min(self._next_heartbeat.values()) - monotonic,
            self.outbox.retry_in,
            self.executor.due_in(),
        ]
        return max(0.0, min(waits))

    # --- messages ---

    def _receive(self, timeout: float) -> None:
        incoming = self._first_message(timeout)
        handled = 0
        until = time.monotonic() + self.runtime_config.max_receive_seconds
        while incoming is not None:
            self._handle_incoming(*incoming)
            handled += 1
            if handled >= self.runtime_config.max_messages_per_pass or time.monotonic() >= until:
                self._more_messages = True
                return
            incoming = self._any_message()
        self._more_messages = False

    def _any_message(self) -> tuple[RuntimeNode, IncomingMessage] | None:
        """A waiting message of any node, taking the nodes in turn."""
        for _ in range(len(self._sources)):
            node = self._sources[self._next_source % len(self._sources)]
            self._next_source = (self._next_source + 1) % len(self._sources)
            message = node.messages.get(0)  # type: ignore[union-attr]
            if message is not None:
                return node, message
        return None

    def _first_message(self, timeout: float) -> tuple[RuntimeNode, IncomingMessage] | None:
        """The first message of the pass, waiting for it (or for a wake-up of the
        executor's) at most ``timeout`` seconds."""
        if not self._sources:
            self.waiter.wait(timeout)
            return None
        if not self._selectable:
            if len(self._sources) == 1:
                node = self._sources[0]
                message = node.messages.get(timeout)  # type: ignore[union-attr]
                return None if message is None else (node, message)
            found = self._any_message()
            if found is None and timeout > 0:
                self.waiter.wait(min(timeout, self.runtime_config.poll_seconds))
                found = self._any_message()
            return found
        found = self._any_message()
        if found is None and timeout > 0:
            self.waiter.wait(timeout)
            found = self._any_message()
        return found

    def _handle_incoming(self, node: RuntimeNode, message: IncomingMessage) -> None:
        try:
            payload = message.payload
        except Exception as exc:  # undecodable body: drop it, or it would come back forever
            logger.error("dropping a message that cannot be decoded: %s", exc)
        else:
            self.handle_message(payload, node.name)
        # What the broker forgets once acknowledged is written down first.
        self.executor.settle(end_of_pass=False)
        try:
            message.ack()
        except Exception as exc:  # broker gone: the message comes again, handling is idempotent
            logger.warning("cannot acknowledge a message: %s", exc)

    def handle_message(self, payload: Any, node: str | None = None) -> None:
        """Act on one control message for ``node`` (default: the first node); invalid ones
        are logged and dropped."""
        node = self.nodes[0].name if node is None else node
        try:
            message = validate_control_message(payload)
        except ProtocolError as exc:
            logger.error("dropping invalid message: %s", exc)
            return
        try:
            if message["type"] == LAUNCH:
                self.executor.launch(node, message)
            elif message["type"] == STOP:
                self.executor.stop(node, message)
            elif message["type"] == KILL_PROCESS:
                self._kill_process(node, message)
            elif message["type"] == EXTEND:
                self.executor.extend(node, message)
        except Exception:  # a bug must not take down the loop and every job's supervision
            # Not the whole message: a launch carries the user's environment.
            what = message.get("job_id", message.get("pid"))
            logger.exception("failed to handle %s message (%s)", message["type"], what)

    def _kill_process(self, node: str, message: dict[str, Any]) -> None:
        pid, gpu_index = message["pid"], message["gpu_index"]
        logger.info("kill_process %s on GPU %s of %s (%s)", pid, gpu_index, node, message["reason"])
        self.executor.kill_process(node, pid, gpu_index)

    # --- reports ---

    def _drain(self) -> None:
        """Queue the reports of what the executor observed, in order."""
        for event in self.executor.poll():
            item = self._event_report(event)
            if item is not None:
                self.outbox.put(item, on_sent=lambda e=event: self.executor.delivered(e))

    @staticmethod
    def _event_report(event: Event) -> dict[str, Any] | None:
        if isinstance(event, Started):
            return started_report(
                node=event.node,
                job_id=event.job_id,
                attempt=event.attempt,
                pid=event.pid or 0,
                started_at=event.started_at or time.time(),
                isolation=None if event.isolation is None else dict(event.isolation),
                port=event.port,
            )
        if isinstance(event, Exited):
            return exited_report(
                node=event.node,
                job_id=event.job_id,
                attempt=event.attempt,
                exit_code=event.exit_code,
                signal=event.signal,
                stop_reason=event.reason or None,
                message=event.message,
                finished_at=event.finished_at or time.time(),
            )
        if isinstance(event, LogChunk):
            return log_report(
                node=event.node,
                job_id=event.job_id,
                attempt=event.attempt,
                offset=event.offset,
                data=event.data.decode("utf-8", "replace"),
            )
        if isinstance(event, ServeSamples):
            try:
                return serve_metrics_report(node=event.node, samples=list(event.samples))
            except ProtocolError as exc:  # a value the protocol refuses: drop the round
                logger.warning("dropping a round of serving metrics: %s", exc)
                return None
        logger.error("dropping an event of unknown kind: %r", type(event).__name__)
        return None

    def _register(self) -> None:
        for node in self.nodes:
            self.outbox.put(
                report(
                    REGISTER,
                    node.name,
                    pool=node.pool,
                    agent_version=AGENT_VERSION,
                    protocol_version=PROTOCOL_VERSION,
                    executor=self.executor.kind,
                    capabilities=self.executor.capabilities().as_dict(),
                    **self.executor.register_fields(node.name),
                )
            )

    def _heartbeat(self, node: str | None = None) -> None:
        """Queue the heartbeat of ``node`` (default: of every node)."""
        names = [n.name for n in self.nodes] if node is None else [node]
        for name in names:
            self._next_heartbeat[name] = time.monotonic() + self.runtime_config.heartbeat_seconds
            fields, on_sent = self.executor.heartbeat_fields(name)
            self.outbox.put(report(HEARTBEAT, name, **fields), on_sent=on_sent)
