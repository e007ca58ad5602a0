"""The dispatch loop: snapshot from the database, engine plan, applied in one transaction."""

import threading
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent
from scheduling.choices import JobState, NodeState, StopReason
from scheduling.models import Allocation, Job, Node, Quota
from scheduling.positions import positions_attach
from scheduling.services import dispatch
from scheduling.services.dispatch import dispatch_cycle
from scheduling.services.enqueue import DISPATCH_REQUESTED_KEY, request_dispatch
from scheduling.services.nodes import job_exited, job_started
from scheduling.services.runtime_history import runtime_history_record
from tests import factories as f


@pytest.fixture(autouse=True)
def _any_preemption_gain(settings):
    """These tests check the mechanics of preemption on jobs of an hour: any gain (the
    default 4 h minimum gain would make them wait; tests/scheduling/simulator/
    test_default_policy.py checks the defaults)."""
    settings.SLUICE_PREEMPTION_MIN_GAIN_SECONDS = 0


def _job(world, gpus=1, nodes=1, priority=None, **kw):
    return f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        gpus_per_node=gpus,
        nodes=nodes,
        base_priority_class=priority or world.normal,
        priority_class=priority or world.normal,
        **kw,
    )


def _other_low_node_job(world, **kw):
    """A whole-node (8 GPU) job of the other tenant at the low class: a preemption victim."""
    return f.JobFactory(
        queue=world.other_queue,
        project=world.other_project,
        gpus_per_node=8,
        base_priority_class=world.low,
        priority_class=world.low,
        **kw,
    )


def _launches(outbox):
    return [(node, m) for node, m in outbox if m["type"] == "launch"]


def test_places_job_and_sends_launch_on_commit(world, outbox, django_capture_on_commit_callbacks):
    job = _job(world, gpus=2)
    with django_capture_on_commit_callbacks(execute=True):
        stats = dispatch_cycle()
    assert stats["placed"] == 1
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED and job.admitted_at
    allocations = list(Allocation.objects.filter(job=job, released_at__isnull=True))
    assert len(allocations) == 2 and len({a.node_id for a in allocations}) == 1
    assert not any(a.borrowed for a in allocations)
    [(node, message)] = _launches(outbox)
    assert node == allocations[0].node.name
    assert sorted(message["gpu_indices"]) == sorted(a.gpu.index for a in allocations)
    assert (
        message["job_id"] == job.pk
        and message["attempt"] == 0
        and message["command"] == job.command
    )
    assert job.events.filter(kind="admitted").exists()


def test_no_launch_before_commit(world, outbox, django_capture_on_commit_callbacks):
    _job(world)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        dispatch_cycle()
    assert _launches(outbox) == [] and callbacks


def test_multi_node_gang_gets_all_gpus_or_nothing(
    world, outbox, django_capture_on_commit_callbacks
):
    gang = _job(world, gpus=8, nodes=2, priority=world.low)
    too_big = _job(world, gpus=8, nodes=3, priority=world.low)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    gang.refresh_from_db()
    too_big.refresh_from_db()
    assert gang.state == JobState.ADMITTED
    assert Allocation.objects.filter(job=gang).values("node").distinct().count() == 2
    assert too_big.state == JobState.PENDING and too_big.pending_reason_code
    assert not Allocation.objects.filter(job=too_big).exists()
    assert {n for n, _ in _launches(outbox)} == {"gpu-01", "gpu-02"}


def test_waiting_jobs_get_reason_position_and_estimate(world):
    running = _job(world, gpus=8, priority=world.low)
    running2 = _job(world, gpus=8, priority=world.low)
    dispatch_cycle()
    waiting = [_job(world, gpus=4, priority=world.low) for _ in range(3)]
    dispatch_cycle()
    running.refresh_from_db()
    running2.refresh_from_db()
    assert running.state == running2.state == JobState.ADMITTED
    for position, job in enumerate(waiting, start=1):
        job.refresh_from_db()
        positions_attach([job])
        assert job.state == JobState.PENDING
        assert job.pending_reason_code, job.pending_reason_message
        assert job.pending_reason_message
        assert job.queue_position == position
        assert job.estimated_start is not None and job.estimated_start > timezone.now()


def test_held_job_is_not_placed(world):
    job = _job(world, state=JobState.HELD)
    dispatch_cycle()
    job.refresh_from_db()
    assert job.state == JobState.HELD and job.pending_reason_code == "HELD"


