"""Recorders: what the generators produced, kept as plain JSON-able records.

Injected, as the C++ Celerity runtime injects its recorders: a generator is given a
recorder (or None) and hands it every node it emits.  Without one it pays nothing
for recording, and nothing outside reaches into a generator to turn recording on.
The records are what ``Queue.graphs()`` returns and the graph dumps contain (the
shapes are pinned in the public API's "Graph records").
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .command_graph import Command
    from .instruction_graph import Instruction, Pilot
    from .task_graph import BufferInfo, Task


class TaskRecorder:
    """The task graph, as the application thread builds it."""

    __slots__ = ("tasks",)

    def __init__(self) -> None:
        self.tasks: list[dict] = []

    def record_task(self, task: "Task", buffers: "dict[int, BufferInfo]") -> None:
        self.tasks.append(task.to_record(buffers))


class CommandRecorder:
    """One rank's commands."""

    __slots__ = ("rank", "commands")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.commands: list[dict] = []

    def record_command(self, cmd: "Command") -> None:
        rec = cmd.to_record()
        rec["rank"] = self.rank
        self.commands.append(rec)


class InstructionRecorder:
    """One rank's instructions and the pilots it sends."""

    __slots__ = ("instructions", "pilots")

    def __init__(self) -> None:
        self.instructions: list[dict] = []
        self.pilots: list[dict] = []

    def record_instruction(self, ins: "Instruction") -> None:
        self.instructions.append(ins.to_record())

    def record_pilot(self, pilot: "Pilot") -> None:
        self.pilots.append(pilot.to_record())


class Recorders:
    """The three recorders of one rank, as the runtime creates them."""

    __slots__ = ("tasks", "commands", "instructions")

    def __init__(self, rank: int) -> None:
        self.tasks = TaskRecorder()
        self.commands = CommandRecorder(rank)
        self.instructions = InstructionRecorder()

    def __repr__(self) -> Any:
        return (f"Recorders({len(self.tasks.tasks)} tasks, {len(self.commands.commands)} commands, "
                f"{len(self.instructions.instructions)} instructions)")
