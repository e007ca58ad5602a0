"""Benchmark of ``scheduling.engine.plan`` on generated clusters (DESIGN.md §11).

Run ``.venv/bin/python bench/engine.py`` (``--quick`` for a short run). Prints one JSON
line per case (median and p95 milliseconds over several repetitions) and one line with the
growth ratio time(10,000 pending) / time(1,000 pending) at 1,000 nodes. Target: the
1,000 nodes x 10,000 pending x 5,000 running case in <= 250 ms median on 2 cores, and
10x more pending for <= 12x the time. Stdlib only; every case is generated from a seed.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduling.engine import (  # noqa: E402
    GpuInfo,
    NodeInfo,
    PendingJob,
    QueueInfo,
    QuotaInfo,
    RunningJob,
    Snapshot,
    plan,
)

NOW = 1_700_000_000.0
TENANTS = 50
HOUR = 3600

# pool -> (share of the nodes, GPU models with memory)
POOLS = {
    "training": (0.6, [("H100-80GB", 81920), ("A100-80GB", 81920)]),
    "inference": (0.2, [("L40S-48GB", 49152), ("A100-40GB", 40960)]),
    "general": (0.2, [("A100-40GB", 40960), ("L40S-48GB", 49152)]),
}
WORKLOADS = {
    "training": ["training", "fine_tuning", "evaluation"],
    "inference": ["inference", "batch_inference"],
    "general": ["interactive", "evaluation", "batch_inference", "fine_tuning"],
}
# (name, value, preemptible, can_preempt, weight among jobs)
CLASSES = [
    ("low", 10, True, False, 0.30),
    ("normal", 100, True, False, 0.55),
    ("high", 1000, True, True, 0.12),
    ("critical", 10000, False, True, 0.03),
]
# GPUs per node, nodes, weight
PENDING_SIZES = [(1, 1, 0.35), (2, 1, 0.25), (4, 1, 0.15), (8, 1, 0.17), (8, 2, 0.06), (8, 4, 0.02)]
RUNNING_SIZES = [(1, 0.72), (2, 0.2), (4, 0.05), (8, 0.03)]


def _pick(rng: random.Random, items: list, weight_index: int = -1):
    return rng.choices(items, weights=[item[weight_index] for item in items])[0]


def make_cluster(rng: random.Random, node_count: int) -> list[NodeInfo]:
    """Nodes of 8 GPUs spread over the pools, one model per node."""
    nodes = []
    gpu_id = 0
    bounds = []
    cumulative = 0.0
    for pool, (share, _) in POOLS.items():
        cumulative += share
        bounds.append((cumulative * node_count, pool))
    for node_id in range(node_count):
        pool = next((name for bound, name in bounds if node_id < bound), bounds[-1][1])
        models = POOLS[pool][1]
        model, memory = models[node_id % len(models)]
        gpus = []
        for index in range(8):
            gpus.append(GpuInfo(gpu_id, node_id, index, model, memory))
            gpu_id += 1
        nodes.append(NodeInfo(node_id, f"gpu-{node_id:05d}", pool, gpus))
    return nodes


def make_quotas(rng: random.Random, nodes: list[NodeInfo]) -> list[QuotaInfo]:
    """Each tenant gets a guarantee in two or three pools; guarantees add up to about the
    capacity, borrowing up to half of it more. Some quotas are per model."""
    capacity: dict[tuple[str, str], int] = {}
    for node in nodes:
        key = (node.pool, node.gpus[0].model)
        capacity[key] = capacity.get(key, 0) + len(node.gpus)
    quotas = []
    for tenant_index in range(TENANTS):
        tenant = f"t{tenant_index:02d}"
        for pool, (_, models) in POOLS.items():
            if rng.random() < 0.3:
                continue
            pool_capacity = sum(capacity.get((pool, model), 0) for model, _ in models)
            share = max(1, int(pool_capacity / TENANTS * rng.uniform(0.5, 1.4)))
            max_jobs = rng.choice([None, None, None, 40, 200])
            if rng.random() < 0.3:
                model = models[0][0]
                quotas.append(QuotaInfo(tenant, pool, model, share // 2, share, max_jobs))
                quotas.append(QuotaInfo(tenant, pool, "", share // 2, share // 2, max_jobs))
            else:
                quotas.append(QuotaInfo(tenant, pool, "", share, share, max_jobs))
    return quotas


def make_queues(rng: random.Random) -> list[QueueInfo]:
    queues = []
    for tenant_index in range(TENANTS):
        for number in range(3):
            queue_id = tenant_index * 10 + number
            strict = rng.random() < 0.1
            is_open = rng.random() > 0.03
            queues.append(
                QueueInfo(queue_id, f"q{queue_id}", f"t{tenant_index:02d}", strict, is_open)
            )
    return queues


def _guarantees(quotas: list[QuotaInfo]) -> dict[str, dict[str, int]]:
    """pool -> tenant -> guaranteed GPUs (all models)."""
    result: dict[str, dict[str, int]] = {pool: {} for pool in POOLS}
    for quota in quotas:
        pool = result[quota.pool]
        pool[quota.tenant] = pool.get(quota.tenant, 0) + quota.guaranteed
    return result


def make_running(
    rng: random.Random, nodes: list[NodeInfo], quotas: list[QuotaInfo], count: int
) -> list[RunningJob]:
    """Fill the nodes with up to ``count`` running jobs (about 95 % of the GPUs), owned by
    tenants with quota in the pool; jobs beyond a tenant's guarantee are borrowed."""
    guarantees = _guarantees(quotas)
    running = []
    free = {node.id: [gpu.id for gpu in node.gpus] for node in nodes}
    order = list(nodes)
    rng.shuffle(order)
    node_iter = 0
    job_id = 10_000_000
    usage: dict[tuple[str, str], int] = {}
    while len(running) < count and node_iter < len(order) * 16:
        node = order[node_iter % len(order)]
        node_iter += 1
        size = _pick(rng, RUNNING_SIZES)[0]
        owners = guarantees[node.pool]
        if len(free[node.id]) < size or not owners:
            continue
        tenant = rng.choices(list(owners), weights=list(owners.values()))[0]
        key = (tenant, node.pool)
        borrowed = usage.get(key, 0) + size > owners[tenant]
        name, value, preemptible, _, _ = _pick(rng, CLASSES)
        if borrowed and not preemptible:
            name, value, preemptible = "normal", 100, True
        gpu_ids = tuple(free[node.id][:size])
        del free[node.id][:size]
        usage[key] = usage.get(key, 0) + size
        limit = rng.choice([1, 4, 12, 24, 48]) * HOUR
        running.append(
            RunningJob(
                id=job_id,
                tenant=tenant,
                pool=node.pool,
                workload_type=rng.choice(WORKLOADS[node.pool]),
                priority=value,
                priority_class=name,
                preemptible=preemptible,
                gpu_ids=gpu_ids,
                gpu_model=node.gpus[0].model,
                borrowed=borrowed,
                started_at=NOW - rng.uniform(0, limit),
                max_runtime_seconds=limit,
                min_runtime_before_preemption=rng.choice([0, 0, 600, 3600]),
                stopping=rng.random() < 0.01,
            )
        )
        job_id += 1
    return running


