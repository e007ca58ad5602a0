"""Tenants' budgets: which quota a job counts against, and whether it fits (DESIGN.md §6)."""

from __future__ import annotations

from collections.abc import Iterable

from .snapshot import QuotaInfo
from .timeline import UnitTimeline

GUARANTEED = "guaranteed"
BORROWED = "borrowed"


class Account:
    """A tenant's budget under one quota: (tenant, pool, model), model ``""`` = any model.

    ``used``/``jobs`` count what the tenant holds now (running, stopping, and placed in
    this cycle) and decide admission exactly as DESIGN.md states it. The two timelines
    plan the future (estimates) and protect reservations: a job may only start now on
    quota units nobody earlier in the order has been promised.
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

    def add_running(self, gpus: int, end: float) -> None:
        """Count a job that holds GPUs when the cycle starts."""
        self.used += gpus
        self.jobs += 1
        self._gpu_releases.extend([end] * gpus)
        self._job_releases.append(end)

    def mode(self, gpus: int, preemptible: bool) -> str | None:
        """GUARANTEED, BORROWED, or None when the job must wait for quota now."""
        if self.max_running is not None and self.jobs >= self.max_running:
            return None
        if self.used + gpus <= self.guaranteed:
            return GUARANTEED
        if preemptible and self.used + gpus <= self.limit:
            return BORROWED
        return None

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
        if self.max_running is None:
            return True
        return (self._job_timeline or self._job_slots()).free_now(self.max_running, end) >= 1

    def start(self, gpus: int, end: float) -> None:
        """Count a job placed now until ``end``."""
        self.used += gpus
        self.jobs += 1
        self._gpus().take_now(gpus, end)
        slots = self._job_slots()
        if slots is not None:
            slots.take_now(1, end)

    def earliest(self, gpus: int, preemptible: bool) -> float:
        """Earliest time the quota lets the job start, given what is promised already."""
        cap = self.guaranteed + self.borrow_limit if preemptible else self.guaranteed
        start = (self._gpu_timeline or self._gpus()).earliest(gpus, cap)
        if self.max_running is not None:
            slots = self._job_timeline or self._job_slots()
            start = max(start, slots.earliest(1, self.max_running))
        return start

    def reserve(self, gpus: int, start: float, end: float, hold_now: bool = True) -> None:
        """Promise quota to a job expected to run from ``start`` to ``end``;
        ``hold_now=False``: only count it in later estimates (see UnitTimeline)."""
        (self._gpu_timeline or self._gpus()).reserve(gpus, start, end, hold_now)
        if self.max_running is not None:
            (self._job_timeline or self._job_slots()).reserve(1, start, end, hold_now)


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
