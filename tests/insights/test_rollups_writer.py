"""The rollup writer (insights.services.rollups.rollup_write) on hand-made state: exact figures."""

from __future__ import annotations

import fcntl
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from freezegun import freeze_time

from insights.choices import Resolution
from insights.models import GpuActivity, JobGpuSeries, QueueRollup, UsageDay, UsageRollup
from insights.rollups import guarantees, series_merge
from insights.services.rollups import rollup_write
from scheduling.choices import GpuHealth, JobState, WorkloadType
from scheduling.models import Gpu, Quota
from tests import factories as f

from .rollups_helpers import T0, admitted, at, gpus_of, pending, placed, sample

pytestmark = pytest.mark.django_db


def queue_row(queue, bucket, resolution=Resolution.MINUTE):
    return QueueRollup.objects.get(resolution=resolution, bucket=bucket, queue=queue)


def usage_row(pool, bucket, tenant=None, model="H100-80GB", resolution=Resolution.MINUTE):
    return UsageRollup.objects.get(
        resolution=resolution, bucket=bucket, pool=pool, tenant=tenant, gpu_model=model
    )


# --- queues -------------------------------------------------------------------------------


def test_queue_depth_counts_pending_jobs_and_gpus_not_held(world):
    pending(world, gpus=1)
    pending(world, gpus=2)
    pending(world, gpus=4, nodes=2)  # 8 GPUs
    pending(world, gpus=8, state=JobState.HELD)
    pending(world, gpus=3, queue=world.other_queue)

    rollup_write(now=T0)

    row = queue_row(world.queue, at(10, 5))
    assert (row.pending_jobs, row.pending_gpus) == (3.0, 11.0)
    assert row.pool_id == world.pool.pk and row.tenant_id == world.tenant.pk
    other = queue_row(world.other_queue, at(10, 5))
    assert (other.pending_jobs, other.pending_gpus) == (1.0, 3.0)


def test_queue_waits_of_the_jobs_admitted_in_the_minute(world):
    admitted(world, submitted_at=at(10, 0), admitted_at=at(10, 5, 10))  # 310 s
    # Requeued at 10:05:00: this admission's wait began then (scheduling.waits).
    admitted(
        world,
        submitted_at=at(9, 0),
        queued_at=at(10, 5),
        admitted_at=at(10, 5, 20),
        requeue_count=1,
        waited_seconds=500.0,
    )  # 20 s
    admitted(world, submitted_at=at(10, 4), admitted_at=at(10, 4, 50))  # the minute before

    rollup_write(now=T0)

    row = queue_row(world.queue, at(10, 5))
    assert row.admitted_jobs == 2
    assert row.wait_p50_seconds == pytest.approx(165.0)
    assert row.wait_p95_seconds == pytest.approx(20 + 0.95 * 290)
    assert row.wait_max_seconds == pytest.approx(310.0)
    empty = queue_row(world.other_queue, at(10, 5))
    assert empty.admitted_jobs == 0 and empty.wait_p50_seconds is None


def test_the_next_run_completes_the_previous_minute(world):
    admitted(world, submitted_at=at(10, 5), admitted_at=at(10, 5, 10))
    rollup_write(now=T0)
    assert queue_row(world.queue, at(10, 5)).admitted_jobs == 1
    # Admitted after the run, in the same minute; then one in the next minute.
    admitted(world, submitted_at=at(10, 4, 45), admitted_at=at(10, 5, 45))
    admitted(world, submitted_at=at(10, 6), admitted_at=at(10, 6, 5))

    rollup_write(now=at(10, 6, 30))

    previous = queue_row(world.queue, at(10, 5))
    assert previous.admitted_jobs == 2
    assert previous.wait_max_seconds == pytest.approx(60.0)
    assert queue_row(world.queue, at(10, 6)).admitted_jobs == 1


# --- pools, tenants, GPUs -----------------------------------------------------------------


