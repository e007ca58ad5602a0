"""From a trace to a scenario: cluster size, tenants, classes, quotas, shapes and limits.

Choices made here, all seeded and printed in the scenario's notes:

- **Cluster** - the trace's own node list when it has one (Alibaba PAI); otherwise, per
  pool (one per ITP cluster file, or ``default``), the smallest number of nodes of
  ``gpus_per_node`` GPUs that keeps the offered load (GPU-seconds asked / (GPUs x span
  of the submissions)) at or below ``target_load``, 85 % by default, and at least enough
  nodes for the largest job. 85 % is what a platform team plans a shared GPU fleet for;
  just under 100 % (``target_load=1``: the smallest cluster that can keep up at all)
  leaves a queue that never drains, whose backlog swamps every policy's figures.
- **One pool** - ``one_pool`` merges the trace's pools into one, ``default`` (the ten
  ITP clusters as one big cluster, its tenants shared): a deep queue in one pool, which
  is what the simulator's deep-backlog benchmark replays.
- **Tenants** - jobs without one are given one of ``tenants`` tenants ``t1..tN`` drawn by
  a seeded RNG with Zipf-like weights 1, 1/2, 1/3, ... (a few big teams, a long tail).
- **Classes** - jobs without one draw ``high`` / ``normal`` / ``low`` with the fractions
  of ``class_mix`` (default 10 / 70 / 20 %; ``--class-mix``, :func:`parse_class_mix`).
  ``high`` may preempt; all three are preemptible so that every job may borrow idle GPUs
  (DESIGN.md §6: non-preemptible work must fit its guarantee). The mix leaves the
  tenants drawn as they are: each job draws both with the same RNG calls.
- **Quotas** - unless given, each tenant is guaranteed in each pool its share of that
  pool's GPU-seconds (largest remainder, summing to the pool's GPUs) and may borrow up
  to the rest of the pool.
- **Shapes** - a job goes on one node when it fits one; a bigger one takes whole nodes
  (64 GPUs on 8-GPU nodes: 8 x 8); a size that does not divide evenly is rounded up to
  an even spread (12 GPUs: 2 x 6).
- **Limits** - users overestimate: the declared limit is ``duration x limit_factor``
  rounded up to a minute, capped at ``limit_cap``; a job longer than its limit is
  killed at the limit and counts as timed out. A trace's own limits win.
- **Topology** - ``nodes_per_block`` N > 0 puts the nodes of a synthetic cluster in
  blocks of N nodes in name order (``<pool>-b1``, ...; a trace's own node list is cut
  the same way), as a leaf switch or a rack would; 0: no topology.
- **Multi-node share** - ``multi_node_share`` S (None: the trace's shapes as they are)
  re-draws the jobs' sizes with a seeded RNG of its own (tenants and classes draw as
  without it): a share S of the jobs takes 2 to ``max_job_nodes`` whole nodes (at most a
  block's nodes where there are blocks), the others fit one node (a bigger job is cut
  to one whole node). The cluster is then sized for the re-drawn jobs.
- **Workload policy** - one for every job: 30 s grace, 5 minutes at least between two
  preemptions, and at most 3 preemptions of a job, after which it runs protected for
  the rest of its run (:class:`~.model.WorkloadSpec`).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from scheduling.engine import QuotaInfo

from .model import ClassSpec, NodeSpec, Scenario, SimJob, Trace, TraceJob, WorkloadSpec

DEFAULT_POOL = "default"
DEFAULT_MODEL = "GPU"
DAY = 86400.0

DEFAULT_CLASSES = {
    "high": ClassSpec("high", 600, preemptible=True, can_preempt=True),
    "normal": ClassSpec("normal", 400),
    "low": ClassSpec("low", 200),
}
# Offered load a pool is sized for when the trace has no cluster (see the module doc).
DEFAULT_TARGET_LOAD = 0.85
DEFAULT_CLASS_MIX = (("high", 0.10), ("normal", 0.70), ("low", 0.20))
# A class named in a trace but unknown here runs at the level of "normal".
UNKNOWN_CLASS_VALUE = 400
DEFAULT_WORKLOADS = {"": WorkloadSpec(preemptible=True, grace_seconds=30)}


def format_class_mix(mix: tuple[tuple[str, float], ...]) -> str:
    """A class mix the way ``--class-mix`` reads it (``high=0.1,normal=0.7,low=0.2``)."""
    return ",".join(f"{name}={weight:g}" for name, weight in mix)


def parse_class_mix(text: str | None) -> tuple[tuple[str, float], ...]:
    """``--class-mix``: the classes drawn for jobs without one and their weights, as
    ``high=0.1,normal=0.7,low=0.2`` (any of :data:`DEFAULT_CLASSES`, each once, weights
    0 or more and not all 0; a class left out is never drawn). Empty: the default mix.
    ValueError says what is wrong."""
    if text is None or not text.strip():
        return DEFAULT_CLASS_MIX
    known = ", ".join(DEFAULT_CLASSES)
    mix: list[tuple[str, float]] = []
    for part in text.split(","):
        name, sep, value = (piece.strip() for piece in part.partition("="))
        if not sep or name not in DEFAULT_CLASSES:
            raise ValueError(
                f"--class-mix {text!r}: expected NAME=WEIGHT,... with NAME one of {known}"
            )
        if any(name == seen for seen, _ in mix):
            raise ValueError(f"--class-mix {text!r}: {name} given twice")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"--class-mix {text!r}: {value!r} is not a number") from None
        if not 0 <= weight < math.inf:
            raise ValueError(f"--class-mix {text!r}: a weight is 0 or more ({name}={value})")
        mix.append((name, weight))
    if sum(weight for _, weight in mix) <= 0:
        raise ValueError(f"--class-mix {text!r}: the weights add up to 0")
    return tuple(mix)


@dataclass(frozen=True, slots=True)
class ScenarioOptions:
    """How to turn a trace into a scenario (see the module docstring).

    ``nodes``: nodes per pool instead of the load-based size (for a trace with its own
    node list: keep that many of its nodes, spread over its models). ``one_pool``: merge
    the trace's pools into one (see the module docstring).
    """

    nodes: int | None = None
    gpus_per_node: int = 8
    gpu_model: str = DEFAULT_MODEL
    tenants: int = 4
    seed: int = 1
    limit_factor: float = 2.0
    limit_cap: float = 7 * DAY
    class_mix: tuple[tuple[str, float], ...] = DEFAULT_CLASS_MIX
    max_jobs: int | None = None
    target_load: float = DEFAULT_TARGET_LOAD
    one_pool: bool = False
    nodes_per_block: int = 0
    multi_node_share: float | None = None
    max_job_nodes: int = 4


def zipf_weights(count: int, exponent: float = 1.0) -> list[float]:
    """Weights 1, 1/2^s, 1/3^s, ... normalised to sum to 1."""
    raw = [1.0 / (rank**exponent) for rank in range(1, count + 1)]
    total = sum(raw)
    return [value / total for value in raw]


def largest_remainder(total: int, shares: dict[str, float]) -> dict[str, int]:
    """Split ``total`` units in proportion to ``shares`` (integers summing to ``total``)."""
    weight = sum(shares.values())
    if weight <= 0 or total <= 0:
        return dict.fromkeys(shares, 0)
    exact = {key: total * value / weight for key, value in shares.items()}
    result = {key: math.floor(value) for key, value in exact.items()}
    left = total - sum(result.values())
    for key in sorted(exact, key=lambda key: (result[key] - exact[key], key))[:left]:
        result[key] += 1
    return result


def declared_limit(duration: float, factor: float, cap: float) -> int:
    """The runtime limit a user would declare for a job of ``duration`` seconds."""
    limit = math.ceil(duration * factor / 60.0) * 60
    if cap > 0:
        limit = min(limit, int(cap))
    return max(int(limit), 1)


def job_shape(num_gpus: int, gpus_per_node: int | None, node_gpus: int) -> tuple[int, int]:
    """(GPUs per node, nodes) of a job on nodes of ``node_gpus`` GPUs."""
    if gpus_per_node and 0 < gpus_per_node < num_gpus:
        return gpus_per_node, math.ceil(num_gpus / gpus_per_node)
    if num_gpus <= node_gpus or node_gpus <= 0:
        return num_gpus, 1
    nodes = math.ceil(num_gpus / node_gpus)
    return math.ceil(num_gpus / nodes), nodes


def offered_load(jobs: Iterable[TraceJob], gpus: int) -> float:
    """GPU-seconds asked / (GPUs x span of the submissions)."""
    jobs = list(jobs)
    if not jobs or gpus <= 0:
        return 0.0
    demand = sum(job.duration * job.num_gpus for job in jobs)
    return demand / (gpus * _span(jobs))


def _span(jobs: list[TraceJob]) -> float:
    first = min(job.submit_time for job in jobs)
    span = max(job.submit_time for job in jobs) - first
    if span <= 0:
        span = max(job.submit_time + job.duration for job in jobs) - first
    return max(span, 1.0)


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def size_pool(
    jobs: list[TraceJob], gpus_per_node: int, target_load: float = 1.0
) -> tuple[int, str]:
    """The smallest number of nodes keeping the offered load at or below
    ``target_load`` (below 100 % when it is 1), and why."""
    if not 0 < target_load <= 1:
        raise ValueError("the target load must be above 0 and at most 1")
    demand = sum(job.duration * job.num_gpus for job in jobs)
    span = _span(jobs)
    average = demand / span
    if target_load >= 1:
        nodes = max(math.floor(average / gpus_per_node) + 1, 1)
        goal = "below 100 %"
    else:
        nodes = max(math.ceil(average / (gpus_per_node * target_load) - 1e-9), 1)
        goal = f"at or below {target_load:.0%}"
    largest = max(job.num_gpus for job in jobs)
    why = (
        f"{len(jobs):,} jobs ask {demand / 3600:,.0f} GPU-hours over "
        f"{span / DAY:.1f} days of submissions = {average:,.1f} GPUs busy on average; "
        f"{_nodes(nodes)} x {gpus_per_node} GPUs keep the offered load {goal} "
        f"({average / (nodes * gpus_per_node):.1%})"
    )
    needed = math.ceil(largest / gpus_per_node)
    if needed > nodes:
        nodes = needed
        why += f"; raised to {_nodes(nodes)} so that the largest job ({largest} GPUs) fits"
    return nodes, why


def _trim(trace: Trace, max_jobs: int | None) -> list[TraceJob]:
    jobs = sorted(trace.jobs, key=lambda job: (job.submit_time, job.job_id))
    return jobs[:max_jobs] if max_jobs else jobs


def _pool_of(job: TraceJob) -> str:
    return job.pool or DEFAULT_POOL


def _sample_nodes(nodes: list[NodeSpec], keep: int) -> list[NodeSpec]:
    """``keep`` nodes spread evenly over the list (the list's mix of models is kept)."""
    if keep >= len(nodes):
        return list(nodes)
    step = len(nodes) / keep
    return [nodes[int(i * step)] for i in range(keep)]


def build_cluster(
    trace: Trace, jobs: list[TraceJob], options: ScenarioOptions
) -> tuple[list[NodeSpec], list[str]]:
    """The nodes of the replay and a note per pool saying how they were chosen."""
    if trace.nodes:
        nodes = trace.nodes
        if options.nodes:
            nodes = _sample_nodes(nodes, options.nodes)
        gpus = sum(node.gpus for node in nodes)
        note = (
            f"cluster: the trace's node list, {len(nodes):,} nodes, {gpus:,} GPUs; "
            f"offered load {offered_load(jobs, gpus):.1%}"
        )
        notes = [note]
        return with_blocks(list(nodes), options.nodes_per_block, notes), notes
    by_pool: dict[str, list[TraceJob]] = defaultdict(list)
    for job in jobs:
        by_pool[_pool_of(job)].append(job)
    nodes: list[NodeSpec] = []
    notes = []
    per_node = options.gpus_per_node
    for pool in sorted(by_pool):
        if options.nodes:
            count = options.nodes
            load = offered_load(by_pool[pool], count * per_node)
            why = f"{_nodes(count)} x {per_node} GPUs as asked (offered load {load:.1%})"
        else:
            count, why = size_pool(by_pool[pool], per_node, options.target_load)
        notes.append(f"pool {pool}: {why}")
        width = len(str(count))
        for number in range(1, count + 1):
            name = f"{pool}-n{number:0{width}d}"
            nodes.append(NodeSpec(name, pool, per_node, options.gpu_model))
    return with_blocks(nodes, options.nodes_per_block, notes), notes


def with_blocks(nodes: list[NodeSpec], per_block: int, notes: list[str]) -> list[NodeSpec]:
    """``nodes`` in topology blocks of ``per_block`` nodes, per pool in list order (the
    last block of a pool may be smaller); unchanged for 0."""
    if per_block <= 0:
        return nodes
    seen: dict[str, int] = defaultdict(int)
    result = []
    for node in nodes:
        number = seen[node.pool] // per_block + 1
        seen[node.pool] += 1
        result.append(replace(node, block=f"{node.pool}-b{number}"))
    blocks = sum(math.ceil(count / per_block) for count in seen.values())
    notes.append(f"topology: blocks of {per_block} nodes, {blocks} in all")
    return result


def reshape_jobs(
    jobs: list[TraceJob], options: ScenarioOptions
) -> tuple[list[TraceJob], list[str]]:
    """The jobs re-drawn with ``options.multi_node_share`` of them on several whole
    nodes (see the module docstring); unchanged when it is None."""
    share = options.multi_node_share
    if share is None:
        return jobs, []
    if not 0 <= share <= 1:
        raise ValueError("the multi-node share must be between 0 and 1")
    per_node = options.gpus_per_node
    most = max(options.max_job_nodes, 2)
    if options.nodes_per_block > 0:
        most = max(min(most, options.nodes_per_block), 2)
    rng = random.Random(f"shapes-{options.seed}")
    reshaped = []
    for job in jobs:
        if rng.random() < share:
            nodes = rng.randint(2, most)
            reshaped.append(replace(job, num_gpus=nodes * per_node, gpus_per_node=per_node))
        else:
            reshaped.append(replace(job, num_gpus=min(job.num_gpus, per_node), gpus_per_node=None))
    note = (
        f"shapes: re-drawn with seed {options.seed}: {share:.0%} of the jobs on 2 to {most} "
        f"whole nodes, the others on one node"
    )
    return reshaped, [note]


def assign_tenants_and_classes(
    jobs: list[TraceJob], options: ScenarioOptions, per_pool: bool = False
) -> tuple[list[TraceJob], list[str]]:
    """Fill in missing tenants and classes with a seeded RNG (see the module docstring).

    ``per_pool``: the pools are separate clusters, each with its own tenants, named
    ``<pool>-t1`` and so on.
    """
    rng = random.Random(options.seed)
    tenants = [f"t{number}" for number in range(1, max(options.tenants, 1) + 1)]
    weights = zipf_weights(len(tenants))
    class_names = [name for name, _ in options.class_mix]
    class_weights = [weight for _, weight in options.class_mix]
    filled = []
    drew_tenants = drew_classes = False
    for job in jobs:
        tenant, cls = job.tenant, job.priority_class
        # Both draws happen for every job, so a trace with tenants but no classes draws
        # the same classes as one without either.
        tenant_draw = rng.choices(tenants, weights)[0]
        class_draw = rng.choices(class_names, class_weights)[0]
        if not tenant:
            tenant, drew_tenants = tenant_draw, True
            if per_pool and job.pool:
                tenant = f"{job.pool}-{tenant}"
        if not cls:
            cls, drew_classes = class_draw, True
        filled.append(replace(job, tenant=tenant, priority_class=cls))
    notes = []
    if drew_tenants:
        shares = ", ".join(f"{t} {w:.0%}" for t, w in zip(tenants, weights, strict=True))
        where = " in each pool (its own tenants)" if per_pool else ""
        notes.append(f"tenants: none in the trace; drawn with seed {options.seed}{where}: {shares}")
    if drew_classes:
        mix = ", ".join(f"{name} {weight:.0%}" for name, weight in options.class_mix)
        notes.append(f"classes: none in the trace; drawn: {mix}")
    return filled, notes


def demand_quotas(jobs: list[SimJob], nodes: list[NodeSpec]) -> list[QuotaInfo]:
    """Per pool, each tenant is guaranteed its share of the pool's GPU-seconds and may
    borrow the rest of the pool."""
    capacity: dict[str, int] = defaultdict(int)
    for node in nodes:
        capacity[node.pool] += node.gpus
    demand: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for job in jobs:
        demand[job.pool][job.tenant] += job.duration * job.gpus
    quotas = []
    for pool in sorted(demand):
        shares = largest_remainder(capacity[pool], dict(sorted(demand[pool].items())))
        for tenant, guaranteed in shares.items():
            borrow = capacity[pool] - guaranteed
            quotas.append(QuotaInfo(tenant, pool, "", guaranteed, borrow))
    return quotas


def sim_jobs(
    jobs: list[TraceJob],
    nodes: list[NodeSpec],
    *,
    limit_factor: float,
    limit_cap: float,
    first_id: int = 1,
    default_pool: str = DEFAULT_POOL,
) -> list[SimJob]:
    """Concrete jobs: shape on the pool's nodes, declared limit, pool."""
    node_gpus: dict[str, int] = defaultdict(int)
    for node in nodes:
        node_gpus[node.pool] = max(node_gpus[node.pool], node.gpus)
    result = []
    for number, job in enumerate(jobs, first_id):
        pool = job.pool or default_pool
        per_node, count = job_shape(job.num_gpus, job.gpus_per_node, node_gpus.get(pool, 0))
        if job.runtime_limit is not None and job.runtime_limit > 0:
            limit = int(math.ceil(job.runtime_limit))
        else:
            limit = declared_limit(job.duration, limit_factor, limit_cap)
        result.append(
            SimJob(
                id=number,
                name=job.job_id,
                tenant=job.tenant,
                pool=pool,
                priority_class=job.priority_class,
                workload_type=job.workload_type,
                gpus_per_node=per_node,
                nodes=count,
                submit=job.submit_time,
                duration=job.duration,
                limit=limit,
                gpu_models=job.gpu_models,
            )
        )
    return result


def known_classes(
    jobs: Iterable[SimJob], classes: dict[str, ClassSpec]
) -> tuple[dict[str, ClassSpec], list[str]]:
    """``classes`` plus a normal-level class for each name the jobs use but it lacks."""
    result = dict(classes)
    missing = sorted({job.priority_class for job in jobs} - set(result))
    for name in missing:
        result[name] = ClassSpec(name, UNKNOWN_CLASS_VALUE)
    notes = [f"classes {', '.join(missing)}: unknown, run at level {UNKNOWN_CLASS_VALUE}"]
    return result, notes if missing else []


def merge_pools(trace: Trace) -> Trace:
    """``trace`` with every job and node in one pool, ``default``: its pools are no longer
    independent (one cluster, tenants shared by all its jobs)."""
    pools = sorted({_pool_of(job) for job in trace.jobs} | {node.pool for node in trace.nodes})
    jobs = [
        job if job.pool == DEFAULT_POOL else replace(job, pool=DEFAULT_POOL) for job in trace.jobs
    ]
    nodes = [
        node if node.pool == DEFAULT_POOL else replace(node, pool=DEFAULT_POOL)
        for node in trace.nodes
    ]
    notes = list(trace.notes)
    if len(pools) > 1:
        notes.append(f"pools: the trace's {len(pools)} pools merged into one, {DEFAULT_POOL}")
    name = f"{trace.name}/one-pool" if len(pools) > 1 else trace.name
    return Trace(name, jobs, nodes=nodes, notes=notes, independent_pools=False)


def build_scenario(trace: Trace, options: ScenarioOptions | None = None) -> Scenario:
    """A scenario for ``trace`` with every choice of the module docstring."""
    options = options or ScenarioOptions()
    if options.one_pool:
        trace = merge_pools(trace)
    picked = _trim(trace, options.max_jobs)
    notes = list(trace.notes)
    if options.max_jobs and len(picked) < len(trace.jobs):
        notes.append(f"jobs: the first {len(picked):,} of {len(trace.jobs):,} by submit time")
    picked, shape_notes = reshape_jobs(picked, options)
    notes.extend(shape_notes)
    nodes, cluster_notes = build_cluster(trace, picked, options)
    notes.extend(cluster_notes)
    filled, assign_notes = assign_tenants_and_classes(picked, options, trace.independent_pools)
    notes.extend(assign_notes)
    jobs = sim_jobs(filled, nodes, limit_factor=options.limit_factor, limit_cap=options.limit_cap)
    classes, class_notes = known_classes(jobs, DEFAULT_CLASSES)
    notes.extend(class_notes)
    cap = f"{options.limit_cap / 3600:g} h" if options.limit_cap > 0 else "none"
    notes.append(f"limits: duration x {options.limit_factor:g}, capped at {cap}")
    return Scenario(
        name=trace.name,
        nodes=nodes,
        quotas=demand_quotas(jobs, nodes),
        classes=classes,
        workloads=dict(DEFAULT_WORKLOADS),
        jobs=jobs,
        notes=notes,
        independent_pools=trace.independent_pools,
    )
