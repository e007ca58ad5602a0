"""A table of small clusters and the decisions the engine must take for them."""

from dataclasses import dataclass, field

import pytest
from engine_builders import NOW, gpu_ids, job, node, quota, run_plan, running, snapshot

from scheduling.engine import QueueInfo, reasons


@dataclass
class Scenario:
    name: str
    nodes: list
    quotas: list
    pending: list
    run: list = field(default_factory=list)
    flags: dict = field(default_factory=dict)
    queues: list | None = None
    placed: dict = field(default_factory=dict)  # job id -> borrowed
    codes: dict = field(default_factory=dict)  # job id -> reason code
    victims: dict = field(default_factory=dict)  # victim id -> reason ("priority"/"reclaim")
    nodes_of: dict = field(default_factory=dict)  # job id -> node ids it must get


FULL_NODE = gpu_ids(1, *range(8))
HALF_NODE = gpu_ids(1, 0, 1, 2, 3)
OTHER_HALF = gpu_ids(1, 4, 5, 6, 7)
LONG = 86400  # runtime limit of running jobs that would not end soon


def high_critical(job_id: int, gpus: int = 4, **kwargs):
    """A pending job of tenant nlp that may preempt and must fit the guarantee."""
    return job(job_id, "nlp", gpus=gpus, cls="high", preemptible=False, **kwargs)


def low_running(job_id: int, gpus: tuple[int, ...], age: float = 5000, **kwargs):
    """A running low-class job of tenant nlp, far from its runtime limit."""
    return running(job_id, "nlp", gpus, "low", age=age, runtime=LONG, **kwargs)


