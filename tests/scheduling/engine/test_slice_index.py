"""The query heaps of a slice (``SliceIndex``: lazy deletion, an entry pushed per change)
answer ``earliest`` and ``find_now`` as a scan of its node slots would, through any
sequence of reservations, starts and releases, for job sizes asked at any point, and
for jobs with and without a runtime limit; so do the searches of a slice with topology
blocks (their views and block heaps), reservations given back included."""

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


def _scan_block_views(slice_: SliceIndex, gpus: int):
    """Per block (by number): GPUs idle now, (free-from time of ``gpus`` GPUs, GPUs free
    by then, slot) best first, and (-window, slot) of the slots that have them now only
    through holes, longest first."""
    views = []
    for members in slice_.blocks:
        idle, timed, holes = 0, [], []
        for idx in members:
            slot = slice_.slots[idx]
            free = sum(1 for value in slot.af if value <= NOW)
            idle += free
            windows = sorted(
                (slot.hole[p] for p, v in enumerate(slot.af) if v > NOW and slot.hole[p] > NOW),
                reverse=True,
            )
            ordered = sorted(slot.af)
            if gpus > len(ordered):
                continue
            if ordered[gpus - 1] != math.inf:
                key = ordered[gpus - 1]
                timed.append((key, sum(1 for value in ordered if value <= key), idx))
            if free < gpus <= free + len(windows):
                holes.append((-windows[gpus - free - 1], idx))
        views.append((idle, sorted(timed), sorted(holes)))
    return views


def _scan_block_now(slice_: SliceIndex, gpus: int, nodes: int, end: float):
    """_block_now() by a scan: the block left with the fewest idle GPUs (the first on a
    tie) among those with ``nodes`` slots that can run the job now; its slots in order."""
    best = None
    for number, (idle, timed, holes) in enumerate(_scan_block_views(slice_, gpus)):
        usable = [idx for window, idx in holes if -window >= end]
        usable += [idx for at, _, idx in timed if at <= NOW]
        if len(slice_.blocks[number]) >= nodes and len(usable) >= nodes:
            key = (idle, number)
            if best is None or key < best[0]:
                best = (key, usable[:nodes])
    return None if best is None else best[1]


def _scan_block_earliest(slice_: SliceIndex, gpus: int, nodes: int):
    """_block_earliest() by a scan: the block whose ``nodes``-th best slot is free first
    (then the fewest idle GPUs, then the first block), and its slots in order."""
    best = None
    for number, (idle, timed, _) in enumerate(_scan_block_views(slice_, gpus)):
        if len(slice_.blocks[number]) >= nodes and len(timed) >= nodes:
            key = (timed[nodes - 1][0], idle, number)
            if best is None or key < best[0]:
                best = (key, [idx for _, _, idx in timed[:nodes]])
    return None if best is None else (best[0][0], best[1])


def _scan_pack_now(slice_: SliceIndex, gpus: int, end: float):
    """_pack_now() by a scan: the longest hole that is long enough, else the best fit of
    idle GPUs on a slot of a block partly in use (or of none) before a wholly idle one."""
    holes, idle = [], []
    whole = [
        all(value <= NOW for idx in members for value in slice_.slots[idx].af)
        for members in slice_.blocks
    ]
    for slot in slice_.slots:
        free = sum(1 for value in slot.af if value <= NOW)
        windows = sorted(
            (slot.hole[p] for p, v in enumerate(slot.af) if v > NOW and slot.hole[p] > NOW),
            reverse=True,
        )
        ordered = sorted(slot.af)
        if free < gpus <= free + len(windows):
            holes.append((-windows[gpus - free - 1], slot.idx))
        if gpus <= len(ordered) and ordered[gpus - 1] <= NOW:
            key = ordered[gpus - 1]
            number = slice_.block_of[slot.idx]
            rank = 1 if number >= 0 and whole[number] else 0
            idle.append((rank, key, sum(1 for value in ordered if value <= key), slot.idx))
    holes.sort()
    if holes and -holes[0][0] >= end:
        return holes[0][1]
    return min(idle)[-1] if idle else None


@FAST
@given(
    st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=8),
    st.lists(st.integers(-1, 2), min_size=8, max_size=8),  # each slot's block (-1: none)
    operations,
)
def test_the_block_searches_answer_as_a_scan(sizes, blocks, ops):
    slice_ = SliceIndex("training", "H100", 81920, NOW)
    for number, size in enumerate(sizes):
        block = f"b{blocks[number]}" if blocks[number] >= 0 else ""
        slice_.add_slot(number, f"n{number}", list(range(number * 8, number * 8 + size)), block)
    slice_.build()
    held = []
    for owner, (op, number, gpus, nodes, start_h, runtime_h) in enumerate(ops, start=1):
        slot = slice_.slots[number % len(sizes)]
        start = NOW + 3600 * start_h
        end = start + 3600 * runtime_h
        if op == "reserve":
            positions = slice_.choose_reserved(slot, min(gpus, len(slot.af)), start)
            if positions:
                before = [
                    (slot.reserved[p], slot.hole[p], slot.hole_owner[p], slot.releasing[p])
                    for p in positions
                ]
                ready = [slot.af[p] for p in positions]
                slice_.reserve(slot, positions, start, end, owner)
                held.append((slot, positions, ready, before))
        elif op == "take":
            idle = sum(1 for value in slot.af if value <= NOW)
            if 0 < gpus <= idle:
                slice_.take_now(slot, gpus, NOW + 3600 * runtime_h)
        elif op == "release":
            busy = [pos for pos, value in enumerate(slot.af) if value > NOW]
            if busy:
                slice_.release_at(slot, busy[:gpus], NOW + 60 * start_h, releasing=False)
        elif held:  # "ask": the last reservation held given back first
            slice_.unhold(*held.pop())
        if not slice_.blocks or gpus > slice_.largest:
            continue
        for end_now in (NOW + 3600 * runtime_h, math.inf):
            if nodes > 1:
                found = slice_._block_now(gpus, nodes, end_now)
                ids = None if found is None else [slot.idx for slot in found]
                assert ids == _scan_block_now(slice_, gpus, nodes, end_now)
            else:
                found = slice_._pack_now(gpus, end_now)
                ids = None if found is None else found[0].idx
                assert ids == _scan_pack_now(slice_, gpus, end_now)
        if nodes > 1:
            early = slice_._block_earliest(gpus, nodes)
            if early is not None:
                early = (early[0], [slot.idx for slot in early[1]])
            assert early == _scan_block_earliest(slice_, gpus, nodes)
        expected_most = max(
            (
                sum(1 for at, _, _ in timed if at <= NOW)
                for _, timed, _ in _scan_block_views(slice_, gpus)
            ),
            default=0,
        )
        assert slice_.most_free_in_block(gpus) == expected_most
