"""Borrowed GPUs that come back inside the tenant's guarantee count against it in the
replay as in the dispatch loop (``engine.promotions``)."""

import pytest

from scheduling.engine import QuotaInfo
from scheduling.simulator import POLICIES, SimConfig, replay, simulation

from .conftest import POOL, scenario, sim_job

EXACT = SimConfig(dispatch_interval=0)


def _replay(promote: bool, monkeypatch):
    # One node of 8 GPUs; a and b are each guaranteed 4 and may borrow 4. Tenant a runs
    # job 1 on its guarantee and job 2 (low class) borrowed; at 1000 job 1 ends and job 3
    # (normal class) starts borrowed. At 2000 b's job 4 comes, inside b's guarantee, and
    # reclaims a borrower of a.
    if not promote:
        monkeypatch.setattr(simulation.Replay, "_promote", lambda self, key: None)
    jobs = [
        sim_job(1, 0, 1000, 4),
        sim_job(2, 1, 20_000, 4, cls="low"),
        sim_job(3, 2, 20_000, 4, cls="normal"),
        sim_job(4, 2000, 1000, 4, tenant="b"),
    ]
    quotas = [QuotaInfo("a", POOL, "", 4, 4), QuotaInfo("b", POOL, "", 4, 4)]
    return replay(scenario(jobs, gpus=8, quotas=quotas), POLICIES["sluice"], EXACT)


def _preempted(result) -> dict[str, int]:
    return {run.job.name: run.preemptions for run in result.runs if run.preemptions}


def test_a_borrower_back_inside_the_guarantee_is_not_reclaimed(monkeypatch):
    # Job 2 is inside a's guarantee once job 1 ends: job 3, borrowed, is reclaimed.
    result = _replay(True, monkeypatch)
    assert _preempted(result) == {"job3": 1}
    starts = {run.job.name: run.first_start for run in result.runs}
    assert starts["job4"] == pytest.approx(2000, abs=10)


def test_without_promotion_the_lower_class_borrower_was_reclaimed(monkeypatch):
    # Still labelled borrowed, job 2 (the lower class) was the victim, leaving a with
    # one job of 4 GPUs borrowed beyond a guarantee it no longer used.
    assert _preempted(_replay(False, monkeypatch)) == {"job2": 1}
