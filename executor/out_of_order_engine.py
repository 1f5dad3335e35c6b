"""Out-of-order engine: decides which instruction runs next, and where.

The engine sees instructions in topological order and tracks, per instruction,
its incomplete predecessors.  It knows nothing about arrays or backends: it maps
each instruction to a *target* (immediate, alloc queue, host lanes, device
lanes of device d) and, for lane targets, to one in-order lane.  Lanes are what
lets the backend overlap independent work while keeping dependent work ordered
without a round trip through the executor: an instruction whose incomplete
predecessors all sit on one lane, with one of them at its tail, is *eagerly*
appended to that lane, so its launch latency hides behind the predecessor.

Cost: the executor pays for every instruction here, so the per-instruction path
allocates one object (the node, which is also the ``Assignment`` handed out) and
looks for an eager lane only when one can exist: when the instruction's only
incomplete predecessors have just been assigned to a lane (or the others
completed), not on every submit, assignment and completion.
"""
from __future__ import annotations

import enum
import heapq
import logging
from collections import deque
from typing import Any, Callable, Iterable

from scheduler.instruction_graph import (AllocInstruction, CopyInstruction, DeviceKernelInstruction,
                                         FillIdentityInstruction, FreeInstruction,
                                         HostTaskInstruction, Instruction, ReduceInstruction)

log = logging.getLogger("celeritas.executor")


class Target(enum.StrEnum):
    """A StrEnum because target keys are hashed on every assignment: str hashing is C,
    ``Enum.__hash__`` is Python."""

    IMMEDIATE = "immediate"      # bookkeeping, receives, sends, fences, horizons, epochs
    ALLOC_QUEUE = "alloc_queue"  # alloc / free
    HOST_LANE = "host_lane"      # host tasks, host-side copies, fill_identity, reduce
    DEVICE_LANE = "device_lane"  # kernels and copies touching one device's memory


# (target, device) — device is None except for DEVICE_LANE
TargetKey = tuple[Target, "int | None"]

_IMMEDIATE: TargetKey = (Target.IMMEDIATE, None)
_ALLOC: TargetKey = (Target.ALLOC_QUEUE, None)
_HOST: TargetKey = (Target.HOST_LANE, None)
_LANE_KINDS = frozenset((Target.HOST_LANE, Target.DEVICE_LANE))


def default_targets(instr: Instruction) -> tuple[TargetKey, ...]:
    """Compatible targets of an instruction, preferred first.

    A copy between two device memories can run on either device's lanes; the
    engine picks the one that allows eager assignment, else the destination's.
    """
    typ = type(instr)
    fixed = _FIXED_TARGETS.get(typ)
    if fixed is not None:
        return fixed
    if isinstance(instr, DeviceKernelInstruction):
        t = _KERNEL_TARGETS.get(instr.device)
        if t is None:
            t = _KERNEL_TARGETS[instr.device] = ((Target.DEVICE_LANE, instr.device),)
        return t
    if isinstance(instr, CopyInstruction):
        s, d = instr.source_memory, instr.dest_memory
        t = _COPY_TARGETS.get((s, d))
        if t is None:
            if d >= 2 and s >= 2 and s != d:
                t = ((Target.DEVICE_LANE, d - 2), (Target.DEVICE_LANE, s - 2))
            elif d >= 2:
                t = ((Target.DEVICE_LANE, d - 2),)
            elif s >= 2:
                t = ((Target.DEVICE_LANE, s - 2),)
            else:
                t = (_HOST,)
            _COPY_TARGETS[(s, d)] = t
        return t
    if isinstance(instr, (HostTaskInstruction, FillIdentityInstruction, ReduceInstruction)):
        t = (_HOST,)
    elif isinstance(instr, (AllocInstruction, FreeInstruction)):
        t = (_ALLOC,)
    else:
        t = (_IMMEDIATE,)
    _FIXED_TARGETS[typ] = t      # everything but kernels and copies: depends on the type alone
    return t


# memo tables of default_targets (pure functions of an instruction type / device number)
_FIXED_TARGETS: dict[type, tuple[TargetKey, ...]] = {}
_KERNEL_TARGETS: dict[int, tuple[TargetKey, ...]] = {}
_COPY_TARGETS: dict[tuple[int, int], tuple[TargetKey, ...]] = {}


class Assignment:
    """Where to issue ``instruction``: ``lane`` is None for immediate/alloc targets.

    The engine's per-instruction node is a subclass, so handing out an assignment
    allocates nothing; its five public fields are set once, when the instruction
    is assigned, and never change afterwards: treat it as immutable.
    """

    __slots__ = ("instruction", "target", "device", "lane", "eager")

    def __init__(self, instruction: Instruction, target: Target, device: int | None, lane: int | None,
                 eager: bool):
        self.instruction = instruction
        self.target = target
        self.device = device
        self.lane = lane
        self.eager = eager

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Assignment):
            return NotImplemented
        return (self.instruction is other.instruction and self.target == other.target
                and self.device == other.device and self.lane == other.lane and self.eager == other.eager)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Assignment(I{self.instruction.id}, {self.target}, device={self.device}, lane={self.lane}, "
                f"eager={self.eager})")


