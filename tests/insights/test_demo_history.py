"""The demo's recorded week, as the insights read it: never more GPUs held than the pool
has, and hourly history present from the first start (seed_demo runs the backfill)."""

import io

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
