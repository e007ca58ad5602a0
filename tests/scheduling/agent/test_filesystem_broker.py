"""The embedded filesystem broker: readers wake when a message is written (inotify) or
acknowledged, not after a polling interval; messages come in order, each to one reader."""

import threading
import time
import uuid

import pytest
from kombu import Connection

from scheduling.agent import transport
from scheduling.agent.transport import AtomicFilesystemTransport, broker_transport_options

NEEDS_INOTIFY = pytest.mark.skipif(
    transport._inotify_watch("/") is None, reason="no inotify on this system"
)
SLOW_POLL = 5.0  # a reader that only polled would wait this long
WOKEN = 2.0


@pytest.fixture
def name() -> str:
    """A queue name of the test's own: kombu keeps the bindings it declared in the process
    (shared by all connections), so a name bound in another folder would not be here."""
    return f"q-{uuid.uuid4().hex[:8]}"


def connection(folder, polling_interval: float = SLOW_POLL) -> Connection:
    options = {**broker_transport_options("filesystem://", folder)}
    options["polling_interval"] = polling_interval
    return Connection(
        "filesystem://", transport=AtomicFilesystemTransport, transport_options=options
    )


def publish(folder, queue_name: str, bodies) -> None:
    with connection(folder) as conn:
        queue = conn.SimpleQueue(queue_name, serializer="json")
        for body in bodies:
            queue.put(body)
        queue.close()


def publish_later(folder, queue_name: str, body, delay: float = 0.2) -> threading.Timer:
    timer = threading.Timer(delay, publish, args=[folder, queue_name, [body]])
    timer.start()
    return timer


@NEEDS_INOTIFY
def test_a_waiting_reader_gets_a_new_message_at_once(tmp_path, name):
    with connection(tmp_path) as conn:
        queue = conn.SimpleQueue(name, accept=["json"])
        with pytest.raises(queue.Empty):
            queue.get(timeout=0.1)  # the reader is set up and has looked once
        publish_later(tmp_path, name, {"n": 1}).join()
        began = time.monotonic()
        message = queue.get(timeout=SLOW_POLL * 2)
        assert time.monotonic() - began < WOKEN
        assert message.payload == {"n": 1}
        message.ack()
        queue.close()


@NEEDS_INOTIFY
def test_other_files_in_the_folder_do_not_wake_the_reader(tmp_path):
    changes = transport.FolderChanges(str(tmp_path))
    try:
        (tmp_path / "x.q.msg.tmp").write_text("{}")  # a message being written
        assert changes.wait(0.2) is False
        (tmp_path / "x.q.msg.tmp").rename(tmp_path / "x.q.msg")  # ... and complete
        assert changes.wait(0.2) is True
    finally:
        changes.close()


def test_without_inotify_the_reader_polls(tmp_path, monkeypatch, name):
    monkeypatch.setattr(transport, "_inotify_watch", lambda folder: None)
    with connection(tmp_path, polling_interval=0.05) as conn:
        queue = conn.SimpleQueue(name, accept=["json"])
        publish_later(tmp_path, name, {"n": 1})
        message = queue.get(timeout=5)
        assert message.payload == {"n": 1}
        message.ack()
        queue.close()


def test_an_acknowledgement_wakes_a_reader_whose_prefetch_is_full(tmp_path, name):
    publish(tmp_path, name, [{"n": 1}, {"n": 2}])
    with connection(tmp_path) as conn:
        queue = conn.SimpleQueue(name, accept=["json"])
        queue.consumer.qos(prefetch_count=1)
        first = queue.get(timeout=1)
        got = []

        def read_next():
            got.append(queue.get(timeout=SLOW_POLL * 2))

        # As in a Celery worker: one thread waits for the next message, another acks.
        reader = threading.Thread(target=read_next)
        reader.start()
        time.sleep(0.2)
        began = time.monotonic()
        first.ack()
        reader.join(timeout=SLOW_POLL * 2)
        assert time.monotonic() - began < WOKEN
        assert got[0].payload == {"n": 2}
        got[0].ack()
        queue.close()


def test_messages_come_in_order_each_to_one_reader(tmp_path, name):
    publish(tmp_path, name, [{"n": n} for n in range(200)])
    publish(tmp_path, f"{name}-other", [{"n": -1}])
    got: list[list[int]] = [[], []]

    def read(into):
        with connection(tmp_path, polling_interval=0.05) as conn:
            queue = conn.SimpleQueue(name, accept=["json"])
            while True:
                try:
                    message = queue.get(timeout=0.5)
                except queue.Empty:
                    break
                into.append(message.payload["n"])
                message.ack()
            queue.close()

    readers = [threading.Thread(target=read, args=[into]) for into in got]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(timeout=30)
    assert sorted(got[0] + got[1]) == list(range(200))  # none lost, none twice
    # Each reader takes the oldest first: the order they were written in, within a
    # millisecond too (one writer).
    assert all(into == sorted(into) for into in got)
    # The other queue's message is untouched, and no claimed file is left behind.
    assert [p.name.split(".", 1)[1] for p in tmp_path.glob("*.msg")] == [f"{name}-other.msg"]
    assert not list(tmp_path.glob("*.claimed"))
