"""The executor of a dry run (``CELERITAS_DRY_RUN_NODES``): graphs are built, nothing runs.

It takes the instruction batches as the executor does and answers what the runtime
waits for (horizons, epochs, fences: zeros of the fenced shape, a copy of a fenced
host object), so a program runs to completion as rank 0 of a cluster of any size
while only its scheduling cost is paid.
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np

from scheduler.errors import CeleritasError
from scheduler.instruction_graph import (AllocInstruction, DestroyHostObjectInstruction, EpochInstruction,
                                         FenceInstruction, HorizonInstruction, InstructionBatch)

from .instruction_handlers import snapshot_host_object


class DryRunExecutor:
    """Stands in for the executor under ``CELERITAS_DRY_RUN_NODES``: no kernels, no transfers."""

    def __init__(self, on_horizon, on_epoch, host_object_copy=None):
        self._on_horizon = on_horizon
        self._copy_host_object = host_object_copy or copy.deepcopy
        self._on_epoch = on_epoch
        self._allocs: dict[int, AllocInstruction] = {}
        self._host_objects: dict[int, Any] = {}
        self.num_instructions = 0

    def start(self) -> None:
        pass

    def submit(self, batch: InstructionBatch) -> None:
        instructions = batch.instructions
        self.num_instructions += len(instructions)
        for ins in instructions:   # (exact types: this stand-in's own cost is part of what a dry run measures)
            t = type(ins)
            if t is AllocInstruction:
                if ins.memory == 0:
                    self._allocs[ins.allocation] = ins
            elif t is HorizonInstruction:
                self._on_horizon(ins.task)
            elif t is EpochInstruction:
                self._on_epoch(ins.task)
            elif t is DestroyHostObjectInstruction:   # (as the executor drops it: the object may go)
                self._host_objects.pop(ins.host_object, None)
            elif t is FenceInstruction and ins.promise is not None:
                if ins.allocation is not None:
                    a = self._allocs.pop(ins.allocation)
                    ins.promise.set_result(np.zeros(a.shape, a.dtype))
                else:   # (as the executor copies it; an error is the fence's, not the scheduler's)
                    try:
                        obj = snapshot_host_object(self._host_objects.get(ins.host_object), ins.host_object,
                                                   ins.task, self._copy_host_object)
                    except CeleritasError as exc:
                        ins.promise.set_exception(exc)
                    else:
                        ins.promise.set_result(obj)

    def track_user_buffer(self, bid, array) -> None:
        pass

    def track_host_object(self, hoid, obj) -> None:
        self._host_objects[hoid] = obj

    def shutdown(self, timeout=None, *, drain=True) -> bool:
        return True

    def join(self, timeout=None) -> bool:
        return True

    @property
    def error(self):
        return None

    @property
    def trace(self):
        return []
