"""What the executor records per executed instruction when tracing is on.

The trace writer (``celeritas/trace.py``) turns these into Chrome trace events;
out-of-core work is named as the graph dumps name it ("evicting copy", a kernel's
"batch k of n").
"""
from __future__ import annotations

from dataclasses import dataclass

from scheduler.instruction_graph import GatherReceiveInstruction, Instruction


@dataclass(slots=True)
class TraceEvent:
    """One executed instruction (for the Chrome trace writer)."""

    instruction_id: int
    kind: str
    name: str
    lane: str
    start_ns: int
    end_ns: int
    task: int | None = None                 # task the instruction belongs to (transfer's task for comm)
    buffers: tuple[int, ...] = ()           # buffers it touches
    bytes: int = 0                          # size_bytes (copy, send, receive, alloc), gathered bytes
    deps: tuple[int, ...] = ()              # predecessor instruction ids (flow arrows)
    transfer: tuple[int, int, int] | None = None
    peer: int | None = None                 # destination rank of a send


def _trace_event(instr: Instruction, lane: str, start_ns: int, end_ns: int) -> TraceEvent:
    """Only called with tracing on: a few getattrs, so kinds need no per-type code here."""
    transfer = getattr(instr, "transfer", None)
    if transfer is not None:
        transfer = tuple(transfer)
    task = getattr(instr, "task", None)
    if task is None and transfer is not None:
        task = transfer[0]
    buf = getattr(instr, "buffer", None)
    if buf is not None:
        buffers: tuple[int, ...] = (buf,)
    elif transfer is not None:
        buffers = (transfer[1],)
    else:
        accesses = getattr(instr, "accesses", None)
        buffers = tuple(sorted({a.buffer for a in accesses})) if accesses else ()
    nbytes = getattr(instr, "size_bytes", 0) or 0
    if not nbytes and type(instr) is GatherReceiveInstruction:
        nbytes = instr.chunk_bytes * max(instr.num_ranks - 1, 0)
    name = getattr(instr, "name", "")
    if getattr(instr, "evicts", False):
        name = "evicting copy"          # (out of core: saves an evicted allocation's data)
    batch = getattr(instr, "batch", None)
    if batch is not None:
        name = f"{name} (batch {batch[0] + 1} of {batch[1]})"
    return TraceEvent(instr.id, instr.kind, name, lane, start_ns, end_ns,
                      task, buffers, nbytes, tuple(instr.dep_ids), transfer, getattr(instr, "to", None))
