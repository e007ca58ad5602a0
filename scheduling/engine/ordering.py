"""Ordering: which pending job the cycle considers next.

The queue-sort point of a cycle. The order itself (classes, fair share and its bands,
size and runtime, the maximum wait, class aging) is worked out by :mod:`.order`; this
keeps what the cycle changes as it goes: each tenant's fair share, re-read after each of
its jobs so that GPUs placed earlier in the cycle count, and the heads of the strict-FIFO
queues (and, under the simulator's global FIFO, of the whole cluster): the first job of
such a queue that stays unplaced although it could run blocks the rest of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Final

from .cycle import CycleState
from .order import SizeOrder, class_order, fair_share_order, fifo_order, sharing_levels
from .snapshot import PendingJob, QueueInfo

INF: Final = math.inf


class Ordering:
    """The order of the cycle's pending jobs, and the strict-FIFO heads (see the module
    doc)."""

    def __init__(self, state: CycleState) -> None:
        self.state = state
        self._shares: dict[str, float] = {}  # fair share per tenant, kept current
        self._queue_heads: dict[int, tuple[int, str, float]] = {}
        self._fifo_head: tuple[int, str, float] | None = None
        self.heads_known = False  # any strict-FIFO head recorded yet

    def order(self) -> Iterable[PendingJob]:
        """The pending jobs in the order they are considered (a lazy order under fair
        share: a tenant's share is read again after each of its jobs)."""
        cluster, policy = self.state.cluster, self.state.policy
        if policy.global_fifo:
            return fifo_order(cluster.pending)
        sizes = SizeOrder(cluster, policy) if policy.size_order else None
        levels = sharing_levels(cluster.pending, cluster.now, policy)
        if policy.fair_share:
            tenants = {job.tenant for job in cluster.pending}
            self._shares = {tenant: self._share(tenant) for tenant in tenants}
            order: Iterable[PendingJob] = fair_share_order(
                cluster.pending, self._shares, sizes, policy.fair_share_band, levels
            )
        else:
            order = class_order(cluster.pending, sizes, levels)
        bounded = self.state.bounded
        if not bounded:
            return order
        return bounded_first(order, [job for job in cluster.pending if job.id in bounded])

    def placed(self, tenant: str) -> None:
        """A job of ``tenant`` was placed: its share counts the GPUs."""
        if tenant in self._shares:
            self._shares[tenant] = self._share(tenant)

    def _share(self, tenant: str) -> float:
        """Weighted fair share: usage history plus GPUs held now, per guaranteed GPU."""
        state = self.state
        usage = state.cluster.usage.get(tenant, 0.0) + state.running_gpus.get(tenant, 0)
        return usage / max(1, state.quotas.guaranteed_total.get(tenant, 0))

    def head_before(
        self, queue: QueueInfo | None
    ) -> tuple[tuple[int, str, float], QueueInfo | None] | None:
        """The head (id, reason, floor) a job of ``queue`` waits behind, with the
        strict-FIFO queue it heads (None: the head of the cluster's global FIFO), if any."""
        if not self.heads_known:
            return None
        if self._fifo_head is not None and self.state.policy.global_fifo:
            return self._fifo_head, None
        if queue is not None and queue.strict_fifo:
            head = self._queue_heads.get(queue.id)
            if head is not None:
                return head, queue
        return None

    def remember_head(
        self, job: PendingJob, queue: QueueInfo | None, code: str, start: float | None
    ) -> None:
        """An unplaced job that could run blocks the rest of a strict-FIFO queue."""
        floor = INF if start is None else start
        if self.state.policy.global_fifo and self._fifo_head is None:
            self._fifo_head = (job.id, code, floor)
            self.heads_known = True
        if queue is not None and queue.strict_fifo and queue.id not in self._queue_heads:
            self._queue_heads[queue.id] = (job.id, code, floor)
            self.heads_known = True


def _reserved_key(job: PendingJob) -> tuple[float, int]:
    start = job.reserved_start
    return (INF if start is None else start, job.id)


def bounded_first(order: Iterable[PendingJob], bounded: list[PendingJob]) -> Iterator[PendingJob]:
    """``order`` with the ``bounded`` jobs (past their maximum wait, holding a reservation
    handed back: see :mod:`.order`) moved ahead of every job that may not pass them,
    earliest reservation first: only a job of a strictly higher class that may preempt
    still goes before one. Considered before the others, a bounded job keeps its
    reservation while its GPUs and quota are free by its start, and conservative backfill
    keeps everyone considered after it from delaying it."""
    waiting = sorted(bounded, key=_reserved_key)
    ids = {job.id for job in waiting}
    for job in order:
        if waiting:
            passes = job.can_preempt
            priority = job.priority
            left: list[PendingJob] = []
            for held in waiting:
                if passes and priority > held.priority:
                    left.append(held)
                else:
                    yield held
            waiting = left
        if job.id not in ids:
            yield job
    yield from waiting
