"""Fair share over several cycles: equal tenants alternate instead of one starving."""

import pytest
from engine_builders import NOW, Simulation, job, node, quota, snapshot

from scheduling.engine import plan


def _two_tenants(fair_share: bool, keep_reservations: bool = False) -> Simulation:
    """One 4-GPU node; tenants a and b, same class and guarantee, each with twenty jobs
    that take the whole node for 100 s. All of a's jobs were submitted before b's."""
    pending = [job(i, "a", gpus=4, runtime=100, submitted=NOW - 1000 + i) for i in range(20)]
    pending += [job(100 + i, "b", gpus=4, runtime=100, submitted=NOW - 500 + i) for i in range(20)]
    snap = snapshot(
        [node(1, gpus=4)], [quota("a", 4), quota("b", 4)], pending, fair_share=fair_share
    )
    return Simulation(snap, half_life=600, keep_reservations=keep_reservations)


@pytest.mark.parametrize("keep_reservations", [False, True])
def test_equal_tenants_share_the_cluster_over_time(keep_reservations):
    simulation = _two_tenants(fair_share=True, keep_reservations=keep_reservations)
    simulation.run(cycles=10)  # 1,000 s: room for ten jobs out of forty
    used = simulation.gpu_seconds
    assert used["a"] == used["b"] == 2000  # five 100-second jobs each, alternating


def test_without_fair_share_the_later_tenant_starves():
    # (Plain submit order, and no reservation handed back from cycle to cycle.)
    simulation = _two_tenants(fair_share=False)
    simulation.run(cycles=10)
    assert simulation.gpu_seconds["a"] == 4000
    assert simulation.gpu_seconds.get("b", 0) == 0


def test_lower_usage_history_goes_first_within_a_class():
    snap = snapshot(
        [node(1, gpus=4)],
        [quota("a", 4), quota("b", 4)],
        [job(1, "a", gpus=4), job(2, "b", gpus=4)],
        usage={"a": 10_000.0, "b": 10.0},
    )
    assert [p.job_id for p in plan(snap).placements] == [2]


def test_share_is_weighted_by_the_guarantee():
    # a used twice as much as b but is guaranteed four times as much: a's share is
    # 2000 / 8 = 250 against b's 1000 / 2 = 500, so both of a's jobs go first.
    snap = snapshot(
        [node(1, gpus=4)],
        [quota("a", 8), quota("b", 2)],
        [job(1, "a", gpus=2), job(2, "b", gpus=2), job(3, "a", gpus=2)],
        usage={"a": 2000.0, "b": 1000.0},
    )
    result = plan(snap)
    assert [p.job_id for p in result.placements] == [1, 3]


def test_class_beats_fair_share():
    snap = snapshot(
        [node(1, gpus=4)],
        [quota("a", 4), quota("b", 4)],
        [job(1, "a", gpus=4, cls="low"), job(2, "b", gpus=4, cls="normal")],
        usage={"a": 0.0, "b": 1e9},
    )
    assert [p.job_id for p in plan(snap).placements] == [2]