_PENDING, _READY, _ASSIGNED = 0, 1, 2


class EngineLane:
    """One in-order lane of a target: the ids of its assigned, incomplete instructions.

    ``handle`` is the executor's: whatever it needs to issue on this lane (the
    backend lane), cached here so issuing needs no lookup.
    """

    __slots__ = ("key", "index", "queue", "handle")

    def __init__(self, key: TargetKey, index: int):
        self.key = key
        self.index = index
        self.queue: deque = deque()
        self.handle: Any = None


class Node(Assignment):
    """Per-instruction state; heap entries are ``(-priority, id, node)``.

    ``lane_ref`` is the lane it was assigned to (None for lane-less targets).
    """

    __slots__ = ("iid", "prio", "targets", "on_lanes", "preds", "succs", "state", "queued", "lane_ref")

    def __init__(self, instr: Instruction, targets: tuple[TargetKey, ...]):
        self.instruction = instr
        self.iid = instr.id
        self.prio = -instr.priority
        self.targets = targets
        self.on_lanes = targets[0][0] in _LANE_KINDS
        self.preds: set[int] = set()              # incomplete predecessor ids
        self.succs: list[Node] = []
        self.state = _PENDING
        self.queued = False                       # in the candidate heap
        self.lane_ref: EngineLane | None = None
        # target, device, lane and eager (the Assignment fields) are set on assignment


