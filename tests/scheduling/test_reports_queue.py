"""Report messages in batches across messages: a worker that receives one from the reports
queue also takes the report messages waiting behind it and applies them together
(``scheduling.services.reports_queue``).

Over the embedded filesystem broker (a folder of this test's own), through the agents'
real sender: each agent's batch is a message of its own, as a fleet of agents sends.
"""

import os
import socket
import subprocess
import time
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone
from kombu import Exchange, Queue

from scheduling.agent.protocol import REPORTS_QUEUE
from scheduling.agent.transport import broker_connection
from scheduling.choices import JobState
from scheduling.services import reports_queue
from scheduling.services.nodes import REPORTS_BATCH_KEY, REPORTS_PROBE_KEY
from scheduling.tasks import agent_report, agent_reports, heartbeats_drain, reports_probe

from .test_agent_reports import _placed_job
from .test_heartbeats_drain import _waiting
from .test_node_heartbeats_apply import _beat, _running_job
from .test_report_batches import _exited, _log, _started


@pytest.fixture(autouse=True)
def _marks(settings, tmp_path):
    """No probe or batch remembered from another test; job logs in the test's folder."""
    settings.SLUICE_LOG_DIR = tmp_path / "logs"
    cache.clear()
    yield
    cache.clear()
    reports_queue._reset()


def _delivered(task, *args):
    """Run ``task`` as a worker runs a message it received from the reports queue."""
    task.push_request(
        args=args, is_eager=False, delivery_info={"exchange": "", "routing_key": REPORTS_QUEUE}
    )
    try:
        return task.run(*args)
    finally:
        task.pop_request()


@pytest.fixture
def batches(monkeypatch):
    """The sizes of the batches applied (reports per call of agent_reports_process)."""
    sizes = []
    process = reports_queue.agent_reports_process

    def counted(*, reports):
        sizes.append(len(reports))
        return process(reports=reports)

    monkeypatch.setattr(reports_queue, "agent_reports_process", counted)
    return sizes


def _jobs(world, count):
    jobs = [_placed_job(world) for _ in range(count)]
    assert len({job.pk for job, _ in jobs}) == count
    return jobs


def test_the_messages_waiting_behind_are_applied_with_the_received_one(
    world, send, broker, batches
):
    (first, node), *others = _jobs(world, 3)
    for job, on in others:
        send([_started(on, job)])
    send([_log(node, first, 0, "hello\n")])

    result = _delivered(agent_reports, [_started(node, first)])

    assert batches == [4]  # its own report and the three waiting: one batch
    assert result["messages"] == 3 and result["reports"] == 4 and result["failed"] == 0
    for job, _ in [(first, node), *others]:
        job.refresh_from_db()
        assert job.state == JobState.RUNNING
    assert _waiting(broker, REPORTS_QUEUE) == []  # taken and acknowledged
    assert cache.get(REPORTS_BATCH_KEY) is None


def test_a_nodes_reports_keep_their_order_across_messages(world, send, broker):
    (job, node), (other, other_node) = _jobs(world, 2)
    send([_started(node, job)])
    send([_log(node, job, 0, "done\n")])
    send([_exited(node, job)])

    _delivered(agent_reports, [_started(other_node, other)])

    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert job.started_at is not None  # started, then ended: not ended unstarted
    kinds = list(job.events.order_by("pk").values_list("kind", flat=True))
    assert kinds.index("started") < kinds.index("succeeded")


def test_with_nothing_waiting_the_message_is_applied_at_once_alone(world, broker, batches):
    job, node = _placed_job(world)
    result = _delivered(agent_reports, [_started(node, job)])
    assert batches == [1] and result["messages"] == 0
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert cache.get(REPORTS_BATCH_KEY) is None


def test_an_older_agents_single_report_takes_the_waiting_ones_too(world, send, broker):
    (job, node), (other, other_node) = _jobs(world, 2)
    send([_started(other_node, other)])
    result = _delivered(agent_report, _started(node, job))
    assert result["messages"] == 1 and result["reports"] == 2
    for each in (job, other):
        each.refresh_from_db()
        assert each.state == JobState.RUNNING


