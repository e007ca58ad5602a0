"""A job past its maximum wait that holds a reservation is guaranteed to start by its
start: the dispatch loop keeps the bound per pool, the job page and the API show it."""

from datetime import timedelta

from django.utils import timezone

from scheduling.choices import JobState
from scheduling.models import Job, PoolEstimates, Quota
from scheduling.positions import positions_attach
from scheduling.services.dispatch import dispatch_cycle
from tests import factories as f


def _job(world, **kw):
    return f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        gpus_per_node=8,
        base_priority_class=world.normal,
        priority_class=world.normal,
        **kw,
    )


def test_an_overdue_job_is_guaranteed_to_start_by_its_reservation(world, client):
    Quota.objects.filter(tenant=world.tenant).update(guaranteed_gpus=32, borrow_limit_gpus=0)
    running = [_job(world, max_runtime_seconds=3600) for _ in range(2)]
    dispatch_cycle()
    for job in running:
        job.refresh_from_db()
        assert job.state == JobState.ADMITTED
    old = _job(world, submitted_at=timezone.now() - timedelta(days=3))
    fresh = _job(world)
    dispatch_cycle()

    row = PoolEstimates.objects.get(pool=world.pool)
    assert set(row.guaranteed) == {str(old.pk)}
    old, fresh = positions_attach(Job.objects.filter(pk__in=[old.pk, fresh.pk]).order_by("pk"))
    assert old.state == JobState.PENDING
    assert old.guaranteed_start is not None
    assert old.estimated_start <= old.guaranteed_start
    assert (old.guaranteed_start - old.estimated_start).total_seconds() <= 1  # rounded up
    assert fresh.estimated_start is not None and fresh.guaranteed_start is None

    client.force_login(world.member)
    body = client.get(f"/api/v1/jobs/{old.pk}/").json()
    assert body["guaranteed_start"] is not None
    assert body["pool_position"] == 1
    assert client.get(f"/api/v1/jobs/{fresh.pk}/").json()["guaranteed_start"] is None
    page = client.get(f"/jobs/{old.pk}/").content.decode()
    assert "Guaranteed to start by" in page
    assert "Guaranteed to start by" not in client.get(f"/jobs/{fresh.pk}/").content.decode()
