"""Accessors: global-coordinate views of a buffer inside kernels and host tasks.

One accessor object is captured by a kernel that runs concurrently for several
chunks on several lane threads, so it cannot hold the chunk's array itself.
The launcher *hydrates* it per call through a thread-local slot owned by the
command group: the accessor looks its array up there on every index.
"""
from __future__ import annotations

import threading
from operator import index as _index
from typing import Any

import numpy as np

from scheduler.errors import AccessError
from scheduler.geometry import Box, Region

from scheduler.task_graph import (DISCARD_READ_WRITE, DISCARD_WRITE, READ, READ_WRITE, WRITE,  # noqa: F401
                                  ACCESS_MODES as MODES)


class _Binding(threading.local):
    """Per thread: ``(hydration, ctx)``, the command group whose chunk runs on this thread
    and that chunk's ``LaunchContext`` (``(None, None)`` outside a kernel or host task)."""

    cur: tuple = (None, None)


_binding = _Binding()


class Hydration:
    """A command group's binding of its accessors to the chunk being run, per thread: its
    ``LaunchContext`` (accessor ``index`` indexes ``ctx.arrays`` and ``ctx.accesses``).

    A token, not a ``threading.local`` of its own: the launcher binds ``(hydration, ctx)``
    in one thread-local slot shared by all command groups (``_binding``), and an accessor
    reads the ctx there when the slot names its hydration.  A ``threading.local`` per
    command group cost 0.9 us to make at every submit with accessors, a per-thread dict
    on each lane that ran a chunk, and 4.6 us to destroy once four live threads had
    touched it (CPython clears it from every thread's state), mostly on the application
    thread (``TaskManager.prune_before`` dropping the last task reference)."""

    __slots__ = ()

    @property
    def ctx(self) -> Any:
        """The ``LaunchContext`` this thread runs for this command group, or None."""
        cur = _binding.cur
        return cur[1] if cur[0] is self else None


