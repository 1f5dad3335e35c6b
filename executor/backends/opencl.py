"""OpenCL backend (PyOpenCL): devices of one platform, an in-order queue per lane.

Device allocations are OpenCL buffers over page-aligned host arrays
(``USE_HOST_PTR``): on CPU devices (PoCL) that is zero-copy, so Python array
kernels and copies run on numpy views of the very memory source kernels use,
and every program runs on this backend unchanged.  Source kernels
(``cl.Kernel``) are compiled once per device with a generated prelude and
enqueued on the lane's command queue; the lane's worker waits on the OpenCL
event, so completion reaches the executor like any other lane work.  On
non-CPU devices the buffers are synchronized with map/unmap around source
kernels, which keeps results correct (not fast) for Python kernels there.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from scheduler.instruction_graph import HOST_MEMORY, USER_MEMORY, AccessorArg, device_memory

from .backend import (BackendError, BackendInfo, Lane, check_argument_count, default_copy_pairs, note_blocked,
                      source_kernel_arguments)
from .host import HUGE_PAGE, HostBackend, host_empty

log = logging.getLogger("celeritas.executor")

try:  # optional dependency: the backend is only constructed when it imports
    import pyopencl as cl
except ImportError as _exc:  # pragma: no cover - exercised where pyopencl is missing
    cl = None
    _IMPORT_ERROR: Exception | None = _exc
else:
    _IMPORT_ERROR = None

_PROBE_SOURCE = "__kernel void celeritas_probe(__global int* x) { x[get_global_id(0)] += 1; }"

PRELUDE = r"""
/* celeritas prelude: accessors arrive as pointer + allocation offset + extents,
   so kernels index buffers in global coordinates like Python kernels do. */
#define ACCESSOR(T, name) __global T* name, long name##_o0, long name##_o1, long name##_o2, \
                          long name##_e0, long name##_e1, long name##_e2
