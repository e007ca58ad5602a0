"""Heartbeats batched across messages: agents send them to the heartbeats queue, and each
drain (``scheduling.heartbeats_drain``) applies every message waiting there as one batch.

Over the embedded filesystem broker (a folder of this test's own), through the agents'
real sender: each node's heartbeat is a message of its own, as a fleet of agents sends.
"""

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone
from kombu import Exchange, Queue

from scheduling.agent.protocol import HEARTBEATS_QUEUE, REPORT_TASK, REPORTS_QUEUE
from scheduling.agent.transport import broker_connection
from scheduling.choices import JobState, NodeState
from scheduling.models import Gpu, Node
from scheduling.services import heartbeats as heartbeats_service
from scheduling.services.nodes import (
    HEARTBEATS_DRAINED_KEY,
    nodes_sweep_lost,
    reports_handled_until,
    reports_probe_record,
)
from scheduling.tasks import agent_reports, heartbeats_drain

from .test_agent_reports import _placed_job
from .test_node_heartbeats_apply import _beat, _busy, _node, _running_job
from .test_report_batches import _exited, _log, _started


@pytest.fixture(autouse=True)
def _marks():
    """No probe, drain or missing job remembered from another test (the ids repeat)."""
    cache.clear()
    yield
    cache.clear()


def _waiting(broker, queue):
    """The reports of the messages left on ``queue`` (taken off it)."""
    reports = []
    with broker_connection("filesystem://", broker) as connection:
        simple = connection.SimpleQueue(queue, accept=["json"])
        while True:
            try:
                message = simple.get_nowait()
            except simple.Empty:
                break
            reports += message.payload[0][0]
            message.ack()
        simple.close()
    return reports


@pytest.fixture
def nodes(world):
    """A node running a two-GPU job and three idle nodes."""
    job, node = _running_job(world)
    return job, node, [_node(world, f"gpu-1{i}") for i in range(3)]


def test_heartbeats_of_many_messages_are_applied_as_one_batch(nodes, send, broker, monkeypatch):
    job, node, idle = nodes
    now = timezone.now()
    send([_beat(node, jobs=[job], sent_at=now, busy=_busy(job, node))])
    for other in idle:
        send([_beat(other, sent_at=now)])
    batches = []
    process = heartbeats_service.agent_reports_process
    monkeypatch.setattr(
        heartbeats_service,
        "agent_reports_process",
        lambda *, reports: batches.append(len(reports)) or process(reports=reports),
    )

    result = heartbeats_drain()

    assert batches == [4]  # four messages, one batch
    assert result["messages"] == 4 and result["heartbeats"] == 4 and result["failed"] == 0
    assert result["lag_max_s"] >= result["lag_min_s"] >= 0
    assert result["cpu_ms"] > 0
    for each in [node, *idle]:
        each.refresh_from_db()
        assert each.last_heartbeat is not None
        assert set(Gpu.objects.filter(node=each).values_list("sampled_at", flat=True)) == {now}
    job.refresh_from_db()
    assert job.last_active_at == now
    assert _waiting(broker, HEARTBEATS_QUEUE) == []  # taken and acknowledged
    assert cache.get(HEARTBEATS_DRAINED_KEY) is not None


def test_a_heartbeat_older_than_one_applied_does_not_undo_it(nodes, send):
    job, node, _ = nodes
    now = timezone.now()
    send([_beat(node, jobs=[job], sent_at=now, busy=_busy(job, node))])
    heartbeats_drain()
    # An older heartbeat of the node, delivered late (a redelivery, a slow agent's outbox),
    # with every GPU idle and other zombies.
    older = _beat(node, jobs=[job], sent_at=now - timedelta(seconds=20))
    older["zombies"] = [{"gpu_index": 7, "pid": 66, "memory_mb": 10, "name": "python"}]
    send([older])
    assert heartbeats_drain()["heartbeats"] == 1
    gpus = Gpu.objects.filter(node=node)
    assert set(gpus.values_list("sampled_at", flat=True)) == {now}
    assert {g.utilization for g in gpus if g.index in _busy(job, node)} == {90.0}
    node.refresh_from_db()
    assert node.zombies == []
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert job.last_active_at == now


