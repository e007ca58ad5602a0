"""The reference schedulers (scheduling.simulator.reference) on schedules worked out by hand.

Every case acts at the exact time of each event (tick 0); each job's limit is its duration.
"""

from dataclasses import replace

import pytest

from scheduling.simulator import NodeSpec
from scheduling.simulator.reference import REFERENCES, parse_references, run_reference

from .conftest import scenario, sim_job

# One node of 4 GPUs. A holds all 4 until 100. B (4 GPUs x 100 s, GPU-time 400) at 1,
# C (1 x 50 s, 50) at 2, D (2 x 300 s, 600) at 3. At 100 the order is C, B, D: C starts,
# B does not fit the 3 GPUs left, D does (nothing is reserved for B) and starts too; B
# waits until D ends at 400. Waits: A 0, B 399, C 98, D 97.
GREEDY = [sim_job(1, 0, 100, 4), sim_job(2, 1, 100, 4), sim_job(3, 2, 50, 1), sim_job(4, 3, 300, 2)]


def test_sjf_starts_whatever_fits_smallest_gpu_time_first_and_keeps_nothing_for_a_big_job():
    result = run_reference(scenario(GREEDY), REFERENCES["sjf"], tick=0)

    assert result.wait_avg_s == pytest.approx((0 + 399 + 98 + 97) / 4)
    assert result.wait_first_avg_s == result.wait_avg_s
    assert result.wait_max_s == 399
    assert (result.preemptions, result.lost_share) == (0, 0.0)


def test_sjf_classes_puts_a_higher_class_first_whatever_its_size():
    # B high: at 100 it starts first and takes all 4 GPUs; C and D start when it ends at
    # 200. Waits: A 0, B 99, C 198, D 197.
    jobs = [*GREEDY[:1], replace(GREEDY[1], priority_class="high"), *GREEDY[2:]]

    result = run_reference(scenario(jobs), REFERENCES["sjf-classes"], tick=0)
    blind = run_reference(scenario(jobs), REFERENCES["sjf"], tick=0)

    assert result.wait_avg_s == pytest.approx((0 + 99 + 198 + 197) / 4)
    assert blind.wait_avg_s == pytest.approx((0 + 399 + 98 + 97) / 4)


def test_srtf_stops_a_long_job_for_a_short_one_and_counts_its_re_wait():
    # A: 4 GPUs x 1000 s at 0. B: 1 GPU x 10 s at 5 (GPU-time 10 against A's remaining
    # 3,980): A stops at 5, B runs 5-15, A starts again at 15 and loses nothing.
    jobs = [sim_job(1, 0, 1000, 4), sim_job(2, 5, 10, 1)]

    result = run_reference(scenario(jobs), REFERENCES["srtf"], tick=0)

    assert result.wait_avg_s == pytest.approx((10 + 0) / 2)
    assert result.wait_first_avg_s == 0
    assert (result.preemptions, result.max_preemptions, result.lost_share) == (1, 1, 0.0)


def test_srtf_lays_a_gang_out_over_whole_nodes_before_a_longer_small_job():
    # Two nodes of 4. A: 1 GPU x 100 s at 0. B: 2 nodes x 4 GPUs x 10 s at 1 (GPU-time 80
    # against A's remaining 99): B needs both whole nodes, so A stops at 1 and starts
    # again at 11. The 8-GPU gang is no "job over 8 GPUs".
    jobs = [sim_job(1, 0, 100, 1), sim_job(2, 1, 10, 4, nodes=2)]

    result = run_reference(scenario(jobs, nodes=2), REFERENCES["srtf"], tick=0)

    assert result.wait_avg_s == pytest.approx((10 + 0) / 2)
    assert result.preemptions == 1
    assert result.wait_big_avg_s == 0


def test_srtf_limited_waits_out_the_minimum_runtime_loses_work_since_the_checkpoint_and_stops_at_the_limit():
    # A: 4 GPUs x 1000 s at 0. B (1 x 10 s) at 100: A has run under 5 minutes, so it may
    # not be stopped before 300; then it is, losing its 300 s (no 30-minute checkpoint
    # yet). B runs 300-310; A runs again 310-1310. C (1 x 10 s) at 800: A was stopped
    # once, the limit here, so C waits for A's end at 1310.
    limited = replace(REFERENCES["srtf-limited"], max_preemptions=1)
    jobs = [sim_job(1, 0, 1000, 4), sim_job(2, 100, 10, 1), sim_job(3, 800, 10, 1)]

    result = run_reference(scenario(jobs), limited, tick=0)

    # waits: A 10 (310 - 300), B 200, C 510
    assert result.wait_avg_s == pytest.approx((10 + 200 + 510) / 3)
    assert (result.preemptions, result.max_preemptions) == (1, 1)
    lost = 300 * 4
    assert result.lost_share == pytest.approx(lost / (1000 * 4 + 10 + 10 + lost))


def test_a_tick_delays_every_start_to_the_next_multiple():
    # sjf with a 5 s tick: A (1 GPU) submitted at 1 starts at 5; B (4 GPUs) at 2 fits
    # the 3 GPUs left only when A ends at 105, acted on at 105 (a multiple of 5).
    jobs = [sim_job(1, 1, 100, 1), sim_job(2, 2, 50, 4)]

    result = run_reference(scenario(jobs), REFERENCES["sjf"], tick=5)

    assert result.wait_avg_s == pytest.approx((4 + 103) / 2)


def test_a_scenario_of_several_pools_is_refused():
    jobs = [sim_job(1, 0, 100, 1)]
    several = scenario(jobs)
    several.nodes.append(NodeSpec("other", "inference", 4, "H100"))

    with pytest.raises(ValueError, match="one pool and one GPU model"):
        run_reference(several, REFERENCES["sjf"])


def test_parse_references_names_the_known_ones_on_an_unknown_name():
    assert [ref.name for ref in parse_references("srtf, sjf,srtf")] == ["srtf", "sjf"]
    with pytest.raises(ValueError, match="unknown reference lifo .*known: sjf, sjf-classes"):
        parse_references("sjf,lifo")
