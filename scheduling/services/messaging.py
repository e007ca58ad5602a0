"""Messages to node agents (queue ``node.<name>``); the format is in scheduling.agent.protocol.

Always called from ``transaction.on_commit``: a message never leaves for a change that was
rolled back. Builders for the messages are the protocol module's (``launch_message``,
``stop_message``, ``kill_process_message``), shared with the agent that reads them.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings

from scheduling.agent.protocol import validate_control_message

log = logging.getLogger(__name__)

# Filled instead of the broker when SLUICE_NODE_TRANSPORT == "memory" (unit tests).
OUTBOX: list[tuple[str, dict]] = []


#: Each thread's broker connection, kept between sends (a dispatch cycle sends its launches
#: every second or so: connecting each time cost more than publishing). kombu connections
#: are not thread-safe, hence one per thread (gunicorn threads send stops too).
_local = threading.local()


def _connection():
    from scheduling.agent.transport import broker_connection

    url, folder = settings.CELERY_BROKER_URL, settings.SLUICE_BROKER_DIR
    kept = getattr(_local, "connection", None)
    if kept is not None and getattr(_local, "key", None) == (url, folder):
        return kept
    _drop_connection()
    _local.connection, _local.key = broker_connection(url, folder), (url, folder)
    return _local.connection


def _drop_connection() -> None:
    kept = getattr(_local, "connection", None)
    _local.connection = None
    if kept is not None:
        try:
            kept.release()
        except Exception:  # already broken: nothing to release
            log.debug("closing a broken broker connection", exc_info=True)


def send_node_messages(messages: list[tuple[str, dict]]) -> None:
    """Publish (node name, message) pairs, in order, over this thread's kept broker
    connection; a connection that fails is replaced once before giving up. A retried
    batch may repeat messages sent before the failure: agents answer a repeated launch or
    stop without acting twice (scheduling.agent.protocol)."""
    if not messages:
        return
    if settings.SLUICE_NODE_TRANSPORT == "memory":
        OUTBOX.extend((node, validate_control_message(message)) for node, message in messages)
        return
    from scheduling.agent.transport import send_control_messages

    for attempt in (1, 2):
        try:
            send_control_messages(_connection(), messages)
            return
        except Exception:
            _drop_connection()
            if attempt == 2:  # the broker is down: the sweeps resend (stuck launches, stops)
                log.exception("could not send %d message(s) to node agents", len(messages))


def send_node_message(node_name: str, message: dict) -> None:
    send_node_messages([(node_name, message)])
