"""Properties of every plan, over random clusters, quotas, running and pending jobs."""

import dataclasses
import os

from engine_builders import NOW, Simulation, check_plan  # noqa: I001  (test helper)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import (
    GpuInfo,
    KeptCluster,
    NodeInfo,
    PendingJob,
    QueueInfo,
    QuotaInfo,
    RunningJob,
    Snapshot,
    plan,
)
from scheduling.engine.planner import Planner
from scheduling.engine.settled import Remaining, nothing_more_can_happen

POOLS = ["training", "inference"]
MODELS = ["H100", "A100"]
TENANTS = ["a", "b", "c"]
CLASSES = [(10, "low"), (100, "normal"), (1000, "high")]
WORKLOADS = ["training", "fine_tuning", "inference", "evaluation"]


# Running jobs' runtime predictions (0: none; some jobs run past theirs) and minimum
# preemption gains: a job expected to end within the gain is nobody's victim.
PREDICTIONS = (0.0, 0.0, 900.0, 7200.0)
GAINS = (0.0, 0.0, 1800.0)
# When a borrower of several nodes reserves (0: at its maximum wait only).
GANG_RESERVES = (0.0, 0.0, 600.0)
# After how long a job is ordered with the next class up (0: off); jobs waited 0-10,000 s.
CLASS_AGINGS = (0.0, 0.0, 3000.0)
# Maximum waits: past it a job's reservation is bounded (12 h: no job here is past it).
MAX_WAITS = (43200.0, 3000.0, 3000.0)
BLOCKS = ("", "", "b1", "b1", "b2")
TOPOLOGY_WAITS = (0.0, 1800.0, 1800.0)


@st.composite
def stop_limits(draw) -> dict:
    """A running job's stops so far and its policy's limit (0: none), some at the limit,
    protected for the whole run or for a window from its start."""
    return {
        "preemptions": draw(st.sampled_from([0, 0, 1, 3])),
        "max_preemptions": draw(st.sampled_from([0, 3, 3])),
        "preemption_protection_seconds": draw(st.sampled_from([0, 0, 300])),
    }


@st.composite
def sharing(draw, on: bool) -> dict:
    """A job's time-sharing fields: taking part or not, and the GPU-seconds it used
    before (set only where the snapshot's queues time-share)."""
    if not on:
        return {}
    return {
        "time_sharing": draw(st.booleans()),
        "attained_gpu_seconds": draw(st.sampled_from([0.0, 0.0, 700.0, 6000.0, 90000.0])),
    }


@st.composite
def sharing_levels(draw, on: bool) -> dict:
    """The snapshot's time-sharing levels and promotion (set only where it time-shares)."""
    if not on:
        return {}
    return {
        "time_sharing_levels": draw(st.sampled_from([(600.0, 5000.0), (3000.0,), ()])),
        "time_sharing_promotion_seconds": draw(st.sampled_from([0.0, 3000.0])),
        "time_sharing_min_wait_seconds": draw(st.sampled_from([0.0, 0.0, 1000.0])),
    }


