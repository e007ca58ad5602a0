"""Broker plumbing for both sides of the agent protocol (kombu and Celery, no Django).

- :func:`broker_connection` / :func:`broker_transport_options`: the kombu connection both
  sides use, with the filesystem broker's folders set (the embedded default).
- :func:`send_control_message`: how the control side puts a message on ``node.<name>``.
- :class:`KombuMessageSource`: the agent's consumer of its queue, reconnecting with backoff.
- :class:`CeleryReportSender`: the agent's sender of reports as Celery task messages.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery
from kombu import Connection, Exchange, Queue
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

from scheduling.agent.protocol import (
    CONTROL_QUEUE,
    REPORT_TASK,
    node_queue_name,
    validate_control_message,
)

logger = logging.getLogger(__name__)

DEFAULT_BROKER_URL = "filesystem://"
DEFAULT_BROKER_DIR = "var/broker"
FILESYSTEM_POLLING_SECONDS = 0.2


def default_broker_url() -> str:
    """``CELERY_BROKER_URL``, else the embedded filesystem broker."""
    return os.environ.get("CELERY_BROKER_URL") or DEFAULT_BROKER_URL


def default_broker_dir() -> str:
    """``SLUICE_BROKER_DIR``, else ``var/broker``."""
    return os.environ.get("SLUICE_BROKER_DIR") or DEFAULT_BROKER_DIR


class _AtomicFilesystemChannel(filesystem.Channel):
    """kombu's filesystem channel, but a message file appears only once it is complete.

    kombu writes a message straight into its final file name, so a reader polling the
    folder can take the file while it is still empty and lose the message (a JSON decode
    error on the reader's side; seen under load). Writing a temporary name that readers
    ignore and renaming it closes that window; reading is unchanged.
    """

    def _put(self, queue, payload, **kwargs):
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # Readers pick files named "<anything>.<queue>.msg"; ".tmp" never matches.
        tmp = f"{final}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(tmp, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class AtomicFilesystemTransport(filesystem.Transport):
    """The ``filesystem://`` transport with complete-file-only writes (see above).

    The control side should use it too (``CELERY_BROKER_TRANSPORT =
    "scheduling.agent.transport:AtomicFilesystemTransport"`` when the broker is
    ``filesystem://``); :func:`broker_connection` always does.
    """

    Channel = _AtomicFilesystemChannel


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


def send_control_message(connection: Connection, node: str, message: dict[str, Any]) -> None:
    """Validate ``message`` and publish it (JSON, persistent) to the node's queue."""
    validate_control_message(message)
    queue = node_queue(node)
    with connection.Producer(serializer="json") as producer:
        producer.publish(
            message,
            exchange=queue.exchange,
            routing_key=queue.routing_key,
            declare=[queue],
            delivery_mode="persistent",
            retry=True,
            retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
        )


class KombuMessageSource:
    """The agent's end of ``node.<name>``: one message at a time, never blocking longer
    than asked, reconnecting with exponential backoff (1 s … 30 s) when the broker drops."""

    def __init__(
        self,
        node: str,
        url: str | None = None,
        broker_dir: str | os.PathLike | None = None,
        *,
        max_backoff: float = 30.0,
    ) -> None:
        self.url = url or default_broker_url()
        self.broker_dir = broker_dir
        self.node = node
        self._max_backoff = max_backoff
        self._connection: Connection | None = None
        self._queue: Any = None
        self._failures = 0
        self._retry_at = 0.0

    def get(self, timeout: float) -> Any:
        """The next kombu message (``.payload``, ``.ack()``) or None."""
        if not self._connected():
            time.sleep(max(0.0, min(timeout, self._retry_at - time.monotonic())))
            return None
        try:
            # A blocking get with timeout 0 only returns what is already buffered, so wait
            # a moment to let the transport deliver the next message.
            return self._queue.get(block=True, timeout=max(timeout, 0.001))
        except self._queue.Empty:
            return None
        except Exception as exc:  # connection and channel errors of any transport
            self._lost(exc)
            return None

    def _connected(self) -> bool:
        if self._queue is not None:
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            connection = broker_connection(self.url, self.broker_dir)
            connection.ensure_connection(max_retries=1)
            simple = connection.SimpleQueue(node_queue(self.node), accept=["json"])
            # One unacknowledged message at a time: if the agent dies, at most one waits
            # for the broker to redeliver it.
            simple.consumer.qos(prefetch_count=1)
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
        self._failures += 1
        backoff = min(self._max_backoff, 2.0 ** (self._failures - 1))
        self._retry_at = time.monotonic() + backoff
        logger.warning("broker unavailable (%s); reconnecting in %.0f s", exc, backoff)
        self.close()

    def close(self) -> None:
        for closer in (self._queue, self._connection):
            if closer is not None:
                try:
                    closer.close()
                except Exception as exc:  # already broken: nothing left to release
                    logger.debug("error while closing the broker connection: %s", exc)
        self._queue = self._connection = None


class CeleryReportSender:
    """Sends reports as ``scheduling.agent_report`` Celery tasks to the control queue.

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
        control_queue: str = CONTROL_QUEUE,
    ) -> None:
        url = url or default_broker_url()
        self.control_queue = control_queue
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

    def __call__(self, report: dict[str, Any]) -> None:
        self.app.send_task(
            REPORT_TASK,
            args=[report],
            queue=self.control_queue,
            retry=False,
            ignore_result=True,
            connection=self.connection,
        )

    def close(self) -> None:
        self.connection.release()
        self.app.close()
