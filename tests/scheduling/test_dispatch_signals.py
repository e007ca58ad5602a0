"""The dispatch cycle's signals (scheduling.signals): what they carry, and a receiver that
fails never breaks the cycle (the apps above the scheduling listen; it does not call them)."""

from __future__ import annotations

import pytest

from scheduling.choices import JobState
from scheduling.models import Job
from scheduling.services.dispatch import dispatch_cycle
from scheduling.signals import dispatch_cycle_finished, jobs_admitted
from tests import factories as f


@pytest.fixture
def heard():
    calls: list[tuple[str, dict]] = []

    def on_admitted(sender, **kwargs):
        calls.append(("admitted", {"sender": sender, **kwargs}))

    def on_cycle(sender, **kwargs):
        calls.append(("cycle", {"sender": sender, **kwargs}))

    jobs_admitted.connect(on_admitted)
    dispatch_cycle_finished.connect(on_cycle)
    yield calls
    jobs_admitted.disconnect(on_admitted)
    dispatch_cycle_finished.disconnect(on_cycle)


def _pending(world, n):
    return [
        f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
        for _ in range(n)
    ]


def test_a_cycle_sends_the_admitted_jobs_and_its_duration(world, heard):
    jobs = _pending(world, 2)
    stats = dispatch_cycle()
    assert stats["placed"] == 2
    assert [kind for kind, _ in heard] == ["admitted", "cycle"]
    admitted = heard[0][1]
    assert admitted["sender"] is Job
    assert sorted(j.pk for j in admitted["jobs"]) == sorted(j.pk for j in jobs)
    assert all(j.state == JobState.ADMITTED for j in admitted["jobs"])
    assert admitted["now"] is not None
    assert heard[1][1]["seconds"] > 0


def test_a_cycle_that_admits_nobody_sends_only_its_duration(world, heard):
    dispatch_cycle()
    assert [kind for kind, _ in heard] == ["cycle"]


def test_a_failing_receiver_does_not_break_the_cycle(world, caplog):
    jobs = _pending(world, 1)

    def broken(sender, **kwargs):
        raise RuntimeError("receiver down")

    jobs_admitted.connect(broken)
    dispatch_cycle_finished.connect(broken)
    try:
        stats = dispatch_cycle()
    finally:
        jobs_admitted.disconnect(broken)
        dispatch_cycle_finished.disconnect(broken)
    assert stats["placed"] == 1
    jobs[0].refresh_from_db()
    assert jobs[0].state == JobState.ADMITTED
    assert jobs[0].allocations.count() == 1
    logged = [r for r in caplog.records if r.name == "django.dispatch" and r.levelname == "ERROR"]
    assert len(logged) == 2  # each failure is logged, with its traceback
