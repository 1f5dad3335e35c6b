"""Allocations per memory: finding, growing (merging), freeing, scratch space, and
keeping device memories within their capacity (out-of-core execution).

Per buffer and memory, allocations are boxes that only grow: a need outside every
allocation merges the ones it touches into one (copying only the up-to-date data),
and lookahead's anticipated boxes are merged in up front so that a growing access
pattern allocates once.

A memory with a capacity (``SystemInfo.capacities``: device memories; host memory
is unbounded) never gets an allocation beyond it.  When the next allocation needs
room, allocations that the command being compiled does not use are freed: first
those whose data is also newest elsewhere (nothing to save), then the least
recently used, whose data only this memory holds being copied to host memory
first (an *eviction*).  Every allocation on such a memory depends on the frees
emitted before it (and on the previous allocation), so that however the executor
orders independent work, the memory never holds more than the generator planned.
Chunks whose working set exceeds the capacity are split into batches by the chunk
planner (``device_chunks``).
"""
from __future__ import annotations

import logging

import numpy as np

from .errors import OutOfMemoryError
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
    __slots__ = ("id", "memory", "box", "access", "dims", "nbytes")

    def __init__(self, aid: int, memory: int, box: Box, creator: int | None, nbytes: int = 0):
        self.id = aid
        self.memory = memory
        self.box = box
        self.dims = box.dims
        self.nbytes = nbytes
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
        # (Box.contains_box inlined: every access of every command asks, several times)
        lo, hi = box.lo, box.hi
        if hi[0] <= lo[0]:   # the empty box
            return allocs[0]
        for a in allocs:
            al, ah = a.box.lo, a.box.hi
            if (al[0] <= lo[0] and hi[0] <= ah[0] and al[1] <= lo[1] and hi[1] <= ah[1]
                    and al[2] <= lo[2] and hi[2] <= ah[2]):
                return a
        return None

    def _allocate(self, b, memory: int, box: Box, discard: Region | None = None,
                  anticipate: bool = True) -> Allocation:
        """An allocation on ``memory`` containing ``box``, resizing (merging) if needed; with
        ``anticipate`` the boxes lookahead anticipates are allocated along."""
        found = self._find_alloc(b, memory, box)
        if found is not None:
            return found
        allocs = b.allocs.setdefault(memory, [])
        cap = self._capacity.get(memory)
        if cap is not None:
            target, merge = self._bounded_target(b, memory, box, cap, anticipate)
            self._pinned.update(a.id for a in merge)   # (copied from below: not evictable meanwhile)
        else:
            target = box
            antic = b.anticipated.get(memory, ())
            changed = True
            merge: list[Allocation] = []
            while changed:
                changed = False
                for ab in antic:
                    if not target.contains_box(ab) and target.touches(ab):
                        target = target.bounding(ab)
                        changed = True
                for a in allocs:
                    if a not in merge and a.box.intersects(target):
                        merge.append(a)
                        if not target.contains_box(a.box):
                            target = target.bounding(a.box)
                        changed = True
        target = target & b.info.box if not b.info.box.empty else target
        nbytes = target.area * b.itemsize
        aid = self._new_alloc_id()
        ins = AllocInstruction(self._new_id(), allocation=aid, memory=memory, buffer=b.info.id,
                               box=target, shape=target.range, dtype=b.dtype, size_bytes=nbytes)
        if cap is not None:
            self._reserve(memory, nbytes, ins, (b,))
        self._emit(ins)
        new = Allocation(aid, memory, target, ins.id, nbytes)
        if cap is not None:
            self._pinned.add(aid)
        # (the host allocations evictions save a device's data to are one per evicted piece,
        # as many as a chunk has batches: no access pattern grows there, and no lookahead
        # mode would allocate them once; batches reallocate on the bounded memory itself)
        n = b.alloc_counts.get(memory, 0) + (not self._evicting)
        b.alloc_counts[memory] = n
        if n >= FREQUENT_ALLOCATION_THRESHOLD and not b.warned and cap is None:
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
        antic = b.anticipated.get(memory)
        if antic:
            # anticipated boxes the allocation holds are met: dropped, so that the buffer's
            # state (a replay shape) is the same as once lookahead's window is flushed
            left = [ab for ab in antic if not target.contains_box(ab)]
            if len(left) != len(antic):
                if left:
                    b.anticipated[memory] = left
                else:
                    del b.anticipated[memory]
        return new

    def _free(self, a: Allocation) -> None:
        ins = FreeInstruction(self._new_id(), allocation=a.id, memory=a.memory)
        ins.deps.extend((u, DEP_ALLOCATION) for u in sorted(a.users()))
        self._emit(ins)
        memory = a.memory
        if memory in self._capacity:
            self._used[memory] -= a.nbytes
            self._frees_since[memory].append(ins.id)
            self._pinned.discard(a.id)

    def _scratch(self, memory: int, box: Box, dtype: np.dtype) -> Allocation:
        aid = self._new_alloc_id()
        nbytes = box.area * dtype.itemsize
        ins = AllocInstruction(self._new_id(), allocation=aid, memory=memory, buffer=None, box=box,
                               shape=(box.area,), dtype=dtype, size_bytes=nbytes)
        if memory in self._capacity:
            self._reserve(memory, nbytes, ins, ())
        self._emit(ins)
        if memory in self._capacity:
            self._pinned.add(aid)
        return Allocation(aid, memory, box, ins.id, nbytes)

    # ---- capacity -------------------------------------------------------------------------
    def _reserve(self, memory: int, nbytes: int, ins: AllocInstruction, buffers: tuple) -> None:
        """Make room for ``ins`` (not yet emitted) on a memory with a capacity, and order it
        after the frees that made the room."""
        cap = self._capacity[memory]
        if self._used[memory] + nbytes > cap:
            self._make_room(memory, nbytes, buffers)
        self._used[memory] += nbytes
        ins.deps.extend((f, DEP_ALLOCATION) for f in self._frees_since[memory])
        last = self._last_alloc.get(memory)
        if last is not None:
            ins.deps.append((last, DEP_ALLOCATION))
        barrier = self._batch_barrier.get(memory)
        if barrier is not None:
            ins.deps.append((barrier, DEP_ALLOCATION))
        self._frees_since[memory] = []
        self._last_alloc[memory] = ins.id

    def _bounded_target(self, b, memory: int, box: Box, cap: int, anticipate: bool) -> tuple[Box, list]:
        """The box to allocate on a memory with a capacity.  It is merged with intersecting
        allocations (and anticipated boxes) only while the merged allocation fits in what
        is free now: making room would evict older data just to keep more of it, and a
        chunk split into batches would grow one allocation over all of them.  Intersecting
        allocations not merged are evicted (the current command's own are always merged).
        A growth that reaches into a box of the buffer the command allocates after this one
        (``_pending_groups``) counts that box too: its allocation would have to merge this
        one, pinned by then, whether or not that fits."""
        itemsize = b.itemsize
        free = cap - self._used[memory] - self._coming.get(memory, 0)
        allocs = b.allocs.get(memory, [])
        antic = b.anticipated.get(memory, ()) if anticipate else ()
        pinned = self._pinned
        pending = self._pending_groups
        target = box
        merge: list[Allocation] = []
        changed = True
        while changed:
            changed = False
            for a in allocs:
                if a not in merge and a.box.intersects(target):
                    grown = target if target.contains_box(a.box) else target.bounding(a.box)
                    # (what the growth reaches is merged too: the command's later boxes, and its
                    # own allocations, pinned, which would have to be merged whether or not it fits)
                    if a.id not in pinned and _room(grown, pending + [x.box for x in allocs if x.id in pinned
                                                                      and x not in merge]) * itemsize > free:
                        continue   # evicted below instead of merged
                    merge.append(a)
                    target = grown
                    changed = True
            for ab in antic:
                if not target.contains_box(ab) and target.touches(ab):
                    grown = target.bounding(ab)
                    # (not over an allocation the command uses and this one does not merge: it
                    # would be evicted below; what else it reaches is merged on the next round)
                    if _room(grown, pending) * itemsize <= free and not any(
                            a.id in pinned and a not in merge and a.box.intersects(grown) for a in allocs):
                        target = grown
                        changed = True
        for a in list(allocs):
            if a not in merge and a.box.intersects(target):
                self._evict(b, a)
        return target, merge

    def _make_room(self, memory: int, nbytes: int, buffers: tuple) -> None:
        """Free allocations on ``memory`` until ``nbytes`` more fit: those whose data is not
        only here first, then the least recently used (their data saved to host memory)."""
        cap = self._capacity[memory]
        # any buffer may lose an allocation here, not only the command's: replay may have
        # left some as shapes (their objects behind), so they are brought up to date first
        self._sync_buffers(None)
        cands = []
        for b in self._buffers.values():
            for a in b.allocs.get(memory, ()):
                if a.id in self._pinned:
                    continue
                users = a.users()
                cands.append((self._sole_region(b, a).empty is False, max(users) if users else -1, a.id, b, a))
        cands.sort(key=lambda c: c[:3])
        for _needed, _last, _aid, b, a in cands:
            if self._used[memory] + nbytes <= cap:
                return
            self._evict(b, a)
        if self._used[memory] + nbytes > cap:
            task = self._compiling_task
            what = f"{task.label}" if task is not None else "the scheduler"
            names = ", ".join(x.info.label for x in buffers) or "scratch space"
            held = [f"{x.info.label} {a.box} ({a.nbytes} B)" for x in self._buffers.values()
                    for a in x.allocs.get(memory, ()) if a.id in self._pinned]
            raise OutOfMemoryError(
                f"{what} needs {nbytes} bytes on memory M{memory} (device {memory - 2}) for {names}, but the "
                f"device's capacity is {cap} bytes and {self._used[memory]} are held by allocations this task "
                f"itself uses{' (' + ', '.join(held) + ')' if held else ''}; split the work into smaller chunks (more ranks or devices, cl.oversubscribe) or "
                f"raise CELERITAS_DEVICE_MEMORY_LIMIT / CELERITAS_HOST_DEVICE_MEMORY")

    @staticmethod
    def _sole_region(b, a: Allocation) -> Region:
        """Where ``a`` holds the only copy of the newest data."""
        memory = a.memory
        parts = [box for box, v in b.newest.query(a.box) if v is not None and len(v[1]) == 1 and memory in v[1]]
        if not parts:
            return Region.empty_region(a.box.dims)
        return Region(parts)

    def _evict(self, b, a: Allocation) -> None:
        """Save what only ``a`` holds to host memory, then free it."""
        memory = a.memory
        sole = self._sole_region(b, a)
        if sole:
            self._evicting = True   # (labels the copies: see _copy_between)
            try:
                self._make_coherent(b, HOST_MEMORY, sole)
            finally:
                self._evicting = False
            self.memory_stats["bytes_written_back"] += sole.area * b.itemsize

        def drop(v):
            if v is None or memory not in v[1]:
                return v
            holders = v[1] - {memory}
            producer = v[0] if v[0] in holders else (HOST_MEMORY if HOST_MEMORY in holders else max(holders))
            return (producer, holders)

        b.newest.apply(a.box, drop)
        b.allocs[memory].remove(a)
        self._shapes.pop(b.info.id, None)   # (its replay shape, if any, is no longer its state)
        self._free(a)
        self.memory_stats["evictions"] += 1
        self.memory_stats["bytes_evicted"] += a.nbytes


def _room(box: Box, pending: list) -> int:
    """Elements an allocation of ``box`` takes, counting the later growth it forces: each
    box of ``pending`` it overlaps is merged into it when allocated, and that allocates the
    larger box while this one is still held (until its copy)."""
    full = box.grown_over(pending) if pending else box
    return box.area if full is box else box.area + full.area