@pytest.fixture
def busy_world(world):
    """nlp's training job on gpu-01's GPUs 0-3 (80 %, 60 %, 2 %, stale sample), vision's
    interactive session on gpu-02's GPUs 0-1 (50 %, 70 %) whose policy calls idle below
    60 %; gpu-02's GPU 7 unhealthy."""
    f.policy(WorkloadType.INTERACTIVE, idle_utilization_threshold=60.0)
    node1, node2 = world.nodes
    g1, g2 = gpus_of(node1), gpus_of(node2)
    fresh = T0 - timedelta(seconds=20)
    for gpu, util, mem in zip(g1[:3], (80.0, 60.0, 2.0), (40000, 30000, 500), strict=True):
        sample(gpu, util, mem, sampled_at=fresh)
    sample(g1[3], 90.0, 1000, sampled_at=T0 - timedelta(minutes=10))  # stale: unknown
    sample(g2[0], 50.0, 2048, sampled_at=fresh)
    sample(g2[1], 70.0, 4096, sampled_at=fresh)
    sample(g1[4], 0.0, 0, sampled_at=fresh)  # free
    Gpu.objects.filter(pk=g2[7].pk).update(health=GpuHealth.UNHEALTHY)
    training = placed(world, g1[:4], granted_at=at(10, 2))
    session = placed(
        world,
        g2[:2],
        granted_at=at(10, 4, 30),
        queue=world.other_queue,
        user=world.outsider,
        workload_type=WorkloadType.INTERACTIVE,
    )
    return world, training, session, g1, g2


def test_usage_per_pool_and_tenant(busy_world):
    world, training, session, g1, g2 = busy_world

    rollup_write(now=T0)

    pool = usage_row(world.pool, at(10, 5))
    assert pool.capacity_gpus == 15.0  # 16 less the unhealthy one
    assert pool.allocated_gpus == 6.0
    assert pool.used_gpus == pytest.approx(0.8 + 0.6 + 0.02 + 0.5 + 0.7)
    # Idle: the 2 % GPU (training threshold 5 %) and the 50 % one (interactive: 60 %).
    assert pool.idle_gpus == 2.0
    nlp = usage_row(world.pool, at(10, 5), tenant=world.tenant)
    assert (nlp.capacity_gpus, nlp.allocated_gpus, nlp.idle_gpus) == (8.0, 4.0, 1.0)
    assert nlp.used_gpus == pytest.approx(1.42)
    vision = usage_row(world.pool, at(10, 5), tenant=world.other)
    assert (vision.capacity_gpus, vision.allocated_gpus, vision.idle_gpus) == (8.0, 2.0, 1.0)
    assert vision.used_gpus == pytest.approx(1.2)


def test_a_tenant_with_a_guarantee_and_nothing_held_has_its_row(world):
    third = f.TenantFactory(slug="speech")
    f.QuotaFactory(tenant=third, pool=world.pool, guaranteed_gpus=4)

    rollup_write(now=T0)

    row = usage_row(world.pool, at(10, 5), tenant=third)
    assert (row.capacity_gpus, row.allocated_gpus, row.used_gpus) == (4.0, 0.0, 0.0)


def test_guarantee_of_any_model_is_shared_by_the_models_without_their_own():
    quotas = [(1, 10, "", 12), (1, 10, "A100-40GB", 2), (2, 10, "", 4)]
    models = {10: {"H100-80GB": 16, "L4-24GB": 8, "A100-40GB": 8}}
    assert guarantees(quotas, models) == {
        (10, "A100-40GB", 1): 2.0,
        (10, "H100-80GB", 1): 8.0,
        (10, "L4-24GB", 1): 4.0,
        (10, "H100-80GB", 2): 2.0,
        (10, "L4-24GB", 2): 1.0,
        (10, "A100-40GB", 2): 1.0,
    }


