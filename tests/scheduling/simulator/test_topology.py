"""Topology in the simulator: blocks of nodes and a share of multi-node jobs on synthetic
clusters, a gang waiting for one block then spread once its topology wait is over, and
the share of multi-node starts inside one block."""

from dataclasses import replace

import pytest

from scheduling.simulator import SimConfig, replay
from scheduling.simulator.metrics import block_placement
from scheduling.simulator.model import Trace, TraceJob
from scheduling.simulator.scenario import ScenarioOptions, build_scenario
from scheduling.simulator.snapshot import SnapshotBuilder

from .conftest import ANY_GAIN, scenario, sim_job

EXACT = SimConfig(dispatch_interval=0)


def _trace(count: int = 200) -> Trace:
    jobs = [TraceJob(f"j{i}", i * 60.0, 3600.0, 1 + i % 8) for i in range(count)]
    return Trace("synthetic", jobs)


def test_a_synthetic_cluster_gets_blocks_of_the_asked_size():
    built = build_scenario(_trace(), ScenarioOptions(nodes=10, nodes_per_block=4))
    assert [node.block for node in built.nodes] == ["default-b1"] * 4 + ["default-b2"] * 4 + [
        "default-b3"
    ] * 2
    assert any("topology: blocks of 4 nodes, 3 in all" in note for note in built.notes)
    plain = build_scenario(_trace(), ScenarioOptions(nodes=10))
    assert {node.block for node in plain.nodes} == {""}


def test_the_multi_node_share_redraws_the_shapes_with_a_seed_of_its_own():
    options = ScenarioOptions(nodes_per_block=4, multi_node_share=0.3, seed=2)
    built = build_scenario(_trace(1000), options)
    multi = [job for job in built.jobs if job.nodes > 1]
    assert 0.25 < len(multi) / len(built.jobs) < 0.35
    assert {job.nodes for job in multi} <= {2, 3, 4}
    assert all(job.gpus_per_node == 8 for job in multi)
    assert all(job.nodes == 1 and job.gpus <= 8 for job in built.jobs if job.nodes == 1)
    # Tenants and classes are drawn as without the option.
    same = build_scenario(_trace(1000), replace(options, multi_node_share=None))
    assert [(j.tenant, j.priority_class) for j in built.jobs] == [
        (j.tenant, j.priority_class) for j in same.jobs
    ]
    with pytest.raises(ValueError):
        build_scenario(_trace(), replace(options, multi_node_share=1.5))


def _blocks(sc, per_block: int):
    sc.nodes = [
        replace(node, block=f"b{number // per_block + 1}") for number, node in enumerate(sc.nodes)
    ]
    return sc


def test_a_gang_waits_for_one_block_then_is_spread_when_its_wait_is_over():
    # Four 4-GPU nodes in blocks {n1, n2} and {n3, n4}. Job 1 takes n1, job 2 (short) is
    # packed next to it on n2, job 3 takes n3. Job 2 ends at 101: n2 and n4 are idle, in
    # two blocks. The gang (two whole nodes, at 110) waits its topology wait (1,800 s)
    # for one block, then is spread over n2 and n4.
    jobs = [
        sim_job(1, 0, 10_000, 4),
        sim_job(2, 1, 100, 4),
        sim_job(3, 2, 10_000, 4),
        sim_job(4, 110, 5_000, 4, nodes=2),
    ]
    sc = _blocks(scenario(jobs, nodes=4), 2)
    result = replay(sc, ANY_GAIN["sluice"], EXACT)
    runs = {run.job.id: run for run in result.runs}
    builder = SnapshotBuilder(sc)

    def nodes_of(job_id):
        return {builder.gpu_label(g)[0] for g in runs[job_id].attempts[0][2]}

    assert (nodes_of(1), nodes_of(2), nodes_of(3)) == ({"n1"}, {"n2"}, {"n3"})
    assert runs[4].first_start == 110 + 1800
    assert nodes_of(4) == {"n2", "n4"}


def test_the_topology_wait_does_not_count_while_the_gang_waits_for_other_gpus():
    # As above, the gang waits for one block from 110. At 120 and 121 two jobs of
    # 3,000 s take n2 (in a hole of the gang's reservation in b1) and n4: from 120 the
    # gang waits for GPUs, which it would do without blocks too. They end at 3,120 and
    # 3,121: n2 and n4 are idle again, in two blocks, and the gang waits for one block
    # for what is left of its topology wait (1,800 - 10 s), not a moment: spread at 4,911.
    jobs = [
        sim_job(1, 0, 10_000, 4),
        sim_job(2, 1, 100, 4),
        sim_job(3, 2, 10_000, 4),
        sim_job(4, 110, 5_000, 4, nodes=2),
        sim_job(5, 120, 3_000, 4),
        sim_job(6, 121, 3_000, 4),
    ]
    sc = _blocks(scenario(jobs, nodes=4), 2)
    result = replay(sc, ANY_GAIN["sluice"], EXACT)
    runs = {run.job.id: run for run in result.runs}
    builder = SnapshotBuilder(sc)

    def nodes_of(job_id):
        return {builder.gpu_label(g)[0] for g in runs[job_id].attempts[0][2]}

    assert (nodes_of(5), nodes_of(6)) == ({"n2"}, {"n4"})
    assert runs[4].first_start == 121 + 3_000 + 1_800 - 10
    assert nodes_of(4) == {"n2", "n4"}


def test_with_a_topology_wait_of_zero_the_gang_is_spread_at_once():
    jobs = [
        sim_job(1, 0, 10_000, 4),
        sim_job(2, 1, 100, 4),
        sim_job(3, 2, 10_000, 4),
        sim_job(4, 110, 5_000, 4, nodes=2),
    ]
    sc = _blocks(scenario(jobs, nodes=4), 2)
    sc.workloads = {"": replace(sc.workloads[""], topology_wait_seconds=0)}
    result = replay(sc, ANY_GAIN["sluice"], EXACT)
    assert {run.job.id: run.first_start for run in result.runs}[4] == 110


def test_single_node_jobs_are_packed_so_the_gang_finds_a_whole_block():
    jobs = [
        sim_job(1, 0, 10_000, 4),
        sim_job(2, 1, 10_000, 4),
        sim_job(3, 10, 5_000, 4, nodes=2),
    ]
    sc = _blocks(scenario(jobs, nodes=4), 2)
    result = replay(sc, ANY_GAIN["sluice"], EXACT)
    builder = SnapshotBuilder(sc)
    block_of = {node.name: node.block for node in sc.nodes}
    placed = block_placement(result, lambda g: builder.gpu_label(g)[0], block_of)
    assert placed == {"starts": 1, "one_block": 1, "share": 1.0, "wait_avg_s": 0.0}


def test_blind_to_the_blocks_the_same_jobs_are_counted_against_them():
    jobs = [sim_job(1, 0, 100, 4, nodes=2), sim_job(2, 0, 100, 4, nodes=2)]
    sc = scenario(jobs, nodes=4)
    result = replay(sc, ANY_GAIN["sluice"], EXACT)
    builder = SnapshotBuilder(sc)
    odd_even = {"n1": "b1", "n2": "b2", "n3": "b1", "n4": "b2"}
    placed = block_placement(result, lambda g: builder.gpu_label(g)[0], odd_even)
    assert placed["starts"] == 2 and placed["one_block"] == 0
