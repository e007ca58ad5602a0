"""Decision digests: the default policy's every decision on a contended mixed scenario
(three tenants borrowing from each other, three classes, jobs of 1 to 16 GPUs) is pinned.
A change to time-sharing, which only queues that opt in use, must leave it unchanged; a
change meant to alter the default's decisions updates the digest with its measurements
(docs/benchmarks.md)."""

from __future__ import annotations

import hashlib
import random

from scheduling.engine import QuotaInfo
from scheduling.simulator import POLICIES, SimConfig, replay

from .conftest import POOL, scenario, sim_job


def mixed_scenario(jobs: int = 400, seed: int = 7):
    """``jobs`` jobs over about five days on 4 nodes of 8 GPUs: tenants a, b and c each
    guaranteed 8 GPUs and allowed to borrow 16 more, classes high / normal / low, sizes
    1, 2, 4, 8 and 16 GPUs, durations from minutes to a day, limits up to twice that."""
    draw = random.Random(seed)
    made = []
    for job_id in range(1, jobs + 1):
        gpus = draw.choice([1, 1, 1, 1, 2, 4, 8, 8, 16])
        duration = float(int(min(draw.lognormvariate(8.0, 1.6), 86_400.0)) + 60)
        made.append(
            sim_job(
                job_id,
                float(int(draw.uniform(0, 5 * 86_400))),
                duration,
                min(gpus, 8),
                nodes=2 if gpus == 16 else 1,
                tenant=draw.choice("abc"),
                cls=draw.choices(["high", "normal", "low"], [1, 7, 2])[0],
                limit=int(duration * draw.uniform(1.0, 2.0)),
            )
        )
    made.sort(key=lambda job: (job.submit, job.id))
    quotas = [QuotaInfo(tenant, POOL, "", 8, 16) for tenant in "abc"]
    return scenario(made, nodes=4, gpus=8, quotas=quotas)


def decisions_digest(result) -> str:
    """The hash bench/simulate.py prints: each job's outcome, stops and runs."""
    digest = hashlib.sha256()
    for run in sorted(result.runs, key=lambda run: run.job.id):
        digest.update(repr((run.job.id, run.outcome, run.preemptions, run.attempts)).encode())
    return digest.hexdigest()[:16]


def test_the_default_policys_decisions_are_pinned():
    result = replay(mixed_scenario(), POLICIES["sluice"], SimConfig())

    assert sum(run.preemptions for run in result.runs) > 0  # contended: stops happen
    assert decisions_digest(result) == "6640c93b09b602a4"
