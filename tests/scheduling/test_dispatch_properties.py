"""The dispatch loop keeps its promises whatever happens between cycles (hypothesis).

Two tenants (``nlp``, ``vision``: 8 GPUs guaranteed and 8 more to borrow each, two 8-GPU
nodes) submit jobs of every shape and class at random; between dispatch cycles running jobs
end, stopped victims report their exit and are requeued. After every cycle:

- no GPU is held by two jobs, and every active job holds exactly the GPUs it asked for;
- a tenant's GPUs on its guarantee (allocations not borrowed) fit the guarantee, and all
  its GPUs fit guarantee plus borrowing;
- no job is labelled borrowed where it fits what is left of its tenant's guarantee (a job
  borrowed at its start moves onto the guarantee once it fits, ``engine.promotions``,
  and a job placed where the guarantee has room starts on it,
  ``engine.quota.placed_within_guarantee``);
- every waiting job has a reason, and the pool positions of the pending jobs are 1..N;
- no job is preempted more often than its workload policy allows (3).
"""

import os
from collections import Counter, defaultdict

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from scheduling.choices import ACTIVE_STATES, JobState
from scheduling.models import Allocation, Job
from scheduling.positions import positions_attach
from scheduling.services.dispatch import dispatch_cycle
from scheduling.services.nodes import job_exited, job_started
from tests import factories as f
from tests.conftest import reset_dispatch_state

pytestmark = pytest.mark.django_db

GUARANTEED, BORROW = 8, 8

submit = st.tuples(
    st.just("submit"),
    st.sampled_from(["nlp", "vision"]),
    st.sampled_from([(1, 1), (2, 1), (4, 1), (8, 1), (8, 2)]),  # GPUs per node, nodes
    st.sampled_from(["low", "batch", "normal", "urgent"]),
)
operations = st.lists(
    st.one_of(
        submit,
        st.tuples(st.just("dispatch")),
        st.tuples(st.just("finish"), st.integers(0, 20)),
        st.tuples(st.just("stopped"), st.integers(0, 20)),
    ),
    min_size=1,
    max_size=30,
)


def _nodes_of(job: Job) -> list[str]:
    allocations = job.allocations.filter(released_at__isnull=True).select_related("node")
    return sorted({allocation.node.name for allocation in allocations})


def _start_admitted() -> None:
    for job in Job.objects.filter(state=JobState.ADMITTED).order_by("pk"):
        for node in _nodes_of(job):
            job_started(
                {
                    "type": "started",
                    "node": node,
                    "job_id": job.pk,
                    "attempt": job.attempt,
                    "pid": 100,
                    "started_at": timezone.now().timestamp(),
                }
            )


def _exit(job: Job, preempted: bool) -> None:
    """Every node of the job reports its exit (the job ends with the last one)."""
    ending = {"exit_code": None, "signal": 15, "stop_reason": "preempted"} if preempted else {}
    for node in _nodes_of(job):
        job_exited(
            {
                "type": "exited",
                "node": node,
                "job_id": job.pk,
                "attempt": job.attempt,
                "exit_code": 0,
                "signal": None,
                **ending,
                "message": "",
                "finished_at": timezone.now().timestamp(),
            }
        )


def _check(tenants) -> None:
    open_ = list(
        Allocation.objects.filter(released_at__isnull=True).select_related("job", "job__tenant")
    )
    per_gpu = Counter(a.gpu_id for a in open_)
    assert max(per_gpu.values(), default=0) <= 1, "a GPU held by two jobs"
    by_job = defaultdict(list)
    for allocation in open_:
        by_job[allocation.job_id].append(allocation)
    active = {job.pk: job for job in Job.objects.filter(state__in=ACTIVE_STATES)}
    assert set(by_job) == set(active), "allocations of inactive jobs, or active jobs without"
    guaranteed, total = Counter(), Counter()
    borrowers = defaultdict(list)
    for job_id, allocations in by_job.items():
        job = active[job_id]
        assert len(allocations) == job.gpus_per_node * job.nodes
        assert len({a.node_id for a in allocations}) == job.nodes
        kinds = {a.borrowed for a in allocations}
        assert len(kinds) == 1, "a job partly borrowed"
        slug = job.tenant.slug
        total[slug] += len(allocations)
        if kinds == {False}:
            guaranteed[slug] += len(allocations)
        elif job.state != JobState.STOPPING:
            borrowers[slug].append(len(allocations))
    for slug in tenants:
        assert guaranteed[slug] <= GUARANTEED, f"{slug} beyond its guarantee"
        assert total[slug] <= GUARANTEED + BORROW, f"{slug} beyond its borrowing"
        room = GUARANTEED - guaranteed[slug]
        assert all(gpus > room for gpus in borrowers[slug]), (
            f"{slug}: a borrowed job fits its guarantee and was not moved onto it"
        )
    waiting = positions_attach(Job.objects.filter(state=JobState.PENDING))
    assert all(job.pending_reason_code for job in waiting)
    positions = sorted(job.pool_position for job in waiting)
    assert positions == list(range(1, len(positions) + 1))
    for job in Job.objects.all():
        assert job.preemption_count <= 3


@settings(
    max_examples=int(os.environ.get("PROP_EXAMPLES", "100")) // 4,  # each a few cycles
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(ops=operations)
def test_every_cycle_keeps_the_loop_s_promises(world, ops):
    # Each example in a savepoint rolled back after it, the dispatch state with it.
    note(f"operations: {ops!r}")
    reset_dispatch_state()
    try:
        with transaction.atomic():
            _run(world, ops)
            transaction.set_rollback(True)
    finally:
        reset_dispatch_state()


def _run(world, ops) -> None:
    classes = {
        "low": world.low,
        "batch": f.PriorityClassFactory(name="batch", value=300, preemptible=True),
        "normal": world.normal,
        "urgent": f.PriorityClassFactory(
            name="urgent", value=500, preemptible=False, can_preempt=True
        ),
    }
    queues = {
        "nlp": (world.queue, world.project),
        "vision": (world.other_queue, world.other_project),
    }
    tenants = list(queues)
    for op in [*ops, ("dispatch",)]:
        if op[0] == "submit":
            _, slug, (per_node, nodes), cls = op
            queue, project = queues[slug]
            f.JobFactory(
                queue=queue,
                project=project,
                gpus_per_node=per_node,
                nodes=nodes,
                base_priority_class=classes[cls],
                priority_class=classes[cls],
            )
        elif op[0] == "dispatch":
            dispatch_cycle()
            _check(tenants)
            _start_admitted()
        elif op[0] == "finish":
            running = list(Job.objects.filter(state=JobState.RUNNING).order_by("pk"))
            if running:
                _exit(running[op[1] % len(running)], preempted=False)
        else:
            stopping = list(Job.objects.filter(state=JobState.STOPPING).order_by("pk"))
            if stopping:
                _exit(stopping[op[1] % len(stopping)], preempted=True)
