"""Fairness per day and per hour: Jain's index of GPU-seconds received over the weighted
max-min fair share of each window."""

from types import SimpleNamespace

import pytest

from scheduling.simulator.metrics import (
    _max_min_fair,
    daily_fairness,
    hourly_fairness,
    window_fairness,
)

HOUR = 3600.0


def _run(tenant, gpus, submit, start, end):
    """A run that waited from submit to start and held ``gpus`` GPUs until end."""
    job = SimpleNamespace(tenant=tenant, gpus=gpus, submit=submit)
    waits = [(submit, start)] if start > submit else []
    return SimpleNamespace(job=job, attempts=[(start, end, tuple(range(gpus)))], waits=waits)


def test_max_min_fair_gives_a_small_demand_all_it_asks_and_the_rest_by_weight():
    share = _max_min_fair(100.0, {"a": 10.0, "b": 200.0, "c": 200.0}, {"a": 1, "b": 1, "c": 3})
    assert share == pytest.approx({"a": 10.0, "b": 22.5, "c": 67.5})


def test_every_tenant_served_its_fair_share_scores_one():
    # Two equal tenants each hold 4 of 8 GPUs for the hour while more of their jobs wait.
    runs = [
        _run("a", 4, 0, 0, HOUR),
        _run("b", 4, 0, 0, HOUR),
        _run("a", 4, 0, HOUR, 2 * HOUR),
        _run("b", 4, 0, HOUR, 2 * HOUR),
    ]
    assert hourly_fairness(runs, {"a": 4, "b": 4}, 8) == pytest.approx(1.0)


def test_one_tenant_served_ahead_of_another_lowers_the_hourly_index():
    # a holds all 8 GPUs for an hour while b's job waits: b gets 0 of its fair half.
    runs = [_run("a", 8, 0, 0, HOUR), _run("b", 4, 0, HOUR, 2 * HOUR)]
    first_hour_only = window_fairness(runs, {"a": 4, "b": 4}, 8, HOUR)
    assert first_hour_only == pytest.approx(0.5)  # x = (2, 0): Jain 4 / (2 * 4)


def test_weights_follow_the_guarantee():
    # Both want more than the 8 GPUs in the first hour; b is guaranteed three times a's
    # GPUs, so 2 and 6 GPUs is the fair split of that hour.
    runs = [
        _run("a", 2, 0, 0, HOUR),
        _run("b", 6, 0, 0, HOUR),
        _run("a", 8, 0, HOUR, 2 * HOUR),
        _run("b", 8, 0, 2 * HOUR, 3 * HOUR),
    ]
    by_hour = window_fairness(runs, {"a": 2, "b": 6}, 8, HOUR)
    assert window_fairness(runs[:2], {"a": 2, "b": 6}, 8, HOUR) == 1.0  # each got what it asked
    swapped = window_fairness(runs, {"a": 6, "b": 2}, 8, HOUR)
    assert swapped < by_hour


def test_a_day_of_alternating_hours_is_fair_by_the_day_not_by_the_hour():
    # a and b both want the 8 GPUs all day; each holds them every other hour.
    runs = [
        _run("a" if hour % 2 == 0 else "b", 8, 0, hour * HOUR, (hour + 1) * HOUR)
        for hour in range(24)
    ]
    guarantees = {"a": 4, "b": 4}
    assert daily_fairness(runs, guarantees, 8) == pytest.approx(1.0)
    assert hourly_fairness(runs, guarantees, 8) < 0.7
