"""Buffers: n-d arrays distributed by the runtime, accessed through range mappers."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from scheduler.errors import AccessError, CeleritasError
from scheduler.geometry.box import as_ints

from .context import Handle, current_runtime
from .accessor import DISCARD_READ_WRITE, DISCARD_WRITE, MODES, READ, READ_WRITE, WRITE, Accessor
from .handler import CommandGroupHandler, handler_of


class BufferError(CeleritasError, ValueError):
    """A buffer was created with data, shape or dtype that do not fit together."""


def _check_dtype(dtype: Any) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise BufferError(f"{dtype!r} is not a numpy dtype") from exc
    if dt.kind not in "biufc":
        raise BufferError(f"buffers hold booleans or numbers; dtype {dt} is not supported")
    return dt


class Buffer(Handle):
    """A 0- to 3-D array the runtime distributes; host-initialized data is copied at construction."""

    _handle_kind = "buffer"

    def __init__(self, data: Any = None, *, shape: Sequence[int] | int | None = None, dtype: Any = None,
                 name: str | None = None):
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        if data is not None:
            if isinstance(data, Buffer):
                raise BufferError("a Buffer cannot be initialized from another Buffer; fence it first")
            try:
                arr = np.asarray(data)
            except ValueError as exc:   # (ragged nested lists: numpy's "inhomogeneous shape")
                raise BufferError(f"buffer data {type(data).__name__} is not an array of one shape: {exc}") from None
            if dtype is not None:
                dt = _check_dtype(dtype)
                if arr.dtype != dt:
                    if not np.can_cast(arr.dtype, dt, casting="same_kind"):
                        raise BufferError(f"data of dtype {arr.dtype} cannot be stored in a buffer of dtype {dt}")
                    arr = arr.astype(dt)
            else:
                _check_dtype(arr.dtype)
            if shape is not None and as_ints(shape, "shape", BufferError) != arr.shape:
                raise BufferError(f"data of shape {arr.shape} does not match shape {tuple(shape)}")
            data = np.array(arr, copy=True, order="C")   # the user may reuse their array
            shape = data.shape
            dtype = data.dtype
        else:
            if shape is None:
                raise BufferError("a Buffer needs data or a shape")
            dtype = _check_dtype(np.float32 if dtype is None else dtype)
        shape = as_ints(shape, "shape", BufferError)
        if len(shape) > 3:
            raise BufferError(f"buffers have 0 to 3 dimensions, got shape {shape}")
        if any(s < 0 for s in shape):
            raise BufferError(f"negative extent in shape {shape}")
        self.shape: tuple[int, ...] = shape
        self.dtype: np.dtype = np.dtype(dtype)
        self._name = name or ""
        self._runtime = current_runtime(create=True)
        self.id: int = self._runtime.create_buffer(self, data)
        self._label = f"B{self.id}" + (f' "{self._name}"' if self._name else "")
        self._alive = True

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str | None) -> None:
        self._name = "" if value is None else str(value)
        self._label = f"B{self.id}" + (f' "{self._name}"' if self._name else "")
        self._runtime.rename_buffer(self.id, self._name)

    @property
    def label(self) -> str:
        return self._label   # (read by every access of every submit: built once, and on rename)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)   # (exact: numpy's int64 product wraps past 2**63)

    def __repr__(self) -> str:
        return f"<cl.Buffer {self.label} shape={self.shape} dtype={self.dtype}>"

    def access(self, cgh, range_mapper, mode: str, *, no_init: bool = False) -> Accessor:
        if not self._alive:
            self._require_alive()
        if mode not in MODES:
            raise AccessError(f"unknown access mode {mode!r} for buffer {self.label}; use one of "
                              f"{', '.join('cl.' + m for m in MODES)}")
        if no_init:
            if mode == READ:
                raise AccessError(f"buffer {self.label}: no_init=True discards the old contents, which a cl.read "
                                  f"access reads (no_init applies to cl.write and cl.read_write)")
            mode = {WRITE: DISCARD_WRITE, READ_WRITE: DISCARD_READ_WRITE}.get(mode, mode)
        if type(cgh) is not CommandGroupHandler or cgh._closed:   # (the message only when it is raised)
            handler_of(cgh, f"Buffer.access of buffer {self.label}")
        return cgh._add_access(self, range_mapper, mode)

    def _require_alive(self) -> None:
        if not self._alive:
            if self._runtime.is_shut_down:
                raise AccessError(f"buffer {self.label} belongs to a runtime that was shut down (q.shutdown() or an "
                                  f"error); make the buffer again after the new Queue")
            raise AccessError(f"buffer {self.label} was destroyed (Buffer.destroy()); it cannot be used any more")

    def destroy(self) -> None:
        """Release the buffer now (otherwise at garbage collection or shutdown)."""
        if getattr(self, "_alive", False):
            self._alive = False
            self._runtime.destroy_buffer(self.id)
