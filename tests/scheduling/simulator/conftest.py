"""Shared builders of the simulator tests: tiny hand-made scenarios.

The simulator needs no Django; the tests that read or write the database say so with
the ``db`` fixtures they use.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scheduling.engine import QuotaInfo  # noqa: E402
from scheduling.simulator import (  # noqa: E402
    POLICIES,
    ClassSpec,
    NodeSpec,
    Scenario,
    SimJob,
    WorkloadSpec,
)

# The policies with any preemption gain, for the tests of preemption mechanics on tiny
# hand-made traces (the default 4 h minimum gain makes their short jobs wait instead);
# the policies that set a gain of their own keep it.
ANY_GAIN = {
    name: replace(policy, preemption_min_gain_seconds=0.0)
    if policy.preemption and name != "sluice-min-gain"
    else policy
    for name, policy in POLICIES.items()
}

POOL = "training"
CLASSES = {
    "high": ClassSpec("high", 600, preemptible=True, can_preempt=True),
    "normal": ClassSpec("normal", 400),
    "low": ClassSpec("low", 200),
}
# A short grace; a job runs 5 minutes at least before it may be preempted (as Sluice's
# default policy says), which also bounds how often one job can be preempted.
WORKLOADS = {"": WorkloadSpec(preemptible=True, grace_seconds=5, min_runtime_before_preemption=300)}


def sim_job(
    job_id: int,
    submit: float,
    duration: float,
    gpus: int = 1,
    *,
    nodes: int = 1,
    tenant: str = "a",
    cls: str = "normal",
    limit: int | None = None,
) -> SimJob:
    """A job whose declared limit is its duration unless told otherwise."""
    return SimJob(
        id=job_id,
        name=f"job{job_id}",
        tenant=tenant,
        pool=POOL,
        priority_class=cls,
        workload_type="training",
        gpus_per_node=gpus,
        nodes=nodes,
        submit=submit,
        duration=duration,
        limit=int(duration) if limit is None else limit,
    )


def scenario(
    jobs: list[SimJob],
    *,
    nodes: int = 1,
    gpus: int = 4,
    quotas: list[QuotaInfo] | None = None,
) -> Scenario:
    """``nodes`` nodes of ``gpus`` GPUs. By default tenant ``a`` is guaranteed twice the
    cluster, so that its jobs wait for GPUs, never for quota (a job waiting for its
    tenant's quota reserves no GPUs: DESIGN.md §6)."""
    capacity = 2 * nodes * gpus
    return Scenario(
        name="hand-made",
        nodes=[NodeSpec(f"n{number}", POOL, gpus, "H100") for number in range(1, nodes + 1)],
        quotas=quotas or [QuotaInfo("a", POOL, "", capacity, 0)],
        classes=dict(CLASSES),
        workloads=dict(WORKLOADS),
        jobs=jobs,
    )
