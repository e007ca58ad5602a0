"""The order in which pending jobs are considered (DESIGN.md §6).

Higher priority first. Inside a class, the tenant with the lowest weighted fair share goes
next, where the share is ``(decayed usage + GPUs running now) / guaranteed GPUs (min 1)``.
The share is re-read each time a tenant's job has been considered, so GPUs placed earlier
in the same cycle count: two equal tenants alternate instead of one taking everything.
Then submit time, then id.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from heapq import heappop, heapreplace

from .snapshot import PendingJob


def _submit_key(job: PendingJob) -> tuple[float, int]:
    return (job.submitted_at, job.id)


def fifo_order(pending: Iterable[PendingJob]) -> list[PendingJob]:
    """Strict submit order, ignoring priorities (the simulator's baseline)."""
    return sorted(pending, key=_submit_key)


def class_order(pending: Iterable[PendingJob]) -> list[PendingJob]:
    """Class, then submit time (fair share disabled)."""
    return sorted(pending, key=lambda job: (-job.priority, job.submitted_at, job.id))


def fair_share_order(
    pending: Iterable[PendingJob], shares: Mapping[str, float]
) -> Iterator[PendingJob]:
    """Class, then lowest current fair share of the tenant, then submit time.

    ``shares[tenant]`` is read again after each of the tenant's jobs has been yielded,
    so the caller may change it (e.g. count GPUs just placed) between two jobs.
    """
    classes: dict[int, dict[str, list[PendingJob]]] = defaultdict(lambda: defaultdict(list))
    for job in pending:
        classes[job.priority][job.tenant].append(job)
    for priority in sorted(classes, reverse=True):
        heap = []
        queues = {}
        for tenant, jobs in classes[priority].items():
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
