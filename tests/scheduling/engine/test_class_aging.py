"""Class aging (``Snapshot.class_aging_seconds``, see scheduling.engine.order): a job whose
class may not preempt, once it has waited long enough, is ordered with the next class up
among the waiting jobs, unless that class may preempt, while its tenant's guarantee in the
pool has room for it; only its order changes."""

from engine_builders import CLASSES, NOW, gpu_ids, job, node, quota, run_plan, running, snapshot

from scheduling.engine import reasons
from scheduling.engine.order import age_classes
from scheduling.engine.snapshot import ClusterState, Snapshot

HOUR = 3600.0


def _one_busy_node():
    """One 8-GPU node, busy for 10 more minutes: nothing starts now, everyone reserves."""
    run = [running(90, "c", gpu_ids(1, *range(8)), age=600, runtime=1200)]
    return [node(1)], [quota("a", 8), quota("b", 8), quota("c", 8)], run


def _positions(result):
    return {job_id: info.pool_position for job_id, info in result.pending.items()}


def test_a_low_job_that_waited_long_enough_is_ordered_with_normal_work_by_size():
    nodes, quotas, run = _one_busy_node()
    # The low job is small and has waited 2 h; the normal job is bigger and new.
    low = job(1, "a", gpus=2, cls="low", runtime=3600, submitted=NOW - 2 * HOUR)
    normal = job(2, "b", gpus=8, cls="normal", runtime=3600, submitted=NOW - 60)
    plain = run_plan(snapshot(nodes, quotas, [low, normal], run))
    assert _positions(plain) == {2: 1, 1: 2}  # off (the default): class first
    aged = run_plan(snapshot(nodes, quotas, [low, normal], run, class_aging_seconds=HOUR))
    assert _positions(aged) == {1: 1, 2: 2}  # with normal work, the smaller goes first
    assert aged.pending[1].estimated_start == NOW + 600
    assert aged.pending[2].estimated_start == NOW + 600 + 3600
    # Not yet aged: class first again.
    young = run_plan(snapshot(nodes, quotas, [low, normal], run, class_aging_seconds=3 * HOUR))
    assert _positions(young) == {2: 1, 1: 2}


def test_aging_never_orders_a_job_with_a_class_that_may_preempt():
    nodes, quotas, run = _one_busy_node()
    normal = job(1, "a", gpus=1, cls="normal", runtime=600, submitted=NOW - 10 * HOUR)
    high = job(2, "b", gpus=8, cls="high", runtime=3600, submitted=NOW - 60)
    result = run_plan(snapshot(nodes, quotas, [normal, high], run, class_aging_seconds=HOUR))
    assert _positions(result) == {2: 1, 1: 2}
    # With a normal job waiting too, an old low job moves up to normal, not further
    # (tenant c's guarantee has room for it beside its running job).
    quotas = [quota("a", 8), quota("b", 8), quota("c", 16)]
    low = job(3, "c", gpus=1, cls="low", runtime=600, submitted=NOW - 10 * HOUR)
    pending = [normal, high, low]
    result = run_plan(snapshot(nodes, quotas, pending, run, class_aging_seconds=HOUR))
    assert _positions(result)[2] == 1  # the high job stays first
    aged = _aged(snapshot(nodes, quotas, pending, run, class_aging_seconds=HOUR))
    assert [(j.id, j.priority) for j in aged.pending] == [(1, 100), (2, 1000), (3, 100)]


def test_an_aged_job_keeps_its_class_name_and_gains_no_preemption_rights():
    # Node 1 runs a low job of tenant b that may be preempted by any higher class; the
    # old low job of tenant a, ordered with normal work, must not stop it.
    quotas = [quota("a", 8), quota("b", 8)]
    run = [running(10, "b", gpu_ids(1, *range(8)), "low", age=3600, runtime=86400)]
    old_low = job(1, "a", gpus=8, cls="low", runtime=3600, submitted=NOW - 5 * HOUR)
    normal = job(2, "a", gpus=8, cls="normal", runtime=3600, submitted=NOW - 60)
    snap = snapshot([node(1)], quotas, [old_low, normal], run, class_aging_seconds=HOUR)
    result = run_plan(snap)
    assert result.preemptions == []
    assert result.pending[1].code != reasons.WAITING_FOR_PREEMPTION
    aged = _aged(snap)
    assert aged.pending[0].priority == 100 and aged.pending[0].priority_class == "low"
    assert aged.pending[0].can_preempt is False and aged.pending[0].preemptible is True
    # The caller's snapshot and records are left as they were.
    assert snap.pending[0] is old_low and old_low.priority == 10


