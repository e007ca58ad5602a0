"""The scheduling policies a replay compares, as settings of the one engine.

There is no scheduling logic here: each policy is a set of the :class:`Snapshot` knobs
that :func:`scheduling.engine.plan` offers.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    def order_knobs(self) -> dict:
        """The order and preemption settings to pass to a Snapshot (only those this
        policy sets)."""
        knobs: dict = {"size_order": self.size_order}
        for name in KNOBS:
            value = getattr(self, name)
            if value is not None:
                knobs[name] = value
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
        Policy(
            "sluice",
            "Sluice's default: classes, fair share, quotas with borrowing, backfill, preemption",
            backfill=True,
            preemption=True,
            fair_share=True,
        ),
        Policy(
            "sluice-min-gain",
            "Sluice's default, but a job preempts only when that gets it running at least "
            "4 h sooner than waiting, for GPUs freed by limits and for its victims' "
            "predicted ends (Snapshot.preemption_min_gain_seconds; the dispatch loop's "
            "SLUICE_PREEMPTION_MIN_GAIN_SECONDS, 0 by default)",
            backfill=True,
            preemption=True,
            fair_share=True,
            preemption_min_gain_seconds=4 * 3600.0,
        ),
        Policy(
            "sluice-tuned",
            "sluice-min-gain with the order settings measured best on ITP's one pool at 85 % "
            "and its deep backlog: tenants within twice each other's fair share in one band "
            "(fair_share_band 1.0; the dispatch loop's SLUICE_FAIR_SHARE_BAND) and a 48 h "
            "maximum wait (SLUICE_MAX_WAIT_SECONDS, or the workload policies' own)",
            backfill=True,
            preemption=True,
            fair_share=True,
            preemption_min_gain_seconds=4 * 3600.0,
            fair_share_band=1.0,
            max_wait_seconds=48 * 3600.0,
        ),
        Policy(
            "sluice-submit-order",
            "Sluice's default with submit order inside a class and tenant (no size- and "
            "runtime-aware order)",
            backfill=True,
            preemption=True,
            fair_share=True,
            size_order=False,
        ),
        Policy(
            "sluice-no-backfill",
            "Sluice without backfill: nothing starts before the first blocked job of its pool",
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
