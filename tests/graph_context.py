"""A synchronous driver for the task, command and instruction graph generators.

Tests submit tasks, build the commands of every rank, compile one rank's
instructions and query the result ("count the sends on rank 1", "are these two
instructions concurrent?").  No threads, no MPI, no kernels.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from celeritas import range_mappers as rm
from scheduler import command_graph as cg
from scheduler import task_graph as tg
from scheduler.geometry import Box
from scheduler.instruction_graph import Instruction
from scheduler.instruction_graph_generator import InstructionGraphGenerator, SystemInfo
from scheduler.recorders import CommandRecorder, InstructionRecorder, TaskRecorder
from scheduler.replay import Replay
from scheduler.scheduler import Lookahead


def buffer_access(tm: tg.TaskManager, mappers: rm.MapperWrappers, bid: int, mapper, mode: str) -> tg.BufferAccess:
    """A task's access to buffer ``bid`` of ``tm``, its range mapper wrapped as the runtime
    wraps users' mappers (for tests that drive a TaskManager without a GraphContext)."""
    info = tm.buffers[bid]
    wrapped, pure = mappers.wrap(mapper, buffer_label=info.label, buffer_dims=len(info.shape))
    return tg.BufferAccess(bid, mode, wrapped, pure)


class GraphContext:
    def __init__(self, num_ranks: int = 1, *, devices: int = 1, lookahead: str = "none",
                 horizon_step: int = 4, horizon_max_parallelism: int = 64, diagnostics: str = "warn",
                 peers: bool = True, comm_memories=frozenset((1,)), compile_ranks: Sequence[int] | None = None,
                 replay: bool = False, capacity: int | None = None):
        self.num_ranks = num_ranks
        self.mappers = rm.MapperWrappers()
        self.tm = tg.TaskManager(horizon_step=horizon_step, horizon_max_parallelism=horizon_max_parallelism,
                                 on_task=self._on_task, diagnostics=diagnostics, recorder=TaskRecorder(),
                                 replay=Replay() if replay else None)
        self.cdags = [cg.CommandGraphGenerator(num_ranks, r, diagnostics=diagnostics, recorder=CommandRecorder(r),
                                               replay=Replay() if replay else None)
                      for r in range(num_ranks)]
        peer_set = None if peers else frozenset()
        self.compile_ranks = list(range(num_ranks)) if compile_ranks is None else list(compile_ranks)
        caps = None if capacity is None else {2 + d: capacity for d in range(devices)}
        self.iggs = {r: InstructionGraphGenerator(SystemInfo(devices, peer_set, comm_memories, caps), rank=r,
                                                  num_ranks=num_ranks, recorder=InstructionRecorder(),
                                                  diagnostics=diagnostics, replay=Replay() if replay else None)
                     for r in self.compile_ranks}
        self.lookaheads = {r: Lookahead(self.iggs[r], lookahead) for r in self.compile_ranks}
        self.instructions: dict[int, list[Instruction]] = {r: [] for r in self.compile_ranks}
        # per rank, what each command compiled to: (its replay template's serial or None, instructions)
        self.compiled: dict[int, list[tuple]] = {r: [] for r in self.compile_ranks}
        self.pilots: dict[int, list] = {r: [] for r in self.compile_ranks}
        self.commands: dict[int, list[cg.Command]] = {r: [] for r in range(num_ranks)}
        self._next_buffer = 0
        self._live_buffers: set[int] = set()
        self._pending_tasks: list[tg.Task] = []
        self._ready = True
        # the init epoch was created before the generators existed
        for t in list(self.tm.tasks.values()):
            self._dispatch(t)

    # ---- program ----------------------------------------------------------------
    def buffer(self, shape: Sequence[int], dtype=np.float32, host_init: bool = False, name: str = "") -> int:
        bid = self._next_buffer
        self._next_buffer += 1
        self._live_buffers.add(bid)
        info = self.tm.create_buffer(bid, tuple(shape), np.dtype(dtype), name, host_init)
        for c in self.cdags:
            c.create_buffer(info)
        for igg in self.iggs.values():
            igg.create_buffer(info)
        return bid

    def access(self, bid: int, mapper, mode: str, kernel_dims: int | None = None) -> tg.BufferAccess:
        return buffer_access(self.tm, self.mappers, bid, mapper, mode)

    def task(self, global_range: Sequence[int], accesses: Sequence[tuple] = (), *, kind: str = tg.DEVICE_COMPUTE,
             name: str = "", offset: Sequence[int] | None = None, split: str = "1d", oversubscribe: int = 1,
             reductions: Sequence[tg.Reduction] = (), side_effects: Sequence[int] = (),
             collective_group: int | None = None, granularity: Sequence[int] | None = None) -> tg.Task:
        dims = len(global_range)
        geom = tg.TaskGeometry(dims, tuple(global_range), tuple(offset or (0,) * dims),
                               tuple(granularity or (1,) * dims))
        accs = [self.access(b, m, mode) for (b, m, mode) in accesses]
        return self.tm.submit(kind, name=name, geometry=geom, accesses=accs, split=split,
                              oversubscribe=oversubscribe, reductions=list(reductions),
                              side_effects=side_effects, collective_group=collective_group)

    def reduction(self, bid: int, op=np.add, identity=0, include_current: bool = False) -> tg.Reduction:
        return tg.Reduction(self.tm.new_reduction_id(), bid, op, identity, include_current)

    def fence(self, bid: int, box: Box | None = None) -> tg.Task:
        info = self.tm.buffers[bid]
        return self.tm.fence(buffer=bid, box=box or info.box, promise=None)

    def epoch(self, action: str = tg.EPOCH_NONE) -> tg.Task:
        return self.tm.epoch(action)

    def destroy_buffer(self, bid: int) -> None:
        self.tm.destroy_buffer(bid)
        for c in self.cdags:
            c.destroy_buffer(bid)
        for r, igg in self.iggs.items():
            out: list = []
            self.lookaheads[r].flush(out)
            self._collect(r, out)
            self.instructions[r].extend(igg.destroy_buffer(bid))
        self._live_buffers.discard(bid)

    def finish(self) -> "GraphContext":
        """Shut down as the runtime does: destroy live buffers, then the shutdown epoch."""
        for bid in sorted(self._live_buffers):
            self.destroy_buffer(bid)
        self.epoch(tg.EPOCH_SHUTDOWN)
        for r in self.compile_ranks:
            out: list = []
            self.lookaheads[r].flush(out)
            self._collect(r, out)
        return self

    # ---- plumbing -----------------------------------------------------------------
    def _on_task(self, task: tg.Task) -> None:
        if hasattr(self, "cdags"):
            self._dispatch(task)

    def _dispatch(self, task: tg.Task) -> None:
        for r, c in enumerate(self.cdags):
            cmds = c.build(task)
            self.commands[r].extend(cmds)
            if r in self.iggs:
                out: list = []
                self.lookaheads[r].push_task(cmds, out)     # (as Scheduler._process does)
                self._collect(r, out)

    def _collect(self, r: int, out: list) -> None:
        for instrs, pilots, template in out:
            self.compiled[r].append((template, instrs))
            self.instructions[r].extend(instrs)
            self.pilots[r].extend(pilots)

    # ---- queries ------------------------------------------------------------------
    def tasks(self) -> dict[int, tg.Task]:
        return self.tm.tasks

    def task_record(self, tid: int) -> dict:
        return next(r for r in self.tm.recorder.tasks if r["id"] == tid)

    def cmds(self, rank: int, kind: str | None = None, task: int | None = None) -> list[cg.Command]:
        return [c for c in self.commands[rank] if (kind is None or c.kind == kind)
                and (task is None or c.task.id == task)]

    def instrs(self, rank: int = 0, kind: str | None = None, **fields) -> list[Instruction]:
        out = []
        for i in self.instructions[rank]:
            if kind is not None and i.kind != kind:
                continue
            if all(getattr(i, k, None) == v for k, v in fields.items()):
                out.append(i)
        return out

    def closure(self, rank: int = 0) -> dict[int, set[int]]:
        """Transitive predecessors of every instruction."""
        preds: dict[int, set[int]] = {}
        for i in self.instructions[rank]:
            s: set[int] = set()
            for d in i.dep_ids:
                s.add(d)
                s |= preds.get(d, set())
            preds[i.id] = s
        return preds

    def concurrent(self, a: Instruction, b: Instruction, rank: int = 0) -> bool:
        cl = self.closure(rank)
        return a.id not in cl[b.id] and b.id not in cl[a.id]

    def depends_on(self, a: Instruction, b: Instruction, rank: int = 0) -> bool:
        return b.id in self.closure(rank)[a.id]
