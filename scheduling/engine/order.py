"""The order in which pending jobs are considered (DESIGN.md §6).

Higher priority first. Inside a class, the tenant with the lowest weighted fair share goes
next, where the share is ``(decayed usage + GPUs running now) / guaranteed GPUs (min 1)``.
The share is re-read each time a tenant's job has been considered, so GPUs placed earlier
in the same cycle count: two equal tenants alternate instead of one taking everything.

**Size- and runtime-aware order** (``Snapshot.size_order``, the default). Inside a class,
tenants whose shares are close (the same *fair-share band*: shares within a factor of
``1 + fair_share_band`` of each other, on a log scale) are not told apart by share; their
jobs go smallest service first, as QSSF does, where a job's *size key* is::

    log2(GPUs x expected runtime) + submitted_at / size_halving_seconds

The expected runtime is the job's prediction (``expected_runtime_seconds``, learnt from
its owner's finished jobs) when it is shorter than the declared limit, else the limit (a
job without a limit counts as :data:`NO_LIMIT_RUNTIME`). The second term is the aging:
every ``size_halving_seconds`` a job waits counts as halving its size, so a job twice as
big as another one submitted ``size_halving_seconds`` later ties with it. Because both
terms are fixed once a job is submitted, the order between two waiting jobs never
changes over time; a job that has waited its *maximum wait* (``max_wait_seconds`` of the
job's workload policy, else the snapshot's) goes before every job of its class and band
that has waited less, oldest first: small work that keeps arriving in its class and band
no longer passes a big or long job. Between bands the lowest share goes first as before.
By itself the maximum wait is an order: higher classes and lower bands still go first.
Once such a job holds a reservation it is *bounded* (:func:`overdue`): from the next
cycle on it is considered before every job but those of a higher class that may preempt,
and its reservation is held from the cycle's start (see :func:`.ordering.bounded_first`
and :mod:`.reservations`).

With ``size_order`` off, inside a class the lowest share goes first, then submit time.
Then id, always.

**Time-sharing** (a queue that opts in; off by default). A job whose queue time-shares
and that checkpoints (``PendingJob.time_sharing``, set by the caller) is ordered by
*least attained service*, discretised as in Tiresias: its *level* is the number of
``Policy.time_sharing_levels`` thresholds its attained GPU-seconds (GPUs x time run, over
all its runs) have reached, and inside a class the jobs of a lower level go first, each
level in the order above (fair share, size, maximum wait). Every other job is in level 0.
A time-sharing job that has waited ``time_sharing_promotion_seconds`` since it last
entered the queue is promoted back to level 0, so that a job stopped for others does not
starve. A waiting time-sharing job may stop a running time-sharing job of its class and
pool in a higher level (see :mod:`.preemption`). With no time-sharing job the order is
exactly the one above.

**Class aging** (``Snapshot.class_aging_seconds``, off by default; :func:`age_classes`).
A job whose class may not preempt, once it has waited that long since its submission, is
ordered with the next class up among the waiting jobs, unless a job of that class may
preempt, and only while its tenant's guarantee in its pool has room for it: the GPUs
guaranteed to the tenant there (every GPU model's quota added up) less those its jobs
hold now (running or stopping, borrowed ones included, as admission counts them), taken
by the aged jobs oldest first. Opportunistic work (a low class) that has waited an hour
thus competes with ordinary work by size and share from then on, on its own tenant's
guarantee, where no reclaim stops it again; it is never ordered with the work that may
stop others, and aging never puts a borrower ahead of anyone (an aged job that could only
borrow would take idle GPUs from other tenants' work, only to be reclaimed). Only the
order changes: the job keeps its class's name, preemptibility and preemption rights, and
once it runs it is a job of its own class again (a victim of the classes above it). It
moves up one class at most. Measured on ITP's trace (README, *Class aging*): an hour's
aging cut the average wait of one pool at 85 % by 7.6 % over three seeds (3.3 % over
five) and lengthened that of the 95 % deep backlog by 4.7 % (5.9 % over five), with about
a tenth fewer preemptions; without the guarantee's bound (before the twenty-second
session) it cut the first by 6 % and lengthened the second by 7.5 % (three seeds).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from heapq import heappop, heapreplace
from typing import Final

from .snapshot import ClusterState, PendingJob, Policy

INF: Final = math.inf

# A job without a runtime limit is ordered as if it needed this long (7 days).
NO_LIMIT_RUNTIME: Final = 7 * 86400.0
# Runtimes under a minute order as a minute: dispatch and start-up cost that much anyway.
MIN_RUNTIME: Final = 60.0


def overdue(job: PendingJob, now: float, policy: Policy) -> bool:
    """Whether the job has waited its maximum wait (the job's, else the policy's) under
    the size-aware order: it goes before the jobs of its class and band that waited
    less, and a reservation it makes is *bounded* (see :mod:`.reservations`)."""
    if not policy.size_order:
        return False
    limit = job.max_wait_seconds if job.max_wait_seconds > 0 else policy.max_wait_seconds
    return limit > 0 and now - job.submitted_at >= limit


def _submit_key(job: PendingJob) -> tuple[float, int]:
    return (job.submitted_at, job.id)


def level_of(attained: float, thresholds: tuple[float, ...]) -> int:
    """The time-sharing level of ``attained`` GPU-seconds: how many thresholds it reached."""
    level = 0
    for threshold in thresholds:
        if attained < threshold:
            break
        level += 1
    return level


def sharing_level(job: PendingJob, now: float, policy: Policy) -> int:
    """The time-sharing level of a waiting job (see the module doc): 0 for a job that does
    not time-share or has waited its promotion time since it last entered the queue."""
    if not job.time_sharing:
        return 0
    promotion = policy.time_sharing_promotion_seconds
    queued = job.queued_at if job.queued_at > 0 else job.submitted_at
    if promotion > 0 and now - queued >= promotion:
        return 0
    return level_of(job.attained_gpu_seconds, policy.time_sharing_levels)


def sharing_floor(job: PendingJob, now: float, policy: Policy) -> float:
    """The attained GPU-seconds from which a running time-sharing job of ``job``'s class
    is in a higher level than ``job`` (INF: ``job`` does not time-share, has not waited
    ``time_sharing_min_wait_seconds`` since it last entered the queue, or is in the last
    level already)."""
    if not job.time_sharing:
        return INF
    queued = job.queued_at if job.queued_at > 0 else job.submitted_at
    if now - queued < policy.time_sharing_min_wait_seconds:
        return INF
    thresholds = policy.time_sharing_levels
    level = sharing_level(job, now, policy)
    return thresholds[level] if level < len(thresholds) else INF


def sharing_levels(pending: Iterable[PendingJob], now: float, policy: Policy) -> dict[int, int]:
    """The time-sharing level of each waiting job above level 0, by job id (empty when no
    job time-shares)."""
    levels: dict[int, int] = {}
    for job in pending:
        if job.time_sharing:
            level = sharing_level(job, now, policy)
            if level:
                levels[job.id] = level
    return levels


def age_classes(cluster: ClusterState, policy: Policy) -> ClusterState:
    """``cluster`` with each pending job that has aged (see the module doc) ordered with
    the next class up while its tenant's guarantee has room for it: a copy with copies
    of those jobs, or ``cluster`` itself when aging is off or no job moves."""
    after = policy.class_aging_seconds
    if after <= 0 or policy.global_fifo:
        return cluster
    oldest = cluster.now - after
    pending = cluster.pending
    if not any(job.submitted_at <= oldest and not job.can_preempt for job in pending):
        return cluster
    preempts: dict[int, bool] = {}
    for job in pending:
        preempts[job.priority] = preempts.get(job.priority, False) or job.can_preempt
    values = sorted(preempts)
    above = {low: high for low, high in zip(values, values[1:], strict=False) if not preempts[high]}
    candidates = sorted(
        (
            job
            for job in pending
            if job.submitted_at <= oldest and not job.can_preempt and job.priority in above
        ),
        key=_submit_key,
    )
    if not candidates:
        return cluster
    room = _guarantee_left(cluster)
    moved: dict[int, PendingJob] = {}
    for job in candidates:
        key = (job.tenant, job.pool)
        left = room.get(key, 0)
        if job.gpus <= left:
            room[key] = left - job.gpus
            moved[job.id] = job.ordered_with(above[job.priority])
    if not moved:
        return cluster
    return ClusterState(
        cluster.now,
        cluster.nodes,
        cluster.quotas,
        cluster.queues,
        cluster.running,
        [moved.get(job.id, job) for job in pending],
        cluster.usage,
    )


def _guarantee_left(cluster: ClusterState) -> dict[tuple[str, str], int]:
    """Per (tenant, pool): the GPUs guaranteed to the tenant in the pool (its quotas of
    every GPU model added up) less those its jobs hold there now (running or stopping,
    borrowed ones included, as admission counts them)."""
    room: dict[tuple[str, str], int] = {}
    for quota in cluster.quotas:
        key = (quota.tenant, quota.pool)
        room[key] = room.get(key, 0) + max(quota.guaranteed, 0)
    for job in cluster.running:
        key = (job.tenant, job.pool)
        room[key] = room.get(key, 0) - len(job.gpu_ids)
    return room


def fifo_order(pending: Iterable[PendingJob]) -> list[PendingJob]:
    """Strict submit order, ignoring priorities (the simulator's baseline)."""
    return sorted(pending, key=_submit_key)


def expected_runtime(job: PendingJob) -> float:
    """The runtime the order assumes: the prediction when below the declared limit."""
    limit = float(job.max_runtime_seconds) if job.max_runtime_seconds > 0 else NO_LIMIT_RUNTIME
    expected = job.expected_runtime_seconds
    if 0 < expected < limit:
        return max(expected, MIN_RUNTIME)
    return max(limit, MIN_RUNTIME)


def size_key(job: PendingJob, halving_seconds: float) -> float:
    """log2 of the job's service (GPUs x expected runtime), aged by its submit time."""
    service = max(job.gpus, 1) * expected_runtime(job)
    aging = job.submitted_at / halving_seconds if halving_seconds > 0 else 0.0
    return math.log2(service) + aging


class SizeOrder:
    """The per-job part of the size-aware order for one cycle (see the module doc).

    A strict-FIFO queue keeps submit order among its own jobs: they take the places the
    size order gives the queue's jobs, oldest first (see :meth:`sort`)."""

    __slots__ = ("now", "halving", "max_wait", "strict")

    def __init__(self, cluster: ClusterState, policy: Policy) -> None:
        self.now = cluster.now
        self.halving = policy.size_halving_seconds
        self.max_wait = policy.max_wait_seconds
        self.strict = {queue.id for queue in cluster.queues if queue.strict_fifo}

    def sort(self, jobs: list[PendingJob]) -> list[tuple[tuple, PendingJob]]:
        """(key, job) of ``jobs`` (of one class) in order, best first."""
        key = self.key
        keyed = sorted(((key(job), job) for job in jobs), key=_first)
        if self.strict:
            _submit_order_inside_strict_queues(keyed, self.strict)
        return keyed

    def key(self, job: PendingJob) -> tuple[int, float, int]:
        """(0, submit) for a job past its maximum wait, else (1, size key); then id."""
        limit = job.max_wait_seconds if job.max_wait_seconds > 0 else self.max_wait
        if limit > 0 and self.now - job.submitted_at >= limit:
            return (0, job.submitted_at, job.id)
        return (1, size_key(job, self.halving), job.id)


def _submit_order_inside_strict_queues(keyed: list[tuple[tuple, PendingJob]], strict: set[int]):
    """Give the places of each strict-FIFO queue's jobs to those jobs in submit order."""
    places: dict[int, list[int]] = defaultdict(list)
    for index, (_, job) in enumerate(keyed):
        if job.queue_id in strict:
            places[job.queue_id].append(index)
    for indexes in places.values():
        if len(indexes) < 2:
            continue
        items = sorted((keyed[index] for index in indexes), key=_submit_of_item)
        for index, item in zip(indexes, items, strict=True):
            keyed[index] = (keyed[index][0], item[1])


def _submit_of_item(item: tuple[tuple, PendingJob]) -> tuple[float, int]:
    return (item[1].submitted_at, item[1].id)


def band(share: float, width: float) -> float:
    """The fair-share band of a share: shares within a factor ``1 + width`` of each other
    mostly fall in the same band (``width <= 0``: every share is its own band)."""
    if width <= 0:
        return share
    return float(math.floor(math.log1p(max(share, 0.0)) / math.log1p(width)))


def _tier(job: PendingJob, levels: Mapping[int, int] | None) -> tuple[int, int]:
    """(class, minus the time-sharing level): higher first."""
    return (job.priority, -levels.get(job.id, 0) if levels else 0)


def class_order(
    pending: Iterable[PendingJob],
    sizes: SizeOrder | None = None,
    levels: Mapping[int, int] | None = None,
) -> list[PendingJob]:
    """Class, then time-sharing level (``levels``: see :func:`sharing_levels`), then
    submit time (or the size key), fair share disabled."""
    if sizes is None:
        if levels:
            return sorted(
                pending,
                key=lambda job: (-job.priority, levels.get(job.id, 0), job.submitted_at, job.id),
            )
        return sorted(pending, key=lambda job: (-job.priority, job.submitted_at, job.id))
    classes: dict[tuple[int, int], list[PendingJob]] = defaultdict(list)
    for job in pending:
        classes[_tier(job, levels)].append(job)
    return [job for tier in sorted(classes, reverse=True) for _, job in sizes.sort(classes[tier])]


def fair_share_order(
    pending: Iterable[PendingJob],
    shares: Mapping[str, float],
    sizes: SizeOrder | None = None,
    band_width: float = 0.0,
    levels: Mapping[int, int] | None = None,
) -> Iterator[PendingJob]:
    """Class, then time-sharing level (``levels``: see :func:`sharing_levels`), then
    lowest current fair share of the tenant (its band, with ``sizes``), then submit time
    (the size key, with ``sizes``).

    ``shares[tenant]`` is read again after each of the tenant's jobs has been yielded,
    so the caller may change it (e.g. count GPUs just placed) between two jobs.
    """
    classes: dict[tuple[int, int], dict[str, list[PendingJob]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for job in pending:
        classes[_tier(job, levels)][job.tenant].append(job)
    for tier in sorted(classes, reverse=True):
        if sizes is None:
            yield from _by_share(classes[tier], shares)
        else:
            yield from _by_band_and_size(classes[tier], shares, sizes, band_width)


def _by_share(tenants: dict[str, list[PendingJob]], shares: Mapping[str, float]):
    heap = []
    queues = {}
    for tenant, jobs in tenants.items():
        jobs.sort(key=_submit_key, reverse=True)  # pop() from the end = oldest
        queues[tenant] = jobs
        head = jobs[-1]
        heap.append((shares[tenant], head.submitted_at, head.id, tenant))
    heap.sort()
    while heap:
        tenant = heap[0][3]
        jobs = queues[tenant]
        yield jobs.pop()
        if jobs:
            head = jobs[-1]
            heapreplace(heap, (shares[tenant], head.submitted_at, head.id, tenant))
        else:
            heappop(heap)


def _by_band_and_size(
    tenants: dict[str, list[PendingJob]],
    shares: Mapping[str, float],
    sizes: SizeOrder,
    width: float,
):
    heap = []
    queues = {}
    for tenant, jobs in tenants.items():
        keyed = sizes.sort(jobs)
        keyed.reverse()  # pop() from the end = first
        queues[tenant] = keyed
        head_key = keyed[-1][0]
        heap.append((band(shares[tenant], width), head_key, tenant))
    heap.sort()
    while heap:
        tenant = heap[0][2]
        keyed = queues[tenant]
        yield keyed.pop()[1]
        if keyed:
            heapreplace(heap, (band(shares[tenant], width), keyed[-1][0], tenant))
        else:
            heappop(heap)


def _first(item: tuple) -> tuple:
    return item[0]