def test_gpu_activity_busy_idle_and_unknown(busy_world):
    world, training, session, g1, g2 = busy_world

    rollup_write(now=T0)

    def activity(gpu):
        row = GpuActivity.objects.get(gpu=gpu)
        return row.busy_at, row.idle_since

    assert activity(g1[0]) == (T0, None)  # 80 % held
    assert activity(g1[2]) == (None, T0)  # 2 % held: idle
    assert activity(g1[3]) == (None, None)  # held, sample stale: unknown
    assert activity(g1[5]) == (None, T0)  # nobody holds it
    assert activity(g2[0]) == (None, T0)  # 50 % under the session's 60 %

    later = T0 + timedelta(minutes=1)
    sample(g1[0], 1.0, sampled_at=later)
    sample(g1[2], 95.0, sampled_at=later)
    rollup_write(now=later)
    assert activity(g1[0]) == (T0, later)  # busy at T0, idle since it was seen idle
    assert activity(g1[2]) == (later, None)
    assert activity(g1[5]) == (None, T0)  # still idle since T0
    assert GpuActivity.objects.get(gpu=g1[5]).sampled_at == later


# --- jobs' series and chargeback -----------------------------------------------------------


def test_job_series_points_and_gpu_seconds(busy_world):
    world, training, session, g1, g2 = busy_world

    rollup_write(now=T0)  # first run: bills the minute before, [10:04, 10:05)

    series = JobGpuSeries.objects.get(job=training)
    assert series.gpus == ["gpu-01:0", "gpu-01:1", "gpu-01:2", "gpu-01:3"]
    assert series.points == [
        [int(T0.timestamp()), [80.0, 60.0, 2.0, None], [40000, 30000, 500, None]]
    ]
    assert series.allocated_gpu_seconds == pytest.approx(4 * 60)
    assert series.used_gpu_seconds == pytest.approx(60 * (0.8 + 0.6 + 0.02))
    # The session was granted at 10:04:30: 30 s of the window, two GPUs.
    other = JobGpuSeries.objects.get(job=session)
    assert other.allocated_gpu_seconds == pytest.approx(2 * 30)
    assert other.used_gpu_seconds == pytest.approx(30 * (0.5 + 0.7))

    later = T0 + timedelta(minutes=1)
    sample(g1[3], 40.0, 7000, sampled_at=later)
    rollup_write(now=later)
    series.refresh_from_db()
    assert len(series.points) == 2
    assert series.points[1] == [
        int(later.timestamp()),
        [80.0, 60.0, 2.0, 40.0],
        [40000, 30000, 500, 7000],
    ]
    assert series.allocated_gpu_seconds == pytest.approx(8 * 60)
    assert series.used_gpu_seconds == pytest.approx(60 * 1.42 + 60 * 1.82)


def test_series_merges_neighbours_and_doubles_its_step(busy_world, settings):
    world, training, session, g1, g2 = busy_world
    settings.SLUICE_JOB_SERIES_POINTS = 4
    moments = [T0 + timedelta(minutes=i) for i in range(5)]
    for i, moment in enumerate(moments):
        sample(g1[0], 10.0 * (i + 1), 100 * (i + 1), sampled_at=moment)
        rollup_write(now=moment)

    series = JobGpuSeries.objects.get(job=training)
    assert series.step_seconds == 120
    stamps = [int(m.timestamp()) for m in moments]
    assert [p[0] for p in series.points] == [stamps[0], stamps[2], stamps[4]]
    assert [p[1][0] for p in series.points] == [15.0, 35.0, 50.0]
    assert [p[2][0] for p in series.points] == [150.0, 350.0, 500.0]
    assert series.points[0][1][3] is None  # stale in both: still unknown

    rollup_write(now=T0 + timedelta(minutes=5))  # 60 s after the last point: not due
    series.refresh_from_db()
    assert len(series.points) == 3
    rollup_write(now=T0 + timedelta(minutes=6))
    series.refresh_from_db()
    assert len(series.points) == 4
    # Seconds keep accumulating every run: 7 runs × 60 s × 4 GPUs.
    assert series.allocated_gpu_seconds == pytest.approx(7 * 240)