def test_activity_of_older_heartbeats_in_other_messages_counts(nodes, send):
    job, node, _ = nodes
    now = timezone.now()
    busy_at = now - timedelta(seconds=10)
    # The node's agent sent twice before a drain: busy, then idle.
    send([_beat(node, jobs=[job], sent_at=busy_at, busy=_busy(job, node))])
    send([_beat(node, jobs=[job], sent_at=now)])
    result = heartbeats_drain()
    assert result["heartbeats"] == 2
    gpus = Gpu.objects.filter(node=node)
    assert set(gpus.values_list("sampled_at", flat=True)) == {now}  # the newest applied
    assert set(gpus.values_list("utilization", flat=True)) == {0.0}
    job.refresh_from_db()
    assert job.last_active_at == busy_at  # the older one's activity, at its own moment


def test_a_failure_in_one_nodes_heartbeat_does_not_lose_the_others(nodes, send):
    job, node, (bad_node, other, _) = nodes
    now = timezone.now()
    bad = _beat(bad_node, sent_at=now)
    del bad["gpus"][0]["index"]  # its handler fails on it
    send([_beat(node, jobs=[job], sent_at=now, busy=_busy(job, node))])
    send([bad])
    send([_beat(other, sent_at=now)])
    result = heartbeats_drain()
    assert result["failed"] == 1 and result["messages"] == 3
    job.refresh_from_db()
    assert job.last_active_at == now
    assert set(Gpu.objects.filter(node=other).values_list("sampled_at", flat=True)) == {now}
    assert set(Gpu.objects.filter(node=bad_node).values_list("sampled_at", flat=True)) == {None}


def test_a_drain_that_fails_leaves_its_messages_for_the_next(nodes, send, broker, monkeypatch):
    job, node, _ = nodes
    now = timezone.now()
    send([_beat(node, jobs=[job], sent_at=now, busy=_busy(job, node))])
    process = heartbeats_service.agent_reports_process

    def killed(*, reports):
        raise RuntimeError("worker lost its database")

    monkeypatch.setattr(heartbeats_service, "agent_reports_process", killed)
    with pytest.raises(RuntimeError):
        heartbeats_drain()
    assert cache.get(HEARTBEATS_DRAINED_KEY) is None
    monkeypatch.setattr(heartbeats_service, "agent_reports_process", process)
    assert heartbeats_drain()["heartbeats"] == 1  # delivered again
    job.refresh_from_db()
    assert job.last_active_at == now


def test_messages_drained_in_chunks(nodes, send, monkeypatch):
    job, node, idle = nodes
    now = timezone.now()
    for each in [node, *idle]:
        send([_beat(each, sent_at=now)])
    monkeypatch.setattr(heartbeats_service, "MESSAGES_PER_CHUNK", 3)
    result = heartbeats_drain()
    assert result["messages"] == 4 and result["heartbeats"] == 4
    assert Gpu.objects.filter(sampled_at=now).count() == 4 * 8


def test_an_older_agents_single_report_and_a_foreign_message(world, broker):
    job, node = _running_job(world)
    now = timezone.now()
    with broker_connection("filesystem://", broker) as connection:
        queue = Queue(HEARTBEATS_QUEUE, Exchange(HEARTBEATS_QUEUE, type="direct"), HEARTBEATS_QUEUE)
        producer = connection.Producer(serializer="json")
        # A report as agents before batches sent it (one report, protocol 2), and a body
        # that is no report task: dropped, never delivered again.
        beat = _beat(node, jobs=[job], sent_at=now, busy=_busy(job, node))
        producer.publish(
            [[beat], {}, {}], headers={"task": REPORT_TASK}, declare=[queue], routing_key=queue.name
        )
        producer.publish({"hello": "world"}, declare=[queue], routing_key=queue.name)
    result = heartbeats_drain()
    assert result["messages"] == 2 and result["heartbeats"] == 1 and result["dropped"] == 1
    job.refresh_from_db()
    assert job.last_active_at == now
    assert heartbeats_drain()["messages"] == 0


