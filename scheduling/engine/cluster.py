"""The GPUs of the cluster as a timeline, indexed so that a query costs O(log nodes).

GPUs are grouped into *slices*: all GPUs of one pool with the same model and memory size.
A job is placed inside one slice. Inside a slice every node contributes a
:class:`NodeSlot`. Each GPU has a time from which it is free for good (``af``): ``now``
when idle, the end of the job holding it, or the end of a job that reserved it. An idle
GPU reserved for a job starting later has a *hole* until that start: a job ending before
then may use it now (backfill).

Two lazy-deletion heaps per slice and per job size ``g`` answer the questions of the
scheduler without scanning nodes:

- ``af_heaps[g]``: (g-th smallest af, GPUs free by then, slot, version): the node where a
  ``g``-GPU job can start earliest (``now`` if it has ``g`` idle unreserved GPUs, best fit
  first);
- ``hole_heaps[g]``: (-longest window, slot, version) for nodes that can run ``g`` GPUs
  now only by using holes: the job must end before the window closes.

Topology: a node may be in a *block* (a leaf switch, rack or NVLink domain;
``NodeInfo.block``). Where a slice has blocks, a job of several nodes is given a
*patience* (what is left of its topology wait; ``NO_TOPOLOGY``: nothing asked). It takes
the nodes of one block that can hold it now (the block left with the fewest idle GPUs
first); with patience left it waits for one otherwise, and its reservation is inside one
block; with none left it is spread over blocks where no block is as early. A single-node
job takes a node of a block already partly in use (or of no block) before one of a
block wholly idle, so that whole blocks stay free for the jobs of several nodes.

These searches cost about what the heaps' do. A single-node job's takes the af heap's
best fits in order, passing over those of wholly idle blocks (each block's idle GPUs are
counted at every change). Each block keeps a *view* per job size (its idle GPUs, its
slots' free-from times best first, its holes), worked out again only after one of its
slots changed (``block_stamp``); two lazy-deletion heaps per job shape order the blocks
by those views, and take in only the blocks changed since the shape last asked:
(idle GPUs, block) for a start now, (when ``nodes`` slots are free, idle GPUs, block)
for the earliest. A slice without blocks, and a slice whose blocks cannot hold the job,
answer exactly as without topology.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # pragma: no cover
    from .preemption import RunningRecord, SliceStats

INF: Final = math.inf
NEG_INF: Final = -math.inf

# The patience of a query that asks nothing of the topology (see the module doc).
NO_TOPOLOGY: Final = -1.0


def _free_by(ordered: list[float], size: int, key: float) -> int:
    """``bisect_right(ordered, key)`` where ``ordered[size - 1] == key``: the GPUs free
    by ``key`` (a loop from ``size``: a node has a few GPUs, and the compiled loop costs
    less than a call to ``bisect``)."""
    count = size
    end = len(ordered)
    while count < end and ordered[count] <= key:
        count += 1
    return count


class NodeSlot:
    """The GPUs of one node inside one slice, with their timeline state."""

    __slots__ = (
        "idx",
        "node_id",
        "node_name",
        "gpu_ids",
        "af",
        "hole",
        "hole_owner",
        "reserved",
        "releasing",
        "version",
        "marks",
        "free_total",
        "running",
        "victim_view",
        "lent",
        "state",
        "base_af",
        "base_running",
        "base_idle",
        "touched",
        "dirty_at",
    )

    def __init__(self, idx: int, node_id: int, node_name: str, gpu_ids: list[int], now: float):
        self.idx = idx
        self.node_id = node_id
        self.node_name = node_name
        self.gpu_ids = gpu_ids
        count = len(gpu_ids)
        self.af = [now] * count
        self.hole = [0.0] * count  # start of the reservation of an idle GPU; 0 = none
        self.hole_owner = [0] * count
        self.reserved = [False] * count  # promised to a waiting job in this cycle
        self.releasing = [False] * count  # held by a stopping job
        self.version = 0
        # Bumped when the GPUs are given back and taken again without a re-index (see
        # SliceIndex.touch): the version with this tells whether the slot changed.
        self.marks = 0
        self.free_total = 0  # GPUs idle now, reserved or not
        # running-job records holding GPUs here (victim search); typed, so that the compiled
        # readers access the records' fields directly rather than by a generic lookup
        self.running: list[RunningRecord] = []
        # possible victims here, cached by the victim search
        self.victim_view: list[tuple[RunningRecord, list[int]]] | None = None
        self.lent = [0.0] * count  # end of a job started in a hole (GPU busy until then)
        # (version, sorted free-from times, GPUs idle and unreserved, hole ends) as of
        # that version: SliceIndex._state, worked out once per change
        self.state: tuple[int, list[float], int, list[float]] | None = None
        # On an index kept between cycles (KeptCluster): the end of the running job
        # holding each GPU (-inf: none), and those jobs' records, kept from one cycle
        # to the next for the running jobs that stay the same (see
        # scheduling.engine.cycle.KeptRunning); a reset starts from them.
        self.base_af: list[float] = [-INF] * count
        self.base_running: list[RunningRecord] = []
        # The positions where base_af is -inf (None: to be worked out again, after a
        # change of base_af), so that a reset need not compare every GPU's time.
        self.base_idle: list[int] | None = None
        # Changed since the last reset (or since made): any GPU's state, the records of
        # the jobs on it, or base_af/base_running (see reset). Set by every change.
        self.touched = False
        # Where it was last entered in its slice's ``dirty`` list (see SliceIndex.refresh).
        self.dirty_at = 0

    def reset(self, now: float) -> None:
        """Back to the state :meth:`__init__` gives (every GPU idle at ``now``), for a
        cluster index kept between cycles (:class:`KeptCluster`), except that the GPUs
        of the running jobs kept from the cycle before (``base_af``, ``base_running``)
        are busy until their end again, as the planner would mark them.

        A slot nobody changed since its last reset (``touched`` False: no job placed,
        reserved, held, marked, stopped or kept anew on it) is in that state already but
        for its idle GPUs' free-from time, the last reset's ``now``: that is patched in
        place, its lists are kept (a deep backlog's cycle leaves most nodes alone, and
        freeing and making their lists again was most of a reset). Its cached
        :meth:`SliceIndex._state` stays valid where no GPU is idle (it does not depend
        on ``now`` there: free-from times after it, no hole)."""
        idle = self.base_idle
        if idle is None:
            base_af = self.base_af
            idle = self.base_idle = [pos for pos in range(len(base_af)) if base_af[pos] == NEG_INF]
        if not self.touched:
            if idle:
                af = self.af
                for pos in idle:
                    af[pos] = now
                self.state = None
            self.version = 0
            self.marks = 0
            self.free_total = 0
            self.victim_view = None
            return
        self.touched = False
        count = len(self.gpu_ids)
        if self.base_running:
            # A copy, idle GPUs patched (not a comprehension: every float would be
            # unboxed and boxed again in the compiled engine).
            af = self.base_af.copy()
            for pos in idle:
                af[pos] = now
            self.af = af
        else:
            self.af = [now] * count
        self.hole = [0.0] * count
        self.hole_owner = [0] * count
        self.reserved = [False] * count
        self.releasing = [False] * count
        self.version = 0
        self.marks = 0
        self.free_total = 0
        self.running = list(self.base_running)
        self.victim_view = None
        self.lent = [0.0] * count
        self.state = None

    def idle_unreserved(self, now: float) -> int:
        """GPUs idle now and promised to nobody."""
        count = 0
        for value in self.af:
            if value <= now:
                count += 1
        return count


class _BlockView:
    """What one block offers jobs of one size per node (``gpus``), as of one state of
    its node slots (``stamp``, see :attr:`SliceIndex.block_stamp`): ``idle``, its GPUs
    idle and unreserved now; ``timed``, (free-from time of ``gpus`` GPUs, GPUs free by
    then, slot) of each slot that ever has them, best first (as the af heap orders
    them), of which the first ``ready`` have them now; ``holes``, (-window, slot) of the
    slots that have them now only by using holes, longest window first."""

    __slots__ = ("stamp", "idle", "ready", "timed", "holes")

    def __init__(self, stamp: int) -> None:
        self.stamp = stamp
        self.idle = 0
        self.ready = 0
        self.timed: list[tuple[float, int, int]] = []
        self.holes: list[tuple[float, int]] = []


class SliceIndex:
    """All node slots of one (pool, GPU model, memory) slice, with the query heaps."""

    __slots__ = (
        "key",
        "pool",
        "model",
        "memory_mb",
        "now",
        "slots",
        "sizes",
        "heaps",
        "largest",
        "buckets",
        "idle",
        "hole_owners",
        "victim_stats",
        "_no_fit",
        "epoch",
        "grown",
        "dirty",
        "synced",
        "block_of",
        "blocks",
        "_block_names",
        "_block_holds",
        "block_gpus",
        "block_idle",
        "block_stamp",
        "_slot_idle",
        "_block_views",
        "_no_block_fit",
        "_block_heaps",
        "block_dirty",
        "_block_dirty_at",
    )

    def __init__(self, pool: str, model: str, memory_mb: int, now: float) -> None:
        self.key = (pool, model, memory_mb)
        self.pool = pool
        self.model = model
        self.memory_mb = memory_mb
        self.now = now
        self.slots: list[NodeSlot] = []
        self.sizes: list[int] = []
        # job size -> its (af, hole) heaps, built when a job of that size first asks
        self.heaps: dict[int, tuple[list, list]] = {}
        self.largest = 0  # the most GPUs of one node of the slice
        self.buckets: list[int] = []  # buckets[n] = slots with n GPUs idle now
        self.idle = 0  # GPUs idle now (reserved or not)
        self.hole_owners: list[tuple[int, float]] = []  # (job id, start) of reservations
        self.victim_stats: SliceStats | None = None  # filled lazily by the preemption search
        # (gpus, nodes) -> shortest end for which find_now failed. Idle GPUs and holes
        # only ever shrink during a cycle, so a longer job cannot fit either.
        self._no_fit: dict[tuple[int, int], float] = {}
        # Bumped when GPUs become idle again (a held reservation given back): whatever
        # was learnt from "only ever shrinks" before is void.
        self.epoch = 0
        # Node slots (by number) that gained idle GPUs that way, in order: searches that
        # keep state across a cycle re-examine these instead of starting over.
        self.grown: list[int] = []
        # Node slots (by number) re-indexed since the heaps were first built, in order,
        # and per job size how far its heaps took them in (see refresh and _sync).
        self.dirty: list[int] = []
        self.synced: dict[int, int] = {}
        # Topology: the block number of each node slot (-1: in no block), and the node
        # slots of each block; (gpus, nodes) -> whether some block can ever hold it.
        self.block_of: list[int] = []
        self.blocks: list[list[int]] = []
        self._block_names: dict[str, int] = {}
        self._block_holds: dict[tuple[int, int], bool] = {}
        # Per block: its GPUs, those idle and unreserved now (the sum of its slots' own,
        # ``_slot_idle``; all of them: the block is wholly idle), and a stamp bumped at
        # every change of one of its slots, which tells whether a view of it is current.
        self.block_gpus: list[int] = []
        self.block_idle: list[int] = []
        self.block_stamp: list[int] = []
        self._slot_idle: list[int] = []
        # job size -> per block its last view (see _block_view), made when first asked
        self._block_views: dict[int, list[_BlockView | None]] = {}
        # (gpus, nodes) -> shortest end for which no block could run it now (as _no_fit)
        self._no_block_fit: dict[tuple[int, int], float] = {}
        # (gpus, nodes) -> the block heaps of that shape (see _block_heaps_of), and the
        # blocks changed since the first were made, in order (as dirty for the slots).
        self._block_heaps: dict[tuple[int, int], tuple[list, list, list[int]]] = {}
        self.block_dirty: list[int] = []
        self._block_dirty_at: list[int] = []

    # -- building -------------------------------------------------------------------

    def reset(self, now: float) -> None:
        """Back to the state of a new index holding the same node slots, every GPU idle
        at ``now`` (see :class:`KeptCluster`); :meth:`build` follows as for a new one."""
        self.now = now
        self.heaps = {}
        self.idle = 0
        self.hole_owners = []
        self.victim_stats = None
        self._no_fit = {}
        self._no_block_fit = {}
        self._block_views = {}
        self._block_heaps = {}
        self.block_dirty = []
        self.epoch = 0
        self.grown = []
        self.dirty = []
        self.synced = {}
        for slot in self.slots:
            slot.reset(now)

    def add_slot(
        self, node_id: int, node_name: str, gpu_ids: list[int], block: str = ""
    ) -> NodeSlot:
        """Add a node's GPUs of this slice (all idle until running jobs are applied), in
        topology ``block`` ("": none)."""
        slot = NodeSlot(len(self.slots), node_id, node_name, gpu_ids, self.now)
        self.slots.append(slot)
        number = -1
        if block:
            found = self._block_names.get(block)
            if found is None:
                found = self._block_names[block] = len(self.blocks)
                self.blocks.append([])
            number = found
            self.blocks[number].append(slot.idx)
            if number == len(self.block_gpus):
                self.block_gpus.append(0)
                self.block_idle.append(0)
                self.block_stamp.append(0)
                self._block_dirty_at.append(0)
            self.block_gpus[number] += len(gpu_ids)
        self.block_of.append(number)
        self._slot_idle.append(0)
        return slot

    def build(self) -> None:
        """Count idle GPUs once every GPU's initial state is known. The heaps of a job
        size are only built when a job of that size first asks (see :meth:`_heaps`)."""
        sizes = [len(slot.gpu_ids) for slot in self.slots]
        sizes.sort()
        self.sizes = sizes
        largest = self.largest = sizes[-1] if sizes else 0
        buckets = self.buckets = [0] * (largest + 1)
        now = self.now
        idle = 0
        for slot in self.slots:
            base_idle = slot.base_idle
            if base_idle is not None and not slot.touched:
                # Unchanged since a reset (see NodeSlot.reset): idle exactly where no
                # kept running job is (those end after now, or they were dropped).
                free = len(base_idle)
            else:
                free = 0
                for value in slot.af:
                    if value <= now:
                        free += 1
            slot.free_total = free
            buckets[free] += 1
            idle += free
        self.idle += idle
        if self.blocks:
            block_idle = self.block_idle
            for number in range(len(block_idle)):
                block_idle[number] = 0
            slot_idle, block_of = self._slot_idle, self.block_of
            for slot in self.slots:
                # GPUs free from now or before, as _state counts them (counted above).
                free = slot.free_total
                slot_idle[slot.idx] = free
                number = block_of[slot.idx]
                if number >= 0:
                    block_idle[number] += free

    def _heaps(self, size: int) -> tuple[list, list]:
        """The (af, hole) heaps for jobs of ``size`` GPUs per node, built on first use,
        brought up to date with the slots re-indexed since (see :meth:`_sync`)."""
        heaps = self.heaps.get(size)
        if heaps is not None:
            if self.synced[size] < len(self.dirty):
                self._sync(size, heaps[0], heaps[1])
            return heaps
        # A cycle builds these heaps for every job size it meets, over every node of the
        # slice: the entries (see _sync) are worked out inline.
        af_heap: list = []
        hole_heap: list = []
        for slot in self.slots:
            known = slot.state
            if known is not None and known[0] == slot.version:
                ordered, free, windows = known[1], known[2], known[3]
            else:
                ordered, free, windows = self._state(slot)
            if size <= len(ordered):
                key = ordered[size - 1]
                if key != INF:
                    count = _free_by(ordered, size, key)
                    af_heap.append((key, count, slot.idx, slot.version))
            if free < size <= free + len(windows):
                hole_heap.append((-windows[size - free - 1], slot.idx, slot.version))
        heapify(af_heap)
        heapify(hole_heap)
        heaps = self.heaps[size] = (af_heap, hole_heap)
        self.synced[size] = len(self.dirty)
        return heaps

    def _state(self, slot: NodeSlot) -> tuple[list[float], int, list[float]]:
        """Sorted free-from times, GPUs idle and unreserved, hole ends (longest first)."""
        known = slot.state
        if known is not None and known[0] == slot.version:
            return known[1], known[2], known[3]
        now = self.now
        af = slot.af
        hole = slot.hole
        free = 0
        windows: list[float] = []
        for pos, value in enumerate(af):
            if value <= now:
                free += 1
            elif hole[pos] > now:
                windows.append(hole[pos])
        if len(windows) > 1:  # (a method call with a keyword: not made where it sorts nothing)
            windows.sort(reverse=True)
        ordered = sorted(af)
        slot.state = (slot.version, ordered, free, windows)
        return ordered, free, windows

    def _sync(self, size: int, af_heap: list, hole_heap: list) -> None:
        """Push the current entries of the slots re-indexed since the heaps of ``size``
        were last brought up to date, once per slot (its last entry in ``dirty``):
        (size-th smallest free-from time, GPUs free by then, slot, version) when the
        slot ever has ``size`` GPUs free, and (-window, slot, version) when it can run
        ``size`` GPUs now only by using holes (sizes up to ``free`` are served by the af
        heap; beyond that a job must end before the shortest hole it uses closes).

        A heap holds, for each slot, its one entry of the slot's current version (older
        ones are stale and dropped when they come on top): pushing a slot's entries when
        a job of ``size`` next asks, instead of onto every size's heaps at every
        re-index, leaves the same current entries, so the same answers, with fewer pushes
        (a slot held, given back and reserved again between two questions of a size is
        pushed once) and fewer stale entries."""
        dirty, slots = self.dirty, self.slots
        for at in range(self.synced[size], len(dirty)):
            idx = dirty[at]
            slot = slots[idx]
            if slot.dirty_at != at:
                continue  # re-indexed again later: that entry pushes its state
            ordered, free, windows = self._state(slot)
            version = slot.version
            if size <= len(ordered):
                key = ordered[size - 1]
                if key != INF:
                    heappush(af_heap, (key, _free_by(ordered, size, key), idx, version))
            if free < size <= free + len(windows):
                heappush(hole_heap, (-windows[size - free - 1], idx, version))
        self.synced[size] = len(dirty)

    def nodes_with_at_least(self, gpus: int) -> int:
        """How many nodes of the slice have at least ``gpus`` GPUs (busy or not)."""
        return len(self.sizes) - bisect_left(self.sizes, gpus)

    # -- keeping the heaps current ----------------------------------------------------

    def refresh(self, slot: NodeSlot) -> None:
        """Re-index ``slot`` after its GPUs changed; older heap entries become stale."""
        slot.touched = True
        slot.version += 1
        ordered, free, windows = self._state(slot)
        if self.heaps:  # its entries are pushed when a job size next asks (see _sync)
            slot.dirty_at = len(self.dirty)
            self.dirty.append(slot.idx)
        total = free + len(windows)
        self.buckets[slot.free_total] -= 1
        self.buckets[total] += 1
        self.idle += total - slot.free_total
        slot.free_total = total
        if self.blocks:
            number = self.block_of[slot.idx]
            if number >= 0:
                self.block_stamp[number] += 1
                self.block_idle[number] += free - self._slot_idle[slot.idx]
                if self._block_heaps:  # pushed when a shape next asks (_block_heaps_of)
                    self._block_dirty_at[number] = len(self.block_dirty)
                    self.block_dirty.append(number)
            self._slot_idle[slot.idx] = free

    def _top(self, heap: list):
        """The best current entry of ``heap``, dropping stale entries (None if empty)."""
        slots = self.slots
        while heap:
            entry = heap[0]
            idx: int = entry[-2]  # typed: the slot's version is then read directly
            if slots[idx].version == entry[-1]:
                return entry
            heappop(heap)
        return None

    def _gather(self, heap: list, count: int, accept, chosen: dict, popped: list) -> None:
        """Pop valid entries of distinct slots accepted by ``accept`` into ``chosen``."""
        slots = self.slots
        while len(chosen) < count and heap:
            entry = heappop(heap)
            idx: int = entry[-2]
            if slots[idx].version != entry[-1]:
                continue
            popped.append((heap, entry))
            if not accept(entry):
                break  # heap order: nothing further qualifies
            chosen.setdefault(entry[-2], slots[entry[-2]])

    # -- queries ---------------------------------------------------------------------

    def find_now(
        self, gpus: int, nodes: int, end: float, patience: float = NO_TOPOLOGY
    ) -> list[NodeSlot] | None:
        """Slots that can run ``nodes`` x ``gpus`` now until ``end`` without delaying a
        reservation; holes first (only short jobs fit there), then best-fit idle GPUs
        (where the slice has blocks, with the topology and ``patience`` of the module
        doc)."""
        if gpus > self.largest:
            return None
        # A search that failed for jobs ending at ``no_fit`` fails for those ending later
        # (absent: none failed; an unlimited job ends at INF and may still fit now).
        no_fit = self._no_fit.get((gpus, nodes))
        if no_fit is not None and end >= no_fit:
            return None
        if not self.blocks:
            found = self._find_now(gpus, nodes, end)
        elif nodes == 1:
            found = self._pack_now(gpus, end)
        elif patience >= 0 and self.block_could_hold(gpus, nodes):
            # As no_fit, for the search inside one block.
            no_block = self._no_block_fit.get((gpus, nodes))
            found = None
            if no_block is None or end < no_block:
                found = self._block_now(gpus, nodes, end)
                if found is None:
                    self._no_block_fit[(gpus, nodes)] = end
            if found is None:
                if patience > 0:
                    return None  # waits for a block (not a failure of the search)
                found = self._find_now(gpus, nodes, end)
        else:
            found = self._find_now(gpus, nodes, end)
        if found is None:
            self._no_fit[(gpus, nodes)] = end
        return found

    def _find_now(self, gpus: int, nodes: int, end: float) -> list[NodeSlot] | None:
        now = self.now
        af_heap, hole_heap = self._heaps(gpus)
        if nodes == 1:
            entry = self._top(hole_heap)
            if entry is not None and -entry[0] >= end:
                return [self.slots[entry[1]]]
            entry = self._top(af_heap)
            if entry is not None and entry[0] <= now:
                return [self.slots[entry[2]]]
            return None
        chosen: dict[int, NodeSlot] = {}
        popped: list = []
        self._gather(hole_heap, nodes, lambda e: -e[0] >= end, chosen, popped)
        self._gather(af_heap, nodes, lambda e: e[0] <= now, chosen, popped)
        for heap, entry in popped:
            heappush(heap, entry)
        return list(chosen.values()) if len(chosen) >= nodes else None

    def earliest(
        self, gpus: int, nodes: int, patience: float = NO_TOPOLOGY
    ) -> tuple[float, list[NodeSlot]] | None:
        """Earliest time ``nodes`` slots each have ``gpus`` GPUs free for good, and those
        slots (None if never: not enough nodes, or GPUs held without end). With a
        ``patience`` on a slice with blocks: inside one block while there is patience
        left, else where earliest, one block first (see the module doc)."""
        if gpus > self.largest:
            return None
        if patience >= 0 and nodes > 1 and self.blocks and self.block_could_hold(gpus, nodes):
            inside = self._block_earliest(gpus, nodes)
            if patience > 0 and inside is not None:
                return inside
            spread = self.earliest(gpus, nodes)
            if spread is None or (inside is not None and inside[0] <= spread[0]):
                return inside
            return spread
        heap = self._heaps(gpus)[0]
        if nodes == 1:
            slots = self.slots
            while heap:  # the top entry, dropping stale ones (inlined: hot path)
                entry = heap[0]
                idx: int = entry[2]
                slot = slots[idx]
                if slot.version == entry[3]:
                    return entry[0], [slot]
                heappop(heap)
            return None
        chosen: dict[int, NodeSlot] = {}
        popped: list = []
        self._gather(heap, nodes, lambda e: True, chosen, popped)
        start = max((entry[0] for _, entry in popped), default=INF)
        for _, entry in popped:
            heappush(heap, entry)
        if len(chosen) < nodes:
            return None
        return start, list(chosen.values())

    # -- topology --------------------------------------------------------------------

    def block_could_hold(self, gpus: int, nodes: int) -> bool:
        """Whether some block has ``nodes`` nodes of at least ``gpus`` GPUs (busy or not)."""
        key = (gpus, nodes)
        known = self._block_holds.get(key)
        if known is None:
            known = False
            slots = self.slots
            for members in self.blocks:
                count = 0
                for idx in members:
                    if len(slots[idx].gpu_ids) >= gpus:
                        count += 1
                if count >= nodes:
                    known = True
                    break
            self._block_holds[key] = known
        return known

    def in_one_block(self, slots: list[NodeSlot], job: Any) -> bool:
        """Whether ``slots`` are all in one block, or the topology asks nothing of
        ``job`` (a pending job) here: no blocks, one node, or no block can hold it."""
        if not self.blocks or job.nodes <= 1:
            return True
        if not self.block_could_hold(job.gpus_per_node, job.nodes):
            return True
        first = self.block_of[slots[0].idx] if slots else -1
        same = first >= 0
        for slot in slots:  # a loop: all() of a generator is a generic call, compiled
            same = same and self.block_of[slot.idx] == first
        return same

    def most_free_in_block(self, gpus: int) -> int:
        """The most nodes of one block with ``gpus`` GPUs idle and unreserved now."""
        most = 0
        for number in range(len(self.blocks)):
            ready = self._block_view(number, gpus).ready
            if ready > most:
                most = ready
        return most

    def _block_view(self, number: int, gpus: int) -> _BlockView:
        """What block ``number`` offers jobs of ``gpus`` GPUs per node, as of its last
        change (worked out again only after one: see ``block_stamp``)."""
        views: list[_BlockView | None] | None = self._block_views.get(gpus)
        if views is None:
            views = [None] * len(self.blocks)
            self._block_views[gpus] = views
        view = views[number]
        stamp = self.block_stamp[number]
        if view is not None and view.stamp == stamp:
            return view
        view = views[number] = _BlockView(stamp)
        slots = self.slots
        now = self.now
        for idx in self.blocks[number]:
            ordered, free, windows = self._state(slots[idx])
            view.idle += free
            if len(ordered) < gpus:
                continue
            at = ordered[gpus - 1]
            if at != INF:
                view.timed.append((at, _free_by(ordered, gpus, at), idx))
                if at <= now:
                    view.ready += 1
            if free < gpus <= free + len(windows):
                view.holes.append((-windows[gpus - free - 1], idx))
        view.timed.sort()
        view.holes.sort()
        return view

    def _pack_now(self, gpus: int, end: float) -> list[NodeSlot] | None:
        """One slot that can run ``gpus`` GPUs now until ``end``: a hole first (as
        :meth:`_find_now`), else idle GPUs on a node of a block already partly in use
        or of no block before one of a block wholly idle, best fit inside each.

        The best fits come from the af heap in its order (best fit first); those of
        wholly idle blocks are passed over (the first kept in case no other fits), and
        put back with the others looked at."""
        af_heap, hole_heap = self._heaps(gpus)
        entry = self._top(hole_heap)
        if entry is not None and -entry[0] >= end:
            return [self.slots[entry[1]]]
        now = self.now
        slots = self.slots
        block_of, block_idle, block_gpus = self.block_of, self.block_idle, self.block_gpus
        found: NodeSlot | None = None
        whole: NodeSlot | None = None  # the best fit of a wholly idle block
        popped: list = []
        while af_heap:
            entry = heappop(af_heap)
            idx: int = entry[2]
            slot = slots[idx]
            if slot.version != entry[3]:
                continue  # stale: dropped, as _top does
            popped.append(entry)
            if entry[0] > now:
                break  # heap order: no node further on has the GPUs idle now
            number = block_of[idx]
            if number < 0 or block_idle[number] != block_gpus[number]:
                found = slot
                break
            if whole is None:
                whole = slot
        for entry in popped:
            heappush(af_heap, entry)
        if found is None:
            found = whole
        return None if found is None else [found]

    def _block_heaps_of(self, gpus: int, nodes: int) -> tuple[list, list]:
        """The block heaps of jobs of ``nodes`` x ``gpus``, brought up to date with the
        blocks changed since they were last asked (each block's one current entry;
        older ones are stale, as in the slot heaps):

        - now: (GPUs idle now, first slot, block, stamp) of the blocks with enough
          slots that have the GPUs idle or in holes now (holes long enough for a job
          or not: that is for the search to tell);
        - earliest: (when ``nodes`` of its slots have the GPUs free for good, GPUs
          idle now, first slot, block, stamp)."""
        key = (gpus, nodes)
        heaps = self._block_heaps.get(key)
        if heaps is None:
            heaps = ([], [], [len(self.block_dirty)])
            self._block_heaps[key] = heaps
            for number in range(len(self.blocks)):
                self._push_block(number, gpus, nodes, heaps[0], heaps[1])
            heapify(heaps[0])
            heapify(heaps[1])
            return heaps[0], heaps[1]
        synced = heaps[2]
        dirty, dirty_at = self.block_dirty, self._block_dirty_at
        for at in range(synced[0], len(dirty)):
            number = dirty[at]
            if dirty_at[number] == at:  # its last change: the entries of its state now
                self._push_block(number, gpus, nodes, heaps[0], heaps[1], True)
        synced[0] = len(dirty)
        return heaps[0], heaps[1]

    def _push_block(
        self,
        number: int,
        gpus: int,
        nodes: int,
        now_heap: list,
        earliest_heap: list,
        push: bool = False,
    ) -> None:
        """Enter block ``number``'s current entries in the block heaps (``push``: with
        heappush, else appended for a heapify)."""
        members = self.blocks[number]
        if len(members) < nodes:
            return
        view = self._block_view(number, gpus)
        stamp = view.stamp
        if view.ready + len(view.holes) >= nodes:
            entry = (view.idle, members[0], number, stamp)
            if push:
                heappush(now_heap, entry)
            else:
                now_heap.append(entry)
        timed = view.timed
        if len(timed) >= nodes:
            later = (timed[nodes - 1][0], view.idle, members[0], number, stamp)
            if push:
                heappush(earliest_heap, later)
            else:
                earliest_heap.append(later)

    def _block_now(self, gpus: int, nodes: int, end: float) -> list[NodeSlot] | None:
        """``nodes`` slots of one block that can run ``gpus`` GPUs each now until
        ``end`` (holes first, longest first, then best-fit idle GPUs), in the block left
        with the fewest idle GPUs (the first block on a tie); None if no block can now.
        The blocks come from the block heap in that order; those that could hold it
        only with holes too short for it are passed over (and put back)."""
        heap = self._block_heaps_of(gpus, nodes)[0]
        stamps = self.block_stamp
        best: _BlockView | None = None
        popped: list = []
        while heap:
            entry = heappop(heap)
            number: int = entry[2]
            if stamps[number] != entry[3]:
                continue  # stale: dropped
            popped.append(entry)
            view = self._block_view(number, gpus)
            count = view.ready
            if count < nodes:
                for hole in view.holes:  # longest window first
                    if -hole[0] < end:
                        break
                    count += 1
            if count >= nodes:
                best = view
                break
        for entry in popped:
            heappush(heap, entry)
        if best is None:
            return None
        slots = self.slots
        chosen: list[NodeSlot] = []
        for hole in best.holes:
            if len(chosen) == nodes or -hole[0] < end:
                break
            chosen.append(slots[hole[1]])
        for item in best.timed:
            if len(chosen) == nodes:
                break
            chosen.append(slots[item[2]])
        return chosen

    def _block_earliest(self, gpus: int, nodes: int) -> tuple[float, list[NodeSlot]] | None:
        """Earliest time ``nodes`` slots of one block each have ``gpus`` GPUs free for
        good, and those slots (the block with the fewest idle GPUs on a tie, then the
        first): the top of the block heap."""
        heap = self._block_heaps_of(gpus, nodes)[1]
        stamps = self.block_stamp
        while heap:
            entry = heap[0]
            number: int = entry[3]
            if stamps[number] == entry[4]:
                slots = self.slots
                timed = self._block_view(number, gpus).timed
                return entry[0], [slots[item[2]] for item in timed[:nodes]]
            heappop(heap)
        return None

    def fits_ignoring_reservations(self, gpus: int, nodes: int) -> bool:
        """Whether the job would fit on the GPUs idle now if nothing were reserved."""
        buckets = self.buckets
        if gpus >= len(buckets):
            return False
        found = 0
        # A loop over the sizes: the builtin sum of a slice is a generic call, compiled.
        for size in range(gpus, len(buckets)):
            found += buckets[size]
        return found >= nodes

    def largest_idle_block(self) -> int:
        """The most GPUs idle now on one node of the slice."""
        for size in range(len(self.buckets) - 1, 0, -1):
            if self.buckets[size]:
                return size
        return 0

    # -- changes -----------------------------------------------------------------------

    def take_now(
        self, slot: NodeSlot, gpus: int, end: float, positions: list[int] | None = None
    ) -> list[int]:
        """Start a job on ``gpus`` GPUs of ``slot`` (or on ``positions``, checked by the
        caller) now until ``end``; returns the positions."""
        now = self.now
        af = slot.af
        hole = slot.hole
        if positions is None:
            in_holes = sorted(
                (hole[pos], pos) for pos in range(len(af)) if af[pos] > now and hole[pos] >= end
            )
            positions = [pos for _, pos in in_holes[:gpus]]
            if len(positions) < gpus:
                idle = [pos for pos in range(len(af)) if af[pos] <= now]
                positions.extend(idle[: gpus - len(positions)])
        for pos in positions:
            if af[pos] <= now:
                af[pos] = end
            else:
                hole[pos] = 0.0  # busy now, still promised from the reservation's start
                slot.lent[pos] = max(slot.lent[pos], end)
        self.refresh(slot)
        return positions

    def choose_reserved(self, slot: NodeSlot, gpus: int, start: float) -> list[int]:
        """The GPUs a reservation at ``start`` would take: free by then, latest first (so
        that GPUs idle now stay usable now)."""
        af = slot.af
        ready = sorted((af[pos], pos) for pos in range(len(af)) if af[pos] <= start)
        return [pos for _, pos in ready[-gpus:]]

    def reserve(
        self, slot: NodeSlot, positions: list[int], start: float, end: float, owner: int
    ) -> None:
        """Promise ``positions`` of ``slot`` to job ``owner`` from ``start`` to ``end``."""
        now = self.now
        af = slot.af
        made_hole = False
        for pos in positions:
            if af[pos] <= now and start > now:
                slot.hole[pos] = start
                slot.hole_owner[pos] = owner
                made_hole = True
            af[pos] = end
            slot.reserved[pos] = True
            # Whoever waits for this GPU from now on waits for this job, not for a stop.
            slot.releasing[pos] = False
        if made_hole:
            self.hole_owners.append((owner, start))
        self.refresh(slot)

    def unhold(
        self,
        slot: NodeSlot,
        positions: list[int],
        ready: list[float],
        before: list[tuple[bool, float, int, bool]],
    ) -> None:
        """Undo a :meth:`reserve` made to hold a reservation: each GPU is free again from
        ``ready`` (or from the end of a job started in the hole meanwhile) and is again
        what it was ``before`` the hold (reserved, hole, hole owner, releasing): the
        promise of a job considered before the hold is still due."""
        if not (len(positions) == len(ready) == len(before)):
            raise ValueError("unhold: positions, ready times and states differ in length")
        lent, af, holes = slot.lent, slot.af, slot.hole
        owners, reserved_, releasing_ = slot.hole_owner, slot.reserved, slot.releasing
        # Indexed rather than zip(): the builtin zip is a generic call, compiled.
        for i in range(len(positions)):
            pos, when = positions[i], ready[i]
            reserved, hole, owner, releasing = before[i]
            busy_until = lent[pos]
            af[pos] = max(when, busy_until) if busy_until else when
            # A job started in the hole meanwhile: busy now, no hole left.
            holes[pos] = 0.0 if busy_until else hole
            owners[pos] = owner
            reserved_[pos] = reserved
            releasing_[pos] = releasing and not busy_until
        self.epoch += 1
        self._no_fit.clear()
        self._no_block_fit.clear()
        self.refresh(slot)
        self.grown.append(slot.idx)

    def touch(self, slot: NodeSlot) -> None:
        """``slot``'s held GPUs were given back and taken again, leaving it as it was
        (:meth:`PreviousReservations.release_and_rehold`): what :meth:`unhold` voids is
        void all the same, and the slot counts as changed (``marks``), so that a cycle
        ends (``.settled``) as if they had been, and caches learnt from "only ever
        shrinks" are dropped at the same points."""
        slot.marks += 1
        self.epoch += 1
        self._no_fit.clear()
        self._no_block_fit.clear()
        self.grown.append(slot.idx)

    def release_at(
        self, slot: NodeSlot, positions: list[int], when: float, releasing: bool = True
    ) -> None:
        """GPUs of ``slot`` held by a job that is being stopped become free at ``when``
        (``releasing`` False: GPUs that were only kept for a job, idle at ``when``)."""
        for pos in positions:
            slot.af[pos] = when
            slot.releasing[pos] = releasing
        if when <= self.now:
            self._no_fit.clear()  # idle now: a size that did not fit now may
            self._no_block_fit.clear()
        self.refresh(slot)


