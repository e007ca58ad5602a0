"""Log shipping and report delivery: chunks, offsets, UTF-8 boundaries, broker outages."""

import pytest

from scheduling.agent.agent import Outbox, utf8_complete_length
from tests.scheduling.agent.helpers import launch, python_job, release, waiting_job


@pytest.mark.parametrize(
    ("data", "length"),
    [
        (b"", 0),
        (b"abc", 3),
        ("é".encode(), 2),
        ("é".encode()[:1], 0),
        (b"a" + "€".encode()[:2], 1),
        (b"a" + "😀".encode()[:3], 1),
        (b"a" + "😀".encode(), 5),
        (b"\x80\x80", 2),  # invalid: sent as is (replaced when decoded)
    ],
)
def test_utf8_complete_length(data, length):
    assert utf8_complete_length(data) == length


def test_large_output_comes_in_bounded_chunks_without_broken_characters(make_agent):
    h = make_agent(log_chunk_bytes=1000)
    h.send(launch(1, python_job("print('é€😀' * 20000)")))
    h.wait_report("exited", 1)
    logs = h.of_type("log", 1)
    assert len(logs) > 100
    offset = 0
    for chunk in logs:
        assert chunk["offset"] == offset
        size = len(chunk["data"].encode())
        assert 0 < size <= 1000
        offset += size
    assert "".join(c["data"] for c in logs) == "é€😀" * 20000 + "\n"
    assert "\ufffd" not in h.log_text(1)
    assert h.reports.index(logs[-1]) < h.reports.index(h.of_type("exited", 1)[0])


def test_output_is_shipped_while_the_job_runs(make_agent, tmp_path):
    h = make_agent()
    h.send(launch(2, waiting_job(tmp_path / "go")))
    h.wait_for(lambda: h.log_text(2) == "waiting\n")
    assert not h.of_type("exited", 2)
    release(tmp_path / "go")
    h.wait_report("exited", 2)
    assert h.log_text(2) == "waiting\n"


def test_outbox_keeps_order_and_retries_after_failures():
    sent, failing = [], [True]

    def send(reports):  # the outbox sends batches (lists), see test_agent_batches.py
        if failing[0]:
            raise ConnectionError("down")
        sent.extend(report["n"] for report in reports)

    recovered = []
    outbox = Outbox(send, on_recovered=lambda: recovered.append(True))
    delivered = []
    outbox.put({"type": "log", "n": 1}, on_sent=lambda: delivered.append(1))
    outbox.put({"type": "heartbeat", "n": 2})
    outbox.put({"type": "exited", "n": 3})
    outbox.put({"type": "heartbeat", "n": 4})  # replaces the older heartbeat
    assert outbox.flush() is False
    assert outbox.flush() is False  # backing off: not even tried
    failing[0] = False
    assert outbox.flush(force=True) is True
    assert sent == [1, 3, 4]
    assert delivered == [1] and recovered == [True]


def test_reports_survive_a_broker_outage(make_agent):
    down = [True]
    received = []

    def send(report):
        if down[0]:
            raise ConnectionError("broker down")
        received.append(report)

    h = make_agent(send_report=send)
    h.send(launch(3, python_job("print('hello')")))
    h.wait_for(lambda: h.agent.jobs.get((3, 1)) and h.agent.jobs[(3, 1)].finished)
    h.agent.tick(0)
    assert received == [] and len(h.agent.outbox) > 0
    down[0] = False
    h.agent.outbox.flush(force=True)
    kinds = [r["type"] for r in received]
    assert kinds[0] == "register"
    assert kinds.index("started") < kinds.index("log") < kinds.index("exited")
    assert kinds.count("heartbeat") == 1
    # The agent registers again once the broker is back (the control side may have restarted).
    assert kinds.count("register") == 2