def test_the_sender_puts_heartbeats_on_their_queue_and_the_rest_on_reports(world, send, broker):
    job, node = _running_job(world)
    beat = _beat(node, jobs=[job], sent_at=timezone.now())
    started = _started(node, job)
    send([started, beat])
    assert _waiting(broker, REPORTS_QUEUE) == [started]
    assert _waiting(broker, HEARTBEATS_QUEUE) == [beat]
    # A heartbeat alone sends nothing to the reports queue (and the reverse).
    send([beat])
    send([started])
    assert _waiting(broker, REPORTS_QUEUE) == [started]
    assert _waiting(broker, HEARTBEATS_QUEUE) == [beat]


def test_without_a_heartbeats_queue_the_sender_keeps_them_with_the_reports(world, send, broker):
    job, node = _running_job(world)
    beat = _beat(node, jobs=[job], sent_at=timezone.now())
    started = _started(node, job)
    send([started, beat], heartbeats_queue="")
    assert _waiting(broker, REPORTS_QUEUE) == [started, beat]
    assert _waiting(broker, HEARTBEATS_QUEUE) == []


def test_heartbeats_in_the_reports_queue_are_still_handled(nodes):
    """An agent older than the heartbeats queue: its heartbeats come with its reports."""
    job, node, _ = nodes
    now = timezone.now()
    agent_reports([_beat(node, jobs=[job], sent_at=now, busy=_busy(job, node))])
    job.refresh_from_db()
    assert job.last_active_at == now


def test_nodes_are_not_judged_while_the_heartbeats_are_not_drained(world):
    # The probes come back (the reports queue flows) but no drain emptied the heartbeats
    # queue for 20 minutes: the nodes' last heartbeats stopped then too.
    now = timezone.now()
    reports_probe_record(sent_at=now.timestamp())
    cache.set(HEARTBEATS_DRAINED_KEY, (now - timedelta(minutes=20)).timestamp())
    Node.objects.update(last_heartbeat=now - timedelta(minutes=20))
    assert abs((reports_handled_until(now) - (now - timedelta(minutes=20))).total_seconds()) < 1
    assert nodes_sweep_lost(now) == []
    assert set(Node.objects.values_list("state", flat=True)) == {NodeState.READY}
    # Drained again: the silent nodes are judged by the clock.
    cache.set(HEARTBEATS_DRAINED_KEY, now.timestamp())
    assert reports_handled_until(now) == now
    assert len(nodes_sweep_lost(now)) == Node.objects.count()


