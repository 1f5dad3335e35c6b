"""Task graph: one node per command group, dependencies from buffer accesses.

The task manager runs on the application thread; it must produce the identical
task stream on every rank, so it depends only on what the program submits.
"""
from __future__ import annotations

import logging
import zlib
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

from .errors import DiagnosticError, RangeMapperError
from .geometry import Box, Region, RegionMap
from .horizons import EpochTracker, collapse_map
from .recorders import TaskRecorder
from .replay import Replay, absolute, absolute_id, own_base_shape, relative_id

log = logging.getLogger("celeritas.task_graph")

# task kinds
DEVICE_COMPUTE = "device_compute"
HOST_COMPUTE = "host_compute"
COLLECTIVE = "collective"
MASTER_NODE = "master_node"
HORIZON = "horizon"
EPOCH = "epoch"
FENCE = "fence"

# access modes
READ = "read"
WRITE = "write"
READ_WRITE = "read_write"
DISCARD_WRITE = "discard_write"
DISCARD_READ_WRITE = "discard_read_write"
ACCESS_MODES = (READ, WRITE, READ_WRITE, DISCARD_WRITE, DISCARD_READ_WRITE)
CONSUMER_MODES = frozenset((READ, WRITE, READ_WRITE))
PRODUCER_MODES = frozenset((WRITE, READ_WRITE, DISCARD_WRITE, DISCARD_READ_WRITE))

# dependency kinds and origins
TRUE_DEP = "true"
ANTI_DEP = "anti"
ORIGIN_DATAFLOW = "dataflow"
ORIGIN_COLLECTIVE = "collective_group_serialization"
ORIGIN_SIDE_EFFECT = "side_effect"
ORIGIN_EXECUTION_FRONT = "execution_front"
ORIGIN_LAST_EPOCH = "last_epoch"

# epoch actions
EPOCH_NONE = "none"
EPOCH_INIT = "init"
EPOCH_BARRIER = "barrier"
EPOCH_SHUTDOWN = "shutdown"

DIAG_OFF = "off"
DIAG_WARN = "warn"
DIAG_ERROR = "error"

RangeMapper = Callable[[Box, tuple], Region]
"""Scheduler-level mapper: (chunk box, buffer shape) -> region of the buffer (clipped)."""


@dataclass(slots=True)
class BufferInfo:
    id: int
    shape: tuple[int, ...]
    dtype: Any
    name: str
    host_initialized: bool

    @property
    def box(self) -> Box:
        return Box.full(self.shape)

    @property
    def label(self) -> str:
        return f"B{self.id}" + (f' "{self.name}"' if self.name else "")


@dataclass(slots=True)
class BufferAccess:
    buffer: int
    mode: str
    mapper: RangeMapper
    # the mapper is a pure function shared across tasks (a built-in one): its identity
    # stands for its results, so replay may key on it
    pure: bool = False

    def region(self, chunk: Box, shape: tuple) -> Region:
        return self.mapper(chunk, shape)


@dataclass(slots=True)
class Reduction:
    id: int
    buffer: int
    op: Any                  # numpy ufunc
    identity: Any
    include_current: bool    # not initialize_to_identity: the buffer's value takes part


@dataclass(slots=True)
class TaskGeometry:
    dims: int
    global_range: tuple[int, ...]
    offset: tuple[int, ...]
    granularity: tuple[int, ...]
    _box: Box | None = field(default=None, repr=False, compare=False)   # cache of ``box``

    @property
    def box(self) -> Box:
        b = self._box
        if b is None:
            b = self._box = Box(self.offset, tuple(o + r for o, r in zip(self.offset, self.global_range)),
                                self.dims)
        return b


SIG_UNKNOWN = object()   # Task.replay_sig before replay_signature computed it (None means: none)


