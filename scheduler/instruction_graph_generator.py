"""Lowers one rank's commands into instructions.

Per buffer and memory it keeps allocations (boxes that only grow, merged on
resize) and, per allocation, the last writer and the concurrent readers of every
region; per buffer a map of which memories hold the newest data.  Dependencies
come only from those maps, so independent work (kernels on different devices, a
send and a kernel, a copy and an unrelated kernel) stays concurrent.

Hot path (scheduler thread, every command): the writer and the readers live in one
region map per allocation, so a read or a write is one pass over it; device splits
are cached per command box; coherence first checks (without building canonical
boxes) whether anything is missing at all.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from itertools import count

import numpy as np

from . import command_graph as cg
from . import task_graph as tg
from .bounded_cache import BoundedCache
from .geometry import Box, Region, RegionMap, split_overlapping
from .horizons import EpochTracker, collapse_access, collapse_map
from .device_chunks import ChunkPlan, ChunkPlanning
from .instruction_replay import InstructionReplayMixin
from .memory import DEP_ALLOCATION, PRIORITY_COPY, Allocation, MemoryManagement
from .recorders import InstructionRecorder
from .replay import Chains, Replay
from .instruction_graph import (  # noqa: F401 - (the dependency origins, also imported from here)
    DEP_COLLECTIVE, DEP_EXECUTION_FRONT, DEP_LAST_EPOCH, DEP_READ, DEP_SIDE_EFFECT, DEP_SPLIT_RECEIVE, DEP_WRITE,
    HOST_MEMORY, USER_MEMORY, AccessAllocation, AllocInstruction, AwaitReceiveInstruction,
    CloneCollectiveGroupInstruction, CopyInstruction, DestroyHostObjectInstruction,
    DeviceKernelInstruction, EpochInstruction, FenceInstruction, FillIdentityInstruction,
    GatherReceiveInstruction, HorizonInstruction, HostTaskInstruction,
    Instruction, Pilot, ReceiveInstruction, ReduceInstruction, ReductionAllocation,
    SendInstruction, SplitReceiveInstruction, device_memory)

log = logging.getLogger("celeritas.instruction_graph")


PRIORITY_COMM = 2



@dataclass(slots=True)
class SystemInfo:
    """What the generator needs to know about the rank's hardware."""

    num_devices: int = 1
    # (source memory, destination memory) pairs that can copy directly; memories 0 and 1
    # can always copy to and from anything.  None = every pair is direct.
    peers: frozenset[tuple[int, int]] | None = None
    # memories the communicator can send from / receive into (None = all)
    comm_memories: frozenset[int] | None = frozenset((HOST_MEMORY,))
    # bytes each device memory may hold (absent: unbounded); host memory is never bounded
    capacities: dict[int, int] | None = None

    def can_copy(self, src: int, dst: int) -> bool:
        if src <= HOST_MEMORY or dst <= HOST_MEMORY or src == dst or self.peers is None:
            return True
        return (src, dst) in self.peers

    def comm_capable(self, memory: int) -> bool:
        return memory != USER_MEMORY and (self.comm_memories is None or memory in self.comm_memories)


_NO_READERS: frozenset = frozenset()
_CLONES = -1     # key of ``_collective`` (groups are >= 0): the last clone_collective_group


class _PendingReceive:
    __slots__ = ("transfer", "region")

    def __init__(self, transfer, region: Region):
        self.transfer = transfer
        self.region = region


class _Buffer:
    __slots__ = ("info", "allocs", "newest", "pending", "user", "anticipated", "dtype",
                 "itemsize", "alloc_counts", "warned")

    def __init__(self, info: tg.BufferInfo):
        self.info = info
        self.allocs: dict[int, list[Allocation]] = {}
        # per point: (producer memory, memories holding the newest data), None before any write
        self.newest = RegionMap(info.box, None)
        self.pending: list[_PendingReceive] = []
        self.user: Allocation | None = None
        self.anticipated: dict[int, list[Box]] = {}
        self.dtype = np.dtype(info.dtype)
        self.itemsize = self.dtype.itemsize
        self.alloc_counts: dict[int, int] = {}
        self.warned = False