def make_pending(rng: random.Random, quotas: list[QuotaInfo], count: int) -> list[PendingJob]:
    """Jobs of every size and class, mostly in pools where their tenant has quota."""
    guarantees = _guarantees(quotas)
    pools_of: dict[str, list[str]] = {}
    for pool, owners in guarantees.items():
        for tenant in owners:
            pools_of.setdefault(tenant, []).append(pool)
    pool_models = {pool: [model for model, _ in models] for pool, (_, models) in POOLS.items()}
    pending = []
    for job_id in range(1, count + 1):
        tenant_index = rng.randrange(TENANTS)
        tenant = f"t{tenant_index:02d}"
        if tenant in pools_of and rng.random() < 0.97:
            pool = rng.choice(pools_of[tenant])
        else:
            pool = rng.choices(list(POOLS), weights=[0.6, 0.2, 0.2])[0]
        gpus_per_node, node_count, _ = _pick(rng, PENDING_SIZES)
        name, value, preemptible, can_preempt, _ = _pick(rng, CLASSES)
        roll = rng.random()
        if roll < 0.5:
            models = ()
        elif roll < 0.98:
            models = (rng.choice(pool_models[pool]),)
        else:
            models = ("B200-192GB",)  # nobody has it
        pending.append(
            PendingJob(
                id=job_id,
                tenant=tenant,
                project="p",
                queue_id=tenant_index * 10 + rng.randrange(3),
                pool=pool,
                workload_type=rng.choice(WORKLOADS[pool]),
                priority=value,
                priority_class=name,
                preemptible=preemptible,
                can_preempt=can_preempt,
                gpus_per_node=gpus_per_node,
                nodes=node_count,
                gpu_models=models,
                min_gpu_memory_mb=rng.choice([0, 0, 0, 45000]),
                submitted_at=NOW - rng.uniform(0, 7 * 24 * HOUR),
                max_runtime_seconds=rng.choice([1, 2, 4, 8, 24, 72]) * HOUR,
                held=rng.random() < 0.01,
            )
        )
    return pending


