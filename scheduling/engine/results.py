"""The output of the scheduling engine (re-exported by :mod:`scheduling.engine.plan`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Placement:
    """Start ``job_id`` now on ``gpu_ids`` (spread over ``node_ids``, in the same order)."""

    job_id: int
    gpu_ids: tuple[int, ...]
    node_ids: tuple[int, ...]
    borrowed: bool
    gpu_model: str


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop ``victim_id`` (with its grace period) so that ``preemptor_id`` can start.

    ``reason`` is ``"priority"`` (a higher class preempts a lower, preemptible one, of
    another tenant or of its own) or ``"reclaim"`` (a tenant below its guarantee takes
    back borrowed GPUs).
    """

    victim_id: int
    preemptor_id: int
    reason: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class PendingInfo:
    """Why a pending job waits, where it stands and when it should start at the latest.

    Positions are 1-based among the jobs that stay pending, in scheduling order.
    ``estimated_start`` is an epoch time, or None when the job cannot start as things are
    (held, closed queue, too big for any node or for its quota, unlimited runtimes ahead).
    ``reserved_gpu_ids`` are the GPUs held for the job from ``estimated_start`` (empty if
    it holds no reservation); pass them back in the next snapshot (see ``PendingJob``).
    ``claimed_gpu_ids`` are those of the reserved GPUs that jobs preempted for this one
    hold or have freed: pass them back too, so that nobody else takes them meanwhile.
    ``guaranteed_start`` is set for a job past its maximum wait that holds a reservation:
    it is *bounded* (see :mod:`.reservations`), and the job starts by then unless what
    the bound does not cover happens (equal to ``estimated_start``, which only moves
    earlier while the reservation stands).
    """

    job_id: int
    code: str
    message: str
    queue_position: int
    pool_position: int
    estimated_start: float | None
    reserved_gpu_ids: tuple[int, ...] = ()
    claimed_gpu_ids: tuple[int, ...] = ()
    guaranteed_start: float | None = None


# The generated ``__init__`` of a frozen dataclass sets every field through
# ``object.__setattr__`` (the price of ``frozen``): about 2 us for PendingInfo, of which a
# cycle creates one per waiting job (10^4 and more). The planner fills the slots directly
# (explaining._pending_info).
_SET_PENDING = tuple(
    getattr(PendingInfo, name).__set__ for name in PendingInfo.__dataclass_fields__
)


@dataclass(slots=True)
class Plan:
    """The decisions of one scheduling cycle. ``skipped``: pending jobs left without a
    ``PendingInfo`` by a ``decisions_only`` cycle (none of them could start or preempt)."""

    placements: list[Placement] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    pending: dict[int, PendingInfo] = field(default_factory=dict)
    skipped: int = 0
