"""Command graph: this rank's share of every task, plus the pushes and await-pushes.

Every rank runs the same generator over the same task stream and keeps the
distributed state of all ranks (who holds the newest copy of every region), but
only emits its own commands.  Hence transfer ids agree across ranks without any
communication.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from . import task_graph as tg
from .errors import DiagnosticError
from .geometry import Box, Region, RegionMap
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


# Distribution state per region: (writer rank, ranks holding the newest data), or
# None before the first write.  writer -1 means "every rank" (host-initialized).
_ALL = -1


class _BufferState:
    __slots__ = ("info", "dist", "last_writer", "readers", "pending")

    def __init__(self, info: BufferInfo, num_ranks: int):
        self.info = info
        box = info.box
        everyone = frozenset(range(num_ranks))
        self.dist = RegionMap(box, (_ALL, everyone) if info.host_initialized else None)
        self.last_writer = RegionMap(box, None)     # local command id
        self.readers = RegionMap(box, frozenset())  # local command ids since the last write
        self.pending: tuple[Reduction, frozenset[int]] | None = None


def split_task(task: Task, num_ranks: int) -> list[tuple[int, Box]]:
    """The chunks of a task as (rank, box); identical on every rank."""
    kind = task.kind
    geom = task.geometry
    full = geom.box if geom is not None else Box((), ())
    if kind == tg.FENCE:
        return [(r, full) for r in range(num_ranks)]
    if kind == tg.MASTER_NODE:
        return [(0, full)]
    if full.empty:
        return []
    if kind == tg.COLLECTIVE:
        return [(r, b) for r, b in enumerate(split_1d(full, (1,) * max(1, geom.dims), num_ranks))]
    if geom.dims == 0:
        return [(0, full)]
    splitter = split_2d if task.split == "2d" and geom.dims >= 2 else split_1d
    gran = geom.granularity or (1,) * geom.dims
    return list(enumerate(splitter(full, gran, num_ranks)))


class CommandGraphGenerator:
    """Generates the commands of one rank from the task stream."""

    def __init__(self, num_ranks: int, rank: int, *, diagnostics: str = tg.DIAG_WARN,
                 record: bool = False, buffers: dict[int, BufferInfo] | None = None):
        self.num_ranks = num_ranks
        self.rank = rank
        self.diagnostics = diagnostics
        self.record = record
        self.records: list[dict] = []
        self._buffers: dict[int, _BufferState] = {}
        self._next_id = 0
        self._front: dict[int, Command] = {}
        self._epoch_for_new: Command | None = None
        self._current_horizon: Command | None = None
        self._last_side_effect: dict[int, Command] = {}
        self._last_collective: dict[int, Command] = {}
        self.num_commands = 0
        self._live: dict[int, Command] = {}   # commands that may still be dependency targets
        for info in (buffers or {}).values():
            self.create_buffer(info)

    # ---- buffers -----------------------------------------------------------------
    def create_buffer(self, info: BufferInfo) -> None:
        st = _BufferState(info, self.num_ranks)
        if info.host_initialized and self._epoch_for_new is not None:
            st.last_writer.update(info.box, self._epoch_for_new.id)
        self._buffers[info.id] = st

    def destroy_buffer(self, bid: int) -> None:
        self._buffers.pop(bid, None)

    # ---- commands --------------------------------------------------------------
    def _new(self, cls, task: Task, **kw) -> Command:
        c = cls(self._next_id, task, **kw)
        self._next_id += 1
        return c

    def _commit(self, out: list[Command], c: Command) -> None:
        if c.kind in (HORIZON, EPOCH):
            for f in sorted(self._front.values(), key=lambda x: x.id):
                c.add_dep(f, tg.TRUE_DEP, tg.ORIGIN_EXECUTION_FRONT)
            self._front.clear()
        else:
            if not any(k == tg.TRUE_DEP for k, _ in c.deps.values()) and self._epoch_for_new is not None:
                c.add_dep(self._epoch_for_new, tg.TRUE_DEP, tg.ORIGIN_LAST_EPOCH)
            for d in c.deps:
                self._front.pop(d, None)
        self._front[c.id] = c
        self._live[c.id] = c
        out.append(c)
        self.num_commands += 1
        if self.record:
            rec = c.to_record()
            rec["rank"] = self.rank
            self.records.append(rec)

    def _read(self, st: _BufferState, cmd: Command, region: Region) -> None:
        for _box, w in st.last_writer.query(region):
            if w is not None and w in self._live:
                cmd.add_dep(self._live[w], tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)
        st.readers.apply(region, lambda s, c=cmd.id: s | {c})

    def _write(self, st: _BufferState, cmd: Command, region: Region) -> None:
        live = self._live
        for box, readers in st.readers.query(region):
            found = False
            for r in readers:
                if r != cmd.id and r in live:
                    cmd.add_dep(live[r], tg.ANTI_DEP, tg.ORIGIN_DATAFLOW)
                    found = True
            if not found:
                # write-after-write: order behind the previous writer of this part
                for _b, w in st.last_writer.query(box):
                    if w is not None and w != cmd.id and w in live:
                        cmd.add_dep(live[w], tg.ANTI_DEP, tg.ORIGIN_DATAFLOW)
        st.last_writer.update(region, cmd.id)
        st.readers.update(region, frozenset())

    def build(self, task: Task) -> list[Command]:
        """Commands of this rank for ``task``, in a valid order."""
        out: list[Command] = []
        if task.kind == tg.EPOCH:
            c = self._new(EpochCommand, task)
            self._commit(out, c)
            self._set_epoch(c)
            self._current_horizon = None
        elif task.kind == tg.HORIZON:
            c = self._new(HorizonCommand, task)
            self._commit(out, c)
            prev = self._current_horizon
            self._current_horizon = c
            if prev is not None:
                self._set_epoch(prev)
        else:
            self._build_compute(task, out)
        return out

    def _set_epoch(self, epoch: Command) -> None:
        self._epoch_for_new = epoch
        eid = epoch.id
        for st in self._buffers.values():
            lw = st.last_writer
            if any(v is not None and v < eid for v in lw.values()):
                lw.apply(lw.extent, lambda v: eid if v is not None and v < eid else v)
            rd = st.readers
            if any(any(r < eid for r in s) for s in rd.values()):
                rd.apply(rd.extent, lambda s: frozenset([r for r in s if r >= eid] + [eid])
                         if any(r < eid for r in s) else s)
        for d in (self._last_side_effect, self._last_collective):
            for k, v in list(d.items()):
                if v.id < eid:
                    d[k] = epoch
        # commands older than the epoch are no longer needed for dependency lookups
        live = self._live
        for cid in [k for k in live if k < eid]:
            del live[cid]

    # ---- compute tasks ---------------------------------------------------------
    def _build_compute(self, task: Task, out: list[Command]) -> None:
        me = self.rank
        chunks = split_task(task, self.num_ranks)
        # regions per chunk and buffer
        reads: list[dict[int, Region]] = []
        writes: list[dict[int, Region]] = []
        for rank, box in chunks:
            rd: dict[int, Region] = {}
            wr: dict[int, Region] = {}
            for a in task.accesses:
                st = self._buffers[a.buffer]
                reg = a.mapper(box, st.info.shape)
                if a.mode in tg.CONSUMER_MODES:
                    rd[a.buffer] = rd[a.buffer] | reg if a.buffer in rd else reg
                if a.mode in tg.PRODUCER_MODES:
                    wr[a.buffer] = wr[a.buffer] | reg if a.buffer in wr else reg
            reads.append(rd)
            writes.append(wr)
        red_buffers = {r.buffer: r for r in task.reductions}
        if self.diagnostics != tg.DIAG_OFF:
            self._check_overlapping_writes(task, chunks, writes)

        # 1. resolve pending reductions that this task consumes
        for bid in sorted({b for rd in reads for b in rd} | {r.buffer for r in task.reductions if r.include_current}):
            st = self._buffers[bid]
            if st.pending is not None:
                self._resolve_reduction(task, st, out)
        for bid in {b for wr in writes for b in wr}:
            st = self._buffers[bid]
            if st.pending is not None and bid not in {b for rd in reads for b in rd}:
                st.pending = None   # overwritten without being read: the partials are dead

        # 2. pushes to other ranks' chunks (one push per buffer)
        push_targets: dict[int, dict[int, Region]] = {}
        for (rank, box), rd in zip(chunks, reads):
            if rank == me:
                continue
            for bid, reg in rd.items():
                st = self._buffers[bid]
                for b, d in st.dist.query(reg):
                    if d is None or rank in d[1] or d[0] != me:
                        continue
                    tgt = push_targets.setdefault(bid, {})
                    tgt[rank] = tgt[rank] | b if rank in tgt else Region.from_box(b)
        local = [(i, box) for i, (rank, box) in enumerate(chunks) if rank == me]
        # 3. await-pushes for what this rank's chunks read but do not hold
        awaits: dict[int, Region] = {}
        for i, _box in local:
            for bid, reg in reads[i].items():
                st = self._buffers[bid]
                for b, d in st.dist.query(reg):
                    if d is None or me in d[1]:
                        continue
                    awaits[bid] = awaits[bid] | b if bid in awaits else Region.from_box(b)
        for bid in sorted(push_targets):
            st = self._buffers[bid]
            tgts = sorted(push_targets[bid].items())
            c = self._new(PushCommand, task, transfer=(task.id, bid, 0), targets=tgts)
            union = tgts[0][1]
            for _, reg in tgts[1:]:
                union = union | reg
            self._read(st, c, union)
            self._commit(out, c)
        for bid in sorted(awaits):
            st = self._buffers[bid]
            c = self._new(AwaitPushCommand, task, transfer=(task.id, bid, 0), region=awaits[bid])
            self._write(st, c, awaits[bid])
            self._commit(out, c)
        # distribution: every reader now holds what it read
        for (rank, _box), rd in zip(chunks, reads):
            for bid, reg in rd.items():
                st = self._buffers[bid]
                for b, d in st.dist.query(reg):
                    if d is not None and rank not in d[1]:
                        st.dist.update(b, (d[0], d[1] | {rank}))

        # 4. this rank's execution command
        for i, box in local:
            if task.kind == tg.FENCE:
                c = self._new(FenceCommand, task)
            else:
                c = self._new(ExecutionCommand, task, box=box, include_current_reductions=(me == chunks[0][0]))
            for bid, reg in reads[i].items():
                self._read(self._buffers[bid], c, reg)
            for red in task.reductions:
                st = self._buffers[red.buffer]
                if red.include_current and c.include_current_reductions:
                    self._read(st, c, Region.from_box(st.info.box))
            for bid, reg in writes[i].items():
                self._write(self._buffers[bid], c, reg)
            for red in task.reductions:
                self._write(self._buffers[red.buffer], c, Region.from_box(self._buffers[red.buffer].info.box))
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

        # 5. distribution after the writes
        for (rank, _box), wr in zip(chunks, writes):
            for bid, reg in wr.items():
                self._buffers[bid].dist.update(reg, (rank, frozenset((rank,))))
        if task.reductions:
            participants = frozenset(r for r, _ in chunks)
            everyone = frozenset(range(self.num_ranks))
            for red in task.reductions:
                st = self._buffers[red.buffer]
                if self.num_ranks == 1:
                    st.dist.update(st.info.box, (_ALL, everyone))
                else:
                    st.pending = (red, participants)
                    st.dist.update(st.info.box, (_ALL, everyone))

    def _resolve_reduction(self, task: Task, st: _BufferState, out: list[Command]) -> None:
        red, participants = st.pending
        st.pending = None
        me = self.rank
        bid = st.info.id
        region = Region.from_box(st.info.box)
        transfer = (task.id, bid, red.id)
        contributes = me in participants
        push = self._new(PushCommand, task, transfer=transfer,
                         targets=[(r, region) for r in range(self.num_ranks) if r != me],
                         contributes=contributes)
        self._read(st, push, region)
        self._commit(out, push)
        await_ = self._new(AwaitPushCommand, task, transfer=transfer, region=region)
        self._commit(out, await_)
        rc = self._new(ReductionCommand, task, reduction=red, buffer=bid, transfer=transfer,
                       contributes=contributes)
        rc.add_dep(await_, tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)
        self._read(st, rc, region)
        self._write(st, rc, region)
        self._commit(out, rc)
        everyone = frozenset(range(self.num_ranks))
        st.dist.update(region, (_ALL, everyone))

    def _check_overlapping_writes(self, task: Task, chunks, writes) -> None:
        for i in range(len(chunks)):
            for j in range(i + 1, len(chunks)):
                for bid, reg in writes[i].items():
                    other = writes[j].get(bid)
                    if other is not None and reg.intersects(other):
                        info = self._buffers[bid].info
                        msg = (f"{task.label} writes {reg & other} of buffer {info.label} from the chunks "
                               f"of ranks {chunks[i][0]} and {chunks[j][0]} (overlapping writes)")
                        if self.diagnostics == tg.DIAG_ERROR:
                            raise DiagnosticError(msg)
                        if self.rank == 0:
                            log.warning(msg)
                        return
