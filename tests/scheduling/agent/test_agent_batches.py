"""Reports go in batches: one broker message carries what the agent had ready, in order,
within bounds; a report counts as delivered only once its batch is out."""

import json

import pytest

from scheduling.agent import cli
from scheduling.agent.agent import Outbox
from scheduling.agent.protocol import (
    HEARTBEATS_QUEUE,
    REPORTS_QUEUE,
    REPORTS_TASK,
    report,
    validate_report,
)
from scheduling.agent.transport import CeleryReportSender, broker_connection
from tests.scheduling.agent.helpers import launch, python_job


class BatchSender:
    """Records each batch; fails while ``down``."""

    def __init__(self) -> None:
        self.batches: list[list[dict]] = []
        self.down = False

    def send_batch(self, reports: list[dict]) -> None:
        if self.down:
            raise ConnectionError("broker down")
        self.batches.append(list(reports))

    def __call__(self, one: dict) -> None:  # pragma: no cover - the agent must batch
        raise AssertionError("sent one report alone")


def log(n: int, data: str = "x") -> dict:
    return report("log", "n1", job_id=1, attempt=1, offset=n, data=data)


def test_everything_due_goes_in_one_message_in_order_and_is_confirmed_after_it():
    sender = BatchSender()
    outbox = Outbox(sender.send_batch)
    confirmed = []

    def on_sent(n):
        # The callback runs once the whole batch is out, never before.
        assert len(sender.batches) == 1 and len(sender.batches[0]) == 50
        confirmed.append(n)

    for n in range(50):
        outbox.put(log(n), on_sent=lambda n=n: on_sent(n))
    assert outbox.flush() is True
    (batch,) = sender.batches
    assert [r["offset"] for r in batch] == list(range(50))
    assert confirmed == list(range(50))
    assert len(outbox) == 0


def test_a_failed_batch_stays_queued_whole_and_unconfirmed():
    sender = BatchSender()
    recovered = []
    outbox = Outbox(sender.send_batch, on_recovered=lambda: recovered.append(True))
    confirmed = []
    for n in range(5):
        outbox.put(log(n), on_sent=lambda n=n: confirmed.append(n))
    outbox.put(report("heartbeat", "n1", gpus=[], jobs=[], zombies=[], kills=[], n=1))
    sender.down = True
    assert outbox.flush() is False
    assert outbox.flush() is False  # backing off: not even tried
    assert (sender.batches, confirmed, len(outbox)) == ([], [], 6)
    # Only the newest heartbeat is kept meanwhile; the rest keeps its order.
    outbox.put(log(5), on_sent=lambda: confirmed.append(5))
    outbox.put(report("heartbeat", "n1", gpus=[], jobs=[], zombies=[], kills=[], n=2))
    sender.down = False
    assert outbox.flush(force=True) is True
    (batch,) = sender.batches
    assert [r.get("offset", r.get("n")) for r in batch] == [0, 1, 2, 3, 4, 5, 2]
    assert [r["type"] for r in batch].count("heartbeat") == 1
    assert confirmed == [0, 1, 2, 3, 4, 5] and recovered == [True]


def test_batches_are_bounded_by_count_and_size_and_keep_the_order():
    sender = BatchSender()
    outbox = Outbox(sender.send_batch, max_batch_reports=200, max_batch_bytes=64 * 1024)
    for n in range(450):
        outbox.put(log(n))
    assert outbox.flush() is True
    assert [len(b) for b in sender.batches] == [200, 200, 50]

    sender.batches.clear()
    big = "é" * 20_000  # ~20 KB of text, more as JSON
    for n in range(7):
        outbox.put(log(n, big))
    outbox.put(log(7, "y" * 100_000))  # bigger than a message may be: it goes alone
    outbox.put(log(8))
    assert outbox.flush() is True
    sizes = [len(json.dumps(b)) for b in sender.batches]
    assert all(
        size <= 64 * 1024 for size, b in zip(sizes, sender.batches, strict=True) if len(b) > 1
    )
    assert [r["offset"] for b in sender.batches for r in b] == list(range(9))
    assert [r["offset"] for r in sender.batches[-2]] == [7]