#define AT1(a, i) a[(i) - a##_o0]
#define AT2(a, i, j) a[((i) - a##_o0) * a##_e1 + ((j) - a##_o1)]
#define AT3(a, i, j, k) a[(((i) - a##_o0) * a##_e1 + ((j) - a##_o1)) * a##_e2 + ((k) - a##_o2)]
#define CHUNK_PARAMS long __cl_o0, long __cl_o1, long __cl_o2, long __cl_r0, long __cl_r1, long __cl_r2
#define GID(d) ((long)get_global_id(d))
#define IN_CHUNK() (GID(0) < __cl_o0 + __cl_r0)
"""


class OclArray(np.ndarray):
    """A host-visible numpy array that also has an OpenCL buffer (created on first use)."""

    cl_buffer: Any = None


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype, align: int = 4096,
                   huge_pages: int | None = HUGE_PAGE, pool: Any = None) -> OclArray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if huge_pages is not None and n >= max(huge_pages, 1):   # 2 MiB-aligned, advised for huge pages
        return host_empty(shape, dtype, huge_pages, pool).view(OclArray)
    raw = np.empty(n + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    arr = raw[off:off + n].view(dtype)
    return arr.reshape(shape).view(OclArray)


def _device_ok(ctx, device) -> bool:
    try:
        cl.Program(ctx, _PROBE_SOURCE).build(devices=[device])
        return True
    except Exception as exc:  # noqa: BLE001 - any failure means: not usable
        log.info("OpenCL device %s cannot build kernels: %s", device.name, str(exc).splitlines()[0])
        return False


def _platforms() -> list:
    try:
        return cl.get_platforms()
    except Exception as exc:  # noqa: BLE001 - pyopencl raises LogicError/RuntimeError when no ICD is registered
        raise BackendError(f"no OpenCL platform is installed ({str(exc).strip()}); install an OpenCL driver "
                           f"(pip install pocl-binary-distribution, or apt-get install pocl-opencl-icd for "
                           f"PoCL on the CPU)") from None


def _listing(platforms: list) -> str:
    """Every platform and device as ``opencl:P:D`` spellings, for error messages."""
    parts = []
    for p, plat in enumerate(platforms):
        try:
            devs = plat.get_devices()
        except Exception:  # noqa: BLE001 - a platform without devices raises on some drivers
            devs = []
        names = ", ".join(f"opencl:{p}:{d} {dev.name.strip()}" for d, dev in enumerate(devs)) or "no devices"
        parts.append(f"platform {p} {plat.name.strip()!r}: {names}")
    return "; ".join(parts)


def opencl_devices(ids: list[tuple[int, int]] | tuple = ()) -> list:
    """The devices for ``opencl`` (first platform whose devices build kernels) or ``opencl:P:D,…``."""
    if cl is None:
        raise BackendError(f"PyOpenCL is not installed (pip install 'celeritas[opencl]'): {_IMPORT_ERROR}")
    platforms = _platforms()
    if ids:
        out = []
        for p, d in ids:
            if p >= len(platforms):
                raise BackendError(f"OpenCL platform {p} does not exist; this machine has "
                                   f"{len(platforms)} platform{'s' if len(platforms) != 1 else ''} "
                                   f"({_listing(platforms) or 'none'})")
            devs = platforms[p].get_devices()
            if d >= len(devs):
                raise BackendError(f"OpenCL platform {p} {platforms[p].name.strip()!r} has no device {d}; "
                                   f"this machine has: {_listing(platforms)}")
            out.append(devs[d])
        return out
    for p in platforms:
        devs = p.get_devices()
        if devs:
            ctx = cl.Context(devs)
            good = [d for d in devs if _device_ok(ctx, d)]
            if good:
                return good
    raise BackendError(f"no OpenCL device can build kernels ({_listing(platforms) or 'no platforms'}); "
                       f"on Debian/Ubuntu: apt-get install pocl-opencl-icd")


def _arguments_key(ctx: Any, args: tuple) -> tuple | None:
    """What decides a source kernel's argument values: the chunk, and per argument the
    allocation's OpenCL buffer (the object itself: the key keeps it alive, so no later
    buffer can compare equal to it) with the allocation's extent, or the scalar (with its
    type).  None when an allocation has no buffer yet or an argument is neither (the full
    path then makes the buffer, or raises the error)."""
    box = ctx.box
    key: list = [box.lo, box.hi]
    for a in args:
        if isinstance(a, AccessorArg):
            buf = getattr(ctx.arrays[a.index], "cl_buffer", None)
            if buf is None:
                return None
            abox = ctx.accesses[a.index].allocation_box
            key.append((buf, abox.lo, abox.hi))
        elif isinstance(a, (bool, int, float, np.generic)):
            key.append((type(a), a))
        else:
            return None
    return tuple(key)


class OpenCLBackend(HostBackend):
    """Logical devices = the listed OpenCL devices (one physical device may appear several times)."""

    def __init__(self, ids: list[tuple[int, int]] | tuple = (), *, devices: list | None = None,
                 huge_pages: int | None = HUGE_PAGE, rank: int | None = None):
        devs = devices if devices is not None else opencl_devices(list(ids))
        super().__init__(len(devs), huge_pages=huge_pages, rank=rank)
        self.devices = devs
        self._contexts: dict[int, Any] = {}
        for d in devs:
            key = d.int_ptr
            if key not in self._contexts:
                self._contexts[key] = cl.Context([d])
        self._queues: dict[Lane, Any] = {}
        self._programs: dict[tuple, Any] = {}
        self._kernels: dict[tuple, Any] = {}
        self._kernel_args: dict[int, tuple] = {}     # id(kernel object) -> key of the arguments it holds
        self._prog_lock = threading.Lock()
        self._cpu = [d.type & cl.device_type.CPU != 0 for d in devs]

    def context_of(self, device: int):
        return self._contexts[self.devices[device].int_ptr]

    def backend_info(self) -> BackendInfo:
        return BackendInfo(num_devices=self.num_devices, memories=self._memories,
                          copy_pairs=default_copy_pairs(self.num_devices, True),
                          communicator_memories=frozenset({USER_MEMORY, HOST_MEMORY}),
                          device_memories={d: device_memory(d) for d in range(self.num_devices)},
                          capacities={device_memory(d): int(dev.global_mem_size)
                                      for d, dev in enumerate(self.devices)})

    def _new_array(self, memory: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if memory < 2:
            return np.empty(shape, dtype=dtype)
        return _aligned_empty(tuple(shape), dtype, huge_pages=self.huge_pages,   # page-aligned: USE_HOST_PTR
                              pool=self.memory_pool)

    def lane_handle(self, lane: Lane) -> Any:
        if lane.kind != "device":
            return None
        q = self._queues.get(lane)
        if q is None:
            dev = self.devices[lane.device]
            q = self._queues[lane] = cl.CommandQueue(self.context_of(lane.device), dev)
        return q

    # ---- source kernels -----------------------------------------------------------
    def _program(self, kernel, device: int):
        src = kernel.source.get("opencl")
        if src is None:
            raise BackendError(f"kernel {kernel.name!r} has no OpenCL source (source={{'opencl': ...}})")
        key = (self.devices[device].int_ptr, kernel.name, src, kernel.options)
        prg = self._programs.get(key)
        if prg is None:
            with self._prog_lock:
                prg = self._programs.get(key)
                if prg is None:
                    try:
                        prg = cl.Program(self.context_of(device), PRELUDE + src).build(options=list(kernel.options))
                    except cl.RuntimeError as exc:
                        raise BackendError(f"OpenCL kernel {kernel.name!r} failed to build: {exc}") from exc
                    self._programs[key] = prg
        return prg

    def _buffer(self, arr: OclArray, device: int):
        buf = getattr(arr, "cl_buffer", None)
        if buf is None:
            base = arr
            flags = cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR
            buf = cl.Buffer(self.context_of(device), flags, hostbuf=base.reshape(-1).view(np.uint8))
            arr.cl_buffer = buf
        return buf

    def launch_source_kernel(self, kernel, ctx, args: tuple, local_range) -> None:
        """Runs on the lane's worker thread: enqueue on the lane's queue and wait for its event."""
        device = ctx.device
        queue = ctx.stream
        kkey = (id(queue), kernel.name, kernel.source.get("opencl"))
        k = self._kernels.get(kkey)
        if k is None:   # one kernel object per queue: set_args is not thread-safe
            program = self._program(kernel, device)
            try:
                k = cl.Kernel(program, kernel.name)
            except cl.LogicError as exc:
                raise BackendError(f"kernel {kernel.name!r}: its OpenCL source defines no __kernel named "
                                   f"{kernel.name!r} ({exc})") from None
            self._kernels[kkey] = k
        syncs = []

        def pointer(_index: int, arr: Any):
            buf = self._buffer(arr, device)
            if not self._cpu[device]:
                syncs.append((buf, arr))
            return buf

        # pyopencl's set_args converts every argument (20-60 us for a dozen): skipped when the
        # kernel object (one per queue) already holds these arguments, as a repeating step's
        # launches on one chunk do
        key = _arguments_key(ctx, args)
        if key is None or self._kernel_args.get(id(k)) != key or not self._cpu[device]:
            cl_args = source_kernel_arguments(kernel.name, ctx, args, pointer)
            check_argument_count(kernel.name, k.num_args, cl_args, args)
            for buf, arr in syncs:   # push host writes to the device
                m, ev = cl.enqueue_map_buffer(queue, buf, cl.map_flags.WRITE_INVALIDATE_REGION, 0,
                                              (arr.nbytes,), np.uint8)
                m[...] = arr.reshape(-1).view(np.uint8)
                m.base.release(queue)
            k.set_args(*cl_args)
            self._kernel_args[id(k)] = key if key is not None else _arguments_key(ctx, args)
        gsize = tuple(ctx.box.range) or (1,)
        goff = tuple(ctx.box.offset) or None
        ev = cl.enqueue_nd_range_kernel(queue, k, gsize, tuple(local_range) if local_range else None,
                                        global_work_offset=goff)
        t0 = time.perf_counter_ns()
        ev.wait()
        for buf, arr in syncs:   # pull the results back into the host-visible array
            cl.enqueue_copy(queue, arr.reshape(-1).view(np.uint8), buf).wait()
        note_blocked(time.perf_counter_ns() - t0)     # the device's time: this work's cost, run inline or not

    def close(self) -> None:
        super().close()
        for q in self._queues.values():
            try:
                q.finish()
            except Exception:  # noqa: BLE001 - teardown
                pass
        self._queues.clear()