def test_jobs_started_together_merge_in_different_runs(world, settings):
    settings.SLUICE_JOB_SERIES_POINTS = 8  # merges up to 2 points early, by job id
    g = gpus_of(world.nodes[0])
    jobs = [placed(world, [gpu], granted_at=at(9, 0)) for gpu in g[:2]]
    start = int(T0.timestamp()) - 7 * 60
    for job in jobs:
        JobGpuSeries.objects.create(
            job=job, gpus=["x"], points=[[start + 60 * i, [1.0], [1]] for i in range(7)]
        )

    rollup_write(now=T0)

    lengths = {job.pk % 2: len(JobGpuSeries.objects.get(job=job).points) for job in jobs}
    assert lengths == {0: 8, 1: 4}  # the even one appended, the odd one merged 8 into 4


def test_series_merge_means():
    points = [[0, [10, None], [100, None]], [60, [20, None], [200, 5]], [120, [30, 1], [1, 1]]]
    assert series_merge(points) == [[0, [15.0, None], [150.0, 5.0]], [120, [30.0, 1.0], [1.0, 1.0]]]


def test_usage_day_hours_by_owner(busy_world):
    world, training, session, g1, g2 = busy_world

    rollup_write(now=T0)
    rollup_write(now=T0 + timedelta(minutes=1))

    row = UsageDay.objects.get(tenant=world.tenant)
    assert (row.day.isoformat(), row.project_id, row.user_id) == (
        "2026-03-02",
        world.project.pk,
        world.member.pk,
    )
    assert (row.workload_type, row.pool_id, row.gpu_model) == (
        "training",
        world.pool.pk,
        "H100-80GB",
    )
    assert row.allocated_gpu_hours == pytest.approx(2 * 240 / 3600)
    assert row.used_gpu_hours == pytest.approx(2 * 60 * 1.42 / 3600)
    # Of its 4 GPUs × 120 s, the one with a stale sample is not sampled hours.
    assert row.sampled_gpu_hours == pytest.approx(3 * 120 / 3600)
    vision = UsageDay.objects.get(tenant=world.other)
    assert vision.workload_type == "interactive"
    assert vision.allocated_gpu_hours == pytest.approx((60 + 120) / 3600)
    assert vision.sampled_gpu_hours == pytest.approx((60 + 120) / 3600)


def test_an_allocation_released_inside_the_window_is_billed_exactly(world):
    g = gpus_of(world.nodes[0])
    rollup_write(now=T0)
    short = placed(
        world, g[:2], granted_at=at(10, 5, 35), released_at=at(10, 5, 50), state=JobState.SUCCEEDED
    )

    rollup_write(now=at(10, 6, 20))

    row = UsageDay.objects.get(tenant=world.tenant)
    assert row.allocated_gpu_hours == pytest.approx(2 * 15 / 3600)
    assert row.used_gpu_hours == 0.0
    assert not JobGpuSeries.objects.filter(job=short).exists()  # never seen running


def test_a_run_in_the_same_minute_bills_nothing_more(busy_world):
    world, training, session, g1, g2 = busy_world
    rollup_write(now=T0)
    sample(g1[0], 10.0, sampled_at=T0 + timedelta(seconds=20))

    again = rollup_write(now=T0 + timedelta(seconds=20))

    assert again.billed_seconds == 0
    assert UsageDay.objects.get(tenant=world.tenant).allocated_gpu_hours == pytest.approx(
        240 / 3600
    )
    assert len(JobGpuSeries.objects.get(job=training).points) == 1
    assert UsageRollup.objects.filter(bucket=at(10, 5), tenant=None).count() == 1
    assert usage_row(world.pool, at(10, 5)).used_gpus == pytest.approx(0.1 + 0.6 + 0.02 + 0.5 + 0.7)


