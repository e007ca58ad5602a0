"""Explanation: why each job waits, where it stands, and when it should start.

The explain point of a cycle. Every job that stays pending gets a :class:`PendingInfo`:
its reason (:mod:`.reasons`) and message (:mod:`.messages`), its positions among the
jobs that stay pending (counted in scheduling order, per queue and per pool), its
estimated start and the GPUs reserved and claimed for it. A job that reserves nothing
still counts its quota from its estimate on, so that the later estimates of its tenant
are upper bounds too. Messages are cached: thousands of waiting jobs share a few
situations.
"""

from __future__ import annotations

import math
from typing import Final

from . import messages, reasons
from .cluster import SliceIndex
from .cycle import CycleState
from .placing import Option, Placing, Slot, block_patience
from .preemption import at_preemption_limit, protected_borrowers
from .quota import Account
from .results import _SET_PENDING, PendingInfo
from .snapshot import PendingJob, QueueInfo

INF: Final = math.inf

_new_object: Final = object.__new__


class Explaining:
    """Records why jobs wait, and their estimates (see the module doc)."""

    def __init__(self, state: CycleState, placing: Placing) -> None:
        self.state = state
        self.placing = placing
        self._queue_positions: dict[int, int] = {}
        self._pool_positions: dict[str, int] = {}
        self._message_cache: dict[tuple, str] = {}
        # Jobs that found no start because GPUs are kept for a job ordered after them
        # (busy without end until that job's turn): their estimates are worked out once
        # every job has been considered (see estimate_past_claims), with the jobs the
        # GPUs are kept for (for the message).
        self._after_claims: list[tuple[PendingJob, list[Option], float | None, list[int]]] = []

    def wait(
        self,
        job: PendingJob,
        code: str,
        message: str,
        start: float | None,
        reserved: tuple[int, ...] = (),
        bounded: bool = False,
    ) -> None:
        """Record why ``job`` stays pending. Jobs are recorded in scheduling order, so the
        positions are counted among the jobs that stay pending as they come. A
        ``bounded`` reservation (the job is past its maximum wait) that is handed on
        makes ``start`` the job's guaranteed start (see :mod:`.reservations`)."""
        if start == INF:
            start = None
        claimed: tuple[int, ...] = ()
        state = self.state
        if reserved and code == reasons.WAITING_FOR_PREEMPTION and state.claimed_ids:
            mine = state.claimed_ids.get(job.id)
            if mine:
                claimed = tuple(gpu_id for gpu_id in reserved if gpu_id in mine)
        queue_id, pool, job_id = job.queue_id, job.pool, job.id  # read once (uncompiled record)
        if (
            reserved
            and state.pool_blocker
            and state.pool_blocker.get(pool, job_id) != job_id
            and job_id not in state.claimed_ids
        ):
            # Without backfill the jobs behind the pool's first blocked job start after
            # it, so their reservations only make their estimates: they are not handed
            # on to the next cycle, which plans them afresh (unless a preemption keeps
            # GPUs for the job: those jobs are considered in every cycle until their
            # turn, see .settled). That keeps a cycle that stops early behind the
            # blocked job exactly like a full one, what it hands on included.
            reserved = ()
        queue_position = self._queue_positions.get(queue_id, 0) + 1
        self._queue_positions[queue_id] = queue_position
        pool_position = self._pool_positions.get(pool, 0) + 1
        self._pool_positions[pool] = pool_position
        guaranteed = start if bounded and reserved and state.policy.backfill else None
        state.result.pending[job_id] = _pending_info(
            job_id,
            code,
            message,
            queue_position,
            pool_position,
            start,
            reserved,
            claimed,
            guaranteed,
        )

    def blocked_by_head(
        self,
        job: PendingJob,
        queue: QueueInfo | None,
        options: list[Option],
        head: tuple[int, str, float],
    ) -> None:
        """The job waits behind ``head`` (id, reason, floor): the first unplaced job of
        its strict-FIFO queue (``queue``), or of the cluster (``queue`` None)."""
        if queue is None:
            message = messages.fifo_head(head[0], head[1])
        else:
            message = messages.queue_head(queue.name, head[0], head[1])
        start = self.estimate_without_gpus(job, options, head[2])
        self.wait(job, reasons.BLOCKED_BY_QUEUE_HEAD, message, start)

    def estimate_without_gpus(
        self,
        job: PendingJob,
        options: list[Option],
        floor: float | None,
        slot: Slot | None = None,
    ) -> float | None:
        """Estimate for a job that reserves nothing (it waits for quota, to borrow, or for
        its queue's head): later estimates of its tenant count its quota, but it stops
        nobody from starting now. ``slot``: its earliest slot if already computed."""
        if slot is not None:
            start, option = slot.start, slot.option
        else:
            found = self.placing.earliest_start(job, options, floor)
            if found is None:
                return None
            start, option = found[0], found[1]
        runtime = job.max_runtime_seconds if job.max_runtime_seconds > 0 else INF
        option.account.reserve(job.gpus, start, start + runtime, hold_now=False)
        return start

    def note_after_claims(
        self, job: PendingJob, options: list[Option], floor: float | None
    ) -> None:
        """A job found no start: if GPUs or quota kept for jobs ordered after it are in its
        way, it gets its estimate once every job has been considered."""
        if self.state.claims:
            claimants = self.claimants_in_the_way(job, options)
            if claimants:
                self._after_claims.append((job, options, floor, claimants))

    def claimants_in_the_way(self, job: PendingJob, options: list[Option]) -> list[int]:
        """The other jobs for which GPUs or quota are kept (see :mod:`.cycle`, claims) on
        the slices or quota accounts the job could use."""
        slices = {id(option.slice) for option in options}
        accounts = {id(option.account) for option in options}
        found: list[int] = []
        state = self.state
        for other, claims in state.claims.items():
            if other == job.id:
                continue
            if any(id(claim[0]) in slices for claim in claims) or any(
                id(kept[0]) in accounts for kept in state.quota_claims.get(other, ())
            ):
                found.append(other)
        return found

    def estimate_past_claims(self) -> None:
        """Estimates for the jobs that found no start because GPUs being freed by a
        preemption are kept for a job ordered after them (see :mod:`.cycle`, claims):
        until that job's turn those GPUs count as busy without end. Now that every job
        has been considered, the kept GPUs are the preemptor's, reserved or started up to
        its limit, so the earliest start over the index as the cycle leaves it is an
        upper bound for such a job. Only the estimate is given: the job holds nothing
        (the cycle's decisions are made; the next one, once the preemptor has started,
        reserves for it as for any job)."""
        if not self._after_claims:
            return
        pending = self.state.result.pending
        for job, options, floor, claimants in self._after_claims:
            found = self.placing.earliest_start(job, options, floor)
            info = pending.get(job.id)
            if found is None or info is None or info.estimated_start is not None:
                continue
            pending[job.id] = _pending_info(
                job.id,
                info.code,
                f"{info.message}; {messages.kept_for_preemptors(claimants)}",
                info.queue_position,
                info.pool_position,
                found[0],
                (),
                (),
                None,
            )

    def reclaim_note(self, job: PendingJob, options: list[Option]) -> str:
        """For a job inside its guarantee that found no victims: the borrowers of other
        tenants that no reclaim stops, being at their stop limit ("" if none)."""
        if not self.state.policy.preemption:
            return ""
        found: set[int] = set()
        for option in options:
            found.update(protected_borrowers(option.slice, job.tenant))
        if not found:
            return ""
        return "; " + messages.protected_borrowers(sorted(found))

    def gpu_wait_reason(
        self, job: PendingJob, slot: Slot, quota_promised: bool, gpus_promised: bool
    ) -> tuple[str, str]:
        """(reason, message) of a job that reserved ``slot``: waiting for GPUs being
        freed, for GPUs or quota promised to jobs before it, or for GPUs."""
        if slot.releasing:
            return reasons.WAITING_FOR_PREEMPTION, messages.releasing_wait(
                slot.start, self.state.now
            )
        if gpus_promised or quota_promised:
            message = self.reserved_message(job, slot.option, quota_promised)
            return reasons.RESERVED_FOR_HIGHER_PRIORITY, message
        return reasons.WAITING_FOR_GPUS, self.gpus_message(job, slot.option)

    # Messages are cached: thousands of waiting jobs share a few situations, and building
    # each string again is a noticeable part of a cycle.

    def quota_message(self, job: PendingJob, account: Account, slice_: SliceIndex) -> str:
        key = (
            id(account),
            account.used,
            account.jobs,
            slice_.idle,
            job.gpus,
            job.preemptible,
            at_preemption_limit(job),
        )
        message = self._message_cache.get(key)
        if message is None:
            message = messages.quota_wait(job, account, slice_.idle)
            self._message_cache[key] = message
        return message

    def reserved_message(self, job: PendingJob, option: Option, quota_promised: bool) -> str:
        blocker = self.state.pool_blocker.get(job.pool)
        if not self.state.policy.backfill and blocker is not None and blocker != job.id:
            return messages.pool_blocked(job, blocker)
        if quota_promised:
            return messages.reserved_quota(option.account)
        owners = option.slice.hole_owners
        key = (job.pool, owners[0] if owners else None)
        message = self._message_cache.get(key)
        if message is None:
            message = messages.reserved_gpus(job, owners, self.state.now)
            self._message_cache[key] = message
        return message

    def topology_blocked(self, job: PendingJob, options: list[Option], end: float) -> str:
        """For a job of several nodes with topology wait left (see :mod:`.cluster`) that
        would start now spread over blocks until ``end``: why it waits
        (``reasons.WAITING_FOR_TOPOLOGY``); "" else."""
        patience = block_patience(job, self.state.now)
        if patience <= 0:
            return ""
        gpus, nodes = job.gpus_per_node, job.nodes
        for option in options:
            slice_ = option.slice
            if not slice_.blocks or not slice_.block_could_hold(gpus, nodes):
                continue
            mode = option.account.mode(job.gpus, job.preemptible)
            if mode is None or not option.account.fits_now(job.gpus, mode, end):
                continue
            if slice_.find_now(gpus, nodes, end) is None:
                continue  # not even spread: it waits for GPUs
            most = slice_.most_free_in_block(gpus)
            return messages.topology_wait(job, slice_.model, most, patience)
        return ""

    def topology_preemption(self, job: PendingJob, option: Option) -> str:
        """Why a job with topology wait left waits rather than stop jobs spread over
        blocks (``reasons.WAITING_FOR_TOPOLOGY``)."""
        slice_ = option.slice
        most = slice_.most_free_in_block(job.gpus_per_node)
        patience = block_patience(job, self.state.now)
        return messages.topology_wait(job, slice_.model, most, patience, preempting=True)

    def gpus_message(self, job: PendingJob, option: Option) -> str:
        slice_ = option.slice
        return messages.gpus_wait(job, slice_.model, slice_.idle, slice_.largest_idle_block())


def _pending_info(
    job_id: int,
    code: str,
    message: str,
    queue_position: int,
    pool_position: int,
    estimated_start: float | None,
    reserved_gpu_ids: tuple[int, ...],
    claimed_gpu_ids: tuple[int, ...],
    guaranteed_start: float | None,
) -> PendingInfo:
    """``PendingInfo(...)``, faster: the same object, its slots filled directly instead of
    through the frozen dataclass's ``__init__`` (one per waiting job per cycle; here, in
    the compiled engine, it runs no interpreted frame)."""
    info = _new_object(PendingInfo)
    _set = _SET_PENDING
    _set[0](info, job_id)
    _set[1](info, code)
    _set[2](info, message)
    _set[3](info, queue_position)
    _set[4](info, pool_position)
    _set[5](info, estimated_start)
    _set[6](info, reserved_gpu_ids)
    _set[7](info, claimed_gpu_ids)
    _set[8](info, guaranteed_start)
    return info
