"""Replaying a scenario's pools side by side, in worker processes, when they share nothing.

The ten ITP clusters are separate clusters with separate users: their pools share no GPU
and no tenant, so each can be replayed on its own and the results put together give
exactly what one replay of them all gives. Only such a scenario
(``Scenario.independent_pools``) is split; any other is replayed in one piece.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace

from .model import Scenario
from .policies import Policy
from .simulation import ReplayResult, SimConfig, replay


def split_by_pool(scenario: Scenario) -> list[Scenario]:
    """One scenario per pool, most jobs first (so that the longest replay starts first:
    a replay's cost follows its number of cycles, hence of jobs, more than its GPU-hours)."""
    parts = []
    for pool in sorted({node.pool for node in scenario.nodes}):
        parts.append(
            replace(
                scenario,
                name=f"{scenario.name}/{pool}",
                nodes=[node for node in scenario.nodes if node.pool == pool],
                quotas=[quota for quota in scenario.quotas if quota.pool == pool],
                jobs=[job for job in scenario.jobs if job.pool == pool],
                notes=[],
            )
        )
    parts.sort(key=lambda part: (-len(part.jobs), part.name))
    return parts


def merge(scenario: Scenario, policy: Policy, parts: list[ReplayResult]) -> ReplayResult:
    """The result of the whole scenario from the results of its pools."""
    runs = sorted((run for part in parts for run in part.runs), key=lambda run: run.job.id)
    return ReplayResult(
        policy=policy.name,
        scenario=scenario.name,
        runs=runs,
        capacity=scenario.capacity,
        guarantees=scenario.guarantees(),
        series=_sum_series([part.series for part in parts]),
        plans=sum(part.plans for part in parts),
        plan_seconds=sum(part.plan_seconds for part in parts),
        wall_seconds=0.0,
        wait_reasons=_sum_reasons([part.wait_reasons for part in parts]),
        promotions=sum(part.promotions for part in parts),
    )


def _sum_reasons(all_reasons: list[dict[tuple[str, str], float]]) -> dict[tuple[str, str], float]:
    """Add the pools' job-seconds per (size, reason)."""
    total: dict[tuple[str, str], float] = defaultdict(float)
    for reasons in all_reasons:
        for key, seconds in reasons.items():
            total[key] += seconds
    return dict(total)


def _sum_series(all_series: list[tuple[list[float], list[int], list[int]]]):
    """Add step functions (time, waiting, busy) given by their change points."""
    changes: list[tuple[float, int, int]] = []
    for times, waiting, busy in all_series:
        last_waiting = last_busy = 0
        for when, now_waiting, now_busy in zip(times, waiting, busy, strict=True):
            changes.append((when, now_waiting - last_waiting, now_busy - last_busy))
            last_waiting, last_busy = now_waiting, now_busy
    changes.sort(key=lambda change: change[0])
    times_out: list[float] = []
    waiting_out: list[int] = []
    busy_out: list[int] = []
    total_waiting = total_busy = 0
    for when, delta_waiting, delta_busy in changes:
        total_waiting += delta_waiting
        total_busy += delta_busy
        if times_out and times_out[-1] == when:
            waiting_out[-1], busy_out[-1] = total_waiting, total_busy
        else:
            times_out.append(when)
            waiting_out.append(total_waiting)
            busy_out.append(total_busy)
    return times_out, waiting_out, busy_out


def _replay_part(scenario: Scenario, policy: Policy, config: SimConfig) -> ReplayResult:
    """Worker: replay one part; the engine records are dropped before pickling back."""
    result = replay(scenario, policy, config)
    for run in result.runs:
        run.pending_record = None
        run.running_record = None
    return result


def replay_split(
    scenario: Scenario,
    policy: Policy,
    config: SimConfig | None = None,
    workers: int = 1,
    progress: Callable[[float], None] | None = None,
) -> ReplayResult:
    """Replay under one policy, pool by pool in ``workers`` processes when the scenario's
    pools are independent (in one piece otherwise, or with one worker)."""
    config = config or SimConfig()
    started = time.perf_counter()
    if workers <= 1 or not scenario.independent_pools or len(scenario.pool_capacity()) < 2:
        result = replay(scenario, policy, config, progress)
        result.wall_seconds = time.perf_counter() - started
        return result
    parts = split_by_pool(scenario)
    total_jobs = max(len(scenario.jobs), 1)
    done_jobs = 0
    results = []
    with ProcessPoolExecutor(max_workers=min(workers, len(parts))) as pool:
        futures = {pool.submit(_replay_part, part, policy, config): part for part in parts}
        for future in as_completed(futures):
            results.append(future.result())
            done_jobs += len(futures[future].jobs)
            if progress is not None:
                progress(done_jobs / total_jobs)
    result = merge(scenario, policy, results)
    result.wall_seconds = time.perf_counter() - started
    return result


def compare(
    scenario: Scenario,
    policies: Sequence[Policy],
    config: SimConfig | None = None,
    progress: Callable[[float], None] | None = None,
    workers: int = 1,
) -> list[ReplayResult]:
    """Replay one scenario under each policy in turn; ``progress`` gets 0..1 overall."""
    results = []
    for number, policy in enumerate(policies):

        def step(fraction: float, number: int = number) -> None:
            if progress is not None:
                progress((number + fraction) / len(policies))

        results.append(replay_split(scenario, policy, config, workers, step))
    return results
