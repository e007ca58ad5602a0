"""The query heaps of a slice (``SliceIndex``: lazy deletion, an entry pushed per change)
answer ``earliest`` and ``find_now`` as a scan of its node slots would, through any
sequence of reservations, starts and releases, for job sizes asked at any point, and
for jobs with and without a runtime limit."""

import math

from hypothesis import given
from hypothesis import strategies as st
from test_properties import FAST

from scheduling.engine.cluster import SliceIndex

NOW = 1_000_000.0


def _scan_earliest(slice_: SliceIndex, gpus: int, nodes: int):
    """earliest() by a scan: the nodes whose ``gpus``-th free-from time comes first."""
    entries = []
    for slot in slice_.slots:
        ordered = sorted(slot.af)
        if gpus <= len(ordered) and ordered[gpus - 1] != math.inf:
            key = ordered[gpus - 1]
            entries.append((key, sum(1 for value in ordered if value <= key), slot.idx))
    entries.sort()
    if len(entries) < nodes:
        return None
    chosen = entries[:nodes]
    return max(entry[0] for entry in chosen), sorted(entry[2] for entry in chosen)


def _scan_find_now(slice_: SliceIndex, gpus: int, nodes: int, end: float):
    """_find_now() by a scan: holes long enough first (longest first), then idle GPUs."""
    holes, idle = [], []
    for slot in slice_.slots:
        free = sum(1 for value in slot.af if value <= NOW)
        windows = sorted(
            (
                slot.hole[pos]
                for pos, value in enumerate(slot.af)
                if value > NOW and slot.hole[pos] > NOW
            ),
            reverse=True,
        )
        ordered = sorted(slot.af)
        if free < gpus <= free + len(windows) and windows[gpus - free - 1] >= end:
            holes.append((-windows[gpus - free - 1], slot.idx))
        if gpus <= len(ordered) and ordered[gpus - 1] <= NOW:
            key = ordered[gpus - 1]
            idle.append((key, sum(1 for value in ordered if value <= key), slot.idx))
    chosen: list[int] = []
    for entry in sorted(holes) + sorted(idle):
        if len(chosen) == nodes:
            break
        if entry[-1] not in chosen:
            chosen.append(entry[-1])
    return sorted(chosen) if len(chosen) >= nodes else None


operations = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "take", "release", "ask"]),
        st.integers(0, 5),  # node slot
        st.integers(1, 8),  # GPUs (job size)
        st.integers(1, 3),  # nodes
        st.integers(0, 4),  # start, in hours from now
        st.integers(1, 4),  # runtime, in hours
    ),
    max_size=40,
)


@FAST
@given(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=6), operations)
def test_the_heaps_answer_as_a_scan(sizes, ops):
    slice_ = SliceIndex("training", "H100", 81920, NOW)
    for number, size in enumerate(sizes):
        slice_.add_slot(number, f"n{number}", list(range(number * 8, number * 8 + size)))
    slice_.build()
    for owner, (op, number, gpus, nodes, start_h, runtime_h) in enumerate(ops, start=1):
        slot = slice_.slots[number % len(sizes)]
        start = NOW + 3600 * start_h
        end = start + 3600 * runtime_h
        if op == "reserve":
            positions = slice_.choose_reserved(slot, min(gpus, len(slot.af)), start)
            if positions:
                slice_.reserve(slot, positions, start, end, owner)
        elif op == "take":
            idle = sum(1 for value in slot.af if value <= NOW)
            if 0 < gpus <= idle:
                slice_.take_now(slot, gpus, NOW + 3600 * runtime_h)
        elif op == "release":
            busy = [pos for pos, value in enumerate(slot.af) if value > NOW]
            if busy:
                slice_.release_at(slot, busy[:gpus], NOW + 60 * start_h, releasing=False)
        found = slice_.earliest(gpus, nodes)
        expected = _scan_earliest(slice_, gpus, nodes)
        if expected is None or gpus > slice_.largest:
            assert found is None
        else:
            assert found is not None
            assert (found[0], sorted(slot.idx for slot in found[1])) == expected
        # Asked for a job that would end in runtime_h hours, or never (no runtime limit).
        for end_now in (NOW + 3600 * runtime_h, math.inf):
            expected_now = _scan_find_now(slice_, gpus, nodes, end_now)
            if gpus <= slice_.largest:
                now_found = slice_._find_now(gpus, nodes, end_now)
                now_ids = sorted(slot.idx for slot in now_found) if now_found else None
                assert now_ids == expected_now
            # Through the cache of sizes known not to fit from some end on, too.
            cached = slice_.find_now(gpus, nodes, end_now)
            assert (None if cached is None else sorted(slot.idx for slot in cached)) == (
                expected_now if gpus <= slice_.largest else None
            )