def test_the_agent_sends_its_reports_in_batches(make_agent):
    sender = BatchSender()
    h = make_agent(send_report=sender)
    # Started: register and the first heartbeat went as one message.
    assert [[r["type"] for r in b] for b in sender.batches] == [["register", "heartbeat"]]
    h.send(launch(1, python_job("print('one'); print('two')")))
    h.wait_for(lambda: any(r["type"] == "exited" for b in sender.batches for r in b))
    kinds = [r["type"] for b in sender.batches for r in b]
    assert kinds.index("started") < kinds.index("log") < kinds.index("exited")
    assert h.agent.jobs[(1, 1)].exit_reported  # confirmed once its batch was out
    for batch in sender.batches:
        for one in batch:
            validate_report(one)


def test_the_agent_keeps_a_failed_batch_and_confirms_nothing(make_agent):
    sender = BatchSender()
    h = make_agent(send_report=sender)
    sender.down = True
    h.send(launch(1, python_job("print('out')")))
    h.wait_for(lambda: h.agent.jobs.get((1, 1)) and h.agent.jobs[(1, 1)].exit_queued)
    record = h.agent.jobs[(1, 1)]
    assert (record.exit_reported, record.log_offset) == (False, 0)
    sender.down = False
    assert h.agent.outbox.flush(force=True) is True
    first, again = sender.batches[1:]  # (the first batch of all was the start's)
    kinds = [r["type"] for r in first]
    assert kinds.index("started") < kinds.index("log") < kinds.index("exited")
    # The agent registers again once the broker is back (the control side may have
    # restarted meanwhile): queued after the first batch went, sent in the same flush.
    assert [r["type"] for r in again] == ["register"]
    assert (record.exit_reported, record.log_offset) == (True, len("out\n"))


def test_a_batch_is_one_task_message_on_the_reports_queue(tmp_path):
    broker = tmp_path / "broker"
    sender = CeleryReportSender("filesystem://", broker)
    reports = [log(n) for n in range(25)]
    try:
        sender.send_batch(reports)
    finally:
        sender.close()
    messages = list(broker.glob(f"*.{REPORTS_QUEUE}.msg"))
    assert len(messages) == 1
    with broker_connection("filesystem://", broker) as connection:
        queue = connection.SimpleQueue(REPORTS_QUEUE, accept=["json"])
        message = queue.get(timeout=5)
        assert message.headers["task"] == REPORTS_TASK
        args, kwargs, _ = message.payload
        assert args == [reports] and kwargs == {}
        message.ack()
        with pytest.raises(queue.Empty):
            queue.get(timeout=0.1)
        queue.close()


@pytest.mark.parametrize("flag", ["--reports-queue", "--control-queue"])
def test_the_reports_queue_can_be_chosen(flag, monkeypatch):
    seen = {}

    class Sender:
        def __init__(self, *args, **kwargs):
            seen.update(kwargs)

        def close(self):
            pass

    monkeypatch.setattr("scheduling.agent.transport.CeleryReportSender", Sender)
    monkeypatch.setattr(cli, "_run_once", lambda *args: 0)
    assert cli.main(["--node", "n1", "--simulate", "1xL4", "--once", flag, "other"]) == 0
    assert seen == {"reports_queue": "other", "heartbeats_queue": HEARTBEATS_QUEUE}
    assert cli.main(["--node", "n1", "--simulate", "1xL4", "--once"]) == 0
    assert seen == {"reports_queue": REPORTS_QUEUE, "heartbeats_queue": HEARTBEATS_QUEUE}
    # "": heartbeats with the other reports (a control side that does not drain them).
    args = ["--node", "n1", "--simulate", "1xL4", "--once", "--heartbeats-queue", ""]
    assert cli.main(args) == 0
    assert seen == {"reports_queue": REPORTS_QUEUE, "heartbeats_queue": ""}
