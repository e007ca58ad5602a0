"""Fair-share usage history."""

import math

import pytest

from scheduling.engine import decay_usage


def test_usage_halves_after_one_half_life():
    assert decay_usage({"a": 1000.0}, 3600, 3600, {}) == pytest.approx({"a": 500.0})


def test_usage_accrues_gpu_seconds():
    # Short interval: close to gpus * elapsed.
    assert decay_usage({}, 10, 86400, {"a": 4})["a"] == pytest.approx(40, rel=1e-3)
    # Exact integral under decay: gpus * half_life / ln 2 * (1 - 0.5 ** (elapsed / half_life)).
    expected = 2 * 3600 / math.log(2) * 0.5
    assert decay_usage({}, 3600, 3600, {"a": 2})["a"] == pytest.approx(expected)


def test_two_steps_equal_one_step():
    one = decay_usage({"a": 100.0, "b": 7.0}, 1000, 600, {"a": 3})
    two = decay_usage(decay_usage({"a": 100.0, "b": 7.0}, 400, 600, {"a": 3}), 600, 600, {"a": 3})
    assert one == pytest.approx(two)


def test_no_decay_without_half_life_and_inputs_untouched():
    usage = {"a": 10.0}
    assert decay_usage(usage, 5, 0, {"a": 1, "b": 2}) == {"a": 15.0, "b": 10.0}
    assert usage == {"a": 10.0}


def test_vanishing_usage_is_dropped():
    assert decay_usage({"a": 1e-6}, 3600 * 100, 3600, {}) == {}
    assert decay_usage({"a": 5.0}, 0, 3600, {"b": 3}) == {"a": 5.0}
