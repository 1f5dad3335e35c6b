"""Hand-built instruction graphs for executor tests (no scheduler involved)."""
from __future__ import annotations

from scheduler.instruction_graph import InstructionBatch


class Graph:
    """Builds instructions with increasing ids; ``deps`` are instruction objects."""

    def __init__(self):
        self.next_id = 1
        self.instrs = []

    def add(self, cls, *deps, **fields):
        instr = cls(id=self.next_id, deps=[(d.id, "true") for d in deps], **fields)
        self.next_id += 1
        self.instrs.append(instr)
        return instr

    def batch(self, pilots=(), shape=None):
        out = InstructionBatch(self.instrs, list(pilots), shape=shape)
        self.instrs = []
        return out