def make_snapshot(node_count: int, pending_count: int, running_count: int, seed: int) -> Snapshot:
    """A reproducible snapshot of a busy cluster."""
    rng = random.Random(seed)
    nodes = make_cluster(rng, node_count)
    quotas = make_quotas(rng, nodes)
    usage = {f"t{index:02d}": rng.uniform(0, 1e8) for index in range(TENANTS)}
    return Snapshot(
        now=NOW,
        nodes=nodes,
        quotas=quotas,
        queues=make_queues(rng),
        running=make_running(rng, nodes, quotas, running_count),
        pending=make_pending(rng, quotas, pending_count),
        usage=usage,
    )


def measure(snapshot: Snapshot, repetitions: int) -> tuple[list[float], object]:
    """Milliseconds of each repetition (garbage collection as in production: enabled)."""
    times = []
    result = None
    for _ in range(repetitions):
        gc.collect()
        started = time.perf_counter()
        result = plan(snapshot)
        times.append((time.perf_counter() - started) * 1000)
    return times, result


def run_case(node_count: int, pending_count: int, repetitions: int, seed: int = 7) -> dict:
    running_count = node_count * 5
    snapshot = make_snapshot(node_count, pending_count, running_count, seed)
    plan(snapshot)  # warm-up
    times, result = measure(snapshot, repetitions)
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    codes: dict[str, int] = {}
    for info in result.pending.values():
        codes[info.code] = codes.get(info.code, 0) + 1
    return {
        "case": f"{node_count}x8/{pending_count}",
        "nodes": node_count,
        "gpus": node_count * 8,
        "pending": pending_count,
        "running": len(snapshot.running),
        "tenants": TENANTS,
        "repetitions": repetitions,
        "median_ms": round(statistics.median(times), 1),
        "p95_ms": round(p95, 1),
        "placements": len(result.placements),
        "preemptions": len(result.preemptions),
        "codes": codes,
    }


def profile_main_case() -> None:
    """Print the functions that cost most in the target case."""
    import cProfile
    import pstats

    snapshot = make_snapshot(1000, 10_000, 5000, seed=7)
    plan(snapshot)
    profiler = cProfile.Profile()
    profiler.runcall(plan, snapshot)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions, skip the largest case"
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the 1,000 x 10,000 case and stop"
    )
    args = parser.parse_args(argv)
    if args.profile:
        profile_main_case()
        return
    repetitions = 3 if args.quick else 7
    medians = {}
    for node_count in (100, 1000, 2000):
        for pending_count in (1000, 10_000, 50_000):
            if args.quick and node_count == 2000 and pending_count == 50_000:
                continue
            reps = repetitions if pending_count <= 10_000 else max(3, repetitions // 2)
            line = run_case(node_count, pending_count, reps)
            medians[(node_count, pending_count)] = line["median_ms"]
            print(json.dumps(line), flush=True)
    ratio = medians[(1000, 10_000)] / medians[(1000, 1000)]
    print(
        json.dumps(
            {
                "growth": "time(10000 pending) / time(1000 pending) at 1000 nodes",
                "ratio": round(ratio, 2),
                "target": "<= 12",
                "target_250ms_case_median_ms": medians[(1000, 10_000)],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
