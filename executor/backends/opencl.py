"""OpenCL backend (PyOpenCL): devices of one platform, an in-order queue per lane.

Device allocations are OpenCL buffers over page-aligned host arrays
(``USE_HOST_PTR``): on CPU devices (PoCL) that is zero-copy, so Python array
kernels and copies run on numpy views of the very memory source kernels use,
and every program runs on this backend unchanged.  Source kernels
(``cl.Kernel``) are compiled once per device with a generated prelude and
enqueued on the lane's command queue.  A source kernel on an idle lane is
enqueued by the executor itself (``enqueue_now``) and the lane's waiter thread
waits for its OpenCL event and notifies the executor (see ``device_queue``);
elsewhere the lane's worker enqueues it and waits, so completion reaches the
executor like any other lane work.  On non-CPU devices the buffers are
synchronized with map/unmap around source kernels, which keeps results correct
(not fast) for Python kernels there.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, NamedTuple

import numpy as np

from scheduler.instruction_graph import HOST_MEMORY, USER_MEMORY, AccessorArg, device_memory

from .backend import (BackendError, BackendInfo, Lane, check_argument_count, default_copy_pairs, note_blocked,
                      source_kernel_arguments, source_kernel_parameter_count)
from .device_queue import DeviceQueueBackend, QueueCompletion, QuietCompletion
from .host import HUGE_PAGE, host_empty

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


# What a kernel parameter's declared type (as clGetKernelArgInfo spells it) takes.
_SCALARS: dict[str, np.dtype] = {name: np.dtype(t) for name, t in {
    "char": np.int8, "uchar": np.uint8, "short": np.int16, "ushort": np.uint16, "int": np.int32,
    "uint": np.uint32, "long": np.int64, "ulong": np.uint64, "half": np.float16, "float": np.float32,
    "double": np.float64, "float2": np.complex64, "double2": np.complex128}.items()}
# The element types an accessor of a buffer of each dtype may be declared with.
_ELEMENTS: dict[str, frozenset[str]] = {
    "float32": frozenset({"float"}), "float64": frozenset({"double"}), "float16": frozenset({"half"}),
    "int8": frozenset({"char"}), "uint8": frozenset({"uchar"}), "int16": frozenset({"short"}),
    "uint16": frozenset({"ushort"}), "int32": frozenset({"int"}), "uint32": frozenset({"uint"}),
    "int64": frozenset({"long"}), "uint64": frozenset({"ulong"}), "bool": frozenset({"uchar", "char", "bool"}),
    "complex64": frozenset({"float2"}), "complex128": frozenset({"double2"})}
_SPELLING = {"float32": "float", "float64": "double", "float16": "half", "int8": "char", "uint8": "uchar",
             "int16": "short", "uint16": "ushort", "int32": "int", "uint32": "uint", "int64": "long",
             "uint64": "ulong", "bool": "uchar", "complex64": "float2", "complex128": "double2"}
# Built-in type names: a pointer to one of these that is not the buffer's type is a mistake;
# anything else (a typedef, a struct, void) is the author's business.
_BUILTIN = frozenset(
    {"bool"} | {f"{t}{n}" for t in ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half",
                                     "float", "double") for n in ("", "2", "3", "4", "8", "16")})
_QUALIFIERS = frozenset({"const", "volatile", "restrict", "__global", "global", "__constant", "constant"})


class _Param(NamedTuple):
    """One declared kernel parameter, from clGetKernelArgInfo."""

    name: str
    type: str          # the type without qualifiers: "float*", "int", "real*"
    pointer: bool      # a __global or __constant pointer (what an accessor fills)


def _signature(k: Any) -> tuple[_Param, ...] | None:
    """The declared parameters of a kernel object, or None where the driver keeps no argument
    info (then arguments are marshalled as documented and only counted)."""
    aq = cl.kernel_arg_address_qualifier
    info = cl.kernel_arg_info
    out = []
    try:
        for i in range(k.num_args):
            type_name = " ".join(w for w in k.get_arg_info(i, info.TYPE_NAME).split() if w not in _QUALIFIERS)
            pointer = (k.get_arg_info(i, info.ADDRESS_QUALIFIER) in (aq.GLOBAL, aq.CONSTANT)
                       and type_name.endswith("*"))
            out.append(_Param(k.get_arg_info(i, info.NAME), type_name.replace(" ", ""), pointer))
    except (cl.RuntimeError, cl.LogicError):   # (KERNEL_ARG_INFO_NOT_AVAILABLE)
        return None
    return tuple(out)


def _check_accessor(name: str, param: _Param, dtype: np.dtype, label: str) -> None:
    """An accessor fills a pointer parameter declared with the buffer's element type; a
    float* over float64 data reads and writes the wrong bytes, silently."""
    what = f"an accessor of buffer {label} holding {dtype}" if label else f"an accessor of a {dtype} buffer"
    if not param.pointer:
        raise BackendError(f"kernel {name!r}: parameter {param.name!r} is declared {param.type}, not a __global "
                           f"pointer, but gets {what}; declare accessors as ACCESSOR(T, name) in the order of args")
    element = param.type[:-1]
    allowed = _ELEMENTS.get(dtype.name)
    if allowed is None or element == "void" or element not in _BUILTIN or element in allowed:
        return
    raise BackendError(f"kernel {name!r}: parameter {param.name!r} is declared {param.type} but gets {what}; "
                       f"declare it ACCESSOR({_SPELLING[dtype.name]}, {param.name})")


def _convert_scalar(name: str, param: _Param, position: int, value: Any) -> Any:
    """``value`` as the numpy scalar of the declared parameter type, as a C call converts it
    (an int into a double, an np.int32 into a long), where numpy's ``same_kind`` rule allows
    and the value fits; without the conversion an int reached a double parameter as the bits
    of a long, and an np.int32 an int parameter as 8 bytes (INVALID_ARG_SIZE)."""
    target = _SCALARS.get(param.type)
    if param.pointer:
        raise BackendError(f"kernel {name!r}: parameter {param.name!r} is a pointer ({param.type}) but gets the "
                           f"scalar args[{position}] {value!r}; pass an accessor there")
    if target is None:   # (a typedef or vector type: marshalled as documented; the count was checked)
        return None
    source = np.asarray(value).dtype if isinstance(value, np.generic) else np.dtype(type(value))
    if isinstance(value, bool) or source.kind == "b":
        source = np.dtype(np.int32)
        value = int(value)
    integers = source.kind in "iu" and target.kind in "iu"   # (any integer that fits: checked below)
    if not integers and not np.can_cast(source, target, "same_kind"):
        why = ": it would truncate" if target.kind in "iu" and source.kind == "f" else ""
        raise BackendError(f"kernel {name!r}: parameter {param.name!r} ({param.type}) cannot take args[{position}] "
                           f"{value!r} of type {type(value).__name__}{why}")
    if target.kind in "iu":
        lo, hi = np.iinfo(target).min, np.iinfo(target).max
        if not lo <= int(value) <= hi:
            raise BackendError(f"kernel {name!r}: parameter {param.name!r} ({param.type}) cannot hold {value!r} "
                               f"(its range is {lo}..{hi})")
        return target.type(int(value))
    with np.errstate(over="ignore"):
        converted = target.type(value)
    if target.kind == "f" and np.isinf(converted) and np.isfinite(value):
        raise BackendError(f"kernel {name!r}: parameter {param.name!r} ({param.type}) cannot hold {value!r} "
                           f"(it would become {converted})")
    return converted


def _check_accessors(name: str, signature: tuple[_Param, ...], ctx: Any, args: tuple) -> None:
    """Every accessor in ``args`` against the parameter it fills (see ``_check_accessor``)."""
    parameter = 6
    for a in args:
        if isinstance(a, AccessorArg):
            arr = ctx.arrays[a.index]
            if arr is not None:
                _check_accessor(name, signature[parameter], arr.dtype, a.label)
            parameter += 7
        else:
            parameter += 1


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
        elif isinstance(a, float):
            key.append((float, a.hex()))   # (0.0 == -0.0, but 1 / x tells them apart)
        elif isinstance(a, np.generic):
            key.append((type(a), a.tobytes()))
        elif isinstance(a, (bool, int)):
            key.append((type(a), a))
        else:
            return None
    return tuple(key)


_NO_SYNCS: tuple = ()     # (a launch on a CPU device copies nothing back)


class _Enqueued:
    """The OpenCL events of what one ``enqueue_now`` enqueued, with the copies back to host
    arrays that non-CPU devices need after each kernel; the lane's waiter waits for them
    (``synchronize`` returns once they are done, whichever thread called it first; the
    copies back run once)."""

    __slots__ = ("items", "_lock", "_synced")

    def __init__(self, items: list):
        self.items = items      # (event, queue, [(buffer, host array), ...])
        self._lock = threading.Lock()
        self._synced = False

    @property
    def done(self) -> bool:
        if self._synced:
            return True
        if any(syncs for _ev, _q, syncs in self.items):
            return False        # (the copies back are the waiter's: done once it synchronized)
        complete = cl.command_execution_status.COMPLETE
        return all(ev.command_execution_status == complete for ev, _q, _syncs in self.items)

    def synchronize(self) -> None:
        with self._lock:
            if self._synced:
                return
            for ev, queue, syncs in self.items:
                ev.wait()
                for buf, arr in syncs:
                    cl.enqueue_copy(queue, arr.reshape(-1).view(np.uint8), buf).wait()
            self._synced = True


class OpenCLBackend(DeviceQueueBackend):
    """Logical devices = the listed OpenCL devices (one physical device may appear several times).

    Lanes stay plain host lanes (``runs_inline``) for everything but ``enqueue_now``: copies
    are numpy copies between zero-copy buffers' host arrays, and a source kernel run inline
    or on a worker enqueues and waits, so its measured cost is the device's time, which is
    what the executor compares with its inline threshold (``DEVICE_TIME``: completions of
    ``enqueue_now`` count the device's time too).  A worker holds its item until the device
    finished it, so ``enqueue_now`` never waits for a busy worker to drain."""

    DEVICE_TIME = True
    DRAIN_WAIT_S = 0.0
    enqueues_python_kernels = False

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
        self._kernel_args: dict[int, tuple] = {}     # id(kernel object) -> (key of the arguments it holds, launch geometry)
        self._signatures: dict[int, tuple | None] = {}   # id(kernel object) -> its declared parameters
        self._wg_limits: dict[tuple, tuple] = {}     # (id(kernel object), device) -> work-group limits
        self._prog_lock = threading.Lock()
        self._cpu = [d.type & cl.device_type.CPU != 0 for d in devs]
        # per thread: the list ``enqueue_now`` collects enqueued events in (None: enqueue and wait)
        self._enqueue_only = threading.local()

    def _enqueuing(self, lane: Lane, worker, fn, direct: bool = False) -> tuple[QueueCompletion, Callable[[], None]]:
        """``fn`` with its source kernels enqueued, not waited for (``enqueue_now``: the lane's
        waiter waits for them).  Only source kernels come here: a Python kernel would run at
        once, ahead of kernels of the lane still on the device (``enqueues_python_kernels``)."""
        c = QueueCompletion(QuietCompletion(worker))
        tls = self._enqueue_only

        def run() -> None:
            tls.pending = pending = []
            try:
                fn()
            finally:
                tls.pending = None
                if pending:
                    c._event = _Enqueued(pending)

        return c, run

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
                    # (argument info: what the parameters are declared as, so scalars are
                    # converted to their types and accessors checked against theirs)
                    options = list(kernel.options) + ["-cl-kernel-arg-info"]
                    try:
                        prg = cl.Program(self.context_of(device), PRELUDE + src).build(options=options)
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
        # (options are part of the key: one source built with -DT=float and -DT=double is two kernels)
        kkey = (id(queue), kernel.name, kernel.source.get("opencl"), kernel.options)
        k = self._kernels.get(kkey)
        if k is None:   # one kernel object per queue: set_args is not thread-safe
            k = self._kernel_object(kernel, device)
            self._signatures[id(k)] = _signature(k)
            self._kernels[kkey] = k
        # pyopencl's set_args converts every argument (20-60 us for a dozen): skipped when the
        # kernel object (one per queue) already holds these arguments, as a repeating step's
        # launches on one chunk do; the launch geometry is kept beside them (the key holds
        # the chunk's box)
        key = _arguments_key(ctx, args)
        held = self._kernel_args.get(id(k))
        if key is not None and held is not None and held[0] == key and self._cpu[device]:
            syncs = _NO_SYNCS
            gsize, goff = held[1]
        else:
            syncs = []

            def pointer(_index: int, arr: Any):
                if arr is None:   # (the accessor maps nothing of this chunk: a null pointer, extents 0)
                    return None
                buf = self._buffer(arr, device)
                if not self._cpu[device]:
                    syncs.append((buf, arr))
                return buf

            check_argument_count(kernel.name, k.num_args, source_kernel_parameter_count(args), args)
            signature = self._signatures.get(id(k))
            scalar = None
            if signature is not None:
                _check_accessors(kernel.name, signature, ctx, args)

                def scalar(position: int, parameter: int, value: Any) -> Any:
                    return _convert_scalar(kernel.name, signature[parameter], position, value)
            cl_args = source_kernel_arguments(kernel.name, ctx, args, pointer, scalar)
            for buf, arr in syncs:   # push host writes to the device
                m, ev = cl.enqueue_map_buffer(queue, buf, cl.map_flags.WRITE_INVALIDATE_REGION, 0,
                                              (arr.nbytes,), np.uint8)
                m[...] = arr.reshape(-1).view(np.uint8)
                m.base.release(queue)
            k.set_args(*cl_args)
            box = ctx.box
            gsize, goff = geometry = (tuple(box.range) or (1,), tuple(box.offset) or None)
            self._kernel_args[id(k)] = (key if key is not None else _arguments_key(ctx, args), geometry)
        if local_range:
            self._check_local_range(kernel.name, k, device, tuple(local_range))
        ev = cl.enqueue_nd_range_kernel(queue, k, gsize, tuple(local_range) if local_range else None,
                                        global_work_offset=goff)
        pending = getattr(self._enqueue_only, "pending", None)
        if pending is not None:     # (enqueue_now: the lane's waiter waits)
            pending.append((ev, queue, syncs))
            return
        t0 = time.perf_counter_ns()
        ev.wait()
        for buf, arr in syncs:   # pull the results back into the host-visible array
            cl.enqueue_copy(queue, arr.reshape(-1).view(np.uint8), buf).wait()
        note_blocked(time.perf_counter_ns() - t0)     # the device's time: this work's cost, run inline or not

    def _kernel_object(self, kernel, device: int) -> Any:
        """A new kernel object for the entry point ``kernel.name`` of its program.

        PoCL builds a kernel whose name is an OpenCL built-in function (``step``, ``dot``)
        as ``_cl_<name>``; that one is the entry point then."""
        program = self._program(kernel, device)
        try:
            return cl.Kernel(program, kernel.name)
        except cl.LogicError as exc:
            try:
                names = [n for n in program.get_info(cl.program_info.KERNEL_NAMES).split(";") if n]
            except Exception:  # noqa: BLE001 - only for the message
                names = []
            if f"_cl_{kernel.name}" in names:
                return cl.Kernel(program, f"_cl_{kernel.name}")
            defines = f"it defines: {', '.join(sorted(names))}" if names else str(exc)
            raise BackendError(f"kernel {kernel.name!r}: its OpenCL source defines no __kernel named "
                               f"{kernel.name!r} ({defines})") from None

    def _check_local_range(self, name: str, k: Any, device: int, local_range: tuple[int, ...]) -> None:
        """A work group larger than the device runs for this kernel fails in the driver with
        INVALID_WORK_GROUP_SIZE, which names neither the limit nor the cause."""
        limit = self._wg_limits.get((id(k), device))
        if limit is None:
            dev = self.devices[device]
            per_kernel = k.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, dev)
            limit = self._wg_limits[(id(k), device)] = (int(per_kernel), tuple(dev.max_work_item_sizes))
        total = int(np.prod(local_range))
        if total > limit[0]:
            raise BackendError(f"kernel {name!r}: local_range {local_range} has {total} work items per work group; "
                               f"device {device} ({self.devices[device].name.strip()}) runs at most {limit[0]} for "
                               f"this kernel")
        for d, (n, most) in enumerate(zip(local_range, limit[1])):
            if n > most:
                raise BackendError(f"kernel {name!r}: local_range {local_range} has {n} work items in dimension {d}; "
                                   f"device {device} ({self.devices[device].name.strip()}) allows at most {most} "
                                   f"there")

    def close(self) -> None:
        super().close()
        for q in self._queues.values():
            try:
                q.finish()
            except Exception:  # noqa: BLE001 - teardown
                pass
        self._queues.clear()
