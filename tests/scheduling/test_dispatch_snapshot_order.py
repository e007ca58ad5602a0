"""What the dispatch loop hands the engine for the size- and runtime-aware order and for
preemption churn: predictions, policies' max wait and preemption limits, the
settings' ordering knobs; and that reading them keeps the loop's query count flat."""

from datetime import timedelta

from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling.choices import JobState, WorkloadType
from scheduling.models import PriorityClass, Quota, WorkloadPolicy
from scheduling.positions import positions_attach
from scheduling.services import dispatch
from scheduling.services.pending_cache import PendingCache
from scheduling.services.runtime_history import runtime_history_record
from tests import factories as f


def _finished(world, runtime, limit=10_000, **kw):
    end = timezone.now() - timedelta(hours=1)
    kw = {"project": world.project, "submitted_by": world.member, **kw}
    job = f.JobFactory(
        queue=world.queue,
        state=JobState.SUCCEEDED,
        max_runtime_seconds=limit,
        submitted_at=end - timedelta(seconds=runtime),
        admitted_at=end - timedelta(seconds=runtime),
        started_at=end - timedelta(seconds=runtime),
        finished_at=end,
        **kw,
    )
    runtime_history_record(job)
    return job


def _pending(world, **kw):
    kw = {"project": world.project, "submitted_by": world.member, **kw}
    return f.JobFactory(queue=world.queue, **kw)


def _snapshot(pending_cache=None):
    return dispatch.load_snapshot(
        timezone.now(), update_usage=False, pending_cache=pending_cache
    ).snapshot


def test_pending_jobs_carry_their_prediction_and_their_policys_max_wait(world):
    f.policy(WorkloadType.TRAINING, max_wait_seconds=4 * 3600)
    for runtime in (2000, 2000, 2000):
        _finished(world, runtime)  # ratio 0.2
    predicted = _pending(world, max_runtime_seconds=7200)
    unknown = _pending(world, workload_type=WorkloadType.EVALUATION, max_runtime_seconds=7200)
    WorkloadPolicy.objects.filter(workload_type=WorkloadType.EVALUATION).delete()

    pending = {p.id: p for p in _snapshot().pending}

    assert pending[predicted.pk].expected_runtime_seconds == 1440.0
    assert pending[predicted.pk].max_wait_seconds == 4 * 3600
    # No history: the engine uses the declared limit; no policy: the snapshot's max wait.
    assert pending[unknown.pk].expected_runtime_seconds == 0.0
    assert pending[unknown.pk].max_wait_seconds == 0.0


def test_running_jobs_carry_their_preemptions_and_their_policys_limits(world):
    f.policy(WorkloadType.TRAINING, max_preemptions=2, preemption_protection_seconds=1800)
    gpus = list(world.nodes[0].gpus.all()[:2])
    running = f.placed_job(
        gpus=gpus,
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        preemption_count=2,
        requeue_count=2,
    )
    fresh = f.placed_job(
        gpus=list(world.nodes[1].gpus.all()[:1]),
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        workload_type=WorkloadType.INTERACTIVE,
    )
    WorkloadPolicy.objects.filter(workload_type=WorkloadType.INTERACTIVE).delete()

    by_id = {r.id: r for r in _snapshot().running}

    job = by_id[running.pk]
    assert (job.preemptions, job.max_preemptions, job.preemption_protection_seconds) == (
        2,
        2,
        1800,
    )
    # Nothing on the node or in the portal records checkpoints: counted from the start.
    assert job.checkpointed_at is None
    other = by_id[fresh.pk]
    assert (other.preemptions, other.max_preemptions, other.preemption_protection_seconds) == (
        0,
        0,
        0,
    )


@override_settings(SLUICE_PREEMPTION_MIN_GAIN_SECONDS=3600)
def test_with_a_minimum_gain_running_jobs_carry_their_prediction(world):
    cache = PendingCache()
    for runtime in (2000, 2000, 2000):
        _finished(world, runtime)  # ratio 0.2
    placed = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    predicted = f.placed_job(
        gpus=list(world.nodes[0].gpus.all()[:1]), max_runtime_seconds=7200, **placed
    )
    unknown = f.placed_job(
        gpus=list(world.nodes[1].gpus.all()[:1]),
        workload_type=WorkloadType.EVALUATION,
        **placed,
    )

    snapshot = _snapshot(cache)
    by_id = {r.id: r for r in snapshot.running}
    assert snapshot.preemption_min_gain_seconds == 3600.0
    assert by_id[predicted.pk].expected_runtime_seconds == 1440.0
    assert by_id[unknown.pk].expected_runtime_seconds == 0.0
    # Predicted once, when first seen placed: the next cycles read no history.
    with CaptureQueriesContext(connection) as first:
        _snapshot(cache)
    later = f.placed_job(gpus=list(world.nodes[0].gpus.all()[1:2]), **placed)
    with CaptureQueriesContext(connection) as second:
        again = {r.id: r for r in _snapshot(cache).running}
    assert len(second.captured_queries) == len(first.captured_queries) + 1
    assert again[later.pk].expected_runtime_seconds > 0
    with override_settings(SLUICE_PREEMPTION_MIN_GAIN_SECONDS=0):
        plain = _snapshot(cache)
    assert plain.preemption_min_gain_seconds == 0.0
    assert {r.expected_runtime_seconds for r in plain.running} == {0.0}


