"""Quota history: every change of a quota's GPUs is recorded in force from its moment, and
usage bills each day against the quota in force that day (a change today does not rewrite
the days before it)."""

import datetime as dt
import importlib

import pytest
from django.apps import apps
from freezegun import freeze_time

from insights import usage
from scheduling.models import Quota, QuotaChange
from scheduling.services import config
from tests import factories as f

pytestmark = pytest.mark.django_db

UTC = dt.UTC


def _guaranteed(user, day: dt.date, *, tenant="nlp", end: dt.date | None = None) -> float:
    query = usage.UsageQuery(start=day, end=end or day, group_by=(), tenants=(tenant,))
    return usage.usage_totals(user, query)["guaranteed_gpu_hours"]


def _history(tenant):
    return list(
        QuotaChange.objects.filter(tenant=tenant)
        .order_by("effective_from", "id")
        .values_list("guaranteed_gpus", "borrow_limit_gpus", "effective_from")
    )


def test_each_day_is_billed_against_the_quota_in_force_that_day(world):
    admin = world.platform_admin
    pool = f.PoolFactory(name="burst")
    with freeze_time("2026-05-01 00:00:00"):
        quota = config.quota_save(
            actor=admin, tenant=world.tenant, pool=pool, guaranteed_gpus=8, borrow_limit_gpus=0
        )
    with freeze_time("2026-05-03 12:00:00"):
        config.quota_save(actor=admin, quota=quota, guaranteed_gpus=2)
    assert _history(world.tenant) == [
        (8, 0, dt.datetime(2026, 5, 1, tzinfo=UTC)),
        (2, 0, dt.datetime(2026, 5, 3, 12, tzinfo=UTC)),
    ]
    with freeze_time("2026-05-03 18:00:00"):
        query = usage.UsageQuery(
            start=dt.date(2026, 5, 1), end=dt.date(2026, 5, 3), group_by=("pool",)
        )
        rows = {r["pool"]: r for r in usage.usage_report(admin, query).rows}
        # Days 1 and 2 at 8 GPUs (192 GPU-h each); day 3: 12 h at 8, 6 h at 2 (so far).
        assert rows["burst"]["guaranteed_gpu_hours"] == 192 + 192 + 96 + 12
        by_day = usage.UsageQuery(
            start=dt.date(2026, 5, 1),
            end=dt.date(2026, 5, 3),
            group_by=("day", "pool"),
            pools=("burst",),
        )
        report = usage.usage_report(admin, by_day)
        assert report.guaranteed_by_day() == [192.0, 192.0, 96.0 + 24.0]
        assert _guaranteed(admin, dt.date(2026, 5, 2)) == 192 + 8 * 24  # and the world's pool
    # The next day the change does not reach back: 5 May is billed at 2 GPUs.
    with freeze_time("2026-05-06 00:00:00"):
        query = usage.UsageQuery(
            start=dt.date(2026, 5, 5), end=dt.date(2026, 5, 5), group_by=("pool",)
        )
        rows = {r["pool"]: r for r in usage.usage_report(admin, query).rows}
        assert rows["burst"]["guaranteed_gpu_hours"] == 48


def test_a_quota_written_before_its_history_keeps_its_value_before_the_change(world):
    """The world's quotas were written directly (no history): the first change records
    their previous value as in force since the epoch, so the days before keep it."""
    quota = Quota.objects.get(tenant=world.tenant, pool=world.pool)
    assert not QuotaChange.objects.exists()
    with freeze_time("2026-05-10 06:00:00"):
        config.quota_save(actor=world.platform_admin, quota=quota, guaranteed_gpus=4)
        assert _history(world.tenant) == [
            (8, 8, dt.datetime(1970, 1, 1, tzinfo=UTC)),
            (4, 8, dt.datetime(2026, 5, 10, 6, tzinfo=UTC)),
        ]
    with freeze_time("2026-05-11 00:00:00"):
        assert _guaranteed(world.platform_admin, dt.date(2026, 5, 9)) == 8 * 24
        assert _guaranteed(world.platform_admin, dt.date(2026, 5, 10)) == 8 * 6 + 4 * 18
    # Saving without a change of GPUs writes no history.
    with freeze_time("2026-05-12 00:00:00"):
        config.quota_save(actor=world.platform_admin, quota=quota, max_running_jobs=3)
    assert len(_history(world.tenant)) == 2


