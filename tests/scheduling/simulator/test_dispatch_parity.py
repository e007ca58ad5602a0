"""The simulator hands the engine what the dispatch loop hands it: same state, same plan.

A small cluster is built in the database (the ``world`` fixture: two nodes of 8 GPUs,
tenants nlp and vision with 8 guaranteed + 8 borrowable GPUs each), loaded the way the
dispatch loop loads it, and converted to the simulator's scenario and snapshot builder
(the conversion the what-if page uses). Both snapshots must give identical decisions.
"""

import pytest
from django.utils import timezone

from scheduling import engine
from scheduling.choices import ACTIVE_STATES, JobState
from scheduling.models import Allocation, Job
from scheduling.services import whatif
from scheduling.services.dispatch import load_snapshot
from scheduling.simulator import POLICIES, Scenario, SnapshotBuilder
from tests import factories as f

pytestmark = pytest.mark.django_db


def _pending(world, gpus, *, nodes=1, cls=None, other=False, minutes_ago=10):
    queue, project = (
        (world.other_queue, world.other_project) if other else (world.queue, world.project)
    )
    cls = cls or world.normal
    return f.JobFactory(
        queue=queue,
        project=project,
        submitted_by=world.outsider if other else world.member,
        gpus_per_node=gpus,
        nodes=nodes,
        base_priority_class=cls,
        priority_class=cls,
        submitted_at=timezone.now() - timezone.timedelta(minutes=minutes_ago),
    )


def _running(world, node, indices, *, cls=None, other=False, borrowed=False, runtime=None):
    queue, project = (
        (world.other_queue, world.other_project) if other else (world.queue, world.project)
    )
    cls = cls or world.normal
    gpus = [node.gpus.get(index=index) for index in indices]
    job = f.placed_job(
        gpus=gpus,
        queue=queue,
        project=project,
        submitted_by=world.outsider if other else world.member,
        base_priority_class=cls,
        priority_class=cls,
        submitted_at=timezone.now() - timezone.timedelta(hours=2),
    )
    Allocation.objects.filter(job=job).update(borrowed=borrowed)
    if runtime is not None:
        Job.objects.filter(pk=job.pk).update(max_runtime_seconds=runtime)
    return job


def _simulator_plan(now) -> tuple[engine.Plan, SnapshotBuilder]:
    """Convert the database's state to the simulator's snapshot and plan it."""
    jobs = list(Job.objects.select_related("tenant", "project", "queue__pool", "priority_class"))
    scenario = Scenario(
        name="database",
        nodes=whatif.cluster_nodes(),
        quotas=list(whatif.cluster_quotas().values()),
        classes=whatif.cluster_classes(),
        workloads=whatif.cluster_workloads(),
        jobs=[whatif.sim_job(job, duration=1.0) for job in jobs],
    )
    builder = SnapshotBuilder(scenario)
    running, pending = [], []
    for job in jobs:
        sim_job = whatif.sim_job(job, duration=1.0)
        if job.state in ACTIVE_STATES:
            allocations = job.allocations.filter(released_at__isnull=True).select_related(
                "gpu", "node"
            )
            gpu_ids = tuple(builder.gpu_id(a.node.name, a.gpu.index) for a in allocations)
            borrowed = any(a.borrowed for a in allocations)
            running.append(
                builder.running_job(sim_job, gpu_ids, borrowed, job.admitted_at.timestamp())
            )
        elif job.state == JobState.PENDING:
            pending.append(builder.pending_job(sim_job))
    snapshot = builder.snapshot(now.timestamp(), None, running, pending, {}, POLICIES["sluice"])
    return engine.plan(snapshot), builder


def _dispatch_plan(now):
    loaded = load_snapshot(now, update_usage=False)
    plan = engine.plan(loaded.snapshot)

    def label(gpu_id):
        node_id, index, _ = loaded.gpus[gpu_id]
        return loaded.node_names[node_id], index

    return plan, label


def _decisions(plan, label):
    return {
        "placements": {
            p.job_id: (sorted(label(gpu) for gpu in p.gpu_ids), p.borrowed, p.gpu_model)
            for p in plan.placements
        },
        "preemptions": sorted((p.victim_id, p.preemptor_id, p.reason) for p in plan.preemptions),
        "pending": {
            job_id: (
                info.code,
                info.queue_position,
                info.pool_position,
                info.estimated_start,
                sorted(label(gpu) for gpu in info.reserved_gpu_ids),
            )
            for job_id, info in plan.pending.items()
        },
    }


def _assert_same_decisions():
    now = timezone.now()
    dispatch_plan, dispatch_label = _dispatch_plan(now)
    simulator_plan, builder = _simulator_plan(now)

    expected = _decisions(dispatch_plan, dispatch_label)
    assert _decisions(simulator_plan, builder.gpu_label) == expected
    return expected


def test_same_placements_and_pending_codes(world):
    node1, node2 = world.nodes
    _running(world, node1, range(8), cls=world.low, other=True)
    _running(world, node2, range(4))
    small = _pending(world, 2, minutes_ago=30)
    big_high = _pending(world, 8, cls=world.high, minutes_ago=20)
    borrowing = _pending(world, 1, other=True, minutes_ago=15)
    too_big = _pending(world, 8, nodes=3, minutes_ago=5)

    decisions = _assert_same_decisions()

    # The comparison is not vacuous: a job starts, the others wait for different reasons.
    assert list(decisions["placements"]) == [small.pk]
    codes = {job_id: info[0] for job_id, info in decisions["pending"].items()}
    assert codes == {
        big_high.pk: engine.reasons.WAITING_FOR_QUOTA,  # nlp would borrow 6 more: 2 idle
        borrowing.pk: engine.reasons.WAITING_FOR_QUOTA,
        too_big.pk: engine.reasons.NO_MATCHING_NODES,
    }


def test_same_preemptions(world):
    node1, node2 = world.nodes
    # Both may run two more days: a reclaim buys more than the default minimum gain.
    _running(world, node1, range(8), other=True, runtime=2 * 86400)
    _running(world, node2, range(8), cls=world.low, other=True, borrowed=True, runtime=2 * 86400)
    reclaimer = _pending(world, 8)  # nlp runs nothing: inside its guarantee

    decisions = _assert_same_decisions()

    assert [victim[1:] for victim in decisions["preemptions"]] == [(reclaimer.pk, "reclaim")]
