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
    # again at 11.
    jobs = [sim_job(1, 0, 100, 1), sim_job(2, 1, 10, 4, nodes=2)]

    result = run_reference(scenario(jobs, nodes=2), REFERENCES["srtf"], tick=0)

    assert result.wait_avg_s == pytest.approx((10 + 0) / 2)
    assert result.preemptions == 1


def test_srtf_takes_a_running_job_by_what_it_has_left_not_by_its_whole_length():
    # A: 4 GPUs x 100 s at 0. B: 4 x 60 s at 50, GPU-time 240 against A's 50 s left x 4 =
    # 200: A runs on, B starts at 100.
    jobs = [sim_job(1, 0, 100, 4), sim_job(2, 50, 60, 4)]

    result = run_reference(scenario(jobs), REFERENCES["srtf"], tick=0)

    assert result.preemptions == 0
    assert result.wait_avg_s == pytest.approx((0 + 50) / 2)


def test_srtf_limited_keeps_the_work_up_to_the_last_checkpoint():
    # A: 4 GPUs x 4000 s at 0. B (1 x 10 s) at 2000 stops A, which keeps its first 1800 s
    # (one 30-minute checkpoint) and loses 200 s on 4 GPUs; A runs again 2010-4210.
    jobs = [sim_job(1, 0, 4000, 4), sim_job(2, 2000, 10, 1)]

    result = run_reference(scenario(jobs), REFERENCES["srtf-limited"], tick=0)

    assert result.wait_avg_s == pytest.approx((10 + 0) / 2)
    assert result.lost_share == pytest.approx(800 / (4000 * 4 + 10 + 800))


def test_srtf_limited_never_stops_a_job_it_may_not_stop_to_fit_the_others_around_it():
    # Two nodes of 7 GPUs filled at 0 by 2, 2, 3 and 2, 2, 3 GPUs (priority order), which
    # largest-first would not fit again. C (1 GPU) at 10: every job has run under 5 minutes,
    # so nothing is stopped and nothing moves; C starts at 300, when the 3-GPU job of 300 s
    # ends and the others may be stopped (no need: C fits).
    jobs = [
        sim_job(1, 0, 400, 2),
        sim_job(2, 0, 410, 2),
        sim_job(3, 0, 300, 3),
        sim_job(4, 0, 500, 2),
        sim_job(5, 0, 510, 2),
        sim_job(6, 0, 400, 3),
        sim_job(7, 10, 10, 1),
    ]

    result = run_reference(scenario(jobs, nodes=2, gpus=7), REFERENCES["srtf-limited"], tick=0)

    assert result.preemptions == 0
    assert result.wait_avg_s == pytest.approx(290 / 7)


def test_sjf_puts_a_job_on_the_fullest_node_it_fits():
    # Two nodes of 4. A (3 GPUs) at 0; B (1 GPU) at 1 goes beside A, so C (4 GPUs) at 2
    # finds a whole node and starts at once.
    jobs = [sim_job(1, 0, 100, 3), sim_job(2, 1, 100, 1), sim_job(3, 2, 100, 4)]

    result = run_reference(scenario(jobs, nodes=2), REFERENCES["sjf"], tick=0)

    assert result.wait_avg_s == 0


def test_sjf_starts_a_gang_only_on_as_many_nodes_with_room_each():
    # Two nodes of 4. A (2 GPUs) at 0. B (2 nodes x 3 GPUs) at 1: 6 GPUs are idle, but only
    # one node has 3 of them: B waits for A's end at 100.
    jobs = [sim_job(1, 0, 100, 2), sim_job(2, 1, 50, 3, nodes=2)]

    result = run_reference(scenario(jobs, nodes=2), REFERENCES["sjf"], tick=0)

    assert result.wait_avg_s == pytest.approx((0 + 99) / 2)


def test_only_jobs_over_8_gpus_count_as_big():
    # Three nodes of 4. A (1 GPU x 100 s) at 0. B (3 nodes x 4, 12 GPUs x 10 s) at 1 needs
    # every node. C (2 x 4 x 50 s) at 2 fits two whole nodes now. D (2 x 4 x 10 s) at 3
    # waits for C's end at 52 and goes before B (GPU-time 80 against 120). B starts when A
    # ends at 100. Waits: A 0, B 99, C 0, D 49; only B is over 8 GPUs.
    jobs = [
        sim_job(1, 0, 100, 1),
        sim_job(2, 1, 10, 4, nodes=3),
        sim_job(3, 2, 50, 4, nodes=2),
        sim_job(4, 3, 10, 4, nodes=2),
    ]

    result = run_reference(scenario(jobs, nodes=3), REFERENCES["sjf"], tick=0)

    assert result.wait_avg_s == pytest.approx((0 + 99 + 0 + 49) / 4)
    assert result.wait_big_avg_s == 99
    assert result.big_waited_over_day == 0


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


def test_a_tick_delays_every_start_and_end_to_the_next_multiple():
    # sjf with a 5 s tick: A (1 GPU x 101 s) submitted at 1 starts at 5 and ends at 106,
    # seen at 110; B (4 GPUs) at 2 starts then.
    jobs = [sim_job(1, 1, 101, 1), sim_job(2, 2, 50, 4)]

    result = run_reference(scenario(jobs), REFERENCES["sjf"], tick=5)

    assert result.wait_avg_s == pytest.approx((4 + 108) / 2)


def test_a_job_no_set_of_nodes_fits_is_refused():
    with pytest.raises(ValueError, match="job job1 needs more nodes"):
        run_reference(scenario([sim_job(1, 0, 100, 4, nodes=2)]), REFERENCES["sjf"])


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