@st.composite
def snapshots(draw) -> Snapshot:
    nodes = []
    # Time-sharing in a third of the snapshots: the order and stops by attained service.
    time_sharing = draw(st.integers(0, 2)) == 0
    gpu_id = 0
    for node_id in range(draw(st.integers(1, 5))):
        pool = draw(st.sampled_from(POOLS))
        model = draw(st.sampled_from(MODELS))
        memory = 81920 if model == "H100" else 40960  # the memory is part of a model
        gpus = []
        for index in range(draw(st.sampled_from([2, 4, 8, 8]))):
            gpus.append(GpuInfo(gpu_id, node_id, index, model, memory))
            gpu_id += 1
        # Topology blocks on some nodes (most in none), so that every property below
        # holds with blocks too.
        block = draw(st.sampled_from(BLOCKS))
        nodes.append(NodeInfo(node_id, f"n{node_id}", pool, gpus, block=block))

    quotas = []
    for tenant in TENANTS:
        for pool in POOLS:
            models = draw(st.lists(st.sampled_from(MODELS), max_size=1))
            for model in ["", *models]:
                quotas.append(
                    QuotaInfo(
                        tenant,
                        pool,
                        model,
                        draw(st.integers(0, 16)),
                        draw(st.integers(0, 16)),
                        draw(st.sampled_from([None, None, None, 0, 1, 3])),
                    )
                )

    running = []
    job_id = 1000
    for node in nodes:
        free = [gpu.id for gpu in node.gpus]
        while free and draw(st.integers(0, 4)) > 0:
            size = draw(st.integers(1, len(free)))
            priority, name = draw(st.sampled_from(CLASSES))
            running.append(
                RunningJob(
                    id=job_id,
                    tenant=draw(st.sampled_from(TENANTS)),
                    pool=node.pool,
                    workload_type=draw(st.sampled_from(WORKLOADS)),
                    priority=priority,
                    priority_class=name,
                    preemptible=draw(st.booleans()),
                    gpu_ids=tuple(free[:size]),
                    gpu_model=node.gpus[0].model,
                    borrowed=draw(st.booleans()),
                    started_at=NOW - draw(st.sampled_from([10, 600, 5000])),
                    max_runtime_seconds=draw(st.sampled_from([0, 600, 3600, 86400])),
                    min_runtime_before_preemption=draw(st.sampled_from([0, 300])),
                    stopping=draw(st.booleans()) and draw(st.booleans()),
                    grace_seconds=draw(st.sampled_from([0, 30])),
                    expected_runtime_seconds=draw(st.sampled_from(PREDICTIONS)),
                    **draw(stop_limits()),
                    **draw(sharing(time_sharing)),
                )
            )
            del free[:size]
            job_id += 1

    pools = sorted({node.pool for node in nodes})
    pending = []
    for job_id in range(1, draw(st.integers(0, 14)) + 1):
        priority, name = draw(st.sampled_from(CLASSES))
        pending.append(
            PendingJob(
                id=job_id,
                tenant=draw(st.sampled_from(TENANTS)),
                project="p",
                queue_id=draw(st.sampled_from([1, 2, 3])),
                pool=draw(st.sampled_from([*pools, *pools, *pools, "ghost"])),
                workload_type=draw(st.sampled_from(WORKLOADS)),
                priority=priority,
                priority_class=name,
                preemptible=draw(st.booleans()),
                can_preempt=draw(st.booleans()),
                gpus_per_node=draw(st.sampled_from([1, 1, 2, 4, 8])),
                nodes=draw(st.sampled_from([1, 1, 1, 2])),
                gpu_models=draw(
                    st.sampled_from([(), (), (), ("H100",), ("A100",), ("A100", "H100")])
                ),
                min_gpu_memory_mb=draw(st.sampled_from([0, 0, 0, 50000])),
                submitted_at=NOW - draw(st.integers(0, 10_000)),
                max_runtime_seconds=draw(st.sampled_from([0, 300, 3600, 7200])),
                held=draw(st.integers(0, 19)) == 0,
                topology_wait_seconds=draw(st.sampled_from(TOPOLOGY_WAITS)),
                topology_since=draw(st.sampled_from([None, None, NOW - 100, NOW - 4000])),
                **draw(sharing(time_sharing)),
            )
        )
    queues = [
        QueueInfo(1, "open", "a"),
        QueueInfo(2, "strict", "b", strict_fifo=True),
        QueueInfo(3, "maybe-closed", "c", open=draw(st.integers(0, 3)) > 0),
    ]
    return Snapshot(
        now=NOW,
        nodes=nodes,
        quotas=quotas,
        queues=queues,
        running=running,
        pending=pending,
        usage={tenant: draw(st.floats(0, 1e6)) for tenant in TENANTS},
        backfill=draw(st.booleans()),
        preemption=draw(st.booleans()),
        fair_share=draw(st.booleans()),
        global_fifo=draw(st.integers(0, 5)) == 0,
        preemption_min_gain_seconds=draw(st.sampled_from(GAINS)),
        gang_borrower_reserve_seconds=draw(st.sampled_from(GANG_RESERVES)),
        class_aging_seconds=draw(st.sampled_from(CLASS_AGINGS)),
        max_wait_seconds=draw(st.sampled_from(MAX_WAITS)),
        **draw(sharing_levels(time_sharing)),
    )