def test_the_drain_runs_every_second_from_beat(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["heartbeats-drain"]
    assert entry["task"] == "scheduling.heartbeats_drain"
    assert entry["schedule"].run_every == timedelta(seconds=settings.SLUICE_HEARTBEAT_DRAIN_SECONDS)
    # On the control queue: a backlog of reports does not hold the heartbeats back.
    assert settings.CELERY_TASK_ROUTES["scheduling.heartbeats_drain"] == {"queue": "control"}


def _behind(send, node, job):
    """The reports queue is behind: a report waits there, and the last probe that came
    back was sent 30 s ago."""
    send([_log(node, job, 0, "x")])
    reports_probe_record(sent_at=(timezone.now() - timedelta(seconds=30)).timestamp())


def test_a_heartbeat_that_overtakes_the_exit_does_not_lose_the_job(nodes, send, broker):
    """An executor that lists only running jobs (Kubernetes): the job ended, its ``exited``
    report waits on the reports queue (behind a backlog) while the next heartbeat, which
    no longer lists it, is drained first."""
    job, node, _ = nodes
    now = timezone.now()
    _behind(send, node, job)
    send([_exited(node, job)])
    send([_beat(node, sent_at=now)])
    heartbeats_drain()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING  # not judged before the reports are handled
    agent_reports(_waiting(broker, REPORTS_QUEUE))  # the reports, handled at last
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


def test_a_job_the_agent_forgot_is_lost_once_the_reports_caught_up(nodes, send):
    job, node, _ = nodes
    now = timezone.now()
    _behind(send, node, job)
    send([_beat(node, sent_at=now - timedelta(seconds=10))])
    heartbeats_drain()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    # A probe sent after that heartbeat came back: no exit was waiting for the job.
    reports_probe_record(sent_at=(now - timedelta(seconds=5)).timestamp())
    send([_beat(node, sent_at=now)])
    heartbeats_drain()
    job.refresh_from_db()
    assert job.state != JobState.RUNNING
    assert job.events.filter(message__contains="no longer runs it").exists()


def test_with_no_report_waiting_a_missing_job_is_lost_at_once(nodes, send):
    """Nothing its agent sent before is still to come (an exit lost with a killed worker,
    an agent that lost the job): the heartbeat repairs at once."""
    job, node, _ = nodes
    reports_probe_record(sent_at=(timezone.now() - timedelta(seconds=30)).timestamp())
    send([_beat(node, sent_at=timezone.now())])
    heartbeats_drain()
    job.refresh_from_db()
    assert job.state != JobState.RUNNING


def test_heartbeats_with_the_reports_judge_a_missing_job_at_once(nodes):
    """The path of agents older than the heartbeats queue is as it was."""
    job, node, _ = nodes
    now = timezone.now()
    reports_probe_record(sent_at=(now - timedelta(seconds=30)).timestamp())
    agent_reports([_beat(node, sent_at=now)])
    job.refresh_from_db()
    assert job.state != JobState.RUNNING


def test_a_start_is_left_to_its_report_while_the_reports_are_behind(world, send, broker):
    job, node = _placed_job(world)  # ADMITTED: its started report waits on the reports queue
    now = timezone.now()
    listed = [{"job_id": job.pk, "attempt": job.attempt, "pid": 7, "running": True}]
    send([_started(node, job)])
    reports_probe_record(sent_at=(now - timedelta(seconds=30)).timestamp())
    send([{**_beat(node, sent_at=now - timedelta(seconds=10)), "jobs": listed}])
    heartbeats_drain()
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED  # not started one by one from the heartbeat
    # The reports caught up, but the started report was lost (a killed worker took it):
    # the next heartbeat starts the job.
    assert _waiting(broker, REPORTS_QUEUE)[0]["type"] == "started"
    send([_log(node, job, 0, "x")])  # still busy
    reports_probe_record(sent_at=(now - timedelta(seconds=5)).timestamp())
    send([{**_beat(node, sent_at=now), "jobs": listed}])
    heartbeats_drain()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


def test_an_exit_in_a_heartbeat_is_left_to_its_report_while_the_reports_are_behind(nodes, send):
    job, node, _ = nodes
    now = timezone.now()
    ended = {
        "job_id": job.pk,
        "attempt": job.attempt,
        "pid": 7,
        "running": False,
        "stop_reason": None,
        "exit_code": 3,
        "signal": None,
        "finished_at": (now - timedelta(seconds=12)).timestamp(),
        "message": "",
    }
    _behind(send, node, job)
    send([{**_beat(node, sent_at=now - timedelta(seconds=10)), "jobs": [ended]}])
    heartbeats_drain()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    reports_probe_record(sent_at=(now - timedelta(seconds=5)).timestamp())
    send([{**_beat(node, sent_at=now), "jobs": [ended]}])
    heartbeats_drain()
    job.refresh_from_db()
    assert job.state == JobState.FAILED  # as the exit said
