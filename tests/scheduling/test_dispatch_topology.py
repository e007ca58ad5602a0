"""Topology in the dispatch loop: blocks from the nodes' labels named by the pool, a job of
several nodes waiting for one block (its reason in the API and on its page), spread once
its topology wait is over."""

import pytest
from django.core.cache import cache

from scheduling.choices import JobState
from scheduling.models import Allocation, Quota
from scheduling.services.dispatch import TOPOLOGY_PAUSED_KEY, TOPOLOGY_WAITS_KEY, dispatch_cycle
from tests import factories as f

LABEL = "topology.sluice.io/block"


@pytest.fixture
def four_nodes(world):
    """Nodes gpu-01 and gpu-02 of the world plus gpu-03 and gpu-04, 8 GPUs each; the
    vision tenant runs a whole-node job on gpu-01 and one on gpu-02; blocks: b1 = gpu-01
    and gpu-03, b2 = gpu-02 and gpu-04 (each block has one busy node)."""
    nodes = list(world.nodes)
    for n in (3, 4):
        node = f.NodeFactory(name=f"gpu-{n:02d}", pool=world.pool)
        for i in range(8):
            f.GpuFactory(node=node, index=i, uuid=f"GPU-{node.name}-{i}")
        nodes.append(node)
    Quota.objects.filter(pool=world.pool).update(guaranteed_gpus=32, borrow_limit_gpus=0)
    for _ in range(2):
        f.JobFactory(
            queue=world.other_queue,
            project=world.other_project,
            gpus_per_node=8,
            max_runtime_seconds=3600,
        )
    dispatch_cycle()
    busy = set(
        Allocation.objects.filter(released_at__isnull=True).values_list("node__name", flat=True)
    )
    assert len(busy) == 2
    idle = [n for n in nodes if n.name not in busy]
    taken = [n for n in nodes if n.name in busy]
    for block, members in (("b1", (taken[0], idle[0])), ("b2", (taken[1], idle[1]))):
        for node in members:
            node.labels = {LABEL: block}
            node.save(update_fields=["labels"])
    return idle


def _gang(world):
    return f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        gpus_per_node=8,
        nodes=2,
        base_priority_class=world.normal,
        priority_class=world.normal,
    )


def test_a_gang_waits_for_one_block_and_says_so(
    world, four_nodes, api, client, django_capture_on_commit_callbacks
):
    job = _gang(world)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert job.pending_reason_code == "WAITING_FOR_TOPOLOGY"
    assert "waiting for one block to hold 2 nodes x 8 GPUs" in job.pending_reason_message
    assert job.pk in (cache.get(TOPOLOGY_WAITS_KEY) or {})

    body = api(world.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["pending_reason"]["code"] == "WAITING_FOR_TOPOLOGY"

    client.force_login(world.member)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "WAITING_FOR_TOPOLOGY" in page and "(topology)" in page


def test_past_its_topology_wait_the_gang_is_spread(
    world, four_nodes, django_capture_on_commit_callbacks
):
    job = _gang(world)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    waits = cache.get(TOPOLOGY_WAITS_KEY)
    waits[job.pk] -= 1801  # its policy's topology wait (1800 s) is over
    cache.set(TOPOLOGY_WAITS_KEY, waits)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED
    nodes = set(
        Allocation.objects.filter(job=job, released_at__isnull=True).values_list(
            "node__name", flat=True
        )
    )
    assert nodes == {n.name for n in four_nodes}
    assert job.pk not in (cache.get(TOPOLOGY_WAITS_KEY) or {})


def test_the_topology_wait_does_not_count_while_the_gang_waits_for_something_else(
    world, four_nodes, django_capture_on_commit_callbacks
):
    job = _gang(world)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    # Its tenant's quota cut below the gang: it waits for quota, its topology wait paused.
    quota = Quota.objects.get(pool=world.pool, tenant=world.tenant)
    quota.guaranteed_gpus = 8
    quota.save(update_fields=["guaranteed_gpus"])
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    job.refresh_from_db()
    assert job.pending_reason_code != "WAITING_FOR_TOPOLOGY"
    waits, paused = cache.get(TOPOLOGY_WAITS_KEY), cache.get(TOPOLOGY_PAUSED_KEY)
    assert job.pk in paused
    # An hour later (it first waited for one block just before the pause), the quota back:
    # it waits for one block again, with almost all its topology wait left.
    waits[job.pk] -= 3600
    paused[job.pk] -= 3600
    cache.set(TOPOLOGY_WAITS_KEY, waits)
    cache.set(TOPOLOGY_PAUSED_KEY, paused)
    quota.guaranteed_gpus = 32
    quota.save(update_fields=["guaranteed_gpus"])
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert job.pending_reason_code == "WAITING_FOR_TOPOLOGY"
    assert "spread over blocks in 30 min" in job.pending_reason_message
    assert job.pk not in (cache.get(TOPOLOGY_PAUSED_KEY) or {})


def test_a_pool_without_a_topology_label_spreads_at_once(world, four_nodes):
    world.pool.topology_label = ""
    world.pool.save(update_fields=["topology_label"])
    job = _gang(world)
    dispatch_cycle()
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED
