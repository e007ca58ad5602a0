"""Short cycles in a deep backlog (dispatch._explain_now): the same placements as a full
cycle from the same state, the jobs not reached left as the last full cycle explained
them (reasons, sort keys, estimates, held reservations), and a full cycle whenever a
waiting job is new or changed or the last full one is too old."""

import random
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time

from scheduling.choices import JobState
from scheduling.models import Allocation, Job, PoolEstimates, Quota
from scheduling.positions import positions_attach
from scheduling.services import dispatch
from scheduling.services.dispatch import RESERVATIONS_KEY, dispatch_cycle
from scheduling.services.enqueue import WAITING_VERSION_KEY, waiting_changed_on_commit
from scheduling.services.nodes import job_exited, job_started
from scheduling.services.pending_cache import PendingCache
from tests import factories as f


@pytest.fixture(autouse=True)
def _fresh_leader(monkeypatch):
    monkeypatch.setattr(dispatch, "LEADER_CACHE", PendingCache())
    cache.delete(RESERVATIONS_KEY)
    cache.delete(WAITING_VERSION_KEY)  # other tests' submissions bumped it
    yield
    cache.delete(RESERVATIONS_KEY)


@pytest.fixture
def deep(settings):
    """A backlog of 6 counts as deep; the last full cycle never gets too old by itself."""
    settings.SLUICE_DISPATCH_DEEP_BACKLOG = 6
    settings.SLUICE_DISPATCH_EXPLAIN_SECONDS = 3600.0
    return settings


def _job(world, gpus, *, other=False, runtime=3600):
    queue, project = (
        (world.other_queue, world.other_project) if other else (world.queue, world.project)
    )
    return f.JobFactory(
        queue=queue,
        project=project,
        gpus_per_node=gpus,
        base_priority_class=world.normal,
        priority_class=world.normal,
        max_runtime_seconds=runtime,
    )


def _backlog(world, count: int) -> tuple[list[Job], list[Job]]:
    """Both nodes taken by one 8-GPU job of each tenant (each guaranteed all 16 GPUs, so
    that GPUs, not quota, hold the rest back), then ``count`` waiting 8-GPU jobs."""
    Quota.objects.update(guaranteed_gpus=16, borrow_limit_gpus=0)
    running = [_job(world, 8), _job(world, 8, other=True, runtime=7200)]
    return running, [_job(world, 8, other=i % 2 == 1) for i in range(count)]


def _cycle(capture):
    with capture(execute=True):
        return dispatch_cycle()


def _finish(job_ids):
    """The agent reports the jobs started (if only admitted) and then exited with 0."""
    for job in Job.objects.filter(pk__in=job_ids):
        node = Allocation.objects.filter(job=job).first().node.name
        now = timezone.now().timestamp()
        if job.state == JobState.ADMITTED:
            job_started(
                {
                    "type": "started",
                    "node": node,
                    "job_id": job.pk,
                    "attempt": job.requeue_count,
                    "pid": 100,
                    "started_at": now,
                }
            )
        job_exited(
            {
                "type": "exited",
                "node": node,
                "job_id": job.pk,
                "attempt": job.requeue_count,
                "exit_code": 0,
                "signal": None,
                "stop_reason": "",
                "message": "",
                "finished_at": now,
            }
        )


_seen: set = set()


def _placed(since: set) -> list[tuple]:
    """The jobs placed and not in ``since``: (job, node, GPUs there). Which GPUs of a node a
    job gets may differ between equal plans (best fit breaks ties by the order the cycle's
    state was built in), so the comparison stops at the node."""
    placed: dict[tuple, int] = {}
    for a in Allocation.objects.filter(released_at__isnull=True).select_related("gpu"):
        if a.job_id not in since:
            key = (a.job_id, a.gpu.node_id)
            placed[key] = placed.get(key, 0) + 1
    return sorted((job_id, node_id, count) for (job_id, node_id), count in placed.items())


class _Rollback(Exception):
    pass


def _one_cycle_from(state, capture, monkeypatch, *, full: bool) -> tuple[list, dict]:
    """One cycle from the given leader state (held reservations), full or short, rolled
    back: what it placed and its figures."""
    monkeypatch.setattr(dispatch, "LEADER_CACHE", PendingCache())
    monkeypatch.setattr(dispatch, "_explain_now", lambda loaded, monotonic: full)
    cache.set(RESERVATIONS_KEY, state)
    before = set(Allocation.objects.values_list("job_id", flat=True))
    try:
        with transaction.atomic():
            stats = _cycle(capture)
            placed = _placed(before)
            raise _Rollback
    except _Rollback:
        pass
    return placed, stats


@pytest.mark.parametrize("seed", range(6))
def test_a_short_cycle_places_what_a_full_cycle_places_from_the_same_state(
    world, settings, monkeypatch, django_capture_on_commit_callbacks, seed
):
    rng = random.Random(seed)
    Quota.objects.update(guaranteed_gpus=12, borrow_limit_gpus=4)
    for _ in range(40):
        _job(
            world,
            rng.choice([1, 1, 2, 4, 8]),
            other=rng.random() < 0.5,
            runtime=rng.randint(600, 7200),
        )
    settings.SLUICE_DISPATCH_DEEP_BACKLOG = 6
    compared = stopped_early = 0
    with freeze_time(timezone.now() + timedelta(minutes=1)) as clock:
        for _ in range(20):
            state = cache.get(RESERVATIONS_KEY) or {}
            full, full_stats = _one_cycle_from(
                state, django_capture_on_commit_callbacks, monkeypatch, full=True
            )
            short, short_stats = _one_cycle_from(
                state, django_capture_on_commit_callbacks, monkeypatch, full=False
            )
            assert short == full
            assert full_stats["reached"] + full_stats["placed"] == full_stats["pending"]
            compared += 1
            stopped_early += short_stats["reached"] + short_stats["placed"] < short_stats["pending"]
            monkeypatch.undo()
            # Go on as production would (short and full cycles as paced), with some ends.
            _cycle(django_capture_on_commit_callbacks)
            clock.tick(30)
            running = Job.objects.filter(state__in=[JobState.ADMITTED, JobState.RUNNING])
            _finish(
                list(
                    running.order_by("admitted_at", "id").values_list("id", flat=True)[
                        : rng.randint(1, 4)
                    ]
                )
            )
            if not Job.objects.filter(state=JobState.PENDING).exists():
                break
    assert compared >= 10 and stopped_early >= 5


def _standing() -> dict[int, tuple]:
    return {
        j.pk: (j.pending_reason_code, j.pending_reason_message, j.pending_rank)
        for j in Job.objects.filter(state=JobState.PENDING)
    }


def test_a_short_cycle_leaves_the_jobs_it_did_not_reach_as_they_were(
    world, deep, django_capture_on_commit_callbacks
):
    _backlog(world, 12)
    stats = _cycle(django_capture_on_commit_callbacks)
    assert stats["explained"] and stats["placed"] == 2
    first = set(Job.objects.filter(state=JobState.ADMITTED).values_list("pk", flat=True))
    before = _standing()
    estimates = PoolEstimates.objects.get(pool=world.pool)
    assert len(estimates.starts) == 12
    reservations = cache.get(RESERVATIONS_KEY)
    assert reservations, "the head of the backlog holds a reservation"

    _finish([min(first)])
    stats = _cycle(django_capture_on_commit_callbacks)
    assert not stats["explained"] and stats["placed"] == 1
    [started] = Job.objects.filter(state=JobState.ADMITTED).exclude(pk__in=first)
    after = _standing()
    assert set(after) == set(before) - {started.pk}
    # Sort keys and the pool's estimates are those of the last full cycle; so are the
    # reasons of the jobs the cycle did not reach.
    assert all(after[pk][2] == before[pk][2] for pk in after)
    again = PoolEstimates.objects.get(pool=world.pool)
    assert (again.computed_at, again.starts) == (estimates.computed_at, estimates.starts)
    assert stats["reached"] + stats["placed"] < stats["pending"]
    unchanged = [pk for pk in after if after[pk][:2] == before[pk][:2]]
    assert len(unchanged) >= stats["pending"] - stats["placed"] - stats["reached"]
    # No waiting job lost the reservation it held.
    kept = cache.get(RESERVATIONS_KEY)
    assert {pk for pk in reservations if pk in after} <= set(kept)


def _counted_in(capture):
    """What a submission or a hold does besides writing the job: bump the waiting jobs'
    version once it commits (the tests write their jobs with factories)."""
    with capture(execute=True):
        waiting_changed_on_commit()


def test_a_new_job_is_explained_at_once(world, deep, django_capture_on_commit_callbacks):
    _backlog(world, 12)
    assert _cycle(django_capture_on_commit_callbacks)["explained"]
    assert not _cycle(django_capture_on_commit_callbacks)["explained"]
    late = _job(world, 1)
    _counted_in(django_capture_on_commit_callbacks)
    assert _cycle(django_capture_on_commit_callbacks)["explained"]
    late.refresh_from_db()
    positions_attach([late])
    assert late.pending_reason_code and late.pending_rank is not None
    assert late.pool_position is not None and late.estimated_start is not None
    assert str(late.pk) in PoolEstimates.objects.get(pool=world.pool).starts


def test_a_changed_job_is_explained_at_once(world, deep, django_capture_on_commit_callbacks):
    _, waiting = _backlog(world, 12)
    _cycle(django_capture_on_commit_callbacks)
    Job.objects.filter(pk=waiting[-1].pk).update(state=JobState.HELD)
    _counted_in(django_capture_on_commit_callbacks)
    assert _cycle(django_capture_on_commit_callbacks)["explained"]


