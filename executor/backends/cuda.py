"""CUDA backend (CuPy): the GPUs of a rank, one CUDA stream per device lane.

Work on a device lane is *enqueued* on the lane's stream (Python array kernels run
under ``with device, stream`` so CuPy launches go to that stream), followed by a
CUDA event; kernels on a lane stay asynchronous — the host never synchronizes per
kernel.  The executor enqueues cheap work itself when the lane is idle
(``enqueue_now``); the rest goes to the lane's worker thread (copies from or to
host memory, which can block: pageable memory, strided targets; and kernels whose
enqueue took over 2 ms).  A waiter thread per lane waits for the events in order,
with the GIL released, and notifies the executor.  Host memory (memory 1) is
pinned, device memories use CuPy's pool of each device, and device pairs with peer
access copy directly (the instruction graph stages the others through host memory).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from scheduler.geometry import Box
from scheduler.instruction_graph import HOST_MEMORY, USER_MEMORY, AccessorArg, device_memory

from .backend import (NO_BOX, BackendError, BackendInfo, Completion, Lane, box_parameters, box_view,
                      source_kernel_arguments)
from .cuda_driver import CudaDriver, DriverError
from .device_queue import DeviceQueueBackend, QueueCompletion, QuietCompletion

log = logging.getLogger("celeritas.executor")

try:
    import cupy
    import cupyx
except ImportError as _exc:  # pragma: no cover - exercised where CuPy is missing
    cupy = None
    _IMPORT_ERROR: Exception | None = _exc
else:
    _IMPORT_ERROR = None

PRELUDE = r"""
/* celeritas prelude: accessors arrive as pointer + allocation offset + extents,
   chunk parameters give the global coordinates of this launch.  __CL_AXIS_X/Y/Z
   (set per launch) name the index dimension each thread axis runs along: the last,
   contiguous dimension along x, so that a warp touches neighbouring elements. */
#define ACCESSOR(T, name) T* __restrict__ name, long long name##_o0, long long name##_o1, long long name##_o2, \
                          long long name##_e0, long long name##_e1, long long name##_e2
#define AT1(a, i) a[(i) - a##_o0]
#define AT2(a, i, j) a[((i) - a##_o0) * a##_e1 + ((j) - a##_o1)]
#define AT3(a, i, j, k) a[(((i) - a##_o0) * a##_e1 + ((j) - a##_o1)) * a##_e2 + ((k) - a##_o2)]
#ifndef __CL_AXIS_X
#define __CL_AXIS_X 0
#define __CL_AXIS_Y 1
#define __CL_AXIS_Z 2
#endif
#define CHUNK_PARAMS long long __cl_o0, long long __cl_o1, long long __cl_o2, \
                     long long __cl_r0, long long __cl_r1, long long __cl_r2
#define __CL_LOCAL(d) ((long long)((d) == __CL_AXIS_X ? blockIdx.x * blockDim.x + threadIdx.x : \
                                   (d) == __CL_AXIS_Y ? blockIdx.y * blockDim.y + threadIdx.y : \
                                   (d) == __CL_AXIS_Z ? blockIdx.z * blockDim.z + threadIdx.z : 0))
#define GID(d) (__CL_LOCAL(d) + (d == 0 ? __cl_o0 : d == 1 ? __cl_o1 : __cl_o2))
#define IN_CHUNK() (__CL_LOCAL(0) < __cl_r0 && __CL_LOCAL(1) < __cl_r1 && __CL_LOCAL(2) < __cl_r2)
"""


def _same(_index: int, array: Any) -> Any:
    """A CuPy array is its own kernel argument (the pointer)."""
    return array


def _pointer(_index: int, array: Any) -> int:
    """A CuPy array's device pointer, as ``CudaDriver.launch`` takes it (0: no array)."""
    return 0 if array is None else array.data.ptr


# source_kernel_arguments' conversions of the common scalar types, looked up by type (True: passed
# as it is); any other type takes source_kernel_arguments itself
_DRIVER_SCALARS: dict = {np.int64: True, np.float32: True, np.float64: True, int: np.int64, float: np.float64,
                         bool: np.int32, np.bool_: np.int32, np.int32: np.int64, np.uint32: np.int64,
                         np.int16: np.int64, np.uint16: np.int64, np.int8: np.int64, np.uint8: np.int64}


