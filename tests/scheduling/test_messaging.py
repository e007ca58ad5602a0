"""Messages to node agents go over a broker connection each thread keeps (a dispatch cycle
sends launches every second: connecting each time cost more than publishing), in order,
straight onto each node's queue (no exchange lookup), on Redis in one pipeline per batch; a
broken connection is replaced once."""

from __future__ import annotations

import uuid

import pytest
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


def test_on_redis_a_batch_is_one_pipeline_without_exchange_lookups(settings, monkeypatch):
    """The broker of production: messages reach the agent's consumer in order, and a batch
    costs one round trip (one pipeline of LPUSHes), not a bindings lookup and a push per
    message. Runs where the settings' broker is Redis (the PostgreSQL stage of .ci/run)."""
    url = settings.CELERY_BROKER_URL
    if not url.startswith("redis://"):
        pytest.skip("needs Redis as CELERY_BROKER_URL (see .ci/run)")
    import redis

    calls: list[str] = []
    real_execute = redis.Redis.execute_command
    real_pipeline_execute = redis.client.Pipeline.execute

    def execute(self, *args, **options):
        calls.append(str(args[0]).upper())
        return real_execute(self, *args, **options)

    def pipeline_execute(self, *args, **kwargs):
        calls.append(f"PIPELINE({len(self.command_stack)})")
        return real_pipeline_execute(self, *args, **kwargs)

    node = f"redis-{uuid.uuid4().hex[:8]}"
    with broker_connection(url, None) as connection:
        connection.ensure_connection()
        monkeypatch.setattr(redis.Redis, "execute_command", execute)
        monkeypatch.setattr(redis.client.Pipeline, "execute", pipeline_execute)
        transport.send_control_messages(
            connection,
            [(node, stop_message(job_id=i, attempt=1, reason="cancelled")) for i in (1, 2, 3)],
        )
        monkeypatch.undo()
        assert calls == ["PIPELINE(3)"]
        queue = connection.SimpleQueue(node_queue(node), accept=["json"])
        try:
            received = []
            for _ in range(3):
                message = queue.get(timeout=5)
                received.append(message.payload["job_id"])
                message.ack()
        finally:
            queue.close()
            redis.Redis.from_url(url).delete(node_queue(node).name)
    assert received == [1, 2, 3]