def test_explanations_are_written_once_the_last_write_is_too_old(
    world, deep, django_capture_on_commit_callbacks
):
    _backlog(world, 12)
    _cycle(django_capture_on_commit_callbacks)
    assert not _cycle(django_capture_on_commit_callbacks)["explained"]
    dispatch.LEADER_CACHE.explained_at -= deep.SLUICE_DISPATCH_EXPLAIN_SECONDS
    assert _cycle(django_capture_on_commit_callbacks)["explained"]
    assert not _cycle(django_capture_on_commit_callbacks)["explained"]


def test_a_shallow_backlog_gets_full_cycles_only(world, deep, django_capture_on_commit_callbacks):
    _backlog(world, 5)
    assert _cycle(django_capture_on_commit_callbacks)["placed"] == 2
    for _ in range(3):
        assert _cycle(django_capture_on_commit_callbacks)["explained"]


def test_a_failed_cycle_forgets_when_it_last_explained(world, deep, monkeypatch):
    _job(world, 8)
    dispatch.LEADER_CACHE.explained(123.0)

    def boom(*args, **kwargs):
        raise RuntimeError("planner failed")

    monkeypatch.setattr(dispatch.engine, "plan", boom)
    with pytest.raises(RuntimeError):
        dispatch_cycle()
    assert dispatch.LEADER_CACHE.explained_at is None


# --- the waiting jobs taken from the leader's copy (dispatch._waiting_to_read) ---------------


def _narrow_reads(queries) -> int:
    """Statements that read the waiting jobs' narrow rows (pending_cache._NARROW)."""
    return sum(
        1
        for q in queries
        if '"pending_rank" AS "pending_rank" FROM "scheduling_job" WHERE' in q["sql"]
    )


def _counted_cycle(capture):
    with CaptureQueriesContext(connection) as ctx:
        stats = _cycle(capture)
    return stats, _narrow_reads(ctx.captured_queries)


@pytest.fixture
def versioned(deep, django_capture_on_commit_callbacks):
    """A deep backlog whose waiting jobs were counted in by the version (as job_submit
    does), read by a full cycle."""
    cache.delete(WAITING_VERSION_KEY)
    with django_capture_on_commit_callbacks(execute=True):
        waiting_changed_on_commit()
    return deep


def test_a_short_cycle_takes_the_waiting_jobs_from_the_copy_while_none_changed(
    world, versioned, django_capture_on_commit_callbacks
):
    _backlog(world, 12)
    stats, reads = _counted_cycle(django_capture_on_commit_callbacks)
    assert stats["read_waiting"] and reads == 1 and stats["placed"] == 2
    first = set(Job.objects.filter(state=JobState.ADMITTED).values_list("pk", flat=True))
    _finish([min(first)])  # a job ends: the waiting ones are as they were
    stats, reads = _counted_cycle(django_capture_on_commit_callbacks)
    assert not stats["read_waiting"] and reads == 0
    assert not stats["explained"] and stats["placed"] == 1 and stats["pending"] == 12
    # The placed job left the copy: the next cycle, again without reading, has 11.
    stats, reads = _counted_cycle(django_capture_on_commit_callbacks)
    assert not stats["read_waiting"] and reads == 0
    assert stats["pending"] == 11 and stats["placed"] == 0


def _submit(world, capture, gpus=8):
    from scheduling.services.jobs import JobSpec, job_submit

    with capture(execute=True):
        return job_submit(
            user=world.member,
            spec=JobSpec(
                queue=world.queue,
                project=world.project,
                name="",
                workload_type="training",
                command=["python", "train.py"],
                gpus_per_node=gpus,
            ),
        )


def test_a_submission_makes_the_next_cycle_read_and_explain_the_waiting_jobs(
    world, versioned, django_capture_on_commit_callbacks, dispatch_requests
):
    # (dispatch_requests: the submission's own request does not run the cycle at once,
    # as eager Celery would, so that the next cycle here is the one it asked for.)
    _backlog(world, 12)
    _cycle(django_capture_on_commit_callbacks)
    assert not _counted_cycle(django_capture_on_commit_callbacks)[0]["read_waiting"]
    late = _submit(world, django_capture_on_commit_callbacks, gpus=1)
    assert dispatch_requests == [1]
    stats, reads = _counted_cycle(django_capture_on_commit_callbacks)
    assert stats["read_waiting"] and reads == 1 and stats["explained"]
    late.refresh_from_db()
    positions_attach([late])
    assert late.pending_reason_code and late.pool_position is not None


