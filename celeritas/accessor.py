"""Accessors: global-coordinate views of a buffer inside kernels and host tasks.

One accessor object is captured by a kernel that runs concurrently for several
chunks on several lane threads, so it cannot hold the chunk's array itself.
The launcher *hydrates* it per call through a thread-local slot owned by the
command group: the accessor looks its array up there on every index.
"""
from __future__ import annotations

import threading
from typing import Any

from scheduler.errors import AccessError
from scheduler.geometry import Box, Region

from scheduler.task_graph import (DISCARD_READ_WRITE, DISCARD_WRITE, READ, READ_WRITE, WRITE,  # noqa: F401
                                  ACCESS_MODES as MODES)


class Hydration(threading.local):
    """Per-thread binding of a command group's accessors to the chunk being run: its
    ``LaunchContext`` (accessor ``index`` indexes ``ctx.arrays`` and ``ctx.accesses``)."""

    def __init__(self) -> None:
        self.ctx: Any = None
        self.label: str = ""


class Accessor:
    """Indexes a buffer in global coordinates: ``acc[chunk]``, ``acc[box]``, ``acc[i, j]``, ``acc[slices]``."""

    __slots__ = ("buffer_id", "buffer_name", "mode", "mapper", "dims", "index", "_hydration", "_checks",
                 "dtype", "shape", "_plain2")

    def __init__(self, buffer, mode: str, mapper, index: int, hydration: Hydration, checks: bool):
        self.buffer_id = buffer.id
        self.buffer_name = buffer.label
        self.dtype = buffer.dtype
        self.shape = buffer.shape
        self.mode = mode
        self.mapper = mapper
        self.dims = len(buffer.shape)
        self.index = index
        self._hydration = hydration
        self._checks = checks
        self._plain2 = self.dims == 2 and not checks      # (see _plain)

    def __repr__(self) -> str:
        return f"<Accessor {self.buffer_name} {self.mode} {self.mapper!r}>"

    # ---- binding ---------------------------------------------------------------------
    def _slot(self) -> tuple[Any, Box, Region | None]:
        ctx = self._hydration.ctx
        if ctx is None:
            raise AccessError(f"accessor of buffer {self.buffer_name} used outside its kernel or host task")
        i = self.index
        acc = ctx.accesses[i]
        return ctx.arrays[i], acc.allocation_box, acc.region

    @property
    def array(self) -> Any:
        """The whole backing allocation (device-local array, allocation coordinates)."""
        return self._slot()[0]

    @property
    def allocation_box(self) -> Box:
        return self._slot()[1]

    @property
    def offset(self) -> tuple[int, ...]:
        """Global coordinates of ``array[0, ...]``."""
        return self._slot()[1].offset

    @property
    def region(self) -> Region | None:
        """What the range mapper grants the current chunk."""
        return self._slot()[2]

    # ---- indexing ---------------------------------------------------------------------
    def _local(self, key) -> tuple[Any, Any]:
        ctx = self._hydration.ctx
        if ctx is None:
            raise AccessError(f"accessor of buffer {self.buffer_name} used outside its kernel or host task")
        i = self.index
        arr = ctx.arrays[i]
        acc = ctx.accesses[i]
        abox = acc.allocation_box
        d = self.dims
        lo = abox.lo
        if type(key) is tuple and not self._checks and len(key) == d:
            # fast path (kernels index like this many times per chunk): plain slices and
            # ints, shifted to the allocation; anything else takes the general path
            local = []
            for i, k in enumerate(key):
                tk = type(k)
                if tk is slice:
                    step = k.step
                    if step is not None and step <= 0:
                        break
                    start, stop = k.start, k.stop
                    o = lo[i]
                    local.append(slice((o if start is None else start) - o,
                                       (abox.hi[i] if stop is None else stop) - o, step))
                elif tk is int:
                    local.append(k - lo[i])
                else:
                    break
            else:
                return arr, tuple(local)
        box = key if type(key) is Box else getattr(key, "box", None)   # a Box, or a Chunk's
        if box is None and isinstance(key, Box):
            box = key
        if box is not None:
            if box.dims != d and not (box.empty and d == 0):
                raise AccessError(f"a {box.dims}-D box indexes the {d}-D buffer {self.buffer_name}")
            if self._checks:
                self._check(box, acc.region)
            return arr, box.slices_in(abox)
        if key is Ellipsis:
            return arr, Ellipsis
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) != d:
            raise AccessError(f"{len(key)} indices for the {d}-D buffer {self.buffer_name}")
        local = []
        pmin = []
        pmax = []
        for i, k in enumerate(key):
            if isinstance(k, slice):
                start = k.start if k.start is not None else abox.lo[i]
                stop = k.stop if k.stop is not None else abox.hi[i]
                if (k.step or 1) <= 0:
                    raise AccessError("accessor slices need a positive step")
                local.append(slice(start - lo[i], stop - lo[i], k.step))
                pmin.append(start)
                pmax.append(stop)
            else:
                try:
                    k = int(k)
                except TypeError:
                    # array (fancy) indices: shift them
                    local.append(k - lo[i])
                    pmin.append(None)
                    pmax.append(None)
                    continue
                local.append(k - lo[i])
                pmin.append(k)
                pmax.append(k + 1)
        if self._checks and None not in pmin:
            self._check(Box(tuple(pmin), tuple(pmax), d), acc.region)
        if self._checks or None in pmin:
            for i, (a, b) in enumerate(zip(pmin, pmax)):
                if a is not None and (a < abox.lo[i] or b > abox.hi[i]):
                    raise AccessError(f"index {key} is outside the part {abox} of buffer {self.buffer_name} "
                                      f"held for this chunk")
        return arr, tuple(local)

    def _check(self, box: Box, granted: Region | None) -> None:
        if box.empty:
            return
        if granted is None or not granted.contains(box):
            raise AccessError(f"access to {box} of buffer {self.buffer_name} is outside what its range "
                              f"mapper grants this chunk ({granted}); mode {self.mode}")

    def _plain(self, key) -> tuple[Any, Any] | None:
        """``_local`` for the keys a 2-D kernel indexes with many times per chunk, two bounded
        slices (``acc[y0:y1, x0:x1]``) or a chunk or box (``acc[chunk]``), with no loop and no
        list: there ``_local``'s general handling was most of an index's cost (0.8 us against
        numpy's 0.14).  None: take ``_local``."""
        ctx = self._hydration.ctx
        if ctx is None:
            return None
        if type(key) is tuple:
            if len(key) != 2:
                return None
            k0, k1 = key
            if type(k0) is not slice or type(k1) is not slice or k0.step is not None or k1.step is not None:
                return None
            a0, b0, a1, b1 = k0.start, k0.stop, k1.start, k1.stop
            if a0 is None or b0 is None or a1 is None or b1 is None:
                return None
        else:
            box = key if type(key) is Box else getattr(key, "box", None)
            if type(box) is not Box or box.dims != 2:
                return None
            (a0, a1, _), (b0, b1, _) = box.lo, box.hi
        i = self.index
        o = ctx.accesses[i].allocation_box.lo
        o0, o1 = o[0], o[1]
        return ctx.arrays[i], (slice(a0 - o0, b0 - o0), slice(a1 - o1, b1 - o1))

    def __getitem__(self, key):
        try:
            if self._plain2:
                if type(key) is tuple and len(key) == 2:
                    # _plain's two slices once more, inline: the stencils' most frequent index
                    k0, k1 = key
                    if type(k0) is slice and type(k1) is slice and k0.step is None and k1.step is None:
                        a0, b0, a1, b1 = k0.start, k0.stop, k1.start, k1.stop
                        ctx = self._hydration.ctx
                        if (ctx is not None and a0 is not None and b0 is not None and a1 is not None
                                and b1 is not None):
                            i = self.index
                            o = ctx.accesses[i].allocation_box.lo
                            o0, o1 = o[0], o[1]
                            return ctx.arrays[i][a0 - o0:b0 - o0, a1 - o1:b1 - o1]
                got = self._plain(key)
                if got is not None:
                    return got[0][got[1]]
            arr, idx = self._local(key)
            return arr[idx]
        except TypeError:
            self._check_mapped(key)
            raise

    def __setitem__(self, key, value) -> None:
        if self.mode == READ:
            raise AccessError(f"buffer {self.buffer_name} is accessed read-only here")
        try:
            if self._plain2:
                got = self._plain(key)
                if got is not None:
                    got[0][got[1]] = value
                    return
            arr, idx = self._local(key)
            arr[idx] = value
        except TypeError:
            self._check_mapped(key)
            raise

    def _check_mapped(self, key) -> None:
        """After a TypeError while indexing: an index into a chunk that holds none of the buffer
        (its range mapper maps the chunk to nothing, e.g. a one_to_one kernel range larger
        than the buffer) is an AccessError, not numpy's complaint about the missing array.
        Anything else (a value numpy cannot store) stays numpy's own error."""
        ctx = self._hydration.ctx
        if ctx is not None and ctx.arrays[self.index] is None:
            raise AccessError(f"index {key!r} into buffer {self.buffer_name}: its range mapper maps nothing "
                              f"of it to this chunk (region {ctx.accesses[self.index].region}); "
                              f"mode {self.mode}") from None

    def view(self, key=Ellipsis):
        return self[key]