class OutOfOrderEngine:
    """Not thread-safe: owned by the executor thread.

    ``max_lanes[target]`` bounds the lanes per target (per device for device
    lanes); when all are busy a ready instruction waits for one to go idle.
    ``eager_filter(instruction, lane)``, where given, may decline an eager
    assignment: the instruction then waits until its predecessors completed, as
    if no lane could take it early (the executor declines work it would rather
    run itself once it is ready).
    """

    def __init__(self, *, max_host_lanes: int = 4, max_device_lanes: int = 4,
                 targets_of: Callable[[Instruction], tuple[TargetKey, ...]] = default_targets,
                 eager_filter: Callable[[Instruction, EngineLane], bool] | None = None):
        if max_host_lanes < 1 or max_device_lanes < 1:
            raise ValueError("lane limits must be at least 1")
        self._max = {Target.HOST_LANE: max_host_lanes, Target.DEVICE_LANE: max_device_lanes}
        self._targets_of = targets_of
        self._eager_filter = eager_filter
        self._nodes: dict[int, Node] = {}
        self._heap: list[tuple[int, int, Node]] = []
        self._ready = 0             # nodes in state _READY
        self._lanes: dict[TargetKey, list[EngineLane]] = {}
        # per target: heap of ready nodes waiting for a lane; one is released per lane
        # that goes idle (releasing all would make saturated targets quadratic)
        self._blocked: dict[TargetKey, list[tuple[int, int, Node]]] = {}

    # ---- queries

    def is_idle(self) -> bool:
        """No instruction submitted and not yet completed."""
        return not self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, instr_id: int) -> bool:
        return instr_id in self._nodes

    def instruction(self, instr_id: int) -> Instruction | None:
        n = self._nodes.get(instr_id)
        return n.instruction if n is not None else None

    def has_ready(self) -> bool:
        """Whether an instruction whose predecessors all completed waits to be assigned
        (eager candidates, which wait for work in flight, do not count)."""
        return self._ready > 0

    def would_assign_at_once(self, instr: Instruction) -> bool:
        """Whether ``instr``, submitted now, would be the next assignment: every predecessor
        has completed and nothing else is ready.  (The executor then runs cheap work
        without submitting it: see its "direct issue".)"""
        if self._ready:
            return False
        nodes = self._nodes
        for d, _ in instr.deps:
            if d in nodes:
                return False
        return True

    def lane_count(self, target: Target, device: int | None = None) -> int:
        return len(self._lanes.get((target, device), ()))

    def pending_instructions(self) -> list[Instruction]:
        """Every submitted, incomplete instruction (for teardown after a failure)."""
        return [n.instruction for n in self._nodes.values()]

    # ---- feeding

    def submit(self, instr: Instruction, deps: Iterable[int] | None = None) -> None:
        """Add an instruction; ``deps`` overrides ``instr.deps`` (predecessor ids)."""
        nodes = self._nodes
        iid = instr.id
        if iid in nodes:
            raise ValueError(f"instruction I{iid} submitted twice")
        node = Node(instr, self._targets_of(instr))
        preds = node.preds
        get = nodes.get
        # eager assignment needs every incomplete predecessor assigned to a lane already
        maybe_eager = node.on_lanes
        # (a predecessor listed twice appears twice among its successors: harmless, since
        # completion only discards from ``preds`` and a queued or ready node is never re-queued)
        if deps is None:
            for d, _ in instr.deps:
                p = get(d)
                if p is not None:
                    preds.add(d)
                    p.succs.append(node)
                    if maybe_eager and (p.state != _ASSIGNED or p.lane_ref is None):
                        maybe_eager = False
        else:
            for d in deps:
                p = get(d)
                if p is not None:
                    preds.add(d)
                    p.succs.append(node)
                    if maybe_eager and (p.state != _ASSIGNED or p.lane_ref is None):
                        maybe_eager = False
        nodes[iid] = node
        if not preds:
            node.state = _READY
            self._ready += 1
            node.queued = True
            heapq.heappush(self._heap, (node.prio, iid, node))
        elif maybe_eager and self._eager_lane(node) is not None:
            node.queued = True
            heapq.heappush(self._heap, (node.prio, iid, node))

    # ---- eager assignment

    def _eager_lane(self, node: Node) -> EngineLane | None:
        """The lane whose order already enforces all of ``node``'s incomplete predecessors."""
        nodes = self._nodes
        lane = None
        for pid in node.preds:
            p = nodes[pid]
            if p.state != _ASSIGNED:
                return None
            pl = p.lane_ref
            if pl is None:
                return None
            if lane is None:
                lane = pl
            elif pl is not lane:
                return None
        if lane is None or lane.key not in node.targets or lane.queue[-1] not in node.preds:
            return None
        return lane

    # ---- assignment

    def assign_one(self) -> Assignment | None:
        """The next instruction to issue (highest priority, then lowest id), or None.

        The assignment is the engine's node for the instruction (see ``Node``)."""
        heap = self._heap
        nodes = self._nodes
        while heap:
            node = heapq.heappop(heap)[2]
            node.queued = False
            state = node.state
            if state == _ASSIGNED or node.iid not in nodes:
                continue
            if state == _READY:
                if not node.on_lanes:                 # immediate / alloc: no lane
                    self._ready -= 1
                    node.state = _ASSIGNED
                    node.target, node.device = node.targets[0]
                    node.lane = None
                    node.eager = False
                    return node
                lane = self._pick_lane(node)
                if lane is None:
                    entry = (node.prio, node.iid, node)
                    for key in node.targets:
                        heapq.heappush(self._blocked.setdefault(key, []), entry)
                    continue
                self._ready -= 1
                return self._assign(node, lane, False)
            lane = self._eager_lane(node)
            if lane is not None and (self._eager_filter is None or self._eager_filter(node.instruction, lane)):
                return self._assign(node, lane, True)
        return None

    def _pick_lane(self, node: Node) -> EngineLane | None:
        """An idle lane, a new lane, or None when every lane of every target is busy."""
        targets = node.targets
        lanes_by_key = self._lanes
        for key in targets:
            for lane in lanes_by_key.get(key, ()):
                if not lane.queue:
                    return lane
        limit = self._max[targets[0][0]]
        for key in targets:
            lanes = lanes_by_key.get(key)
            if lanes is None:
                lanes = lanes_by_key[key] = []
            if len(lanes) < limit:
                lane = EngineLane(key, len(lanes))
                lanes.append(lane)
                return lane
        return None

    def _assign(self, node: Node, lane: EngineLane, eager: bool) -> Node:
        node.state = _ASSIGNED
        node.lane_ref = lane
        node.target, node.device = lane.key
        node.lane = lane.index
        node.eager = eager
        lane.queue.append(node.iid)
        # successors may now sit behind this lane's new tail
        for s in node.succs:
            if s.state == _PENDING and not s.queued and s.on_lanes:
                if len(s.preds) == 1:                # only this node: no need to look further
                    if lane.key in s.targets:
                        s.queued = True
                        heapq.heappush(self._heap, (s.prio, s.iid, s))
                elif self._eager_lane(s) is not None:
                    s.queued = True
                    heapq.heappush(self._heap, (s.prio, s.iid, s))
        return node

    # ---- completion

    def complete(self, instr_id: int) -> None:
        """Retire an issued instruction; unknown ids are ignored (already complete)."""
        node = self._nodes.pop(instr_id, None)
        if node is None:
            return
        if node.state == _READY:            # retired without being assigned
            self._ready -= 1
        lane = node.lane_ref
        if lane is not None:
            q = lane.queue
            if q and q[0] == instr_id:
                q.popleft()
            else:
                try:
                    q.remove(instr_id)
                except ValueError:
                    pass
            if not q and self._blocked:
                blocked = self._blocked.get(lane.key)
                while blocked:
                    b = heapq.heappop(blocked)[2]
                    if b.state == _READY and not b.queued:
                        b.queued = True
                        heapq.heappush(self._heap, (b.prio, b.iid, b))
                        break
        heap = self._heap
        for s in node.succs:
            preds = s.preds
            preds.discard(instr_id)
            if s.state != _PENDING:
                continue
            if not preds:
                s.state = _READY
                self._ready += 1
                if not s.queued:
                    s.queued = True
                    heapq.heappush(heap, (s.prio, s.iid, s))
            elif not s.queued and s.on_lanes and self._eager_lane(s) is not None:
                s.queued = True
                heapq.heappush(heap, (s.prio, s.iid, s))