@override_settings(
    SLUICE_SIZE_ORDER=False,
    SLUICE_SIZE_HALVING_SECONDS=900,
    SLUICE_MAX_WAIT_SECONDS=7200,
    SLUICE_FAIR_SHARE_BAND=0.5,
    SLUICE_GANG_BORROWER_RESERVE_SECONDS=14400,
    SLUICE_CLASS_AGING_SECONDS=3600,
    SLUICE_TIME_SHARING_LEVELS_GPU_HOURS=(16.0, 256.0, 4096.0),
    SLUICE_TIME_SHARING_PROMOTION_SECONDS=0.0,
    SLUICE_TIME_SHARING_MIN_WAIT_SECONDS=1800.0,
)
def test_the_ordering_knobs_come_from_the_settings(world):
    snapshot = _snapshot()
    assert snapshot.class_aging_seconds == 3600.0
    # Time-sharing's levels are set in GPU-hours and reach the engine in GPU-seconds.
    assert snapshot.time_sharing_levels == (16 * 3600.0, 256 * 3600.0, 4096 * 3600.0)
    assert snapshot.time_sharing_promotion_seconds == 0.0
    assert snapshot.time_sharing_min_wait_seconds == 1800.0

    assert (snapshot.size_order, snapshot.size_halving_seconds) == (False, 900.0)
    assert (snapshot.max_wait_seconds, snapshot.fair_share_band) == (7200.0, 0.5)
    assert snapshot.gang_borrower_reserve_seconds == 14400.0


def test_default_ordering_knobs(world):
    snapshot = _snapshot()

    assert snapshot.size_order is True
    # The defaults of scheduling.engine.defaults (the simulator's `sluice` policy).
    assert (snapshot.size_halving_seconds, snapshot.max_wait_seconds) == (21600.0, 172800.0)
    assert snapshot.fair_share_band == 1.0
    assert snapshot.preemption_min_gain_seconds == 0.0  # a higher class preempts for any gain
    assert snapshot.gang_borrower_reserve_seconds == 0.0
    assert snapshot.class_aging_seconds == 0.0
    assert snapshot.time_sharing_levels == (64 * 3600.0, 1024 * 3600.0)
    assert snapshot.time_sharing_promotion_seconds == 8 * 3600.0
    assert snapshot.time_sharing_min_wait_seconds == 3600.0


def _count_load_queries() -> int:
    with CaptureQueriesContext(connection) as ctx:
        dispatch.load_snapshot(timezone.now())
    return len(ctx.captured_queries)


def _grow(world, n, free_gpus):
    colleague = f.UserFactory(username=f"colleague-{n}")
    project = f.ProjectFactory(tenant=world.tenant, slug=f"p-{n}")
    for _ in range(3):
        _finished(world, 1000, submitted_by=colleague, project=project)
    for i in range(n):
        _pending(world, submitted_by=colleague if i % 2 else world.member, project=project)
        f.placed_job(
            gpus=[next(free_gpus)],
            queue=world.queue,
            project=project,
            submitted_by=colleague,
            preemption_count=1,
        )


def test_the_loops_query_count_does_not_grow_with_the_jobs(world, monkeypatch):
    # Usage is stored at most every 10 s: stored every time here, for counts that do not
    # depend on the clock.
    monkeypatch.setattr(dispatch, "USAGE_WRITE_SECONDS", 0.0)
    free_gpus = iter([gpu for node in world.nodes for gpu in node.gpus.all()])
    _grow(world, 4, free_gpus)
    few = _count_load_queries()
    _grow(world, 12, free_gpus)
    many = _count_load_queries()

    assert few == many


def test_class_aging_moves_an_old_low_job_ahead_of_normal_work_in_the_dispatch_loop(
    world, settings
):
    """SLUICE_CLASS_AGING_SECONDS reaches the engine: a low job that has waited 2 h is
    ordered with normal work (by size, its wait aging it), ahead of a new normal job, when
    its tenant's guarantee has room for it; one that could only borrow is not."""
    low = PriorityClass.objects.get(name="low")
    Quota.objects.filter(tenant=world.tenant).update(guaranteed_gpus=16)
    f.placed_job(
        gpus=list(world.nodes[0].gpus.all()[:1]),
        queue=world.other_queue,
        project=world.other_project,
        submitted_by=world.outsider,
    )
    shape = {"nodes": 2, "gpus_per_node": 8, "max_runtime_seconds": 3600}
    old_low = _pending(
        world,
        priority_class=low,
        base_priority_class=low,
        submitted_at=timezone.now() - timedelta(hours=2),
        **shape,
    )
    new_normal = _pending(world, **shape)

    settings.SLUICE_CLASS_AGING_SECONDS = 0
    dispatch.dispatch_cycle()
    old_low.refresh_from_db()
    new_normal.refresh_from_db()
    positions_attach([old_low, new_normal])
    assert (new_normal.pool_position, old_low.pool_position) == (1, 2)

    settings.SLUICE_CLASS_AGING_SECONDS = 3600
    dispatch.dispatch_cycle()
    old_low.refresh_from_db()
    new_normal.refresh_from_db()
    positions_attach([old_low, new_normal])
    assert (old_low.pool_position, new_normal.pool_position) == (1, 2)
    assert old_low.state == JobState.PENDING and old_low.priority_class == low

    Quota.objects.filter(tenant=world.tenant).update(guaranteed_gpus=8)
    dispatch.dispatch_cycle()
    old_low.refresh_from_db()
    new_normal.refresh_from_db()
    positions_attach([old_low, new_normal])
    assert (new_normal.pool_position, old_low.pool_position) == (1, 2)
