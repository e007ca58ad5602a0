"""The autoscaler of inference services: how many replicas a service should have now.

A pure function (stdlib only, no Django; like ``scheduling.engine``): the replicas' samples
of a recent window, the replicas the service has, its policy and the state the previous
call returned go in; the desired count, a reason and the numbers it was decided from come
out, with the state to hand to the next call. Modelled on Knative's KPA:

* **Load** is the replicas' ongoing requests (running + waiting, as vLLM / TGI / Triton
  report them), summed over the replicas at each instant and averaged over a window: the
  observed concurrency; ``desired = ceil(concurrency / target_running_per_replica)``.
* **Stable window** (``stable_window_s``, 60 s): the desired count outside panic.
* **Panic window** (``panic_window_s``, 6 s): when the panic window's desired count is at
  least ``panic_threshold`` × the current count, the service panics: it scales on the
  panic window and never scales down, until a stable window has passed without a panic
  trigger.
* **Ceilings** (extra scale-up signals, each optional): the p95 latency of the panic
  window above ``latency_slo_ms`` (see *Latency* below), the error rate of the panic window above
  ``error_rate_max`` (with at least ``MIN_REQUESTS_FOR_ERROR_RATE`` requests in it), the
  replicas' mean GPU utilization above ``gpu_util_max``. A breached ceiling asks for one
  replica more than the current count, and only once every current replica is ready (so
  that the previous step is serving before the next is asked for: latency does not fall
  while new replicas load their model); while any is breached the service does not scale
  down.
* **Scale-down floor**: outside panic, a scale-down never goes below what the panic
  window asks for (the stable window's mean lags a load step by up to a window; the
  panic window's does not).
* **Replicas not started yet** (``decide(started=...)``: those still waiting to be placed
  by the scheduler): the panic hold, the scale-down delay and the step limit keep replicas
  that serve, not replicas that wait. When the count is above what the load asks for now,
  the waiting ones beyond that ask are no longer wanted: a replica is launched only if the
  current load still asks for it when it can start.
* **Rate limits**: a scale-up adds at most ``scale_up_max_step`` replicas at a time (0: no
  limit); a scale-down happens only once the load has asked for fewer replicas for
  ``scale_down_delay_s`` (Knative's scale-down-delay): the decision takes the highest of
  the window's scale-ups and of the panic window's asks, and never goes below the stable
  window's recommendation, so a scale-up is never undone within the delay (no flapping).
  The window remembers the panic window's ask rather than the recommendation: the stable
  window's mean trails a falling load by half a window and the panic hold keeps its count
  for a stable window, and holding either for the delay added the delay to that lag
  (replicas left a ramp-down half a stable window late).
* **Bounds**: never below ``min_replicas`` (the step limit does not hold a service below
  its minimum) nor above ``max_replicas``. With ``scale_to_zero`` (``min_replicas`` 0) the
  floor is 1 until the service has seen no request and no ongoing request for
  ``scale_to_zero_grace_s``.

**Latency**: the p95 comes from the replicas' cumulative histograms (Prometheus buckets),
so it is known only to the bucket it falls in. When the SLO is one of the bucket
boundaries (the service passes it to its replicas as ``SERVE_LATENCY_SLO_SECONDS``; a
model server that adds it to its boundaries is exact) the share of requests within the
SLO is counted exactly and the SLO is breached when it is under 95 %; otherwise the bucket
bounds decide when the SLO lies outside the p95's bucket, and only an SLO inside the
bucket falls back to Prometheus' linear interpolation. ``Decision.inputs`` says which
(``p95_method``) with the bucket's bounds.

Scaling up from zero needs a signal from outside the replicas (Knative's activator: the
requests queued at the load balancer): ``decide(gateway_waiting=...)`` takes it; nothing
in Sluice measures it yet, so a service at zero wakes up when its minimum is raised.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace

from .scaling import ScalingSettings

#: Errors of a window count only with at least this many requests in it (1 of 3 failing
#: says little).
MIN_REQUESTS_FOR_ERROR_RATE = 10
#: The quantile a latency SLO is about.
SLO_QUANTILE = 0.95
#: A replica's sample stands for its load this long (the agent scrapes every ~2 s).
SAMPLE_HOLD_S = 5.0
#: ``ceil(2.0000000001)`` is 3: load this close to a whole number of replicas rounds down.
_EPSILON = 1e-9


class Reason:
    """Reason codes of a decision (the service's timeline shows them with a message)."""

    NO_METRICS = "no_metrics"
    STEADY = "steady"
    SCALE_UP = "scale_up"
    PANIC = "panic"
    LATENCY = "latency_slo"
    ERRORS = "error_rate"
    GPU_UTIL = "gpu_util"
    SCALE_DOWN = "scale_down"
    SCALE_DOWN_DELAYED = "scale_down_delayed"
    WAITING_NOT_NEEDED = "waiting_not_needed"
    STEP_LIMITED = "step_limited"
    MIN_REPLICAS = "min_replicas"
    MAX_REPLICAS = "max_replicas"
    SCALE_TO_ZERO = "scale_to_zero"
    ZERO_GRACE = "zero_grace"


@dataclass(frozen=True, slots=True)
class Sample:
    """One scrape of one replica (the agent's ServeSample, plus its GPUs' utilization).

    ``latency_buckets``: a cumulative histogram [(le seconds, count), ...] as exposed
    (le may be ``inf``); counters are cumulative and may restart from 0 (a new process).
    """

    replica: int
    at: float
    ready: bool = True
    running: float | None = None
    waiting: float | None = None
    requests_total: float | None = None
    errors_total: float | None = None
    latency_buckets: tuple[tuple[float, float], ...] = ()
    gpu_util: float | None = None  # percent, 0-100

    @property
    def concurrency(self) -> float | None:
        if self.running is None and self.waiting is None:
            return None
        return (self.running or 0.0) + (self.waiting or 0.0)


@dataclass(frozen=True, slots=True)
class Policy(ScalingSettings):
    """A service's scaling settings (``inference.models.Service`` fields of the same names):
    the fields, their defaults and bounds are those declared in ``inference/scaling.py``."""


@dataclass(frozen=True, slots=True)
class State:
    """What one call hands to the next (kept on the service as JSON).

    ``recommendations``: (at, recommended) of the last ``scale_down_delay_s``, only those
    that can still be the window's highest (a monotone queue: each lower than the one
    before). ``panic_until``: the service is in panic until then. ``last_activity_at``:
    the last time a request or an ongoing request was seen (scale to zero).
    """

    recommendations: tuple[tuple[float, int], ...] = ()
    panic_until: float | None = None
    last_activity_at: float | None = None

    def to_json(self) -> dict:
        return {
            "recommendations": [list(r) for r in self.recommendations],
            "panic_until": self.panic_until,
            "last_activity_at": self.last_activity_at,
        }

    @classmethod
    def from_json(cls, data: dict | None) -> State:
        data = data or {}
        try:
            recs = tuple((float(at), int(n)) for at, n in data.get("recommendations") or ())
        except (TypeError, ValueError):
            recs = ()
        return cls(
            recommendations=recs,
            panic_until=_number(data.get("panic_until")),
            last_activity_at=_number(data.get("last_activity_at")),
        )


@dataclass(frozen=True, slots=True)
class Observation:
    """The numbers a decision is made from (None: no replica reported it)."""

    stable_concurrency: float | None = None
    panic_concurrency: float | None = None
    request_rate: float | None = None  # requests/s over the stable window
    recent_request_rate: float | None = None  # requests/s over the panic window
    panic_requests: float = 0.0  # requests counted in the panic window
    error_rate: float | None = None  # errors / requests over the panic window
    p95_ms: float | None = None  # over the panic window (interpolated inside its bucket)
    p95_bucket_ms: tuple[float, float] | None = None  # the bucket the p95 falls in (hi: inf)
    slo_share: float | None = None  # share of requests within the SLO, when it is a bound
    gpu_util: float | None = None  # percent, mean of the replicas' latest
    replicas_reporting: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    desired: int
    reason_code: str
    reason: str
    panic: bool
    inputs: dict = field(default_factory=dict)
    state: State = field(default_factory=State)


def _number(value) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


# --- observing ----------------------------------------------------------------------------


def _by_replica(samples: Iterable[Sample], since: float, now: float) -> dict[int, list[Sample]]:
    out: dict[int, list[Sample]] = {}
    for s in samples:
        if since < s.at <= now:
            out.setdefault(s.replica, []).append(s)
    for rows in out.values():
        rows.sort(key=lambda s: s.at)
    return out


def _concurrency(
    samples: list[Sample], since: float, now: float, live: Collection[int] | None = None
) -> float | None:
    """The window's mean of the total ongoing requests (Knative's observed concurrency).

    The total at an instant is the sum, over replicas, of each one's latest value not
    older than ``SAMPLE_HOLD_S``; the window's figure is the mean of the totals at the
    instants of its samples. Replicas retired during the window count while they
    reported: their load moved to the others when they left, so it is still load; a
    replica not in ``live`` (None: all are) counts up to its last sample only."""
    series: dict[int, list[tuple[float, float]]] = {}
    for s in samples:
        value = s.concurrency
        if value is not None and since - SAMPLE_HOLD_S < s.at <= now:
            series.setdefault(s.replica, []).append((s.at, value))
    points = sorted({at for rows in series.values() for at, _ in rows if at > since})
    if not points:
        return None
    for rows in series.values():
        rows.sort()
    times = {r: [at for at, _ in rows] for r, rows in series.items()}
    total = 0.0
    gone = set() if live is None else set(series) - set(live)
    for point in points:
        for replica, rows in series.items():
            i = bisect.bisect_right(times[replica], point) - 1
            if i < 0 or rows[i][0] <= point - SAMPLE_HOLD_S:
                continue
            if replica in gone and i == len(rows) - 1 and rows[i][0] < point:
                continue  # it left after its last sample
            total += rows[i][1]
    return total / len(points)


def counter_increase(values: Sequence[float]) -> float:
    """How much a cumulative counter grew over ``values`` (in time order); a drop is a
    restart of the replica's process, counted from 0 as Prometheus' ``increase`` does."""
    grown = 0.0
    for prev, value in zip(values, values[1:], strict=False):
        grown += value if value < prev else value - prev
    return grown


def _increase(rows: list[Sample], name: str) -> tuple[float, float] | None:
    """(increase, seconds it spans) of one replica's counter, None with under 2 samples."""
    points = [(s.at, getattr(s, name)) for s in rows if getattr(s, name) is not None]
    if len(points) < 2:
        return None
    return counter_increase([v for _, v in points]), points[-1][0] - points[0][0]


def _le(value) -> float:
    try:
        return float(value)  # accepts "+Inf"
    except (TypeError, ValueError):
        return math.inf


def _histogram_increase(rows: list[Sample]) -> dict[float, float]:
    with_buckets = [s for s in rows if s.latency_buckets]
    if len(with_buckets) < 2:
        return {}
    first = {_le(le): float(n) for le, n in with_buckets[0].latency_buckets}
    last = {_le(le): float(n) for le, n in with_buckets[-1].latency_buckets}
    if any(last.get(le, 0.0) < n for le, n in first.items()):
        return last  # the process restarted: everything since counts
    return {le: n - first.get(le, 0.0) for le, n in last.items()}


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' ``histogram_quantile`` on cumulative buckets {le: count} (seconds):
    linear inside the bucket the rank falls in; the highest finite bound when it falls in
    the +Inf bucket. None without observations."""
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = (le if not math.isinf(le) else prev_le), count
    return prev_le


def quantile_bucket(q: float, buckets: dict[float, float]) -> tuple[float, float] | None:
    """(lower, upper) bounds (seconds) of the bucket the ``q`` quantile falls in: all a
    histogram knows of it (upper ``inf`` above the highest finite bound). None without
    observations."""
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_le = 0.0
    for le in bounds:
        if buckets[le] >= rank:
            return prev_le, le
        prev_le = le
    return prev_le, math.inf


def share_within(le: float, buckets: dict[float, float]) -> float | None:
    """The share of observations at most ``le`` seconds when ``le`` is a bucket bound (to a
    microsecond), else None: exact, no interpolation."""
    if not buckets:
        return None
    total = buckets[max(buckets)]
    if total <= 0:
        return None
    for bound, count in buckets.items():
        if not math.isinf(bound) and abs(bound - le) < 1e-6:
            return count / total
    return None


def observe(
    samples: Iterable[Sample],
    now: float,
    policy: Policy,
    live: Collection[int] | None = None,
) -> Observation:
    """The window figures of a decision from the replicas' samples (``live``: the
    replicas the service still has; None: every replica that reported)."""
    samples = list(samples)
    stable = _by_replica(samples, now - policy.stable_window_s, now)
    panic = _by_replica(samples, now - policy.panic_window_s, now)
    rate, rate_seen = 0.0, False
    for rows in stable.values():
        inc = _increase(rows, "requests_total")
        if inc is not None and inc[1] > 0:
            rate += inc[0] / inc[1]
            rate_seen = True
    panic_requests, panic_errors, errors_seen = 0.0, 0.0, False
    recent_rate, recent_seen = 0.0, False
    merged: dict[float, float] = {}
    for rows in panic.values():
        req = _increase(rows, "requests_total")
        if req is not None:
            panic_requests += req[0]
            if req[1] > 0:
                recent_rate += req[0] / req[1]
                recent_seen = True
        err = _increase(rows, "errors_total")
        if err is not None:
            panic_errors += err[0]
            errors_seen = True
        for le, n in _histogram_increase(rows).items():
            merged[le] = merged.get(le, 0.0) + n
    p95 = histogram_quantile(SLO_QUANTILE, merged)
    bucket = quantile_bucket(SLO_QUANTILE, merged)
    slo_share = None
    if policy.latency_slo_ms:
        slo_share = share_within(policy.latency_slo_ms / 1000.0, merged)
    error_rate = None
    if errors_seen and panic_requests >= MIN_REQUESTS_FOR_ERROR_RATE:
        error_rate = panic_errors / panic_requests
    utils = []
    for rows in stable.values():
        latest = [s.gpu_util for s in rows if s.gpu_util is not None]
        if latest:
            utils.append(latest[-1])
    return Observation(
        stable_concurrency=_concurrency(samples, now - policy.stable_window_s, now, live),
        panic_concurrency=_concurrency(samples, now - policy.panic_window_s, now, live),
        request_rate=rate if rate_seen else None,
        recent_request_rate=recent_rate if recent_seen else None,
        panic_requests=panic_requests,
        error_rate=error_rate,
        p95_ms=None if p95 is None else p95 * 1000.0,
        p95_bucket_ms=None if bucket is None else (bucket[0] * 1000.0, bucket[1] * 1000.0),
        slo_share=slo_share,
        gpu_util=sum(utils) / len(utils) if utils else None,
        replicas_reporting=len(stable),
    )


# --- deciding -----------------------------------------------------------------------------


def _replicas_for(concurrency: float, target: float) -> int:
    return max(0, math.ceil(concurrency / target - _EPSILON))


def _window_max(
    recs: tuple[tuple[float, int], ...], now: float, value: int, delay: float
) -> tuple[tuple[tuple[float, int], ...], int]:
    """Add ``(now, value)`` to the monotone queue of the delay window; its highest."""
    kept = [(at, n) for at, n in recs if at > now - delay and at <= now]
    while kept and kept[-1][1] <= value:
        kept.pop()
    kept.append((now, value))
    return tuple(kept), kept[0][1]


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def _ms(value: float) -> str:
    return "+Inf" if math.isinf(value) else f"{value:g} ms"


def latency_verdict(obs: Observation, slo_ms: float | None) -> tuple[bool, str, str] | None:
    """(breached, method, words): the panic window's p95 against the SLO, and how it was
    obtained. ``method``: ``slo_bound`` (the SLO is a bucket bound: the share of requests
    within it, exact), ``bucket`` (the SLO lies outside the p95's bucket: its bounds
    decide), ``interpolated`` (the SLO lies inside the p95's bucket: Prometheus' linear
    estimate decides). None without an SLO or without requests."""
    if not slo_ms or obs.p95_ms is None:
        return None
    lo, hi = obs.p95_bucket_ms or (obs.p95_ms, obs.p95_ms)
    if obs.slo_share is not None:
        breached = obs.slo_share < SLO_QUANTILE
        words = (
            f"{100 * obs.slo_share:.1f} % of requests within the SLO {slo_ms:g} ms "
            f"(a bound of the replicas' histogram: exact)"
        )
        return breached, "slo_bound", words
    if hi <= slo_ms:
        return False, "bucket", f"p95 ≤ {_ms(hi)} (bucket {lo:g}–{_ms(hi)}) ≤ SLO {slo_ms:g} ms"
    if lo >= slo_ms:
        return True, "bucket", f"p95 > {lo:g} ms (bucket {lo:g}–{_ms(hi)}) ≥ SLO {slo_ms:g} ms"
    return (
        obs.p95_ms > slo_ms,
        "interpolated",
        f"p95 ≈ {obs.p95_ms:.0f} ms, interpolated inside the bucket {lo:g}–{_ms(hi)} that "
        f"holds the SLO {slo_ms:g} ms",
    )


def decide(
    *,
    now: float,
    current: int,
    ready: int,
    samples: Iterable[Sample],
    policy: Policy,
    state: State | None = None,
    gateway_waiting: float = 0.0,
    live: Collection[int] | None = None,
    started: int | None = None,
) -> Decision:
    """The desired replica count of a service now, with its reason, inputs and next state.

    ``current``: replicas the service has (live, of any spec version: what it pays for);
    ``ready``: those answering their health path; ``samples``: the replicas' samples of
    at least the last stable window; ``gateway_waiting``: requests waiting in front of
    the service for a replica (scale from zero; 0 when unknown); ``live``: the ids of
    the replicas the service has now (the samples may include replicas that left during
    the window; None: all reporting replicas are live); ``started``: the replicas placed
    by the scheduler (the others wait to start; None: all have started).
    """
    state = state or State()
    obs = observe(samples, now, policy, live)
    target = max(policy.target_running_per_replica, _EPSILON)
    signals: list[str] = []

    # Scale to zero: when was the service last used?
    last_activity = state.last_activity_at
    busy = (obs.panic_concurrency or 0.0) > 0 or obs.panic_requests > 0 or gateway_waiting > 0
    if busy or last_activity is None:
        last_activity = now

    # Load: stable and panic windows.
    if obs.stable_concurrency is None and gateway_waiting <= 0:
        stable_desired = panic_desired = current
        code, message = Reason.NO_METRICS, "no load samples from the replicas yet: hold"
    else:
        stable_load = (obs.stable_concurrency or 0.0) + gateway_waiting
        panic_load = (
            obs.panic_concurrency if obs.panic_concurrency is not None else stable_load
        ) + gateway_waiting
        stable_desired = _replicas_for(stable_load, target)
        panic_desired = _replicas_for(panic_load, target)
        code, message = (
            Reason.STEADY,
            f"concurrency {stable_load:.1f} / target {target:g} per replica → {stable_desired}",
        )

    panic_until = state.panic_until
    if panic_until is not None and panic_until <= now:
        panic_until = None
    triggered = current > 0 and panic_desired >= policy.panic_threshold * current
    if triggered:
        panic_until = now + policy.stable_window_s
    in_panic = panic_until is not None
    if in_panic:
        recommended = max(panic_desired, current)
        code = Reason.PANIC
        if triggered:
            message = (
                f"panic: {_fmt(obs.panic_concurrency)} ongoing requests in the last "
                f"{policy.panic_window_s:g} s need {panic_desired} replicas "
                f"(≥ {policy.panic_threshold:g} × {current}); no scale-down until "
                f"{policy.stable_window_s:g} s without a trigger"
            )
        else:
            message = (
                f"in panic for {panic_until - now:.0f} s more: {_fmt(obs.panic_concurrency)} "
                f"ongoing requests need {panic_desired}; no scale-down meanwhile"
            )
    else:
        recommended = stable_desired
        if recommended < current and panic_desired > recommended:
            # The stable window lags a load step by up to its length: never below what
            # the panic window asks for.
            recommended = min(panic_desired, current)
            message = (
                f"{message}; the panic window's {_fmt(obs.panic_concurrency)} ongoing "
                f"requests need {panic_desired}: no scale-down below {recommended}"
            )

    # Ceilings: one more replica once every replica is serving; no scale-down meanwhile.
    breached = []
    latency = latency_verdict(obs, policy.latency_slo_ms)
    if latency is not None and latency[0]:
        breached.append((Reason.LATENCY, latency[2]))
    if policy.error_rate_max is not None and (obs.error_rate or 0.0) > policy.error_rate_max:
        breached.append(
            (
                Reason.ERRORS,
                f"error rate {100 * (obs.error_rate or 0):.1f} % > {100 * policy.error_rate_max:g} %",
            )
        )
    if policy.gpu_util_max and obs.gpu_util is not None and obs.gpu_util > policy.gpu_util_max:
        breached.append(
            (Reason.GPU_UTIL, f"GPU utilization {obs.gpu_util:.0f} % > {policy.gpu_util_max:g} %")
        )
    signals = [c for c, _ in breached]
    if breached:
        all_ready = current > 0 and ready >= current
        floor_here = current + 1 if all_ready else current
        if floor_here > recommended:
            recommended = floor_here
            words = "; ".join(m for _, m in breached)
            code = breached[0][0]
            if all_ready:
                message = f"{words} → one more replica"
            else:
                message = f"{words}: hold until the {current - ready} starting replica(s) serve"

    # Floor: min_replicas, or scale to zero after the grace period.
    if policy.scale_to_zero and policy.min_replicas == 0:
        idle_for = now - last_activity
        floor = 0 if idle_for >= policy.scale_to_zero_grace_s else 1
    else:
        floor = max(policy.min_replicas, 0)
    bounded = min(max(recommended, floor), policy.max_replicas)

    # Scale-down delay: the highest of what the load asked for in the delay window.
    recs: tuple[tuple[float, int], ...] = ()
    held = bounded
    if policy.scale_down_delay_s > 0:
        remembered = bounded
        if bounded <= current and not breached and code != Reason.NO_METRICS:
            # Not a scale-up: the window remembers what the load asks for now (the panic
            # window's ask), not the stable window's mean, which trails a falling load by
            # half a window, nor the panic hold's count: the delay then counts from when
            # the load fell, and is not added to those lags.
            remembered = min(bounded, max(min(panic_desired, policy.max_replicas), floor))
        recs, held = _window_max(state.recommendations, now, remembered, policy.scale_down_delay_s)
        held = max(held, bounded)

    desired = held
    if desired > current and policy.scale_up_max_step > 0:
        desired = min(desired, current + policy.scale_up_max_step)
    desired = min(max(desired, floor), policy.max_replicas)

    # Replicas not started yet are kept only as far as the load asks for them now.
    waiting_cut = None
    if started is not None and desired > started:
        ask = panic_desired if in_panic else stable_desired
        if code == Reason.NO_METRICS:
            ask = current
        if breached:
            ask = max(ask, started + 1)
        ask_now = min(max(ask, floor), policy.max_replicas)
        if desired > max(started, ask_now):
            waiting_cut = (desired, max(started, ask_now))
            desired = waiting_cut[1]

    if recs and desired > current and desired > bounded:
        # A scale-up the window made (a step-limited one catching up with an older
        # recommendation) holds for the whole delay from now, as any other scale-up.
        recs, _ = _window_max(recs, now, desired, policy.scale_down_delay_s)

    # The reason shown: what made the final number differ from the load's.
    if waiting_cut is not None and desired < current:
        code = Reason.WAITING_NOT_NEEDED
        message = (
            f"{current - started} replica(s) not started yet; the load now asks for "
            f"{waiting_cut[1]} (the holds would keep {waiting_cut[0]}): the waiting ones "
            "beyond that are no longer needed"
        )
    elif desired > current:
        if recommended > policy.max_replicas and desired == policy.max_replicas:
            code = Reason.MAX_REPLICAS
            message = f"{message}; capped at max_replicas {policy.max_replicas}"
        elif desired < held:
            code = Reason.STEP_LIMITED if code not in (Reason.PANIC,) else code
            message = f"{message}; +{policy.scale_up_max_step} at a time (wants {held})"
        elif recommended < floor and desired == floor:
            code = Reason.MIN_REPLICAS if floor == policy.min_replicas else Reason.ZERO_GRACE
            message = f"up to the floor of {floor} replica(s)"
        elif code in (Reason.STEADY, Reason.NO_METRICS):
            code = Reason.SCALE_UP
    elif desired < current:
        if desired == 0:
            code = Reason.SCALE_TO_ZERO
            message = (
                f"no request for {now - last_activity:.0f} s "
                f"(grace {policy.scale_to_zero_grace_s:g} s): scale to zero"
            )
        else:
            code = Reason.SCALE_DOWN
            if policy.scale_down_delay_s > 0:
                message = f"{message}; lower for {policy.scale_down_delay_s:g} s (scale-down delay)"
    else:
        if held > bounded and held >= current and bounded < current:
            code = Reason.SCALE_DOWN_DELAYED
            message = (
                f"{message}; scale-down delayed: the load asked for {held} in the last "
                f"{policy.scale_down_delay_s:g} s"
            )
        elif recommended > policy.max_replicas and current >= policy.max_replicas:
            code = Reason.MAX_REPLICAS
            message = f"{message}; at max_replicas {policy.max_replicas}"
        elif recommended < floor and current == floor and floor > 0:
            code = Reason.MIN_REPLICAS if floor == policy.min_replicas else Reason.ZERO_GRACE
            message = (
                f"{message}; at min_replicas {floor}"
                if floor == policy.min_replicas
                else f"{message}; kept at 1 for the scale-to-zero grace "
                f"({now - last_activity:.0f} of {policy.scale_to_zero_grace_s:g} s idle)"
            )

    inputs = {
        "current": current,
        "ready": ready,
        "stable_concurrency": obs.stable_concurrency,
        "panic_concurrency": obs.panic_concurrency,
        "request_rate": obs.request_rate,
        "recent_request_rate": obs.recent_request_rate,
        "error_rate": obs.error_rate,
        "p95_ms": obs.p95_ms,
        # JSON has no infinity: an open top bucket's upper bound is null.
        "p95_bucket_ms": None
        if obs.p95_bucket_ms is None
        else [None if math.isinf(b) else b for b in obs.p95_bucket_ms],
        "slo_share": obs.slo_share,
        "p95_method": None if latency is None else latency[1],
        "p95_words": None if latency is None else latency[2],
        "started": started,
        "gpu_util": obs.gpu_util,
        "replicas_reporting": obs.replicas_reporting,
        "gateway_waiting": gateway_waiting,
        "desired_stable": stable_desired,
        "desired_panic": panic_desired,
        "recommended": recommended,
        "held": held,
        "floor": floor,
        "panic": in_panic,
        "signals": signals,
        "target": target,
    }
    new_state = replace(
        state, recommendations=recs, panic_until=panic_until, last_activity_at=last_activity
    )
    return Decision(
        desired=desired,
        reason_code=code,
        reason=message,
        panic=in_panic,
        inputs=inputs,
        state=new_state,
    )