# Within-tenant priority preemption (Kueue's withinClusterQueue: LowerPriority): a job
# whose class may preempt stops lower, preemptible jobs of its own tenant when that frees
# the quota it lacks (the guarantee for non-preemptible work, guarantee + borrowing for
# preemptible work) and the GPUs it needs.
OWN_TENANT = [
    Scenario(
        "own tenant: a higher class stops a lower job of its tenant to fit the guarantee",
        [node(1, gpus=4)],
        [quota("nlp", 4, 4)],
        [high_critical(1)],
        run=[low_running(10, HALF_NODE)],
        codes={1: reasons.WAITING_FOR_PREEMPTION},
        victims={10: "priority"},
    ),
    Scenario(
        "own tenant: guarantee + borrowing exhausted by lower jobs of the tenant",
        [node(1)],
        [quota("nlp", 4, 4)],
        [job(1, "nlp", gpus=4, cls="high")],
        run=[low_running(10, HALF_NODE), low_running(11, OTHER_HALF, borrowed=True)],
        codes={1: reasons.WAITING_FOR_PREEMPTION},
        victims={11: "priority"},  # the borrowed one: the smallest disturbance
    ),
    Scenario(
        "own tenant: the tenant's lower job is borrowed",
        [node(1, gpus=4)],
        [quota("nlp", 4, 4)],
        [high_critical(1)],
        run=[low_running(10, HALF_NODE, borrowed=True)],
        codes={1: reasons.WAITING_FOR_PREEMPTION},
        victims={10: "priority"},
    ),
    Scenario(
        "own tenant: a borrower may stop its tenant's guaranteed lower job for GPUs",
        [node(1, gpus=4), node(2, gpus=4)],
        [quota("nlp", 4, 4), quota("b", 4)],
        [job(1, "nlp", gpus=4, cls="high")],
        run=[
            low_running(10, HALF_NODE),
            running(20, "b", gpu_ids(2, 0, 1, 2, 3), "low", runtime=LONG),
        ],
        codes={1: reasons.WAITING_FOR_PREEMPTION},
        victims={10: "priority"},
    ),
    Scenario(
        "own tenant: stopping frees the quota, the GPUs are idle elsewhere",
        [node(1, gpus=4), node(2, gpus=4)],
        [quota("nlp", 4)],
        [high_critical(1)],
        run=[low_running(10, HALF_NODE)],
        codes={1: reasons.WAITING_FOR_PREEMPTION},
        victims={10: "priority"},
    ),
    Scenario(
        "own tenant: quota from the tenant's job, GPUs from idle ones and a reclaim",
        [node(1)],
        [quota("nlp", 8), quota("b", 0, 8)],
        [high_critical(1, gpus=8)],
        run=[
            low_running(10, HALF_NODE),
            running(20, "b", gpu_ids(1, 4, 5), "normal", borrowed=True, runtime=LONG),
        ],
        codes={1: reasons.WAITING_FOR_PREEMPTION},
        victims={10: "priority", 20: "reclaim"},
    ),
    Scenario(
        "own tenant: a job of the tenant serves better than another tenant's borrower",
        [node(1, gpus=4), node(2, gpus=4)],
        [quota("nlp", 4), quota("b", 0, 4)],
        [high_critical(1)],
        run=[
            running(20, "b", HALF_NODE, "low", borrowed=True, runtime=LONG),
            low_running(10, gpu_ids(2, 0, 1, 2, 3)),
        ],
        codes={1: reasons.WAITING_FOR_PREEMPTION},
        victims={10: "priority"},  # it frees quota and GPUs at once
    ),
    Scenario(
        "own tenant: the same class is no victim",
        [node(1, gpus=4)],
        [quota("nlp", 4, 4)],
        [high_critical(1)],
        run=[running(10, "nlp", HALF_NODE, "high", age=5000, runtime=LONG)],
        codes={1: reasons.WAITING_FOR_QUOTA},
    ),
    Scenario(
        "own tenant: non-preemptible work is no victim",
        [node(1, gpus=4)],
        [quota("nlp", 4, 4)],
        [high_critical(1)],
        run=[low_running(10, HALF_NODE, preemptible=False)],
        codes={1: reasons.WAITING_FOR_QUOTA},
    ),
    Scenario(
        "own tenant: a class that may not preempt waits for quota",
        [node(1, gpus=4)],
        [quota("nlp", 4, 4)],
        [high_critical(1, can_preempt=False)],
        run=[low_running(10, HALF_NODE)],
        codes={1: reasons.WAITING_FOR_QUOTA},
    ),
    Scenario(
        "own tenant: never a victim younger than its minimum runtime",
        [node(1, gpus=4)],
        [quota("nlp", 4, 4)],
        [high_critical(1)],
        run=[running(10, "nlp", HALF_NODE, "low", age=60, min_runtime=600, runtime=LONG)],
        codes={1: reasons.WAITING_FOR_QUOTA},
    ),
    Scenario(
        "own tenant: training never stops the tenant's inference",
        [node(1, gpus=4, pool="shared")],
        [quota("nlp", 4, 4, pool="shared")],
        [high_critical(1, pool="shared")],
        run=[low_running(10, HALF_NODE, pool="shared", workload="inference")],
        codes={1: reasons.WAITING_FOR_QUOTA},
    ),
    Scenario(
        "own tenant: no preemption when the quota frees within the grace period anyway",
        [node(1, gpus=4)],
        [quota("nlp", 4, 4)],
        [high_critical(1)],
        run=[running(10, "nlp", HALF_NODE, "low", age=3590, runtime=3600)],
        codes={1: reasons.WAITING_FOR_QUOTA},
    ),
    Scenario(
        "own tenant: no preemption when preemption is disabled",
        [node(1, gpus=4)],
        [quota("nlp", 4, 4)],
        [high_critical(1)],
        run=[low_running(10, HALF_NODE)],
        flags={"preemption": False},
        codes={1: reasons.WAITING_FOR_QUOTA},
    ),
    Scenario(
        "own tenant: never a job of another pool",
        [node(1, gpus=4), node(2, gpus=4, pool="other")],
        [quota("nlp", 4, pool="other"), quota("nlp", 4)],
        [high_critical(1)],
        run=[
            low_running(10, gpu_ids(2, 0, 1, 2, 3), pool="other"),
            running(11, "nlp", HALF_NODE, "high", age=5000, runtime=LONG),
        ],
        codes={1: reasons.WAITING_FOR_QUOTA},
    ),
    Scenario(
        "own tenant: quota held by a stopping job of the tenant is waited for, not taken",
        [node(1, gpus=4)],
        [quota("nlp", 4, 4)],
        [high_critical(1)],
        run=[low_running(10, HALF_NODE, stopping=True)],
        codes={1: reasons.WAITING_FOR_PREEMPTION},
    ),
    Scenario(
        "own tenant: one running-job slot freed under max running jobs",
        [node(1)],
        [quota("nlp", 8, max_jobs=2)],
        [high_critical(1, gpus=2)],
        run=[low_running(10, gpu_ids(1, 0, 1)), low_running(11, gpu_ids(1, 2, 3), age=1000)],
        codes={1: reasons.WAITING_FOR_PREEMPTION},
        victims={11: "priority"},  # the more recently started one
    ),
]