class Accessor:
    """Indexes a buffer in global coordinates: ``acc[chunk]``, ``acc[box]``, ``acc[i, j]``, ``acc[slices]``."""

    __slots__ = ("buffer_id", "buffer_name", "mode", "mapper", "dims", "index", "_hydration", "_checks",
                 "dtype", "shape", "_plain2")

    def __init__(self, buffer, mode: str, mapper, index: int, hydration: Hydration, checks: bool):
        self.buffer_id = buffer.id
        self.buffer_name = buffer._label   # (Buffer.label's value, without the property's call)
        self.dtype = buffer.dtype
        self.shape = shape = buffer.shape
        self.mode = mode
        self.mapper = mapper
        self.dims = dims = len(shape)
        self.index = index
        self._hydration = hydration
        self._checks = checks
        self._plain2 = dims == 2 and not checks      # (see _plain)

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

    # (array and offset write _slot's lookup out: kernels read them once per chunk and accessor;
    # 0.20 -> 0.09 and 0.28 -> 0.13 us, measured inside a kernel)
    @property
    def array(self) -> Any:
        """The whole backing allocation (device-local array, allocation coordinates)."""
        cur = _binding.cur
        if cur[0] is self._hydration:
            return cur[1].arrays[self.index]
        return self._slot()[0]          # (outside its kernel: the error)

    @property
    def allocation_box(self) -> Box:
        return self._slot()[1]

    @property
    def offset(self) -> tuple[int, ...]:
        """Global coordinates of ``array[0, ...]``."""
        cur = _binding.cur
        if cur[0] is self._hydration:
            box = cur[1].accesses[self.index].allocation_box
            return box.lo[:box.dims]    # (Box.offset)
        return self._slot()[1].offset

    @property
    def region(self) -> Region | None:
        """What the range mapper grants the current chunk."""
        return self._slot()[2]

    # ---- indexing ---------------------------------------------------------------------
    def _local(self, key) -> tuple[Any, Any]:
        cur = _binding.cur   # (Hydration.ctx inline)
        ctx = cur[1] if cur[0] is self._hydration else None
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
            return self._general(key, arr, acc)
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
                if type(k) is not int:
                    # numpy integers; anything else (index arrays and lists, '...', None, a
                    # bool, a float, a string): _general
                    if type(k) is bool:
                        return self._general(key, arr, acc)
                    try:
                        k = _index(k)
                    except TypeError:
                        return self._general(key, arr, acc)
                local.append(k - lo[i])
                pmin.append(k)
                pmax.append(k + 1)
        if self._checks:
            self._check(Box(tuple(pmin), tuple(pmax), d), acc.region)
            for i, (a, b) in enumerate(zip(pmin, pmax)):
                if a < abox.lo[i] or b > abox.hi[i]:
                    raise AccessError(f"index {key} is outside the part {abox} of buffer {self.buffer_name} "
                                      f"held for this chunk")
        return arr, tuple(local)

    def _general(self, key: tuple, arr, acc) -> tuple[Any, Any]:
        """``_local`` for a key with other parts than ints and slices: one ``...`` (the
        missing dimensions, whole), ``None`` (numpy's new axis), integer arrays and lists
        (numpy's fancy indexing, in global coordinates).  A boolean mask, a float, a string
        or any other object raises AccessError.  An index array is always checked against
        the allocation (numpy would wrap a negative index to the other end or raise its own
        IndexError), and with checks point by point against what the range mapper grants."""
        if arr is None:
            self._check_mapped(key)
        d = self.dims
        name = self.buffer_name
        ellipses = [p for p, k in enumerate(key) if k is Ellipsis]
        n = sum(1 for k in key if k is not None and k is not Ellipsis)
        if len(ellipses) > 1:
            raise AccessError(f"index {key!r} into buffer {name} has more than one '...'")
        if ellipses:
            if n > d:
                raise AccessError(f"{n} indices for the {d}-D buffer {name}")
            p = ellipses[0]
            key = key[:p] + (slice(None),) * (d - n) + key[p + 1:]
        elif n != d:
            raise AccessError(f"{n} indices for the {d}-D buffer {name}")
        abox = acc.allocation_box
        lo, hi = abox.lo, abox.hi
        ctx = self._hydration.ctx
        xp = getattr(ctx, "xp", None) or np
        local: list = []
        pmin: list = []
        pmax: list = []
        fancy: list = []           # (dimension, index array in global coordinates)
        i = 0
        for k in key:
            if k is None:
                local.append(None)
                continue
            if isinstance(k, slice):
                start = lo[i] if k.start is None else self._bound(k.start, k)
                stop = hi[i] if k.stop is None else self._bound(k.stop, k)
                step = None if k.step is None else self._bound(k.step, k)
                if step is not None and step <= 0:
                    raise AccessError("accessor slices need a positive step")
                local.append(slice(start - lo[i], stop - lo[i], step))
                pmin.append(start)
                pmax.append(stop)
            else:
                v = self._component(k, xp)
                if type(v) is int:
                    local.append(v - lo[i])
                    pmin.append(v)
                    pmax.append(v + 1)
                else:
                    fancy.append((i, v))
                    local.append(v - lo[i])
                    if v.size:
                        pmin.append(int(v.min()))
                        pmax.append(int(v.max()) + 1)
                    else:
                        pmin.append(None)      # (an empty index array accesses nothing)
                        pmax.append(None)
            i += 1
        if len(fancy) > 1:
            try:
                np.broadcast_shapes(*[v.shape for _, v in fancy])
            except ValueError:
                raise AccessError(f"index arrays of shapes {', '.join(str(v.shape) for _, v in fancy)} into buffer "
                                  f"{name} cannot be broadcast together") from None
        empty = None in pmin or any(b <= a for a, b in zip(pmin, pmax))
        if self._checks and not empty:
            granted = acc.region
            bounding = Box(tuple(pmin), tuple(pmax), d)
            if granted is None or not granted.contains(bounding):
                if fancy:
                    self._check_points(fancy, pmin, pmax, granted)
                else:
                    self._check(bounding, granted)
        if self._checks or fancy:
            for i, (a, b) in enumerate(zip(pmin, pmax)):
                if a is not None and (a < lo[i] or b > hi[i]):
                    what = (f"index {key}" if not fancy else
                            f"index {'array' if any(j == i for j, _ in fancy) else 'part'} {a}"
                            f"{f'..{b - 1}' if b - 1 != a else ''} in dimension {i}")
                    raise AccessError(f"{what} is outside the part {abox} of buffer {name} held for this chunk")
        return arr, tuple(local)

    def _bound(self, b, k: slice) -> int:
        """A slice bound or step as an int; AccessError if it is none."""
        if type(b) is int:
            return b
        try:
            return _index(b)
        except TypeError:
            pass
        raise AccessError(f"slice {k!r} into buffer {self.buffer_name}: slice bounds and steps must be integers "
                          f"(got {type(b).__name__} {b!r})")

    def _component(self, k, xp) -> Any:
        """One non-slice index as an int, or as an index array of intp (numpy's or the
        allocation's array module's); AccessError for anything else."""
        tk = type(k)
        if tk is int:
            return k
        if tk is bool:
            self._mask(k)
        if tk is list or tk is tuple:
            try:
                k = xp.asarray(k)
            except (ValueError, TypeError):
                raise AccessError(f"index {k!r} into buffer {self.buffer_name} is not a list of integers") from None
            if k.size == 0 and k.dtype.kind == "f":
                k = k.astype(np.intp)          # ([]: no indices, as numpy takes it)
        dt = getattr(k, "dtype", None)
        if dt is not None and hasattr(k, "ndim"):    # numpy or CuPy arrays, numpy scalars
            kind = getattr(dt, "kind", "")
            if kind == "b":
                self._mask(k)
            if kind in ("i", "u"):
                if k.ndim == 0:
                    return int(k)
                return k if dt == np.intp else k.astype(np.intp)
        else:
            try:
                return _index(k)
            except TypeError:
                pass
        raise AccessError(f"index {k!r} ({type(k).__name__}) into buffer {self.buffer_name} is not an integer: an "
                          f"accessor takes integers, slices with integer bounds, '...', integer arrays or lists, "
                          f"a cl.Box or a chunk (a float is not truncated)")

    def _mask(self, k) -> None:
        raise AccessError(f"a boolean index (mask) into buffer {self.buffer_name}: accessor indices are global "
                          f"coordinates, which a mask has none of; index with integers instead (e.g. the mask's "
                          f"np.nonzero() plus the offset of what it masks)")

    def _check_points(self, fancy: list, pmin: list, pmax: list, granted: Region | None) -> None:
        """With checks: the elements that index arrays select (broadcast together, with the
        other dimensions' ranges), when their bounding box is not all granted: each must be."""
        d = self.dims
        dims = [i for i, _ in fancy]
        arrays = np.broadcast_arrays(*[v if isinstance(v, np.ndarray) else v.get() for _, v in fancy])
        points = np.unique(np.stack([a.reshape(-1) for a in arrays], axis=1), axis=0)
        if granted is not None:
            left = np.ones(len(points), dtype=bool)
            for g in granted.boxes:          # (vectorized: the points inside one granted box)
                gl, gh = g.lo, g.hi
                if any(not (gl[i] <= pmin[i] and pmax[i] <= gh[i]) for i in range(d) if i not in dims):
                    continue
                inside = np.ones(len(points), dtype=bool)
                for c, i in enumerate(dims):
                    inside &= (points[:, c] >= gl[i]) & (points[:, c] < gh[i])
                left &= ~inside
            points = points[left]
        for p in points:                      # (the rest: granted by several boxes together, or not)
            blo, bhi = list(pmin), list(pmax)
            for c, i in enumerate(dims):
                blo[i] = int(p[c])
                bhi[i] = int(p[c]) + 1
            self._check(Box(tuple(blo), tuple(bhi), d), granted)

    def _reject(self, key) -> None:
        """After a TypeError while indexing (numpy's, or celeritas's own arithmetic on a key
        part): AccessError when a part of the key is of a wrong type."""
        if isinstance(key, (Box, slice)) or key is Ellipsis or getattr(key, "box", None) is not None:
            parts = (key,) if isinstance(key, slice) else ()
        else:
            parts = key if isinstance(key, tuple) else (key,)
        for k in parts:
            if k is None or k is Ellipsis:
                continue
            if isinstance(k, slice):
                for b in (k.start, k.stop, k.step):
                    if b is not None:
                        self._bound(b, k)
            else:
                self._component(k, np)

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
        cur = _binding.cur   # (Hydration.ctx inline)
        ctx = cur[1] if cur[0] is self._hydration else None
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
                        cur = _binding.cur   # (Hydration.ctx inline)
                        ctx = cur[1] if cur[0] is self._hydration else None
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
            self._reject(key)
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
            self._reject(key)
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
