"""CUDA driver calls that keep the GIL: how the executor enqueues source kernels,
device-to-device copies and their events.

CuPy releases the GIL around every CUDA call it makes, and the executor enqueues a
kernel with five or six of them (the device and stream contexts each ask for the
current device, the launch, the event's creation and record).  A thread that gives
the GIL away waits to get it back until the thread that took it blocks, or for a
whole switch interval (5 ms) if that thread keeps computing: measured on an H200,
one-thread kernel launches cost 5.2 ms each through ``RawKernel`` beside a busy
Python thread, and 19 ms with the contexts and event the backend added, against
16-21 us through the calls here, which ``ctypes.PyDLL`` makes without releasing
the GIL (8-11 us alone, as fast as CuPy's).  In the runtime the application and
scheduler threads are such threads while a program submits work.

Only the lane's waiter thread waits for the device (``DriverEvent.synchronize``),
and it does release the GIL.  ``load()`` returns None where ``libcuda`` cannot be
opened through ctypes: the backend then goes through CuPy alone.
"""
from __future__ import annotations

import ctypes
import struct
import sys
import threading
from typing import Any

import numpy as np

CU_EVENT_BLOCKING_SYNC = 0x1        # the waiter sleeps in the driver instead of spinning a core
CU_EVENT_DISABLE_TIMING = 0x2
CUDA_ERROR_NOT_READY = 600

# a kernel parameter's bytes in its 8-byte slot, by the type source_kernel_arguments gives it
# (a Python int is a device pointer)
SLOTS = {int: "q", np.int64: "q", np.int32: "i4x", np.float32: "f4x", np.float64: "d"}


class DriverError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


class CudaDriver:
    """The handful of driver entry points the enqueue path needs, bound through ctypes."""

    def __init__(self, keep: Any, release: Any):
        vp, uint, intp = ctypes.c_void_p, ctypes.c_uint, ctypes.POINTER(ctypes.c_int)

        def bind(lib, name, *argtypes):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int
            fn.argtypes = list(argtypes)
            return fn

        self._launch = bind(keep, "cuLaunchKernel", vp, uint, uint, uint, uint, uint, uint, uint, vp, vp, vp)
        self._memcpy = bind(keep, "cuMemcpyAsync", ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, vp)
        self._create = bind(keep, "cuEventCreate", ctypes.POINTER(vp), uint)
        self._record = bind(keep, "cuEventRecord", vp, vp)
        self._query = bind(keep, "cuEventQuery", vp)
        self._destroy = bind(keep, "cuEventDestroy_v2", vp)
        self._wait = bind(release, "cuEventSynchronize", vp)      # (CDLL: the GIL is released)
        self._get_ctx = bind(keep, "cuCtxGetCurrent", ctypes.POINTER(vp))
        self._set_ctx = bind(keep, "cuCtxSetCurrent", vp)
        self._device_get = bind(keep, "cuDeviceGet", intp, ctypes.c_int)
        self._retain = bind(keep, "cuDevicePrimaryCtxRetain", ctypes.POINTER(vp), ctypes.c_int)
        self._error_name = bind(keep, "cuGetErrorName", ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
        self._contexts: dict[int, int] = {}
        self._packers: dict[tuple, Any] = {}
        self._local = threading.local()

    @classmethod
    def load(cls) -> CudaDriver | None:
        """The driver, or None where it cannot be bound (no libcuda, an old one)."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            return cls(ctypes.PyDLL("libcuda.so.1"), ctypes.CDLL("libcuda.so.1"))
        except (OSError, AttributeError):
            return None

    def _check(self, rc: int, what: str) -> None:
        if rc:
            name = ctypes.c_char_p()
            self._error_name(rc, ctypes.byref(name))
            raise DriverError(f"{what} failed: {(name.value or b'CUDA error').decode()} ({rc})")

    # ---- context -----------------------------------------------------------------------
    def use(self, device: int) -> None:
        """Make ``device``'s primary context (the one CuPy's runtime calls use) current on this
        thread, as ``cupy.cuda.Device(device)`` would, without giving the GIL away."""
        ctx = self._contexts.get(device)
        if ctx is None:
            dev = ctypes.c_int()
            self._check(self._device_get(ctypes.byref(dev), device), f"cuDeviceGet({device})")
            h = ctypes.c_void_p()
            self._check(self._retain(ctypes.byref(h), dev), f"cuDevicePrimaryCtxRetain({device})")
            ctx = self._contexts[device] = h.value
        cur = ctypes.c_void_p()
        self._get_ctx(ctypes.byref(cur))
        if cur.value != ctx:
            self._check(self._set_ctx(ctx), f"cuCtxSetCurrent(device {device})")

    # ---- work on a stream --------------------------------------------------------------
    def launch(self, function: int, grid: tuple, block: tuple, stream: int, values: list, what: str) -> None:
        """``cuLaunchKernel`` of ``function`` with ``values`` (ints for pointers and numpy
        scalars, as ``source_kernel_arguments`` makes them), each in an 8-byte slot: the
        driver copies each parameter's size from its slot at the call, so the slots are
        reused."""
        types = tuple(map(type, values))
        packer = self._packers.get(types)
        if packer is None:
            try:
                fmt = "<" + "".join([SLOTS[t] for t in types])
            except KeyError as exc:
                raise DriverError(f"{what}: a kernel parameter of type {exc.args[0].__name__} has no "
                                  f"CUDA counterpart here") from None
            packer = self._packers[types] = struct.Struct(fmt).pack_into
        slots = getattr(self._local, "slots", None)
        if slots is None:
            slots = self._local.slots = {}
        n = len(values)
        entry = slots.get(n)
        if entry is None:
            buf = ctypes.create_string_buffer(8 * n)
            base = ctypes.addressof(buf)
            params = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)])
            entry = slots[n] = (buf, params, ctypes.addressof(params))
        packer(entry[0], 0, *values)
        self._check(self._launch(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, stream,
                                 entry[2], None), what)

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """``nbytes`` from device pointer ``src`` to ``dst`` (one GPU, or peers: unified addressing)."""
        self._check(self._memcpy(dst, src, nbytes, stream), "cuMemcpyAsync")

    def record(self, stream: int) -> DriverEvent:
        """A new blocking-sync event recorded on ``stream``."""
        h = ctypes.c_void_p()
        self._check(self._create(ctypes.byref(h), CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        ev = DriverEvent(self, h.value)
        self._check(self._record(ev.ptr, stream), "cuEventRecord")
        return ev


class DriverEvent:
    """A CUDA event made by ``CudaDriver.record`` (the ``DeviceEvent`` a completion waits for)."""

    __slots__ = ("driver", "ptr")

    def __init__(self, driver: CudaDriver, ptr: int):
        self.driver = driver
        self.ptr = ptr

    @property
    def done(self) -> bool:
        rc = self.driver._query(self.ptr)
        if rc == CUDA_ERROR_NOT_READY:
            return False
        self.driver._check(rc, "cuEventQuery")
        return True

    def synchronize(self) -> None:
        self.driver._check(self.driver._wait(self.ptr), "cuEventSynchronize")

    def __del__(self) -> None:
        if self.ptr and not sys.is_finalizing():
            self.driver._destroy(self.ptr)
            self.ptr = 0
