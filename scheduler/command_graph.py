"""Command graph: this rank's share of every task, plus the pushes and await-pushes.

Every rank runs the same generator over the same task stream and tracks the
distribution of data over all ranks, but only emits its own commands.  Hence
transfer ids agree across ranks without any communication.

Cost: splitting a task and evaluating its mappers is inherently O(ranks) per task
(both are cached across tasks, so a stencil pays dictionary lookups).  Everything
else stays O(1) per rank: the distribution state is kept as its projection onto
this rank's questions (see ``_BufferState``), so other ranks' reads and writes are
rejected by bounding-box tests unless they meet this rank's data, and the state
does not grow with the number of ranks.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

from . import task_graph as tg
from .errors import DiagnosticError
from .bounded_cache import BoundedCache
from .geometry import Box, Region, RegionMap
from .horizons import EpochTracker, collapse_access, collapse_map, forget_before
from .recorders import CommandRecorder
from .command_replay import CommandReplayMixin
from .replay import Chains, Replay
from .split import split_1d, split_2d
from .task_graph import BufferInfo, Reduction, Task

log = logging.getLogger("celeritas.command_graph")

EXECUTION = "execution"
PUSH = "push"
AWAIT_PUSH = "await_push"
REDUCTION = "reduction"
FENCE = "fence"
HORIZON = "horizon"
EPOCH = "epoch"


@dataclass(slots=True, eq=False)
class Command:
    id: int
    task: Task
    deps: dict[int, tuple[str, str]] = field(default_factory=dict)
    kind = "command"

    def add_dep(self, dep: "Command", kind: str, origin: str) -> None:
        if dep is self:
            return
        cur = self.deps.get(dep.id)
        if cur is None or (cur[0] == tg.ANTI_DEP and kind == tg.TRUE_DEP):
            self.deps[dep.id] = (kind, origin)

    def fields(self) -> dict:
        return {}

    def to_record(self) -> dict:
        rec = {"id": self.id, "kind": self.kind, "task": self.task.id,
               "deps": [{"id": d, "kind": k, "origin": o} for d, (k, o) in sorted(self.deps.items())]}
        rec.update(self.fields())
        return rec


@dataclass(slots=True, eq=False)
class ExecutionCommand(Command):
    box: Box | None = None
    include_current_reductions: bool = False  # this chunk folds in the buffers' old values
    plans: list | None = None                 # the instruction generator's device chunks (cached)
    # a replayed command's cell in its command template, shared by every command made from
    # that template entry: the instruction generator keeps there what follows from the
    # entry alone (its plans and signature; see ``InstructionGraphGenerator._plan_chunks``)
    memo: list | None = None
    kind = EXECUTION

    def fields(self) -> dict:
        return {"box": self.box.to_json()}


@dataclass(slots=True, eq=False)
class PushCommand(Command):
    transfer: tuple[int, int, int] = (0, 0, 0)
    targets: list[tuple[int, Region]] = field(default_factory=list)
    contributes: bool = True          # reduction pushes: False = this rank has no partial
    kind = PUSH

    def fields(self) -> dict:
        return {"transfer": list(self.transfer),
                "targets": [{"rank": r, "region": reg.to_json()} for r, reg in self.targets]}


@dataclass(slots=True, eq=False)
class AwaitPushCommand(Command):
    transfer: tuple[int, int, int] = (0, 0, 0)
    region: Region | None = None
    kind = AWAIT_PUSH

    def fields(self) -> dict:
        return {"transfer": list(self.transfer), "region": self.region.to_json()}


@dataclass(slots=True, eq=False)
class ReductionCommand(Command):
    reduction: Reduction | None = None
    buffer: int = 0
    transfer: tuple[int, int, int] = (0, 0, 0)
    contributes: bool = True          # this rank holds a partial result
    kind = REDUCTION

    def fields(self) -> dict:
        return {"reduction": self.reduction.id, "buffer": self.buffer}


@dataclass(slots=True, eq=False)
class FenceCommand(Command):
    kind = FENCE

    def fields(self) -> dict:
        return {}


@dataclass(slots=True, eq=False)
class HorizonCommand(Command):
    kind = HORIZON


@dataclass(slots=True, eq=False)
class EpochCommand(Command):
    kind = EPOCH


# Distribution state.  Conceptually every point of a buffer has (writer rank, ranks
# holding the newest data), or nothing before the first write; writer -1 means "every
# rank" (host-initialized data, reduction results).  A rank only ever asks two
# questions of it: "which ranks lack data that *I* wrote?" (pushes) and "do *I* lack
# this data?" (await-pushes).  So ``_BufferState`` keeps the projection of that state
# onto those questions, which stays small however many ranks there are:
#
#   mine     RegionMap: the holders (frozenset of ranks) where this rank wrote the
#            newest data, None elsewhere
#   mine_bb  a conservative bounding Box of mine's non-None part (None: none)
#   held     Region where this rank holds the newest (initialized) data
#   uninit   Region never written: nothing is transferred for it
#
# Another rank's read matters only where it intersects ``mine`` (it becomes a holder;
# it may need a push), another rank's write only where it intersects ``mine`` or
# ``held``: bounding-box tests reject everything else, so the per-rank work of a task
# is O(1) and the state does not grow with the number of ranks.
_ALL = -1
_NO_READERS: frozenset = frozenset()


class _BufferState:
    __slots__ = ("info", "shape", "dims", "mine", "mine_bb", "held", "uninit", "access", "pending")

    def __init__(self, info: BufferInfo, num_ranks: int):
        self.info = info
        self.shape = info.shape
        box = info.box
        self.dims = box.dims
        self.mine = RegionMap(box, None)
        self.mine_bb: Box | None = None
        full = Region.from_box(box)
        empty = Region.empty_region(box.dims)
        self.held = full if info.host_initialized else empty
        self.uninit = empty if info.host_initialized else full
        # per point: (last writer command id or None, command ids that read since then)
        self.access = RegionMap(box, (None, _NO_READERS))
        self.pending: tuple[Reduction, frozenset[int]] | None = None


def split_task(task: Task, num_ranks: int, cache: dict | None = None) -> list[tuple[int, Box]]:
    """The chunks of a task as (rank, box); identical on every rank.  ``cache`` (a
    ``BoundedCache``) memoizes per geometry: a stencil submits the same split every step,
    and with many ranks ``split_2d``'s grid search is not free.  (A cached list is shared:
    callers must not modify it.)"""
    kind = task.kind
    geom = task.geometry
    if geom is None:
        full = Box((), ())
        key = None
    else:
        key = (kind, geom.dims, geom.global_range, geom.offset, geom.granularity, task.split, num_ranks)
        if cache is not None:
            hit = cache.get(key)
            if hit is not None:
                return hit
        full = geom.box
    if kind == tg.FENCE:
        out = [(r, full) for r in range(num_ranks)]
    elif full.empty:     # (a master-node task over an empty range too: it has no partition to run)
        out = []
    elif kind == tg.MASTER_NODE:
        out = [(0, full)]
    elif kind == tg.COLLECTIVE:
        out = [(r, b) for r, b in enumerate(split_1d(full, (1,) * max(1, geom.dims), num_ranks))]
    elif geom.dims == 0:
        out = [(0, full)]
    else:
        splitter = split_2d if task.split == "2d" and geom.dims >= 2 else split_1d
        gran = geom.granularity or (1,) * geom.dims
        out = list(enumerate(splitter(full, gran, num_ranks)))
    if key is not None and cache is not None:
        cache.put(key, out)
    return out


class CommandGraphGenerator(CommandReplayMixin):
    """Generates the commands of one rank from the task stream."""

    # (for the replay mixin, which cannot import this module at its top)
    _COMMAND_CLASSES = (AwaitPushCommand, ExecutionCommand, PushCommand, ReductionCommand)

    def __init__(self, num_ranks: int, rank: int, *, diagnostics: str = tg.DIAG_WARN,
                 recorder: CommandRecorder | None = None, buffers: dict[int, BufferInfo] | None = None,
                 replay: Replay | None = None):
        self.num_ranks = num_ranks
        self.rank = rank
        self.diagnostics = diagnostics
        self.recorder = recorder
        self.replay = replay
        self._shapes: dict = {}   # buffer -> its replay shape record (see command_replay)
        self._stale: dict = {}    # buffers whose objects lag behind their replay shape
        self._warned = False   # a diagnostic was logged while lowering (such lowerings are not memoized)
        self._epoch_merged = False   # a lowering merged an epoch dependency into an anti one (replay)
        self._mapper_warned: set = set()   # (task name, buffer) already told of a mapper (_check_mapper_covers_chunks)
        self._buffers: dict[int, _BufferState] = {}
        self._next_id = 0
        self._horizons = EpochTracker()   # front (id -> command), current horizon, epoch for new
        self._last_side_effect: dict[int, Command] = {}
        self._last_collective: dict[int, Command] = {}
        self.num_commands = 0
        self._live: dict[int, Command] = {}   # commands that may still be dependency targets
        self._chain: dict | None = None   # the node of the chain of templates the state is at (replay)
        self._chains = Chains()
        self._me_only = frozenset((rank,))
        self._split_cache = BoundedCache(1024)     # see ``split_task``
        self._regions_cache = BoundedCache(256)    # see ``_chunk_regions``
        self._mine_cache = BoundedCache(256)       # see ``_my_chunks``
        self._builder_code = BoundedCache(256)     # command templates' builder source -> code (command_replay)
        for info in (buffers or {}).values():
            self.create_buffer(info)

    # ---- buffers -----------------------------------------------------------------
    def create_buffer(self, info: BufferInfo) -> None:
        st = _BufferState(info, self.num_ranks)
        self._chain = None
        epoch = self._horizons.epoch
        if info.host_initialized and epoch is not None:
            st.access.update(info.box, (epoch, _NO_READERS))
        self._buffers[info.id] = st

    def destroy_buffer(self, bid: int) -> None:
        self._chain = None
        self._buffers.pop(bid, None)
        self._shapes.pop(bid, None)
        self._stale.pop(bid, None)

    # ---- commands --------------------------------------------------------------
    def _new(self, cls, task: Task, **kw) -> Command:
        c = cls(self._next_id, task, **kw)
        self._next_id += 1
        return c

    def _commit(self, out: list[Command], c: Command) -> None:
        horizons = self._horizons
        if c.kind in (HORIZON, EPOCH):
            for f in horizons.collapse_front():
                c.add_dep(f, tg.TRUE_DEP, tg.ORIGIN_EXECUTION_FRONT)
            horizons.add(c.id, (), c)
        else:
            epoch = horizons.epoch
            if epoch is not None:
                for k, _ in c.deps.values():
                    if k == tg.TRUE_DEP:
                        break
                else:
                    if epoch in c.deps:   # (merged into an anti-dependency: see CommandReplayMixin._record)
                        self._epoch_merged = True
                    c.add_dep(self._live[epoch], tg.TRUE_DEP, tg.ORIGIN_LAST_EPOCH)
            horizons.add(c.id, c.deps, c)
        self._register(out, c)

    def _register(self, out: list[Command], c: Command) -> None:
        """A command whose dependencies are final joins the graph (the execution front
        was updated by the caller)."""
        self._live[c.id] = c
        out.append(c)
        self.num_commands += 1
        if self.recorder is not None:
            self.recorder.record_command(c)

    # Dependencies between this rank's commands come from ``access``: per point the last
    # writer and the readers since.  One pass over the map per access (the values it
    # returns are unmerged and may repeat; only the set of dependencies matters).
    def _read(self, st: _BufferState, cmd: Command, region: Region) -> None:
        cid = cmd.id
        live = self._live
        seen = set()
        for w in st.access.read_collect(region, cid):
            if w is not None and w not in seen:
                seen.add(w)
                c = live.get(w)
                if c is not None:
                    cmd.add_dep(c, tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)

    def _write(self, st: _BufferState, cmd: Command, region: Region) -> None:
        cid = cmd.id
        live = self._live
        for w, readers in set(st.access.update_collect(region, (cid, _NO_READERS))):
            found = False
            for r in readers:
                if r != cid:
                    c = live.get(r)
                    if c is not None:
                        cmd.add_dep(c, tg.ANTI_DEP, tg.ORIGIN_DATAFLOW)
                        found = True
            if not found and w is not None and w != cid:
                # write-after-write: order behind the previous writer of this part
                c = live.get(w)
                if c is not None:
                    cmd.add_dep(c, tg.ANTI_DEP, tg.ORIGIN_DATAFLOW)

    def build(self, task: Task) -> list[Command]:
        """Commands of this rank for ``task``, in a valid order."""
        out: list[Command] = []
        if self.replay is not None:
            self._build_replayed(task, out)
        else:
            self._build_now(task, out)
        return out

    def _build_now(self, task: Task, out: list[Command]) -> None:
        # (the epoch is collapsed onto before the tracker moves to it: see _set_epoch)
        if task.kind == tg.EPOCH:
            c = self._new(EpochCommand, task)
            self._commit(out, c)
            self._set_epoch(c)
            self._horizons.epoch_generated(c.id)
        elif task.kind == tg.HORIZON:
            c = self._new(HorizonCommand, task)
            self._commit(out, c)
            prev = self._horizons.current_horizon    # (the previous horizon becomes the epoch)
            if prev is not None:
                self._set_epoch(self._live[prev])
            self._horizons.horizon(c.id)
        else:
            self._build_compute(task, out)

    def _set_epoch(self, epoch: Command) -> None:
        """``epoch`` now represents every older command (see ``horizons``).  Called while the
        tracker still names the old epoch: the buffers that replay left as shapes are restored
        first, and a shape's references to the epoch stand for the epoch of when it was taken."""
        eid = epoch.id
        self._sync_buffers(None)
        for st in self._buffers.values():
            st.access.apply_all(partial(collapse_access, eid=eid))
        self._shapes.clear()
        for d in (self._last_side_effect, self._last_collective):
            collapse_map(d, eid, epoch, key=_command_id)
        # commands older than the epoch are no longer needed for dependency lookups
        forget_before(self._live, eid)

    def _chunk_regions(self, mapper, shape: tuple, chunks: list, task: Task | None = None,
                       bid: int | None = None) -> list[Region]:
        """``mapper`` applied to every chunk.  Built-in mappers and splits are shared across
        tasks (see ``to_scheduler_mapper`` and ``split_task``), so a stencil asks for the
        same list every step: cached by identity (the cache keeps both objects alive, so an
        identity cannot be reused while its entry exists).  A new list is checked against
        what the mapper gives the whole range (``task``'s, for diagnostics)."""
        key = (mapper, shape, id(chunks))
        hit = self._regions_cache.get(key)
        if hit is not None and hit[0] is chunks:
            return hit[1]
        regs = [mapper(box, shape) for _rank, box in chunks]
        if task is not None and self.diagnostics != tg.DIAG_OFF and len(chunks) > 1:
            self._check_mapper_covers_chunks(task, bid, mapper, shape, chunks, regs)
        self._regions_cache.put(key, (chunks, regs))
        return regs

    def _check_mapper_covers_chunks(self, task: Task, bid: int, mapper, shape: tuple, chunks: list,
                                    regs: list[Region]) -> None:
        """A range mapper must map a part of the range into what it maps the whole range to:
        the task graph orders tasks (and checks reads of unwritten data) by the whole
        range's result, the command graph moves data by the chunks'.  One that does not
        (``chunk.offset == k`` where "the chunk holds k" was meant: the whole range then
        maps to nothing) gives correct data but task dependencies and horizons that miss
        accesses; said once per task name and buffer."""
        geom = task.geometry
        if geom is None:
            return
        whole = mapper(geom.box, shape)
        for (rank, box), reg in zip(chunks, regs):
            if reg and not whole.contains(reg):
                warned = (task.name, bid)
                if self.diagnostics != tg.DIAG_ERROR and warned in self._mapper_warned:
                    return
                info = self._buffers[bid].info
                msg = (f"{task.label}: the range mapper of its access to buffer {info.label} maps rank "
                       f"{rank}'s chunk {box} to {reg}, which is not inside what it maps the whole range "
                       f"{geom.box} to ({whole}); a range mapper must map a part of the range into what it "
                       f"maps the whole range to")
                if self.diagnostics == tg.DIAG_ERROR:
                    raise DiagnosticError(msg)
                self._mapper_warned.add(warned)
                self._warned = True
                if self.rank == 0:
                    log.warning(msg)
                return

    def _my_chunks(self, chunks: list) -> tuple[int, ...]:
        """Indices of this rank's chunks (splits are shared across tasks: cached by identity)."""
        hit = self._mine_cache.get(id(chunks))
        if hit is not None and hit[0] is chunks:
            return hit[1]
        me = self.rank
        idx = tuple(i for i, (r, _b) in enumerate(chunks) if r == me)
        self._mine_cache.put(id(chunks), (chunks, idx))
        return idx

    @staticmethod
    def _meeting_mine(st: _BufferState, regs: list[Region]) -> set[int]:
        """Chunks whose regions may meet what this rank wrote or holds (bounding boxes)."""
        near: set[int] = set()
        if st.mine_bb is not None:
            near.update(st.mine_bb.indices_meeting(regs))
        if st.held:
            near.update(st.held.bounding_box.indices_meeting(regs))
        return near

    # ---- distribution ------------------------------------------------------------
    def _dist_write(self, st: _BufferState, rank: int, reg: Region) -> None:
        """``rank`` wrote ``reg``: it alone holds the newest data there."""
        if not reg:
            return
        if rank == self.rank:
            st.mine.update(reg, self._me_only)
            bb = st.mine_bb
            if bb is None:
                st.mine_bb = reg.bounding_box
            elif not bb.contains(reg):
                st.mine_bb = bb.bounding(reg.bounding_box)
            held = st.held
            if not held.contains(reg):
                st.held = held | reg
        else:
            bb = st.mine_bb
            if bb is not None and reg.bounds_intersect(bb):
                st.mine.update(reg, None)
            held = st.held
            if held and held.bounds_intersect(reg):
                st.held = held - reg
        uninit = st.uninit
        if uninit:
            st.uninit = uninit - reg

    def _dist_replicated(self, st: _BufferState, holders: frozenset[int]) -> None:
        """``holders`` hold the newest data of the whole buffer, written by the lowest of them."""
        box = st.info.box
        st.mine = RegionMap(box, None)
        st.mine_bb = None
        st.uninit = Region.empty_region(box.dims)
        if self.rank == min(holders):
            st.mine.update(box, holders)
            st.mine_bb = box
        st.held = Region.from_box(box) if self.rank in holders else Region.empty_region(box.dims)

    def _dist_all(self, st: _BufferState) -> None:
        """Every rank holds the newest data of the whole buffer (reduction results)."""
        box = st.info.box
        st.mine = RegionMap(box, None)
        st.mine_bb = None
        st.held = Region.from_box(box)
        st.uninit = Region.empty_region(box.dims)

    # ---- compute tasks ---------------------------------------------------------
    def _build_compute(self, task: Task, out: list[Command]) -> None:
        if self._stale:
            self._sync_buffers(task.buffer_ids)
        me = self.rank
        buffers = self._buffers
        chunks = split_task(task, self.num_ranks, self._split_cache)
        # per buffer, the region every chunk reads / writes (lists indexed like ``chunks``;
        # buffers in the order of their first access)
        reads: dict[int, list[Region]] = {}
        writes: dict[int, list[Region]] = {}
        if chunks:
            consumer_modes = tg.CONSUMER_MODES
            producer_modes = tg.PRODUCER_MODES
            for a in task.accesses:
                bid = a.buffer
                regs = self._chunk_regions(a.mapper, buffers[bid].shape, chunks, task, bid)
                mode = a.mode
                if mode in consumer_modes:
                    cur = reads.get(bid)
                    reads[bid] = regs if cur is None else [x | y for x, y in zip(cur, regs)]
                if mode in producer_modes:
                    cur = writes.get(bid)
                    writes[bid] = regs if cur is None else [x | y for x, y in zip(cur, regs)]
            # A reduction that folds in the buffer's current value does so in the first chunk
            # (see ``include_current_reductions``): that chunk reads the whole buffer, which
            # may live on another rank and then has to be pushed here first.
            for red in task.reductions:
                if red.include_current:
                    bid = red.buffer
                    full = Region.from_box(buffers[bid].info.box)
                    cur = reads.get(bid)
                    regs = list(cur) if cur is not None else [Region.empty_region(full.dims)] * len(chunks)
                    regs[0] = regs[0] | full
                    reads[bid] = regs
        if self.diagnostics != tg.DIAG_OFF:
            self._check_overlapping_writes(task, chunks, writes)

        # 1. resolve pending reductions that this task consumes (on the ranks that read them)
        for bid in sorted(reads.keys()):
            st = buffers[bid]
            if st.pending is not None:
                consumers = frozenset(chunks[i][0] for i, reg in enumerate(reads[bid]) if reg)
                if consumers:
                    self._resolve_reduction(task, st, consumers, out)
        for bid in writes:
            st = buffers[bid]
            if st.pending is not None and bid not in reads:
                st.pending = None   # overwritten without being read: the partials are dead

        # 2./3. pushes of what this rank wrote to the other ranks' chunks that lack it (one
        # push per buffer), await-pushes for what this rank's chunk reads but lacks; then
        # every reader holds what it read.  A rank's read changes only what that rank holds,
        # so each chunk sees the state from before the task.  Hot loop (one iteration per
        # rank): another rank's read is rejected by a bounding-box test unless it meets
        # data this rank wrote.
        push_targets: dict[int, dict[int, Region]] = {}
        awaits: dict[int, Region] = {}
        mine = self._my_chunks(chunks)
        for bid, regs in reads.items():
            st = buffers[bid]
            for i in mine:
                reg = regs[i]
                if not reg:
                    continue
                hb = st.held.as_box()
                if hb is not None and hb.contains(reg):
                    continue   # (fast path: a one-box held region that contains the read)
                uninit = st.uninit
                missing = reg - st.held
                if uninit and missing:
                    missing = missing - uninit
                if missing:
                    awaits[bid] = awaits[bid] | missing if bid in awaits else missing
                    # (nothing missing: reg lies in held | uninit, held does not change)
                    st.held = st.held | (reg - uninit if uninit else reg)
            bb = st.mine_bb
            if bb is None:
                continue
            for i in bb.indices_meeting(regs):
                rank = chunks[i][0]
                if rank == me:
                    continue
                reg = regs[i]
                lack = [(lo, hi) for lo, hi, s in st.mine.items_in(reg) if s is not None and rank not in s]
                if lack:
                    tgt = push_targets.setdefault(bid, {})
                    part = Region.from_corners(lack, st.dims)
                    tgt[rank] = tgt[rank] | part if rank in tgt else part
                    st.mine.apply(reg, lambda s, r=rank: s if s is None or r in s else s | {r})
        for bid in sorted(push_targets):
            st = buffers[bid]
            tgts = sorted(push_targets[bid].items())
            c = self._new(PushCommand, task, transfer=(task.id, bid, 0), targets=tgts)
            union = tgts[0][1]
            for _, reg in tgts[1:]:
                union = union | reg
            self._read(st, c, union)
            self._commit(out, c)
        for bid in sorted(awaits):
            st = buffers[bid]
            c = self._new(AwaitPushCommand, task, transfer=(task.id, bid, 0), region=awaits[bid])
            self._write(st, c, awaits[bid])
            self._commit(out, c)

        # 4. this rank's execution command
        for i, (rank, box) in enumerate(chunks):
            if rank != me:
                continue
            rd = {bid: regs[i] for bid, regs in reads.items()}
            wr = {bid: regs[i] for bid, regs in writes.items()}
            if task.kind == tg.FENCE:
                c = self._new(FenceCommand, task)
            else:
                c = self._new(ExecutionCommand, task, box=box, include_current_reductions=(me == chunks[0][0]))
            for bid, reg in rd.items():
                self._read(buffers[bid], c, reg)
            for bid, reg in wr.items():
                self._write(buffers[bid], c, reg)
            for red in task.reductions:
                self._write(buffers[red.buffer], c, Region.from_box(buffers[red.buffer].info.box))
            for ho in task.side_effects:
                prev = self._last_side_effect.get(ho)
                if prev is not None:
                    c.add_dep(prev, tg.TRUE_DEP, tg.ORIGIN_SIDE_EFFECT)
                self._last_side_effect[ho] = c
            if task.collective_group is not None:
                prev = self._last_collective.get(task.collective_group)
                if prev is not None:
                    c.add_dep(prev, tg.TRUE_DEP, tg.ORIGIN_COLLECTIVE)
                self._last_collective[task.collective_group] = c
            self._commit(out, c)

        # 5. distribution after the writes (per buffer in chunk order, as overlapping writes
        # resolve).  Hot loop: once every point is initialized, another rank's write matters
        # only where it meets what this rank wrote or holds (bounding-box test).
        for bid, regs in writes.items():
            st = buffers[bid]
            near = None
            for i, ((rank, _box), reg) in enumerate(zip(chunks, regs)):
                if not reg:
                    continue
                if rank != me and not st.uninit:
                    if near is None:
                        near = self._meeting_mine(st, regs)
                    if i not in near:
                        continue
                self._dist_write(st, rank, reg)
                if rank == me:
                    near = None   # what this rank wrote and holds grew: test the later chunks anew
        if task.reductions:
            participants = frozenset(r for r, _ in chunks)
            for red in task.reductions:
                st = buffers[red.buffer]
                if not chunks:
                    # An empty range reduces nothing: folded into the current value that is the
                    # current value, left as it is (a pending reduction included); without it
                    # the result is the identity, which a reduction without participants
                    # gathers (on one rank too: there is no chunk to fill it).  The current
                    # value was lost on several ranks, where no chunk folded it in.
                    if not red.include_current:
                        st.pending = (red, participants)
                        self._dist_all(st)
                    continue
                # (on one rank nothing is pending after a reduction: an older pending one, from
                # an empty range, is resolved above if this one folds in the current value,
                # and dead otherwise; it used to survive and overwrite this result)
                if self.num_ranks > 1 and len(participants) > 1:
                    st.pending = (red, participants)
                    self._dist_all(st)
                else:
                    # one chunk's rank holds the whole result (it folded in the current value
                    # too: the first chunk does): a write of the buffer by that rank, pushed
                    # to later readers as any, with no partials to gather (as in Celerity)
                    st.pending = None
                    self._dist_replicated(st, participants)

    def _resolve_reduction(self, task: Task, st: _BufferState, consumers: frozenset[int],
                           out: list[Command]) -> None:
        """Combine the partial results of a pending reduction where ``task`` reads them.

        Only the consumers gather and reduce: every rank sends its partial (or, without
        one, an empty notification) to each consumer, and each consumer receives the
        others' and reduces.  Afterwards the consumers hold the result; the lowest of them
        counts as its writer, so it alone pushes it to later readers.
        """
        red, participants = st.pending
        st.pending = None
        me = self.rank
        bid = st.info.id
        region = Region.from_box(st.info.box)
        transfer = (task.id, bid, red.id)
        contributes = me in participants
        targets = [(r, region) for r in sorted(consumers) if r != me]
        if targets:
            push = self._new(PushCommand, task, transfer=transfer, targets=targets, contributes=contributes)
            self._read(st, push, region)
            self._commit(out, push)
        if me in consumers:
            await_ = self._new(AwaitPushCommand, task, transfer=transfer, region=region)
            self._commit(out, await_)
            rc = self._new(ReductionCommand, task, reduction=red, buffer=bid, transfer=transfer,
                           contributes=contributes)
            rc.add_dep(await_, tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)
            self._read(st, rc, region)
            self._write(st, rc, region)
            self._commit(out, rc)
        self._dist_replicated(st, consumers)

    def _check_overlapping_writes(self, task: Task, chunks, writes: dict[int, list[Region]]) -> None:
        """Warn (or raise) when two chunks write the same element of a buffer.

        Chunks of a split are disjoint, so writes that stay inside their own chunk box
        (one_to_one and the like: the common case) cannot overlap: that is checked in
        O(1) per chunk.  Otherwise a sweep along dim 0 over the bounding boxes finds the
        candidate pairs, which are checked exactly; the first overlapping pair in (chunk,
        chunk, buffer) order is reported, as a nested loop over the chunks would.
        """
        n = len(chunks)
        if n < 2 or not writes:
            return
        if task.kind != tg.FENCE:
            inside = True
            for regs in writes.values():
                for (_rank, box), reg in zip(chunks, regs):
                    if not reg:
                        continue
                    if not box.contains(reg):
                        inside = False
                        break
                if not inside:
                    break
            if inside:
                return   # every write inside its own (disjoint) chunk
        found = []   # (i, j, position of the buffer among the written ones, bid)
        for pos, (bid, regs) in enumerate(writes.items()):
            lst = []
            for i, reg in enumerate(regs):
                if reg:
                    lo, hi = reg.bounds
                    lst.append((lo[0], i, lo, hi, reg))
            if len(lst) < 2:
                continue
            lst.sort(key=lambda e: (e[0], e[1]))
            active: list = []
            for e in lst:
                _x, i, lo, hi, reg = e
                active = [a for a in active if a[3][0] > lo[0]]
                for a in active:
                    if a[4].bounds_intersect(reg) and a[4].intersects(reg):
                        found.append((min(a[1], i), max(a[1], i), pos, bid))
                active.append(e)
        if not found:
            return
        i, j, _pos, bid = min(found)
        reg, other = writes[bid][i], writes[bid][j]
        info = self._buffers[bid].info
        msg = (f"{task.label} writes {reg & other} of buffer {info.label} from the chunks "
               f"of ranks {chunks[i][0]} and {chunks[j][0]} (overlapping writes)")
        if self.diagnostics == tg.DIAG_ERROR:
            raise DiagnosticError(msg)
        if self.rank == 0:
            log.warning(msg)
            self._warned = True


def _command_id(c: Command) -> int:
    return c.id