SCENARIOS = [
    Scenario(
        "within quota: admitted as guaranteed",
        [node(1)],
        [quota("a", 8)],
        [job(1, gpus=8)],
        placed={1: False},
    ),
    Scenario(
        "beyond the guarantee on idle GPUs: admitted as borrowed",
        [node(1)],
        [quota("a", 4, 4)],
        [job(1, gpus=4), job(2, gpus=4)],
        placed={1: False, 2: True},
    ),
    Scenario(
        "bigger than guaranteed + borrow limit",
        [node(1)],
        [quota("a", 4, 2)],
        [job(1, gpus=8)],
        codes={1: reasons.EXCEEDS_QUOTA_LIMIT},
    ),
    Scenario(
        "no quota at all in the pool",
        [node(1)],
        [quota("a", 8, pool="inference")],
        [job(1, gpus=1)],
        codes={1: reasons.EXCEEDS_QUOTA_LIMIT},
    ),
    Scenario(
        "used quota: waits for quota although GPUs are idle",
        [node(1)],
        [quota("a", 4, 0)],
        [job(1, gpus=2)],
        run=[running(10, "a", gpu_ids(1, 0, 1, 2, 3))],
        codes={1: reasons.WAITING_FOR_QUOTA},
    ),
    Scenario(
        "non-preemptible work outside the guarantee waits, preemptible work borrows",
        [node(1)],
        [quota("a", 4, 8)],
        [job(1, gpus=4, preemptible=False), job(2, gpus=4)],
        run=[running(10, "a", gpu_ids(1, 0, 1, 2, 3))],
        codes={1: reasons.WAITING_FOR_QUOTA},
        placed={2: True},
    ),
    Scenario(
        "non-preemptible work bigger than the guarantee can never run",
        [node(1)],
        [quota("a", 4, 8)],
        [job(1, gpus=8, preemptible=False)],
        codes={1: reasons.EXCEEDS_QUOTA_LIMIT},
    ),
    Scenario(
        "a model-specific quota wins over the any-model quota",
        [node(1, model="H100"), node(2, model="A100")],
        [quota("a", 0, 0, model="H100"), quota("a", 8)],
        [job(1, gpus=8, models=("H100",)), job(2, gpus=8, models=("A100",))],
        codes={1: reasons.EXCEEDS_QUOTA_LIMIT},
        placed={2: False},
    ),
    Scenario(
        "max running jobs",
        [node(1)],
        [quota("a", 8, max_jobs=1)],
        [job(1, gpus=1), job(2, gpus=1)],
        placed={1: False},
        codes={2: reasons.WAITING_FOR_QUOTA},
    ),
    Scenario(
        "reclaim: a tenant below its guarantee takes back borrowed GPUs",
        [node(1)],
        [quota("a", 8), quota("b", 0, 8)],
        [job(1, "a", gpus=8)],
        run=[running(10, "b", FULL_NODE, borrowed=True, cls="high")],
        codes={1: reasons.WAITING_FOR_PREEMPTION},
        victims={10: "reclaim"},
    ),
    Scenario(
        "no reclaim for a job beyond its tenant's guarantee",
        [node(1)],
        [quota("a", 4, 4), quota("b", 0, 8)],
        [job(1, "a", gpus=8)],
        run=[running(10, "b", FULL_NODE, borrowed=True)],
        codes={1: reasons.WAITING_FOR_QUOTA},
    ),
    Scenario(
        "class preemption skips victims younger than their minimum runtime",
        [node(1)],
        [quota("a", 8), quota("b", 8)],
        [job(1, "a", gpus=4, cls="high")],
        run=[
            running(10, "b", gpu_ids(1, 0, 1, 2, 3), "low", age=60, min_runtime=600),
            running(
                11, "b", gpu_ids(1, 4, 5, 6, 7), "low", age=7200, min_runtime=600, runtime=86400
            ),
        ],
        codes={1: reasons.WAITING_FOR_PREEMPTION},
        victims={11: "priority"},
    ),
    Scenario(
        "class preemption waits when every victim is too young",
        [node(1)],
        [quota("a", 8), quota("b", 8)],
        [job(1, "a", gpus=8, cls="high")],
        run=[
            running(10, "b", gpu_ids(1, 0, 1, 2, 3), "low", age=60, min_runtime=600),
            running(
                11, "b", gpu_ids(1, 4, 5, 6, 7), "low", age=7200, min_runtime=600, runtime=86400
            ),
        ],
        codes={1: reasons.WAITING_FOR_GPUS},
    ),
    Scenario(
        "no preemption of the same or a higher class, nor of non-preemptible work",
        [node(1)],
        [quota("a", 8), quota("b", 8)],
        [job(1, "a", gpus=4, cls="high")],
        run=[
            running(10, "b", gpu_ids(1, 0, 1, 2, 3), "high"),
            running(11, "b", gpu_ids(1, 4, 5, 6, 7), "low", preemptible=False),
        ],
        codes={1: reasons.WAITING_FOR_GPUS},
    ),
    Scenario(
        "training never preempts inference",
        [node(1, pool="shared")],
        [quota("a", 8, pool="shared"), quota("b", 8, pool="shared")],
        [job(1, "a", gpus=8, cls="critical", pool="shared", workload="training")],
        run=[running(10, "b", FULL_NODE, "low", pool="shared", workload="inference")],
        codes={1: reasons.WAITING_FOR_GPUS},
    ),
    Scenario(
        "fine-tuning never preempts inference either",
        [node(1, pool="shared")],
        [quota("a", 8, pool="shared"), quota("b", 8, pool="shared")],
        [job(1, "a", gpus=8, cls="critical", pool="shared", workload="fine_tuning")],
        run=[running(10, "b", FULL_NODE, "low", pool="shared", workload="inference")],
        codes={1: reasons.WAITING_FOR_GPUS},
    ),
    Scenario(
        "evaluation may preempt low-class inference",
        [node(1, pool="shared")],
        [quota("a", 8, pool="shared"), quota("b", 8, pool="shared")],
        [job(1, "a", gpus=8, cls="critical", pool="shared", workload="evaluation")],
        run=[running(10, "b", FULL_NODE, "low", pool="shared", workload="inference")],
        codes={1: reasons.WAITING_FOR_PREEMPTION},
        victims={10: "priority"},
    ),
    Scenario(
        "no preemption when preemption is disabled",
        [node(1)],
        [quota("a", 8), quota("b", 0, 8)],
        [job(1, "a", gpus=8, cls="critical")],
        run=[running(10, "b", FULL_NODE, "low", borrowed=True)],
        flags={"preemption": False},
        codes={1: reasons.WAITING_FOR_GPUS},
    ),
    Scenario(
        "gang on one node: two half-free nodes do not make one 8-GPU job",
        [node(1), node(2)],
        [quota("a", 16), quota("b", 16)],
        [job(1, "a", gpus=8, runtime=600), job(2, "a", gpus=4)],
        run=[
            running(10, "b", gpu_ids(1, 0, 1, 2, 3), runtime=7200),
            running(11, "b", gpu_ids(2, 0, 1, 2, 3), runtime=7200),
        ],
        codes={1: reasons.WAITING_FOR_GPUS},
        placed={2: False},
    ),
    Scenario(
        "best fit: a small job goes to the fullest node that fits",
        [node(1), node(2)],
        [quota("a", 16), quota("b", 16)],
        [job(1, "a", gpus=2)],
        run=[running(10, "b", gpu_ids(2, 0, 1, 2, 3, 4, 5))],
        placed={1: False},
        nodes_of={1: (2,)},
    ),
    Scenario(
        "multi-node: all or nothing",
        [node(1), node(2), node(3)],
        [quota("a", 24), quota("b", 24)],
        [job(1, "a", gpus=8, nodes=3, runtime=600)],
        run=[running(10, "b", gpu_ids(3, 0), runtime=7200)],
        codes={1: reasons.WAITING_FOR_GPUS},
    ),
    Scenario(
        "multi-node: one gang over distinct nodes",
        [node(1), node(2), node(3)],
        [quota("a", 24), quota("b", 24)],
        [job(1, "a", gpus=8, nodes=2)],
        run=[running(10, "b", gpu_ids(3, 0))],
        placed={1: False},
        nodes_of={1: (1, 2)},
    ),
    Scenario(
        "unknown GPU model",
        [node(1)],
        [quota("a", 8)],
        [job(1, gpus=1, models=("B200",))],
        codes={1: reasons.NO_MATCHING_NODES},
    ),
    Scenario(
        "not enough GPU memory anywhere",
        [node(1, memory=40960)],
        [quota("a", 8)],
        [job(1, gpus=1, min_memory=80000)],
        codes={1: reasons.NO_MATCHING_NODES},
    ),
    Scenario(
        "more GPUs than any node has",
        [node(1), node(2)],
        [quota("a", 16)],
        [job(1, gpus=16)],
        codes={1: reasons.NO_MATCHING_NODES},
    ),
    Scenario(
        "pool without nodes",
        [node(1)],
        [quota("a", 8, pool="ghost")],
        [job(1, gpus=1, pool="ghost")],
        codes={1: reasons.NO_MATCHING_NODES},
    ),
    Scenario(
        "a model the job accepts, among others",
        [node(1, model="A100"), node(2, model="H100")],
        [quota("a", 16)],
        [job(1, gpus=8, models=("L40S", "H100"))],
        placed={1: False},
        nodes_of={1: (2,)},
    ),
    Scenario(
        "closed queue and held job",
        [node(1)],
        [quota("a", 8)],
        [job(1, gpus=1, queue=3), job(2, gpus=1, held=True)],
        queues=[QueueInfo(1, "main", "a"), QueueInfo(3, "closed", "a", open=False)],
        codes={1: reasons.QUEUE_CLOSED, 2: reasons.HELD},
    ),
    Scenario(
        "strict FIFO: the head blocks its queue, not the others",
        [node(1)],
        [quota("a", 8)],
        [job(1, gpus=8, queue=2), job(2, gpus=1, queue=2), job(3, gpus=1, queue=1)],
        run=[running(10, "a", gpu_ids(1, 0, 1, 2, 3))],
        codes={1: reasons.WAITING_FOR_QUOTA, 2: reasons.BLOCKED_BY_QUEUE_HEAD},
        placed={3: False},
    ),
    Scenario(
        "strict FIFO: a head that can never run blocks nothing",
        [node(1)],
        [quota("a", 8)],
        [job(1, gpus=1, queue=2, models=("B200",)), job(2, gpus=1, queue=2)],
        codes={1: reasons.NO_MATCHING_NODES},
        placed={2: False},
    ),
    Scenario(
        "backfill: a short job starts before the reservation, a long one may not",
        [node(1)],
        [quota("a", 8), quota("b", 8)],
        [
            job(1, "a", gpus=8),
            job(2, "a", gpus=2, runtime=1800),
            job(3, "a", gpus=2, runtime=7200),
        ],
        run=[running(10, "b", gpu_ids(1, 0, 1, 2, 3), age=0, runtime=3600)],
        flags={"size_order": False},  # the order is submit order here
        codes={1: reasons.WAITING_FOR_GPUS, 3: reasons.RESERVED_FOR_HIGHER_PRIORITY},
        placed={2: False},
    ),
    Scenario(
        "backfill: a long job may use GPUs the reservation does not need",
        [node(1), node(2)],
        [quota("a", 16), quota("b", 16)],
        [job(1, "a", gpus=8), job(2, "a", gpus=2, runtime=7200)],
        run=[
            running(10, "b", gpu_ids(1, 0, 1, 2, 3), age=0, runtime=3600),
            running(11, "b", gpu_ids(2, 0, 1, 2, 3, 4, 5), age=0, runtime=7200),
        ],
        codes={1: reasons.WAITING_FOR_GPUS},
        placed={2: False},
        nodes_of={2: (2,)},
    ),
    Scenario(
        "backfill respects quota promised to a tenant's blocked job",
        [node(1), node(2)],
        [quota("a", 8), quota("b", 8)],
        [job(1, "a", gpus=8), job(2, "a", gpus=2, runtime=7200), job(3, "a", gpus=2, runtime=60)],
        run=[
            running(10, "b", gpu_ids(1, 0), age=0, runtime=600),
            running(11, "b", gpu_ids(2, 0), age=0, runtime=7200),
        ],
        placed={3: False},
        flags={"size_order": False},  # the order is submit order here
        codes={1: reasons.WAITING_FOR_GPUS, 2: reasons.RESERVED_FOR_HIGHER_PRIORITY},
    ),
    Scenario(
        "without backfill nothing passes a blocked job of the pool",
        [node(1)],
        [quota("a", 8), quota("b", 8)],
        [job(1, "a", gpus=8), job(2, "a", gpus=2, runtime=1800)],
        run=[running(10, "b", gpu_ids(1, 0, 1, 2, 3), age=0, runtime=3600)],
        flags={"backfill": False, "size_order": False},
        codes={1: reasons.WAITING_FOR_GPUS, 2: reasons.RESERVED_FOR_HIGHER_PRIORITY},
    ),
    Scenario(
        "higher class first",
        [node(1)],
        [quota("a", 8)],
        [job(1, gpus=8, cls="low"), job(2, gpus=8, cls="high")],
        placed={2: False},
        codes={1: reasons.WAITING_FOR_QUOTA},
    ),
    Scenario(
        "global FIFO ignores classes and blocks behind the first waiting job",
        [node(1)],
        [quota("a", 8)],
        [job(1, gpus=8, cls="low"), job(2, gpus=8, cls="high"), job(3, gpus=1, cls="high")],
        run=[running(10, "a", gpu_ids(1, 0))],
        flags={"global_fifo": True},
        codes={
            1: reasons.WAITING_FOR_QUOTA,
            2: reasons.BLOCKED_BY_QUEUE_HEAD,
            3: reasons.BLOCKED_BY_QUEUE_HEAD,
        },
    ),
]


