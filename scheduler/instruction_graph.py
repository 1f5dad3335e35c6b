"""Instruction and pilot types: the contract between the scheduler and the executor.

The instruction graph generator (``instruction_graph.py``) produces these; the
executor consumes them and knows nothing else about the scheduler.  Every
instruction lists its predecessors by id; the generator emits instructions in a
topological order, so a predecessor id the executor has never seen (or already
retired) is complete.

Memories: 0 user (host arrays owned by buffers, fence results), 1 host (staging,
host tasks), 2 + d device d.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .geometry import Box, Region

USER_MEMORY = 0
HOST_MEMORY = 1


def device_memory(device: int) -> int:
    return 2 + device


# transfer id: (task id, buffer id, reduction id); reduction 0 = none
TransferId = tuple[int, int, int]


# dependency origins (the ``deps`` of an instruction are (id, origin) pairs)
DEP_READ = "read"              # reads what the predecessor wrote
DEP_WRITE = "write"            # overwrites what the predecessor read or wrote
DEP_SIDE_EFFECT = "side_effect"
DEP_COLLECTIVE = "collective_order"
DEP_LAST_EPOCH = "last_epoch"
DEP_EXECUTION_FRONT = "execution_front"
DEP_SPLIT_RECEIVE = "split_receive"


@dataclass(slots=True)
class Pilot:
    """Announces a send to the receiver so it can match the payload to a receive."""

    msg_id: int
    to: int
    transfer: TransferId
    box: Box

    def to_record(self) -> dict:
        return {"msg_id": self.msg_id, "to": self.to, "transfer": list(self.transfer),
                "box": self.box.to_json()}


@dataclass(slots=True)
class AccessAllocation:
    """One accessor of a kernel/host task resolved to the allocation that backs it."""

    buffer: int
    allocation: int
    allocation_box: Box   # the allocation's extent in buffer coordinates
    box: Box              # bounding box of what the chunk accesses (buffer coordinates)
    region: Region | None = None  # exact accessed region (for bounds checks); None = box
    mode: str = ""                # access mode (read, write, ...) of the accessor

    def to_record(self) -> dict:
        return {"buffer": self.buffer, "allocation": self.allocation, "box": self.box.to_json(),
                "mode": self.mode}


@dataclass(slots=True)
class ReductionAllocation:
    """Where a kernel chunk combines its partial result for one reduction."""

    reduction: int
    buffer: int
    allocation: int        # a 1-element allocation on the chunk's memory
    include_current: bool  # the allocation starts with the buffer's value, not the identity

    def to_record(self) -> dict:
        return {"reduction": self.reduction, "buffer": self.buffer, "allocation": self.allocation,
                "include_current": self.include_current}


@dataclass(slots=True, eq=False)
class Instruction:
    id: int
    deps: list[tuple[int, str]] = field(default_factory=list)  # (predecessor id, origin)
    priority: int = 0

    kind = "instruction"

    def fields(self) -> dict:
        return {}

    def to_record(self) -> dict:
        rec = {"id": self.id, "kind": self.kind,
               "deps": [{"id": d, "origin": o} for d, o in self.deps],
               "priority": self.priority}
        rec.update(self.fields())
        return rec

    @property
    def dep_ids(self) -> list[int]:
        return [d for d, _ in self.deps]


@dataclass(slots=True, eq=False)
class AllocInstruction(Instruction):
    allocation: int = 0
    memory: int = 0
    buffer: int | None = None
    box: Box | None = None        # buffer coordinates (None for scratch/gather space)
    shape: tuple[int, ...] = ()   # numpy shape of the allocation
    dtype: Any = None             # numpy dtype
    size_bytes: int = 0
    kind = "alloc"

    def fields(self) -> dict:
        return {"allocation": self.allocation, "memory": self.memory, "buffer": self.buffer,
                "box": self.box.to_json() if self.box is not None else None,
                "size_bytes": self.size_bytes}


@dataclass(slots=True, eq=False)
class FreeInstruction(Instruction):
    allocation: int = 0
    memory: int = 0
    kind = "free"

    def fields(self) -> dict:
        return {"allocation": self.allocation}


@dataclass(slots=True, eq=False)
class CopyInstruction(Instruction):
    """Copy ``box`` (buffer coordinates) between two allocations of the same buffer."""

    source: int = 0
    dest: int = 0
    source_memory: int = 0
    dest_memory: int = 0
    buffer: int | None = None
    box: Box | None = None
    source_box: Box | None = None  # extent of the source allocation
    dest_box: Box | None = None    # extent of the destination allocation
    layout: str = "strided"        # "strided" (n-d box in both) or "linearized"
    size_bytes: int = 0
    evicts: bool = False           # saves data of an allocation evicted for lack of device memory
    kind = "copy"

    def fields(self) -> dict:
        rec = {"source": self.source, "dest": self.dest, "source_memory": self.source_memory,
               "dest_memory": self.dest_memory, "buffer": self.buffer,
               "box": self.box.to_json() if self.box is not None else None, "layout": self.layout,
               "size_bytes": self.size_bytes}
        if self.evicts:
            rec["evict"] = True
        return rec


@dataclass(slots=True, eq=False)
class DeviceKernelInstruction(Instruction):
    device: int = 0
    task: int = 0
    box: Box | None = None
    accesses: list[AccessAllocation] = field(default_factory=list)
    reductions: list[ReductionAllocation] = field(default_factory=list)
    launcher: Callable[..., Any] | None = None  # opaque: provided by the task's creator
    name: str = ""
    batch: tuple[int, int] | None = None   # (i, n): batch i of n of a chunk too large for its device
    kind = "device_kernel"

    def fields(self) -> dict:
        rec = {"device": self.device, "task": self.task, "box": self.box.to_json(),
               "accesses": [a.to_record() for a in self.accesses], "name": self.name}
        if self.reductions:   # (where each reduction combines: a scratch slot, or the target in place)
            rec["reductions"] = [r.to_record() for r in self.reductions]
        if self.batch is not None:
            rec["batch"] = list(self.batch)
        return rec


@dataclass(slots=True, eq=False)
class HostTaskInstruction(Instruction):
    task: int = 0
    box: Box | None = None
    global_range: tuple[int, ...] = ()
    accesses: list[AccessAllocation] = field(default_factory=list)
    collective_group: int | None = None
    launcher: Callable[..., Any] | None = None
    name: str = ""
    kind = "host_task"

    def fields(self) -> dict:
        return {"task": self.task, "box": self.box.to_json(),
                "accesses": [a.to_record() for a in self.accesses], "name": self.name,
                "collective_group": self.collective_group}


@dataclass(slots=True, eq=False)
class SendInstruction(Instruction):
    to: int = 0
    msg_id: int = 0
    transfer: TransferId = (0, 0, 0)
    box: Box | None = None          # what is sent (buffer coordinates)
    source: int = 0                 # allocation
    source_box: Box | None = None   # extent of that allocation
    dtype: Any = None
    size_bytes: int = 0
    kind = "send"

    def fields(self) -> dict:
        return {"to": self.to, "msg_id": self.msg_id, "transfer": list(self.transfer),
                "box": self.box.to_json(), "source": self.source, "size_bytes": self.size_bytes}


@dataclass(slots=True, eq=False)
class ReceiveInstruction(Instruction):
    """Receive every inbound fragment of ``region`` into allocation ``dest`` (host memory, or the
    reading device's memory where the communicator can write there)."""

    transfer: TransferId = (0, 0, 0)
    region: Region | None = None
    dest: int = 0
    dest_box: Box | None = None
    dtype: Any = None
    size_bytes: int = 0
    kind = "receive"

    def fields(self) -> dict:
        return {"transfer": list(self.transfer), "region": self.region.to_json(), "dest": self.dest,
                "size_bytes": self.size_bytes}


@dataclass(slots=True, eq=False)
class SplitReceiveInstruction(ReceiveInstruction):
    """Start receiving ``region``; ``await_receive`` instructions complete per sub-region."""

    kind = "split_receive"


@dataclass(slots=True, eq=False)
class AwaitReceiveInstruction(Instruction):
    transfer: TransferId = (0, 0, 0)
    region: Region | None = None
    kind = "await_receive"

    def fields(self) -> dict:
        return {"transfer": list(self.transfer), "region": self.region.to_json()}


@dataclass(slots=True, eq=False)
class GatherReceiveInstruction(Instruction):
    """Receive one ``chunk_bytes`` partial result from every other rank into slot ``rank``."""

    transfer: TransferId = (0, 0, 0)
    dest: int = 0
    chunk_bytes: int = 0
    num_ranks: int = 1
    kind = "gather_receive"

    def fields(self) -> dict:
        return {"transfer": list(self.transfer), "chunk_bytes": self.chunk_bytes}


@dataclass(slots=True, eq=False)
class FillIdentityInstruction(Instruction):
    reduction: int = 0
    allocation: int = 0
    count: int = 0
    identity: Any = None
    kind = "fill_identity"

    def fields(self) -> dict:
        return {"reduction": self.reduction, "count": self.count}


@dataclass(slots=True, eq=False)
class ReduceInstruction(Instruction):
    """dest[0] = op over source[0:count] (and dest[0] itself when ``include_dest``)."""

    reduction: int = 0
    source: int = 0
    dest: int = 0
    count: int = 0
    op: Any = None                  # a numpy ufunc
    include_dest: bool = False
    kind = "reduce"

    def fields(self) -> dict:
        return {"reduction": self.reduction, "count": self.count}


@dataclass(slots=True, eq=False)
class FenceInstruction(Instruction):
    task: int = 0
    promise: Any = None             # resolved with the user allocation / host object
    allocation: int | None = None   # user allocation holding the snapshot (buffer fences)
    host_object: int | None = None
    kind = "fence"

    def fields(self) -> dict:
        return {"task": self.task}


@dataclass(slots=True, eq=False)
class DestroyHostObjectInstruction(Instruction):
    host_object: int = 0
    kind = "destroy_host_object"

    def fields(self) -> dict:
        return {"host_object": self.host_object}


@dataclass(slots=True, eq=False)
class CloneCollectiveGroupInstruction(Instruction):
    original: int = 0
    new: int = 0
    kind = "clone_collective_group"

    def fields(self) -> dict:
        return {"original": self.original, "new": self.new}


@dataclass(slots=True, eq=False)
class HorizonInstruction(Instruction):
    task: int = 0
    garbage: list[int] = field(default_factory=list)  # user allocations to drop
    kind = "horizon"

    def fields(self) -> dict:
        return {"task": self.task}


@dataclass(slots=True, eq=False)
class EpochInstruction(Instruction):
    task: int = 0
    action: str = "none"            # "none" | "barrier" | "shutdown" | "init"
    garbage: list[int] = field(default_factory=list)
    stream_hash: int = 0            # task-stream hash up to this epoch (ranks compare it)
    digest: list = field(default_factory=list)  # task_graph's DIGEST entries since the previous epoch
    kind = "epoch"

    def fields(self) -> dict:
        return {"task": self.task, "action": self.action}


@dataclass(slots=True)
class LaunchContext:
    """What the executor hands to a kernel's or host task's ``launcher``.

    ``arrays[i]`` is the backend array of ``instruction.accesses[i].allocation``
    (shaped like that allocation's box); ``reduction_arrays[j]`` the 1-element
    array of ``instruction.reductions[j]``.
    """

    box: Box
    device: int | None
    arrays: list[Any]
    reduction_arrays: list[Any]
    xp: Any = None                 # array module of the memory (numpy, cupy)
    global_range: tuple[int, ...] = ()
    communicator: Any = None       # collective host tasks: the group's communicator
    rank: int = 0
    stream: Any = None             # backend lane handle (CUDA stream / OpenCL queue)
    accesses: list = field(default_factory=list)  # the instruction's AccessAllocation list
    task: int = -1                 # task id, for error messages
    reductions: list = field(default_factory=list)  # the instruction's ReductionAllocation list
    chunk: Any = None              # the kernel's last Chunk, kept by its launcher (see handler._Launcher)


@dataclass(frozen=True, slots=True)
class AccessorArg:
    """A device source kernel argument naming ``LaunchContext.arrays[index]`` (an accessor);
    ``label`` is its buffer's (``B3 "name"``), for the backend's messages."""

    index: int
    label: str = field(default="", compare=False)


@dataclass(slots=True)
class InstructionBatch:
    """One hand-off from the scheduler thread to the executor.

    ``user_allocations`` binds the user-memory allocation ids that this batch's
    instructions may use to the buffers whose host arrays the runtime registered with
    the executor (``Executor.track_user_buffer``): the arrays themselves never pass
    through the scheduler.
    """

    instructions: list[Instruction]
    pilots: list[Pilot]
    user_allocations: list[tuple[int, int]] = field(default_factory=list)   # (allocation, buffer)
    # the serial numbers of the replay templates the instructions were made from, one per
    # command, or None (something lowered, not replayed): batches of one shape hold the same
    # kinds of instruction in the same order, with the same priorities, boxes, memories and
    # sizes (ids, tasks, names and launchers differ: see InstructionGraphGenerator.compile),
    # so what the executor works out from a batch's kinds, priorities and copies holds for all
    shape: tuple[int, ...] | None = None
