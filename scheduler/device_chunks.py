"""Device chunks: how an execution command is cut across this rank's devices.

A command's box is split once more into one chunk per device (times the
``oversubscribe`` hint), under the task's split and granularity, and every chunk's
accesses are evaluated once; the resulting plans are shared between commands with
the same box and accesses (a stencil plans the same chunks every step).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import command_graph as cg
from . import task_graph as tg
from .errors import DiagnosticError, OutOfMemoryError, RangeMapperError
from .geometry import Box, Region
from .instruction_graph import HOST_MEMORY, device_memory
from .split import split_1d, split_2d

import logging

log = logging.getLogger("celeritas.instruction_graph")


@dataclass(slots=True)
class ChunkPlan:
    box: Box
    memory: int
    device: int | None
    accesses: list[tuple[tg.BufferAccess, Region, Box]] = field(default_factory=list)  # (access, region, bbox)
    consumed: dict[int, Region] = field(default_factory=dict)
    produced: dict[int, Region] = field(default_factory=dict)
    bbox: dict[int, Box] = field(default_factory=dict)     # per buffer: bounding box of all its accesses
    # per buffer: the boxes allocated contiguously, one allocation each (its accesses'
    # bounding boxes, those that touch merged: Box.touching_groups); mostly ``(bbox,)``
    groups: dict[int, tuple[Box, ...]] = field(default_factory=dict)
    cbbox: dict[int, Box] = field(default_factory=dict)    # bounding boxes of the consumed regions
    pbbox: dict[int, Box] = field(default_factory=dict)    # bounding boxes of the produced regions
    batch: tuple[int, int] | None = None  # (i, n): batch i of n of a chunk larger than its device memory

    def working_set(self, itemsize_of) -> int:
        """Bytes the chunk's allocations span on its memory."""
        return sum(box.area * itemsize_of(bid) for bid, box in self.allocation_boxes())

    def allocation_boxes(self) -> list[tuple[int, Box]]:
        """(buffer, box) of every allocation the chunk needs, by buffer."""
        return [(bid, box) for bid, boxes in sorted(self.groups.items()) for box in boxes]



class Plans(list):
    """The device chunks of an execution command (a list of ``ChunkPlan``) with what every
    compile of them needs first, computed once: the buffers they touch (sorted) and, per
    (buffer, memory) in sorted order, the boxes allocated contiguously (the chunks' groups
    on that memory, those that touch merged: one box in the common case)."""

    __slots__ = ("bids", "touch", "need", "overlap", "outside", "requirements", "allocated_under")

    # identity semantics: a plan stands for its cache key (replay keys on the object)
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __init__(self, plans: list):
        super().__init__(plans)
        self.overlap: tuple | None = None   # (i, j, buffer, region): chunks i < j write region
        # (i, access, region, the command's region): chunk i maps outside the command's box
        self.outside: tuple | None = None
        self.requirements: tuple | None = None   # (buffer, memory, box) for lookahead, made on first use
        # lookahead: the shape ids of ``bids`` (interned buffer states) under which every
        # requirement was found allocated, so a repeating step asks one set, not per box
        self.allocated_under: set[tuple] = set()
        self.bids = tuple(sorted({bid for p in plans for bid in p.bbox}))
        # the same buffers in the order the task's accesses name them: replay's order (keys,
        # shapes, compiled builders), so that two steps whose buffers swap roles record
        # templates of one structure and share one compiled builder
        self.touch = tuple(dict.fromkeys([bid for p in plans for bid in p.bbox]))
        need: dict[tuple[int, int], tuple[Box, ...]] = {}
        for p in plans:
            if p.batch is not None:
                continue   # (batches allocate one after the other, when they run)
            for bid, boxes in p.groups.items():
                key = (bid, p.memory)
                have = need.get(key)
                need[key] = boxes if have is None else Box.touching_groups(have + boxes)
        self.need = [(key, box) for key in (sorted(need) if len(need) > 1 else need) for box in need[key]]