@dataclass(slots=True, eq=False)
class Task:
    id: int
    kind: str
    name: str = ""
    geometry: TaskGeometry | None = None
    accesses: list[BufferAccess] = field(default_factory=list)
    side_effects: list[int] = field(default_factory=list)   # host object ids
    collective_group: int | None = None
    reductions: list[Reduction] = field(default_factory=list)
    split: str = "1d"                 # "1d" | "2d"
    oversubscribe: int = 1
    launcher: Any = None              # opaque to the scheduler: the kernel / host function
    epoch_action: str = EPOCH_NONE
    fence_promise: Any = None
    fence_buffer: int | None = None
    fence_box: Box | None = None
    fence_host_object: int | None = None
    stream_hash: int = 0              # epochs: hash of the task stream up to here (divergence check)
    digest: list = field(default_factory=list)  # epochs: DIGEST entries of the tasks since the last epoch
    deps: dict[int, tuple[str, str]] = field(default_factory=dict)  # dep id -> (kind, origin)
    critical_path_length: int = 0
    buffer_ids: tuple[int, ...] = ()  # the buffers accessed or reduced into, sorted (every level reads it)
    # replay_signature's result, computed once (the task and command levels both key on it)
    replay_sig: Any = field(default=SIG_UNKNOWN, repr=False)
    # the task graph's int for replay_sig (Replay.signature; None: none yet), which the command
    # graph's chains step by without hashing the signature again (CommandReplayMixin._build_replayed)
    replay_sig_id: int | None = field(default=None, repr=False)

    def add_dep(self, dep: "Task", kind: str, origin: str) -> None:
        """A dependency on ``dep``; a true one replaces an anti one on the same task."""
        deps = self.deps
        did = dep.id
        cur = deps.get(did)
        if cur is None:
            deps[did] = (kind, origin)
            cpl = dep.critical_path_length + 1
            if cpl > self.critical_path_length:
                self.critical_path_length = cpl
        elif kind == TRUE_DEP and cur[0] == ANTI_DEP:
            deps[did] = (kind, origin)

    def has_true_dep(self) -> bool:
        for k, _ in self.deps.values():
            if k == TRUE_DEP:
                return True
        return False

    @property
    def label(self) -> str:
        return f"T{self.id}" + (f' "{self.name}"' if self.name else "")

    def to_record(self, buffers: dict[int, BufferInfo] | None = None) -> dict:
        g = self.geometry
        rec = {"id": self.id, "kind": self.kind, "name": self.name,
               "range": list(g.global_range) if g else [],
               "offset": list(g.offset) if g else [],
               "deps": [{"id": d, "kind": k, "origin": o} for d, (k, o) in sorted(self.deps.items())],
               "accesses": [], "critical_path_length": self.critical_path_length}
        if g is not None:
            full = g.box
            for a in self.accesses:
                shape = buffers[a.buffer].shape if buffers and a.buffer in buffers else None
                entry = {"buffer": a.buffer, "mode": a.mode}
                if shape is not None:
                    try:
                        entry["region"] = a.mapper(full, shape).to_json()
                    except Exception:   # a record must never fail; the error surfaces elsewhere
                        entry["region"] = None
                rec["accesses"].append(entry)
        if self.reductions:
            rec["reductions"] = [{"id": r.id, "buffer": r.buffer} for r in self.reductions]
        if self.side_effects:
            rec["side_effects"] = list(self.side_effects)
        if self.collective_group is not None:
            rec["collective_group"] = self.collective_group
        if self.kind == EPOCH:
            rec["action"] = self.epoch_action
        return rec


_EMPTY_BOX0 = Box((), ())

# The divergence check compares ranks' task streams at every epoch by hash, and names
# the first differing task from a digest of the tasks since the previous epoch.  The
# digest keeps the first DIGEST_LIMIT of them (a program that never waits would
# otherwise grow it without bound, and it travels to the neighbour rank); past that,
# one DIGEST_MORE entry says from which task on the tasks are hashed only.
# An entry is (id, kind, name, range, accesses), tuples of ints and strings only (the form
# the divergence check compares and sends, so it need not convert 3-4 entries per task at
# every epoch, 1.3 us each): accesses as the stream hashes them,
# ((buffer id, ACCESS_MODE_IDS[mode]), ...) in the task's order (the tuple the stream entry
# already builds, so the digest costs no more per task), then its pseudo accesses (see
# EFFECT_IDS); a buffer's entry has () or, made with data, ((id, HOST_DATA),).
# Past DIGEST_LIMIT, the newest DIGEST_LIMIT entries are also kept (a ring): what a rank
# stalled at a fence shows its neighbour (``pending_digest``), so a difference in a long
# stretch between epochs (a loop with fences, no q.wait()) is still found where the
# neighbour's newest tasks overlap these; an epoch's digest lists only the first ones.
DIGEST_LIMIT = 4096
DIGEST_MORE = "more"
BUFFER_CREATED = "buffer"    # a digest entry of a buffer made before task ``id``, named "B<id> <dtype>"


def _stable_str_id(s: str) -> int:
    return zlib.crc32(s.encode())


ACCESS_MODE_IDS = {m: _stable_str_id(m) for m in ACCESS_MODES}   # a mode's id in the stream and digest
# What else a task or buffer does to the graph, as pseudo accesses (id, EFFECT) after the
# buffer accesses of its entry (and so in the stream hash too): its collective group, its
# side effects on host objects (a host-object fence's too), its reductions into buffers
# (REDUCE_INTO where the buffer's value takes part); a buffer entry's (buffer id,
# HOST_DATA) where it was made with data.  Most tasks have none, and pay for one test.
COLLECTIVE_GROUP = _stable_str_id("collective_group")
SIDE_EFFECT = _stable_str_id("side_effect")
REDUCE = _stable_str_id("reduce")
REDUCE_INTO = _stable_str_id("reduce_into")
HOST_DATA = _stable_str_id("host_data")
EFFECT_IDS = {"collective_group": COLLECTIVE_GROUP, "side_effect": SIDE_EFFECT, "reduce": REDUCE,
              "reduce_into": REDUCE_INTO, "host_data": HOST_DATA}