def test_a_deleted_quota_still_bills_the_days_it_was_in_force(world, client):
    quota = Quota.objects.get(tenant=world.other, pool=world.pool)
    client.force_login(world.platform_admin)
    with freeze_time("2026-05-10 12:00:00"):
        response = client.delete(f"/api/v1/quotas/{quota.pk}/")
        assert response.status_code == 204, response.content
    assert not Quota.objects.filter(pk=quota.pk).exists()
    assert [(g, b) for g, b, _ in _history(world.other)] == [(8, 8), (0, 0)]
    with freeze_time("2026-05-12 00:00:00"):
        assert _guaranteed(world.platform_admin, dt.date(2026, 5, 10), tenant="vision") == 96
        assert _guaranteed(world.platform_admin, dt.date(2026, 5, 11), tenant="vision") == 0


def test_a_quota_moved_to_another_pool_ends_in_the_old_one(world):
    pool = f.PoolFactory(name="burst")
    quota = Quota.objects.get(tenant=world.tenant, pool=world.pool)
    with freeze_time("2026-05-10 00:00:00"):
        config.quota_save(actor=world.platform_admin, quota=quota, pool=pool)
    rows = set(
        QuotaChange.objects.filter(tenant=world.tenant).values_list(
            "pool__name", "guaranteed_gpus", "effective_from"
        )
    )
    moved = dt.datetime(2026, 5, 10, tzinfo=UTC)
    epoch = dt.datetime(1970, 1, 1, tzinfo=UTC)
    assert rows == {("training", 8, epoch), ("training", 0, moved), ("burst", 8, moved)}


def test_an_applied_change_through_config_save_is_recorded(world):
    """What an applied recommendation does (config_save on the quota) enters the history."""
    quota = Quota.objects.get(tenant=world.tenant, pool=world.pool)
    with freeze_time("2026-05-10 00:00:00"):
        config.config_save(
            actor=world.platform_admin,
            instance=quota,
            changes={"guaranteed_gpus": 4, "borrow_limit_gpus": 12},
            action="quota.update",
        )
    assert [(g, b) for g, b, _ in _history(world.tenant)] == [(8, 8), (4, 12)]


def test_the_django_admin_records_the_history_too(world, client):
    quota = Quota.objects.get(tenant=world.tenant, pool=world.pool)
    client.force_login(world.platform_admin)
    response = client.post(
        f"/admin/scheduling/quota/{quota.pk}/change/",
        {
            "tenant": world.tenant.pk,
            "pool": world.pool.pk,
            "gpu_model": "",
            "guaranteed_gpus": 3,
            "borrow_limit_gpus": 8,
            "max_running_jobs": "",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    assert [(g, b) for g, b, _ in _history(world.tenant)] == [(8, 8), (3, 8)]


def test_the_migration_records_the_current_quotas_as_in_force_since_the_epoch(world):
    migration = importlib.import_module("scheduling.migrations.0014_quota_history")
    migration.record_current_quotas(apps, None)
    rows = set(
        QuotaChange.objects.values_list(
            "tenant__slug", "pool__name", "guaranteed_gpus", "borrow_limit_gpus", "effective_from"
        )
    )
    epoch = dt.datetime(1970, 1, 1, tzinfo=UTC)
    assert rows == {("nlp", "training", 8, 8, epoch), ("vision", "training", 8, 8, epoch)}


def test_members_see_only_their_tenants_quota_history(world):
    with freeze_time("2026-05-10 00:00:00"):
        config.quota_save(
            actor=world.platform_admin,
            quota=Quota.objects.get(tenant=world.other, pool=world.pool),
            guaranteed_gpus=1,
        )
    query = usage.UsageQuery(start=dt.date(2026, 5, 1), end=dt.date(2026, 5, 1), group_by=())
    assert {g["tenant"] for g in usage.guarantees_for(world.member, query)} == {"nlp"}
    assert {g["tenant"] for g in usage.guarantees_for(world.outsider, query)} == {"vision"}