def test_eager_tasks_and_direct_calls_take_nothing(world, send, broker):
    (job, node), (other, other_node) = _jobs(world, 2)
    waiting = _started(other_node, other)
    send([waiting])
    agent_reports.apply(args=[[_started(node, job)]])
    agent_reports([_log(node, job, 0, "x")])
    other.refresh_from_db()
    assert other.state == JobState.ADMITTED
    assert _waiting(broker, REPORTS_QUEUE) == [waiting]


def test_only_one_process_takes_messages_at_a_time(world, send, broker, batches):
    """Another process applies a batch it took: this one applies its own message alone, so
    that two batches applied at once do not put a job's exit before its start."""
    (job, node), (other, other_node) = _jobs(world, 2)
    waiting = _started(other_node, other)
    send([waiting])
    cache.set(REPORTS_BATCH_KEY, "another process", timeout=60)

    result = _delivered(agent_reports, [_started(node, job)])

    assert batches == [1] and result["messages"] == 0
    assert _waiting(broker, REPORTS_QUEUE) == [waiting]
    assert cache.get(REPORTS_BATCH_KEY) == "another process"  # not ours to release


def _held(taken_at, pid=None):
    """The batch key, held by a process of this host (alive: this one) since ``taken_at``."""
    token = f"{taken_at:.6f} {socket.gethostname()} {pid or os.getpid()} other"
    cache.set(REPORTS_BATCH_KEY, token, timeout=60)


def test_a_message_received_while_an_older_batch_applies_waits_for_it(
    world, send, broker, batches, monkeypatch
):
    """Its message came after all of that batch's: applied beside them, a job's exit could
    come before its start. It waits, then takes what waits behind it."""
    (job, node), (other, other_node) = _jobs(world, 2)
    send([_started(other_node, other)])
    _held(time.time() - 1)
    waited = []

    def batch_done(seconds):
        waited.append(seconds)
        cache.delete(REPORTS_BATCH_KEY)  # the other process acknowledged its batch

    monkeypatch.setattr(reports_queue.time, "sleep", batch_done)

    result = _delivered(agent_reports, [_started(node, job)])

    assert waited == [reports_queue.BATCH_POLL_SECONDS]
    assert batches == [2] and result["messages"] == 1


@pytest.mark.parametrize("taken", [+5, -(reports_queue.BATCH_WAIT_SECONDS + 5)])
def test_no_wait_for_a_later_batch_nor_one_whose_worker_died(
    world, send, broker, batches, monkeypatch, taken
):
    """A batch taken after the message was received holds only later messages; one taken
    long ago is taken for dead (its messages come back anyway)."""
    job, node = _placed_job(world)
    _held(time.time() + taken)
    monkeypatch.setattr(reports_queue.time, "sleep", lambda s: pytest.fail("waited"))
    result = _delivered(agent_reports, [_started(node, job)])
    assert batches == [1] and result["messages"] == 0


