"""The interface every backend (host/numpy, CUDA/CuPy, OpenCL/PyOpenCL) implements.

The executor only talks to a backend through this module: allocations are opaque
array objects, work runs on *lanes* (in-order queues: a worker thread, a CUDA
stream, an OpenCL command queue) and reports back through completion objects that
can be tested without blocking.  Keeping the surface this small is what lets the
executor loop stay identical across backends.
"""
from __future__ import annotations

import abc
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, NamedTuple

from scheduler.errors import CeleritasError
from scheduler.geometry import Box
import numpy as np

from scheduler.instruction_graph import HOST_MEMORY, USER_MEMORY, AccessorArg, device_memory

log = logging.getLogger("celeritas.executor")


_blocked = threading.local()


def note_blocked(ns: int) -> None:
    """Record that the calling thread spent ``ns`` blocked on a device (an OpenCL event, a
    stream) inside lane work.  A lane's cost estimate is the worker's CPU time, which leaves
    out waiting for the GIL but would leave out waiting for the device too: work that blocks
    on a device adds that time here (see ``blocked_ns``)."""
    _blocked.ns = getattr(_blocked, "ns", 0) + ns


def blocked_ns() -> int:
    """Nanoseconds the calling thread recorded with ``note_blocked`` so far."""
    return getattr(_blocked, "ns", 0)


class BackendError(CeleritasError, RuntimeError):
    """A backend operation failed in a way the executor cannot recover from."""


class LaneSkipped(Exception):
    """The completion error of dependent work a lane did not run because earlier work failed.

    The executor queues an instruction on a lane right behind the predecessors it
    depends on (eager assignment) before they ran, and marks it ``dependent``;
    such work must not run once work on its lane failed, since it may read what
    the failed work should have written.  Not a failure of its own.
    """


class AllocationError(BackendError, MemoryError):
    """An allocation failed; the message names the memory and the live allocations.

    The runtime re-raises this as ``cl.OutOfMemoryError`` (the executor may not
    import ``celeritas``/``scheduler.errors``).
    """


class Lane(NamedTuple):
    """Identifies one in-order queue of a backend.

    A NamedTuple (not a dataclass) because it is a dict key on the hot path and
    tuple hashing is the cheapest there is.
    """

    kind: str            # "host" or "device"
    device: int | None   # None for host lanes
    index: int

    @property
    def name(self) -> str:
        if self.kind == "device":
            return f"D{self.device}.lane{self.index}"
        return f"host.lane{self.index}"