def driver_arguments(name: str, ctx: Any, args: tuple, cache: dict) -> list:
    """``source_kernel_arguments(name, ctx, args, _pointer, cache=cache)`` for ``CudaDriver.launch``,
    written for the common case: a type lookup per scalar instead of a chain of isinstance
    tests, and an accessor's pointer read in place (a quarter of a launch's Python)."""
    out = list(box_parameters(ctx.box, cache))
    arrays = ctx.arrays
    accesses = ctx.accesses
    scalars = _DRIVER_SCALARS
    for a in args:
        t = type(a)
        if t is AccessorArg:
            i = a.index
            arr = arrays[i]
            if arr is None:
                out.append(0)
                out.extend(NO_BOX)
                continue
            out.append(arr.data.ptr)
            abox = accesses[i].allocation_box
            out.extend(NO_BOX if abox is None else box_parameters(abox, cache))
            continue
        conv = scalars.get(t)
        if conv is None:
            return source_kernel_arguments(name, ctx, args, _pointer, cache=cache)
        out.append(a if conv is True else conv(a))
    return out


def load_driver() -> CudaDriver | None:
    """The GIL-keeping driver calls (``cuda_driver``), or None: the backend then enqueues
    through CuPy alone.  (A function, so that CuPy's stand-in can put its own in place.)"""
    return CudaDriver.load()


GRID_LIMITS = (2 ** 31 - 1, 65535, 65535)       # blocks along x, y, z
DEFAULT_BLOCK = {1: (256,), 2: (8, 32), 3: (2, 4, 32)}   # threads per index dimension, in index order


@dataclass(frozen=True, slots=True)
class ThreadAxes:
    """How one chunk's launch lays index dimensions onto CUDA's thread axes."""
    order: tuple[int, int, int]     # the index dimension x, y, z run along (3 and above: none)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