class Locator:
    """Where the GPUs of the cycle's cluster index are: a GPU id's (slice, slot,
    position), and the GPUs of a job grouped by node slot.

    Records the simulator hands to cycle after cycle (a running job's GPUs, a waiting
    job's kept reservation) carry the same GPU ids each time, and nodes are the same
    objects with the same lists of GPU ids (:meth:`NodeInfo.kinds`): the grouping of
    a record's ids by those lists is remembered on the record (``layout``), so that
    later cycles map each list to its slot instead of every GPU id to its location. On
    an index kept between cycles (:class:`KeptCluster`) the slots are the same objects
    from cycle to cycle, so the placement found is remembered too.
    The GPU id map itself is built on first use only.
    """

    __slots__ = ("_slots", "_location", "kept")

    def __init__(self) -> None:
        self._slots: dict[int, tuple[SliceIndex, NodeSlot]] = {}  # id(slot.gpu_ids) ->
        self._location: dict[int, tuple[SliceIndex, NodeSlot, int]] | None = None
        # Kept between cycles with its slices (KeptCluster): a record's placement, found
        # once, is remembered on the record with it (the slots are the same objects).
        self.kept = False

    def add(self, slice_: SliceIndex, slot: NodeSlot) -> None:
        self._slots[id(slot.gpu_ids)] = (slice_, slot)

    def locate(self, gpu_id: int) -> tuple[SliceIndex, NodeSlot, int] | None:
        """(slice, slot, position) of a GPU (None: not schedulable in this cycle)."""
        location = self._location
        if location is None:
            location = self._location = {}
            for slice_, slot in self._slots.values():
                for pos, known in enumerate(slot.gpu_ids):
                    location[known] = (slice_, slot, pos)
        return location.get(gpu_id)

    def group(self, gpu_ids: tuple[int, ...]) -> list[tuple[SliceIndex, NodeSlot, list[int]]]:
        """The GPUs by node slot, in order of first GPU (GPUs not found are left out)."""
        by_slot: dict[int, tuple[SliceIndex, NodeSlot, list[int]]] = {}
        locate = self.locate
        for gpu_id in gpu_ids:
            location = locate(gpu_id)
            if location is None:
                continue
            slice_, slot, pos = location
            entry = by_slot.get(id(slot))
            if entry is None:
                by_slot[id(slot)] = (slice_, slot, [pos])
            else:
                entry[2].append(pos)
        return list(by_slot.values())

    def placement(
        self, record, gpu_ids: tuple[int, ...]
    ) -> list[tuple[SliceIndex, NodeSlot, list[int]]]:
        """:meth:`group` of ``gpu_ids``, the ids of ``record`` (a job record with a
        ``layout`` attribute, where the grouping is remembered for later cycles)."""
        layout = record.layout
        if layout is not None and (layout[0] is gpu_ids or layout[0] == gpu_ids):
            if layout[2] is self:
                return layout[3]  # found on this kept index in an earlier cycle
            slots = self._slots
            found = []
            for kind, positions in layout[1]:
                entry = slots.get(id(kind))
                if entry is None:
                    break  # a node not in this cycle's index: group afresh
                found.append((entry[0], entry[1], positions))
            else:
                if self.kept:
                    record.layout = (layout[0], layout[1], self, found)
                return found
        grouped = self.group(gpu_ids)
        if sum(len(positions) for _, _, positions in grouped) == len(gpu_ids):
            kinds = [(slot.gpu_ids, positions) for _, slot, positions in grouped]
            record.layout = (
                (gpu_ids, kinds, self, grouped) if self.kept else (gpu_ids, kinds, None, None)
            )
        return grouped