def test_no_wait_for_a_batch_whose_process_is_gone(world, broker, batches, monkeypatch):
    """A worker killed while it held the key, started again on the same host: its messages
    come back, nothing to wait for."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    job, node = _placed_job(world)
    _held(time.time() - 1, pid=gone.pid)
    monkeypatch.setattr(reports_queue.time, "sleep", lambda s: pytest.fail("waited"))
    _delivered(agent_reports, [_started(node, job)])
    assert batches == [1]


def test_a_batch_that_fails_puts_its_messages_back_in_order(world, send, broker, monkeypatch):
    (job, node), (other, other_node) = _jobs(world, 2)
    waiting = [_started(other_node, other), _log(other_node, other, 0, "x")]
    for report in waiting:
        send([report])

    def lost(*, reports):
        raise RuntimeError("the worker lost its database")

    monkeypatch.setattr(reports_queue, "agent_reports_process", lost)
    with pytest.raises(RuntimeError):
        _delivered(agent_reports, [_started(node, job)])

    assert cache.get(REPORTS_BATCH_KEY) is None
    assert _waiting(broker, REPORTS_QUEUE) == waiting  # none lost


def test_probes_taken_with_reports_are_recorded_once_those_are_applied(
    world, send, broker, monkeypatch
):
    (job, node), (other, other_node) = _jobs(world, 2)
    sent = timezone.now().timestamp()
    send([_started(other_node, other)])
    with broker_connection("filesystem://", broker) as connection:
        from celery import Celery

        app = Celery("test-probe", set_as_current=False, fixups=[])
        app.send_task(
            "scheduling.reports_probe", args=[sent], queue=REPORTS_QUEUE, connection=connection
        )
    seen = []
    process = reports_queue.agent_reports_process

    def applied(*, reports):
        seen.append(cache.get(REPORTS_PROBE_KEY))  # not recorded before the reports
        return process(reports=reports)

    monkeypatch.setattr(reports_queue, "agent_reports_process", applied)

    result = _delivered(agent_reports, [_started(node, job)])

    assert result["messages"] == 2 and result["probes"] == 1
    assert seen == [None]
    assert cache.get(REPORTS_PROBE_KEY) == sent
    other.refresh_from_db()
    assert other.state == JobState.RUNNING


def test_a_probe_received_takes_the_reports_behind_it(world, send, broker):
    job, node = _placed_job(world)
    send([_started(node, job)])
    sent = timezone.now().timestamp()
    result = _delivered(reports_probe, sent)
    assert result["messages"] == 1 and cache.get(REPORTS_PROBE_KEY) == sent
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


def test_a_foreign_task_on_the_queue_is_left_to_a_worker(world, send, broker):
    (job, node), (other, other_node) = _jobs(world, 2)
    with broker_connection("filesystem://", broker) as connection:
        queue = Queue(REPORTS_QUEUE, Exchange(REPORTS_QUEUE, type="direct"), REPORTS_QUEUE)
        connection.Producer(serializer="json").publish(
            [[1], {}, {}],
            headers={"task": "scheduling.dispatch", "id": "x"},
            declare=[queue],
            routing_key=queue.name,
        )
    later = _started(other_node, other)
    send([later])

    result = _delivered(agent_reports, [_started(node, job)])

    assert result["messages"] == 0  # stopped at the foreign message, put back
    other.refresh_from_db()
    assert other.state == JobState.ADMITTED
    with broker_connection("filesystem://", broker) as connection:
        simple = connection.SimpleQueue(REPORTS_QUEUE, accept=["json"])
        left = [simple.get_nowait() for _ in range(2)]
        assert {m.headers.get("task") for m in left} == {
            "scheduling.dispatch",
            "scheduling.agent_reports",
        }
        for message in left:
            message.ack()
        simple.close()


def test_a_drained_heartbeat_waits_for_the_reports_a_batch_took(world, send, broker, monkeypatch):
    """An executor that lists only running jobs (Kubernetes): the job's ``exited`` report
    was taken off the reports queue by a batch and is not applied yet when the heartbeats
    are drained; the queue is empty, but the heartbeat that no longer lists the job must not
    make it lost."""
    job, node = _running_job(world)
    now = timezone.now()
    cache.set(REPORTS_PROBE_KEY, (now - timedelta(seconds=30)).timestamp(), timeout=None)
    (other, other_node) = _placed_job(world)
    send([_exited(node, job)])
    send([_beat(node, sent_at=now)])  # on the heartbeats queue
    process = reports_queue.agent_reports_process

    def drained_meanwhile(*, reports):
        heartbeats_drain()  # another worker process drains the heartbeats now
        job.refresh_from_db()
        assert job.state == JobState.RUNNING
        return process(reports=reports)

    monkeypatch.setattr(reports_queue, "agent_reports_process", drained_meanwhile)

    _delivered(agent_reports, [_started(other_node, other)])

    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert not job.events.filter(kind="lost").exists()
