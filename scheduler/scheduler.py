"""The scheduler thread: task stream in, instruction batches out, with lookahead.

Lookahead holds commands back while they keep asking for new allocations, so
that when they are compiled the first allocation already covers every box the
held commands anticipate (one allocation instead of a resize per step).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from . import command_graph as cg
from . import task_graph as tg
from .instruction_graph import InstructionBatch, Instruction, Pilot
from .instruction_graph_generator import InstructionGraphGenerator, SystemInfo
from .recorders import CommandRecorder, InstructionRecorder
from .replay import Replay

log = logging.getLogger("celeritas.scheduler")

LOOKAHEAD_NONE = "none"
LOOKAHEAD_AUTO = "auto"
LOOKAHEAD_INFINITE = "infinite"
LOOKAHEAD_MODES = (LOOKAHEAD_NONE, LOOKAHEAD_AUTO, LOOKAHEAD_INFINITE)


class SchedulerDelegate(Protocol):
    """Where compiled batches go (the executor).  User arrays and host objects reach the
    executor from the runtime directly; a batch names the user allocation of every
    host-initialized buffer it introduces (``InstructionBatch.user_allocations``)."""

    def submit(self, batch: InstructionBatch) -> None: ...


class Lookahead:
    """Decides when held commands are compiled (see module docstring)."""

    def __init__(self, igg: InstructionGraphGenerator, mode: str = LOOKAHEAD_AUTO):
        if mode not in LOOKAHEAD_MODES:
            raise ValueError(f"lookahead must be one of {LOOKAHEAD_MODES}, got {mode!r}")
        self.igg = igg
        self.mode = mode
        self.held: list[cg.Command] = []
        self._holding = False
        self._need_since_horizon = False
        self._clean_horizons = 0

    def push(self, cmd: cg.Command, out: list) -> None:
        """Queue ``cmd``; appends what compiling commands gives (``InstructionGraphGenerator.compile``:
        instructions, pilots, template) to ``out``."""
        if self.mode == LOOKAHEAD_NONE:
            out.append(self.igg.compile(cmd))
            return
        if self.igg.anticipate(cmd):
            self._holding = True
            self._need_since_horizon = True
            self._clean_horizons = 0
        if not self._holding:
            out.append(self.igg.compile(cmd))
            return
        self.held.append(cmd)
        if cmd.kind == cg.HORIZON:
            # (horizons since the last command that asked for memory, as Celerity counts them:
            # the one closing that command's span is the first; the second flushes)
            self._clean_horizons = 1 if self._need_since_horizon else self._clean_horizons + 1
            self._need_since_horizon = False
            if self.mode == LOOKAHEAD_AUTO and self._clean_horizons >= 2:
                self.flush(out)
        elif cmd.kind in (cg.EPOCH, cg.FENCE):
            self.flush(out)

    def push_task(self, cmds: list[cg.Command], out: list) -> None:
        """``push`` of a task's commands: by one template of them all where the instruction
        generator keeps one (``group_probe``), else one by one, recording such a template
        when they were all compiled at once."""
        igg = self.igg
        if len(cmds) < 2 or self._holding or igg.replay is None:
            for c in cmds:
                self.push(c, out)
            return
        probe = igg.group_probe(cmds, self.mode != LOOKAHEAD_NONE)
        if probe is None:
            for c in cmds:
                self.push(c, out)
            return
        if probe.template is not None:
            # (recorded with every anticipate answered from allocations already made, which
            # the key's buffer states make so again: the questions are skipped)
            out.append(igg.compile(cmds[0], probe))
            return
        mark = igg.begin_group(probe, cmds)
        n = len(out)
        for c in cmds:
            self.push(c, out)
        if not self._holding and len(out) - n == len(cmds):
            igg.record_group(probe, mark, cmds, out[n:])

    def flush(self, out: list) -> None:
        held, self.held = self.held, []
        for c in held:
            out.append(self.igg.compile(c))
        self.igg.clear_anticipation()
        self._holding = False
        self._need_since_horizon = False
        self._clean_horizons = 0

    def set_mode(self, mode: str, out: list) -> None:
        """Any change of mode compiles what is held first, as Celerity does: commands held
        under one mode's rule are then never judged by the other's (an ``infinite`` hold
        has no horizon count for ``auto`` to go on)."""
        if mode not in LOOKAHEAD_MODES:
            raise ValueError(f"lookahead must be one of {LOOKAHEAD_MODES}, got {mode!r}")
        self.flush(out)
        self.mode = mode


# ---- events: what the application thread asks of the scheduler thread -------------------------
# One small frozen dataclass per event, dispatched by type (as Celerity's scheduler does
# with a variant): no tuples read by position across the thread boundary.

@dataclass(slots=True)   # (not frozen: a frozen __init__ sets through object.__setattr__, once per task)
class TaskSubmitted:
    task: tg.Task


@dataclass(frozen=True, slots=True)
class BufferCreated:
    info: tg.BufferInfo


@dataclass(frozen=True, slots=True)
class BufferDestroyed:
    buffer: int


@dataclass(frozen=True, slots=True)
class HostObjectCreated:
    host_object: int


@dataclass(frozen=True, slots=True)
class HostObjectDestroyed:
    host_object: int


@dataclass(frozen=True, slots=True)
class LookaheadChanged:
    mode: str


@dataclass(frozen=True, slots=True)
class FlushRequested:
    pass


@dataclass(frozen=True, slots=True)
class RecordingStarted:
    """From now on the generators hand their nodes to these recorders."""

    commands: CommandRecorder
    instructions: InstructionRecorder


@dataclass(frozen=True, slots=True)
class SyncRequested:
    """Set ``done`` once every event posted before this one has been processed."""

    done: threading.Event


@dataclass(frozen=True, slots=True)
class StopRequested:
    pass


class Scheduler:
    """Runs the command and instruction graph generators; synchronously or on a thread."""

    def __init__(self, *, num_ranks: int, rank: int, system: SystemInfo, delegate: SchedulerDelegate,
                 lookahead: str = LOOKAHEAD_AUTO, diagnostics: str = tg.DIAG_WARN,
                 command_recorder: CommandRecorder | None = None,
                 instruction_recorder: InstructionRecorder | None = None, replay: bool = True,
                 overlap_batches: bool = True, on_error=None):
        self.num_ranks = num_ranks
        self.rank = rank
        self.delegate = delegate
        self.cdag = cg.CommandGraphGenerator(num_ranks, rank, diagnostics=diagnostics, recorder=command_recorder,
                                             replay=Replay() if replay else None)
        self.igg = InstructionGraphGenerator(system, rank=rank, num_ranks=num_ranks, recorder=instruction_recorder,
                                             diagnostics=diagnostics, replay=Replay() if replay else None,
                                             overlap_batches=overlap_batches)
        self.lookahead = Lookahead(self.igg, lookahead)
        self.on_error = on_error
        self.failed: BaseException | None = None
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._busy = False
        self.busy_ns = 0
        self.num_tasks = 0
        # (start_ns, end_ns) of every event processed, in perf_counter_ns like the
        # executor's trace; None unless someone (trace, summary) asked for them,
        # because a list that grows with every task is not free on long runs.
        self.busy_intervals: list[tuple[int, int]] | None = None
        self._holding_since: int | None = None   # lookahead holds commands since (perf_counter_ns)

    # ---- thread-safe entry points (application thread) -----------------------------
    def notify_task(self, task: tg.Task) -> None:
        self._post(TaskSubmitted(task))

    def notify_buffer_created(self, info: tg.BufferInfo) -> None:
        self._post(BufferCreated(info))

    def notify_buffer_destroyed(self, bid: int) -> None:
        self._post(BufferDestroyed(bid))

    def notify_host_object_created(self, hoid: int) -> None:
        self._post(HostObjectCreated(hoid))

    def notify_host_object_destroyed(self, hoid: int) -> None:
        self._post(HostObjectDestroyed(hoid))

    def set_lookahead(self, mode: str) -> None:
        if mode not in LOOKAHEAD_MODES:
            raise ValueError(f"lookahead must be one of {LOOKAHEAD_MODES}, got {mode!r}")
        self._post(LookaheadChanged(mode))

    def flush(self) -> None:
        self._post(FlushRequested())

    def start_recording(self, commands: CommandRecorder, instructions: InstructionRecorder) -> None:
        self._post(RecordingStarted(commands, instructions))

    def sync(self, timeout: float | None = 60.0) -> bool:
        """Wait until every event posted so far has been processed."""
        ev = threading.Event()
        self._post(SyncRequested(ev))
        return ev.wait(timeout)

    def _post(self, event) -> None:
        if self._thread is None:
            self.process(event)
        else:
            self._events.put(event)

    # ---- thread ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"celeritas-scheduler-{self.rank}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the events queued so far (the shutdown epoch among them)."""
        if self._thread is not None:
            self._events.put(StopRequested())
            self._thread.join(timeout)
            self._thread = None

    @property
    def idle(self) -> bool:
        return not self._busy and self._events.empty()

    def _loop(self) -> None:
        events = self._events
        get, empty, process = events.get, events.empty, self.process
        stop = False
        while not stop:
            ev = get()
            if type(ev) is StopRequested:
                return
            self._busy = True
            t0 = time.perf_counter_ns()
            try:
                # every event queued meanwhile in one busy interval: the application posts tasks
                # in runs of tens, and timing and bookkeeping each event on its own cost about
                # 2 % of a replayed task's lowering
                while True:
                    process(ev)
                    if empty():
                        break
                    ev = get()
                    if type(ev) is StopRequested:
                        stop = True
                        break
            finally:
                t1 = time.perf_counter_ns()
                self.busy_ns += t1 - t0
                if self.busy_intervals is not None:
                    self.busy_intervals.append((t0, t1))
                if self.lookahead.held:
                    if self._holding_since is None:
                        self._holding_since = t1
                elif self._holding_since is not None:
                    self._end_holding(t0)
                self._busy = False

    def _end_holding(self, end: int) -> None:
        """Commands held for lookahead count as a busy scheduler, as Celerity counts them: the
        executor waits for their instructions as it waits for a scheduler that compiles."""
        start, self._holding_since = self._holding_since, None
        if end > start:
            self.busy_ns += end - start
            if self.busy_intervals is not None:
                self.busy_intervals.append((start, end))

    # ---- processing ------------------------------------------------------------------
    def process(self, ev) -> None:
        if type(ev) is SyncRequested:
            ev.done.set()
            return
        if self.failed is not None:
            return
        try:
            self._process(ev)
        except BaseException as exc:   # reported to the runtime, surfaced at the next sync point
            self.failed = exc
            log.debug("scheduler failed", exc_info=True)
            if self.on_error is not None:
                self.on_error(exc)
            else:
                raise

    def _process(self, ev) -> None:
        out: list[tuple[list[Instruction], list[Pilot]]] = []
        user_allocations: list[tuple[int, int]] = []
        kind = type(ev)
        if kind is TaskSubmitted:
            self.num_tasks += 1
            cmds = self.cdag.build(ev.task)
            if len(cmds) == 1:      # (most tasks on one rank)
                self.lookahead.push(cmds[0], out)
            else:
                self.lookahead.push_task(cmds, out)
        elif kind is BufferCreated:
            self.cdag.create_buffer(ev.info)
            aid = self.igg.create_buffer(ev.info)
            if aid is not None:
                user_allocations.append((aid, ev.info.id))
        elif kind is BufferDestroyed:
            self.lookahead.flush(out)
            self.cdag.destroy_buffer(ev.buffer)
            out.append((self.igg.destroy_buffer(ev.buffer), [], None))
        elif kind is HostObjectCreated:
            self.igg.create_host_object(ev.host_object)
        elif kind is HostObjectDestroyed:
            self.lookahead.flush(out)
            out.append((self.igg.destroy_host_object(ev.host_object), [], None))
        elif kind is LookaheadChanged:
            self.lookahead.set_mode(ev.mode, out)
        elif kind is FlushRequested:
            self.lookahead.flush(out)
        elif kind is RecordingStarted:
            self.cdag.recorder = ev.commands
            self.igg.recorder = ev.instructions
        else:
            raise ValueError(f"unknown scheduler event {ev!r}")
        if out or user_allocations:
            if len(out) == 1:       # (most tasks: one command; its lists are fresh, see compile)
                instrs, pilots, tpl = out[0]
                shape = None if tpl is None else (tpl,)
            else:
                instrs = []
                pilots = []
                shape = []
                for i, p, tpl in out:
                    instrs.extend(i)
                    pilots.extend(p)
                    if shape is not None:
                        if tpl is None:
                            shape = None
                        else:
                            shape.append(tpl)
                if shape is not None:
                    shape = tuple(shape)
            if instrs or pilots or user_allocations:
                self.delegate.submit(InstructionBatch(instrs, pilots, user_allocations, shape))
