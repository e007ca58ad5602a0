"""What a raise would change, for the approvals inbox: a read that runs the engine twice.

The snapshot is loaded without touching the stored fair-share usage, planned as things are,
and planned again with the raised jobs at the target class. Nothing is written.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from django.utils import timezone

from .models import Job, PriorityRaise, TenantUsage
from .services.pending_cache import PendingCache, PendingRow

if TYPE_CHECKING:
    from .services.dispatch import RunningRow

# The waiting jobs as this web process last read them for a preview (read whole only when
# new or changed; see pending_cache): with 10,000 waiting, the approvals page takes ~140 ms
# instead of ~400 ms. Read whole again every 10 minutes (the dispatch leader: every minute).
# Previews are serialized: the cache's records are updated in place by each load and must
# not change under a plan that uses them.
_PREVIEW_CACHE = PendingCache(full_reload_seconds=600)
_PREVIEW_LOCK = threading.Lock()


@dataclass
class JobImpact:
    """Where one job stands now and after the raise (positions are None once it would start)."""

    job_id: int
    name: str
    starts_now: bool
    starts_after: bool
    queue_position_now: int | None
    queue_position_after: int | None
    pool_position_now: int | None
    pool_position_after: int | None
    passes: int  # jobs of its pool it would overtake

    @property
    def moves_ahead(self) -> bool:
        return self.passes > 0 or (self.starts_after and not self.starts_now)


@dataclass
class RaiseImpact:
    """The effect of granting one raise: its waiting jobs, and running jobs it could preempt."""

    jobs: list[JobImpact] = field(default_factory=list)
    preempts: list[Job] = field(default_factory=list)
    running: list[int] = field(default_factory=list)  # covered jobs already running
    note: str = ""


def _stored_usage() -> dict[str, float]:
    """Fair-share usage as last written by the dispatch loop (read only, not decayed)."""
    return dict(TenantUsage.objects.values_list("tenant__slug", "gpu_seconds"))


def _raised(entry, to_class, policy):
    """A copy of a snapshot job (pending or running) at the target class."""
    changes = {
        "priority": to_class.value,
        "priority_class": to_class.name,
        "preemptible": to_class.preemptible and (policy.preemptible if policy else True),
    }
    if hasattr(entry, "can_preempt"):
        changes["can_preempt"] = to_class.can_preempt
    return dataclasses.replace(entry, **changes)


def _covers(raise_: PriorityRaise, job: RunningRow | PendingRow) -> bool:
    """Whether the raise covers ``job`` (the dispatch loop's plain row of a placed or a
    waiting job)."""
    if raise_.job_id:
        return job.id == raise_.job_id
    return job.project_id == raise_.project_id and job.priority < raise_.to_class.value


def _position(plan, job_id: int) -> tuple[bool, int | None, int | None]:
    info = plan.pending.get(job_id)
    if info is None:
        return True, None, None
    return False, info.queue_position, info.pool_position


def _impact(raise_: PriorityRaise, loaded, baseline, engine) -> RaiseImpact:
    snapshot = loaded.snapshot
    pending_ids = {j.id for j in loaded.pending.values() if _covers(raise_, j)}
    running_ids = {j.id for j in loaded.running.values() if _covers(raise_, j)}
    policy_of = loaded.policies.get
    pending = [
        _raised(p, raise_.to_class, policy_of(p.workload_type)) if p.id in pending_ids else p
        for p in snapshot.pending
    ]
    running = [
        _raised(r, raise_.to_class, policy_of(r.workload_type)) if r.id in running_ids else r
        for r in snapshot.running
    ]
    after = engine.plan(dataclasses.replace(snapshot, pending=pending, running=running))
    result = RaiseImpact(running=sorted(running_ids))
    for job_id in sorted(pending_ids):
        now_starts, now_q, now_p = _position(baseline, job_id)
        after_starts, after_q, after_p = _position(after, job_id)
        passes = 0
        if now_p is not None:
            passes = now_p - (after_p if after_p is not None else 1)
        result.jobs.append(
            JobImpact(
                job_id=job_id,
                name=loaded.pending[job_id].name,
                starts_now=now_starts,
                starts_after=after_starts,
                queue_position_now=now_q,
                queue_position_after=after_q,
                pool_position_now=now_p,
                pool_position_after=after_p,
                passes=max(passes, 0),
            )
        )
    before_pairs = {(p.victim_id, p.preemptor_id) for p in baseline.preemptions}
    victims = [
        p.victim_id
        for p in after.preemptions
        if p.preemptor_id in pending_ids and (p.victim_id, p.preemptor_id) not in before_pairs
    ]
    found = Job.objects.select_related("tenant", "priority_class").in_bulk(victims)
    result.preempts = [found[v] for v in dict.fromkeys(victims) if v in found]
    if not pending_ids and not running_ids:
        result.note = "No job it covers is waiting or running now."
    return result


def raise_impacts(
    raises: list[PriorityRaise], now: datetime | None = None
) -> dict[int, RaiseImpact]:
    """Impact of each raise (by raise id); empty when the engine is not available."""
    if not raises:
        return {}
    try:
        from . import engine
        from .services.dispatch import load_snapshot
    except ImportError:  # the engine is optional for the pages: they work without the preview
        return {}
    with _PREVIEW_LOCK:
        try:
            loaded = load_snapshot(
                now or timezone.now(), update_usage=False, pending_cache=_PREVIEW_CACHE
            )
            if not loaded.snapshot.usage:
                loaded.snapshot = dataclasses.replace(loaded.snapshot, usage=_stored_usage())
            baseline = engine.plan(loaded.snapshot)
            return {r.pk: _impact(r, loaded, baseline, engine) for r in raises}
        except Exception:
            _PREVIEW_CACHE.clear()
            raise
