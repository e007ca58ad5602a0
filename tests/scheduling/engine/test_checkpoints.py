"""A running job's last checkpoint: given (``checkpointed_at``) or worked out from its
interval (``checkpoint_interval``, the simulator's jobs); both give the same work lost."""

import dataclasses

import pytest
from engine_builders import NOW, gpu_ids, running

from scheduling.engine.preemption import lost_work


@pytest.mark.parametrize("age", [0, 1, 599, 600, 601, 1799, 1800, 5000.5])
@pytest.mark.parametrize("interval", [600.0, 1800.0])
def test_an_interval_gives_the_work_lost_its_last_checkpoint_gives(age, interval):
    job = dataclasses.replace(running(1, "a", gpu_ids(1, 0, 1, 2)), started_at=NOW - age)
    start = job.started_at
    told = dataclasses.replace(job, checkpointed_at=start + (NOW - start) // interval * interval)
    worked_out = dataclasses.replace(job, checkpoint_interval=interval)
    assert lost_work(worked_out, NOW) == lost_work(told, NOW)
    assert lost_work(worked_out, NOW) == 3 * (age % interval)


def test_without_either_the_work_since_the_start_is_lost():
    job = dataclasses.replace(running(1, "a", gpu_ids(1, 0)), started_at=NOW - 700)
    assert lost_work(job, NOW) == 700
