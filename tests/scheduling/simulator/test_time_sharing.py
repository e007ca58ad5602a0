"""The simulator's ``sluice-timeshare`` policy: the default with every queue
time-sharing, for the jobs that checkpoint (training-like, preemptible)."""

from dataclasses import replace

from scheduling.simulator import POLICIES, SimConfig, replay

from .conftest import ANY_GAIN, scenario, sim_job

EXACT = SimConfig(dispatch_interval=0)
# Levels from 4 GPU-hours and no minimum wait, so that a 4-GPU job is in level 1 within
# hours, and a waiting job stops it at once.
SHARING = replace(
    ANY_GAIN["sluice-timeshare"],
    time_sharing_first_level_gpu_seconds=4 * 3600.0,
    time_sharing_min_wait_seconds=0.0,
)


def _long_then_short(count: int, every: float = 3000.0):
    """A 4-GPU job of 100,000 s from 0 on a 4-GPU node, then ``count`` 4-GPU jobs of
    600 s of the same class from 20,000 s, one every ``every`` s."""
    jobs = [sim_job(1, 0, 100_000, 4)]
    jobs += [sim_job(2 + k, 20_000 + k * every, 600, 4) for k in range(count)]
    return scenario(jobs)


def test_a_short_job_no_longer_waits_for_a_long_one_of_its_class():
    one = _long_then_short(1)
    default = replay(one, ANY_GAIN["sluice"], EXACT)
    assert default.runs[1].first_start == 100_000  # no stop inside a class by default
    assert default.runs[0].preemptions == 0

    shared = replay(one, SHARING, EXACT)
    long, short = shared.runs
    # The long job (80,000 GPU-seconds used: level 1) stops for it with its 5 s grace,
    # losing the work since its last 30-minute checkpoint, and resumes after it.
    assert short.first_start == 20_005
    assert long.preemptions == 1
    assert long.lost_gpu_seconds == 4 * (20_005 - 11 * 1800)
    assert [start for start, _, _ in long.attempts] == [0, 20_605]
    assert long.outcome == "completed"


def test_every_stop_counts_against_the_limit():
    # Ten short jobs one after the other: the long job is stopped three times (the
    # scenario's limit), then runs on to its end while the others wait.
    shared = replay(_long_then_short(10), SHARING, EXACT)
    long = shared.runs[0]
    assert long.preemptions == 3
    assert max(run.preemptions for run in shared.runs) == 3
    waited = [run for run in shared.runs[1:] if run.first_start > long.attempts[-1][0]]
    assert waited  # those after its third stop wait for its end


def test_jobs_that_do_not_checkpoint_are_not_stopped():
    one = _long_then_short(1)
    one.jobs = [replace(job, workload_type="evaluation") for job in one.jobs]
    shared = replay(one, SHARING, EXACT)
    assert shared.runs[0].preemptions == 0
    assert shared.runs[1].first_start == 100_000


def test_a_job_stops_nobody_before_its_minimum_wait():
    # With a 1 h minimum wait the short job stops the long one an hour after it arrived
    # (a cycle is planned then).
    patient = replace(SHARING, time_sharing_min_wait_seconds=3600.0)
    shared = replay(_long_then_short(1), patient, EXACT)
    assert shared.runs[1].first_start == 20_000 + 3600 + 5
    assert shared.runs[0].preemptions == 1


def test_the_policy_is_the_default_with_time_sharing_on():
    default, shared = POLICIES["sluice"], POLICIES["sluice-timeshare"]
    assert shared.time_sharing and not default.time_sharing
    assert shared.order_knobs() == default.order_knobs()  # the engine's own defaults