def _effects(t: Task) -> tuple:
    """A task's pseudo accesses (see COLLECTIVE_GROUP), for its digest entry and stream."""
    out = [] if t.collective_group is None else [(t.collective_group, COLLECTIVE_GROUP)]
    out += [(h, SIDE_EFFECT) for h in t.side_effects]
    out += [(r.buffer, REDUCE_INTO if r.include_current else REDUCE) for r in t.reductions]
    return tuple(out)


class _StableStrIds(dict):
    """string -> a number equal on every rank (Python's str hash is salted per process),
    computed on the first lookup of each string and kept."""

    __slots__ = ()

    def __missing__(self, s: str) -> int:
        v = self[s] = _stable_str_id(s)
        return v


class TaskManager:
    """Builds the task graph: dependencies, horizons, epochs and pruning.

    ``on_task`` receives every task (including horizons and epochs) in order;
    the runtime forwards them to the scheduler thread.
    """

    def __init__(self, *, horizon_step: int = 4, horizon_max_parallelism: int = 64,
                 on_task: Callable[[Task], None] | None = None, diagnostics: str = DIAG_WARN,
                 recorder: TaskRecorder | None = None, replay: Replay | None = None, stream: bool = True):
        self.horizon_step = horizon_step
        # whether to keep the task stream the divergence check compares between ranks (stream
        # hash, folds, digests: ~85 opcodes of every commit): not on a single rank, where
        # nothing compares it (every epoch's hash is then 0 and its digest empty)
        self.stream = stream
        self.horizon_max_parallelism = horizon_max_parallelism
        self.on_task = on_task
        self.diagnostics = diagnostics
        self.recorder = recorder
        self.replay = replay
        self._shapes: dict[int, tuple] = {}   # buffer -> (interned shape, base, snapshot): see replay
        self._stale: dict[int, tuple] = {}    # buffers whose access map lags behind its shape
        self._epoch_merged = False            # the lowering merged the epoch dependency into an anti one
        self._collapsed: dict = {}            # (shape, epoch relative to its base) -> collapsed shape
        self.buffers: dict[int, BufferInfo] = {}
        self.tasks: dict[int, Task] = {}
        self._pruned_to = 0   # every task below this id has been forgotten (ids are consecutive)
        self._next_id = 0
        self._next_reduction = 1
        # per buffer and point: (last writer task id or None, ids of the tasks that read it
        # since): a read truly depends on the writer, a write anti-depends on the readers
        self._access: dict[int, RegionMap] = {}
        self._written: dict[int, Region | None] = {}  # ever written or host-initialized (None: all)
        self._last_side_effect: dict[int, Task] = {}
        self._last_collective: dict[int, Task] = {}
        self._horizons = EpochTracker()   # front, current horizon, epoch for new tasks
        self._max_cpl = 0
        self._horizon_cpl = 0
        self.latest_epoch: Task | None = None
        self.stream_hash = 0
        self._digest: list = []
        self._digest_more: tuple | None = None   # the first task past DIGEST_LIMIT since the epoch
        self._tail: deque | None = None          # past DIGEST_LIMIT: the newest DIGEST_LIMIT entries
        # (id of the epoch before the latest, the latest epoch): the stretch the latest closed,
        # for a reader that has not seen the latest epoch yet (see pending_digest)
        self._closed: tuple[int | None, Task] | None = None
        self._stream: list = []   # tasks not yet folded into stream_hash, as tuples of ints
        # (id of the task a fold ended with, stream_hash after it) of the recent folds: see
        # stream_checkpoints (one per epoch or 1024 stream entries; the oldest dropped in halves)
        self._folds: list[tuple[int, int]] = []
        self._folds_from = 0      # _folds lists every fold that ended with a task from this id on
        self._str_ids = _StableStrIds()   # kind, name, mode -> their stream-hash ids
        init = self._new_task(EPOCH, name="init")
        init.epoch_action = EPOCH_INIT
        self._commit(init, reduce_front=False)
        self._horizons.epoch_generated(init.id)
        self.latest_epoch = init

    # ---- buffers -------------------------------------------------------------
    def create_buffer(self, bid: int, shape: tuple[int, ...], dtype: Any, name: str,
                      host_initialized: bool) -> BufferInfo:
        info = BufferInfo(bid, tuple(shape), dtype, name, host_initialized)
        self.buffers[bid] = info
        # (a buffer another rank makes with another shape or dtype, or not at all, diverges
        # as a task would: in the stream hash, and in the digest before the next task)
        if self.stream:
            dt = str(dtype)
            self._stream.append((self._str_ids[BUFFER_CREATED], bid, info.shape, self._str_ids[dt],
                                 host_initialized))
            entry = (self.next_task_id, BUFFER_CREATED, f"B{bid} {dt}", info.shape,
                     ((bid, HOST_DATA),) if host_initialized else ())
            if len(self._digest) < DIGEST_LIMIT:
                self._digest.append(entry)
            else:
                self._overflow(entry)
        box = info.box
        init = self._horizons.epoch if host_initialized else None
        self._access[bid] = RegionMap(box, (init, _NO_READERS))
        # None once every element has been written (no uninitialized-read check needed)
        self._written[bid] = None if host_initialized or box.empty else Region.empty_region(len(shape))
        return info

    def destroy_buffer(self, bid: int) -> None:
        self._access.pop(bid, None)
        self._shapes.pop(bid, None)
        self._stale.pop(bid, None)
        self._written.pop(bid, None)

    def new_reduction_id(self) -> int:
        rid = self._next_reduction
        self._next_reduction += 1
        return rid

    # ---- tasks -----------------------------------------------------------------
    @property
    def next_task_id(self) -> int:
        return self._next_id

    def _new_task(self, kind: str, **kw) -> Task:
        t = Task(self._next_id, kind, **kw)
        self._next_id += 1
        if t.accesses or t.reductions:
            t.buffer_ids = _buffer_ids(t.accesses, t.reductions)
        return t

    def submit(self, kind: str, *, name: str = "", geometry: TaskGeometry | None = None,
               accesses: Sequence[BufferAccess] = (), side_effects: Sequence[int] = (),
               collective_group: int | None = None, reductions: Sequence[Reduction] = (),
               split: str = "1d", oversubscribe: int = 1, launcher: Any = None) -> Task:
        # (the Task made here with positional arguments, not through _new_task's keywords)
        tid = self._next_id
        accesses = list(accesses)
        reductions = list(reductions)
        t = Task(tid, kind, name, geometry, accesses, list(side_effects), collective_group, reductions, split,
                 oversubscribe, launcher)
        self._next_id = tid + 1
        if accesses or reductions:
            t.buffer_ids = _buffer_ids(accesses, reductions)
        self._compute_dependencies(t)
        self._commit(t)
        self._maybe_horizon()   # (a call, not inline: tests count the horizons by width through it)
        return t

    def fence(self, *, buffer: int | None = None, box: Box | None = None,
              host_object: int | None = None, promise: Any = None) -> Task:
        accesses = []
        side_effects = []
        if buffer is not None:
            fbox = box

            def fence_mapper(chunk: Box, shape: tuple, _b=fbox) -> Region:
                return Region.from_box(_b)

            accesses.append(BufferAccess(buffer, READ, fence_mapper))
        if host_object is not None:
            side_effects.append(host_object)
        geom = TaskGeometry(0, (), (), ())
        t = self._new_task(FENCE, name="fence", geometry=geom, accesses=accesses,
                           side_effects=side_effects, fence_promise=promise,
                           fence_buffer=buffer, fence_box=box, fence_host_object=host_object)
        self._compute_dependencies(t)
        self._commit(t)
        self._maybe_horizon()
        return t

    def epoch(self, action: str = EPOCH_NONE) -> Task:
        t = self._new_task(EPOCH, name=action if action != EPOCH_NONE else "epoch")
        t.epoch_action = action
        self._commit(t)
        self._horizons.epoch_generated(t.id)
        self.latest_epoch = t
        # the epoch bounds the graph as a horizon would: the count towards the next restarts
        self._horizon_cpl = self._max_cpl
        self._apply_epoch(t)
        return t

    # ---- dependency computation ----------------------------------------------
    # Hot path (application thread, every submit).  Mapper results are cached by the
    # wrapped mappers.  Per buffer and point, the access map holds the last writer and
    # the readers since, as the command and instruction graphs track it, so dependencies
    # are a function of the buffers' own state (which is what replay keys on).
    def _compute_dependencies(self, t: Task) -> None:
        replay = self.replay
        if replay is not None:
            key = self._replay_key(t)
            if key is None or len(key) == 1:
                if key is None:
                    replay.bypassed += 1
                self._lower_dependencies(t)
                for bid in t.buffer_ids:
                    self._shapes.pop(bid, None)   # (changed outside replay: shape it anew when needed)
                return
            e = self._horizons.epoch   # (epoch_for_new_tasks, without the property's call)
            eft = None if e is None else self.tasks[e]
            epoch_rel = None if e is None else e - t.id
            tpl = replay.find(key, epoch_rel)
            if tpl is not None:
                replay.hits += 1
                self._replay(t, tpl, eft)
                return
            self._epoch_merged = False
            self._lower_dependencies(t)
            replay.misses += 1
            replay.keep(key, self._record(t, key[1]), epoch_rel, self._epoch_merged)
            return
        self._lower_dependencies(t)

    def _lower_dependencies(self, t: Task) -> None:
        geom = t.geometry
        full = geom.box if geom is not None else _EMPTY_BOX0
        accesses = t.accesses
        reductions = t.reductions
        bids = t.buffer_ids
        tasks = self.tasks
        for bid in bids:
            info = self.buffers.get(bid)
            if info is None or bid not in self._access:
                what = "does not exist" if info is None else "was destroyed"
                raise RangeMapperError(f"{t.label} accesses buffer {info.label if info else f'B{bid}'}, "
                                       f"which {what}")
            consumed = produced = None
            for a in accesses:
                if a.buffer != bid:
                    continue
                reg = a.mapper(full, info.shape)
                mode = a.mode
                if mode in CONSUMER_MODES:
                    consumed = reg if consumed is None else consumed | reg
                if mode in PRODUCER_MODES:
                    produced = reg if produced is None else produced | reg
            for red in reductions:
                if red.buffer == bid:
                    if red.include_current:
                        consumed = info.box if consumed is None else consumed | info.box
                    produced = info.box if produced is None else produced | info.box
            if isinstance(consumed, Box):
                consumed = Region.from_box(consumed)
            if isinstance(produced, Box):
                produced = Region.from_box(produced)
            if bid in self._stale:
                self._sync(bid)
            acc = self._access[bid]
            tid = t.id
            if consumed:
                written = self._written[bid]
                if written is not None:   # None: every element has been written
                    uninit = consumed - written
                    if uninit and self.diagnostics != DIAG_OFF:
                        msg = (f"{t.label} reads {uninit} of buffer {info.label}, "
                               f"which has never been written (uninitialized read)")
                        if any(a.buffer == bid and a.mode in (WRITE, READ_WRITE) for a in accesses):
                            # (as Celerity's warning says: a write access is brought up to date first)
                            msg += ("; a write or read_write access keeps what the task does not write: "
                                    "declare it with no_init=True if the task overwrites all of it")
                        if self.diagnostics == DIAG_ERROR:
                            raise DiagnosticError(msg)
                        log.warning(msg)
                # (the order of add_dep calls with equal kind and origin does not matter)
                for writer in set(acc.read_collect(consumed, tid)):
                    if writer is not None:
                        w = tasks.get(writer)
                        if w is not None:
                            t.add_dep(w, TRUE_DEP, ORIGIN_DATAFLOW)
            if produced:
                # overwriting a part orders this task after the tasks that read that part
                # since its last write, or after the last writer where nobody read it
                for writer, readers in set(acc.update_collect(produced, (tid, _NO_READERS))):
                    if writer is None:
                        continue   # never written: nobody read initialized data there
                    found = False
                    for r in readers:
                        if r != tid:
                            rt = tasks.get(r)
                            if rt is not None:
                                t.add_dep(rt, ANTI_DEP, ORIGIN_DATAFLOW)
                                found = True
                    if not found and writer != tid:
                        w = tasks.get(writer)
                        if w is not None:
                            t.add_dep(w, ANTI_DEP, ORIGIN_DATAFLOW)
                written = self._written[bid]
                if written is not None:
                    written = written | produced
                    if written == info.box:
                        written = None
                    self._written[bid] = written
        for ho in t.side_effects:
            prev = self._last_side_effect.get(ho)
            if prev is not None and prev.id in tasks:
                t.add_dep(prev, TRUE_DEP, ORIGIN_SIDE_EFFECT)
            self._last_side_effect[ho] = t
        if t.collective_group is not None:
            prev = self._last_collective.get(t.collective_group)
            if prev is not None and prev.id in tasks:
                t.add_dep(prev, TRUE_DEP, ORIGIN_COLLECTIVE)
            self._last_collective[t.collective_group] = t
        eft = self.epoch_for_new_tasks
        if eft is not None and not t.has_true_dep():
            # (merged into an anti-dependency on the epoch itself: replay keys the template
            # by the epoch's distance, see _record)
            self._epoch_merged = eft.id in t.deps
            t.add_dep(eft, TRUE_DEP, ORIGIN_LAST_EPOCH)

    # ---- replay (see scheduler/replay.py) ------------------------------------------
    def _replay_key(self, t: Task) -> tuple | None:
        """What determines ``t``'s dependencies and its buffers' new state, or None when the
        lowering must run every time (user mappers, fences, uninitialized data to report)."""
        if t.kind not in _REPLAYABLE:
            return None
        sig = t.replay_sig
        if sig is SIG_UNKNOWN:
            sig = replay_signature(t)
        if sig is None:
            return None
        bids = t.buffer_ids
        sig_id = t.replay_sig_id = self.replay.signature(sig)
        if sig_id is None:
            return (sig,)   # a first sighting: lowered normally, nothing shaped or recorded
        tid = t.id
        parts = []
        written = self._written
        shapes = self._shapes
        for bid in bids:
            if written.get(bid, False) is not None:
                return None   # parts never written (or no such buffer): diagnose every time
            sh = shapes.get(bid)
            if sh is None:
                snap, top = own_base_shape(self._access[bid])
                sh = shapes[bid] = (self.replay.intern(snap), top, snap)
            parts.append(sh[0])
            parts.append(None if sh[1] is None else sh[1] - tid)
        # (the epoch's distance is not in the key: see Replay.find)
        side_effects = t.side_effects
        group = t.collective_group
        if side_effects or group is not None:
            tasks = self.tasks
            extras = (self._horizons.epoch is None,
                      tuple([_rel_task(self._last_side_effect.get(ho), tid, tasks) for ho in side_effects]),
                      None if group is None else _rel_task(self._last_collective.get(group), tid, tasks))
        else:   # (the same tuple without the comprehension: most tasks have neither)
            extras = (self._horizons.epoch is None, (), None)
        return (sig_id, bids, tuple(parts), extras)

    def _record(self, t: Task, bids: tuple) -> tuple:
        """The template of ``t``'s lowering just done: dependencies and new buffer states,
        ids relative to ``t``."""
        tid = t.id
        # the epoch dependency of a task without a true one is written symbolically (None:
        # whichever task is the epoch at replay), so the template holds at any distance
        # from the epoch; where it merged with an anti-dependency on the epoch itself, that
        # dependency's relative id is the state's, and the template is kept per distance
        symbolic = not self._epoch_merged
        # (each dependency's (kind, origin) value is kept as it is: _replay shares it)
        deps = tuple([(None if symbolic and ko[1] == ORIGIN_LAST_EPOCH else d - tid, ko)
                      for d, ko in t.deps.items()])
        post = []
        for bid in bids:
            snap, top = own_base_shape(self._access[bid])
            sid = self.replay.intern(snap)
            self._shapes[bid] = (sid, top, snap)
            post.append((bid, sid, snap, relative_id(top, tid)))
        return deps, tuple(post)

    def _sync(self, bid: int) -> None:
        """Rebuild a buffer's access map from the shape replay left it as."""
        _sid, base, snap = self._stale.pop(bid)
        self._access[bid].restore(snap, absolute(base or 0))

    def _replay(self, t: Task, tpl: tuple, eft: Task | None) -> None:
        """Apply template ``tpl`` to ``t``; ``eft`` is the epoch for new tasks."""
        deps, post = tpl
        tid = t.id
        tasks = self.tasks
        # Task.add_dep inline, with the template's (kind, origin) tuples shared (-0.4 us a task)
        tdeps = t.deps
        cpl = t.critical_path_length
        for rel, ko in deps:
            dep = eft if rel is None else tasks[tid + rel]
            did = dep.id
            cur = tdeps.get(did)
            if cur is None:
                tdeps[did] = ko
                if dep.critical_path_length >= cpl:
                    cpl = dep.critical_path_length + 1
            elif ko[0] == TRUE_DEP and cur[0] == ANTI_DEP:
                tdeps[did] = ko
        t.critical_path_length = cpl
        shapes = self._shapes
        stale = self._stale
        for bid, sid, snap, top in post:   # (the map is rebuilt when read: _sync)
            shapes[bid] = stale[bid] = (sid, None if top is None else top + tid, snap)
        for ho in t.side_effects:
            self._last_side_effect[ho] = t
        if t.collective_group is not None:
            self._last_collective[t.collective_group] = t

    # ---- commit, horizons, epochs ------------------------------------------------
    def _commit(self, t: Task, reduce_front: bool = True) -> None:
        horizons = self._horizons
        if reduce_front and t.kind in (HORIZON, EPOCH):
            for f in horizons.collapse_front():
                t.add_dep(f, TRUE_DEP, ORIGIN_EXECUTION_FRONT)
            horizons.add(t.id, (), t)
        else:
            horizons.add(t.id, t.deps, t)
        self.tasks[t.id] = t
        if t.critical_path_length > self._max_cpl:
            self._max_cpl = t.critical_path_length
        if self.stream:
            geom = t.geometry
            rng = geom.global_range if geom else ()
            stream = self._stream
            sid = self._str_ids
            accesses = t.accesses
            accessed = ()
            if accesses:                     # (a loop: a comprehension is a call in CPython 3.11)
                acc = []
                for a in accesses:
                    acc.append((a.buffer, sid[a.mode]))
                accessed = tuple(acc)
            if t.collective_group is not None or t.side_effects or t.reductions:
                # (the group among them: ints only, hash(None) differs between processes)
                accessed += _effects(t)
            stream.append((sid[t.kind], sid[t.name], t.id, rng, accessed))
            digest = self._digest
            if t.kind == EPOCH:
                self._fold_stream()
                self._checkpoint(t.id)
                t.stream_hash = self.stream_hash
                if self._digest_more is not None:
                    digest.append(self._digest_more)
                t.digest = digest
                prev = self.latest_epoch
                self._closed = (None if prev is None else prev.id, t)   # (before _digest: see pending_digest)
                self._digest = []
                self._digest_more = None
                self._tail = None
            else:
                if len(stream) >= 1024:
                    self._fold_stream()
                    self._checkpoint(t.id)
                entry = (t.id, t.kind, t.name, rng, accessed)   # (a tuple: the stream entry above hashes it)
                if len(digest) < DIGEST_LIMIT:
                    digest.append(entry)
                else:
                    self._overflow(entry)
        if self.recorder is not None:
            self.recorder.record_task(t, self.buffers)
        if self.on_task is not None:
            self.on_task(t)

    def _overflow(self, entry: tuple) -> None:
        """A digest entry past DIGEST_LIMIT since the epoch: into the ring of the newest."""
        tail = self._tail
        if tail is None:
            self._digest_more = (entry[0], DIGEST_MORE, "", (), ())
            tail = self._tail = deque(maxlen=DIGEST_LIMIT)
        tail.append(entry)

    FOLDS_KEPT = 64           # checkpoints kept (past 2x, the older half goes): 64K tasks back at least

    def _checkpoint(self, tid: int) -> None:
        folds = self._folds
        folds.append((tid, self.stream_hash))
        if len(folds) > 2 * self.FOLDS_KEPT:
            self._folds_from = folds[-self.FOLDS_KEPT - 1][0] + 1
            del folds[:-self.FOLDS_KEPT]

    def stream_checkpoints(self) -> tuple[int, int, list[tuple[int, int]]]:
        """``(lo, hi, [(task id, stream hash), ...])``: where the stream hash was folded, at
        which task, over the task ids lo..hi, every fold there listed (the application thread
        may be committing task hi + 1; a copy: the divergence check reads it from another
        thread).  Folds fall at every epoch and after every 1024 stream entries, so ranks
        whose streams agree up to task N list the same folds up to N with the same hashes:
        where two ranks' lists differ over the ids both cover, their streams differ at or
        before the first such id, however far it lies behind the newest DIGEST_LIMIT
        entries that ``pending_digest`` lists.  Nothing per task: a tuple per fold."""
        n = self._next_id               # (read first: task n - 2's commit, fold included, is over)
        folds = self._folds[:]
        lo = self._folds_from           # (read last: a trim since the copy only raises it)
        hi = n - 1 if folds and folds[-1][0] == n - 1 else n - 2   # (task n - 1 folded: its commit is past that)
        return lo, hi, [f for f in folds if lo <= f[0] <= hi]

    def _fold_stream(self) -> None:
        """Fold the tasks committed since the last fold into ``stream_hash`` (in batches: a
        hash per task cost more than the rest of a replayed task's bookkeeping).  The
        entries hold only ints (strings were mapped by ``_StableStrIds``), whose tuple
        hash CPython computes the same way in every process (masked to a non-negative
        48-bit number); the repr-and-CRC it replaced cost 7 % of a replayed submit."""
        if self._stream:
            self.stream_hash = hash((self.stream_hash, tuple(self._stream))) & 0xFFFF_FFFF_FFFF
            self._stream = []

    def _maybe_horizon(self) -> None:
        if (self._max_cpl - self._horizon_cpl >= self.horizon_step
                or len(self._horizons.front) > self.horizon_max_parallelism):
            self._generate_horizon()

    def _generate_horizon(self) -> Task:
        self._horizon_cpl = self._max_cpl
        h = self._new_task(HORIZON, name="horizon")
        self._commit(h)
        prev = self._horizons.horizon(h.id)
        if prev is not None:
            self._apply_epoch(self.tasks[prev])
        return h

    def _apply_epoch(self, epoch: Task) -> None:
        """Everything older than ``epoch`` is now represented by it."""
        eid = epoch.id
        shapes = self._shapes
        access = self._access
        # (over a copy: a cl.Buffer's finalizer may run on this thread mid-loop, when the
        # cyclic GC collects it, and destroy its buffer; the runtime's lock is re-entrant)
        for bid, acc in list(access.items()):
            if bid not in access:
                continue
            rec = shapes.get(bid)
            if rec is None:
                acc.apply_all(partial(_collapse_task_access, eid=eid))
                continue
            # a buffer known by its shape collapses shape to shape, memoized (no map is rebuilt)
            # (ids relative to the shape's base, or to the epoch where it names no task)
            sid, base, snap = rec
            anchor = eid if base is None else base
            key = (sid, eid - anchor)
            hit = self._collapsed.get(key)
            if hit is None:
                if bid in self._stale:
                    self._sync(bid)
                acc.apply_all(partial(_collapse_task_access, eid=eid))
                snap, top = own_base_shape(acc)
                hit = (self.replay.intern(snap), snap, relative_id(top, anchor))
                if len(self._collapsed) >= 4096:
                    self._collapsed.clear()
                self._collapsed[key] = hit
                shapes[bid] = (hit[0], top, snap)
            else:
                shapes[bid] = self._stale[bid] = (hit[0], absolute_id(hit[2], anchor), hit[1])
        for d in (self._last_side_effect, self._last_collective):
            if d:
                collapse_map(d, eid, epoch, key=_task_id)

    def prune_before(self, task_id: int) -> None:
        """Forget tasks older than an epoch/horizon the executor has reached."""
        eft = self.epoch_for_new_tasks.id if self.epoch_for_new_tasks else task_id
        limit = min(task_id, eft)
        tasks = self.tasks
        for tid in range(self._pruned_to, limit):   # (not a walk over every live task: that
            tasks.pop(tid, None)                     # grows with how far the scheduler lags)
        if limit > self._pruned_to:
            self._pruned_to = limit

    def pending_digest(self, after: int | None = None) -> list:
        """The digest entries (id, kind, name, range, accesses) of the tasks committed since
        the last epoch (a copy: the divergence check reads it from another thread), or of the
        newest DIGEST_LIMIT of them where there are more (a list without a gap).  With
        ``after`` the id of the epoch before the latest one (a reader, the executor, that
        has not reached the latest epoch yet): since that one, the latest epoch listed as
        ``(id, EPOCH, action, (), ())`` in between (its stretch up to its DIGEST_MORE entry
        only, if it has one: nothing after that would be complete)."""
        tail = self._tail
        if tail is not None:             # (contiguous: the newest DIGEST_LIMIT entries)
            newest = list(tail)
            return newest if len(newest) >= DIGEST_LIMIT else self._digest[len(newest) - DIGEST_LIMIT:] + newest
        digest = self._digest            # (read before _closed: _commit writes them the other way round)
        cur = list(digest)
        closed = self._closed
        if after is None or closed is None or closed[0] != after:
            return cur
        epoch = closed[1]
        if digest is epoch.digest:       # (read between _commit's two writes: nothing since the epoch)
            cur = []
        old = epoch.digest
        if old and old[-1][1] == DIGEST_MORE:
            return list(old)
        return old + [(epoch.id, EPOCH, epoch.epoch_action, (), ())] + cur

    @property
    def epoch_for_new_tasks(self) -> Task | None:
        """The task every new task without another true dependency depends on."""
        e = self._horizons.epoch
        return None if e is None else self.tasks[e]

    @property
    def num_live_tasks(self) -> int:
        return len(self.tasks)