@st.composite
def crowded_tenants(draw) -> Snapshot:
    """One slice where tenants run lower work up to (or beyond) their quota while jobs of
    higher classes of the same tenants wait: within-tenant preemption, mostly (and, in
    a third of them, time-sharing inside a class)."""
    time_sharing = draw(st.integers(0, 2)) == 0
    nodes = []
    for node_id in range(draw(st.integers(1, 3))):
        gpus = [
            GpuInfo(node_id * 10 + index, node_id, index, "H100", 81920)
            for index in range(draw(st.sampled_from([4, 8])))
        ]
        nodes.append(NodeInfo(node_id, f"n{node_id}", "training", gpus))
    tenants = TENANTS[: draw(st.integers(1, 2))]
    quotas = [
        QuotaInfo(
            tenant,
            "training",
            "",
            draw(st.integers(0, 8)),
            draw(st.integers(0, 8)),
            draw(st.sampled_from([None, None, 1, 2])),
        )
        for tenant in tenants
    ]
    running = []
    for node in nodes:
        free = [gpu.id for gpu in node.gpus]
        while free and draw(st.integers(0, 5)) > 0:
            size = draw(st.integers(1, len(free)))
            priority, name = draw(st.sampled_from(CLASSES[:2]))
            running.append(
                RunningJob(
                    id=1000 + len(running),
                    tenant=draw(st.sampled_from(tenants)),
                    pool="training",
                    workload_type=draw(st.sampled_from(["training", "training", "inference"])),
                    priority=priority,
                    priority_class=name,
                    preemptible=draw(st.integers(0, 4)) > 0,
                    gpu_ids=tuple(free[:size]),
                    gpu_model="H100",
                    borrowed=draw(st.booleans()),
                    started_at=NOW - draw(st.sampled_from([10, 600, 5000])),
                    max_runtime_seconds=draw(st.sampled_from([0, 86400, 86400, 5010])),
                    min_runtime_before_preemption=draw(st.sampled_from([0, 0, 300])),
                    stopping=draw(st.integers(0, 9)) == 0,
                    grace_seconds=draw(st.sampled_from([0, 30, 30])),
                    expected_runtime_seconds=draw(st.sampled_from(PREDICTIONS)),
                    **draw(stop_limits()),
                    **draw(sharing(time_sharing)),
                )
            )
            del free[:size]
    pending = []
    for job_id in range(1, draw(st.integers(1, 6)) + 1):
        priority, name = draw(st.sampled_from(CLASSES[1:]))
        pending.append(
            PendingJob(
                id=job_id,
                tenant=draw(st.sampled_from(tenants)),
                project="p",
                queue_id=1,
                pool="training",
                workload_type=draw(st.sampled_from(["training", "evaluation"])),
                priority=priority,
                priority_class=name,
                preemptible=draw(st.booleans()),
                can_preempt=draw(st.integers(0, 3)) > 0,
                gpus_per_node=draw(st.sampled_from([1, 2, 4, 4, 8])),
                nodes=draw(st.sampled_from([1, 1, 1, 2])),
                gpu_models=(),
                min_gpu_memory_mb=0,
                submitted_at=NOW - draw(st.integers(0, 10_000)),
                max_runtime_seconds=draw(st.sampled_from([0, 3600, 7200])),
                **draw(sharing(time_sharing)),
            )
        )
    return Snapshot(
        now=NOW,
        nodes=nodes,
        quotas=quotas,
        queues=[QueueInfo(1, "open", "a")],
        running=running,
        pending=pending,
        backfill=draw(st.booleans()),
        fair_share=draw(st.booleans()),
        preemption_min_gain_seconds=draw(st.sampled_from(GAINS)),
        gang_borrower_reserve_seconds=draw(st.sampled_from(GANG_RESERVES)),
        class_aging_seconds=draw(st.sampled_from(CLASS_AGINGS)),
        max_wait_seconds=draw(st.sampled_from(MAX_WAITS)),
        **draw(sharing_levels(time_sharing)),
    )


