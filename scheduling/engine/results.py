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

    ``reason`` is ``"priority"`` (a higher class preempts a lower, preemptible one) or
    ``"reclaim"`` (a tenant below its guarantee takes back borrowed GPUs).
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
    """

    job_id: int
    code: str
    message: str
    queue_position: int
    pool_position: int
    estimated_start: float | None
    reserved_gpu_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class Plan:
    """The decisions of one scheduling cycle."""

    placements: list[Placement] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    pending: dict[int, PendingInfo] = field(default_factory=dict)
