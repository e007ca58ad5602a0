"""The backfill (insights.services.rollups.rollups_backfill and ``manage.py insights_backfill``):
hour rows and daily usage rebuilt exactly from recorded jobs and allocations."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from freezegun import freeze_time

from insights.choices import Resolution
from insights.models import QueueRollup, UsageDay, UsageRollup
from insights.services.rollups import rollups_backfill
from scheduling.choices import JobState

from .rollups_helpers import at, gpus_of, pending, placed

pytestmark = pytest.mark.django_db
NOW = at(12, 30)


@pytest.fixture
def history(world):
    g = gpus_of(world.nodes[0])
    # nlp: waited 10:00-10:30, held 2 GPUs 10:30-11:15.
    placed(
        world,
        g[:2],
        submitted_at=at(10, 0),
        granted_at=at(10, 30),
        released_at=at(11, 15),
        state=JobState.SUCCEEDED,
    )
    # vision: stored without allocations (like the demo's history): 4 GPUs 11:00-12:30.
    pending(
        world,
        queue=world.other_queue,
        gpus=4,
        state=JobState.SUCCEEDED,
        submitted_at=at(10, 50),
        admitted_at=at(11, 0),
        started_at=at(11, 0),
        finished_at=at(12, 30),
    )
    # nlp: pending since 11:30.
    pending(world, gpus=1, submitted_at=at(11, 30))
    # nlp: admitted at 9:10 after 10 min, preempted and requeued at 9:40, admitted at 9:50.
    pending(
        world,
        gpus=1,
        state=JobState.ADMITTED,
        submitted_at=at(9, 0),
        first_wait_seconds=600.0,
        waited_seconds=600.0,
        requeue_count=1,
        queued_at=at(9, 40),
        admitted_at=at(9, 50),
    )
    return world


def q(queue, hour):
    return QueueRollup.objects.get(resolution=Resolution.HOUR, bucket=hour, queue=queue)


def u(world, hour, tenant=None):
    return UsageRollup.objects.get(
        resolution=Resolution.HOUR,
        bucket=hour,
        pool=world.pool,
        tenant=tenant,
        gpu_model="H100-80GB",
    )


def test_backfill_rebuilds_queue_hours(history):
    world = history
    result = rollups_backfill(days=1, now=NOW)

    assert result["hours"] == 24
    assert QueueRollup.objects.filter(queue=world.queue, resolution=Resolution.HOUR).count() == 24
    nine = q(world.queue, at(9, 0))
    assert nine.pending_jobs == pytest.approx(20 / 60)  # 9:00-9:10 and 9:40-9:50
    assert (nine.admitted_jobs, nine.wait_p50_seconds, nine.wait_max_seconds) == (2, 600.0, 600.0)
    ten = q(world.queue, at(10, 0))
    assert (ten.pending_jobs, ten.pending_gpus) == (0.5, 1.0)
    assert (ten.admitted_jobs, ten.wait_max_seconds) == (1, 1800.0)
    eleven = q(world.queue, at(11, 0))
    assert (eleven.pending_jobs, eleven.admitted_jobs) == (0.5, 0)
    other = q(world.other_queue, at(10, 0))
    assert other.pending_jobs == pytest.approx(1 / 6)
    assert other.pending_gpus == pytest.approx(4 / 6)
    assert q(world.other_queue, at(11, 0)).wait_p50_seconds == 600.0
    assert q(world.queue, at(12, 0, day=1)).pending_jobs == 0.0


def test_backfill_rebuilds_allocations_per_pool_and_tenant(history):
    world = history
    rollups_backfill(days=1, now=NOW)

    ten, eleven = u(world, at(10, 0)), u(world, at(11, 0))
    # 2 GPUs × 30 min; the nlp job admitted at 9:50 holds no allocation row and has no
    # end: it counts its 1 GPU until now.
    assert (ten.capacity_gpus, ten.allocated_gpus, ten.used_gpus, ten.idle_gpus) == (
        16.0,
        2.0,
        0.0,
        0.0,
    )
    # 2 GPUs × 15 min of nlp, 4 GPUs × 60 min of vision, and the 1 GPU.
    assert eleven.allocated_gpus == pytest.approx(0.5 + 4 + 1)
    assert u(world, at(11, 0), world.tenant).allocated_gpus == pytest.approx(1.5)
    assert u(world, at(11, 0), world.other).allocated_gpus == pytest.approx(4.0)
    assert u(world, at(11, 0), world.other).capacity_gpus == 8.0
    # A tenant with a guarantee has its row every hour.
    assert UsageRollup.objects.filter(resolution=Resolution.HOUR, tenant=world.other).count() == 24


def test_backfill_sets_daily_allocated_hours(history):
    world = history
    rollups_backfill(days=1, now=NOW)

    hours = {
        (row.tenant_id, row.day.isoformat()): row.allocated_gpu_hours
        for row in UsageDay.objects.all()
    }
    assert hours[(world.other.pk, "2026-03-02")] == pytest.approx(6.0)
    # 2 GPUs × 45 min, and 1 GPU from 9:50 to 12:30.
    assert hours[(world.tenant.pk, "2026-03-02")] == pytest.approx(1.5 + 160 / 60)
    assert set(UsageDay.objects.values_list("used_gpu_hours", flat=True)) == {0.0}


def test_backfill_keeps_hours_already_written_unless_replaced(history):
    world = history
    UsageRollup.objects.create(
        resolution=Resolution.HOUR,
        bucket=at(10, 0),
        pool=world.pool,
        gpu_model="H100-80GB",
        allocated_gpus=7.0,
        used_gpus=5.0,
    )
    rollups_backfill(days=1, now=NOW)
    assert u(world, at(10, 0)).used_gpus == 5.0
    assert not UsageRollup.objects.filter(bucket=at(10, 0), tenant=world.tenant).exists()

    rollups_backfill(days=1, now=NOW, replace=True)
    assert (u(world, at(10, 0)).allocated_gpus, u(world, at(10, 0)).used_gpus) == (2.0, 0.0)
    assert QueueRollup.objects.filter(resolution=Resolution.HOUR).count() == 48


def test_backfill_twice_gives_the_same_days(history):
    rollups_backfill(days=1, now=NOW)
    first = sorted(UsageDay.objects.values_list("allocated_gpu_hours", flat=True))
    rollups_backfill(days=1, now=NOW)
    assert sorted(UsageDay.objects.values_list("allocated_gpu_hours", flat=True)) == first


def test_the_command(history):
    out = StringIO()
    with freeze_time(NOW):
        call_command("insights_backfill", "--days", "2", stdout=out)
    assert "48 hours" in out.getvalue()
    assert QueueRollup.objects.filter(resolution=Resolution.HOUR, queue=history.queue).count() == 48
    with pytest.raises(CommandError):
        call_command("insights_backfill", "--days", "0")