def _task_id(t: Task) -> int:
    return t.id


_NO_READERS: frozenset = frozenset()


def _buffer_ids(accesses: list, reductions: list) -> tuple[int, ...]:
    """The distinct buffers a task accesses or reduces into, sorted (``Task.buffer_ids``)."""
    if not reductions:
        n = len(accesses)
        if n == 1:
            return (accesses[0].buffer,)
        if n == 2:   # (a stencil's two accesses without building sets)
            a, b = accesses[0].buffer, accesses[1].buffer
            return (a, b) if a < b else (b, a) if b < a else (a,)
    return tuple(sorted({a.buffer for a in accesses} | {r.buffer for r in reductions}))


_SIG_ACCESSES = 5   # where a replay signature holds ``_access_key``'s tuple


def access_key(t: Task) -> tuple:
    """Per access the buffer, mode and mapper: the part of ``replay_signature`` that chunk
    plans are keyed on too (``ChunkPlanning._plan_chunks``), taken from the signature where
    the task has one (made once per task)."""
    sig = t.replay_sig
    return sig[_SIG_ACCESSES] if type(sig) is tuple else _access_key(t)


def _access_key(t: Task) -> tuple:
    return tuple([(a.buffer, a.mode, a.mapper) for a in t.accesses]) if t.accesses else ()


