"""The demo's recorded week, as the insights read it: never more GPUs held than the pool
has, and hourly history present from the first start (seed_demo runs the backfill)."""

import io

import pytest
from django.core.management import call_command
from django.db.models import F
from freezegun import freeze_time

from insights.choices import Resolution
from insights.models import QueueRollup, UsageRollup


# Mid-hour, the clock running: the backfill writes the hours up to the current one, so a
# second seed in the next hour (a run that straddled the hour) would add that hour's rows.
@freeze_time("2026-11-18 10:20:00", tick=True)
def test_the_demo_history_fits_its_pools_and_is_rolled_up(db):
    call_command("seed_demo", stdout=io.StringIO())
    pools = UsageRollup.objects.filter(resolution=Resolution.HOUR, tenant__isnull=True)
    assert pools.filter(pool__name="training", allocated_gpus__gt=0).count() > 24
    assert not pools.filter(allocated_gpus__gt=F("capacity_gpus") + 1e-9).exists()
    assert QueueRollup.objects.filter(resolution=Resolution.HOUR, admitted_jobs__gt=0).exists()
    # Seeding again keeps the history as it is.
    before = pools.count()
    call_command("seed_demo", stdout=io.StringIO())
    assert pools.count() == before


@freeze_time("2026-11-18 10:20:00", tick=True)
def test_the_demo_history_carries_gpu_utilization(db):
    """The demo's jobs never ran on an agent: seed_demo gives them samples (a series each),
    so its usage reads GPU-hours used, and the pools' hours used GPUs, not 0 %."""
    from django.contrib.auth import get_user_model

    from insights.models import JobGpuSeries, UsageDay
    from insights.usage import UsageQuery, usage_totals
    from scheduling.models import Job

    call_command("seed_demo", stdout=io.StringIO())
    history = Job.objects.filter(name__startswith="demo-history-")
    assert JobGpuSeries.objects.filter(job__in=history).count() == history.count() > 0
    series = JobGpuSeries.objects.filter(job__in=history).first()
    values = [u for point in series.points for u in point[1]]
    assert values and all(0.0 <= u <= 100.0 for u in values)

    import datetime as dt

    today = dt.date(2026, 11, 18)
    query = UsageQuery(start=today - dt.timedelta(days=8), end=today, group_by=())
    totals = usage_totals(get_user_model().objects.get(username="admin"), query)
    assert totals["allocated_gpu_hours"] > 100
    assert totals["utilization_note"] is None
    assert 20 < totals["utilization_pct"] < 95
    pools = UsageRollup.objects.filter(resolution=Resolution.HOUR, tenant__isnull=True)
    assert pools.filter(used_gpus__gt=0).exists()
    assert not pools.filter(used_gpus__gt=F("allocated_gpus") + 1e-9).exists()
    # Seeding again adds no used hours twice.
    used = sum(UsageDay.objects.values_list("used_gpu_hours", flat=True))
    call_command("seed_demo", stdout=io.StringIO())
    assert sum(UsageDay.objects.values_list("used_gpu_hours", flat=True)) == pytest.approx(used)
