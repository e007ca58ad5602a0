"""Messages to node agents go over a broker connection each thread keeps (a dispatch cycle
sends launches every second: connecting each time cost more than publishing), in order,
each node's queue declared once per batch; a broken connection is replaced once."""

from __future__ import annotations

from kombu import Connection

from scheduling.agent import transport
from scheduling.agent.protocol import stop_message
from scheduling.agent.transport import broker_connection, node_queue
from scheduling.services import messaging


def _received(folder, node: str) -> list[dict]:
    with broker_connection("filesystem://", folder) as connection:
        queue = connection.SimpleQueue(node_queue(node))
        out = []
        while True:
            try:
                message = queue.get(timeout=0.1)
            except queue.Empty:
                return out
            out.append(message.payload)
            message.ack()


def _broker(settings, tmp_path):
    # (Node names differ between tests: kombu keeps the filesystem transport's bindings
    # in memory for the whole process, whatever the folder.)
    settings.SLUICE_NODE_TRANSPORT = "broker"
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.SLUICE_BROKER_DIR = str(tmp_path / "broker")
    messaging._drop_connection()


def test_messages_arrive_in_order_over_one_kept_connection(settings, tmp_path, monkeypatch):
    _broker(settings, tmp_path)
    opened: list[Connection] = []
    real = transport.broker_connection

    def counting(*args, **kwargs):
        opened.append(real(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(transport, "broker_connection", counting)
    try:
        messaging.send_node_messages(
            [("n1", stop_message(job_id=i, attempt=1, reason="cancelled")) for i in (1, 2)]
        )
        messaging.send_node_messages(
            [("n2", stop_message(job_id=3, attempt=1, reason="cancelled"))]
        )
        messaging.send_node_messages(
            [("n1", stop_message(job_id=4, attempt=1, reason="cancelled"))]
        )
    finally:
        messaging._drop_connection()
    assert len(opened) == 1
    assert [m["job_id"] for m in _received(settings.SLUICE_BROKER_DIR, "n1")] == [1, 2, 4]
    assert [m["job_id"] for m in _received(settings.SLUICE_BROKER_DIR, "n2")] == [3]


def test_a_failing_connection_is_replaced_once(settings, tmp_path, monkeypatch):
    _broker(settings, tmp_path)
    real = transport.send_control_messages
    calls = []

    def flaky(connection, messages):
        calls.append(connection)
        if len(calls) == 1:
            raise ConnectionError("broker went away")
        real(connection, messages)

    monkeypatch.setattr(transport, "send_control_messages", flaky)
    try:
        messaging.send_node_messages(
            [("retry-1", stop_message(job_id=7, attempt=1, reason="cancelled"))]
        )
    finally:
        messaging._drop_connection()
    assert len(calls) == 2 and calls[0] is not calls[1]
    assert [m["job_id"] for m in _received(settings.SLUICE_BROKER_DIR, "retry-1")] == [7]


def test_a_broker_that_stays_down_is_logged_not_raised(settings, tmp_path, monkeypatch, caplog):
    _broker(settings, tmp_path)

    def down(connection, messages):
        raise ConnectionError("broker down")

    monkeypatch.setattr(transport, "send_control_messages", down)
    messaging.send_node_messages(
        [("retry-1", stop_message(job_id=8, attempt=1, reason="cancelled"))]
    )
    assert "could not send 1 message(s) to node agents" in caplog.text
