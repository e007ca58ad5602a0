"""A cluster index kept between cycles (``Snapshot.kept_cluster``, the simulator's) gives
the plans a new index gives, cycle after cycle."""

import dataclasses
import math

from engine_builders import gpu_ids, job, node, quota, running, snapshot
from hypothesis import given
from hypothesis import strategies as st
from test_properties import FAST, Requeueing, crowded_tenants, snapshots

from scheduling.engine import KeptCluster, plan
from scheduling.engine.planner import Planner
from scheduling.engine.preemption import RunningRecord, lost_work


def _same(kept, fresh) -> None:
    assert kept.placements == fresh.placements
    assert kept.preemptions == fresh.preemptions
    assert kept.pending == fresh.pending
    assert kept.skipped == fresh.skipped


@FAST
@given(st.one_of(snapshots(), crowded_tenants()))
def test_cycles_on_a_kept_index_plan_as_on_a_new_one(snap):
    """Through starts, preemptions, stops, requeues and handed-back reservations, each
    cycle planned on the kept (reset) index decides and explains as one on a new index,
    in full and decisions-only cycles alike."""
    keep = KeptCluster()
    sim = Requeueing(snap)
    slices = None
    for pause in (1, 60, 60, 600):
        for decisions_only in (False, True):
            fresh = plan(dataclasses.replace(sim.snap, decisions_only=decisions_only))
            kept = plan(
                dataclasses.replace(sim.snap, kept_cluster=keep, decisions_only=decisions_only)
            )
            _same(kept, fresh)
            if slices is None:
                slices = dict(keep.slices)
            # the same index objects, reset, in every later cycle
            assert keep.slices.keys() == slices.keys()
            assert all(keep.slices[key] is slice_ for key, slice_ in slices.items())
        sim.step()
        sim.next_event()
        sim.advance(sim.snap.now + pause)


def test_a_stopping_job_s_grace_is_no_victim_s_on_a_kept_index():
    """The longest grace of a stop now (how late victims stopped now are gone) counts the
    jobs that may be stopped, not those stopping already, on a kept index as on a new
    one. (Counted on a kept index, a stopping job's long grace kept a pool without
    backfill open to preemptions that a new index knew could not happen: the two ended
    a decisions-only cycle at different jobs, as hypothesis found.)"""
    run = [
        running(10, "a", gpu_ids(1, 0), grace=30),
        running(11, "a", gpu_ids(1, 1), grace=600, stopping=True),
    ]
    snap = snapshot([node(1)], [quota("a", 8)], [job(1)], run)
    fresh = Planner(snap)
    kept = Planner(dataclasses.replace(snap, kept_cluster=KeptCluster()))
    assert fresh.longest_grace == kept.longest_grace == 30


def test_other_nodes_get_a_new_index():
    keep = KeptCluster()
    quotas = [quota("a", 16)]
    first = snapshot([node(1)], quotas, [job(1, gpus=8)], kept_cluster=keep)
    plan(first)
    built = keep.slices[("training", "H100", 81920)]
    # Same nodes: reset and reused; the running job's GPUs are busy again, not the
    # placement of the cycle before.
    again = dataclasses.replace(
        first, pending=[job(2, gpus=8)], running=[running(1, "a", gpu_ids(1, *range(8)))]
    )
    assert plan(again).placements == []
    assert keep.slices[("training", "H100", 81920)] is built
    # Other nodes: built anew (and kept for them).
    other = snapshot([node(1), node(2)], quotas, [job(2, gpus=8)], kept_cluster=keep)
    assert [p.job_id for p in plan(other).placements] == [2]
    assert keep.slices[("training", "H100", 81920)] is not built
    assert len(keep.nodes) == 2


def _kept_state(keep: KeptCluster) -> tuple:
    """What the running jobs kept on ``keep`` amount to, comparable across indexes."""
    kept = keep.running
    groups = {
        key: (
            group.gpus,
            group.gpu_ends,
            group.job_ends,
            sorted(r.job.id for r in group.records.values()),
        )
        for key, group in kept.groups.items()
    }
    slots = {
        (key, slot.node_id): (
            slot.base_af,
            sorted(record.job.id for record in slot.base_running),
        )
        for key, slice_ in keep.slices.items()
        for slot in slice_.slots
    }
    ids = sorted(record.job.id for record in kept.records.values())
    return groups, dict(kept.tenants), dict(kept.graces), slots, ids