def test_a_writer_down_for_an_hour_bills_three_minutes(busy_world):
    world, training, session, g1, g2 = busy_world
    rollup_write(now=T0)
    later = T0 + timedelta(hours=1)
    for gpu in g1[:3]:
        Gpu.objects.filter(pk=gpu.pk).update(sampled_at=later)

    run = rollup_write(now=later)

    assert run.billed_seconds == 3 * 60 == 3 * max(settings.SLUICE_ROLLUP_INTERVAL, 60)
    series = JobGpuSeries.objects.get(job=training)
    assert series.allocated_gpu_seconds == pytest.approx(4 * 60 + 4 * 180)


def test_a_window_across_midnight_is_split_between_days(world):
    g = gpus_of(world.nodes[0])
    job = placed(world, g[:1], granted_at=at(23, 0, day=1))
    UsageRollup.objects.create(
        resolution=Resolution.MINUTE,
        bucket=at(23, 58, day=1),
        pool=world.pool,
        gpu_model="H100-80GB",
    )

    with freeze_time(at(0, 1, 15)):
        rollup_write(now=at(0, 1, 15))

    days = dict(
        UsageDay.objects.filter(tenant=world.tenant).values_list("day", "allocated_gpu_hours")
    )
    assert {d.isoformat(): round(h * 3600) for d, h in days.items()} == {
        "2026-03-01": 120,
        "2026-03-02": 60,
    }
    assert JobGpuSeries.objects.get(job=job).allocated_gpu_seconds == pytest.approx(180)


# --- hours and retention ------------------------------------------------------------------


def test_an_ended_hour_is_compacted_from_its_minutes(world):
    for minute, depth in ((10, 2.0), (20, 4.0), (30, 6.0)):
        QueueRollup.objects.create(
            resolution=Resolution.MINUTE,
            bucket=at(9, minute),
            queue=world.queue,
            pool=world.pool,
            tenant=world.tenant,
            pending_jobs=depth,
            pending_gpus=2 * depth,
            admitted_jobs=1 if minute < 30 else 0,
        )
        UsageRollup.objects.create(
            resolution=Resolution.MINUTE,
            bucket=at(9, minute),
            pool=world.pool,
            gpu_model="H100-80GB",
            capacity_gpus=16.0,
            allocated_gpus=depth,
            used_gpus=depth / 2,
            idle_gpus=1.0,
        )
    # The tenant held GPUs in one of the three minutes.
    UsageRollup.objects.create(
        resolution=Resolution.MINUTE,
        bucket=at(9, 20),
        pool=world.pool,
        tenant=world.tenant,
        gpu_model="H100-80GB",
        capacity_gpus=8.0,
        allocated_gpus=3.0,
        used_gpus=1.5,
    )
    admitted(world, submitted_at=at(9, 0), admitted_at=at(9, 10, 40))  # 640 s
    admitted(world, submitted_at=at(9, 15), admitted_at=at(9, 20, 0))  # 300 s
    admitted(world, submitted_at=at(9, 15), admitted_at=at(10, 0, 5))  # the next hour

    run = rollup_write(now=at(10, 0, 30))

    assert run.hours_compacted == 1
    hour = queue_row(world.queue, at(9, 0), Resolution.HOUR)
    assert (hour.pending_jobs, hour.pending_gpus, hour.admitted_jobs) == (4.0, 8.0, 2)
    assert (hour.wait_p50_seconds, hour.wait_max_seconds) == (470.0, 640.0)
    assert hour.wait_p95_seconds == pytest.approx(300 + 0.95 * 340)
    pool = usage_row(world.pool, at(9, 0), resolution=Resolution.HOUR)
    assert (pool.capacity_gpus, pool.allocated_gpus, pool.used_gpus, pool.idle_gpus) == (
        16.0,
        4.0,
        2.0,
        1.0,
    )
    tenant = usage_row(world.pool, at(9, 0), tenant=world.tenant, resolution=Resolution.HOUR)
    assert (tenant.capacity_gpus, tenant.allocated_gpus, tenant.used_gpus) == (
        pytest.approx(8 / 3),
        1.0,
        0.5,
    )
    # Nothing to compact in the next run of the same hour.
    assert rollup_write(now=at(10, 1, 30)).hours_compacted == 0
    assert QueueRollup.objects.filter(resolution=Resolution.HOUR).count() == 1