class InstructionGraphGenerator(ChunkPlanning, MemoryManagement, InstructionReplayMixin):
    """Compiles commands of one rank into instructions and outbound pilots."""

    def __init__(self, system: SystemInfo, *, rank: int = 0, num_ranks: int = 1,
                 recorder: InstructionRecorder | None = None, lookahead_merge: bool = True,
                 diagnostics: str = tg.DIAG_WARN, replay: Replay | None = None, overlap_batches: bool = True):
        self.system = system
        self.diagnostics = diagnostics
        self.replay = replay
        self._shapes: dict = {}    # buffer -> its replay shape (see instruction_replay)
        self._stale: dict = {}     # buffers whose objects lag behind their replay shape
        self._allocated_memo = BoundedCache(4096)   # (shape, memory, box) -> allocated? (lookahead)
        self._builder_code = BoundedCache(1024)     # replay builders' source -> code (see _builder)
        self._makers: dict = {}     # instruction class -> the function replay builders make it by (see _maker)
        # out-of-core (see memory.py): capacity per bounded memory, bytes allocated there,
        # the frees since / the last allocation (allocations depend on them), the
        # allocations the command being compiled uses (never evicted for it)
        self._capacity: dict[int, int] = {m: c for m, c in (system.capacities or {}).items()
                                          if m > HOST_MEMORY and c is not None}
        self._used: dict[int, int] = {m: 0 for m in self._capacity}
        self._frees_since: dict[int, list[int]] = {m: [] for m in self._capacity}
        self._last_alloc: dict[int, int] = {}
        self._pinned: set[int] = set()
        self._evicting = False   # copies made now save data of an allocation being evicted
        # with overlap off (a benchmark baseline), a batch's allocations wait for the previous
        # batch's kernel on the memory, so batches run strictly one after the other
        self._overlap_batches = overlap_batches
        self._batch_barrier: dict[int, int] = {}
        self._coming: dict[int, int] = {}   # bytes the command's later allocations will need, per memory
        # boxes of the buffer being allocated that the command allocates after it, on that
        # (bounded) memory: a growth reaching into one must count it (``_bounded_target``)
        self._pending_groups: list = []
        self._compiling_task = None
        self.memory_stats = {"evictions": 0, "bytes_evicted": 0, "bytes_written_back": 0, "batches": 0,
                             "batched_chunks": 0}
        self._warned = False       # a diagnostic was logged while lowering (not memoized then)
        self._anticipation_misses = 0   # anticipate calls that found a box not allocated (see record_group)
        self._mapper_warned: set = set()   # (task name, buffer) already told of a mapper (_report_outside)
        # every device memory takes receives directly (CUDA-aware MPI or host devices asked
        # to): await-pushes then need no host allocation of their own
        self._direct_receives = system.num_devices > 0 and all(
            system.comm_capable(device_memory(d)) for d in range(system.num_devices))
        self.rank = rank
        self.num_ranks = num_ranks
        self.recorder = recorder
        self._next_instr = 0
        self._next_alloc = 1
        self._next_msg = 0
        self._buffers: dict[int, _Buffer] = {}
        self._horizons = EpochTracker()   # front (id -> None), current horizon, epoch for new
        self._garbage: list[int] = []
        self._host_objects: dict[int, int | None] = {}   # host object -> last instruction
        self._collective: dict[int, int | None] = {}     # group -> last instruction
        self._out: list[Instruction] = []
        self._pilots: list[Pilot] = []
        self._template_serials = count()    # replay templates' serial numbers (see compile)
        # the node of the chain of templates the state is at (None: none), and the task id of
        # the chain's last step (see InstructionReplayMixin._chain_key)
        self._chain: dict | None = None
        self._chain_tid = 0
        self._chains = Chains()
        self._counts: dict[str, int] = {}   # instructions lowered, per kind (see ``counts``)
        # replayed templates' instruction counts per kind (a tuple of (kind, n)) -> replays
        self._replayed_kinds: dict[tuple, int] = {}
        self._only = _Singletons()   # memory -> (memory, frozenset((memory,))), shared
        self._source_cache = BoundedCache(4096)      # (newest, destination) -> source memory
        self._plan_cache = BoundedCache(1024)        # see ``_plan_chunks``
        self._plan_token = object()   # marks replayed commands' memo cells filled under this plan cache
        self._coherence_cache = BoundedCache(4096)   # see ``_make_coherent``
        self._split_cache = BoundedCache(1024)       # see ``_local_split``

    # ---- objects ---------------------------------------------------------------
    def create_buffer(self, info: tg.BufferInfo) -> int | None:
        """Register a buffer; returns the id of its user allocation when host-initialized."""
        b = _Buffer(info)
        self._buffers[info.id] = b
        self._chain = None
        self._plan_cache.clear()   # (plans are keyed by buffer id, whose shape this fixes)
        self._plan_token = object()
        if info.host_initialized:
            aid = self._new_alloc_id()
            b.user = Allocation(aid, USER_MEMORY, info.box, self._horizons.epoch)
            b.newest.update(info.box, self._only[USER_MEMORY])
            return aid
        return None

    def destroy_buffer(self, bid: int) -> list[Instruction]:
        self._sync_buffers((bid,))
        b = self._buffers.pop(bid, None)
        self._shapes.pop(bid, None)
        self._chain = None
        if b is None:
            return []
        self._begin()
        self._materialize_all(b)
        for mem in sorted(b.allocs):
            for a in b.allocs[mem]:
                self._free(a)
        if b.user is not None:
            self._garbage.append(b.user.id)
        return self._end()[0]

    def create_host_object(self, hoid: int) -> None:
        self._host_objects[hoid] = None
        self._chain = None

    def destroy_host_object(self, hoid: int) -> list[Instruction]:
        self._chain = None
        self._begin()
        last = self._host_objects.pop(hoid, None)
        ins = DestroyHostObjectInstruction(self._new_id(), host_object=hoid)
        if last is not None:
            ins.deps.append((last, DEP_SIDE_EFFECT))
        self._emit(ins)
        return self._end()[0]

    # ---- bookkeeping -------------------------------------------------------------
    def _new_id(self) -> int:
        i = self._next_instr
        self._next_instr += 1
        return i

    def _new_alloc_id(self) -> int:
        a = self._next_alloc
        self._next_alloc += 1
        return a

    def _begin(self) -> None:
        self._out = []
        self._pilots = []

    def _end(self) -> tuple[list[Instruction], list[Pilot]]:
        out, pilots = self._out, self._pilots
        self._out, self._pilots = [], []
        return out, pilots

    def _emit(self, ins: Instruction) -> Instruction:
        # de-duplicate dependencies, keep the first origin
        # (the execution front's bookkeeping, inlined: see ``EpochTracker.add``)
        deps = ins.deps
        front = self._horizons.front
        if deps:
            if len(deps) == 1:
                d = deps[0][0]
                if d == ins.id:
                    ins.deps = []
                else:
                    front.pop(d, None)
            else:
                seen: dict[int, str] = {}
                for d, o in deps:
                    if d not in seen:
                        seen[d] = o
                seen.pop(ins.id, None)
                ins.deps = sorted(seen.items())
                for d in seen:
                    front.pop(d, None)
        else:
            epoch = self._horizons.epoch
            if epoch is not None:
                ins.deps = [(epoch, DEP_LAST_EPOCH)]
                front.pop(epoch, None)
        front[ins.id] = None
        self._out.append(ins)
        counts = self._counts
        kind = ins.kind
        counts[kind] = counts.get(kind, 0) + 1
        if self.recorder is not None:
            self.recorder.record_instruction(ins)
        return ins

    def _pilot(self, p: Pilot) -> None:
        self._pilots.append(p)
        if self.recorder is not None:
            self.recorder.record_pilot(p)

    # ---- access tracking ---------------------------------------------------------
    # Per point: a read depends on the last writer, a write on the readers since the last
    # write, or on the last writer where there are none.  One pass over the allocation's
    # map each; the values come back unmerged and may repeat (``_emit`` de-duplicates).
    @staticmethod
    def _read(alloc: Allocation, region, ins: Instruction) -> None:
        deps = ins.deps
        iid = ins.id
        for w in alloc.access.read_collect(region, iid):
            if w is not None:
                deps.append((w, DEP_READ))

    @staticmethod
    def _write(alloc: Allocation, region, ins: Instruction) -> None:
        deps = ins.deps
        for w, readers in alloc.access.update_collect(region, (ins.id, _NO_READERS)):
            if readers:
                deps.extend([(r, DEP_WRITE) for r in readers])
            elif w is not None:
                deps.append((w, DEP_WRITE))

    # ---- coherence ---------------------------------------------------------------
    def _source_memory(self, newest: tuple[int, frozenset[int]], dst: int) -> int | None:
        """Best memory to copy from directly: the producer of the data, so that a copy
        never waits for an earlier copy of the same data (halos of a 2-D split would otherwise
        travel through a diagonal neighbour); else a peer device, then host, then user.
        Memoized per (newest, destination): copy paths never change."""
        key = (newest, dst)
        cache = self._source_cache
        if key in cache:
            return cache[key]
        producer, mems = newest
        best = None
        if dst in mems:
            best = dst
        elif producer is not None and self.system.can_copy(producer, dst):
            best = producer
        for m in () if best is not None else sorted(mems, reverse=True):
            if m == dst:
                best = m
                break
            if self.system.can_copy(m, dst):
                if best is None or (m >= 2 and best < 2) or (m == HOST_MEMORY and best == USER_MEMORY):
                    best = m
        cache.put(key, best)
        return best

    def _copy_between(self, b: _Buffer, src_mem: int, dst: Allocation, box: Box) -> None:
        """Copy ``box`` from the allocations of ``src_mem`` into ``dst``."""
        srcs = [b.user] if src_mem == USER_MEMORY else b.allocs.get(src_mem, ())
        for src in srcs:
            if src is None:
                continue
            sb = src.box
            if not box.empty and sb.contains_box(box) and sb.dims == box.dims:
                part = box   # (the common case: one source allocation holds all of it)
            else:
                part = sb & box
                if part.empty:
                    continue
            for piece in self._split_by_writer(src, part):
                cp = CopyInstruction(self._new_id(), [], PRIORITY_COPY, src.id, dst.id, src_mem, dst.memory,
                                     b.info.id, piece, sb, dst.box, "strided", piece.area * b.itemsize,
                                     self._evicting)
                self._read(src, piece, cp)
                self._write(dst, piece, cp)
                self._emit(cp)

    @staticmethod
    def _split_by_writer(src: Allocation, part: Box) -> list[Box]:
        """``part`` cut into the boxes of its last writers in ``src``: a copy of data two
        kernels wrote becomes one copy per kernel, each waiting only for its own writer, so
        the first half travels while the second is still computed (as Celerity splits)."""
        values = src.access.values_in(part)
        first = values[0][0] if values else None
        for v in values:
            if v[0] != first:
                break
        else:
            return [part]
        groups: dict = {}
        for box, (writer, _readers) in src.access.query(part):
            groups.setdefault(writer, []).append(box)
        out = []
        for _writer, boxes in sorted(groups.items(), key=lambda g: -1 if g[0] is None else g[0]):
            out.extend(Region(boxes) if len(boxes) > 1 else boxes)
        return out

    def _make_coherent(self, b: _Buffer, memory: int, region: Region) -> None:
        """Copy whatever of ``region`` is not newest on ``memory`` from where it is."""
        if not region:
            return
        newest = b.newest
        # fast path: nothing to copy (no canonical decomposition of the newest map needed)
        for v in newest.values_in(region):
            if v is not None and memory not in v[1]:
                break
        else:
            return
        # The copies and the newest map after them depend only on the map's content, the
        # memory and the region (and the fixed copy paths): a stencil repeats the same few
        # states, so they are memoized per content.  Allocations and dependencies are not
        # (they are looked up / tracked every time); a step whose allocation is missing
        # takes the full path, since ``_allocate`` reads the intermediate newest map.
        key = (memory, region.corners if type(region) is Region else region, newest.snapshot())
        cache = self._coherence_cache
        hit = cache.get(key)
        if hit is not None:
            steps, final = hit
            find = self._find_alloc
            dsts = []
            for box, src, stage in steps:
                dst = find(b, memory, box)
                if dst is None:
                    break
                host = None
                if stage is not None:
                    host = find(b, HOST_MEMORY, box)
                    if host is None:
                        break
                dsts.append((dst, host))
            else:
                copy = self._copy_between
                for (box, src, stage), (dst, host) in zip(steps, dsts):
                    if stage is not None:
                        copy(b, stage, host, box)
                    copy(b, src, dst, box)
                newest.restore(final)
                return
        steps = []
        for box, v in newest.query(region):
            if v is None or memory in v[1]:
                continue
            dst = self._find_alloc(b, memory, box)
            if dst is None:
                dst = self._allocate(b, memory, box)
            src = self._source_memory(v, memory)
            stage_src = None
            if src is None:
                # no direct path (devices without peer access): stage through host memory once
                stage_src = self._source_memory(v, HOST_MEMORY)
                host = self._find_alloc(b, HOST_MEMORY, box) or self._allocate(b, HOST_MEMORY, box)
                self._copy_between(b, stage_src, host, box)
                v = (v[0], v[1] | {HOST_MEMORY})
                src = HOST_MEMORY
            self._copy_between(b, src, dst, box)
            b.newest.update(box, (v[0], v[1] | {memory}))
            steps.append((box, src, stage_src))
        cache.put(key, (steps, newest.snapshot()))

    # ---- receives ---------------------------------------------------------------
    def _materialize(self, b: _Buffer, touched: list[Region], memories: list[int] | None = None,
                     accessed: list[Region] | None = None) -> None:
        """Turn pending await-pushes that ``touched`` regions intersect into receives.

        ``memories[i]`` is the memory that reads ``touched[i]``: a receive that
        one reader consumes whole lands straight in that reader's memory when the
        communicator can write there (CUDA-aware MPI), else in host memory.
        ``accessed[i]``, where given, is what reader i reads or writes of the buffer
        (within ``touched[i]``, its allocation groups).  Where several readers touch one
        receive, its awaits are the parts ``split_overlapping`` makes of what they access
        (and one for the rest of what they touch), so each waits for the data it accesses
        and no more, as concurrent receives are split in Celerity.
        """
        if not b.pending:
            return
        # (what readers on host memory need there: a receive landing in host memory next to
        # it allocates it along, as the command would right after)
        host = () if memories is None else \
            Box.touching_groups([box for reg, m in zip(touched, memories) if m == HOST_MEMORY for box in reg.boxes])
        keep = []
        for p in b.pending:
            region = p.region
            hit = [i for i, reg in enumerate(touched) if reg.intersects(region)]
            if not hit:
                keep.append(p)
                continue
            if len(hit) == 1:
                parts = [touched[hit[0]] & region]
            elif accessed is None:
                parts = split_overlapping([touched[i] & region for i in hit])
            else:
                parts = split_overlapping([accessed[i] & region for i in hit])
                rest = region.intersection(touched[hit[0]])
                for i in hit[1:]:
                    rest = rest | (touched[i] & region)
                for part in parts:
                    rest = rest - part
                if rest:
                    parts.append(rest)
            consumer = whole = None
            if memories is not None and len(parts) == 1 and parts[0] == region:
                consumer = memories[hit[0]]
                whole = touched[hit[0]]
            self._receive(b, p, parts, consumer, whole, host)
        b.pending = keep

    def _materialize_all(self, b: _Buffer) -> None:
        for p in b.pending:
            self._receive(b, p, [p.region])
        b.pending = []

    def _receive(self, b: _Buffer, p: _PendingReceive, parts: list[Region], consumer: int | None = None,
                 consumer_region: Region | None = None, host: tuple = ()) -> None:
        """Receive ``p`` into one allocation per group of its boxes that touch (two
        disconnected boxes need not allocate what lies between them), each group with
        the receive instructions of the ``parts`` (what separate readers consume) in it.

        ``consumer_region``: all the consuming chunk reads of the buffer (its allocation
        groups); a receive straight into a device allocates the group that holds it, the
        allocation the kernel then uses (a receive-sized one would be grown right after,
        and under a capacity the two together may not fit).  ``host``: the boxes readers on
        host memory need there, allocated along with a group they touch."""
        region = p.region
        groups = Box.touching_groups(region.boxes) if len(region) > 1 else (region.bounding_box,)
        direct = consumer is not None and consumer >= 2 and self.system.comm_capable(consumer)
        # Every group is allocated before any receive is written: a later group's allocation
        # may merge an earlier one's, and a resize copies only data already there (not what
        # a receive of the transfer still being materialized will write).
        consumer_groups = () if not direct or consumer_region is None else \
            Box.touching_groups(consumer_region.boxes) if len(consumer_region) > 1 else (consumer_region.bounding_box,)
        targets = []
        for group in groups:
            bbox = group
            into = direct
            if direct:
                for cbox in consumer_groups:
                    if cbox.touches(group):
                        bbox = cbox if cbox.contains_box(group) else cbox.bounding(group)
                        break
            if into and consumer in self._capacity and self._find_alloc(b, consumer, bbox) is None:
                # On a memory with a capacity a new allocation waits for the frees that made its
                # room, and a free waits for the sends reading what it frees, which complete when
                # the peer receives: a receive waiting for an allocation there can close a cycle
                # between ranks (each rank's receive behind its own send).  It lands in host
                # memory instead, which needs no room.
                into = False
                bbox = group
            dst_mem = consumer if into else HOST_MEMORY
            if dst_mem == HOST_MEMORY and host:
                bbox = bbox.grown_over(host, touching=True)
            self._allocate(b, dst_mem, bbox)
            targets.append((group, dst_mem, bbox))
        for group, dst_mem, bbox in targets:
            sub = region if len(groups) == 1 else region & group
            sub_parts = parts if len(groups) == 1 else [q for q in (part & group for part in parts) if q]
            dst = self._find_alloc(b, dst_mem, bbox)
            common = dict(transfer=p.transfer, region=sub, dest=dst.id, dest_box=dst.box, dtype=b.dtype,
                          size_bytes=sub.area * b.itemsize, priority=PRIORITY_COMM)
            if len(sub_parts) <= 1:
                ins = ReceiveInstruction(self._new_id(), **common)
                self._write(dst, sub, ins)
                self._emit(ins)
            else:
                split = SplitReceiveInstruction(self._new_id(), **common)
                self._write(dst, sub, split)
                self._emit(split)
                for part in sub_parts:
                    aw = AwaitReceiveInstruction(self._new_id(), transfer=p.transfer, region=part,
                                                 priority=PRIORITY_COMM)
                    aw.deps.append((split.id, DEP_SPLIT_RECEIVE))
                    dst.access.update(part, (aw.id, _NO_READERS))  # (the receive left no readers)
                    self._emit(aw)
            b.newest.update(sub, self._only[dst_mem])

    # ---- lookahead --------------------------------------------------------------
    def anticipate(self, cmd: cg.Command) -> bool:
        """Record the boxes ``cmd`` will need; True if any is not allocated yet.  (Called
        for every command under lookahead: the requirements of an execution command are
        kept on its plan, and a transfer's are a box or two.)"""
        shapes = self._shapes
        under = None
        if cmd.kind == cg.EXECUTION:
            # every box allocated under the same buffer states as before: nothing to record
            plans = self._plan_chunks(cmd)
            sids = []
            for bid in plans.bids:
                sh = shapes.get(bid)
                if sh is None:
                    break
                sids.append(sh.sid)
            else:
                under = tuple(sids)
                if under in plans.allocated_under:
                    return False
        new_need = False
        all_hit = True
        buffers = self._buffers
        memo = self._allocated_memo
        for bid, memory, box in self._requirements(cmd):
            b = buffers.get(bid)
            if b is None or box.empty:
                continue
            sh = shapes.get(bid)   # (the memo lookup of ``_allocated``, inlined: every command asks)
            if sh is None:
                hit = self._find_alloc(b, memory, box) is not None
            else:
                hit = memo.get((sh.sid, memory, box))
                if hit is None:
                    hit = self._allocated(bid, memory, box)
            if not hit:
                all_hit = False
                self._sync_buffers((bid,))
                lst = b.anticipated.setdefault(memory, [])
                if not any(x.contains_box(box) for x in lst):
                    lst.append(box)
                    new_need = True
                    self._shapes.pop(bid, None)
                    self._chain = None     # (a state no chain step made)
        if all_hit:
            if under is not None:
                known = plans.allocated_under
                if len(known) >= 64:        # (buffer states that keep changing: start over)
                    known.clear()
                known.add(under)
        else:
            self._anticipation_misses += 1
        return new_need

    def clear_anticipation(self) -> None:
        self._sync_buffers(None)
        for bid, b in self._buffers.items():
            if b.anticipated:
                b.anticipated.clear()
                self._shapes.pop(bid, None)
                self._chain = None

    def _requirements(self, cmd: cg.Command) -> tuple:
        kind = cmd.kind
        if kind == cg.EXECUTION:
            plans = self._plan_chunks(cmd)
            req = plans.requirements
            if req is None:
                req = plans.requirements = tuple([(bid, plan.memory, box) for plan in plans
                                                  for bid, boxes in plan.groups.items() for box in boxes])
            return req
        if kind == cg.AWAIT_PUSH and cmd.transfer[2] == 0 and not self._direct_receives:
            return ((cmd.transfer[1], HOST_MEMORY, cmd.region.bounding_box),)
        if kind == cg.PUSH and cmd.transfer[2] == 0 and not self._direct_receives:
            # data produced on a device is staged through host memory to be sent: one
            # host allocation for every box the window pushes, not one per step (RSim)
            bid = cmd.transfer[1]
            return tuple([(bid, HOST_MEMORY, reg.bounding_box) for _rank, reg in cmd.targets if reg])
        return ()

    # ---- compile -------------------------------------------------------------------
    @property
    def counts(self) -> dict[str, int]:
        """Instructions made so far, per kind: those lowered, counted one by one, and those
        replayed, counted by template (a replay adds its template's tally once, not a count
        per kind: the summary reads this once, the scheduler replays it per task)."""
        out = dict(self._counts)
        for kinds, n in list(self._replayed_kinds.items()):   # (a copy: read from another thread)
            for kind, k in kinds:
                out[kind] = out.get(kind, 0) + k * n
        return out

    def compile(self, cmd: cg.Command, group=None) -> tuple[list[Instruction], list[Pilot], int | None]:
        """The command's instructions and pilots, and the serial number of the replay template
        they were made from (None: lowered, not replayed).  Equal serials mean instructions of
        the same kinds, priorities, boxes, memories and sizes, in the same order; their ids,
        tasks, names and launchers differ (what InstructionBatch.shape tells the executor).
        ``group``: a ``group_probe`` that found a template: ``cmd`` and the rest of its task's
        commands are made by it."""
        out = self._out = []     # (_begin/_end inlined: once per command)
        pilots = self._pilots = []
        self._compiling_task = cmd.task
        if self._pinned:
            self._pinned.clear()
        if self._coming:
            self._coming.clear()
        template = None
        if group is not None:
            template = self._replay_group(group, cmd)
        elif self.replay is not None:
            template = self._compile_replayed(cmd)
        else:
            self._compile_now(cmd)
        self._out = []
        self._pilots = []
        return out, pilots, template

    def _compile_now(self, cmd: cg.Command) -> None:
        if self._stale:
            self._sync_buffers(self._touched_buffers(cmd))
        kind = cmd.kind
        if kind == cg.EXECUTION:
            self._compile_execution(cmd)
        elif kind == cg.PUSH:
            self._compile_push(cmd)
        elif kind == cg.AWAIT_PUSH:
            self._compile_await_push(cmd)
        elif kind == cg.REDUCTION:
            self._compile_reduction(cmd)
        elif kind == cg.FENCE:
            self._compile_fence(cmd)
        elif kind in (cg.HORIZON, cg.EPOCH):
            self._compile_horizon_or_epoch(cmd)
        else:
            raise ValueError(f"unknown command kind {kind}")

    def _compile_execution(self, cmd: cg.ExecutionCommand) -> None:
        task = cmd.task
        plans = self._plan_chunks(cmd)
        if plans.overlap is not None and self.diagnostics != tg.DIAG_OFF:
            self._report_overlap(cmd, plans)
        if plans.outside is not None:
            self._report_outside(cmd, plans)
        # pending receives this command touches
        buffers = self._buffers
        for bid in plans.bids:
            b = buffers[bid]
            if b.pending:
                readers = [p for p in plans if bid in p.bbox]
                self._materialize(b, [_group_region(p.groups[bid]) for p in readers], [p.memory for p in readers],
                                  [_accessed(p, bid) for p in readers] if len(readers) > 1 else None)
        # allocations first (a resize later in this command would free what a chunk uses)
        bounded = self._capacity
        if bounded:   # (growth of one allocation must leave room for the command's others)
            coming = self._coming
            coming.clear()
            per_memory: dict[int, list] = {}
            for (bid, mem), box in plans.need:
                if mem in bounded:
                    coming[mem] = coming.get(mem, 0) + box.area * buffers[bid].itemsize
                    per_memory.setdefault(mem, []).append((bid, box))
            n_reductions = sum(buffers[r.buffer].itemsize for r in task.reductions)
            for mem, needs in per_memory.items():
                scratch = sum(1 for p in plans if p.memory == mem and p.batch is None) * n_reductions
                coming[mem] += scratch   # (allocated after the needs: room is kept for it)
                self._fit(mem, needs, scratch)
        order = self._missing_first(plans.need) if bounded and len(plans.need) > 1 else plans.need
        for k, ((bid, mem), box) in enumerate(order):
            b = buffers[bid]
            if bounded and mem in bounded:
                self._coming[mem] -= box.area * b.itemsize
            found = self._find_alloc(b, mem, box)
            if found is not None:
                if bounded and mem in bounded:
                    self._pinned.add(found.id)
                continue
            if bounded and mem in bounded:
                self._pending_groups = [x for key, x in order[k + 1:] if key == (bid, mem)]
            self._allocate(b, mem, box, _discard(b, bid, mem, (p for p in plans if p.batch is None)))
            self._pending_groups = []
        direct = bool(task.reductions) and self._reduces_in_place(cmd, plans)
        if len(plans) > 1:
            self._coherent_parts(plans)
        # coherence, then one kernel / host task per chunk
        kernels: list[tuple[ChunkPlan, Instruction, list[Allocation]]] = []
        for p in plans:
            if p.batch is not None:   # a chunk larger than its device: this batch's allocations now
                batch_allocs = []
                scratch = sum(buffers[r.buffer].itemsize for r in task.reductions)
                # (the scratch of the batches before it stays until the local reduction)
                held = sum(s.nbytes for q, _ins, ss in kernels if q.memory == p.memory for s in ss)
                needs = p.allocation_boxes()
                self._fit(p.memory, needs, scratch + held)
                self._coming[p.memory] = scratch + sum(box.area * buffers[bid].itemsize for bid, box in needs)
                for bid, box in needs:
                    b = buffers[bid]
                    self._coming[p.memory] -= box.area * b.itemsize
                    a = self._find_alloc(b, p.memory, box)
                    if a is None:
                        a = self._allocate(b, p.memory, box, _discard(b, bid, p.memory, (p,)), anticipate=False)
                    self._pinned.add(a.id)
                    batch_allocs.append(a.id)
            consumed = sorted(p.consumed.items()) if len(p.consumed) > 1 else p.consumed.items()
            for bid, reg in consumed:
                self._make_coherent(self._buffers[bid], p.memory, reg)
            if task.kind == tg.DEVICE_COMPUTE:
                ins: Instruction = DeviceKernelInstruction(self._new_id(), device=p.device, task=task.id,
                                                           box=p.box, launcher=task.launcher,
                                                           name=task.name)
            else:
                ins = HostTaskInstruction(self._new_id(), task=task.id, box=p.box,
                                          global_range=task.geometry.global_range if task.geometry else (),
                                          collective_group=task.collective_group, launcher=task.launcher,
                                          name=task.name)
            # (bid, id(box)) -> allocation: nothing allocates between these look-ups, and the
            # access, consumed and produced bounding boxes are often the same object
            found: dict = {}
            for a, reg, bb in p.accesses:
                b = self._buffers[a.buffer]
                if not reg:
                    ins.accesses.append(AccessAllocation(a.buffer, -1, Box.empty_box(b.info.box.dims),
                                                         Box.empty_box(b.info.box.dims), reg, a.mode))
                    continue
                fk = (a.buffer, id(bb))
                alloc = found.get(fk)
                if alloc is None:
                    alloc = found[fk] = self._find_alloc(b, p.memory, bb)
                ins.accesses.append(AccessAllocation(a.buffer, alloc.id, alloc.box, bb, reg, a.mode))
            groups = p.groups
            for bid, reg in consumed:
                if reg:
                    if len(groups[bid]) > 1:
                        self._track_in_groups(bid, p.memory, groups[bid], reg, ins, self._read)
                        continue
                    box = p.cbbox[bid]
                    alloc = found.get((bid, id(box)))
                    if alloc is None:
                        alloc = self._find_alloc(self._buffers[bid], p.memory, box)
                    if alloc is not None:
                        self._read(alloc, reg, ins)
            for bid, reg in sorted(p.produced.items()) if len(p.produced) > 1 else p.produced.items():
                if reg:
                    if len(groups[bid]) > 1:
                        self._track_in_groups(bid, p.memory, groups[bid], reg, ins, self._write)
                        continue
                    box = p.pbbox[bid]
                    alloc = found.get((bid, id(box)))
                    if alloc is None:
                        alloc = self._find_alloc(self._buffers[bid], p.memory, box)
                    if alloc is not None:
                        self._write(alloc, reg, ins)
            scratch = []
            if direct:
                self._reduce_in_place(cmd, p, ins)
            for red in task.reductions if not direct else ():
                b = self._buffers[red.buffer]
                j = len(kernels)
                s = self._scratch(p.memory, Box((j,), (j + 1,)), b.dtype)
                ins.reductions.append(ReductionAllocation(red.id, red.buffer, s.id, False))
                self._write(s, s.box, ins)
                scratch.append(s)
            for ho in task.side_effects:
                last = self._host_objects.get(ho)
                if last is not None:
                    ins.deps.append((last, DEP_SIDE_EFFECT))
                self._host_objects[ho] = ins.id
            if task.collective_group is not None:
                self._collective_order(task.collective_group, ins)
            if p.batch is not None:
                ins.batch = p.batch
            self._emit(ins)
            kernels.append((p, ins, scratch))
            if p.batch is not None:
                # (later batches may evict this one's allocations: its writes are newest now)
                for bid, reg in p.produced.items():
                    if reg:
                        buffers[bid].newest.update(reg, self._only[p.memory])
                self._pinned.difference_update(batch_allocs)
                self.memory_stats["batches"] += 1
                if p.batch[0] == 0:   # (a device's batches of one command: one series)
                    self.memory_stats["batched_chunks"] += 1
                if not self._overlap_batches:
                    self._batch_barrier[p.memory] = ins.id
        # newest data after the writes
        for p in plans:
            if p.batch is not None:
                continue
            for bid, reg in p.produced.items():
                if reg:
                    self._buffers[bid].newest.update(reg, self._only[p.memory])
        if task.reductions and not direct:
            self._local_reductions(cmd, kernels)

    def _coherent_parts(self, plans) -> None:
        """Where chunks on one memory read overlapping parts of a buffer, make the parts that
        ``split_overlapping`` gives of their reads coherent first, one set of copies per part,
        so that each chunk depends on the copies of what it reads only.  Chunk by chunk, a
        later chunk found its overlap copied along with an earlier chunk's whole read and
        waited for all of that copy; Celerity splits concurrent copies the same way.  Chunks
        whose reads are disjoint, and batches (their allocations come one by one), are left
        to the chunk loop."""
        by_memory: dict[int, list[ChunkPlan]] = {}
        for p in plans:
            if p.batch is None and p.consumed:
                by_memory.setdefault(p.memory, []).append(p)
        for memory, ps in by_memory.items():
            if len(ps) < 2:
                continue
            for bid in sorted({bid for p in ps for bid in p.consumed}):
                regs = [r for r in (p.consumed.get(bid) for p in ps) if r]
                if len(regs) > 1 and any(a.intersects(c) for i, a in enumerate(regs) for c in regs[i + 1:]):
                    b = self._buffers[bid]
                    for part in split_overlapping(regs):
                        self._make_coherent(b, memory, part)

    def _missing_first(self, need: list) -> list:
        """``Plans.need`` with, per buffer and bounded memory, a box that no allocation holds but
        that meets one another box was found in, before that box: found first, the allocation
        would be pinned, and the missing box's allocation would have to grow over it whether
        or not that fits, where allocated first it may evict it instead (the found box is then
        allocated on its own), as one box over both would have."""
        out = list(need)
        k = 0
        while k < len(out):
            key = out[k][0]
            end = k + 1
            while end < len(out) and out[end][0] == key:
                end += 1
            if end - k > 1 and key[1] in self._capacity:
                b = self._buffers[key[0]]
                found = [self._find_alloc(b, key[1], box) for _key, box in out[k:end]]
                held = [a for a in found if a is not None]
                missing = [e for e, a in zip(out[k:end], found) if a is None]
                if missing and held and any(a.box.intersects(box) for _key, box in missing for a in held):
                    out[k:end] = missing + [e for e, a in zip(out[k:end], found) if a is not None]
            k = end
        return out

    def _track_in_groups(self, bid: int, memory: int, groups: tuple, reg: Region, ins: Instruction,
                         track) -> None:
        """``_read``/``_write`` of ``reg`` by ``ins`` where the chunk's accesses of ``bid`` lie
        in several allocations (``groups``, one each): each allocation tracks its part."""
        b = self._buffers[bid]
        for box in groups:
            part = reg & box
            if part:
                alloc = self._find_alloc(b, memory, box)
                if alloc is not None:
                    track(alloc, part, ins)

    def _fit(self, memory: int, needs, extra: int) -> None:
        """Allocations the command would reuse may be larger than it needs now (made by an
        earlier task for a larger chunk): where keeping them leaves no room for the rest of
        ``needs`` ((buffer, box) pairs on ``memory``) and ``extra`` scratch bytes, they are
        evicted so that just what is needed gets allocated."""
        cap = self._capacity.get(memory)
        if cap is None:
            return
        oversized = []
        need = extra
        for bid, box in needs:
            b = self._buffers[bid]
            a = self._find_alloc(b, memory, box)
            exact = box.area * b.itemsize
            need += exact if a is None else a.nbytes
            if a is not None and a.nbytes > exact and a.id not in self._pinned:
                oversized.append((b, a))
        if need > cap:
            for b, a in oversized:
                if a in b.allocs.get(memory, ()):
                    self._evict(b, a)

    def _collective_order(self, group: int, ins: Instruction) -> None:
        if group not in self._collective:
            clone = CloneCollectiveGroupInstruction(self._new_id(), original=0, new=group)
            # (cloning a communicator is collective itself: every rank clones in one order,
            # so each clone follows the one before it, not only the same stream of issue)
            last = self._collective.get(_CLONES)
            if last is not None:
                clone.deps.append((last, DEP_COLLECTIVE))
            self._emit(clone)
            self._collective[group] = clone.id
            self._collective[_CLONES] = clone.id
        ins.deps.append((self._collective[group], DEP_COLLECTIVE))
        self._collective[group] = ins.id

    def _reduces_in_place(self, cmd: cg.ExecutionCommand, plans) -> bool:
        """One rank, one chunk: its kernel can reduce straight into the targets' allocations on
        its device (no scratch, gather copy and local reduce, no copy back for a device reader),
        as Celerity does, where that costs no concurrency: each target either starts from the
        identity or already holds its current value there (else the kernel would wait for a
        copy of it, where a partial result reduced afterwards runs alongside).  Several chunks
        or ranks combine partial results (``_local_reductions``)."""
        if self.num_ranks != 1 or len(plans) != 1 or plans[0].batch is not None:
            return False
        memory = plans[0].memory
        for red in cmd.task.reductions:
            b = self._buffers[red.buffer]
            if b.pending:
                return False
            if red.include_current and cmd.include_current_reductions:
                for v in b.newest.values_in(Region.from_box(b.info.box)):
                    if v is None or memory not in v[1]:
                        return False
        return True

    def _reduce_in_place(self, cmd: cg.ExecutionCommand, p: ChunkPlan, ins: Instruction) -> None:
        """The kernel of the command's only chunk combines into each target's allocation on
        its memory, starting from the current value (made coherent there first) or, with
        ``initialize_to_identity``, from the identity; the result is newest there."""
        for red in cmd.task.reductions:
            b = self._buffers[red.buffer]
            full = b.info.box
            whole = Region.from_box(full)
            include = red.include_current and cmd.include_current_reductions
            dst = self._find_alloc(b, p.memory, full)
            if dst is None:
                dst = self._allocate(b, p.memory, full, None if include else whole)
            if p.memory in self._capacity:
                self._pinned.add(dst.id)
            if include:
                self._make_coherent(b, p.memory, whole)
                self._read(dst, full, ins)
            ins.reductions.append(ReductionAllocation(red.id, red.buffer, dst.id, include))
            self._write(dst, full, ins)
            b.newest.update(full, self._only[p.memory])

    def _local_reductions(self, cmd: cg.ExecutionCommand, kernels) -> None:
        n = len(kernels)
        for ri, red in enumerate(cmd.task.reductions):
            b = self._buffers[red.buffer]
            gather = self._scratch(HOST_MEMORY, Box((0,), (n,)), b.dtype)
            for j, (_p, _ins, scratch) in enumerate(kernels):
                s = scratch[ri]
                cp = CopyInstruction(self._new_id(), source=s.id, dest=gather.id, source_memory=s.memory,
                                     dest_memory=HOST_MEMORY, buffer=None, box=s.box, source_box=s.box,
                                     dest_box=gather.box, size_bytes=b.itemsize, priority=PRIORITY_COPY)
                self._read(s, s.box, cp)
                self._write(gather, s.box, cp)
                self._emit(cp)
            include = red.include_current and cmd.include_current_reductions
            full = b.info.box
            if include and b.pending:   # the current value comes from another rank
                self._materialize(b, [Region.from_box(full)], [HOST_MEMORY])
            dst = self._allocate(b, HOST_MEMORY, full)
            if include:
                self._make_coherent(b, HOST_MEMORY, Region.from_box(full))
            rd = ReduceInstruction(self._new_id(), reduction=red.id, source=gather.id, dest=dst.id, count=n,
                                   op=red.op, include_dest=include)
            self._read(gather, gather.box, rd)
            if include:
                self._read(dst, full, rd)
            self._write(dst, full, rd)
            self._emit(rd)
            b.newest.update(full, self._only[HOST_MEMORY])
            for _p, _ins, scratch in kernels:
                self._free(scratch[ri])
            self._free(gather)

    def _send_sources(self, b: _Buffer, box: Box) -> list[tuple[Allocation, Box]]:
        """Allocations to send ``box`` from, staging through host memory where needed."""
        out = []
        comm_capable = self.system.comm_capable
        for part, v in b.newest.query(box):
            src_mem = None
            if v is not None:
                if v[0] is not None and comm_capable(v[0]):
                    src_mem = v[0]   # the producer (see _source_memory)
                else:
                    for m in sorted(v[1], reverse=True):
                        if comm_capable(m):
                            src_mem = m
                            break
            if src_mem is None:
                if v is None:
                    src_mem = HOST_MEMORY   # uninitialized: send whatever host memory holds
                    self._allocate(b, HOST_MEMORY, part)
                else:
                    self._allocate(b, HOST_MEMORY, part)
                    self._make_coherent(b, HOST_MEMORY, Region.from_box(part))
                    src_mem = HOST_MEMORY
            for a in b.allocs.get(src_mem, []):
                piece = a.box & part
                if not piece.empty:
                    out.append((a, piece))
        return out

    def _compile_push(self, cmd: cg.PushCommand) -> None:
        tid, bid, rid = cmd.transfer
        b = self._buffers[bid]
        if rid != 0 and not cmd.contributes:
            for rank, _reg in cmd.targets:
                self._pilot(Pilot(self._next_msg, rank, cmd.transfer, Box.empty_box(b.info.box.dims)))
                self._next_msg += 1
            return
        if b.pending:
            union = Region.empty_region(b.info.box.dims)
            for _r, reg in cmd.targets:
                union = union | reg
            self._materialize(b, [union])
        for rank, reg in cmd.targets:
            for box in reg:
                for alloc, piece in self._send_sources(b, box):
                    msg = self._next_msg
                    self._next_msg += 1
                    s = SendInstruction(self._new_id(), to=rank, msg_id=msg, transfer=cmd.transfer, box=piece,
                                        source=alloc.id, source_box=alloc.box, dtype=b.dtype,
                                        size_bytes=piece.area * b.itemsize, priority=PRIORITY_COMM)
                    self._read(alloc, piece, s)
                    self._emit(s)
                    self._pilot(Pilot(msg, rank, cmd.transfer, piece))

    def _compile_await_push(self, cmd: cg.AwaitPushCommand) -> None:
        tid, bid, rid = cmd.transfer
        if rid != 0:
            return   # the reduction command receives the partial results
        b = self._buffers[bid]
        # data still pending from an earlier transfer of the same region must land first
        self._materialize(b, [cmd.region])
        b.pending.append(_PendingReceive(cmd.transfer, cmd.region))
        b.newest.update(cmd.region, self._only[HOST_MEMORY])

    def _compile_reduction(self, cmd: cg.ReductionCommand) -> None:
        b = self._buffers[cmd.buffer]
        red = cmd.reduction
        n = self.num_ranks
        full = b.info.box
        gather = self._scratch(HOST_MEMORY, Box((0,), (n,)), b.dtype)
        fill = FillIdentityInstruction(self._new_id(), reduction=red.id, allocation=gather.id, count=n,
                                       identity=red.identity)
        self._write(gather, gather.box, fill)
        self._emit(fill)
        dst = self._allocate(b, HOST_MEMORY, full)
        me = Box((self.rank,), (self.rank + 1,))
        if cmd.contributes:
            self._make_coherent(b, HOST_MEMORY, Region.from_box(full))
            cp = CopyInstruction(self._new_id(), source=dst.id, dest=gather.id, source_memory=HOST_MEMORY,
                                 dest_memory=HOST_MEMORY, buffer=None, box=me, source_box=me,
                                 dest_box=gather.box, layout="linearized", size_bytes=b.itemsize,
                                 priority=PRIORITY_COPY)
            self._read(dst, full, cp)
            self._write(gather, me, cp)
            self._emit(cp)
        if n > 1:
            gr = GatherReceiveInstruction(self._new_id(), transfer=cmd.transfer, dest=gather.id,
                                          chunk_bytes=b.itemsize, num_ranks=n, priority=PRIORITY_COMM)
            self._write(gather, Region.from_box(gather.box) - me, gr)
            self._emit(gr)
        rd = ReduceInstruction(self._new_id(), reduction=red.id, source=gather.id, dest=dst.id, count=n,
                               op=red.op, include_dest=False)
        self._read(gather, gather.box, rd)
        self._write(dst, full, rd)
        self._emit(rd)
        b.newest.update(full, self._only[HOST_MEMORY])
        self._free(gather)

    def _compile_fence(self, cmd: cg.FenceCommand) -> None:
        task = cmd.task
        deps: list[tuple[int, str]] = []
        allocation = None
        if task.fence_buffer is not None:
            b = self._buffers[task.fence_buffer]
            box = task.fence_box
            self._materialize(b, [Region.from_box(box)])
            aid = self._new_alloc_id()
            al = AllocInstruction(self._new_id(), allocation=aid, memory=USER_MEMORY, buffer=b.info.id,
                                  box=box, shape=box.range, dtype=b.dtype, size_bytes=box.area * b.itemsize)
            self._emit(al)
            snap = Allocation(aid, USER_MEMORY, box, al.id)
            for part, v in b.newest.query(box):
                if v is None:
                    continue
                src = self._source_memory(v, USER_MEMORY)
                self._copy_between(b, src, snap, part)
            allocation = aid
            deps.extend((u, DEP_READ) for u in sorted(snap.users()))
            if not deps:     # (nothing copied in: an empty box, or no part ever written)
                deps.append((al.id, DEP_ALLOCATION))
        ins = FenceInstruction(self._new_id(), task=task.id, promise=task.fence_promise, allocation=allocation)
        ins.deps = deps
        if task.fence_host_object is not None:
            ho = task.fence_host_object
            ins.host_object = ho
            last = self._host_objects.get(ho)
            if last is not None:
                ins.deps.append((last, DEP_SIDE_EFFECT))
            self._host_objects[ho] = ins.id
        self._emit(ins)

    def _compile_horizon_or_epoch(self, cmd: cg.Command) -> None:
        for b in self._buffers.values():
            self._materialize_all(b)
        task = cmd.task
        if cmd.kind == cg.EPOCH:
            ins: Instruction = EpochInstruction(self._new_id(), task=task.id, action=task.epoch_action,
                                                garbage=self._garbage, stream_hash=task.stream_hash,
                                                digest=task.digest)
        else:
            ins = HorizonInstruction(self._new_id(), task=task.id, garbage=self._garbage)
        self._garbage = []
        horizons = self._horizons
        front_ids = sorted(horizons.front)
        horizons.front.clear()
        ins.deps = [(f, DEP_EXECUTION_FRONT) for f in front_ids]
        if not ins.deps and horizons.epoch is not None:
            ins.deps = [(horizons.epoch, DEP_LAST_EPOCH)]
        horizons.add(ins.id, ())
        self._out.append(ins)
        self._counts[ins.kind] = self._counts.get(ins.kind, 0) + 1
        if self.recorder is not None:
            self.recorder.record_instruction(ins)
        if cmd.kind == cg.EPOCH:
            horizons.epoch_generated(ins.id)
            self._apply_epoch(ins.id)
        else:
            prev = horizons.horizon(ins.id)
            if prev is not None:
                self._apply_epoch(prev)

    def _apply_epoch(self, eid: int) -> None:
        """Older instructions are represented by the epoch from now on (see ``horizons``)."""
        for b in self._buffers.values():
            allocs = [a for lst in b.allocs.values() for a in lst]
            if b.user is not None:
                allocs.append(b.user)
            for a in allocs:
                a.access.apply_all(partial(collapse_access, eid=eid))
        for d in (self._host_objects, self._collective):
            collapse_map(d, eid)
        # the allocation order of bounded memories too: an allocation that depended on an
        # older free or allocation now depends on the epoch, which follows them.  Left as
        # they were, their ids sat in the replay key (``_memory_state``) at a distance that
        # grows every step, so that no step on a bounded memory was ever replayed
        if self._capacity:
            collapse_map(self._last_alloc, eid)
            collapse_map(self._batch_barrier, eid)
            for m, frees in self._frees_since.items():
                if frees and frees[0] < eid:
                    kept = [f for f in frees if f >= eid]
                    self._frees_since[m] = [eid] + kept


class _Singletons(dict):
    def __missing__(self, key):
        v = self[key] = (key, frozenset((key,)))
        return v


def _discard(b, bid: int, memory: int, plans) -> Region | None:
    """What the chunks on ``memory`` overwrite without reading: a resize need not copy it."""
    discard = None
    for p in plans:
        if p.memory != memory:
            continue
        prod = p.produced.get(bid)
        if prod:
            dis = prod - p.consumed[bid] if bid in p.consumed else prod
            discard = discard | dis if discard is not None else dis
    return discard


def _accessed(p: ChunkPlan, bid: int) -> Region:
    """What chunk ``p`` reads or writes of buffer ``bid``."""
    got = p.consumed.get(bid)
    put = p.produced.get(bid)
    if not got:
        return put if put is not None else Region.empty_region(p.bbox[bid].dims)
    return got | put if put else got


def _group_region(groups: tuple) -> Region:
    """The region of a chunk's allocation groups of one buffer (``ChunkPlan.groups``)."""
    return Region.from_box(groups[0]) if len(groups) == 1 else Region(groups)