def test_down_or_cordoned_nodes_are_not_used(world):
    for node in world.nodes:
        node.state = NodeState.CORDONED
        node.save()
    job = _job(world)
    dispatch_cycle()
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.pending_reason_code


def test_preemption_stops_victim_then_requeues_and_preemptor_runs(
    world, outbox, django_capture_on_commit_callbacks
):
    # The other tenant fills the cluster at a low class (8 guaranteed + 8 borrowed GPUs).
    victims = [_other_low_node_job(world) for _ in range(2)]
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    _start_all(victims)
    high = _job(world, gpus=8, priority=world.high)
    outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    high.refresh_from_db()
    assert high.state == JobState.PENDING and high.pending_reason_code == "WAITING_FOR_PREEMPTION"
    stopping = Job.objects.filter(pk__in=[v.pk for v in victims], state=JobState.STOPPING)
    assert stopping.count() == 1
    victim = stopping.get()
    assert victim.stop_reason == StopReason.PREEMPTED
    stops = [(n, m) for n, m in outbox if m["type"] == "stop"]
    assert (
        len(stops) == 1
        and stops[0][1]["reason"] == "preempted"
        and stops[0][1]["job_id"] == victim.pk
    )
    assert AuditEvent.objects.filter(action="job.preempt", target_id=str(victim.pk)).count() == 1
    # A second cycle during the grace period must not pick another victim.
    dispatch_cycle()
    assert Job.objects.filter(state=JobState.STOPPING).count() == 1
    with django_capture_on_commit_callbacks(execute=True):
        _exit_preempted(victim)
    victim.refresh_from_db()
    assert (
        victim.state == JobState.PENDING
        and victim.requeue_count == 1
        and victim.preemption_count == 1
    )
    assert victim.events.filter(kind="requeued").exists()
    dispatch_cycle()
    high.refresh_from_db()
    assert high.state == JobState.ADMITTED


def test_a_job_ahead_of_a_preemptor_is_told_when_the_gpus_kept_for_it_are_free(
    world, django_capture_on_commit_callbacks
):
    """While a preemptor's victim stops, a job ordered before it (a higher class that may
    not preempt) that can only use the same GPUs waits without a reservation, and is told
    it starts after the preemptor's run instead of getting no estimate at all."""
    cordoned = world.nodes[1]
    cordoned.state = NodeState.CORDONED
    cordoned.save()
    victim = _other_low_node_job(world)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    _start_all([victim])
    high = _job(world, gpus=8, priority=world.high, max_runtime_seconds=3600)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    high.refresh_from_db()
    assert high.pending_reason_code == "WAITING_FOR_PREEMPTION"
    urgent = f.PriorityClassFactory(name="urgent", value=world.high.value + 1, can_preempt=False)
    ahead = _job(world, gpus=8, priority=urgent)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    ahead.refresh_from_db()
    high.refresh_from_db()
    positions_attach([ahead, high])
    assert (ahead.pool_position, high.pool_position) == (1, 2)
    assert ahead.pending_reason_code == "WAITING_FOR_GPUS"
    assert f"kept for job {high.pk}, which preempted for them" in ahead.pending_reason_message
    assert high.estimated_start is not None and ahead.estimated_start is not None
    assert ahead.estimated_start >= high.estimated_start + timedelta(seconds=3600)
    # The victim's GPUs still go to the preemptor once it is gone.
    with django_capture_on_commit_callbacks(execute=True):
        _exit_preempted(victim)
    dispatch_cycle()
    high.refresh_from_db()
    assert high.state == JobState.ADMITTED


def test_request_dispatch_is_coalesced(world, monkeypatch):
    sent = []
    monkeypatch.setattr("scheduling.tasks.dispatch.apply_async", lambda **kw: sent.append(kw))
    cache.delete(DISPATCH_REQUESTED_KEY)
    for _ in range(1000):
        request_dispatch()
    assert sent == [{"queue": "dispatch"}]


def test_second_leader_skips(world):
    if connection.vendor == "postgresql":
        pytest.skip("covered by the PostgreSQL concurrency test")
    with dispatch._leader_lock() as first:
        assert first
        assert dispatch_cycle() == {"skipped": True}


