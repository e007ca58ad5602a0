"""Messages to node agents (queue ``node.<name>``); the format is in scheduling.agent.protocol.

Always called from ``transaction.on_commit``: a message never leaves for a change that was
rolled back.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings

log = logging.getLogger(__name__)

# Filled instead of the broker when SLUICE_NODE_TRANSPORT == "memory" (unit tests).
OUTBOX: list[tuple[str, dict]] = []


def node_queue_name(node_name: str) -> str:
    return f"node.{node_name}"


def send_node_message(node_name: str, message: dict) -> None:
    message = {**message, "sent_at": message.get("sent_at") or time.time()}
    if settings.SLUICE_NODE_TRANSPORT == "memory":
        OUTBOX.append((node_name, message))
        return
    from scheduling.agent.transport import broker_connection

    try:
        with broker_connection(settings.CELERY_BROKER_URL, settings.SLUICE_BROKER_DIR) as conn:
            queue = conn.SimpleQueue(node_queue_name(node_name))
            try:
                queue.put(message, serializer="json")
            finally:
                queue.close()
    except Exception:  # the broker is down: the sweeps resend (stuck launch, stop deadlines)
        log.exception("could not send %s to node %s", message.get("type"), node_name)


def send_node_messages(messages: list[tuple[str, dict]]) -> None:
    for node_name, message in messages:
        send_node_message(node_name, message)