def replay_signature(t: Task) -> tuple | None:
    """What of a compute task itself (not of its buffers' state) the task and command
    graphs' lowerings read: kind, geometry, split, per access the buffer, mode and mapper
    (a pure one stands for its results), reductions, side effects and collective group.
    None when a mapper is opaque: the task is lowered anew every time.  Computed once per
    task: a task does not change after its submission.  It also holds what only the
    instruction level reads (the oversubscription, the reductions' operators): a command
    made from a template then determines its instruction-level signature and plans by
    the template entry alone (``ExecutionCommand.memo``)."""
    sig = t.replay_sig
    if sig is not SIG_UNKNOWN:
        return sig
    sig = None
    accesses = t.accesses
    for a in accesses:
        if not a.pure:
            break
    else:
        geom = t.geometry
        reductions = t.reductions
        sig = (t.kind, geom.global_range, geom.offset, geom.granularity, t.split,
               _access_key(t),                      # (at _SIG_ACCESSES)
               tuple([(r.buffer, r.include_current, r.op) for r in reductions]) if reductions else (),
               tuple(t.side_effects), t.collective_group, t.oversubscribe)
    t.replay_sig = sig
    return sig


def _collapse_task_access(value: tuple, eid: int) -> tuple:
    """The epoch collapse of a task-level access value: an older writer is represented by
    the epoch; older readers are dropped, as the epoch (which a later writer then depends
    on) already follows them.  Readers since the epoch's creation stay: a writer must
    still be ordered after them."""
    w, rs = value
    nw = eid if w is not None and w < eid else w
    if rs and min(rs) < eid:
        rs = frozenset([r for r in rs if r >= eid])
    return value if nw == w and rs is value[1] else (nw, rs)


_REPLAYABLE = frozenset((DEVICE_COMPUTE, HOST_COMPUTE, COLLECTIVE, MASTER_NODE))


def _rel_task(t: "Task | None", base: int, tasks: dict) -> int | None:
    """A task's id relative to ``base``, None for no task (or one already forgotten)."""
    return None if t is None or t.id not in tasks else t.id - base
