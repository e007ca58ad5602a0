"""The scheduling policies a replay compares, as settings of the one engine.

There is no scheduling logic here: each policy is a set of the :class:`Snapshot` knobs
that :func:`scheduling.engine.plan` offers.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.engine.defaults import EARLIER_DEFAULTS, ORDER_DEFAULTS


@dataclass(frozen=True, slots=True)
class Policy:
    """Engine knobs of one policy (see :class:`scheduling.engine.Snapshot`)."""

    name: str
    description: str
    backfill: bool
    preemption: bool
    fair_share: bool
    global_fifo: bool = False
    # The size- and runtime-aware order (see scheduling.engine.order); None: the
    # engine's defaults (Snapshot).
    size_order: bool = True
    size_halving_seconds: float | None = None
    max_wait_seconds: float | None = None
    fair_share_band: float | None = None
    # Preemption settings (see scheduling.engine.preemption); None: the engine's default.
    preemption_min_gain_seconds: float | None = None
    # When a borrower of several whole nodes reserves GPUs (Snapshot); None: the default.
    gang_borrower_reserve_seconds: float | None = None
    # After how long a waiting job is ordered with the next class up (Snapshot); None:
    # the default (off).
    class_aging_seconds: float | None = None
    # Time-sharing (see scheduling.engine.order): every queue opts in, so the jobs that
    # checkpoint (training-like, preemptible; see snapshot.checkpoints) share GPUs inside
    # their class by least attained service. Off but in ``sluice-timeshare``.
    time_sharing: bool = False
    # Time-sharing's settings (Snapshot); None: the engine's defaults.
    time_sharing_first_level_gpu_seconds: float | None = None
    time_sharing_promotion_seconds: float | None = None
    time_sharing_min_wait_seconds: float | None = None

    def order_knobs(self) -> dict:
        """The order and preemption settings to pass to a Snapshot (only those this
        policy sets)."""
        knobs: dict = {"size_order": self.size_order}
        for name in KNOBS:
            value = getattr(self, name)
            if value is not None:
                knobs[name] = value
        if self.time_sharing_promotion_seconds is not None:
            knobs["time_sharing_promotion_seconds"] = self.time_sharing_promotion_seconds
        if self.time_sharing_min_wait_seconds is not None:
            knobs["time_sharing_min_wait_seconds"] = self.time_sharing_min_wait_seconds
        first = self.time_sharing_first_level_gpu_seconds
        if first is not None:  # the levels from there, each 16 times the one before
            knobs["time_sharing_levels"] = (first, 16 * first)
        return knobs


# The Snapshot settings a policy may set (None: the engine's default); ``bench/simulate.py
# --knob NAME=VALUE`` overrides them for a measurement.
KNOBS = (
    "size_halving_seconds",
    "max_wait_seconds",
    "fair_share_band",
    "preemption_min_gain_seconds",
    "gang_borrower_reserve_seconds",
    "class_aging_seconds",
)
# Time-sharing's settings ``--knob`` may set too (only policies that time-share read them).
SHARING_KNOBS = (
    "time_sharing_first_level_gpu_seconds",
    "time_sharing_promotion_seconds",
    "time_sharing_min_wait_seconds",
)


def _with(settings: dict, **flags) -> Policy:
    """A policy setting every knob of ``settings`` (a dict of :mod:`scheduling.engine.
    defaults`), with ``flags`` (name, description, backfill, ...)."""
    knobs = {name: float(settings[name]) for name in KNOBS}
    flags.setdefault("size_order", bool(settings["size_order"]))
    return Policy(**flags, **knobs)


POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (
        Policy(
            "fifo",
            "strict FIFO per pool: submit order, the first job that cannot start blocks the "
            "rest; no classes, fair share, backfill or preemption",
            backfill=False,
            preemption=False,
            fair_share=False,
            global_fifo=True,
        ),
        # Always the portal's default: the very settings of scheduling.engine.defaults,
        # which portal/settings.py reads too.
        _with(
            ORDER_DEFAULTS,
            name="sluice",
            description="Sluice's default (the portal's): classes, fair share in bands of "
            "twice each other's share, size- and runtime-aware order with a 48 h maximum "
            "wait, quotas with borrowing, backfill, preemption by a higher class for any gain, "
            "stop limits on every kind of stop (scheduling.engine.defaults)",
            backfill=True,
            preemption=True,
            fair_share=True,
        ),
        _with(
            EARLIER_DEFAULTS,
            name="sluice-2026-12",
            description="Sluice's default until 2026-12-07: fair-share bands of 1.25x, a 12 h "
            "maximum wait, preemption for any gain",
            backfill=True,
            preemption=True,
            fair_share=True,
        ),
        _with(
            {**EARLIER_DEFAULTS, "preemption_min_gain_seconds": 4 * 3600.0},
            name="sluice-min-gain",
            description="the default until 2026-12-07, but a job preempts only when that "
            "gets it running at least 4 h sooner than waiting, for GPUs freed by limits and "
            "for its victims' predicted ends",
            backfill=True,
            preemption=True,
            fair_share=True,
        ),
        _with(
            {**ORDER_DEFAULTS, "preemption_min_gain_seconds": 4 * 3600.0},
            name="sluice-tuned",
            description="the settings measured best on ITP's one pool at 85 % and its deep "
            "backlog (fair_share_band 1.0, a 48 h maximum wait, a 4 h minimum preemption "
            "gain): the default's order plus the gain, which a site opts in to",
            backfill=True,
            preemption=True,
            fair_share=True,
        ),
        _with(
            ORDER_DEFAULTS,
            name="sluice-timeshare",
            description="Sluice's default with time-sharing on in every queue: inside a class, "
            "jobs that checkpoint (training-like, preemptible) go by least attained GPU-time "
            "in levels, a waiting one may stop a running one of a higher level (stop limit, "
            "minimum run, promotion after a long wait)",
            backfill=True,
            preemption=True,
            fair_share=True,
            time_sharing=True,
        ),
        _with(
            ORDER_DEFAULTS,
            name="sluice-submit-order",
            description="Sluice's default with submit order inside a class and tenant (no "
            "size- and runtime-aware order)",
            backfill=True,
            preemption=True,
            fair_share=True,
            size_order=False,
        ),
        _with(
            ORDER_DEFAULTS,
            name="sluice-no-backfill",
            description="Sluice's default without backfill: nothing starts before the first "
            "blocked job of its pool",
            backfill=False,
            preemption=True,
            fair_share=True,
        ),
    )
}

DEFAULT_POLICIES = ("fifo", "sluice", "sluice-no-backfill")


def parse_policies(text: str) -> list[Policy]:
    """Policies from a comma-separated list of names; raises ValueError on an unknown one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in POLICIES]
    if unknown:
        known = ", ".join(POLICIES)
        raise ValueError(f"unknown policy {', '.join(unknown)} (known: {known})")
    if not names:
        raise ValueError("no policy given")
    return [POLICIES[name] for name in dict.fromkeys(names)]