class Completion:
    """Completion of one piece of asynchronous backend work.

    ``notifying`` tells the executor whether the backend will call its notifier
    when this completes (host threads can; CUDA/OpenCL events must be polled), so
    the executor knows whether it may block or has to keep polling.
    """

    __slots__ = ()
    notifying: ClassVar[bool] = False

    def is_done(self) -> bool:
        raise NotImplementedError

    def error(self) -> BaseException | None:
        """The exception the work raised, once done; None on success."""
        return None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (tests and teardown only; the executor never waits)."""
        raise NotImplementedError

    # optional timing (time.perf_counter_ns) for traces; None when unknown
    @property
    def start_ns(self) -> int | None:
        return None

    @property
    def end_ns(self) -> int | None:
        return None


class DoneCompletion(Completion):
    """Work that finished synchronously (or failed synchronously)."""

    __slots__ = ("_error",)
    notifying = False

    def __init__(self, error: BaseException | None = None):
        self._error = error

    def is_done(self) -> bool:
        return True

    def error(self) -> BaseException | None:
        return self._error

    def wait(self, timeout: float | None = None) -> bool:
        return True


@dataclass(slots=True)
class BackendInfo:
    """What a backend reports about its memories; the runtime turns it into the scheduler's
    ``SystemInfo`` (which memories copy directly, what MPI may touch, capacities).

    ``copy_pairs`` are the (source, dest) memory pairs a single copy can connect;
    everything else is staged through host memory.  ``communicator_memories`` are
    the memories the communicator can send from and receive into directly.
    ``direct_memories`` are the device memories a communicator could use as well
    if asked to (``CELERITAS_MPI_DEVICE_MEMORY=direct``), and ``direct_needs``
    names what the communicator must support for that ("cuda": CUDA-aware MPI;
    None: nothing, the memory is ordinary host memory).
    """

    num_devices: int
    memories: tuple[int, ...]
    copy_pairs: frozenset[tuple[int, int]]
    communicator_memories: frozenset[int]
    device_memories: dict[int, int] = field(default_factory=dict)
    direct_memories: frozenset[int] = frozenset()
    direct_needs: str | None = None
    capacities: dict[int, int] = field(default_factory=dict)   # device memory -> bytes it can hold

    def can_copy(self, source: int, dest: int) -> bool:
        return (source, dest) in self.copy_pairs


def default_copy_pairs(num_devices: int, peer_to_peer: bool) -> frozenset[tuple[int, int]]:
    """user<->host, host<->device, user<->device, same-memory, and peers if allowed."""
    mems = [USER_MEMORY, HOST_MEMORY] + [device_memory(d) for d in range(num_devices)]
    pairs = set()
    for s in mems:
        for d in mems:
            if s >= 2 and d >= 2 and s != d and not peer_to_peer:
                continue
            pairs.add((s, d))
    return frozenset(pairs)


class Backend(abc.ABC):
    """Allocation, copies and launches on lanes for one rank's devices."""

    # Whether a Python (array) kernel on a device lane only enqueues device work, as CuPy
    # kernels on a stream do, so that ``enqueue_now`` may run it behind work still on the
    # device; False where it computes on host memory at once (the OpenCL backend's numpy
    # views of zero-copy buffers): there only source kernels are enqueued now.
    enqueues_python_kernels: bool = True

    @property
    @abc.abstractmethod
    def num_devices(self) -> int: ...

    @abc.abstractmethod
    def xp_for_memory(self, memory: int) -> Any:
        """The array module (numpy, cupy) whose arrays live in ``memory``."""

    @abc.abstractmethod
    def backend_info(self) -> BackendInfo: ...

    @abc.abstractmethod
    def allocate(self, memory: int, shape: tuple[int, ...], dtype: Any) -> Any:
        """A new (uninitialized) array in ``memory``; raises AllocationError."""

    @abc.abstractmethod
    def free(self, memory: int, array: Any) -> None: ...

    @abc.abstractmethod
    def copy(self, src: Any, src_box: Box | None, dst: Any, dst_box: Box | None, box: Box,
             lane: Lane, *, dependent: bool = False) -> Completion:
        """Copy ``box`` (buffer coordinates) from ``src`` (extent ``src_box``) to
        ``dst`` (extent ``dst_box``) on ``lane``; an extent of None means the array
        holds exactly ``box``, linearized.  ``dependent`` as for ``launch``."""

    @abc.abstractmethod
    def launch(self, lane: Lane, fn: Callable[[], Any], *, dependent: bool = False) -> Completion:
        """Run ``fn()`` in the order of ``lane``.  ``dependent``: ``fn`` may read what work
        queued before it on the lane writes, so once any work on the lane failed it must
        not run (its completion carries ``LaneSkipped``)."""

    def enqueue_now(self, lane: Lane, fn: Callable[[], Any], *, dependent: bool = False,
                    direct: bool = False) -> Completion | None:
        """``launch`` without the hand-off to the lane's worker thread, where the lane is an
        asynchronous device queue with nothing queued on it: ``fn`` (known to the caller
        as brief on the calling thread) only enqueues work, so it runs right here and the
        completion tracks the device.  None where that is not possible (the default): the
        caller then launches.  A hand-off costs a wake-up and a GIL switch, several times
        a kernel launch (measured on an H100: 300 us per one-thread kernel through the
        worker against 14 us bare).  ``direct``: ``fn`` enqueues only through this
        backend's own calls (``launch_source_kernel``), which take the lane from the launch
        context, so the backend need not make the lane current for third-party code."""
        return None

    def runs_inline(self, lane: Lane) -> bool:
        """True when ``launch(lane, fn)`` / ``copy(...)`` on this lane would only run ``fn``
        (or the plain numpy ``copy_box``) on a worker thread of this process.

        The executor may then call the work itself, on its own thread, instead of
        handing it over, provided the lane is idle (no instruction queued on it) and
        the work is known to be short: that saves a thread hand-off, a wake-up and a
        completion notification per instruction.  Backends whose lanes are real
        device queues (streams, command queues) keep the default, False.
        """
        return False

    def lane_handle(self, lane: Lane) -> Any:
        """The native queue behind a lane (CUDA stream, OpenCL queue); None for host."""
        return None

    def set_notifier(self, notifier: Callable[[Completion], None] | None) -> None:
        """Register a callable invoked (from any thread) when a notifying completion finishes."""

    def to_host(self, array: Any) -> Any:
        """A numpy array with the contents of ``array`` (fence results)."""
        return array

    def hand_over(self, memory: int, array: Any) -> Any:
        """The allocation leaves the executor (a fence result, or user-memory garbage).

        The backend stops accounting for it but must not reuse its memory while
        the returned object is alive; returns a numpy array the user may keep.
        """
        return self.to_host(array)

    def close(self) -> None:
        """Release lanes and worker threads; the backend is unusable afterwards."""


