"""Allocations per memory: finding, growing (merging), freeing and scratch space.

Per buffer and memory, allocations are boxes that only grow: a need outside every
allocation merges the ones it touches into one (copying only the up-to-date data),
and lookahead's anticipated boxes are merged in up front so that a growing access
pattern allocates once.
"""
from __future__ import annotations

import logging

import numpy as np

from .geometry import Box, Region, RegionMap
from .instruction_graph import AllocInstruction, CopyInstruction, FreeInstruction, HOST_MEMORY

log = logging.getLogger("celeritas.instruction_graph")

_NO_READERS: frozenset = frozenset()

# dependency origin of a free on its allocation's users
DEP_ALLOCATION = "allocation_lifetime"
PRIORITY_COPY = 1
FREQUENT_ALLOCATION_THRESHOLD = 10


class Allocation:
    # access: per point (last writer instruction or None, instructions that read since),
    # one map so that a read or a write is a single pass over it
    __slots__ = ("id", "memory", "box", "access", "dims")

    def __init__(self, aid: int, memory: int, box: Box, creator: int | None):
        self.id = aid
        self.memory = memory
        self.box = box
        self.dims = box.dims
        self.access = RegionMap(box, (creator, _NO_READERS))

    def users(self) -> set[int]:
        out = set()
        for w, rs in self.access.values():
            if w is not None:
                out.add(w)
            out |= rs
        return out




class MemoryManagement:
    """Mixin of the instruction graph generator: its allocations (uses its buffers,
    id counters and instruction emission)."""

    def _find_alloc(self, b, memory: int, box: Box) -> Allocation | None:
        """The first allocation on ``memory`` that contains ``box``."""
        allocs = b.allocs.get(memory)
        if not allocs:
            return None
        for a in allocs:
            if a.box.contains(box):
                return a
        return None

    def _allocate(self, b, memory: int, box: Box, discard: Region | None = None) -> Allocation:
        """An allocation on ``memory`` containing ``box``, resizing (merging) if needed."""
        found = self._find_alloc(b, memory, box)
        if found is not None:
            return found
        allocs = b.allocs.setdefault(memory, [])
        target = box
        antic = b.anticipated.get(memory, ())
        changed = True
        merge: list[Allocation] = []
        while changed:
            changed = False
            for ab in antic:
                if not target.contains(ab) and target.touches(ab):
                    target = target.bounding(ab)
                    changed = True
            for a in allocs:
                if a not in merge and a.box.intersects(target):
                    merge.append(a)
                    if not target.contains(a.box):
                        target = target.bounding(a.box)
                    changed = True
        target = target & b.info.box if not b.info.box.empty else target
        aid = self._new_alloc_id()
        ins = AllocInstruction(self._new_id(), allocation=aid, memory=memory, buffer=b.info.id,
                               box=target, shape=target.range, dtype=b.dtype,
                               size_bytes=target.area * b.itemsize)
        self._emit(ins)
        new = Allocation(aid, memory, target, ins.id)
        n = b.alloc_counts.get(memory, 0) + 1
        b.alloc_counts[memory] = n
        if n >= FREQUENT_ALLOCATION_THRESHOLD and not b.warned:
            b.warned = True
            log.warning("buffer %s was allocated %d times on memory %d: its access pattern grows; "
                        "lookahead 'auto' or 'infinite' allocates once instead", b.info.label, n, memory)
        newest_here = b.newest.region_of(lambda v: v is not None and memory in v[1])
        if memory == HOST_MEMORY:
            for p in b.pending:
                newest_here = newest_here - p.region
        for old in sorted(merge, key=lambda a: a.id):
            keep = Region.from_box(old.box) & newest_here
            if discard is not None:
                keep = keep - discard
            for cbox in keep:
                cp = CopyInstruction(self._new_id(), source=old.id, dest=aid, source_memory=memory,
                                     dest_memory=memory, buffer=b.info.id, box=cbox, source_box=old.box,
                                     dest_box=target, size_bytes=cbox.area * b.itemsize,
                                     priority=PRIORITY_COPY)
                self._read(old, cbox, cp)
                self._write(new, cbox, cp)
                self._emit(cp)
            allocs.remove(old)
            self._free(old)
        allocs.append(new)
        return new

    def _free(self, a: Allocation) -> None:
        ins = FreeInstruction(self._new_id(), allocation=a.id, memory=a.memory)
        ins.deps.extend((u, DEP_ALLOCATION) for u in sorted(a.users()))
        self._emit(ins)

    def _scratch(self, memory: int, box: Box, dtype: np.dtype) -> Allocation:
        aid = self._new_alloc_id()
        ins = AllocInstruction(self._new_id(), allocation=aid, memory=memory, buffer=None, box=box,
                               shape=(box.area,), dtype=dtype, size_bytes=box.area * dtype.itemsize)
        self._emit(ins)
        return Allocation(aid, memory, box, ins.id)