def _records_as_made(keep: KeptCluster, now: float) -> None:
    """Each record kept (and renewed) from cycle to cycle is what a new record of its
    job at ``now`` is, but for what the cycle's own planning changes (end, stopping,
    account): its seasoning and protection, the job's fields it read once, the work it
    would lose and its victim order."""
    for record in keep.running.records.values():
        new = RunningRecord(record.job, record.base_end, now)
        for name in (
            "seasoned",
            "protected",
            "until",
            "inference",
            "gpus",
            "tenant",
            "priority",
            "preemptible",
            "borrowed",
            "started_at",
            "job_id",
            "checkpoint_interval",
            "checkpointed_at",
        ):
            assert getattr(record, name) == getattr(new, name), name
        assert record.lost == new.lost == lost_work(record.job, now)
        assert record.order_key == new.order_key


@FAST
@given(st.one_of(snapshots(), crowded_tenants()), st.data())
def test_running_jobs_kept_between_cycles_are_those_a_new_index_keeps(snap, data):
    """Through starts, stops, requeues, jobs passing their limit and records handed anew
    (a changed job), what a kept index keeps of the running jobs (GPUs busy until their
    end, quota counted, records) is what an index built for that cycle alone keeps, and
    the plans are those of a new index."""
    keep = KeptCluster()
    sim = Requeueing(snap)
    for pause in (1, 60, 600, 3600, 86400):
        running = sim.snap.running
        sim.snap.running = [
            dataclasses.replace(job) if data.draw(st.booleans()) else job for job in running
        ]
        kept = plan(dataclasses.replace(sim.snap, kept_cluster=keep))
        alone = KeptCluster()
        plan(dataclasses.replace(sim.snap, kept_cluster=alone))
        assert _kept_state(keep) == _kept_state(alone)
        _records_as_made(keep, sim.snap.now)
        _same(kept, plan(sim.snap))
        sim.step()
        sim.next_event()
        sim.advance(sim.snap.now + pause)


def _as_reset_leaves_it(slot, now: float) -> None:
    """``slot`` is what resetting every list gives: its kept jobs' GPUs busy until their
    end, the others idle at ``now``, nothing promised, held or lent, its kept records."""
    count = len(slot.gpu_ids)
    assert slot.af == [now if end == -math.inf else end for end in slot.base_af]
    # where no kept job runs, remembered across resets
    assert slot.base_idle == [pos for pos, end in enumerate(slot.base_af) if end == -math.inf]
    assert slot.hole == [0.0] * count
    assert slot.hole_owner == [0] * count
    assert slot.reserved == [False] * count
    assert slot.releasing == [False] * count
    assert slot.lent == [0.0] * count
    assert [id(record) for record in slot.running] == [id(r) for r in slot.base_running]
    assert (slot.version, slot.marks, slot.free_total, slot.victim_view) == (0, 0, 0, None)
    # A cached state is kept only where it is what the slot's GPUs give now; a kept job
    # ended by now is dropped by the cycle's KeptRunning.update, which clears it.
    ended = any(-math.inf < end <= now for end in slot.base_af)
    if slot.state is not None and not ended:
        free = sum(1 for end in slot.af if end <= now)
        assert slot.state == (0, sorted(slot.af), free, [])


@FAST
@given(st.one_of(snapshots(), crowded_tenants()), st.data())
def test_a_reset_leaves_every_node_as_new_but_for_its_kept_jobs(snap, data):
    """Slots nobody changed since the last reset keep their lists (their idle GPUs'
    time patched); whether changed or not, after a reset each is what resetting every
    list gives, through cycles that start, hold, reserve, preempt and requeue."""
    keep = KeptCluster()
    sim = Requeueing(snap)
    for pause in (1, 60, 600, 3600, 86400):
        decisions_only = data.draw(st.booleans())
        cycle = dataclasses.replace(sim.snap, kept_cluster=keep, decisions_only=decisions_only)
        kept = plan(cycle)
        _same(kept, plan(dataclasses.replace(cycle, kept_cluster=None)))
        later = sim.snap.now + data.draw(st.sampled_from([0, 1, 60]))
        if keep.reuse(sim.snap.nodes, later):
            for slice_ in keep.slices.values():
                for slot in slice_.slots:
                    _as_reset_leaves_it(slot, later)
        sim.step()
        sim.next_event()
        sim.advance(sim.snap.now + pause)
