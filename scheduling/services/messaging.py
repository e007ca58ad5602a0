"""Messages to node agents (queue ``node.<name>``); the format is in scheduling.agent.protocol.

Always called from ``transaction.on_commit``: a message never leaves for a change that was
rolled back. Builders for the messages are the protocol module's (``launch_message``,
``stop_message``, ``kill_process_message``), shared with the agent that reads them.
"""

from __future__ import annotations

import logging

from django.conf import settings

from scheduling.agent.protocol import validate_control_message

log = logging.getLogger(__name__)

# Filled instead of the broker when SLUICE_NODE_TRANSPORT == "memory" (unit tests).
OUTBOX: list[tuple[str, dict]] = []


def send_node_messages(messages: list[tuple[str, dict]]) -> None:
    """Publish (node name, message) pairs over one broker connection."""
    if not messages:
        return
    if settings.SLUICE_NODE_TRANSPORT == "memory":
        OUTBOX.extend((node, validate_control_message(message)) for node, message in messages)
        return
    from scheduling.agent.transport import broker_connection, send_control_message

    try:
        with broker_connection(settings.CELERY_BROKER_URL, settings.SLUICE_BROKER_DIR) as conn:
            for node, message in messages:
                send_control_message(conn, node, message)
    except Exception:  # the broker is down: the sweeps resend (stuck launches, stop deadlines)
        log.exception("could not send %d message(s) to node agents", len(messages))


def send_node_message(node_name: str, message: dict) -> None:
    send_node_messages([(node_name, message)])
