"""GPUs held by work outside Sluice (a Slurm job of someone else, reported by the Slurm
bridge's heartbeats as ``outside_jobs``) are capacity in use: the engine places nothing on
them until a heartbeat no longer lists them."""

import pytest
from django.utils import timezone

from scheduling.agent import protocol
from scheduling.choices import JobState
from scheduling.models import Allocation, Gpu
from scheduling.services.dispatch import dispatch_cycle
from scheduling.tasks import agent_report
from tests import factories as f


def _outside(job_id, gpus, indices=(), user="alice"):
    return {
        "slurm_job_id": str(job_id),
        "node": "",
        "user": user,
        "name": "their-train",
        "gpu_indices": list(indices),
        "gpus": gpus,
        "label": "outside Sluice",
    }


def _heartbeat(node, outside_jobs=None, jobs=()):
    report = {
        "type": "heartbeat",
        "node": node.name,
        "sent_at": timezone.now().timestamp(),
        "gpus": [],
        "jobs": list(jobs),
        "zombies": [],
    }
    if outside_jobs is not None:
        report["outside_jobs"] = outside_jobs
    agent_report(report)


def _job(world, gpus):
    return f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        gpus_per_node=gpus,
        base_priority_class=world.normal,
        priority_class=world.normal,
    )


def _held(node):
    return dict(
        Gpu.objects.filter(node=node).exclude(held_outside="").values_list("index", "held_outside")
    )


def test_gpus_held_outside_are_not_placed_on_until_the_outside_job_ends(
    world, django_capture_on_commit_callbacks
):
    first, second = world.nodes
    _heartbeat(first, [_outside(501, 8, range(8))])
    _heartbeat(second, [_outside(502, 6, range(6), user="bob")])
    assert _held(first) == dict.fromkeys(range(8), "Slurm job 501 of alice")
    assert set(_held(second)) == set(range(6))
    big = _job(world, gpus=4)
    small = _job(world, gpus=2)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    big.refresh_from_db()
    small.refresh_from_db()
    # Only two GPUs of the 16 are free (on the second node): the 4-GPU job waits.
    assert big.state == JobState.PENDING
    assert small.state == JobState.ADMITTED
    assert {(a.node_id, a.gpu.index) for a in Allocation.objects.filter(job=small)} == {
        (second.pk, 6),
        (second.pk, 7),
    }

    _heartbeat(first, [])  # the outside job ended
    assert _held(first) == {}
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    big.refresh_from_db()
    assert big.state == JobState.ADMITTED
    assert {a.node_id for a in Allocation.objects.filter(job=big)} == {first.pk}


def test_an_outside_job_on_gpus_sluice_counts_as_its_own_takes_other_free_ones(
    world, django_capture_on_commit_callbacks
):
    """Slurm picks the GPUs on a node, so its indices need not be Sluice's: the count is
    what is held, on GPUs no Sluice job holds."""
    first, second = world.nodes
    for node in world.nodes:
        _heartbeat(node, [_outside(600 + node.pk, 7, range(1, 8))])
    mine = _job(world, gpus=1)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    mine.refresh_from_db()
    [alloc] = Allocation.objects.filter(job=mine)
    assert alloc.gpu.index == 0
    # Slurm gave the outside job index 0 of that node (Sluice's job got another there).
    _heartbeat(alloc.node, [_outside(700, 2, [0, 1])])
    held = _held(alloc.node)
    assert 0 not in held and len(held) == 2
    assert held == {1: "Slurm job 700 of alice", 7: "Slurm job 700 of alice"}


def test_an_agents_heartbeat_without_outside_jobs_clears_them(world):
    node = world.nodes[0]
    _heartbeat(node, [_outside(1, 2)])
    assert len(_held(node)) == 2
    _heartbeat(node)  # no outside_jobs field at all
    assert _held(node) == {}


def test_more_outside_gpus_than_the_node_has_marks_what_there_is(world):
    node = world.nodes[0]
    _heartbeat(node, [_outside(1, 6), _outside(2, 6)])
    assert len(_held(node)) == 8


def test_outside_jobs_must_be_a_list():
    report = protocol.report("heartbeat", "n1", gpus=[], jobs=[], zombies=[], outside_jobs={})
    with pytest.raises(protocol.ProtocolError, match="outside_jobs"):
        protocol.validate_report(report)


def test_nodes_page_shows_gpus_in_use_outside_sluice(world, client):
    node = world.nodes[0]
    _heartbeat(node, [_outside(501, 3, [0, 1, 2])])
    client.force_login(world.member)
    body = client.get("/nodes/").content.decode()
    assert "in use outside Sluice (Slurm job 501 of alice)" in body
    assert "+3 in use outside Sluice" in body


def test_a_pod_that_is_not_sluices_is_named_on_the_nodes_page(world, client):
    node = world.nodes[0]
    pod = {
        "pod": "research/notebook-1",
        "node": node.name,
        "user": "research",
        "name": "notebook-1",
        "gpu_indices": [],
        "gpus": 2,
        "label": "outside Sluice",
    }
    _heartbeat(node, [pod])
    assert Gpu.objects.filter(node=node).exclude(held_outside="").count() == 2
    client.force_login(world.member)
    body = client.get("/nodes/").content.decode()
    assert "in use outside Sluice (Pod research/notebook-1)" in body