def test_aging_is_off_without_a_setting_and_for_strict_fifo():
    nodes, quotas, run = _one_busy_node()
    low = job(1, "a", gpus=2, cls="low", submitted=NOW - 5 * HOUR)
    normal = job(2, "b", gpus=8, cls="normal", submitted=NOW)
    snap = snapshot(nodes, quotas, [low, normal], run)
    fifo = snapshot(nodes, quotas, [low, normal], run, global_fifo=True, class_aging_seconds=1)
    # Nobody old enough: the same cluster state, no copy.
    fresh = snapshot(nodes, quotas, [low, normal], run, class_aging_seconds=6 * HOUR)
    for unaged in (snap, fifo, fresh):
        cluster = unaged.cluster_state()
        assert age_classes(cluster, unaged.policy()) is cluster
    # Old enough: a copy with the aged job.
    old = snapshot(nodes, quotas, [low, normal], run, class_aging_seconds=HOUR)
    cluster = old.cluster_state()
    assert age_classes(cluster, old.policy()) is not cluster


def _aged(snap: Snapshot) -> ClusterState:
    return age_classes(snap.cluster_state(), snap.policy())


def _aged_ids(snap) -> list[int]:
    return [j.id for j in _aged(snap).pending if j.priority != CLASSES[j.priority_class]]


def test_aged_jobs_move_up_only_while_their_tenants_guarantee_has_room_oldest_first():
    # Tenant a: 8 GPUs guaranteed, 6 held (one of them borrowed: admission counts it too).
    quotas = [quota("a", 8, borrow=8), quota("b", 8)]
    run = [
        running(90, "a", gpu_ids(1, 0, 1, 2, 3, 4), "normal", runtime=7200),
        running(91, "a", gpu_ids(1, 5), "low", borrowed=True, runtime=7200),
    ]
    old = job(1, "a", gpus=2, cls="low", submitted=NOW - 3 * HOUR)
    older_but_big = job(2, "a", gpus=4, cls="low", submitted=NOW - 4 * HOUR)
    newer = job(3, "a", gpus=2, cls="low", submitted=NOW - 2 * HOUR)
    other = job(4, "b", gpus=2, cls="low", submitted=NOW - 2 * HOUR)
    normal = job(5, "b", gpus=1, cls="normal", submitted=NOW)
    pending = [newer, older_but_big, old, other, normal]
    snap = snapshot([node(1), node(2)], quotas, pending, run, class_aging_seconds=HOUR)
    # 2 GPUs of room: the 4-GPU job could only borrow (it stays low), the oldest job that
    # fits takes the room, the next one would borrow; tenant b has its own room.
    assert sorted(_aged_ids(snap)) == [1, 4]


def test_the_guarantee_room_adds_up_the_tenants_quotas_of_every_model_in_the_pool():
    quotas = [quota("a", 4, model="H100"), quota("a", 4, model="A100"), quota("b", 8)]
    run = [running(90, "a", gpu_ids(1, 0, 1, 2, 3), "normal", runtime=7200)]
    low = job(1, "a", gpus=4, cls="low", submitted=NOW - 2 * HOUR)
    normal = job(2, "b", gpus=1, cls="normal", submitted=NOW)
    snap = snapshot([node(1)], quotas, [low, normal], run, class_aging_seconds=HOUR)
    assert _aged_ids(snap) == [1]
    bigger = job(1, "a", gpus=5, cls="low", submitted=NOW - 2 * HOUR)
    snap = snapshot([node(1)], quotas, [bigger, normal], run, class_aging_seconds=HOUR)
    assert _aged_ids(snap) == []