def test_retention_deletes_old_minutes_and_hours(world, settings):
    settings.SLUICE_ROLLUP_MINUTE_DAYS = 2
    settings.SLUICE_ROLLUP_HOUR_DAYS = 90
    now = at(10, 0, 30)

    def make(resolution, bucket):
        UsageRollup.objects.create(
            resolution=resolution, bucket=bucket, pool=world.pool, gpu_model="H100-80GB"
        )

    make(Resolution.MINUTE, now - timedelta(days=2, minutes=1))
    make(Resolution.MINUTE, now - timedelta(days=1))
    make(Resolution.HOUR, floor := (now - timedelta(days=91)).replace(minute=0, second=0))
    make(Resolution.HOUR, now.replace(minute=0, second=0) - timedelta(days=89))

    rollup_write(now=now)

    minutes = UsageRollup.objects.filter(resolution=Resolution.MINUTE, tenant=None)
    assert sorted(minutes.values_list("bucket", flat=True)) == [now - timedelta(days=1), at(10, 0)]
    hours = UsageRollup.objects.filter(resolution=Resolution.HOUR).values_list("bucket", flat=True)
    assert floor not in hours
    assert now.replace(minute=0, second=0) - timedelta(days=89) in hours


# --- cost and safety ------------------------------------------------------------------------


def _cluster(world, nodes: int, prefix: str):
    """``nodes`` more nodes of 8 GPUs, each GPU held by a one-GPU running job and sampled."""
    moment = T0 - timedelta(seconds=10)
    queues = [world.queue, world.other_queue]
    for n in range(nodes):
        node = f.NodeFactory(name=f"{prefix}-{n:02d}", pool=world.pool)
        for i in range(8):
            gpu = f.GpuFactory(node=node, index=i, uuid=f"GPU-{prefix}-{n}-{i}")
            sample(gpu, 10.0 * i, 1000, sampled_at=moment)
            placed(world, [gpu], granted_at=T0 - timedelta(minutes=30), queue=queues[i % 2])
        pending(world, gpus=2)
        admitted(
            world, submitted_at=T0 - timedelta(minutes=3), admitted_at=T0 - timedelta(seconds=5)
        )


def _queries(world, nodes: int, prefix: str) -> int:
    _cluster(world, nodes, prefix)
    rollup_write(now=T0)
    with CaptureQueriesContext(connection) as ctx:
        rollup_write(now=T0 + timedelta(minutes=1))
    return len(ctx.captured_queries)


def test_query_count_does_not_grow_with_jobs_and_gpus(world):
    small = _queries(world, 1, "small")
    JobGpuSeries.objects.all().delete()
    for model in (QueueRollup, UsageRollup, UsageDay, GpuActivity):
        model.objects.all().delete()
    large = _queries(world, 5, "large")
    assert JobGpuSeries.objects.count() == 48
    assert small == large
    assert large <= 25, large


def test_a_run_while_another_holds_the_lock_does_nothing(world):
    if connection.vendor != "sqlite":
        pytest.skip("the file lock is SQLite's; PostgreSQL uses an advisory lock")
    with open(settings.VAR_DIR / "rollups.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            assert rollup_write(now=T0) is None
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    assert not UsageRollup.objects.exists()
    assert rollup_write(now=T0) is not None


def test_the_beat_task_runs_the_writer(world):
    from insights.tasks import rollup

    with freeze_time(T0):
        result = rollup.delay().get()
    assert result["bucket"] == at(10, 5).isoformat()
    assert UsageRollup.objects.filter(bucket=at(10, 5), tenant=None).count() == 1


def test_quota_of_a_model_without_gpus_writes_no_row(world):
    Quota.objects.create(
        tenant=world.tenant, pool=world.pool, gpu_model="A100-40GB", guaranteed_gpus=4
    )
    rollup_write(now=T0)
    assert not UsageRollup.objects.filter(gpu_model="A100-40GB").exists()
