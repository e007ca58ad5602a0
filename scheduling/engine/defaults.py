"""The default order and preemption settings: one definition, read by the engine's
:class:`~.snapshot.Snapshot`, the portal's settings (``portal/settings.py``, each one
overridable by its ``SLUICE_*`` variable) and the simulator's ``sluice`` policy alike.

They are the settings that measured best on the shared traces (docs/benchmarks.md, the
scheduling-quality rows; DESIGN.md §6) within the design's preemption contract: the
simulator's ``sluice-tuned`` order (fair-share band 1.0, a 48 h maximum wait), without its
4 h minimum preemption gain, which would make a higher class wait for a lower one. The
earlier defaults are kept as the simulator's ``sluice-2026-12`` policy for comparison;
docs/concepts/order.md ("Changing from earlier defaults") says what a site that set the
old knobs should do.
"""

from __future__ import annotations

from typing import Final

#: Inside a class and fair-share band, small and short work first (see .order).
SIZE_ORDER: Final = True
#: Every this many seconds waited halve a job's size in that order.
SIZE_HALVING_SECONDS: Final = 6 * 3600.0
#: Past this wait (from its submission) a job goes before every job of its class and band
#: that has waited less, and holds a reservation nothing later may take.
MAX_WAIT_SECONDS: Final = 48 * 3600.0
#: Tenants within a factor 1 + this of each other's fair share form one band.
FAIR_SHARE_BAND: Final = 1.0
#: A job preempts only when that gets it running at least this much sooner. 0 (any gain) by
#: default: DESIGN §6's contract is that a higher class that may preempt does, with a grace
#: period; a 4 h gain measured a shorter average wait (the simulator's ``sluice-tuned``) but
#: makes a higher class wait for a lower one expected to end within it, so a site opts in
#: (SLUICE_PREEMPTION_MIN_GAIN_SECONDS; docs/decisions/).
PREEMPTION_MIN_GAIN_SECONDS: Final = 0.0
#: A borrower of several whole nodes reserves once it has waited this long (0: off).
GANG_BORROWER_RESERVE_SECONDS: Final = 0.0
#: After this wait a job is ordered with the next class up (0: off).
CLASS_AGING_SECONDS: Final = 0.0

#: Time-sharing, for the queues that opt in (see .order): a job that checkpoints is in
#: level 0 until it has used this many GPU-seconds, then in level 1, then level 2; a job
#: of a lower level may stop a running one of a higher level of its class. 64 and 1,024
#: GPU-hours measured best on ITP's one pool at 85 % (4 and 16 GPU-hours stopped more
#: jobs, lost more work and, with a 1 h minimum wait, 16 lost more than 0.5 %).
TIME_SHARING_LEVELS: Final = (64 * 3600.0, 1024 * 3600.0)
#: A time-sharing job that has waited this long since it last entered the queue is back
#: in level 0 (promotion, so that a job stopped for others does not starve).
TIME_SHARING_PROMOTION_SECONDS: Final = 8 * 3600.0
#: A time-sharing job stops another only once it has waited this long since it last
#: entered the queue: work that would start soon anyway stops nobody (fewer stops).
TIME_SHARING_MIN_WAIT_SECONDS: Final = 3600.0

#: Time-sharing's settings, by the name of the Snapshot field (the portal's
#: SLUICE_TIME_SHARING_* settings; only jobs whose queue time-shares read them).
SHARING_DEFAULTS: Final[dict[str, float | tuple[float, ...]]] = {
    "time_sharing_levels": TIME_SHARING_LEVELS,
    "time_sharing_promotion_seconds": TIME_SHARING_PROMOTION_SECONDS,
    "time_sharing_min_wait_seconds": TIME_SHARING_MIN_WAIT_SECONDS,
}

#: The same, by the name of the Snapshot field (and of the simulator's policy knob).
ORDER_DEFAULTS: Final[dict[str, float | bool]] = {
    "size_order": SIZE_ORDER,
    "size_halving_seconds": SIZE_HALVING_SECONDS,
    "max_wait_seconds": MAX_WAIT_SECONDS,
    "fair_share_band": FAIR_SHARE_BAND,
    "preemption_min_gain_seconds": PREEMPTION_MIN_GAIN_SECONDS,
    "gang_borrower_reserve_seconds": GANG_BORROWER_RESERVE_SECONDS,
    "class_aging_seconds": CLASS_AGING_SECONDS,
}

#: The defaults before 2026-12-07 (the simulator's ``sluice-2026-12`` policy).
EARLIER_DEFAULTS: Final[dict[str, float | bool]] = {
    **ORDER_DEFAULTS,
    "max_wait_seconds": 12 * 3600.0,
    "fair_share_band": 0.25,
    "preemption_min_gain_seconds": 0.0,
}
