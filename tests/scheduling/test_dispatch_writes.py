"""What a dispatch cycle writes follows what changed, not how many jobs wait.

Positions are counted from sort keys when read, estimates live in one row per pool, the
leader keeps the waiting jobs between cycles: a cycle in which nothing changed writes no
job row, and a job leaving the head does not rewrite the jobs behind it.
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling.choices import JobState
from scheduling.models import Job, PoolEstimates, Quota
from scheduling.positions import positions_attach
from scheduling.services import dispatch
from scheduling.services.dispatch import LEADER_CACHE, dispatch_cycle
from scheduling.services.sql import rows_update
from tests import factories as f


def _job(world, gpus=8, **kw):
    return f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        gpus_per_node=gpus,
        base_priority_class=kw.pop("priority", world.normal),
        priority_class=kw.pop("priority_class", world.normal),
        **kw,
    )


def _job_updates(queries) -> list[str]:
    table = Job._meta.db_table
    return [
        q["sql"]
        for q in queries
        if q["sql"].lstrip().upper().startswith("UPDATE") and table in q["sql"]
    ]


@pytest.fixture
def backlog(world):
    """Both nodes full with nlp's 8-GPU jobs, six more of them waiting."""
    Quota.objects.filter(tenant=world.tenant).update(guaranteed_gpus=16, borrow_limit_gpus=0)
    running = [_job(world) for _ in range(2)]
    dispatch_cycle()
    waiting = [_job(world) for _ in range(6)]
    dispatch_cycle()
    for job in running:
        job.refresh_from_db()
        assert job.state == JobState.ADMITTED
    return running, waiting


