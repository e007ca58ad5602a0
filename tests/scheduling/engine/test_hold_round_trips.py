"""Giving the holds of old reservations back and taking them again is skipped where it
cannot help the job (``Reserving._holds_cannot_help``, ``PreviousReservations.
release_and_rehold``): the cycles decide and explain as with every round trip made."""

import dataclasses

from hypothesis import given
from hypothesis import strategies as st
from test_properties import (
    FAST,
    Requeueing,
    assert_shortcut_plans_alike,
    crowded_tenants,
    snapshots,
)

from scheduling.engine import KeptCluster


def _reorder(sim: Requeueing, data) -> None:
    """Hand back previous positions shuffled, as if the order had changed since (fair
    share moved, jobs arrived): jobs now overtake the owners of held reservations."""
    pending = sim.snap.pending
    positions = [job.previous_position for job in pending]
    shuffled = data.draw(st.permutations(positions))
    sim.snap.pending = [
        dataclasses.replace(job, previous_position=position)
        for job, position in zip(pending, shuffled, strict=True)
    ]


@FAST
@given(st.one_of(snapshots(), crowded_tenants()), st.data())
def test_skipped_round_trips_plan_as_made_ones(snap, data):
    """Through starts, preemptions, stops and requeues, with each reservation handed
    back to the next cycle and the order changing, full and decisions-only cycles
    (whose early end depends on what the round trips leave behind) plan alike either
    way."""
    keep = KeptCluster()
    sim = Requeueing(snap)
    for pause in (1, 60, 60, 600, 60):
        if data.draw(st.booleans()):
            _reorder(sim, data)
        assert_shortcut_plans_alike(sim, keep, "always_give_back")
        sim.step()
        sim.next_event()
        sim.advance(sim.snap.now + pause)