class KeptCluster:
    """A cluster index kept from one cycle to the next by a caller that plans the same
    nodes again and again (the simulator hands one per pool in every snapshot,
    ``Snapshot.kept_cluster``): the slices, their node slots and the locator are built
    for the first cycle and, in each later cycle with the very same nodes (the same
    objects in the same order; nodes are not changed once made), reset to every GPU idle
    instead of built anew. A reset index is what a new one would be with the running
    jobs that stayed the same since the cycle before marked (``running``: the cycle's
    KeptRunning, which brings them in line with the snapshot): the planner then marks
    the other running jobs, claims and reservations on it as on a new one. None of a
    cycle's own state is kept. With other nodes it is built anew and kept."""

    __slots__ = ("nodes", "slices", "pool_slices", "locator", "running")

    def __init__(self) -> None:
        self.nodes: list | None = None
        self.slices: dict[tuple[str, str, int], SliceIndex] = {}
        self.pool_slices: dict[str, list[SliceIndex]] = {}
        self.locator = Locator()
        # The running jobs kept from one cycle to the next with this index (the
        # cycle's KeptRunning; None: none yet), their GPUs in the slots' base_af.
        self.running: Any = None

    def reuse(self, nodes: list, now: float) -> bool:
        """Reset the kept index for a cycle at ``now`` if it was built for ``nodes``."""
        kept = self.nodes
        if kept is None or len(kept) != len(nodes):
            return False
        for mine, theirs in zip(kept, nodes, strict=True):
            if mine is not theirs:
                return False
        for slice_ in self.slices.values():
            slice_.reset(now)
        return True

    def keep(
        self,
        nodes: list,
        slices: dict[tuple[str, str, int], SliceIndex],
        pool_slices: dict[str, list[SliceIndex]],
        locator: Locator,
    ) -> None:
        """Keep the index just built for ``nodes``."""
        self.nodes = list(nodes)
        self.slices = slices
        self.pool_slices = pool_slices
        self.locator = locator
        locator.kept = True
        self.running = None  # kept for the slots of the index before