class ChunkPlanning:
    """Mixin of the instruction graph generator: plans of execution commands (uses its
    buffers, system, caches and diagnostics setting)."""

    def _plan_chunks(self, cmd: cg.ExecutionCommand) -> list[ChunkPlan]:
        """Device chunks of a command with their accesses; computed once per command, and
        shared between commands with the same box and the same accesses (a stencil plans
        the same chunks every step).  A plan depends only on the key below: the mappers are
        pure per chunk (keyed ones are shared across tasks, opaque user ones are new objects
        per task and never hit), buffer shapes are fixed per buffer id (the cache is dropped when
        a buffer is created), and plans are never modified once made."""
        plans = cmd.plans
        if plans is None:
            memo = cmd.memo
            token = self._plan_token
            if memo is not None and memo[0] is token:
                # (a command from the same command-template entry as one planned before: the
                # entry fixes the box and the task signature, which holds every part of the
                # key below; the token says the cache has not been dropped since)
                plans = cmd.plans = memo[1]
                return plans
            task = cmd.task
            geom = task.geometry
            box = cmd.box
            key = (task.kind, box.lo, box.hi, box.dims, task.split, task.oversubscribe,
                   geom.dims if geom is not None else None, geom.granularity if geom is not None else None,
                   tg.access_key(task),
                   # (reduction scratch counts against a bounded device memory)
                   tuple([r.buffer for r in task.reductions]) if self._capacity else ())
            cache = self._plan_cache
            plans = cache.get(key)
            if plans is None:
                plans = cache.put(key, self._make_plans(cmd))
            cmd.plans = plans
            if memo is not None:
                memo[0] = token
                memo[1] = plans
                memo[2] = None
                memo[3] = None
        return plans

    def _make_plans(self, cmd: cg.ExecutionCommand) -> list[ChunkPlan]:
        task = cmd.task
        k = max(1, task.oversubscribe)
        if task.kind == tg.DEVICE_COMPUTE:
            d = self.system.num_devices
            boxes = self._local_split(cmd, d * k)
            plans = []
            nb = len(boxes)
            for j, box in enumerate(boxes):
                dev = (j * d) // nb if nb >= d else j
                plans.append(ChunkPlan(box, device_memory(dev), dev))
        elif task.kind == tg.HOST_COMPUTE:
            # oversubscribed host tasks become several host-task instructions (lanes run them
            # concurrently), as device kernels become several kernels
            plans = [ChunkPlan(box, HOST_MEMORY, None) for box in self._local_split(cmd, k)]
        else:
            plans = [ChunkPlan(cmd.box, HOST_MEMORY, None)]
        for plan in plans:
            self._fill_plan(plan, task)
        if self._capacity and task.kind == tg.DEVICE_COMPUTE:
            # (a batch's reduction scratch lives until the command's local reduction, so the
            # chunks planned before it on its device count against its room)
            batched: list[ChunkPlan] = []
            live: dict[int, int] = {}
            for p in plans:
                parts = self._batches(p, cmd, live.get(p.memory, 0))
                live[p.memory] = live.get(p.memory, 0) + len(parts)
                batched.extend(parts)
            plans = batched
            self._sequence_if_too_large(plans, task)
        out = Plans(plans)
        out.overlap = overlapping_writes(plans)
        if len(plans) > 1 or plans[0].box != cmd.box:
            out.outside = self._mapped_outside(cmd, plans)
        return out

    def _mapped_outside(self, cmd: cg.ExecutionCommand, plans: list[ChunkPlan]) -> tuple | None:
        """The first local chunk (device chunk, oversubscribed part, batch) an access maps
        outside what it maps the command's whole box to, as (chunk index, access, its
        region, the box's region); None if there is none.  The command graph moves data
        between ranks by the box's region, so outside it a chunk would read data that
        never arrived, or write data no other rank learns of."""
        task = cmd.task
        for k, a in enumerate(task.accesses):
            whole = None
            for i, p in enumerate(plans):
                reg = p.accesses[k][1]
                if not reg:
                    continue
                if whole is None:
                    whole = a.mapper(cmd.box, self._buffers[a.buffer].info.shape)
                if not whole.contains(reg):
                    return (i, a, reg, whole)
        return None

    def _report_outside(self, cmd: cg.ExecutionCommand, plans: "Plans") -> None:
        """A range mapper maps a local chunk outside what it maps the rank's chunk to
        (``chunk.offset == k`` where "the chunk holds k" was meant, on a device chunk
        that starts at k).  On several ranks the data would be wrong, so it is an error
        whatever the diagnostics setting; on one rank every access is local and the
        data right, so it is the diagnostic the command graph gives for a rank's chunk
        outside the whole range (an error under ``error``, else a warning once per task
        name and buffer)."""
        i, a, reg, whole = plans.outside
        task = cmd.task
        p = plans[i]
        info = self._buffers[a.buffer].info
        part = f"device {p.device}'s chunk {p.box}" if p.device is not None else f"the chunk {p.box}"
        msg = (f"{task.label}: the range mapper of its access to buffer {info.label} maps {part} of rank "
               f"{self.rank} to {reg}, which is not inside what it maps the rank's chunk {cmd.box} to "
               f"({whole}); a range mapper must map a part of a chunk into what it maps the chunk to")
        if self.num_ranks > 1:
            verb = "read data that never arrived" if a.mode in tg.CONSUMER_MODES else \
                "write data no other rank learns of"
            raise RangeMapperError(f"{msg} (data moves between ranks by the rank's chunk: the part would {verb})")
        if self.diagnostics == tg.DIAG_ERROR:
            raise DiagnosticError(msg)
        warned = (task.name, a.buffer)
        if self.diagnostics == tg.DIAG_OFF or warned in self._mapper_warned:
            return
        self._mapper_warned.add(warned)
        self._warned = True
        log.warning(msg)

    def _fill_plan(self, plan: ChunkPlan, task) -> ChunkPlan:
        """Evaluate the chunk's accesses (regions, their bounding boxes per buffer)."""
        groups = plan.groups
        for a in task.accesses:
            b = self._buffers[a.buffer]
            reg = a.mapper(plan.box, b.info.shape)
            bb = reg.bounding_box
            plan.accesses.append((a, reg, bb))
            if a.mode in tg.CONSUMER_MODES:
                plan.consumed[a.buffer] = plan.consumed[a.buffer] | reg if a.buffer in plan.consumed else reg
            if a.mode in tg.PRODUCER_MODES:
                plan.produced[a.buffer] = plan.produced[a.buffer] | reg if a.buffer in plan.produced else reg
            if reg:
                if a.buffer in plan.bbox:
                    plan.bbox[a.buffer] = plan.bbox[a.buffer].bounding(bb)
                    have = groups[a.buffer]
                    if not any(g.contains_box(bb) for g in have):
                        groups[a.buffer] = Box.touching_groups(have + (bb,))
                else:
                    plan.bbox[a.buffer] = bb
                    groups[a.buffer] = (bb,)
        for regs, bbs in ((plan.consumed, plan.cbbox), (plan.produced, plan.pbbox)):
            for bid, reg in regs.items():
                bbs[bid] = reg.bounding_box
        return plan

    def _batches(self, plan: ChunkPlan, cmd: cg.ExecutionCommand, live: int = 0) -> list[ChunkPlan]:
        """``plan`` itself if its working set fits its device memory, else the batches it is
        cut into along dimension 0 (whole granules, as oversubscription cuts): each small
        enough to fit in half the memory where possible, so that the next batch's
        allocation and copies can proceed while the current batch's kernel runs (double
        buffering), else in all of it.  Every batch keeps a reduction scratch value until
        the command's local reduction, as do the ``live`` chunks and batches planned before
        this one on the device, so n batches leave room for ``live + n`` of them."""
        cap = self._capacity.get(plan.memory)
        task = cmd.task
        itemsize = self._itemsize_of
        extra = sum(itemsize(r.buffer) for r in task.reductions)   # (one chunk's reduction scratch)
        if cap is None or plan.working_set(itemsize) + extra * (live + 1) <= cap:
            return [plan]
        geom = task.geometry
        gran = (geom.granularity or (1,) * geom.dims)[0] if geom.dims else 1
        rows = plan.box.range[0] // gran if plan.box.dims else 1
        # The batch holding the first granule needs at least that granule's working set
        # (a mapper's result for a chunk covers its results for the parts), so a budget
        # below it cannot be met by any split: skip it instead of trying ever finer ones
        # (matmul's whole-B read made that search evaluate thousands of plans).
        one = split_1d(plan.box, (gran,) + (1,) * (plan.box.dims - 1), max(rows, 1))[0]
        need = self._fill_plan(ChunkPlan(one, plan.memory, plan.device), task).working_set(itemsize) \
            + extra * (live + 1)
        least = None   # (the fewest bytes any split tried needs, for the error)
        for budget in (cap // 2, cap):
            if need > budget:
                continue
            k = 2
            while k <= max(rows, 1):
                boxes = split_1d(plan.box, (gran,) + (1,) * (plan.box.dims - 1), k)
                parts = [self._fill_plan(ChunkPlan(box, plan.memory, plan.device), task) for box in boxes]
                worst = max(q.working_set(itemsize) for q in parts) + extra * (live + len(parts))
                least = worst if least is None else min(least, worst)
                if worst <= budget:
                    n = len(parts)
                    for i, q in enumerate(parts):
                        q.batch = (i, n)
                    return parts
                if len(boxes) < k:
                    break   # as fine as the granularity allows
                # (grow towards the number of batches the worst one suggests, but never past
                # one granule per batch, the finest split: jumping over it gave up too soon)
                k = min(max(k + 1, -(-k * worst // budget)), max(rows, k + 1))
        # (name what the bytes are for: a kernel with only reductions has no buffer of its
        # own, and a granule of several rows is what cannot be cut further)
        names = ", ".join(self._buffers[bid].info.label for bid in sorted(plan.bbox))
        parts = [f"buffers {names}"] if names else []
        if extra:
            targets = ", ".join(self._buffers[r.buffer].info.label for r in task.reductions)
            parts.append(f"the reduction scratch of every batch (reductions into {targets})")
        unit = "one row" if gran == 1 else f"one granule ({gran} rows, constrain_split)"
        raise OutOfMemoryError(
            f"{task.label}: {unit} of its chunk {plan.box} on device {plan.device} (memory M{plan.memory}) "
            f"needs at least {need if least is None else least} bytes for {' and '.join(parts)}"
            f", but the device's capacity is {cap} bytes: it cannot be "
            f"split into batches that fit (an all() or other whole-buffer access of a buffer larger than the "
            f"device?); raise CELERITAS_DEVICE_MEMORY_LIMIT / CELERITAS_HOST_DEVICE_MEMORY or read less per chunk")

    def _sequence_if_too_large(self, plans: list[ChunkPlan], task) -> None:
        """Chunks of one device (oversubscription) are allocated together, their accesses
        merged per buffer.  Where that merged set does not fit, or where some chunk of the
        device had to be cut into batches anyway, every chunk of the device runs as a batch
        instead, each allocating when its turn comes (an allocation kept for the whole
        command would leave the batches no room)."""
        by_memory: dict[int, list[ChunkPlan]] = {}
        for p in plans:
            if p.memory in self._capacity:
                by_memory.setdefault(p.memory, []).append(p)
        for memory, ps in by_memory.items():
            if len(ps) < 2:
                continue
            sequence = any(p.batch is not None for p in ps)
            if not sequence:
                merged: dict[int, tuple[Box, ...]] = {}
                for p in ps:
                    for bid, boxes in p.groups.items():
                        merged[bid] = Box.touching_groups(merged[bid] + boxes) if bid in merged else boxes
                scratch = len(ps) * sum(self._itemsize_of(r.buffer) for r in task.reductions)
                sequence = (sum(box.area * self._itemsize_of(bid) for bid, boxes in merged.items() for box in boxes)
                            + scratch > self._capacity[memory])
            if sequence:
                for i, p in enumerate(ps):
                    p.batch = (i, len(ps))

    def _itemsize_of(self, bid: int) -> int:
        return self._buffers[bid].itemsize

    def _local_split(self, cmd: cg.ExecutionCommand, n: int) -> list[Box]:
        """The command's box cut into ``n`` chunks for this rank's devices / lanes, under the
        task's split and granularity (whole work groups), as the command graph cuts ranks."""
        geom = cmd.task.geometry
        if geom is None or geom.dims == 0 or n == 1:
            return [cmd.box]
        gran = geom.granularity or (1,) * geom.dims
        two = cmd.task.split == "2d" and geom.dims >= 2
        key = (cmd.box.lo, cmd.box.hi, cmd.box.dims, gran, n, two)
        boxes = self._split_cache.get(key)
        if boxes is None:   # (a stencil splits the same command box every step)
            boxes = self._split_cache.put(key, split_2d(cmd.box, gran, n) if two else split_1d(cmd.box, gran, n))
        return boxes

    def _report_overlap(self, cmd: cg.ExecutionCommand, plans: "Plans") -> None:
        """Two local chunks of one command write the same element: the same diagnostic the
        command graph gives for chunks of different ranks."""
        i, j, bid, reg = plans.overlap
        task = cmd.task
        b = self._buffers[bid]
        pi, pj = plans[i], plans[j]
        if pi.device is not None and pi.device != pj.device:
            where = f"devices {pi.device} and {pj.device} of rank {self.rank}"
        else:
            where = f"chunks {pi.box} and {pj.box} of rank {self.rank}"
        msg = f"{task.label} writes {reg} of buffer {b.info.label} from the chunks of {where} (overlapping writes)"
        if self.diagnostics == tg.DIAG_ERROR:
            raise DiagnosticError(msg)
        log.warning(msg)
        self._warned = True




def overlapping_writes(plans: list[ChunkPlan]) -> tuple | None:
    """The first pair of chunks (in chunk, chunk, buffer order) whose writes intersect.
    Chunks are disjoint, so writes inside their own chunk box (the common case) cannot."""
    if len(plans) < 2:
        return None
    if all(p.box.contains(bb) for p in plans for bb in p.pbbox.values()):
        return None
    for i, pi in enumerate(plans):
        for j in range(i + 1, len(plans)):
            pj = plans[j]
            for bid, reg in sorted(pi.produced.items()):
                other = pj.produced.get(bid)
                if reg and other and pi.pbbox[bid].intersects(pj.pbbox[bid]):
                    both = reg & other
                    if both:
                        return (i, j, bid, both)
    return None
