"""Figures of a replay: waits, completion times, makespan, utilization, fairness, preemptions.

Definitions (docs/simulator.md repeats them):

- *queueing delay* (wait, ``wait_*``): all the time a job waited, over the jobs that
  started: first start - submit, plus each re-wait after a preemption (from the
  preempted run's stop to the next start; a re-wait still open when the replay ends is
  left out); percentiles interpolate linearly between ranks. ``wait_first_*`` is the
  first part alone (first start - submit), ``rewait_avg_s`` the rest per started job,
  and ``rewait_preempted_avg_s`` the rest per job preempted at least once;
  ``wait_big_avg_s`` is the average wait of the jobs over 8 GPUs (multi-node work);
- *job completion time* (JCT): end - submit, over jobs that completed or timed out;
- *makespan*: last end - first submit;
- *utilization*: GPU-seconds held by jobs (lost work and grace periods included) /
  (the cluster's GPUs x makespan);
- *fairness*: Jain's index (sum x)^2 / (n sum x^2) over tenants with a guarantee, of
  x = GPU-seconds received / guaranteed GPUs. Over a whole replay every job runs to its
  end, so each tenant receives about what it asked and the index says little;
  ``fairness_daily`` / ``fairness_hourly`` look at each day / hour apart, where it
  matters: x = GPU-seconds received / fair share, the fair share being the weighted
  max-min division of the window's GPU-seconds among the tenants that asked for GPUs in
  it (weights: guaranteed GPUs; nobody's share above what it asked), averaged over the
  windows where two or more tenants asked (:func:`window_fairness`);
- *lost GPU-hours*: work done by preempted jobs since their last checkpoint (and in
  their grace period); ``lost_share`` is their share of the GPU-hours held by jobs;
- *waits by size* (:func:`wait_by_size`): per size of job (1, 2-4, 5-8, over 8 GPUs),
  its jobs' average first wait and re-wait, and the part of the average wait its jobs
  carry, split by the reason the engine gave them while they waited when the replay
  recorded it (``SimConfig.wait_reasons``);
- *waits by class* (:func:`wait_by_class`): the same per priority class (first wait,
  re-wait, preemptions, the longest wait and the jobs that waited more than a day, and
  the part of the average wait its jobs carry, split by size), the classes that carry
  most first: a class below others waits for what they leave; :func:`tail_by_class`
  gives only the longest wait and the jobs past a day of each class;
- *the tail* (``wait_max_s``, ``waited_over_day``, ``wait_beyond_day_s``): the longest
  wait of a started job (re-waits counted), how many started jobs waited more than a
  day in all, and what the waits beyond their first day add to the average wait (the
  sum of each started job's wait less a day, where positive, over every started job):
  an average can hide a few jobs that starve, and this says how many and how much
  (``big_waited_over_day``: those of them over 8 GPUs); ``wait_by_size`` gives the
  longest wait and the count per size (``longest_h``, ``over_day``);
- *topology* (:func:`block_placement`): of the starts of jobs of several nodes, how many
  were inside one block (every node of the job in the same block), with the multi-node
  jobs' average wait;
- *churn*: ``preempted_jobs`` preempted at least once, ``preempted_2_plus`` /
  ``preempted_5_plus`` at least twice / five times, ``max_preemptions`` the most
  preemptions of one job.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence

from .simulation import (
    COMPLETED,
    NEVER_STARTED,
    SIZE_BUCKETS,
    TIMED_OUT,
    UNSCHEDULABLE,
    JobRun,
    ReplayResult,
    size_bucket,
)

DAY = 86400.0
HOUR = 3600.0
BIG_JOB_GPUS = 8  # wait_big_avg_s: jobs over a node's worth of GPUs


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of sorted ``values``, linearly interpolated (0 if empty)."""
    if not values:
        return 0.0
    position = (len(values) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all values are equal, 1/n when one gets everything."""
    values = list(values)
    square_sum = sum(value * value for value in values)
    if not values or square_sum == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * square_sum)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _span(runs: list[JobRun]) -> tuple[float, float]:
    ends = [run.finish for run in runs if run.finish is not None]
    if not ends:
        return 0.0, 0.0
    return min(run.job.submit for run in runs), max(ends)


def summarize(result: ReplayResult) -> dict:
    """The headline figures of one replay (times in seconds)."""
    runs = result.runs
    started = [run for run in runs if run.first_start is not None]
    waits = sorted(run.total_wait or 0.0 for run in started)
    big_waits = [run.total_wait or 0.0 for run in started if run.job.gpus > BIG_JOB_GPUS]
    first_waits = sorted(run.first_wait or 0.0 for run in started)
    rewaits = [run.rewait for run in started]
    preempted = [run for run in runs if run.preemptions]
    ends = [run for run in runs if run.outcome in (COMPLETED, TIMED_OUT)]
    first, last = _span(runs)
    makespan = last - first
    busy = sum(run.gpu_seconds for run in runs)
    lost = sum(run.lost_gpu_seconds for run in runs)
    outcomes = defaultdict(int)
    for run in runs:
        outcomes[run.outcome] += 1
    return {
        "policy": result.policy,
        "trace": result.scenario,
        "jobs": len(runs),
        "completed": outcomes[COMPLETED],
        "timed_out": outcomes[TIMED_OUT],
        "unschedulable": outcomes[UNSCHEDULABLE],
        "never_started": outcomes[NEVER_STARTED],
        "wait_avg_s": _mean(waits),
        "wait_p50_s": percentile(waits, 0.50),
        "wait_p95_s": percentile(waits, 0.95),
        "wait_p99_s": percentile(waits, 0.99),
        "wait_first_avg_s": _mean(first_waits),
        "wait_first_p50_s": percentile(first_waits, 0.50),
        "wait_first_p95_s": percentile(first_waits, 0.95),
        "wait_big_avg_s": _mean(big_waits),
        "wait_max_s": max(waits, default=0.0),
        "waited_over_day": _over_day(waits),
        "wait_beyond_day_s": _mean([max(wait - DAY, 0.0) for wait in waits]),
        "big_waited_over_day": _over_day(big_waits),
        "rewait_avg_s": _mean(rewaits),
        "rewait_preempted_avg_s": _mean([run.rewait for run in preempted]),
        "jct_avg_s": _mean([run.finish - run.job.submit for run in ends]),
        "makespan_s": makespan,
        "utilization": busy / (result.capacity * makespan) if makespan > 0 else 0.0,
        "fairness": jain(_normalized_service(runs, result.guarantees).values()),
        "fairness_daily": daily_fairness(runs, result.guarantees, result.capacity),
        "fairness_hourly": hourly_fairness(runs, result.guarantees, result.capacity),
        "preemptions": sum(run.preemptions for run in runs),
        "preempted_jobs": len(preempted),
        "preempted_2_plus": sum(1 for run in preempted if run.preemptions >= 2),
        "preempted_5_plus": sum(1 for run in preempted if run.preemptions >= 5),
        "max_preemptions": max((run.preemptions for run in runs), default=0),
        "lost_gpu_hours": lost / HOUR,
        "lost_share": lost / busy if busy > 0 else 0.0,
        "gpus": result.capacity,
        "plans": result.plans,
        "plan_seconds": result.plan_seconds,
        "wall_seconds": result.wall_seconds,
    }


def block_placement(
    result: ReplayResult, gpu_node: Callable[[int], str], block_of: dict[str, str]
) -> dict:
    """How the jobs of several nodes were placed over the topology blocks ``block_of``
    (node name -> block; "" or absent: none), whatever the engine was told: ``starts``
    of such jobs, ``one_block`` of them inside one block, their ``share``, and the
    jobs' average wait (``wait_avg_s``, re-waits counted). ``gpu_node`` names the node
    of a GPU id (``SnapshotBuilder.gpu_label``)."""
    starts = inside = 0
    waits = []
    for run in result.runs:
        if run.job.nodes <= 1:
            continue
        if run.first_start is not None:
            waits.append(run.total_wait or 0.0)
        for _, _, gpu_ids in run.attempts:
            starts += 1
            blocks = {block_of.get(gpu_node(gpu_id), "") for gpu_id in gpu_ids}
            if len(blocks) == 1 and "" not in blocks:
                inside += 1
    return {
        "starts": starts,
        "one_block": inside,
        "share": inside / starts if starts else 0.0,
        "wait_avg_s": _mean(waits),
    }


def _normalized_service(runs: list[JobRun], guarantees: dict[str, int]) -> dict[str, float]:
    service: dict[str, float] = defaultdict(float)
    for run in runs:
        service[run.job.tenant] += run.gpu_seconds
    return {
        tenant: service.get(tenant, 0.0) / guaranteed
        for tenant, guaranteed in guarantees.items()
        if guaranteed > 0 and tenant in service
    }


def daily_fairness(runs: list[JobRun], guarantees: dict[str, int], capacity: int = 0) -> float:
    """Jain's index per day of each tenant's GPU-seconds over its fair share that day,
    averaged over the days where two or more tenants asked for GPUs (see
    :func:`window_fairness`)."""
    return window_fairness(runs, guarantees, capacity, DAY)


def hourly_fairness(runs: list[JobRun], guarantees: dict[str, int], capacity: int = 0) -> float:
    """The same per hour."""
    return window_fairness(runs, guarantees, capacity, HOUR)


def window_fairness(
    runs: list[JobRun], guarantees: dict[str, int], capacity: int, window: float
) -> float:
    """Jain's index per time window of x = GPU-seconds a tenant received / its fair share,
    averaged over the windows where two or more tenants asked for GPUs.

    A tenant's *demand* in a window is the GPU-seconds its jobs held or waited for (GPUs
    asked x time waiting); its *fair share* is the weighted max-min division of the
    window's GPU-seconds (``capacity`` GPUs; without it, what the tenants received in all)
    among the tenants with demand, weighted by guaranteed GPUs (a tenant without a
    guarantee weighs 1) and capped by each demand: a tenant that asks less than its share
    gets all it asks and the rest goes to the others. 1 means every tenant got its fair
    share in every window; a tenant served ahead of others lowers it.
    """
    if not runs:
        return 1.0
    origin = min(run.job.submit for run in runs)
    served: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    asked: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for run in runs:
        tenant = run.job.tenant
        gpus = run.job.gpus
        for start, end, gpu_ids in run.attempts:
            _add_by_window(served, tenant, start, end, len(gpu_ids), origin, window)
            _add_by_window(asked, tenant, start, end, len(gpu_ids), origin, window)
        for start, end in run.waits:
            _add_by_window(asked, tenant, start, end, gpus, origin, window)
    indexes = []
    for key, demands in asked.items():
        demands = {tenant: value for tenant, value in demands.items() if value > 0}
        if len(demands) < 2:
            continue
        received = served.get(key, {})
        total = capacity * window if capacity > 0 else sum(received.values())
        fair = _max_min_fair(total, demands, guarantees)
        indexes.append(
            jain([received.get(tenant, 0.0) / fair[tenant] for tenant in demands if fair[tenant]])
        )
    return _mean(indexes) if indexes else 1.0


def _max_min_fair(
    total: float, demands: dict[str, float], guarantees: dict[str, int]
) -> dict[str, float]:
    """Weighted water-filling of ``total`` over ``demands`` (weights: guarantees)."""
    share = dict.fromkeys(demands, 0.0)
    active = set(demands)
    left = total
    while active and left > 1e-9:
        weights = {tenant: max(guarantees.get(tenant, 0), 1) for tenant in active}
        unit = left / sum(weights.values())
        done = {
            tenant for tenant in active if demands[tenant] - share[tenant] <= unit * weights[tenant]
        }
        if not done:
            for tenant in active:
                share[tenant] += unit * weights[tenant]
            break
        for tenant in done:
            left -= demands[tenant] - share[tenant]
            share[tenant] = demands[tenant]
        active -= done
    return share


def _add_by_window(ledger, key: str, start: float, end: float, rate: float, origin, window):
    """Spread ``rate`` x (end - start) over the windows the interval covers."""
    index = int((start - origin) // window)
    while start < end:
        stop = min(end, origin + (index + 1) * window)
        ledger[index][key] += rate * (stop - start)
        start = stop
        index += 1


def per_tenant(result: ReplayResult) -> list[dict]:
    """Per tenant: jobs, guarantee, waits (re-waits included, see :func:`summarize`),
    GPU-hours received and share of them."""
    by_tenant: dict[str, list[JobRun]] = defaultdict(list)
    for run in result.runs:
        by_tenant[run.job.tenant].append(run)
    total = sum(run.gpu_seconds for run in result.runs) or 1.0
    first, last = _span(result.runs)
    makespan = max(last - first, 1.0)
    rows = []
    for tenant in sorted(by_tenant):
        runs = by_tenant[tenant]
        waits = sorted(run.total_wait for run in runs if run.total_wait is not None)
        received = sum(run.gpu_seconds for run in runs)
        guaranteed = result.guarantees.get(tenant, 0)
        rows.append(
            {
                "tenant": tenant,
                "jobs": len(runs),
                "guaranteed_gpus": guaranteed,
                "wait_avg_s": _mean(waits),
                "wait_p95_s": percentile(waits, 0.95),
                "rewait_avg_s": _mean([run.rewait for run in runs if run.first_start is not None]),
                "gpu_hours": received / HOUR,
                "share": received / total,
                # GPUs held on average over the makespan, per guaranteed GPU
                "use_of_guarantee": received / makespan / guaranteed if guaranteed else 0.0,
                "preemptions": sum(run.preemptions for run in runs),
                "timed_out": sum(1 for run in runs if run.outcome == TIMED_OUT),
            }
        )
    return rows


def timeline(result: ReplayResult, buckets: int = 400) -> dict[str, list[float]]:
    """Time-weighted averages of jobs waiting and utilization in equal time buckets."""
    times, waiting, busy = result.series
    if len(times) < 2:
        return {"hours": [], "waiting": [], "utilization": []}
    start, end = times[0], times[-1]
    width = max((end - start) / buckets, 1e-9)
    wait_area = [0.0] * buckets
    busy_area = [0.0] * buckets
    for index in range(len(times) - 1):
        left, right = times[index], times[index + 1]
        while left < right:
            bucket = min(int((left - start) / width), buckets - 1)
            # Rounding may put ``left`` in the bucket before its own: move on, never
            # pour the rest of the interval into one bucket.
            while bucket < buckets - 1 and start + (bucket + 1) * width <= left:
                bucket += 1
            stop = right if bucket == buckets - 1 else min(right, start + (bucket + 1) * width)
            wait_area[bucket] += waiting[index] * (stop - left)
            busy_area[bucket] += busy[index] * (stop - left)
            left = stop
    capacity = max(result.capacity, 1)
    return {
        "hours": [(start + (i + 0.5) * width - start) / HOUR for i in range(buckets)],
        "waiting": [area / width for area in wait_area],
        "utilization": [area / width / capacity for area in busy_area],
    }


# The part of a wait no cycle gave a reason for (see WaitReasons): the job arrived, or was
# requeued, while nothing could start, and no cycle ran until something could; or the
# cycles were not handed the job (FIFO's see only the head of the queue, and
# max_waiting_per_tenant a window of it).
UNPLANNED = "UNPLANNED"


def _over_day(waits: Sequence[float]) -> int:
    """How many of ``waits`` (seconds) are longer than a day."""
    return sum(1 for wait in waits if wait > DAY)


def _first_and_rewait(ran: list[JobRun]) -> dict[str, float]:
    """``first_wait_h`` and ``rewait_h``: averages over the started jobs ``ran``."""
    return {
        "first_wait_h": round(_mean([run.first_wait or 0.0 for run in ran]) / HOUR, 3),
        "rewait_h": round(_mean([run.rewait for run in ran]) / HOUR, 3),
    }


def wait_by_size(result: ReplayResult) -> dict[str, dict]:
    """Per size of job (:data:`SIZE_BUCKETS`, by total GPUs): ``jobs``,
    ``gpu_hours_share`` (of all the jobs' GPU-hours), ``first_wait_h`` and ``rewait_h``
    (averages over the size's started jobs), ``of_average_h`` (what its jobs add to the
    replay's average wait: their waits over every started job of the replay),
    ``longest_h`` (the longest wait of its jobs), ``over_day`` (its jobs that waited more
    than a day in all) and, when
    the replay recorded them, ``reasons_h``: ``of_average_h`` split by reason code
    (:data:`UNPLANNED` for the rest, largest first)."""
    runs = result.runs
    started = [run for run in runs if run.first_start is not None]
    total_gpu_seconds = sum(run.job.gpus * run.job.duration for run in runs) or 1.0
    per_job = HOUR * max(len(started), 1)
    figures: dict[str, dict] = {}
    for _, _, label in SIZE_BUCKETS:
        mine = [run for run in runs if size_bucket(run.job.gpus) == label]
        if not mine:
            continue
        ran = [run for run in mine if run.first_start is not None]
        waits = [run.total_wait or 0.0 for run in ran]
        waited = sum(waits)
        entry: dict = {
            "jobs": len(mine),
            "gpu_hours_share": round(
                sum(run.job.gpus * run.job.duration for run in mine) / total_gpu_seconds, 4
            ),
            **_first_and_rewait(ran),
            "of_average_h": round(waited / per_job, 4),
            "longest_h": round(max(waits, default=0.0) / HOUR, 3),
            "over_day": _over_day(waits),
        }
        if result.wait_reasons:
            reasons = {
                code: seconds
                for (bucket, code), seconds in result.wait_reasons.items()
                if bucket == label and seconds > 0
            }
            reasons[UNPLANNED] = max(waited - sum(reasons.values()), 0.0)
            entry["reasons_h"] = {
                code: round(seconds / per_job, 4)
                for code, seconds in sorted(reasons.items(), key=lambda item: -item[1])
            }
        figures[label] = entry
    return figures


def wait_by_class(result: ReplayResult) -> dict[str, dict]:
    """Per priority class, the classes whose jobs carry most of the average wait first:
    ``jobs``, ``first_wait_h`` and ``rewait_h`` (averages over the class's started
    jobs), ``preemptions`` (of its jobs), ``longest_h`` and ``over_day`` (as in
    :func:`tail_by_class`), ``of_average_h`` (what its jobs add to the
    replay's average wait, as in :func:`wait_by_size`) and ``by_size_h``: that part
    split by size of job (:data:`SIZE_BUCKETS`, sizes without jobs of the class left
    out)."""
    runs = result.runs
    started = [run for run in runs if run.first_start is not None]
    per_job = HOUR * max(len(started), 1)
    classes: dict[str, list[JobRun]] = defaultdict(list)
    for run in runs:
        classes[run.job.priority_class].append(run)
    figures: dict[str, dict] = {}
    for name, mine in classes.items():
        ran = [run for run in mine if run.first_start is not None]
        by_size: dict[str, float] = defaultdict(float)
        for run in ran:
            by_size[size_bucket(run.job.gpus)] += run.total_wait or 0.0
        figures[name] = {
            "jobs": len(mine),
            **_first_and_rewait(ran),
            "preemptions": sum(run.preemptions for run in mine),
            **_tail(ran),
            "of_average_h": round(sum(by_size.values()) / per_job, 4),
            "by_size_h": {
                label: round(by_size[label] / per_job, 4)
                for _, _, label in SIZE_BUCKETS
                if label in by_size
            },
        }
    return dict(sorted(figures.items(), key=lambda item: (-item[1]["of_average_h"], item[0])))


def _tail(ran: list[JobRun]) -> dict[str, float]:
    """``longest_h`` (the longest wait, re-waits counted, of the started jobs ``ran``)
    and ``over_day`` (how many of them waited more than a day in all)."""
    waits = [run.total_wait or 0.0 for run in ran]
    return {"longest_h": round(max(waits, default=0.0) / HOUR, 1), "over_day": _over_day(waits)}


def tail_by_class(result: ReplayResult) -> dict[str, dict]:
    """Per priority class (by name): the longest wait of its started jobs (``longest_h``, re-waits counted) and how many of
    them waited more than a day in all (``over_day``): a bound on every wait is a bound
    in every class, and a class-wide average hides the tail of a small class."""
    classes: dict[str, list[JobRun]] = defaultdict(list)
    for run in result.runs:
        if run.first_start is not None:
            classes[run.job.priority_class].append(run)
    return {name: _tail(ran) for name, ran in sorted(classes.items())}
