"""The autoscaler alone (inference.autoscaler, no Django): windows, panic, ceilings, rate
limits, bounds, scale to zero; and properties over random policies and load shapes."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference import autoscaler
from inference.autoscaler import (
    MIN_REQUESTS_FOR_ERROR_RATE,
    Reason,
    Sample,
    State,
    counter_increase,
    decide,
    histogram_quantile,
    observe,
)

#: Each rule tried on its own: one replica at most, one request per replica, no step limit
#: and no scale-down delay unless the test sets them (a service's defaults are in
#: inference/scaling.py and have rate limits on).
RULES_ALONE = {
    "max_replicas": 1,
    "target_running_per_replica": 1.0,
    "scale_up_max_step": 0,
    "scale_down_delay_s": 0.0,
}


def Policy(**settings) -> autoscaler.Policy:  # noqa: N802 - stands for the class
    return autoscaler.Policy(**{**RULES_ALONE, **settings})


# --- a small simulated service -------------------------------------------------------------


def simulate(
    policy: autoscaler.Policy,
    load,
    *,
    seconds: float,
    start: int | None = None,
    tick=1.0,
    latency_ms=None,
):
    """Run the autoscaler every ``tick`` s on replicas that share ``load(t)`` ongoing
    requests evenly and report every tick (new replicas are ready at once; the newest
    leave first, their samples stay in the window as the service's would). Returns
    [(t, current, decision)]."""
    current = start if start is not None else max(policy.min_replicas, 1)
    live = list(range(current))
    next_id = current
    state = None
    samples: list[Sample] = []
    requests = 0.0
    out = []
    t = 0.0
    while t <= seconds:
        total = load(t)
        requests += total * tick
        for r in live:
            buckets = ()
            if latency_ms is not None:
                lat = latency_ms(t, current) / 1000.0
                n = requests / max(current, 1)
                buckets = ((lat / 2, 0.0), (lat, n * 0.96), (lat * 2, n), (math.inf, n))
            samples.append(
                Sample(
                    replica=r,
                    at=t,
                    running=total / current,
                    requests_total=requests / current,
                    latency_buckets=buckets,
                )
            )
        keep = t - policy.stable_window_s - 10
        samples = [s for s in samples if s.at > keep]
        d = decide(
            now=t,
            current=current,
            ready=current,
            samples=samples,
            policy=policy,
            state=state,
            live=live,
        )
        out.append((t, current, d))
        state = d.state
        while len(live) < d.desired:
            live.append(next_id)
            next_id += 1
        del live[d.desired :]
        current = d.desired
        t += tick
    return out


def step(before: float, after: float, at: float):
    return lambda t: before if t < at else after


# --- observing -----------------------------------------------------------------------------


def test_concurrency_is_the_mean_over_time_of_the_replicas_total():
    samples = [
        Sample(replica=1, at=1, running=2, waiting=1),
        Sample(replica=1, at=3, running=4, waiting=1),
        Sample(replica=2, at=2, running=1),
        Sample(replica=3, at=-100, running=50),  # outside the window
    ]
    obs = observe(samples, 4, Policy(stable_window_s=60, panic_window_s=2))
    # totals at 1 s: 3; at 2 s: 3 + 1; at 3 s: 5 + 1 (replica 2's value holds)
    assert obs.stable_concurrency == pytest.approx((3 + 4 + 6) / 3)
    assert obs.panic_concurrency == pytest.approx(6.0)
    assert obs.replicas_reporting == 2


def test_a_replica_that_stopped_reporting_counts_no_longer():
    samples = [Sample(replica=1, at=0, running=4), Sample(replica=2, at=10, running=1)]
    obs = observe(samples, 10, Policy(stable_window_s=60, panic_window_s=2))
    assert obs.stable_concurrency == pytest.approx((4 + 1) / 2)


def test_counters_restart_from_zero():
    assert counter_increase([10, 20, 5, 8]) == 10 + 5 + 3
    assert counter_increase([7]) == 0


def test_histogram_quantile_like_prometheus():
    buckets = {0.1: 50.0, 0.2: 90.0, 0.5: 100.0, math.inf: 100.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.2 + 0.3 * 0.5)
    assert histogram_quantile(0.95, {0.1: 0.0, math.inf: 10.0}) == pytest.approx(0.1)
    assert histogram_quantile(0.95, {}) is None
    assert histogram_quantile(0.95, {0.1: 0.0, math.inf: 0.0}) is None


def test_p95_and_error_rate_over_the_panic_window():
    b0 = ((0.1, 0.0), (0.5, 0.0), ("+Inf", 0.0))
    b1 = ((0.1, 10.0), (0.5, 100.0), ("+Inf", 100.0))
    samples = [
        Sample(replica=1, at=0, requests_total=0, errors_total=0, latency_buckets=b0),
        Sample(replica=1, at=5, requests_total=100, errors_total=20, latency_buckets=b1),
    ]
    obs = observe(samples, 5, Policy(stable_window_s=60, panic_window_s=6))
    assert obs.p95_ms == pytest.approx((0.1 + 0.4 * (95 - 10) / 90) * 1000)
    assert obs.error_rate == pytest.approx(0.2)
    assert obs.request_rate == pytest.approx(20.0)


def test_error_rate_needs_enough_requests():
    samples = [
        Sample(replica=1, at=0, requests_total=0, errors_total=0),
        Sample(replica=1, at=2, requests_total=MIN_REQUESTS_FOR_ERROR_RATE - 1, errors_total=5),
    ]
    assert observe(samples, 2, Policy()).error_rate is None


def test_a_restarted_replicas_histogram_counts_from_zero():
    samples = [
        Sample(replica=1, at=0, latency_buckets=((1.0, 500.0), (math.inf, 500.0))),
        Sample(replica=1, at=2, latency_buckets=((1.0, 0.0), (math.inf, 10.0))),
    ]
    obs = observe(samples, 2, Policy())
    assert obs.p95_ms == pytest.approx(1000.0)  # every request of the new process above 1 s


# --- deciding ------------------------------------------------------------------------------


def _steady(load: float, replicas: int, now: float = 100.0, **extra) -> list[Sample]:
    return [
        Sample(replica=r, at=t, running=load / replicas, **extra)
        for r in range(replicas)
        for t in range(int(now) - 58, int(now) + 1, 2)
    ]


def test_desired_is_load_over_target_rounded_up():
    policy = Policy(max_replicas=20, target_running_per_replica=4, scale_up_max_step=0)
    d = decide(now=100, current=3, ready=3, samples=_steady(12, 3), policy=policy)
    assert (d.desired, d.reason_code) == (3, Reason.STEADY)
    d = decide(now=100, current=3, ready=3, samples=_steady(17, 3), policy=policy)
    assert (d.desired, d.reason_code) == (5, Reason.SCALE_UP)
    assert d.inputs["stable_concurrency"] == pytest.approx(17)


def test_no_samples_holds():
    d = decide(now=0, current=2, ready=0, samples=[], policy=Policy(min_replicas=1, max_replicas=5))
    assert (d.desired, d.reason_code) == (2, Reason.NO_METRICS)


def test_bounds_and_their_reasons():
    policy = Policy(
        min_replicas=2, max_replicas=4, target_running_per_replica=1, scale_up_max_step=0
    )
    d = decide(now=100, current=4, ready=4, samples=_steady(40, 4), policy=policy)
    assert (d.desired, d.reason_code) == (4, Reason.MAX_REPLICAS)
    d = decide(now=100, current=3, ready=3, samples=_steady(40, 3), policy=policy)
    assert (d.desired, d.reason_code) == (4, Reason.MAX_REPLICAS)
    d = decide(now=100, current=2, ready=2, samples=_steady(0, 2), policy=policy)
    assert (d.desired, d.reason_code) == (2, Reason.MIN_REPLICAS)
    d = decide(now=100, current=0, ready=0, samples=[], policy=policy)
    assert d.desired == 2


def test_step_limit():
    policy = Policy(
        max_replicas=50, target_running_per_replica=1, scale_up_max_step=2, panic_threshold=100
    )
    d = decide(now=100, current=2, ready=2, samples=_steady(20, 2), policy=policy)
    assert (d.desired, d.reason_code) == (4, Reason.STEP_LIMITED)


def test_panic_on_a_load_step_and_never_down_while_in_panic():
    policy = Policy(
        max_replicas=40,
        target_running_per_replica=1,
        stable_window_s=60,
        panic_window_s=6,
        panic_threshold=2.0,
        scale_up_max_step=0,
    )
    runs = simulate(policy, step(4, 12, 30), seconds=200, start=4)
    first = next(t for t, cur, d in runs if d.desired > cur)
    assert first <= 30 + 6
    panic = next(t for t, cur, d in runs if d.reason_code == Reason.PANIC)
    assert 30 <= panic <= 30 + 6
    for _t, cur, d in runs:
        if d.panic:
            assert d.desired >= cur
    # load stays at 12: it ends with 12 replicas, out of panic a stable window later
    assert runs[-1][2].desired == 12 and not runs[-1][2].panic


def test_panic_ends_a_stable_window_after_the_last_trigger():
    policy = Policy(
        max_replicas=40,
        target_running_per_replica=1,
        stable_window_s=20,
        panic_window_s=4,
        scale_up_max_step=0,
    )
    runs = simulate(policy, step(2, 10, 10), seconds=60, start=2)
    panics = [t for t, _, d in runs if d.panic]
    assert panics[0] <= 14 and panics[-1] < 10 + 4 + 20 + 2


def test_scale_down_waits_for_the_delay():
    policy = Policy(
        max_replicas=20,
        target_running_per_replica=1,
        stable_window_s=10,
        panic_window_s=2,
        scale_down_delay_s=30,
        scale_up_max_step=0,
    )
    runs = simulate(policy, step(10, 2, 50), seconds=150, start=10)
    down = next(t for t, cur, d in runs if d.desired < cur)
    # The last sample of the old load is at 49 s: the delay counts from there, not from
    # when the stable window forgot it (~10 s later: the delay is not added to that lag).
    assert down >= 49 + 30
    settled = next(t for t, _cur, d in runs if d.desired == 2)
    assert settled <= 49 + 30 + 2
    delayed = [
        d for t, _, d in runs if 50 < t < down and d.reason_code == Reason.SCALE_DOWN_DELAYED
    ]
    assert delayed
    assert runs[-1][2].desired == 2


def test_latency_slo_adds_one_replica_when_all_are_ready():
    policy = Policy(
        max_replicas=10, target_running_per_replica=100, latency_slo_ms=200, scale_up_max_step=0
    )

    def hist(at, n, lat):
        return ((lat, n * 0.9), (lat * 2, n), (math.inf, n))

    samples = [
        Sample(
            replica=r,
            at=t,
            running=1,
            requests_total=t * 10.0,
            latency_buckets=hist(t, t * 10.0, 0.3),
        )
        for r in range(2)
        for t in range(90, 101, 2)
    ]
    d = decide(now=100, current=2, ready=2, samples=samples, policy=policy)
    assert d.inputs["p95_ms"] > 200
    assert (d.desired, d.reason_code) == (3, Reason.LATENCY)
    # a replica still loading its model: wait for it before asking for another
    d = decide(now=100, current=3, ready=2, samples=samples, policy=policy)
    assert d.desired == 3 and d.reason_code == Reason.LATENCY and "hold" in d.reason


def test_error_rate_and_gpu_util_ceilings():
    policy = Policy(
        max_replicas=10,
        target_running_per_replica=100,
        error_rate_max=0.05,
        gpu_util_max=80,
        scale_up_max_step=0,
    )
    samples = [
        Sample(replica=0, at=t, running=1, requests_total=t * 10.0, errors_total=t * 1.0)
        for t in range(90, 101, 2)
    ]
    d = decide(now=100, current=1, ready=1, samples=samples, policy=policy)
    assert (d.desired, d.reason_code) == (2, Reason.ERRORS)
    samples = [Sample(replica=0, at=t, running=1, gpu_util=95.0) for t in range(90, 101, 2)]
    d = decide(now=100, current=1, ready=1, samples=samples, policy=policy)
    assert (d.desired, d.reason_code) == (2, Reason.GPU_UTIL)


def test_scale_to_zero_after_the_grace_period_only():
    policy = Policy(
        min_replicas=0,
        max_replicas=4,
        scale_to_zero=True,
        scale_to_zero_grace_s=60,
        stable_window_s=10,
        panic_window_s=2,
        target_running_per_replica=1,
    )
    runs = simulate(policy, step(2, 0, 20), seconds=120, start=2)
    zero = next(t for t, cur, d in runs if d.desired == 0)
    assert 20 + 60 <= zero <= 20 + 60 + 5
    assert next(d for t, _, d in runs if t == zero).reason_code == Reason.SCALE_TO_ZERO
    assert all(d.desired >= 1 for t, _, d in runs if t < 20 + 60)
    # at zero it stays at zero without traffic, and a waiting request at the gateway wakes it
    state = runs[-1][2].state
    d = decide(now=200, current=0, ready=0, samples=[], policy=policy, state=state)
    assert d.desired == 0
    d = decide(
        now=201, current=0, ready=0, samples=[], policy=policy, state=state, gateway_waiting=3
    )
    assert d.desired == 3


def test_state_round_trips_through_json():
    state = State(recommendations=((1.0, 5), (3.0, 2)), panic_until=9.0, last_activity_at=3.0)
    assert State.from_json(state.to_json()) == state
    assert State.from_json({"recommendations": "bad"}) == State()
    assert State.from_json(None) == State()


# --- properties ----------------------------------------------------------------------------


@st.composite
def policies(draw):
    stable = draw(st.integers(8, 90))
    zero = draw(st.booleans())
    lo = 0 if zero else draw(st.integers(1, 4))
    return Policy(
        min_replicas=lo,
        max_replicas=draw(st.integers(max(lo, 1), 24)),
        target_running_per_replica=draw(st.sampled_from([0.5, 1, 2, 4, 10])),
        stable_window_s=stable,
        panic_window_s=draw(st.integers(2, stable - 1)),
        panic_threshold=draw(st.sampled_from([1.1, 1.5, 2.0, 3.0])),
        scale_up_max_step=draw(st.integers(0, 4)),
        scale_down_delay_s=draw(st.sampled_from([0, 5, 30, 90])),
        scale_to_zero=zero,
        scale_to_zero_grace_s=draw(st.sampled_from([10, 60])),
        latency_slo_ms=draw(st.sampled_from([None, 100])),
    )


segments = st.lists(
    st.tuples(st.integers(1, 40), st.floats(0, 80, allow_nan=False)), min_size=1, max_size=6
)


def piecewise(parts):
    edges, t = [], 0
    for duration, level in parts:
        t += duration
        edges.append((t, level))

    def load(now):
        for end, level in edges:
            if now < end:
                return level
        return edges[-1][1]

    return load, t


PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(policy=policies(), parts=segments)
def test_never_outside_min_and_max(policy, parts):
    load, length = piecewise(parts)
    for _t, _cur, d in simulate(
        policy,
        load,
        seconds=length + 30,
        tick=2.0,
        latency_ms=lambda t, n: 50 + 40 * load(t) / max(n, 1),
    ):
        assert policy.min_replicas <= d.desired <= policy.max_replicas


@PROPERTY
@given(policy=policies(), parts=segments)
def test_no_scale_down_within_the_delay_after_a_scale_up(policy, parts):
    load, length = piecewise(parts)
    runs = simulate(policy, load, seconds=length + 30, tick=2.0)
    ups = [(t, d.desired) for t, cur, d in runs if d.desired > cur]
    for t0, level in ups:
        for t, _cur, d in runs:
            if t0 < t < t0 + policy.scale_down_delay_s:
                assert d.desired >= level, (t0, level, t, d)


@PROPERTY
@given(policy=policies(), parts=segments)
def test_never_down_in_panic(policy, parts):
    load, length = piecewise(parts)
    for _t, cur, d in simulate(policy, load, seconds=length + 30, tick=2.0):
        if d.panic:
            assert d.desired >= cur


@PROPERTY
@given(
    policy=policies(),
    base=st.floats(0.5, 10, allow_nan=False),
    factor=st.floats(1.0, 8.0, allow_nan=False),
)
def test_panic_reacts_within_one_panic_window_of_a_load_step(policy, base, factor):
    """Settled at a load, then a step big enough to trigger panic: the service asks for
    more replicas within one panic window (unless it is at its maximum)."""
    settle = policy.stable_window_s + policy.scale_down_delay_s + 30
    runs = simulate(policy, lambda t: base, seconds=settle, tick=1.0)
    settled = runs[-1][2].desired
    target = policy.target_running_per_replica
    after = base * factor * max(settled, 1) / max(math.ceil(base / target - 1e-9), 1)
    if settled == 0 or math.ceil(after / target - 1e-9) < policy.panic_threshold * settled:
        return  # not a panic-sized step for this service
    if settled >= policy.max_replicas:
        return
    step_at = settle + 1
    runs = simulate(
        policy, step(base, after, step_at), seconds=step_at + policy.panic_window_s, tick=1.0
    )
    reacted = [t for t, cur, d in runs if t >= step_at and d.desired > cur]
    assert reacted and reacted[0] <= step_at + policy.panic_window_s


# --- a load step, waiting replicas, the p95 against the SLO --------------------------------


def _step_samples(step_at: int, now: int, low: float, high: float, per_request_s: float = 0.1):
    """Two replicas sharing ``low`` requests/s until ``step_at``, ``high`` after; each
    request ``per_request_s`` long (ongoing = rate × time), one sample a second each."""
    samples, total = [], 0.0
    for t in range(0, now + 1):
        rate = low if t <= step_at else high
        total += rate
        for r in range(2):
            samples.append(
                Sample(replica=r, at=t, running=rate * per_request_s / 2, requests_total=total / 2)
            )
    return samples


def test_a_scale_down_never_goes_below_the_panic_windows_ask():
    """2 replicas after a quiet minute; the load jumps from 2 to 30 requests/s 5 s ago: the
    stable window (60 s mean) asks for 1, the panic window for 3 (not 2 × 2: no panic)."""
    policy = Policy(max_replicas=8, target_running_per_replica=1.4, scale_up_max_step=0)
    samples = _step_samples(step_at=55, now=60, low=2, high=30)
    d = decide(now=60, current=2, ready=2, samples=samples, policy=policy)
    assert d.inputs["desired_stable"] == 1 and d.inputs["desired_panic"] >= 2
    assert d.desired == 2 and not d.panic
    assert "no scale-down below 2" in d.reason


def test_the_recent_request_rate_keeps_up_with_a_step():
    samples = _step_samples(step_at=55, now=60, low=2, high=30)
    obs = observe(samples, 60, Policy())
    assert obs.recent_request_rate == pytest.approx(30.0)
    assert obs.request_rate < 5  # the stable window's mean still lags
    d = decide(now=60, current=2, ready=2, samples=samples, policy=Policy(max_replicas=8))
    assert d.inputs["recent_request_rate"] == pytest.approx(30.0)


def test_replicas_not_started_yet_are_kept_only_as_far_as_the_load_asks():
    """The panic hold and the scale-down delay keep 4 wanted after the load ended; 2 of
    the 4 still wait for quota: they are no longer wanted (the 2 serving stay, held)."""
    policy = Policy(max_replicas=8, target_running_per_replica=1, scale_down_delay_s=60)
    now = 100.0
    samples = [
        Sample(replica=r, at=t, running=2.0 if t < 80 else 0.0)
        for r in range(2)
        for t in range(40, 101, 2)
    ]
    state = State(recommendations=((now - 10, 4),), panic_until=now + 30)
    held = decide(
        now=now, current=4, ready=2, samples=samples, policy=policy, state=state, live=[0, 1, 2, 3]
    )
    assert held.desired == 4  # without knowing which replicas started: the holds keep 4
    d = decide(
        now=now,
        current=4,
        ready=2,
        samples=samples,
        policy=policy,
        state=state,
        live=[0, 1, 2, 3],
        started=2,
    )
    assert d.desired == 2 and d.reason_code == Reason.WAITING_NOT_NEEDED
    assert "2 replica(s) not started yet" in d.reason
    # While the load still asks for them, waiting replicas stay wanted.
    busy = [Sample(replica=r, at=t, running=2.0) for r in range(2) for t in range(40, 101, 2)]
    d = decide(now=now, current=4, ready=2, samples=busy, policy=policy, state=state, started=2)
    assert d.desired == 4


def _latency_samples(buckets_then, buckets_now):
    return [
        Sample(replica=0, at=95, running=1, requests_total=0, latency_buckets=buckets_then),
        Sample(replica=0, at=100, running=1, requests_total=100, latency_buckets=buckets_now),
    ]


def test_p95_against_an_slo_that_is_a_bucket_bound_is_exact():
    """A 100 ms model (every request 105-109 ms): with the SLO 150 ms among the bounds,
    all requests are within it: no breach, and the decision says how it knows."""
    zero = ((0.1, 0.0), (0.15, 0.0), (0.25, 0.0), (math.inf, 0.0))
    now = ((0.1, 0.0), (0.15, 100.0), (0.25, 100.0), (math.inf, 100.0))
    policy = Policy(max_replicas=4, target_running_per_replica=4, latency_slo_ms=150)
    d = decide(now=100, current=1, ready=1, samples=_latency_samples(zero, now), policy=policy)
    assert d.inputs["p95_method"] == "slo_bound" and d.inputs["slo_share"] == 1.0
    assert d.inputs["p95_bucket_ms"] == [100.0, 150.0]
    assert d.reason_code != Reason.LATENCY and d.desired == 1
    assert "100.0 % of requests within the SLO 150 ms" in d.inputs["p95_words"]


def test_p95_against_an_slo_outside_or_inside_its_bucket():
    zero = ((0.1, 0.0), (0.25, 0.0), (math.inf, 0.0))
    now = ((0.1, 0.0), (0.25, 100.0), (math.inf, 100.0))
    samples = _latency_samples(zero, now)
    # The SLO above the bucket: its upper bound says p95 ≤ 250 ms.
    above = decide(now=100, current=1, ready=1, samples=samples, policy=Policy(latency_slo_ms=300))
    assert above.inputs["p95_method"] == "bucket"
    assert "p95 ≤ 250 ms" in above.inputs["p95_words"]
    # The SLO inside the bucket: only the interpolation (242.5 ms) is left, and says so.
    inside = decide(
        now=100,
        current=1,
        ready=1,
        samples=samples,
        policy=Policy(latency_slo_ms=200, max_replicas=3),
    )
    assert inside.inputs["p95_method"] == "interpolated"
    assert inside.inputs["p95_ms"] == pytest.approx(242.5)
    assert inside.reason_code == Reason.LATENCY and "interpolated" in inside.reason
    # An open top bucket: JSON has no infinity.
    top = decide(
        now=100,
        current=1,
        ready=1,
        samples=_latency_samples(((0.1, 0.0), (math.inf, 0.0)), ((0.1, 0.0), (math.inf, 9.0))),
        policy=Policy(latency_slo_ms=50),
    )
    assert top.inputs["p95_bucket_ms"] == [100.0, None]


# --- scale-down after a ramp ---------------------------------------------------------------

RAMP_POLICY = Policy(
    max_replicas=8,
    target_running_per_replica=1.4,
    stable_window_s=30,
    panic_window_s=6,
    scale_down_delay_s=30,
    scale_up_max_step=0,
)


def _ramp_down(t: float) -> float:
    """6 ongoing requests (5 replicas at 1.4) until 60 s, down to 0.5 (1 replica) at 100 s."""
    if t < 60:
        return 6.0
    if t < 100:
        return 6.0 - 5.5 * (t - 60) / 40
    return 0.5


def test_replicas_leave_as_the_load_falls():
    """A linear ramp-down: each replica leaves the scale-down delay (plus the panic
    window's lag and a tick) after the load stopped needing it. Holding the stable
    window's recommendation for the delay added the stable window's lag to that: 3
    replicas were still there 27 s after the ramp-down had ended."""
    policy = RAMP_POLICY
    runs = simulate(policy, _ramp_down, seconds=200, start=5)
    counts = {t: d.desired for t, _cur, d in runs}
    ticks = sorted(counts)
    for k in (5, 4, 3, 2):
        # first second the load fits in k - 1 replicas
        fits = next(
            t for t in ticks if _ramp_down(t) <= (k - 1) * policy.target_running_per_replica
        )
        left = next(t for t in ticks if counts[t] < k)
        assert fits + policy.scale_down_delay_s <= left, (k, fits, left)
        assert left <= fits + policy.scale_down_delay_s + policy.panic_window_s + 1, (k, fits, left)
    # the first replica leaves during the ramp-down, the last extra one a delay after it
    assert next(t for t in ticks if counts[t] < 5) < 100
    assert counts[100 + policy.scale_down_delay_s] == 1
    downs = [t for t, cur, d in runs if d.desired < cur]
    ups = [t for t, cur, d in runs if d.desired > cur and t > 0]
    assert downs and not ups


def test_after_a_panic_the_delay_holds_what_the_load_asks_not_the_panic_count():
    """A step from 4 to 16 ongoing requests for 10 s panics to 16 replicas; the load then
    settles at 8. When the panic ends (a stable window after its trigger) the service
    goes to 8 once the stable window agrees, instead of holding 16 for one more delay."""
    policy = Policy(
        max_replicas=40,
        target_running_per_replica=1,
        stable_window_s=30,
        panic_window_s=6,
        scale_down_delay_s=30,
        scale_up_max_step=0,
    )

    def load(t):
        return 4 if t < 30 else (16 if t < 40 else 8)

    runs = simulate(policy, load, seconds=150, start=4)
    assert max(d.desired for _t, _cur, d in runs) == 16
    last_panic = max(t for t, _cur, d in runs if d.panic)
    # the stable window forgets the 16 ongoing requests 30 s after 40 s
    settled = next(t for t, _cur, d in runs if d.desired == 8)
    assert settled <= max(last_panic, 40 + policy.stable_window_s) + 5
    for t, cur, d in runs:
        if t > settled:
            assert d.desired == 8 and cur == 8


@pytest.mark.parametrize("level", [2.6, 4.5, 7.2])
def test_a_noisy_flat_load_does_not_flap(level):
    """Ongoing requests around a flat level (a new random value every second, ± 0.4):
    after the first minute the count never changes, so no scale-down is undone."""
    import random

    rng = random.Random(int(level * 10))
    noise = [rng.uniform(-0.4, 0.4) for _ in range(701)]
    policy = Policy(
        max_replicas=20,
        target_running_per_replica=1,
        stable_window_s=30,
        panic_window_s=6,
        scale_down_delay_s=30,
        scale_up_max_step=0,
    )
    runs = simulate(policy, lambda t: level + noise[int(t)], seconds=700, start=1)
    changes = [(t, cur, d.desired) for t, cur, d in runs if d.desired != cur and t > 60]
    assert not changes
    assert runs[-1][2].desired == math.ceil(level)
