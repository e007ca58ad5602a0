"""Tenants' budgets: which quota a job counts against, and whether it fits (DESIGN.md §6)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .snapshot import QuotaInfo, RunningJob
from .timeline import INF, UnitTimeline

GUARANTEED: Final = "guaranteed"
BORROWED: Final = "borrowed"


class Account:
    """A tenant's budget under one quota: (tenant, pool, model), model ``""`` = any model.

    ``used``/``jobs`` count what the tenant holds now (running, stopping, and placed in
    this cycle) and decide admission exactly as DESIGN.md states it. ``leaving`` and
    ``leaving_jobs`` are the part of it held by stopping jobs (stopping when the cycle
    starts or preempted in it) that no waiting job counts on yet: that quota counts as
    freed at their stop time, so a job that fits once they are gone waits for them
    instead of for quota, and takes its share when it gets a reservation. The two
    timelines plan the future (estimates) and protect reservations: a job may only start
    now on quota units nobody earlier in the order has been promised.
    """

    __slots__ = (
        "tenant",
        "pool",
        "model",
        "guaranteed",
        "borrow_limit",
        "max_running",
        "used",
        "jobs",
        "leaving",
        "leaving_jobs",
        "leaving_until",
        "now",
        "_gpu_releases",
        "_job_releases",
        "_gpu_timeline",
        "_job_timeline",
    )

    def __init__(self, tenant: str, pool: str, model: str, quota: QuotaInfo | None, now: float):
        self.tenant = tenant
        self.pool = pool
        self.model = model
        self.guaranteed = max(quota.guaranteed, 0) if quota else 0
        self.borrow_limit = max(quota.borrow_limit, 0) if quota else 0
        self.max_running = quota.max_running_jobs if quota else None
        self.used = 0
        self.jobs = 0
        self.leaving = 0
        self.leaving_jobs = 0
        self.leaving_until = now  # when the last stopping job is gone
        self.now = now
        self._gpu_releases: list[float] = []
        self._job_releases: list[float] = []
        self._gpu_timeline: UnitTimeline | None = None
        self._job_timeline: UnitTimeline | None = None

    @property
    def limit(self) -> int:
        """Most GPUs the tenant may hold under this quota (guaranteed + borrowing)."""
        return self.guaranteed + self.borrow_limit

    @property
    def label(self) -> str:
        """The GPU model the quota is for, in words."""
        return self.model or "GPUs (any model)"

    def cap(self, preemptible: bool) -> int:
        """The budget a job may use: non-preemptible work must fit the guarantee."""
        return self.limit if preemptible else self.guaranteed

    def could_ever_fit(self, gpus: int, preemptible: bool) -> bool:
        """Whether a job of ``gpus`` GPUs fits this quota when the tenant runs nothing."""
        return gpus <= self.cap(preemptible) and self.max_running != 0

    def add_running(self, gpus: int, end: float, leaving: bool = False) -> None:
        """Count a job that holds GPUs when the cycle starts (``leaving``: a stopping
        job whose quota nobody has claimed)."""
        self.used += gpus
        self.jobs += 1
        if leaving:
            self.add_leaving(gpus, end)
        self._gpu_releases.extend([end] * gpus)
        self._job_releases.append(end)

    def add_kept(self, gpus: int, jobs: int, gpu_ends: list[float], job_ends: list[float]) -> None:
        """Count at once ``jobs`` running jobs of ``gpus`` GPUs in all, none stopping, that
        free their GPUs at ``gpu_ends`` (one per GPU) and their slots at ``job_ends``
        (one per job): what :meth:`add_running` of each would count."""
        self.used += gpus
        self.jobs += jobs
        self._gpu_releases.extend(gpu_ends)
        self._job_releases.extend(job_ends)

    def release_claim(self, gpus: int, end: float) -> None:
        """A stopping job of ``gpus`` GPUs, counted until now as held without end
        because its quota was kept for the job it was stopped for, ends at ``end``."""
        self.add_leaving(gpus, end)
        self._gpus().move(gpus, INF, end)
        slots = self._job_slots()
        if slots is not None:
            slots.move(1, INF, end)

    def add_leaving(self, gpus: int, end: float) -> None:
        """Quota of a stopping job of ``gpus`` GPUs, gone by ``end``, becomes available
        to waiting jobs."""
        self.leaving += gpus
        self.leaving_jobs += 1
        self.leaving_until = max(self.leaving_until, end)

    def take_leaving(self, gpus: int) -> None:
        """A job of ``gpus`` GPUs that will start after the stopping jobs counts on
        their quota first."""
        self.leaving -= min(self.leaving, gpus)
        self.leaving_jobs -= min(self.leaving_jobs, 1)

    def mode(self, gpus: int, preemptible: bool, after_stops: bool = False) -> str | None:
        """GUARANTEED, BORROWED, or None when the job must wait for quota now
        (``after_stops``: once the stopping jobs are gone)."""
        used, jobs = self.used, self.jobs
        if after_stops:
            used -= self.leaving
            jobs -= self.leaving_jobs
        if self.max_running is not None and jobs >= self.max_running:
            return None
        if used + gpus <= self.guaranteed:
            return GUARANTEED
        if preemptible and used + gpus <= self.limit:
            return BORROWED
        return None

    def shortfall(self, gpus: int, cap: int) -> tuple[int, int]:
        """(GPUs, running jobs) the tenant's running jobs under this quota must give up,
        beyond those already stopping, for a job of ``gpus`` GPUs to fit under ``cap``."""
        need_gpus = self.used - self.leaving + gpus - cap
        need_jobs = 0
        if self.max_running is not None:
            need_jobs = self.jobs - self.leaving_jobs + 1 - self.max_running
        return max(need_gpus, 0), max(need_jobs, 0)

    def stop(self, gpus: int, end: float, when: float) -> None:
        """A running job of ``gpus`` GPUs, due to end at ``end``, is stopped by ``when``."""
        self.add_leaving(gpus, when)
        self._gpus().move(gpus, end, when)
        slots = self._job_slots()
        if slots is not None:
            slots.move(1, end, when)

    # -- timelines ----------------------------------------------------------------------

    def _gpus(self) -> UnitTimeline:
        if self._gpu_timeline is None:
            self._gpu_timeline = UnitTimeline(self.now, self._gpu_releases)
        return self._gpu_timeline

    def _job_slots(self) -> UnitTimeline | None:
        if self.max_running is None:
            return None
        if self._job_timeline is None:
            self._job_timeline = UnitTimeline(self.now, self._job_releases)
        return self._job_timeline

    def fits_now(self, gpus: int, mode: str, end: float) -> bool:
        """Whether starting now until ``end`` leaves every promised quota unit alone."""
        cap = self.guaranteed if mode == GUARANTEED else self.limit
        if (self._gpu_timeline or self._gpus()).free_now(cap, end) < gpus:
            return False
        max_running = self.max_running
        if max_running is None:
            return True
        slots = self._job_timeline or self._job_slots()
        return slots is not None and slots.free_now(max_running, end) >= 1

    def start(self, gpus: int, end: float) -> None:
        """Count a job placed now until ``end``."""
        self.used += gpus
        self.jobs += 1
        self._gpus().take_now(gpus, end)
        slots = self._job_slots()
        if slots is not None:
            slots.take_now(1, end)

    def earliest(
        self,
        gpus: int,
        preemptible: bool,
        stops: list[tuple[int, float, float]] | None = None,
        within_guarantee: bool = False,
    ) -> float:
        """Earliest time the quota lets the job start, given what is promised already;
        ``stops``: as if these (gpus, end, stop time) running jobs were being stopped;
        ``within_guarantee``: inside the guarantee only (a job that reclaims)."""
        if preemptible and not within_guarantee:
            cap = self.guaranteed + self.borrow_limit
        else:
            cap = self.guaranteed
        if stops:
            return self._earliest_after(gpus, cap, stops)
        start = (self._gpu_timeline or self._gpus()).earliest(gpus, cap)
        max_running = self.max_running
        if max_running is not None:
            slots = self._job_timeline or self._job_slots()
            if slots is not None:
                start = max(start, slots.earliest(1, max_running))
        return start

    def _earliest_after(self, gpus: int, cap: int, stops: list[tuple[int, float, float]]) -> float:
        timeline = self._gpus().copy()
        slots = self._job_slots()
        slots = slots.copy() if slots is not None else None
        for count, end, when in stops:
            timeline.move(count, end, when)
            if slots is not None:
                slots.move(1, end, when)
        start = timeline.earliest(gpus, cap)
        if slots is not None and self.max_running is not None:
            start = max(start, slots.earliest(1, self.max_running))
        return start

    def reserve(self, gpus: int, start: float, end: float, hold_now: bool = True) -> None:
        """Promise quota to a job expected to run from ``start`` to ``end``;
        ``hold_now=False``: only count it in later estimates (see UnitTimeline)."""
        (self._gpu_timeline or self._gpus()).reserve(gpus, start, end, hold_now)
        if self.max_running is not None:
            slots = self._job_timeline or self._job_slots()
            if slots is not None:
                slots.reserve(1, start, end, hold_now)


class Quotas:
    """Finds the account a (tenant, pool, model) counts against, creating it on demand."""

    def __init__(self, quotas: Iterable[QuotaInfo], now: float) -> None:
        self.now = now
        self._quotas: dict[tuple[str, str, str], QuotaInfo] = {}
        self.guaranteed_total: dict[str, int] = {}
        for quota in quotas:
            self._quotas[(quota.tenant, quota.pool, quota.gpu_model)] = quota
            self.guaranteed_total[quota.tenant] = self.guaranteed_total.get(quota.tenant, 0) + max(
                quota.guaranteed, 0
            )
        self._accounts: dict[tuple[str, str, str], Account] = {}
        self._resolved: dict[tuple[str, str, str], Account] = {}

    def account(self, tenant: str, pool: str, model: str) -> Account:
        """The account of ``tenant`` for ``model`` in ``pool`` (model quota over ``""``)."""
        found = self._resolved.get((tenant, pool, model))
        if found is not None:
            return found
        key_model = model if (tenant, pool, model) in self._quotas else ""
        key = (tenant, pool, key_model)
        account = self._accounts.get(key)
        if account is None:
            account = Account(tenant, pool, key_model, self._quotas.get(key), self.now)
            self._accounts[key] = account
        self._resolved[(tenant, pool, model)] = account
        return account


def promotions(running: Iterable[RunningJob], quotas: Iterable[QuotaInfo]) -> list[int]:
    """The running jobs that borrowed GPUs when they started and now fit their tenant's
    guarantee: those GPUs count against the guarantee from now on, so they are no
    longer reclaimable (DESIGN.md §6: reclaim takes back what a tenant borrows beyond its
    guarantee, never its guarantee).

    A job is admitted as borrowed when its tenant's guarantee is used up at its start;
    once the tenant's guaranteed jobs end, what it still runs may be within its
    guarantee again. Left labelled borrowed, such a job stays a reclaim victim: another
    tenant below its guarantee would stop it and leave its tenant below its own, which
    may then reclaim in turn (churn). For each quota account (tenant, pool, GPU model;
    model ``""`` for the pool's any-model quota, as :class:`Quotas` resolves it), the
    GPUs of the running jobs not borrowed (stopping ones included: they hold theirs
    until gone) are counted, then the borrowed jobs not stopping are taken oldest first
    (start, then id) while they fit what is left of the guarantee (a later, smaller one
    may fit where an older one does not). The callers record the change (the dispatch
    loop on the jobs' allocations, the simulator on its records) and hand the jobs as
    not borrowed from then on."""
    guaranteed = _guarantees(quotas)
    held: dict[tuple[str, str, str], int] = {}
    borrowers = _count_running(running, guaranteed, held, None)
    promoted: list[int] = []
    for key, jobs in borrowers.items():
        promoted.extend(fit_guarantee(jobs, guaranteed.get(key, 0) - held.get(key, 0)))
    return promoted


# A job placed in a cycle: (job id, tenant, pool, GPU model, GPUs, borrowed).
PlacedJob = tuple[int, str, str, str, int, bool]


def placed_within_guarantee(
    running: Iterable[RunningJob], placed: list[PlacedJob], quotas: Iterable[QuotaInfo]
) -> list[int]:
    """The jobs placed as borrowed in a cycle that fit their tenant's guarantee: they
    start on it, as :func:`promotions` would move them there at the next cycle.

    Admission counts every GPU the tenant holds, borrowed ones included (DESIGN.md §6),
    so a job that starts while its tenant runs a borrowed job too big for what is left
    of the guarantee is admitted as borrowed although the guarantee has room for it.
    Per quota account, the GPUs not borrowed (running, stopping, and placed in the
    cycle as guaranteed) are counted, then the running borrowers (older) take what is
    left as :func:`promotions` would, then the borrowed placements, by job id (they all
    start now), each while it fits."""
    if not any(item[5] for item in placed):
        return []  # nothing placed as borrowed (most cycles)
    guaranteed = _guarantees(quotas)
    wanted: dict[tuple[str, str, str], list[PlacedJob]] = {}
    held: dict[tuple[str, str, str], int] = {}
    for item in placed:
        key = _account_key(guaranteed, item[1], item[2], item[3])
        if item[5]:
            wanted.setdefault(key, []).append(item)
        else:
            held[key] = held.get(key, 0) + item[4]
    if not wanted:
        return []
    borrowers = _count_running(running, guaranteed, held, wanted)
    labelled: list[int] = []
    for key, items in wanted.items():
        room = guaranteed.get(key, 0) - held.get(key, 0)
        if room <= 0:
            continue
        older = borrowers.get(key)
        if older:
            taken = set(fit_guarantee(older, room))
            room -= sum(len(job.gpu_ids) for job in older if job.id in taken)
        for item in sorted(items):
            if item[4] <= room:
                labelled.append(item[0])
                room -= item[4]
    return labelled


def _count_running(
    running: Iterable[RunningJob],
    guaranteed: dict[tuple[str, str, str], int],
    held: dict[tuple[str, str, str], int],
    accounts: dict | None,
) -> dict[tuple[str, str, str], list[RunningJob]]:
    """Add the GPUs of the running jobs not borrowed (stopping ones included) to ``held``
    per quota account, and return the borrowed jobs not stopping per account (only the
    accounts in ``accounts``, unless None)."""
    borrowers: dict[tuple[str, str, str], list[RunningJob]] = {}
    for job in running:
        key = _account_key(guaranteed, job.tenant, job.pool, job.gpu_model)
        if accounts is not None and key not in accounts:
            continue
        if not job.borrowed:
            held[key] = held.get(key, 0) + len(job.gpu_ids)
        elif not job.stopping:
            borrowers.setdefault(key, []).append(job)
    return borrowers


def _guarantees(quotas: Iterable[QuotaInfo]) -> dict[tuple[str, str, str], int]:
    return {
        (quota.tenant, quota.pool, quota.gpu_model): max(quota.guaranteed, 0) for quota in quotas
    }


def _account_key(
    guaranteed: dict[tuple[str, str, str], int], tenant: str, pool: str, model: str
) -> tuple[str, str, str]:
    """The quota a job counts against: its GPU model's, else the pool's any-model one
    (as :meth:`Quotas.account` resolves it)."""
    key = (tenant, pool, model)
    return key if key in guaranteed else (tenant, pool, "")


def fit_guarantee(borrowers: list[RunningJob], room: int) -> list[int]:
    """The ids of the jobs among ``borrowers`` (borrowed, not stopping, of one quota
    account) that ``room`` guaranteed GPUs take: oldest first (start, then id), each
    while it fits what is left (see :func:`promotions`)."""
    if room <= 0:
        return []
    promoted: list[int] = []
    for job in sorted(borrowers, key=_started):
        gpus = len(job.gpu_ids)
        if gpus <= room:
            promoted.append(job.id)
            room -= gpus
    return promoted


def _started(job: RunningJob) -> tuple[float, int]:
    return job.started_at, job.id