def thread_axes(name: str, dims: int, rng: tuple[int, ...], local_range) -> ThreadAxes:
    """The last index dimension runs along x, as SYCL linearises ids: a warp is 32
    consecutive x threads, which then read one 128-byte line of a row instead of 32
    lines of 32 rows (uncoalesced: several times slower for a 2-D stencil).  Grid axes
    y and z hold at most 65535 blocks, so a dimension too long for them moves to x."""
    dims = max(1, dims)
    blk = tuple(local_range) if local_range else DEFAULT_BLOCK[dims]
    blocks = [-(-rng[d] // blk[d]) for d in range(dims)]
    order = list(range(dims - 1, -1, -1))
    if any(blocks[order[a]] > GRID_LIMITS[a] for a in range(dims)):
        order.sort(key=lambda d: -blocks[d])
        if any(blocks[order[a]] > GRID_LIMITS[a] for a in range(dims)):
            raise BackendError(f"kernel {name!r}: a chunk of {tuple(rng[:dims])} items in blocks of "
                               f"{tuple(blk)} needs {tuple(blocks)} blocks, more than a CUDA grid holds "
                               f"({GRID_LIMITS[0]} along one dimension, {GRID_LIMITS[1]} along the others)")
    pad = 3 - dims
    return ThreadAxes(tuple(order) + tuple(range(3, 3 + pad)),             # type: ignore[arg-type]
                      tuple(blocks[d] for d in order) + (1,) * pad,        # type: ignore[arg-type]
                      tuple(blk[d] for d in order) + (1,) * pad)           # type: ignore[arg-type]


def source_kernel(src: str, name: str, axes: ThreadAxes, options: tuple = ()) -> Any:
    """``src`` behind the prelude as a ``cupy.RawKernel``, its ``GID``s mapped onto thread axes
    as ``axes`` launches them (the prelude's ``__CL_AXIS_X/Y/Z``)."""
    defines = tuple(f"-D__CL_AXIS_{a}={d}" for a, d in zip("XYZ", axes.order))
    return cupy.RawKernel(PRELUDE + src, name, options=tuple(options) + defines)


def device_copy(s: Any, d: Any) -> None:
    """Device view ``s`` into device view ``d`` (of the same GPU or a peer) on the current
    stream: one ``cudaMemcpyAsync`` where both are contiguous (a halo row), else CuPy's
    strided copy, a kernel whose dispatch costs the host several times as much."""
    if s.dtype == d.dtype and s.flags.c_contiguous and d.flags.c_contiguous:
        d.data.copy_from_device_async(s.data, d.nbytes)
    else:
        d[...] = s.reshape(d.shape)


def upload(s: np.ndarray, d: Any) -> None:
    """Host view ``s`` into device view ``d`` on the current stream.  A contiguous ``d``
    takes one host-to-device copy (asynchronous from pinned memory: the copy's event, which
    later writers of ``s`` wait for, says when it is done); any other goes through a
    contiguous device temporary and a device-side strided copy."""
    h = np.ascontiguousarray(s)
    if h.shape != d.shape:
        h = h.reshape(d.shape)
    if d.flags.c_contiguous:
        d.set(h, stream=cupy.cuda.get_current_stream())
    else:
        d[...] = cupy.asarray(h)


def download(s: Any, d: np.ndarray) -> None:
    """Device view ``s`` into host view ``d`` on the current stream.  A contiguous ``d`` (host
    memory is pinned) takes one device-to-host copy straight into it, asynchronous: the
    copy's event says when ``d`` holds the data, and the thread that enqueued it does not
    wait.  Any other waits for a contiguous host temporary and stores it into ``d``."""
    stream = cupy.cuda.get_current_stream()
    g = cupy.ascontiguousarray(s)
    if g.shape != d.shape:
        g = g.reshape(d.shape)
    if d.flags.c_contiguous:
        g.get(stream=stream, out=d, blocking=False)
    else:
        host = cupy.asnumpy(g, stream=stream)
        stream.synchronize()             # the host-side store must wait for the data
        d[...] = host


def cuda_device_count() -> int:
    if cupy is None:
        raise ImportError(f"CuPy is not installed: {_IMPORT_ERROR}")
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver / no device: zero GPUs
        return 0


class CudaBackend(DeviceQueueBackend):
    """Logical device d = CUDA device ``device_ids[d]`` (several may share one GPU)."""

    def keep_waits(self) -> list | None:
        """``DeviceQueueBackend.keep_waits``, with the driver only: its event query keeps the
        GIL, where CuPy's gives it away (a query would then cost a GIL hand-off, what
        keeping the waits saves)."""
        if self._driver is not None:
            self.kept = []
        return self.kept

    def __init__(self, device_ids: list[int], *, rank: int | None = None):
        if cupy is None:
            raise BackendError(f"CuPy is not installed: {_IMPORT_ERROR}")
        super().__init__(len(device_ids), rank=rank)
        self.device_ids = list(device_ids)
        n = cuda_device_count()
        # the capacity out-of-core execution plans with: what is free when the runtime starts
        self._free_at_start: dict[int, int] = {}
        for d, dev in enumerate(self.device_ids):
            if 0 <= dev < n:
                with cupy.cuda.Device(dev):   # a GPU listed k times: each logical device plans with 1/k
                    free = int(cupy.cuda.runtime.memGetInfo()[0])
                    self._free_at_start[device_memory(d)] = free // self.device_ids.count(dev)
        for d in self.device_ids:
            if not 0 <= d < n:
                raise BackendError(f"CUDA device {d} does not exist ({n} visible)")
        self._streams: dict[Lane, Any] = {}
        self._kernels: dict[tuple, Any] = {}
        self._axes: dict[tuple, ThreadAxes] = {}     # per kernel and chunk box (replayed steps repeat them)
        self._box_params: dict = {}                    # source_kernel_arguments' memo
        # the driver calls that enqueue without giving the GIL away (None: through CuPy)
        self._driver = load_driver()
        self._functions: dict[tuple, int] = {}        # CUfunction handle per kernel key
        self._lock = threading.Lock()
        self._peer = {}
        for a in range(len(device_ids)):
            for b in range(len(device_ids)):
                da, db = device_ids[a], device_ids[b]
                ok = da == db or bool(cupy.cuda.runtime.deviceCanAccessPeer(da, db))
                self._peer[(a, b)] = ok
                if ok and da != db:
                    with cupy.cuda.Device(da):
                        try:
                            cupy.cuda.runtime.deviceEnablePeerAccess(db)
                        except cupy.cuda.runtime.CUDARuntimeError:   # already enabled
                            pass

    def xp_for_memory(self, memory: int) -> Any:
        return cupy if memory >= 2 else np

    def backend_info(self) -> BackendInfo:
        mems = [USER_MEMORY, HOST_MEMORY] + [device_memory(d) for d in range(self.num_devices)]
        pairs = set()
        for s in mems:
            for t in mems:
                if s >= 2 and t >= 2 and s != t and not self._peer[(s - 2, t - 2)]:
                    continue
                pairs.add((s, t))
        return BackendInfo(num_devices=self.num_devices, memories=tuple(mems), copy_pairs=frozenset(pairs),
                          communicator_memories=frozenset({USER_MEMORY, HOST_MEMORY}),
                          device_memories={d: device_memory(d) for d in range(self.num_devices)},
                          direct_memories=frozenset(device_memory(d) for d in range(self.num_devices)),
                          direct_needs="cuda", capacities=dict(self._free_at_start))

    def _new_array(self, memory: int, shape, dtype):
        if memory == HOST_MEMORY:
            return cupyx.empty_pinned(shape, dtype=dtype)
        if memory < 2:
            return np.empty(shape, dtype=dtype)
        with cupy.cuda.Device(self.device_ids[memory - 2]):
            try:
                return cupy.empty(shape, dtype=dtype)
            except cupy.cuda.memory.OutOfMemoryError as exc:
                raise MemoryError(str(exc)) from exc

    def free(self, memory: int, array: Any) -> None:
        super().free(memory, array)   # the pool reuses the memory once the array is collected

    def to_host(self, array: Any) -> Any:
        return cupy.asnumpy(array) if cupy is not None and isinstance(array, cupy.ndarray) else array

    def hand_over(self, memory: int, array: Any) -> Any:
        super().hand_over(memory, array)
        return self.to_host(array)

    # ---- lanes -------------------------------------------------------------------------
    def lane_handle(self, lane: Lane) -> Any:
        if lane.kind != "device":
            return None
        s = self._streams.get(lane)
        if s is None:
            with self._lock:
                s = self._streams.get(lane)
                if s is None:
                    with cupy.cuda.Device(self.device_ids[lane.device]):
                        s = self._streams[lane] = cupy.cuda.Stream(non_blocking=True)
        return s

    def _enqueuing(self, lane: Lane, worker, fn: Callable[[], Any],
                   direct: bool = False) -> tuple[QueueCompletion, Callable[[], None]]:
        """``fn`` under the lane's device and stream, followed by the event it completes with.
        ``direct`` (with the driver): ``fn`` enqueues through the driver calls alone (a source
        kernel, a device copy), so CuPy's device and stream contexts, whose calls give the GIL
        away, are left out: the lane's device is made current and the event recorded through
        the driver."""
        stream = self.lane_handle(lane)
        dev = self.device_ids[lane.device]
        c = QueueCompletion(QuietCompletion(worker))
        drv = self._driver
        if direct and drv is not None:
            sptr = stream.ptr

            def run() -> None:
                drv.use(dev)
                fn()
                c._event = drv.record(sptr)

            return c, run

        def run() -> None:
            with cupy.cuda.Device(dev), stream:
                fn()
                if drv is not None:
                    ev = drv.record(stream.ptr)
                else:
                    ev = cupy.cuda.Event(block=True, disable_timing=True)
                    ev.record(stream)
            c._event = ev

        return c, run

    def launch(self, lane: Lane, fn: Callable[[], Any], *, dependent: bool = False) -> Completion:
        if lane.kind != "device":
            return super().launch(lane, fn, dependent=dependent)
        w = self._worker(lane)
        c, run = self._enqueuing(lane, w, fn)
        w.put(run, c._host, dependent)
        self._waiter(lane).queue.put(c)
        return c

    def copy(self, src: Any, src_box: Box | None, dst: Any, dst_box: Box | None, box: Box,
             lane: Lane, *, dependent: bool = False) -> Completion:
        src_dev = isinstance(src, cupy.ndarray)
        dst_dev = isinstance(dst, cupy.ndarray)
        if not src_dev and not dst_dev:
            return super().copy(src, src_box, dst, dst_box, box, lane, dependent=dependent)

        if lane.kind != "device":
            raise BackendError("copies touching device memory run on a device lane")
        drv = self._driver
        views = None
        if src_dev and dst_dev and drv is not None:
            s = box_view(src, src_box, box)
            d = box_view(dst, dst_box, box)
            if s.dtype == d.dtype and s.flags.c_contiguous and d.flags.c_contiguous:
                # one cudaMemcpyAsync through the driver (same GPU or peers), enqueued here if the lane allows
                stream = self.lane_handle(lane)

                def memcpy() -> None:
                    drv.copy(d.data.ptr, s.data.ptr, d.nbytes, stream.ptr)

                c = self.enqueue_now(lane, memcpy, dependent=dependent, direct=True)
                return c if c is not None else self.launch(lane, memcpy, dependent=dependent)
            views = (s, d)              # (strided: CuPy's copy below, on the views made here)

        def run() -> None:
            s, d = views if views is not None else (box_view(src, src_box, box), box_view(dst, dst_box, box))
            if src_dev and dst_dev:
                device_copy(s, d)               # same device or peer access (CuPy checks)
            elif dst_dev:
                upload(s, d)
            else:
                download(s, d)

        if src_dev and dst_dev:        # device to device never blocks the host: enqueue it here if the lane allows
            c = self.enqueue_now(lane, run, dependent=dependent)
            if c is not None:
                return c
        return self.launch(lane, run, dependent=dependent)

    # ---- source kernels ---------------------------------------------------------------
    def launch_source_kernel(self, kernel, ctx, args: tuple, local_range) -> None:
        """Runs inside ``launch``'s worker under the lane's device and stream."""
        src = kernel.source.get("cuda")
        if src is None:
            raise BackendError(f"kernel {kernel.name!r} has no CUDA source (source={{'cuda': ...}})")
        dev = self.device_ids[ctx.device]
        box = ctx.box
        akey = (kernel.name, box.lo, box.hi, local_range)
        axes = self._axes.get(akey)
        if axes is None:
            if len(self._axes) > 4096:         # (new boxes every step: start over)
                self._axes.clear()
            rng = tuple(h - l for l, h in zip(box.lo, box.hi))
            axes = self._axes[akey] = thread_axes(kernel.name, box.dims, rng, local_range)
        key = (dev, kernel.name, src, kernel.options, axes.order)
        drv = self._driver
        if drv is not None:
            f = self._functions.get(key)
            if f is None:
                with cupy.cuda.Device(dev):      # (CuPy loads the module on the current device)
                    f = self._functions[key] = self._raw_kernel(key, src, kernel, axes).kernel.ptr
            kargs = driver_arguments(kernel.name, ctx, args, self._box_params)
            try:
                drv.launch(f, axes.grid, axes.block, ctx.stream.ptr, kargs, f"kernel {kernel.name!r}")
            except DriverError as exc:
                raise BackendError(str(exc)) from None
            return
        kargs = source_kernel_arguments(kernel.name, ctx, args, _same, cache=self._box_params)
        self._raw_kernel(key, src, kernel, axes)(axes.grid, axes.block, tuple(kargs))

    def _raw_kernel(self, key: tuple, src: str, kernel, axes: ThreadAxes) -> Any:
        """The kernel's ``cupy.RawKernel``, compiled once per key.  It stays in ``_kernels``
        also for the driver's launches: CuPy keeps its module loaded while it lives."""
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = source_kernel(src, kernel.name, axes, kernel.options)
        return k

    def close(self) -> None:
        super().close()
        for s in self._streams.values():
            try:
                s.synchronize()
            except Exception:  # noqa: BLE001 - teardown
                pass
        self._streams.clear()