def test_a_cycle_in_which_nothing_changed_writes_no_job_row(
    backlog, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()  # committed: the leader knows the estimates it wrote
    with CaptureQueriesContext(connection) as ctx:
        stats = dispatch_cycle()
    assert stats["pending"] == 6 and stats["placed"] == 0
    assert stats["pending_updated"] == 0 and stats["pending_read_whole"] == 0
    assert _job_updates(ctx.captured_queries) == []
    writes = [
        q["sql"]
        for q in ctx.captured_queries
        if q["sql"].lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE"))
    ]
    assert writes == []  # nor usage, estimates or anything else: the commit has nothing to wait on


def test_fair_share_usage_is_stored_every_ten_seconds(backlog):
    from freezegun import freeze_time

    from scheduling.models import TenantUsage

    before = dict(TenantUsage.objects.values_list("tenant__slug", "updated_at"))
    dispatch_cycle()
    assert dict(TenantUsage.objects.values_list("tenant__slug", "updated_at")) == before
    with freeze_time(timezone.now() + timedelta(seconds=11)):
        dispatch_cycle()
        after = TenantUsage.objects.get(tenant__slug="nlp")
    assert after.updated_at > before["nlp"] and after.gpu_seconds > 0  # 16 GPUs busy meanwhile


def test_positions_follow_the_order_without_rewriting_the_jobs_behind(world, backlog):
    running, waiting = backlog
    ranks = dict(
        Job.objects.filter(pk__in=[j.pk for j in waiting]).values_list("pk", "pending_rank")
    )
    for position, job in enumerate(waiting, start=1):
        job.refresh_from_db()
        positions_attach([job])
        assert (job.queue_position, job.pool_position) == (position, position)

    # The first running job ends: the head of the queue starts, nobody behind moves up in
    # the table, yet everybody reads one place further.
    Job.objects.filter(pk=running[0].pk).update(
        state=JobState.SUCCEEDED, finished_at=timezone.now()
    )
    running[0].allocations.update(released_at=timezone.now())
    stats = dispatch_cycle()
    assert stats["placed"] == 1
    head = Job.objects.get(pk=waiting[0].pk)
    assert head.state == JobState.ADMITTED and head.pending_rank is None
    for position, job in enumerate(waiting[1:], start=1):
        job.refresh_from_db()
        positions_attach([job])
        assert job.pending_rank == ranks[job.pk]
        assert job.queue_position == position
    assert stats["pending_updated"] == 0


def test_a_new_job_that_goes_first_is_the_only_row_ranked(world, backlog):
    _, waiting = backlog
    urgent = _job(world, priority=world.high, priority_class=world.high)
    stats = dispatch_cycle()
    urgent.refresh_from_db()
    positions_attach([urgent])
    # It waits for preemption or GPUs, ahead of everybody of the lower class.
    if urgent.state == JobState.PENDING:
        assert urgent.queue_position == 1
        assert stats["pending_updated"] == 1
    for position, job in enumerate(waiting, start=2 if urgent.state == JobState.PENDING else 1):
        job.refresh_from_db()
        positions_attach([job])
        assert job.queue_position == position


def test_estimates_are_kept_per_pool_and_read_by_jobs_and_api(world, backlog, client):
    _, waiting = backlog
    row = PoolEstimates.objects.get(pool=world.pool)
    assert set(row.starts) == {str(j.pk) for j in waiting}
    (job,) = positions_attach([Job.objects.get(pk=waiting[0].pk)])
    assert job.estimated_start is not None
    assert abs(job.estimated_start.timestamp() - row.starts[str(job.pk)]) < 1
    client.force_login(world.member)
    body = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["estimated_start"] is not None
    assert (body["queue_position"], body["pool_position"]) == (1, 1)


def test_a_page_of_jobs_reads_positions_and_estimates_in_two_queries(world, backlog):
    _, waiting = backlog
    jobs = list(Job.objects.filter(pk__in=[j.pk for j in waiting]))
    with CaptureQueriesContext(connection) as ctx:
        positions_attach(jobs)
        seen = sorted(j.queue_position for j in jobs)
        estimates = [j.estimated_start for j in jobs]
    assert seen == list(range(1, 7)) and all(estimates)
    assert len(ctx.captured_queries) <= 3  # positions, the queues' pools, the estimates


def test_the_cache_sees_a_hold_and_a_class_change_on_the_next_cycle(world, backlog):
    _, waiting = backlog
    held, raised = waiting[3], waiting[5]
    Job.objects.filter(pk=held.pk).update(state=JobState.HELD)
    Job.objects.filter(pk=raised.pk).update(priority_class=world.high)
    stats = dispatch_cycle()
    assert stats["pending_read_whole"] == 2  # only the two that changed
    held.refresh_from_db()
    raised.refresh_from_db()
    positions_attach([raised])
    assert held.pending_reason_code == "HELD"
    assert raised.queue_position == 1  # the higher class goes first


def test_a_job_cancelled_after_the_snapshot_is_not_placed(world, monkeypatch):
    job = _job(world, gpus=1)
    real = dispatch.load_snapshot

    def load_then_cancel(*args, **kwargs):
        loaded = real(*args, **kwargs)
        Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
        return loaded

    monkeypatch.setattr(dispatch, "load_snapshot", load_then_cancel)
    stats = dispatch_cycle()
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and not job.allocations.exists()
    assert stats["placed"] == 1  # planned, then dropped when applied


def test_rows_update_sets_each_row_its_own_values(world):
    jobs = [_job(world, gpus=1) for _ in range(3)]
    rows_update(
        Job,
        ["pending_rank", "pending_reason_message"],
        [(j.pk, 10.0 * i, f"message {i}") for i, j in enumerate(jobs)],
    )
    got = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "pending_rank"))
    assert got == {j.pk: 10.0 * i for i, j in enumerate(jobs)}
    assert Job.objects.get(pk=jobs[2].pk).pending_reason_message == "message 2"


def test_the_leader_cache_is_cleared_when_loading_fails(world, monkeypatch):
    _job(world, gpus=1)
    dispatch_cycle()

    def broken(*args, **kwargs):
        raise RuntimeError("database went away")

    LEADER_CACHE.positions = {1: 1}
    monkeypatch.setattr(LEADER_CACHE, "load", broken)
    with pytest.raises(RuntimeError):
        dispatch_cycle()
    assert LEADER_CACHE.positions == {}
