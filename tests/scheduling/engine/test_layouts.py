"""Job records handed to cycle after cycle (the simulator's way): the grouping of their
GPUs by node, remembered on the record, never changes what a cycle decides."""

import dataclasses

from engine_builders import gpu_ids, job, node, quota, running, snapshot

from scheduling.engine import NodeInfo, plan

QUOTAS = [quota("a", 16), quota("b", 0, 16)]


def _fresh(snap):
    """The same snapshot with new job records (nothing remembered on them)."""
    return dataclasses.replace(
        snap,
        running=[dataclasses.replace(record) for record in snap.running],
        pending=[dataclasses.replace(record) for record in snap.pending],
    )


def _decisions(result):
    return result.placements, result.preemptions, result.pending


def _without_gpu(full: NodeInfo, index: int) -> NodeInfo:
    """``full`` with one GPU unhealthy (left out), as the dispatch loop hands it over."""
    return NodeInfo(full.id, full.name, full.pool, [g for g in full.gpus if g.index != index])


def test_a_record_handed_to_a_second_cycle_is_placed_from_its_remembered_layout():
    nodes = [node(1), node(2)]
    spread = running(10, "b", gpu_ids(1, 0, 1) + gpu_ids(2, 5), "low", borrowed=True)
    pending = [job(1, "a", gpus=8, cls="high"), job(2, "a", gpus=2)]
    snap = snapshot(nodes, QUOTAS, pending, [spread])
    first = plan(snap)
    assert spread.layout is not None and spread.layout[0] == spread.gpu_ids
    # The second cycle reads the layout; it decides exactly as fresh records do.
    again = plan(dataclasses.replace(snap, now=snap.now + 5))
    assert _decisions(again) == _decisions(
        plan(_fresh(dataclasses.replace(snap, now=snap.now + 5)))
    )
    assert _decisions(first) == _decisions(plan(_fresh(snap)))


def test_a_layout_is_grouped_afresh_when_the_ids_or_the_nodes_change():
    nodes = [node(1), node(2)]
    record = running(10, "b", gpu_ids(1, 0, 1), "low", borrowed=True)
    pending = [job(1, "a", gpus=8, cls="high")]
    plan(snapshot(nodes, QUOTAS, pending, [record]))
    remembered = record.layout
    # New ids on the same record (a job of the dispatch loop moved): grouped again.
    record.gpu_ids = gpu_ids(2, 3, 4)
    moved = snapshot(nodes, QUOTAS, pending, [record])
    assert _decisions(plan(moved)) == _decisions(plan(_fresh(moved)))
    assert record.layout[0] == gpu_ids(2, 3, 4) and record.layout is not remembered
    # Equal nodes, but new objects (a database read): the layout's nodes are not in the
    # index, so the ids are grouped against the new ones.
    rebuilt = snapshot([node(1), node(2)], QUOTAS, pending, [record])
    assert _decisions(plan(rebuilt)) == _decisions(plan(_fresh(rebuilt)))


def test_a_gpu_out_of_service_is_left_out_and_nothing_incomplete_is_remembered():
    full = node(1, gpus=4)
    record = running(10, "b", gpu_ids(1, 0, 1, 2, 3), "low", borrowed=True)
    pending = [job(1, "a", gpus=4, cls="high")]
    degraded = snapshot([_without_gpu(full, 2)], QUOTAS, pending, [record])
    result = plan(degraded)
    assert _decisions(result) == _decisions(plan(_fresh(degraded)))
    assert record.layout is None  # a GPU was not found: not remembered
    healthy = snapshot([full], QUOTAS, pending, [record])
    assert _decisions(plan(healthy)) == _decisions(plan(_fresh(healthy)))
    assert record.layout is not None


def test_a_kept_reservation_is_read_from_its_layout_until_it_changes():
    """A waiting job's reservation handed back cycle after cycle: kept as long as it
    holds, whether its grouping is remembered or worked out afresh."""
    nodes = [node(1), node(2)]
    busy = [running(10, "a", gpu_ids(1, *range(8)), runtime=3600)]
    busy.append(running(11, "a", gpu_ids(2, *range(8)), runtime=7200))
    waiting = job(1, "c", gpus=8)
    snap = snapshot(nodes, QUOTAS + [quota("c", 8)], [waiting], busy)
    first = plan(snap).pending[1]
    assert first.reserved_gpu_ids == gpu_ids(1, *range(8))
    for later in (60.0, 120.0):
        waiting.reserved_gpu_ids = first.reserved_gpu_ids
        waiting.reserved_start = first.estimated_start
        step = dataclasses.replace(snap, now=snap.now + later)
        info = plan(step).pending[1]
        assert info == plan(_fresh(step)).pending[1]
        assert info.reserved_gpu_ids == first.reserved_gpu_ids
        assert waiting.layout is not None and waiting.layout[0] == first.reserved_gpu_ids
    # A reservation naming a GPU that left service is void: planned afresh.
    waiting.reserved_gpu_ids = gpu_ids(1, *range(8))
    gone = dataclasses.replace(snap, nodes=[_without_gpu(nodes[0], 3), nodes[1]])
    assert plan(gone).pending[1] == plan(_fresh(gone)).pending[1]
