"""Heartbeats of several nodes applied together (``nodes.node_heartbeats_apply``, the path
of a batch's heartbeats): the same outcome as one at a time, a fixed number of statements
for any number of nodes, and a heartbeat that cannot be applied loses only itself."""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time

from audit.models import AuditEvent
from audit.services import audit_record
from scheduling.choices import JobState, NodeState
from scheduling.models import Gpu, Job, Node
from scheduling.services.dispatch import dispatch_cycle
from scheduling.services.nodes import node_heartbeat, node_heartbeats_apply
from scheduling.tasks import agent_reports
from tests import factories as f

from .test_agent_reports import _placed_job, _report


def _node(world, name):
    node = f.NodeFactory(name=name, pool=world.queue.pool)
    for i in range(8):
        f.GpuFactory(node=node, index=i, uuid=f"GPU-{name}-{i}")
    return node


def _running_job(world, gpus=2):
    if gpus == 2:
        job, node = _placed_job(world)
    else:
        job = f.JobFactory(  # the other tenant's: one tenant's quota is 8 GPUs
            queue=world.other_queue,
            project=world.other_project,
            submitted_by=world.outsider,
            gpus_per_node=gpus,
        )
        dispatch_cycle()
        job.refresh_from_db()
        node = job.allocations.first().node
    started = (timezone.now() - timedelta(minutes=5)).timestamp()
    job = _report("started", node, job, pid=4242, started_at=started)
    assert job.state == JobState.RUNNING
    return job, node


def _beat(node, *, jobs=(), sent_at, busy=(), zombies=None):
    return {
        "type": "heartbeat",
        "node": node.name,
        "sent_at": sent_at.timestamp(),
        "gpus": [
            {
                "index": i,
                "utilization": 90.0 if i in busy else 0.0,
                "memory_used_mb": 5000 if i in busy else 0,
                "temperature_c": 40.0 + i,
                "power_w": None,
                "processes": [],
            }
            for i in range(8)
        ],
        "jobs": [{"job_id": j.pk, "attempt": j.attempt, "pid": 1, "running": True} for j in jobs],
        "zombies": zombies if zombies is not None else [],
    }


def _busy(job, node):
    return set(job.allocations.filter(node=node).values_list("gpu__index", flat=True))


def _state():
    """Everything a heartbeat changes."""
    return (
        list(Node.objects.order_by("pk").values_list("name", "state", "last_heartbeat", "zombies")),
        list(
            Gpu.objects.order_by("pk").values_list(
                "utilization", "memory_used_mb", "temperature_c", "power_w", "sampled_at"
            )
        ),
        list(Job.objects.order_by("pk").values_list("state", "last_active_at", "finished_at")),
        # in another order together: every node's writes come before the repairs
        sorted(AuditEvent.objects.values_list("action", "target_id")),
    )


@pytest.fixture
def fleet(world):
    """Four nodes: one running an eight-GPU job, one two two-GPU jobs, two without."""
    big = _running_job(world, gpus=8)
    a, b = _running_job(world), _running_job(world)
    assert a[1] == b[1] != big[1]
    return [a, b, (None, _node(world, "gpu-03")), (None, _node(world, "gpu-04")), big]


def test_many_nodes_in_one_batch_as_one_at_a_time(fleet):
    with freeze_time(timezone.now() + timedelta(minutes=1)):  # both runs receive at once
        _many_nodes_in_one_batch(fleet)