def test_cancelling_a_waiting_job_counts_as_a_change(
    world, versioned, django_capture_on_commit_callbacks
):
    from scheduling.services.jobs import job_cancel

    _backlog(world, 12)
    _cycle(django_capture_on_commit_callbacks)
    assert not _counted_cycle(django_capture_on_commit_callbacks)[0]["read_waiting"]
    waiting = Job.objects.filter(state=JobState.PENDING, tenant=world.tenant).last()
    before = cache.get(WAITING_VERSION_KEY)
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(user=world.tenant_admin, job=waiting)
        assert cache.get(WAITING_VERSION_KEY) == before  # not before the commit
    assert cache.get(WAITING_VERSION_KEY) == before + 1
    # (the cancel's dispatch request runs a cycle here: Celery is eager in the tests)
    stats = _cycle(django_capture_on_commit_callbacks)
    assert stats["pending"] == 11


def test_the_leaders_own_placements_do_not_count_as_a_change(
    world, versioned, django_capture_on_commit_callbacks
):
    _backlog(world, 12)
    before = cache.get(WAITING_VERSION_KEY)
    stats = _cycle(django_capture_on_commit_callbacks)
    assert stats["placed"] == 2 and cache.get(WAITING_VERSION_KEY) == before


def test_a_requeue_from_a_report_counts_as_a_change(
    world, versioned, django_capture_on_commit_callbacks
):
    from scheduling.services.lifecycle import Step, jobs_transition_steps

    _backlog(world, 12)
    _cycle(django_capture_on_commit_callbacks)
    before = cache.get(WAITING_VERSION_KEY)
    job = Job.objects.filter(state=JobState.ADMITTED).first()
    with django_capture_on_commit_callbacks(execute=True):
        jobs_transition_steps([Step(job=job, to_state=JobState.LOST, kind="lost")])
    assert cache.get(WAITING_VERSION_KEY) == before  # leaving a node is not waiting
    job.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        jobs_transition_steps([Step(job=job, to_state=JobState.PENDING, kind="requeued")])
    assert cache.get(WAITING_VERSION_KEY) == before + 1


def test_a_lost_version_makes_the_next_cycle_read(
    world, versioned, django_capture_on_commit_callbacks
):
    _backlog(world, 12)
    _cycle(django_capture_on_commit_callbacks)
    cache.delete(WAITING_VERSION_KEY)  # a cache flush
    assert _counted_cycle(django_capture_on_commit_callbacks)[0]["read_waiting"]


# --- how often a deep backlog is explained (dispatch._explain_interval) -----------------------


@pytest.mark.parametrize(
    "took, expected",
    [
        (0.0, 1.0),  # never below SLUICE_DISPATCH_EXPLAIN_SECONDS
        (0.05, 1.0),
        (0.3, 3.0),  # full cycles take a tenth of the loop's time
        (0.8, 8.0),
        (5.0, 10.0),  # never above SLUICE_DISPATCH_EXPLAIN_MAX_SECONDS
    ],
)
def test_full_cycles_take_a_bounded_share_of_the_loop(settings, took, expected):
    settings.SLUICE_DISPATCH_EXPLAIN_SECONDS = 1.0
    settings.SLUICE_DISPATCH_EXPLAIN_SHARE = 0.1
    settings.SLUICE_DISPATCH_EXPLAIN_MAX_SECONDS = 10.0
    dispatch.LEADER_CACHE.explained(100.0, took)
    assert dispatch._explain_interval() == pytest.approx(expected)


def test_a_share_of_zero_keeps_the_fixed_interval(settings):
    settings.SLUICE_DISPATCH_EXPLAIN_SECONDS = 2.0
    settings.SLUICE_DISPATCH_EXPLAIN_SHARE = 0.0
    dispatch.LEADER_CACHE.explained(100.0, 30.0)
    assert dispatch._explain_interval() == 2.0


def test_the_next_full_cycle_waits_for_the_interval_of_the_last_ones_cost(
    world, deep, django_capture_on_commit_callbacks
):
    """A full cycle that took 0.4 s at a share of a tenth: cycles are short until the last
    full one is 4 s old, then one explains again (its own cost sets the next wait)."""
    deep.SLUICE_DISPATCH_EXPLAIN_SECONDS = 1.0
    deep.SLUICE_DISPATCH_EXPLAIN_SHARE = 0.1
    deep.SLUICE_DISPATCH_EXPLAIN_MAX_SECONDS = 10.0
    _backlog(world, 12)
    assert _cycle(django_capture_on_commit_callbacks)["explained"]
    cache_ = dispatch.LEADER_CACHE
    assert cache_.explained_seconds > 0
    cache_.explained_seconds = 0.4
    cache_.explained_at -= 3.5  # older than SLUICE_DISPATCH_EXPLAIN_SECONDS, younger than 4 s
    assert not _cycle(django_capture_on_commit_callbacks)["explained"]
    cache_.explained_at -= 1.0
    assert _cycle(django_capture_on_commit_callbacks)["explained"]