def box_view(array: Any, extent: Box | None, box: Box) -> Any:
    """The view of ``array`` (holding ``extent`` in buffer coordinates) that covers ``box``.

    Arrays are normally shaped like their extent; a flat (linearized) array or a
    scratch allocation without an extent is reinterpreted as the 3-D extent first,
    which for a contiguous array is a view, never a copy (writes must land).

    Every receive, send and copy takes one or two of these: the containment test and
    the slices are written out per dimensionality (0.84 instead of 2.2 us for an array
    shaped like its extent, without Box.contains and a list of slices).
    """
    blo, bhi = box.lo, box.hi
    if extent is None:
        lo, hi = blo, bhi
    else:
        lo, hi = extent.lo, extent.hi
        if not (lo[0] <= blo[0] and bhi[0] <= hi[0] and lo[1] <= blo[1] and bhi[1] <= hi[1]
                and lo[2] <= blo[2] and bhi[2] <= hi[2]) and bhi[0] > blo[0]:   # (an empty box fits anywhere)
            raise BackendError(f"box {box} lies outside the allocation extent {extent}")
    l0, l1, l2 = lo
    shape = array.shape
    nd = len(shape)
    if nd == 2:
        if shape[0] == hi[0] - l0 and shape[1] == hi[1] - l1 and hi[2] - l2 == 1:
            return array[blo[0] - l0:bhi[0] - l0, blo[1] - l1:bhi[1] - l1, ...]
    elif nd == 1:
        if shape[0] == hi[0] - l0 and hi[1] - l1 == 1 and hi[2] - l2 == 1:
            return array[blo[0] - l0:bhi[0] - l0, ...]
    elif nd == 3:
        if shape == (hi[0] - l0, hi[1] - l1, hi[2] - l2):
            return array[blo[0] - l0:bhi[0] - l0, blo[1] - l1:bhi[1] - l1, blo[2] - l2:bhi[2] - l2, ...]
    elif nd == 0 and hi[0] - l0 == 1 and hi[1] - l1 == 1 and hi[2] - l2 == 1:
        return array[...]
    # not shaped like the extent: the 3-D view of it
    arr = array.view()
    try:
        arr.shape = (hi[0] - l0, hi[1] - l1, hi[2] - l2)
    except (AttributeError, ValueError) as exc:
        raise BackendError(f"array of shape {array.shape} cannot hold extent {extent}") from exc
    return arr[blo[0] - l0:bhi[0] - l0, blo[1] - l1:bhi[1] - l1, blo[2] - l2:bhi[2] - l2, ...]


def copy_box(src: Any, src_box: Box | None, dst: Any, dst_box: Box | None, box: Box) -> None:
    """One n-d strided slice assignment: no per-row Python loops."""
    if box.empty:
        return
    d = box_view(dst, dst_box, box)
    s = box_view(src, src_box, box)
    if s.shape != d.shape:
        s = s.reshape(d.shape)
    d[...] = s


