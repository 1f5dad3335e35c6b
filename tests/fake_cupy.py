"""A stand-in for CuPy, so that the CUDA backend's control flow runs without a GPU.

"Device" arrays are numpy arrays of a subclass (``ndarray``), so every kernel and copy
computes real values.  What is asynchronous on a GPU is simulated where the backend
relies on it: a stream is in order, an event recorded on it completes ``delay_ns``
after the work before it (one item after the other, as a GPU runs a stream), and
``Event.synchronize`` sleeps (it releases the GIL, as ``cudaEventSynchronize`` does).
``install(monkeypatch)`` puts it in place of ``executor.backends.cuda``'s CuPy.
"""
from __future__ import annotations

import contextlib
import threading
import time
import types
import weakref

import numpy as np


class ndarray(np.ndarray):
    """A "device" array, with CuPy's host transfers and their checks (``set`` needs a
    contiguous target, ``get(out=...)`` a contiguous host array of the same shape and dtype)."""

    def set(self, arr, stream=None):
        if not isinstance(arr, np.ndarray) or isinstance(arr, ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not self.flags.c_contiguous:
            raise RuntimeError("Cannot set to non-contiguous array")
        np.copyto(self.view(np.ndarray), arr)
        FakeCupy.host_transfers.append(("set", self.shape))

    @property
    def data(self):
        """CuPy's memory pointer of the array's first element (here: the array itself)."""
        return _MemoryPointer(self)

    def get(self, stream=None, order="C", out=None, blocking=True):
        if out is None:
            return np.array(self).view(np.ndarray)
        if not isinstance(out, np.ndarray) or isinstance(out, ndarray):
            raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
        if self.dtype != out.dtype:
            raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
        if self.shape != out.shape:
            raise ValueError(f"Shape mismatch. Expected shape: {self.shape}, actual shape: {out.shape}")
        if not out.flags.c_contiguous:
            raise RuntimeError("`out` cannot be specified when copying to non-contiguous ndarray")
        np.copyto(out, self.view(np.ndarray))
        FakeCupy.host_transfers.append(("get", self.shape))
        return out


class _MemoryPointer:
    """``ndarray.data``: the device-to-device copy CuPy makes with one ``cudaMemcpyAsync``, and
    ``ptr``, the array's real address (which ``FakeDriver.copy`` copies between)."""

    def __init__(self, array: ndarray):
        self.array = array

    @property
    def ptr(self) -> int:
        p = self.array.__array_interface__["data"][0]
        FakeCupy.by_pointer[p] = self.array
        return p

    def copy_from_device_async(self, src: "_MemoryPointer", size: int, stream=None) -> None:
        for a in (self.array, src.array):
            if not a.flags.c_contiguous or a.nbytes < size:
                raise ValueError("a memory copy needs contiguous arrays of at least the size")
        dst = self.array.view(np.ndarray).reshape(-1).view(np.uint8)
        dst[:size] = src.array.view(np.ndarray).reshape(-1).view(np.uint8)[:size]
        FakeCupy.host_transfers.append(("memcpy", self.array.shape))


class FakeCupy:
    host_transfers: list = []   # ("set" | "get" | "memcpy", shape) of each direct transfer, in order
    # address -> the array whose ``data.ptr`` gave it, while it lives (the newest)
    by_pointer: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def __init__(self, delay_ns: int = 50_000):
        self.delay_ns = delay_ns
        self.queries = 0            # Event.done reads (each a cudaEventQuery on a GPU)
        self.kernels: list = []     # (name, grid, block, options) of every RawKernel launch
        self.streams: dict = {}     # ptr -> Stream
        self.functions: dict = {}   # kernel handle -> (name, options)
        self.driver_calls = 0       # FakeDriver launches, copies and records
        self._local = threading.local()
        fake = self

        class Device:
            def __init__(self, i: int = 0):
                self.id = i

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def synchronize(self):
                pass

        class Stream:
            def __init__(self, non_blocking: bool = False):
                self.busy_until = 0
                self.ptr = id(self)
                fake.streams[self.ptr] = self

            def __enter__(self):
                stack = fake._stack()
                stack.append(self)
                return self

            def __exit__(self, *exc):
                fake._stack().pop()
                return False

            def synchronize(self):
                d = self.busy_until - time.perf_counter_ns()
                if d > 0:
                    time.sleep(d / 1e9)

        class Event:
            def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
                self.at = 0

            def record(self, stream=None):
                s = stream or fake.current_stream()
                now = time.perf_counter_ns()
                self.at = s.busy_until = max(now, s.busy_until) + fake.delay_ns

            @property
            def done(self):
                fake.queries += 1
                return time.perf_counter_ns() >= self.at

            def synchronize(self):
                d = self.at - time.perf_counter_ns()
                if d > 0:
                    time.sleep(d / 1e9)

        def raw_kernel(src: str, name: str, options=()):
            def launch(grid, block, args):
                fake.kernels.append((name, grid, block, tuple(options)))
            # (``kernel.ptr``: the handle the driver launches, see FakeDriver.launch)
            launch.kernel = types.SimpleNamespace(ptr=id(launch))
            fake.functions[id(launch)] = (name, tuple(options))
            return launch

        runtime = types.SimpleNamespace(getDeviceCount=lambda: 1, memGetInfo=lambda: (8 << 30, 8 << 30),
                                        deviceCanAccessPeer=lambda a, b: 1, deviceEnablePeerAccess=lambda d: None,
                                        CUDARuntimeError=RuntimeError,
                                        getDeviceProperties=lambda i: {"name": b"FakeGPU"})
        self.cuda = types.SimpleNamespace(Device=Device, Stream=Stream, Event=Event, runtime=runtime,
                                          get_current_stream=self.current_stream,
                                          memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
        self.ndarray = ndarray
        self.RawKernel = raw_kernel
        self._null = Stream()

    def _stack(self) -> list:
        s = getattr(self._local, "stack", None)
        if s is None:
            s = self._local.stack = []
        return s

    def current_stream(self):
        s = self._stack()
        return s[-1] if s else self._null

    def stream_of(self, ptr: int):
        """The stream with handle ``ptr`` (a driver call on anything else fails, as on a GPU)."""
        s = self.streams.get(ptr)
        if s is None:
            raise RuntimeError(f"no stream {ptr:#x}")
        return s

    # the array functions the backend and the apps' kernels use
    @staticmethod
    def empty(shape, dtype=np.float64):
        return np.empty(shape, dtype).view(ndarray)

    @staticmethod
    def zeros(shape, dtype=np.float64):
        return np.zeros(shape, dtype).view(ndarray)

    @staticmethod
    def asarray(a):
        return np.array(a).view(ndarray)

    @staticmethod
    def asnumpy(a, stream=None):
        return np.array(a).view(np.ndarray)

    @staticmethod
    def ascontiguousarray(a):
        return np.ascontiguousarray(a).view(ndarray)

    @staticmethod
    def concatenate(arrays, axis=0):
        return np.concatenate(arrays, axis=axis).view(ndarray)


class FakeDriver:
    """``cuda_driver.CudaDriver`` on the stand-in: launches are recorded as ``RawKernel``'s are,
    copies move the bytes between the arrays' real addresses, and an event completes
    ``delay_ns`` after the work before it on its stream, as ``Event.record`` has it."""

    def __init__(self, fake: FakeCupy):
        self.fake = fake
        self.devices_used: list = []

    def use(self, device: int) -> None:
        self.devices_used.append(device)

    def launch(self, function: int, grid: tuple, block: tuple, stream: int, values: list, what: str) -> None:
        from executor.backends.cuda_driver import SLOTS
        for v in values:
            if type(v) not in SLOTS:     # (what the real driver packs; it refuses anything else)
                raise TypeError(f"{what}: {type(v).__name__} parameter")
        name, options = self.fake.functions[function]
        self.fake.stream_of(stream)
        self.fake.kernels.append((name, grid, block, options))
        self.fake.driver_calls += 1

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        import ctypes
        self.fake.stream_of(stream)
        ctypes.memmove(dst, src, nbytes)
        FakeCupy.host_transfers.append(("memcpy", FakeCupy.by_pointer[dst].shape))
        self.fake.driver_calls += 1

    def record(self, stream: int):
        ev = self.fake.cuda.Event(block=True, disable_timing=True)
        ev.record(self.fake.stream_of(stream))
        self.fake.driver_calls += 1
        return ev


def pinned_stand_in() -> types.SimpleNamespace:
    """cupyx's pinned host arrays: plain numpy ones."""
    return types.SimpleNamespace(empty_pinned=lambda shape, dtype=np.float64: np.empty(shape, dtype))


@contextlib.contextmanager
def stand_in(delay_us: int | None = None, driver: bool = True):
    """The stand-in in place of CuPy for the CUDA backend inside the ``with`` (then the real
    one, or none, again); each "device" item takes ``delay_us`` (default 20) after the one
    before it on its stream, so completions arrive asynchronously, from the lanes' waiters.
    ``driver``: with ``FakeDriver`` as the GIL-keeping driver calls (else without any, as
    where libcuda cannot be bound through ctypes)."""
    import executor.backends.cuda as cuda_backend
    saved = cuda_backend.cupy, getattr(cuda_backend, "cupyx", None), cuda_backend.load_driver
    fake = FakeCupy(delay_ns=(20 if delay_us is None else delay_us) * 1000)
    cuda_backend.cupy, cuda_backend.cupyx = fake, pinned_stand_in()
    cuda_backend.load_driver = (lambda: FakeDriver(fake)) if driver else (lambda: None)
    try:
        yield fake
    finally:
        cuda_backend.cupy, cuda_backend.cupyx, cuda_backend.load_driver = saved


def install(monkeypatch, delay_ns: int = 50_000, driver: bool = True) -> FakeCupy:
    """``stand_in`` for a test (``monkeypatch`` undoes it)."""
    import executor.backends.cuda as cuda_backend
    fake = FakeCupy(delay_ns)
    monkeypatch.setattr(cuda_backend, "cupy", fake, raising=False)
    monkeypatch.setattr(cuda_backend, "cupyx", pinned_stand_in(), raising=False)
    monkeypatch.setattr(cuda_backend, "load_driver", (lambda: FakeDriver(fake)) if driver else (lambda: None))
    return fake