SCENARIOS += OWN_TENANT


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario(scenario: Scenario) -> None:
    snap = snapshot(
        scenario.nodes,
        scenario.quotas,
        scenario.pending,
        scenario.run,
        queues=scenario.queues,
        **scenario.flags,
    )
    result = run_plan(snap)

    placed = {p.job_id: p.borrowed for p in result.placements}
    assert placed == scenario.placed
    codes = {job_id: info.code for job_id, info in result.pending.items()}
    for job_id, code in scenario.codes.items():
        assert codes[job_id] == code, result.pending[job_id].message
    assert set(codes) == set(scenario.codes), codes
    assert {p.victim_id: p.reason for p in result.preemptions} == scenario.victims
    for job_id, node_ids in scenario.nodes_of.items():
        (placement,) = [p for p in result.placements if p.job_id == job_id]
        assert sorted(placement.node_ids) == list(node_ids)
    for info in result.pending.values():
        if info.code in reasons.NEVER_STARTS:
            assert info.estimated_start is None
        else:
            assert info.estimated_start is not None and info.estimated_start >= NOW


def test_a_job_without_a_runtime_limit_starts_on_idle_gpus():
    """``max_runtime_seconds`` 0 means no limit: the job runs until it ends, on GPUs
    free for good (it once found none: an unlimited job ends at infinity, which the
    slice's "no fit from this end on" check took as already failed)."""
    unlimited = job(1, "a", gpus=4, runtime=0)
    snap = snapshot([node(0, gpus=4)], [quota("a", 4)], [unlimited])
    result = run_plan(snap)
    assert [(p.job_id, p.gpu_ids) for p in result.placements] == [(1, gpu_ids(0, 0, 1, 2, 3))]
    # Behind a job that ends in an hour, it only gets the GPUs free for good.
    nodes = [node(0, gpus=4), node(1, gpus=4)]
    run = [running(10, "a", gpu_ids(0, 0, 1), age=0, runtime=3600)]
    snap = snapshot(nodes, [quota("a", 8)], [job(1, "a", gpus=4, runtime=0)], run)
    result = run_plan(snap)
    assert [(p.job_id, p.node_ids) for p in result.placements] == [(1, (1,))]