FAST = settings(
    max_examples=int(os.environ.get("PROP_EXAMPLES", "100")),  # more for a deeper check
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@FAST
@given(st.one_of(snapshots(), crowded_tenants()))
def test_every_plan_respects_the_invariants(snap):
    """No GPU counted twice or beyond the cluster, gangs whole, quotas and guarantees
    respected, preemptions legal, every unplaced job explained once with positions."""
    check_plan(snap, plan(snap))


@FAST
@given(snapshots())
def test_plan_is_deterministic_and_leaves_the_snapshot_alone(snap):
    before = repr(snap)
    first = plan(snap)
    assert repr(snap) == before
    assert plan(snap) == first


def hand_back_some_reservations(snap: Snapshot, data) -> None:
    """Give some pending jobs the reservation a first plan made for them, as the
    dispatch loop hands reservations to the next cycle."""
    first = plan(snap)
    for job in snap.pending:
        info = first.pending.get(job.id)
        if info is not None and info.reserved_gpu_ids and data.draw(st.booleans()):
            job.reserved_gpu_ids = info.reserved_gpu_ids
            job.reserved_start = info.estimated_start


@FAST
@given(snapshots(), st.data())
def test_reservations_handed_back_keep_the_invariants(snap, data):
    """Feeding a plan's reservations into the next cycle (as the dispatch loop does),
    possibly for GPUs that changed meanwhile, never breaks a plan."""
    hand_back_some_reservations(snap, data)
    if snap.running and data.draw(st.booleans()):
        snap.running.pop(data.draw(st.integers(0, len(snap.running) - 1)))
    check_plan(snap, plan(snap))


class Requeueing(Simulation):
    """A simulation in which stopped jobs come back as pending jobs (same tenant, class
    and size), as the dispatch loop requeues preempted work."""

    def requeue(self, job: RunningJob) -> None:
        self.snap.pending.append(
            PendingJob(
                id=job.id,
                tenant=job.tenant,
                project="p",
                queue_id=1,
                pool=job.pool,
                workload_type=job.workload_type,
                priority=job.priority,
                priority_class=job.priority_class,
                preemptible=job.preemptible,
                can_preempt=job.priority >= 1000,
                gpus_per_node=len(job.gpu_ids),
                nodes=1,
                gpu_models=(job.gpu_model,),
                min_gpu_memory_mb=0,
                submitted_at=self.snap.now,
                max_runtime_seconds=job.max_runtime_seconds,
            )
        )


def assert_shortcut_plans_alike(sim: Requeueing, keep: KeptCluster, switch: str) -> None:
    """The simulation's current cycle, full and decisions-only, on a new and on the kept
    cluster index, plans alike with the planner's shortcut and with ``switch`` (the
    planner attribute that turns it off) set: same placements, preemptions, pending
    jobs and skipped jobs."""
    for decisions_only in (False, True):
        for kept in (None, keep):
            cycle = dataclasses.replace(sim.snap, decisions_only=decisions_only, kept_cluster=kept)
            plans = []
            for plain in (False, True):
                planner = Planner(cycle)
                setattr(planner, switch, plain)
                plans.append(planner.run())
            shortcut, plain_plan = plans
            assert shortcut.placements == plain_plan.placements
            assert shortcut.preemptions == plain_plan.preemptions
            assert shortcut.pending == plain_plan.pending
            assert shortcut.skipped == plain_plan.skipped


@FAST
@given(st.one_of(snapshots(), crowded_tenants()))
def test_the_cycles_after_preemptions_keep_the_invariants(snap):
    """Victims stop for their preemptors (their GPUs and quota kept for them), then are
    gone and requeued: every cycle keeps the invariants (run_plan checks them, among
    them that a stopping job is never a victim again)."""
    sim = Requeueing(snap)
    for pause in (1, 60, 60):
        sim.step()
        sim.next_event()  # sets the stopping jobs' stop times
        sim.advance(sim.snap.now + pause)


def _acts_after_settled(snap: Snapshot) -> tuple[int | None, int, int]:
    """Plan ``snap`` in full, asking before each job whether nothing more can happen:
    (position of the first yes or None, decisions made before it, decisions in all)."""
    planner = Planner(snap)
    remaining = Remaining(snap.pending)
    settled_at = None
    decisions_then = 0
    for position, job in enumerate(planner.order()):
        if settled_at is None and nothing_more_can_happen(planner.view, remaining):
            settled_at = position
            decisions_then = len(planner.result.placements) + len(planner.result.preemptions)
        planner.consider(job)
        remaining.remove(job)
    decisions = len(planner.result.placements) + len(planner.result.preemptions)
    return settled_at, decisions_then, decisions


@FAST
@given(st.one_of(snapshots(), crowded_tenants()), st.data())
def test_nothing_more_happens_once_the_cycle_is_settled(snap, data):
    """Asked before every job (not only where a decisions-only cycle asks), "nothing
    more can happen" is never wrong: no job after that point starts or preempts; also
    with reservations handed back from a first cycle."""
    hand_back_some_reservations(snap, data)
    settled_at, decisions_then, decisions = _acts_after_settled(snap)
    if settled_at is not None:
        assert decisions == decisions_then


@FAST
@given(st.one_of(snapshots(), crowded_tenants()), st.data())
def test_the_check_answers_alike_with_or_without_its_last_witness(snap, data):
    """Asked before every job, the check first re-reads the node that had room last time;
    its answer is the one a check without that memory gives."""
    hand_back_some_reservations(snap, data)
    planner = Planner(snap)
    remaining = Remaining(snap.pending)
    considered = []
    for job in planner.order():
        fresh = Remaining(snap.pending)
        for done in considered:
            fresh.remove(done)
        assert nothing_more_can_happen(planner.view, remaining) == nothing_more_can_happen(
            planner.view, fresh
        )
        planner.consider(job)
        remaining.remove(job)
        considered.append(job)


@FAST
@given(st.one_of(snapshots(), crowded_tenants()))
def test_a_decisions_only_plan_decides_as_a_full_one(snap):
    """Same placements and preemptions; the jobs it considered are explained exactly as
    in the full plan, and the others are counted as skipped."""
    full = plan(snap)
    fast = plan(dataclasses.replace(snap, decisions_only=True))
    assert fast.placements == full.placements
    assert fast.preemptions == full.preemptions
    for job_id, info in fast.pending.items():
        assert info == full.pending[job_id]
    assert len(fast.pending) + fast.skipped == len(full.pending)


@FAST
@given(st.one_of(snapshots(), crowded_tenants()), st.data())
def test_without_backfill_a_decisions_only_plan_hands_on_what_a_full_one_does(snap, data):
    """Without backfill the full plan hands on nothing (no reservation, no GPUs kept for
    it) for a job the decisions-only plan did not reach, and the same as the
    decisions-only plan for each job it did: the next cycle reads the same from both
    (the replay drops older reservations of the jobs not reached)."""
    snap = dataclasses.replace(snap, backfill=False)
    hand_back_some_reservations(snap, data)
    full = plan(snap)
    fast = plan(dataclasses.replace(snap, decisions_only=True))
    assert (fast.placements, fast.preemptions) == (full.placements, full.preemptions)
    for job_id, info in full.pending.items():
        if job_id in fast.pending:
            assert fast.pending[job_id] == info
        else:
            assert (info.reserved_gpu_ids, info.claimed_gpu_ids) == ((), ())


@FAST
@given(st.one_of(snapshots(), crowded_tenants()))
def test_decisions_only_cycles_after_preemptions(snap):
    """Through stops, claims and requeues, each decisions-only cycle decides as the full
    plan of the same snapshot."""
    sim = Requeueing(snap)
    for pause in (1, 60, 60):
        fast = plan(dataclasses.replace(sim.snap, decisions_only=True))
        full = sim.step()
        assert (fast.placements, fast.preemptions) == (full.placements, full.preemptions)
        sim.next_event()
        sim.advance(sim.snap.now + pause)


@st.composite
def arriving_work(draw) -> tuple[Snapshot, list[PendingJob]]:
    """One pool of one GPU model, busy, with jobs waiting and more arriving over the next
    two hours, of three classes that may not preempt, tenants waiting for their
    guarantees at times; the maximum wait is short, so many reservations are bounded."""
    nodes = []
    for node_id in range(draw(st.integers(1, 3))):
        gpus = [
            GpuInfo(node_id * 10 + index, node_id, index, "H100", 81920)
            for index in range(draw(st.sampled_from([4, 8])))
        ]
        nodes.append(NodeInfo(node_id, f"n{node_id}", "training", gpus))
    total = sum(len(node.gpus) for node in nodes)
    # Guarantees of at least the largest node, none to borrow (a reclaim is a preemption).
    largest = max(len(node.gpus) for node in nodes)
    quotas = [
        QuotaInfo(tenant, "training", "", draw(st.integers(largest, total)), 0, None)
        for tenant in TENANTS
    ]
    running = []
    for node in nodes:
        free = [gpu.id for gpu in node.gpus]
        while free and draw(st.integers(0, 3)) > 0:
            size = draw(st.integers(1, len(free)))
            running.append(
                RunningJob(
                    id=1000 + len(running),
                    tenant=draw(st.sampled_from(TENANTS)),
                    pool="training",
                    workload_type="training",
                    priority=100,
                    priority_class="normal",
                    preemptible=True,
                    gpu_ids=tuple(free[:size]),
                    gpu_model="H100",
                    borrowed=False,
                    started_at=NOW - 10,
                    max_runtime_seconds=draw(st.sampled_from([600, 1800, 3600])),
                )
            )
            del free[:size]
    jobs = []
    for job_id in range(1, draw(st.integers(2, 16)) + 1):
        priority, name = draw(st.sampled_from(CLASSES))
        per_node = draw(st.sampled_from([1, 1, 2, 4, 8]))
        jobs.append(
            PendingJob(
                id=job_id,
                tenant=draw(st.sampled_from(TENANTS)),
                project="p",
                queue_id=1,
                pool="training",
                workload_type="training",
                priority=priority,
                priority_class=name,
                preemptible=True,
                can_preempt=False,
                gpus_per_node=min(per_node, largest),
                nodes=draw(st.sampled_from([1, 1, 1, 2])) if len(nodes) > 1 else 1,
                gpu_models=(),
                min_gpu_memory_mb=0,
                submitted_at=NOW + draw(st.sampled_from([-3000, -600, 0, 0, 300, 1200, 4000])),
                max_runtime_seconds=draw(st.sampled_from([300, 900, 3600, 7200])),
            )
        )
    snap = Snapshot(
        now=NOW,
        nodes=nodes,
        quotas=quotas,
        queues=[QueueInfo(1, "open", "a")],
        running=running,
        pending=[job for job in jobs if job.submitted_at <= NOW],
        usage={tenant: draw(st.floats(0, 1e5)) for tenant in TENANTS},
        fair_share=draw(st.booleans()),
        preemption=draw(st.booleans()),
        max_wait_seconds=draw(st.sampled_from([300.0, 900.0])),
    )
    return snap, [job for job in jobs if job.submitted_at > NOW]


@dataclasses.dataclass
class BoundedReplay(Simulation):
    """A replay with jobs arriving at their submit times; records the first guaranteed
    start each job is given."""

    arrivals: list = dataclasses.field(default_factory=list)
    bounds: dict = dataclasses.field(default_factory=dict)

    def step(self):
        result = super().step()
        for info in result.pending.values():
            if info.guaranteed_start is not None:
                assert info.estimated_start is not None
                assert info.estimated_start <= info.guaranteed_start
                self.bounds.setdefault(info.job_id, info.guaranteed_start)
        return result

    def advance(self, until: float) -> None:
        super().advance(until)
        arrived = [job for job in self.arrivals if job.submitted_at <= until]
        self.arrivals = [job for job in self.arrivals if job.submitted_at > until]
        self.snap.pending.extend(arrived)

    def run(self, cycles: int = 1000) -> None:
        for _ in range(cycles):
            self.step()
            upcoming = [t for t in (self.next_event(),) if t is not None]
            upcoming += [job.submitted_at for job in self.arrivals]
            if not upcoming:
                break
            self.advance(max(min(upcoming), self.snap.now))


@FAST
@given(arriving_work())
def test_a_bounded_job_starts_no_later_than_its_bound(work):
    """Once a job past its maximum wait holds a reservation, it starts by the guaranteed
    start it was first given, whatever arrives later and whatever backfills, as long as
    running jobs end by their limits and no class that may preempt is involved."""
    snap, arrivals = work
    replay = BoundedReplay(snap, arrivals=arrivals)
    replay.run()
    for job_id, bound in replay.bounds.items():
        assert job_id in replay.started, (job_id, bound - NOW)
        assert replay.started[job_id] <= bound + 1e-6, (
            job_id,
            replay.started[job_id] - NOW,
            bound - NOW,
        )