@pytest.mark.django_db(transaction=True)
def test_concurrent_leaders_never_double_allocate(world):
    """Two dispatchers at once (two threads, two connections): each GPU is allocated at most once."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: SQLite serializes writers anyway")
    for _ in range(40):
        _job(world, gpus=1, priority=world.low)
    barrier = threading.Barrier(2)
    results, errors = [], []

    def run():
        from django.db import connections

        try:
            barrier.wait()
            for _ in range(3):
                results.append(dispatch_cycle())
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    active = Allocation.objects.filter(released_at__isnull=True)
    # The tenant may hold 8 guaranteed + 8 borrowed GPUs: exactly 16, each once.
    assert active.count() == active.values("gpu").distinct().count() == 16
    assert Job.objects.filter(state=JobState.ADMITTED).count() == 16
    assert len(results) == 6


def test_reservations_are_handed_to_the_next_cycle(world, django_capture_on_commit_callbacks):
    # nlp is guaranteed 16 GPUs but vision holds 8 of them under its own guarantee.
    Quota.objects.filter(tenant=world.tenant).update(guaranteed_gpus=16, borrow_limit_gpus=0)
    _job(world, gpus=8)
    f.JobFactory(queue=world.other_queue, project=world.other_project, gpus_per_node=8)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    waiting = _job(world, gpus=8)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    waiting.refresh_from_db()
    positions_attach([waiting])
    loaded = dispatch.load_snapshot(timezone.now(), update_usage=False)
    [pending] = [p for p in loaded.snapshot.pending if p.id == waiting.pk]
    assert waiting.pending_reason_code == "WAITING_FOR_GPUS", waiting.pending_reason_message
    assert len(pending.reserved_gpu_ids) == 8
    assert abs(pending.reserved_start - waiting.estimated_start.timestamp()) < 1


def test_stopping_victims_name_their_preemptor(world):
    victim = _other_low_node_job(world, state=JobState.STOPPING, stop_reason=StopReason.PREEMPTED)
    victim.events.create(created_at=timezone.now(), kind="stop_preempted", data={"preemptor": 4242})
    loaded = dispatch.load_snapshot(timezone.now(), update_usage=False)
    [running] = [r for r in loaded.snapshot.running if r.id == victim.pk]
    assert running.stopping and running.preempted_by == 4242


def _start_all(jobs):
    for job in jobs:
        job.refresh_from_db()
        job_started(
            {
                "type": "started",
                "node": job.allocations.first().node.name,
                "job_id": job.pk,
                "attempt": 0,
                "pid": 100,
                "started_at": timezone.now().timestamp(),
            }
        )


def _exit_preempted(job):
    job_exited(
        {
            "type": "exited",
            "node": job.allocations.first().node.name,
            "job_id": job.pk,
            "attempt": 0,
            "exit_code": None,
            "signal": 15,
            "stop_reason": "preempted",
            "message": "",
            "finished_at": timezone.now().timestamp(),
        }
    )


def _vision_fills_both_nodes(world, capture, **kw):
    """Two 8-GPU preemptible jobs of the other tenant, placed (one on borrowed GPUs) and
    running."""
    batch = f.PriorityClassFactory(name="batch", value=300, preemptible=True)
    others = [
        f.JobFactory(
            queue=world.other_queue,
            project=world.other_project,
            gpus_per_node=8,
            base_priority_class=batch,
            priority_class=batch,
            **kw,
        )
        for _ in range(2)
    ]
    with capture(execute=True):
        dispatch_cycle()
    _start_all(others)
    return others


def test_reclaimed_gpus_go_to_the_reclaimer_not_back_to_the_requeued_victim(
    world, django_capture_on_commit_callbacks
):
    # The other tenant fills both nodes with normal jobs, one of them borrowed. nlp, below
    # its guarantee, reclaims with a *low* job. The victim is requeued ahead of it (higher
    # class) but must not take its GPUs back: the claim is handed to the next cycle.
    others = _vision_fills_both_nodes(world, django_capture_on_commit_callbacks)
    reclaimer = _job(world, gpus=8, priority=world.low)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    reclaimer.refresh_from_db()
    assert reclaimer.pending_reason_code == "WAITING_FOR_PREEMPTION"
    victim = Job.objects.get(pk__in=[o.pk for o in others], state=JobState.STOPPING)
    loaded = dispatch.load_snapshot(timezone.now(), update_usage=False)
    [pending] = [p for p in loaded.snapshot.pending if p.id == reclaimer.pk]
    assert len(pending.claimed_gpu_ids) == 8

    with django_capture_on_commit_callbacks(execute=True):
        _exit_preempted(victim)
    victim.refresh_from_db()
    assert victim.state == JobState.PENDING
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    reclaimer.refresh_from_db()
    victim.refresh_from_db()
    assert reclaimer.state == JobState.ADMITTED
    assert victim.state == JobState.PENDING


def test_remembered_reservations_from_before_claims_still_load():
    assert dispatch._previous_reservation(None) == ((), None, ())
    assert dispatch._previous_reservation(([1, 2], 10.0)) == ((1, 2), 10.0, ())
    assert dispatch._previous_reservation(([1, 2], 10.0, [2]))[2] == (2,)


def test_a_node_marked_down_while_the_cycle_plans_gets_no_job(world, monkeypatch):
    # The snapshot saw the nodes ready; they go down before the plan is applied (the
    # race of a lost agent: its jobs requeued between the cycle's reads). Nothing may be
    # placed on them.
    job = _job(world, gpus=8)
    real_load = dispatch.load_snapshot

    def load_then_nodes_go_down(now, **kw):
        loaded = real_load(now, **kw)
        Node.objects.update(state=NodeState.DOWN)
        return loaded

    monkeypatch.setattr(dispatch, "load_snapshot", load_then_nodes_go_down)
    stats = dispatch_cycle()
    job.refresh_from_db()
    assert stats["placed"] == 1  # the engine planned it on the snapshot
    assert job.state == JobState.PENDING
    assert not Allocation.objects.filter(job=job).exists()


def test_a_gpu_released_after_the_cycle_began_is_granted_after_its_release(world, monkeypatch):
    # The cycle begins; before its snapshot reads the GPUs, the job holding them exits
    # (released at the agent's finish time, later than the cycle's start). The next grant
    # of those GPUs is stamped after that release: no GPU shows two holders at one instant.
    world.nodes[1].state = NodeState.CORDONED
    world.nodes[1].save()
    first = _job(world, gpus=8)  # every GPU of the one schedulable node
    assert dispatch_cycle()["placed"] == 1
    job_started({"node": "gpu-01", "job_id": first.pk, "attempt": 0, "pid": 1})
    second = _job(world, gpus=8)
    real_load = dispatch.load_snapshot

    def first_exits_then_load(now, **kw):
        finished = timezone.now().timestamp()
        exit_report = {"node": "gpu-01", "job_id": first.pk, "attempt": 0, "exit_code": 0}
        job_exited({**exit_report, "finished_at": finished})
        return real_load(now, **kw)

    monkeypatch.setattr(dispatch, "load_snapshot", first_exits_then_load)
    assert dispatch_cycle()["placed"] == 1
    released = Allocation.objects.filter(job=first).values_list("released_at", flat=True)
    granted = Allocation.objects.filter(job=second).values_list("granted_at", flat=True)
    assert len(granted) == 8 and min(granted) >= max(released)


def test_cycles_are_paced_by_the_minimum_gap(settings, monkeypatch):
    d = dispatch
    settings.SLUICE_DISPATCH_MIN_GAP_MS = 100
    slept: list[float] = []
    clock = [1000.0]
    monkeypatch.setattr(d.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(d, "_last_cycle_end", None)
    assert d.dispatch_pace(slept.append) == 0.0  # no cycle yet: at once
    monkeypatch.setattr(d, "_last_cycle_end", 1000.0)
    clock[0] = 1000.03
    assert d.dispatch_pace(slept.append) == pytest.approx(0.07)
    clock[0] = 1000.5  # the last cycle is long past: at once
    assert d.dispatch_pace(slept.append) == 0.0
    settings.SLUICE_DISPATCH_MIN_GAP_MS = 0
    clock[0] = 1000.01
    assert d.dispatch_pace(slept.append) == 0.0
    assert slept == [pytest.approx(0.07)]


def test_the_dispatch_task_waits_before_clearing_its_flag(settings, monkeypatch, world):
    """Requests made while the task waits are taken by its cycle, not queued again."""
    from scheduling import tasks

    d = dispatch
    order: list[str] = []

    def pace():
        order.append(f"pace flag={cache.get(DISPATCH_REQUESTED_KEY)}")
        return 0.0

    monkeypatch.setattr(d, "dispatch_pace", pace)
    cache.set(DISPATCH_REQUESTED_KEY, 1)
    tasks.dispatch.run()
    assert order == ["pace flag=1"]
    assert cache.get(DISPATCH_REQUESTED_KEY) is None
    assert d._last_cycle_end is not None


@pytest.mark.parametrize("history", [True, False])
def test_minimum_gain_waits_for_a_borrower_its_history_says_ends_soon(
    world, history, settings, django_capture_on_commit_callbacks
):
    # Vision fills both nodes (one job borrowed); its jobs declare 10 h and, by its
    # history, run a tenth of that. nlp's job, inside its guarantee, would reclaim: with a
    # 2 h minimum gain it waits for the borrower expected to end within the hour.
    settings.SLUICE_PREEMPTION_MIN_GAIN_SECONDS = 7200
    if history:
        end = timezone.now() - timezone.timedelta(hours=1)
        for _ in range(3):
            done = f.JobFactory(
                queue=world.other_queue,
                project=world.other_project,
                state=JobState.SUCCEEDED,
                max_runtime_seconds=36_000,
                started_at=end - timezone.timedelta(seconds=3600),
                admitted_at=end - timezone.timedelta(seconds=3600),
                finished_at=end,
            )
            runtime_history_record(done)
    others = _vision_fills_both_nodes(
        world, django_capture_on_commit_callbacks, max_runtime_seconds=36_000
    )
    job = _job(world, gpus=8)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    job.refresh_from_db()
    stopping = Job.objects.filter(pk__in=[o.pk for o in others], state=JobState.STOPPING)
    if history:
        assert not stopping.exists()
        assert job.pending_reason_code == "WAITING_FOR_GPUS"
    else:
        assert stopping.count() == 1
        assert job.pending_reason_code == "WAITING_FOR_PREEMPTION"


def test_borrowed_gpus_back_inside_the_guarantee_count_against_it(
    world, django_capture_on_commit_callbacks
):
    # Vision fills both nodes, one job on its guarantee and one borrowed. Once the first
    # ends, the borrowed one fits vision's guarantee: the next cycle counts it there (its
    # allocations and the job's timeline say so), so it is no longer reclaimable.
    others = _vision_fills_both_nodes(world, django_capture_on_commit_callbacks)
    borrowed = {a.job_id for a in Allocation.objects.filter(job__in=others, borrowed=True)}
    [lender] = [o for o in others if o.pk not in borrowed]
    [borrower] = [o for o in others if o.pk in borrowed]
    lender.refresh_from_db()
    job_exited(
        {
            "type": "exited",
            "node": lender.allocations.first().node.name,
            "job_id": lender.pk,
            "attempt": 0,
            "exit_code": 0,
            "signal": None,
            "message": "",
            "finished_at": timezone.now().timestamp(),
        }
    )
    with django_capture_on_commit_callbacks(execute=True):
        stats = dispatch_cycle()
    assert stats["promoted"] == 1
    assert not Allocation.objects.filter(job=borrower, borrowed=True).exists()
    event = borrower.events.get(kind="guaranteed")
    assert "8 borrowed GPUs now count against vision's guarantee in pool training" in event.message
    loaded = dispatch.load_snapshot(timezone.now(), update_usage=False)
    [record] = [r for r in loaded.snapshot.running if r.id == borrower.pk]
    assert record.borrowed is False

    # Vision borrows the free node again, at a higher class than the promoted job. nlp,
    # inside its guarantee, reclaims: the borrowed job, not the promoted one (which, still
    # labelled borrowed, would have been the victim: lower class).
    higher = f.PriorityClassFactory(name="batch-plus", value=350, preemptible=True)
    newer = f.JobFactory(
        queue=world.other_queue,
        project=world.other_project,
        gpus_per_node=8,
        base_priority_class=higher,
        priority_class=higher,
    )
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_cycle()
    _start_all([newer])
    assert Allocation.objects.filter(job=newer, borrowed=True).count() == 8
    mine = _job(world, gpus=8)
    with django_capture_on_commit_callbacks(execute=True):
        again = dispatch_cycle()
    assert again["promoted"] == 0 and again["preempted"] == 1
    newer.refresh_from_db()
    borrower.refresh_from_db()
    mine.refresh_from_db()
    assert newer.state == JobState.STOPPING and borrower.state == JobState.RUNNING
    assert mine.pending_reason_code == "WAITING_FOR_PREEMPTION"