def source_kernel_parameter_count(args: tuple) -> int:
    """How many kernel parameters ``args`` fill: CHUNK_PARAMS (6), 7 per accessor, 1 per scalar."""
    return 6 + sum(7 if isinstance(a, AccessorArg) else 1 for a in args)


NO_BOX = (np.int64(0),) * 6      # the offset and extents of an accessor that maps nothing of its chunk


def box_parameters(box: Box, cache: dict | None = None) -> tuple:
    """A box's offset and extents as the prelude takes them (six int64), remembered in
    ``cache`` per box object while it lives: a replayed step hands its kernels the same box
    objects every time, and making the twelve or more numpy scalars of a launch cost a
    tenth of a CUDA launch's Python."""
    if cache is not None:
        hit = cache.get(id(box))
        if hit is not None and hit[0] is box:
            return hit[1]
    lo = box.lo
    vals = tuple(np.int64(x) for x in lo) + tuple(np.int64(h - l) for l, h in zip(lo, box.hi))
    if cache is not None:
        if len(cache) >= 4096:        # (new boxes every step: start over)
            cache.clear()
        cache[id(box)] = (box, vals)
    return vals


def source_kernel_arguments(name: str, ctx: Any, args: tuple, pointer: Callable[[int, Any], Any],
                            scalar: Callable[[int, int, Any], Any] | None = None, cache: dict | None = None) -> list:
    """Arguments of a device source kernel: ``CHUNK_PARAMS`` first, then ``args``.

    An accessor becomes ``pointer(index, array)`` followed by the allocation's
    offset and extents (three int64 each), which the generated prelude uses to
    index in global coordinates (an accessor that maps nothing of the chunk has
    no array: ``pointer`` gets None, the extents are 0).  Scalars pass through with
    C-friendly types, unless ``scalar(position in args, parameter index, value)``
    (a backend that knows the declared parameter types) returns the value to pass.
    ``cache``: the backend's memo for ``box_parameters``.
    """
    out: list = list(box_parameters(ctx.box, cache))
    for position, a in enumerate(args):
        if isinstance(a, AccessorArg):
            abox = ctx.accesses[a.index].allocation_box
            arr = ctx.arrays[a.index]
            out.append(pointer(a.index, arr))
            out.extend(NO_BOX if arr is None or abox is None else box_parameters(abox, cache))
            continue
        if scalar is not None:
            converted = scalar(position, len(out), a)
            if converted is not None:
                out.append(converted)
                continue
        if isinstance(a, (bool, np.bool_)):
            out.append(np.int32(a))
        elif isinstance(a, (int, np.integer)):
            out.append(np.int64(a))
        elif isinstance(a, np.float32):
            out.append(a)
        elif isinstance(a, (float, np.floating)):
            out.append(np.float64(a))
        else:
            raise BackendError(f"kernel {name!r}: argument {a!r} is neither an accessor nor a scalar")
    return out


def check_argument_count(name: str, expected: int, given: list | int, args: tuple) -> None:
    """A source kernel whose parameter list does not match what ``args`` marshals to
    (``given``: the marshalled list or its length) would fail deep in the driver
    (pyopencl: "set_args() takes 3 positional arguments but 14 were given"); this says
    which parameters are missing."""
    count = given if isinstance(given, int) else len(given)
    if expected == count:
        return
    accessors = sum(1 for a in args if isinstance(a, AccessorArg))
    raise BackendError(
        f"kernel {name!r} has {expected} parameters, but its arguments make {count}: CHUNK_PARAMS (6), "
        f"{accessors} accessor(s) as ACCESSOR(T, name) (7 each) and {len(args) - accessors} scalar(s) from "
        f"args={tuple('accessor' if isinstance(a, AccessorArg) else a for a in args)}; declare it as "
        f"__kernel void {name}(CHUNK_PARAMS, ACCESSOR(T, a), ..., scalars...)")
