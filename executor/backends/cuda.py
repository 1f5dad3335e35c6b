"""CUDA backend (CuPy): the GPUs of a rank, one CUDA stream per device lane.

Each device lane has a worker thread that *enqueues* work on the lane's stream
(Python array kernels run under ``with device, stream`` so CuPy launches go to
that stream) and records a CUDA event; completion is the event, polled by the
executor, so kernels on a lane stay asynchronous — the host never synchronizes
per kernel.  Host memory (memory 1) is pinned, device memories use CuPy's pool
of each device, and device pairs with peer access copy directly (the
instruction graph stages the others through host memory).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import numpy as np

from scheduler.geometry import Box
from scheduler.instruction_graph import HOST_MEMORY, USER_MEMORY, device_memory

from .backend import BackendError, Completion, Lane, BackendInfo, box_view, source_kernel_arguments
from .host import HostBackend, HostCompletion

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
   chunk parameters give the global coordinates of this launch. */
#define ACCESSOR(T, name) T* __restrict__ name, long long name##_o0, long long name##_o1, long long name##_o2, \
                          long long name##_e0, long long name##_e1, long long name##_e2
#define AT1(a, i) a[(i) - a##_o0]
#define AT2(a, i, j) a[((i) - a##_o0) * a##_e1 + ((j) - a##_o1)]
#define AT3(a, i, j, k) a[(((i) - a##_o0) * a##_e1 + ((j) - a##_o1)) * a##_e2 + ((k) - a##_o2)]
#define CHUNK_PARAMS long long __cl_o0, long long __cl_o1, long long __cl_o2, \
                     long long __cl_r0, long long __cl_r1, long long __cl_r2
#define __CL_LOCAL(d) ((long long)(d == 0 ? blockIdx.x * blockDim.x + threadIdx.x : \
                                   d == 1 ? blockIdx.y * blockDim.y + threadIdx.y : \
                                            blockIdx.z * blockDim.z + threadIdx.z))
#define GID(d) (__CL_LOCAL(d) + (d == 0 ? __cl_o0 : d == 1 ? __cl_o1 : __cl_o2))
#define IN_CHUNK() (__CL_LOCAL(0) < __cl_r0 && __CL_LOCAL(1) < __cl_r1 && __CL_LOCAL(2) < __cl_r2)
"""


def cuda_device_count() -> int:
    if cupy is None:
        raise ImportError(f"CuPy is not installed: {_IMPORT_ERROR}")
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver / no device: zero GPUs
        return 0


class CudaCompletion(Completion):
    """Done once the worker enqueued the work and the recorded event has completed."""

    __slots__ = ("_host", "_event")
    notifying = False   # CUDA events are polled

    def __init__(self, host: HostCompletion):
        self._host = host
        self._event = None

    def is_done(self) -> bool:
        if not self._host._done:
            return False
        if self._host._error is not None or self._event is None:
            return True
        return self._event.done

    def error(self) -> BaseException | None:
        return self._host._error

    def wait(self, timeout: float | None = None) -> bool:
        if not self._host.wait(timeout):
            return False
        if self._event is not None:
            self._event.synchronize()
        return True

    @property
    def start_ns(self):
        return self._host.start_ns

    @property
    def end_ns(self):
        return self._host.end_ns


class CudaBackend(HostBackend):
    """Logical device d = CUDA device ``device_ids[d]`` (several may share one GPU)."""

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
                with cupy.cuda.Device(dev):
                    self._free_at_start[device_memory(d)] = int(cupy.cuda.runtime.memGetInfo()[0])
        for d in self.device_ids:
            if not 0 <= d < n:
                raise BackendError(f"CUDA device {d} does not exist ({n} visible)")
        self._streams: dict[Lane, Any] = {}
        self._kernels: dict[tuple, Any] = {}
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

    def launch(self, lane: Lane, fn: Callable[[], Any], *, dependent: bool = False) -> Completion:
        if lane.kind != "device":
            return super().launch(lane, fn, dependent=dependent)
        stream = self.lane_handle(lane)
        dev = self.device_ids[lane.device]
        holder: list[CudaCompletion] = []

        def run() -> None:
            with cupy.cuda.Device(dev), stream:
                fn()
                ev = cupy.cuda.Event(disable_timing=True)
                ev.record(stream)
            holder[0]._event = ev

        host = super().launch(lane, run, dependent=dependent)
        c = CudaCompletion(host)
        holder.append(c)
        return c

    def copy(self, src: Any, src_box: Box | None, dst: Any, dst_box: Box | None, box: Box,
             lane: Lane, *, dependent: bool = False) -> Completion:
        src_dev = isinstance(src, cupy.ndarray)
        dst_dev = isinstance(dst, cupy.ndarray)
        if not src_dev and not dst_dev:
            return super().copy(src, src_box, dst, dst_box, box, lane, dependent=dependent)

        def run() -> None:
            s = box_view(src, src_box, box)
            d = box_view(dst, dst_box, box)
            if src_dev and dst_dev:
                d[...] = s.reshape(d.shape)      # same device or peer access (CuPy checks)
            elif dst_dev:
                d[...] = cupy.asarray(np.ascontiguousarray(s)).reshape(d.shape)
            else:
                # device -> host: the host-side store must wait for the data
                host = cupy.asnumpy(cupy.ascontiguousarray(s), stream=cupy.cuda.get_current_stream())
                cupy.cuda.get_current_stream().synchronize()
                d[...] = host.reshape(d.shape)

        if lane.kind != "device":
            raise BackendError("copies touching device memory run on a device lane")
        return self.launch(lane, run, dependent=dependent)

    # ---- source kernels ---------------------------------------------------------------
    def launch_source_kernel(self, kernel, ctx, args: tuple, local_range) -> None:
        """Runs inside ``launch``'s worker under the lane's device and stream."""
        src = kernel.source.get("cuda")
        if src is None:
            raise BackendError(f"kernel {kernel.name!r} has no CUDA source (source={{'cuda': ...}})")
        dev = self.device_ids[ctx.device]
        key = (dev, kernel.name, src, kernel.options)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = cupy.RawKernel(PRELUDE + src, kernel.name, options=tuple(kernel.options))
        box = ctx.box
        rng = tuple(h - l for l, h in zip(box.lo, box.hi))
        kargs = source_kernel_arguments(kernel.name, ctx, args, lambda _i, arr: arr)
        dims = max(1, box.dims)
        if local_range:
            block = tuple(local_range) + (1,) * (3 - len(local_range))
        else:
            block = {1: (256, 1, 1), 2: (16, 16, 1), 3: (8, 8, 4)}[dims]
        grid = tuple(-(-r // b) for r, b in zip(rng, block))
        k(grid, block, tuple(kargs))

    def close(self) -> None:
        super().close()
        for s in self._streams.values():
            try:
                s.synchronize()
            except Exception:  # noqa: BLE001 - teardown
                pass
        self._streams.clear()