def _many_nodes_in_one_batch(fleet):
    (job_a, node), (job_b, _), (_, idle), (_, down), (big, big_node) = fleet
    Node.objects.filter(pk=down.pk).update(state=NodeState.DOWN)
    audit_record(action="node.down", target=down, reason="test")
    now = timezone.now()
    zombie = [{"gpu_index": 7, "pid": 66, "memory_mb": 10, "name": "python"}]
    batch = [
        # lists job a only: job b is LOST (a repair, before the next node's jobs are read)
        _beat(node, jobs=[job_a], sent_at=now, busy=_busy(job_a, node)),
        _beat(big_node, jobs=[big], sent_at=now - timedelta(seconds=1), busy={0, 5}),
        _beat(idle, sent_at=now, zombies=zombie),
        _beat(down, sent_at=now + timedelta(seconds=1)),  # comes back
    ]

    sid = transaction.savepoint()
    for report in batch:
        agent_reports([report])
    alone = _state()
    transaction.savepoint_rollback(sid)

    assert agent_reports(batch)["failed"] == 0
    together = _state()
    assert together == alone
    # and what that is:
    job_a.refresh_from_db()
    job_b.refresh_from_db()
    big.refresh_from_db()
    assert job_a.last_active_at == now
    assert job_b.state == JobState.PENDING  # LOST, requeued by its policy
    assert AuditEvent.objects.filter(action="job.lost", target_id=str(job_b.pk)).exists()
    assert big.last_active_at == now - timedelta(seconds=1)
    assert Node.objects.get(pk=idle.pk).zombies == zombie
    assert Node.objects.get(pk=down.pk).state == NodeState.READY
    assert set(Gpu.objects.filter(node=idle).values_list("sampled_at", flat=True)) == {now}
    assert AuditEvent.objects.filter(action="node.up", target_id=str(down.pk)).exists()


def test_statements_do_not_grow_with_the_nodes(world):
    nodes = [_node(world, f"gpu-{i:02d}") for i in range(3, 9)]
    now = timezone.now()

    def cost(count, offset):
        sent = now + timedelta(seconds=offset)
        batch = [_beat(n, sent_at=sent, busy={0, 1}) for n in nodes[:count]]
        with CaptureQueriesContext(connection) as queries:
            assert agent_reports(batch)["failed"] == 0
        return len(queries)

    assert cost(2, 1) == cost(6, 2)
    assert set(Gpu.objects.filter(node__in=nodes).values_list("utilization", flat=True)) == {
        0.0,
        90.0,
    }


def test_one_heartbeat_of_a_node_running_a_job_costs_six_statements(fleet):
    """Lock the node, read its GPUs and placed jobs, write its last heartbeat, its GPU
    samples and its job's last active time (within the caller's transaction)."""
    job, node = fleet[4]
    beat = _beat(node, jobs=[job], sent_at=timezone.now(), busy=_busy(job, node))
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        node_heartbeat(beat)
    statements = [q["sql"] for q in queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == 6, statements


def test_unchanged_zombies_are_not_written_again(fleet):
    _, node = fleet[2]
    zombie = [{"gpu_index": 7, "pid": 66, "memory_mb": 10, "name": "python"}]
    agent_reports([_beat(node, sent_at=timezone.now(), zombies=zombie)])
    with CaptureQueriesContext(connection) as queries:
        agent_reports([_beat(node, sent_at=timezone.now(), zombies=zombie)])
    assert not [q for q in queries if q["sql"].startswith("UPDATE") and "zombies" in q["sql"]]
    with CaptureQueriesContext(connection) as queries:
        agent_reports([_beat(node, sent_at=timezone.now(), zombies=[])])
    assert [q for q in queries if q["sql"].startswith("UPDATE") and "zombies" in q["sql"]]
    assert Node.objects.get(pk=node.pk).zombies == []


def test_a_heartbeat_that_cannot_be_applied_loses_only_itself(fleet):
    (job, node), _, (_, idle), (_, other), _ = fleet
    now = timezone.now()
    bad = _beat(idle, sent_at=now)
    del bad["gpus"][0]["index"]  # its handler fails on it
    batch = [
        _beat(node, jobs=[job], sent_at=now, busy=_busy(job, node)),
        bad,
        _beat(other, sent_at=now),
    ]
    assert agent_reports(batch)["failed"] == 1
    job.refresh_from_db()
    assert job.last_active_at == now
    assert set(Gpu.objects.filter(node=other).values_list("sampled_at", flat=True)) == {now}
    assert set(Gpu.objects.filter(node=idle).values_list("sampled_at", flat=True)) == {None}


def test_two_heartbeats_of_one_node_given_together_apply_in_order(fleet):
    job, node = fleet[0]
    now = timezone.now()
    first = _beat(node, jobs=[job], sent_at=now - timedelta(seconds=10), busy=_busy(job, node))
    second = _beat(node, jobs=[job], sent_at=now)
    with transaction.atomic():
        node_heartbeats_apply(beats=[(first, []), (second, [])])
    job.refresh_from_db()
    assert job.last_active_at == now - timedelta(seconds=10)  # the second one was idle
    assert set(Gpu.objects.filter(node=node).values_list("utilization", flat=True)) == {0.0}
