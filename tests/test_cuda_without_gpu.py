"""The CUDA backend's control flow on a stand-in for CuPy (``fake_cupy``): no GPU needed.

What only a GPU shows (kernels compiled and run, coalescing, CUDA-aware MPI) is in
``test_cuda.py``.  Here: work is enqueued from the executor's thread when the lane
allows it, in the lane's order, completions arrive as notifications from the lane's
waiter once the "device" finished, or, with the driver, the executor keeps what it
enqueued and asks the device about the oldest item of each lane (``keep_waits``),
failures reach the work's completion and skip dependent work, and whole programs
compute the right values.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import celeritas as cl
from executor.backends.backend import Lane

import fake_cupy
from device_queue_checks import check_failed_enqueue_skips_dependent_work, notifying, wait_notified

LANE = Lane("device", 0, 0)
TIMEOUT = 10.0


@pytest.fixture(params=[True, False], ids=["driver", "cupy-only"])
def fake(monkeypatch, request):
    """With the GIL-keeping driver calls (as on a GPU), and without (libcuda not bound)."""
    return fake_cupy.install(monkeypatch, delay_ns=20_000_000, driver=request.param)   # 20 ms per item


@pytest.fixture
def backend(fake):
    from executor.backends.cuda import CudaBackend
    b = notifying(CudaBackend([0]))
    yield b
    b.close()


def _wait_notified(backend, c) -> None:
    wait_notified(backend, c, TIMEOUT)


def test_an_idle_lane_enqueues_on_the_calling_thread_and_its_waiter_notifies_once_the_device_is_done(backend):
    ran_on = []
    c = backend.enqueue_now(LANE, lambda: ran_on.append(threading.current_thread()))
    assert c is not None and c.notifying
    assert ran_on == [threading.current_thread()]          # no hand-off to the lane's worker
    assert not c.is_done()                                 # the "device" still runs it (20 ms)
    assert c not in backend.notified
    _wait_notified(backend, c)
    assert c.is_done() and c.error() is None
    assert c.cpu_ns is not None and c.start_ns <= c.end_ns


def test_a_lane_busy_on_its_worker_keeps_its_order(backend):
    """Work enqueued from the caller must not overtake work the worker still holds: after a
    bounded wait for the worker, ``enqueue_now`` declines (the caller then launches behind it)."""
    order = []
    gate = threading.Event()
    first = backend.launch(LANE, lambda: (gate.wait(TIMEOUT), order.append("worker")))
    assert backend.enqueue_now(LANE, lambda: order.append("direct")) is None
    assert order == []
    gate.set()
    _wait_notified(backend, first)
    second = backend.enqueue_now(LANE, lambda: order.append("direct"))
    assert second is not None and order == ["worker", "direct"]
    assert second._event.at > first._event.at              # behind it on the stream
    _wait_notified(backend, second)


def test_a_failed_enqueue_fails_its_completion_and_dependent_work_on_the_lane_is_skipped(backend):
    check_failed_enqueue_skips_dependent_work(backend, LANE)


def _track_queries(monkeypatch, fake) -> list:
    """Per event query, whether an event recorded before it on the same stream was still
    unfinished then (a query behind a lane's first unfinished item: wasted)."""
    events = fake.cuda.Event
    plain_record, plain_done = events.record, events.done.fget
    behind: list = []

    def record(self, stream=None):
        plain_record(self, stream)
        s = stream or fake.current_stream()
        self._before = list(getattr(s, "_recorded", ()))
        s._recorded = self._before + [self]

    def done(self):
        now = time.perf_counter_ns()
        behind.append(any(e.at > now for e in getattr(self, "_before", ())))
        return plain_done(self)

    monkeypatch.setattr(events, "record", record)
    monkeypatch.setattr(events, "done", property(done))
    return behind


@pytest.mark.parametrize("driver", [True, False])
@pytest.mark.parametrize("devices", ["cuda", "cuda:0,0"])
def test_wave_sim_on_the_cuda_backend_matches_numpy_and_events_are_asked_only_at_a_lanes_head(
        monkeypatch, devices, driver):
    fake = fake_cupy.install(monkeypatch, delay_ns=30_000, driver=driver)
    behind = _track_queries(monkeypatch, fake)
    from apps import wave_sim
    q = cl.Queue(devices=devices)
    assert q.runtime.backend_name == "cuda"
    np.testing.assert_allclose(wave_sim.run(q, 40, 8), wave_sim.reference(40, 8), rtol=1e-6, atol=1e-6)
    q.shutdown()
    if driver:
        # the executor asked about what it enqueued itself (the driver's query keeps the GIL),
        # never about an item behind an unfinished one on its stream (a burst of eagerly
        # queued kernels would cost a query each, every look)
        assert fake.queries == len(behind) > 0
        assert not any(behind)
    else:
        # CuPy's query gives the GIL away: completions came from the waiters alone
        assert fake.queries == 0


def test_kept_completions_are_taken_in_lane_order_and_passed_to_the_waiters_before_a_sleep(backend, fake):
    """``keep_waits``: the executor's look asks the device about each lane's oldest item
    only; what the device finished comes back in order; what is left goes to the waiters,
    which notify as before."""
    kept = backend.keep_waits()
    if backend._driver is None:
        assert kept is None                 # (CuPy's event query gives the GIL away)
        return
    other = Lane("device", 0, 1)
    a = [backend.enqueue_now(LANE, lambda: None, direct=True) for _ in range(3)]
    b = backend.enqueue_now(other, lambda: None, direct=True)
    assert [c for _lane, c in kept] == [*a, b]
    queries = fake.queries
    assert backend.take_finished() == []          # 20 ms per item: nothing done yet
    assert fake.queries - queries == 2            # one question per lane, not per item
    time.sleep(0.025)                   # a[0] and b are done, a[1] is not
    assert backend.take_finished() == [a[0], b]
    assert [c for _lane, c in kept] == a[1:]
    assert a[0].error() is None and a[0].end_ns >= a[0].start_ns
    backend.pass_kept_on()
    assert kept == []
    for c in a[1:]:
        _wait_notified(backend, c)
    assert a[0] not in backend.notified and b not in backend.notified


def test_a_kept_completion_whose_event_query_fails_carries_the_error(backend, fake):
    kept = backend.keep_waits()
    if kept is None:
        return
    c = backend.enqueue_now(LANE, lambda: None, direct=True)

    class Fault(RuntimeError):
        pass

    class Broken:
        @property
        def done(self):
            raise Fault("illegal address")

    c._event = Broken()
    assert backend.take_finished() == [c]
    assert isinstance(c.error(), Fault) and kept == []


@pytest.mark.parametrize("delay_us", [0, 5_000])
def test_a_program_whose_kernels_outlast_the_hosts_work_ends_through_the_waiters(monkeypatch, delay_us):
    """With items of 5 ms the executor runs out of work while the device runs, passes what
    it kept to the waiters and sleeps; with none it finds everything done at its looks."""
    from executor.backends.device_queue import DeviceQueueBackend
    fake = fake_cupy.install(monkeypatch, delay_ns=delay_us * 1000, driver=True)
    passed = []
    plain = DeviceQueueBackend.pass_kept_on
    monkeypatch.setattr(DeviceQueueBackend, "pass_kept_on",
                        lambda self: (passed.extend(c for _lane, c in self.kept), plain(self))[1])
    q = cl.Queue(devices="cuda")
    up = cl.Buffer(np.zeros((16, 8), np.float32))
    u = cl.Buffer(np.ones((16, 8), np.float32))
    _source_steps(q, up, u, 6)
    out = q.fence(u).result()
    q.shutdown()
    np.testing.assert_array_equal(out, np.ones((16, 8), np.float32))   # (the stand-in's kernels compute nothing)
    assert len([k for k in fake.kernels if k[0] == "step"]) == 6
    # the executor sleeps only after a look that found nothing done: with items that take no
    # time it never passes one on; with 5 ms ones it does (and the waiters notify them)
    assert (len(passed) > 0) == (delay_us > 0)
    assert all(c.is_done() for c in passed)


def test_source_kernels_launch_with_the_last_index_dimension_along_x(monkeypatch):
    fake = fake_cupy.install(monkeypatch, delay_ns=10_000)
    k = cl.Kernel(source={"cuda": "extern \"C\" __global__ void fill(CHUNK_PARAMS, ACCESSOR(float, y)) {}"},
                  name="fill")
    q = cl.Queue(devices="cuda")
    y = cl.Buffer(shape=(64, 100), dtype=np.float32)

    def cgf(cgh):
        cgh.parallel_for((64, 100), k, args=(y.access(cgh, cl.one_to_one(), cl.discard_write),))

    for _ in range(3):
        q.submit(cgf)
    q.wait()
    q.shutdown()
    launches = [x for x in fake.kernels if x[0] == "fill"]
    assert len(launches) == 3
    assert all(x[1:] == ((4, 8, 1), (32, 8, 1), ("-D__CL_AXIS_X=1", "-D__CL_AXIS_Y=0",
                                                  "-D__CL_AXIS_Z=3")) for x in launches)


def test_a_gpu_listed_twice_gives_two_logical_devices_that_share_its_memory(fake):
    """``cuda:0,0`` (as ``opencl:0:0,0:0``): two device lanes and memories on one GPU, which is
    how one GPU runs a multi-device decomposition; out-of-core planning gives each half."""
    from celeritas.config import DeviceSpec
    from executor.backends.cuda import CudaBackend
    assert DeviceSpec.parse("cuda:0,0").ids == (0, 0)
    b = CudaBackend([0, 0])
    try:
        info = b.backend_info()
        assert info.num_devices == 2
        assert info.capacities == {2: (8 << 30) // 2, 3: (8 << 30) // 2}
        assert (2, 3) in info.copy_pairs and (3, 2) in info.copy_pairs      # same GPU: direct copies
    finally:
        b.close()


@pytest.mark.parametrize("box, direct", [
    (((2, 0), (5, 8)), True),       # whole rows of the allocation: contiguous on both sides
    (((2, 3), (5, 6)), False),      # a column band: strided, through a contiguous temporary
])
def test_host_device_copies_go_straight_into_a_contiguous_target(fake, box, direct):
    """A contiguous device target takes the host data with one ``set``, a contiguous host
    target the device data with one ``get(out=...)`` (pinned memory: no pageable temporary,
    no synchronisation on the enqueueing thread); a strided target still gets its values
    through a temporary.  Both directions, with allocations whose extents differ from the
    copied box (views into larger arrays)."""
    from executor.backends.cuda import CudaBackend
    from scheduler.geometry import Box
    b = notifying(CudaBackend([0]))
    try:
        ext_host, ext_dev = Box((0, 0), (6, 8)), Box((1, 0), (7, 8))
        host = np.arange(48, dtype=np.float32).reshape(6, 8)
        dev = fake.zeros((6, 8), np.float32)
        bx = Box(*box)
        (y0, x0), (y1, x1) = box
        fake_cupy.FakeCupy.host_transfers.clear()
        c = b.copy(host, ext_host, dev, ext_dev, bx, LANE)
        _wait_notified(b, c)
        assert c.error() is None
        want = np.zeros((6, 8), np.float32)
        want[y0 - 1:y1 - 1, x0:x1] = host[y0:y1, x0:x1]
        np.testing.assert_array_equal(np.asarray(dev), want)

        back = np.full((6, 8), -1, np.float32)
        c = b.copy(dev, ext_dev, back, ext_host, bx, LANE)
        _wait_notified(b, c)
        assert c.error() is None
        want_back = np.full((6, 8), -1, np.float32)
        want_back[y0:y1, x0:x1] = host[y0:y1, x0:x1]
        np.testing.assert_array_equal(back, want_back)
        shape = (y1 - y0, x1 - x0)
        assert fake_cupy.FakeCupy.host_transfers == ([("set", shape), ("get", shape)] if direct else [])
    finally:
        b.close()


@pytest.mark.parametrize("box, direct", [(((2, 0), (5, 8)), True), (((2, 3), (5, 6)), False)])
def test_device_to_device_copies_of_whole_rows_are_one_memory_copy(fake, box, direct):
    """A contiguous box between two device allocations (a halo row) is one
    ``copy_from_device_async`` (a ``cudaMemcpyAsync`` on the GPU) instead of CuPy's strided
    copy kernel; a strided box keeps the kernel.  The values land either way."""
    from executor.backends.cuda import CudaBackend
    from scheduler.geometry import Box
    b = notifying(CudaBackend([0]))
    try:
        ext_a, ext_b = Box((0, 0), (6, 8)), Box((1, 0), (7, 8))
        a = np.arange(48, dtype=np.float32).reshape(6, 8).view(fake_cupy.ndarray)
        other = fake.zeros((6, 8), np.float32)
        fake_cupy.FakeCupy.host_transfers.clear()
        c = b.copy(a, ext_a, other, ext_b, Box(*box), LANE)
        _wait_notified(b, c)
        assert c.error() is None
        (y0, x0), (y1, x1) = box
        want = np.zeros((6, 8), np.float32)
        want[y0 - 1:y1 - 1, x0:x1] = np.asarray(a)[y0:y1, x0:x1]
        np.testing.assert_array_equal(np.asarray(other), want)
        assert fake_cupy.FakeCupy.host_transfers == ([("memcpy", (y1 - y0, x1 - x0))] if direct else [])
    finally:
        b.close()


WAVE_SOURCE = cl.Kernel(source={"cuda": "extern \"C\" __global__ void step(CHUNK_PARAMS, ACCESSOR(float, up), "
                                        "ACCESSOR(float, u), float a) {}"}, name="step")


def _source_steps(q, up, u, steps: int) -> None:
    for s in range(steps):
        def cgf(cgh, up=up, u=u):
            w = up.access(cgh, cl.one_to_one(), cl.read_write)
            r = u.access(cgh, cl.neighborhood(1, 1, shape="along_axes"), cl.read)
            cgh.parallel_for(up.shape, WAVE_SOURCE, args=(w, r, np.float32(s)))
        q.submit(cgf)
        up, u = u, up


@pytest.mark.parametrize("driver", [True, False])
def test_source_kernels_and_halo_rows_are_enqueued_without_cupys_contexts(monkeypatch, driver):
    """With the driver, a step of source kernels and whole-row halo copies (``cuda:0,0``)
    enqueues through the GIL-keeping calls alone: no CuPy device or stream context is
    entered (each asks CUDA for the current device with the GIL released), the lane's
    device is made current through the driver, and every item gets a driver event."""
    fake = fake_cupy.install(monkeypatch, delay_ns=10_000, driver=driver)
    entered = []
    stream_cls = fake.cuda.Stream
    plain_enter = stream_cls.__enter__
    monkeypatch.setattr(stream_cls, "__enter__", lambda self: (entered.append(self), plain_enter(self))[1])
    q = cl.Queue(devices="cuda:0,0")
    up = cl.Buffer(np.zeros((32, 16), np.float32))
    u = cl.Buffer(np.ones((32, 16), np.float32))
    _source_steps(q, up, u, 2)
    q.wait()
    entered.clear()
    fake.kernels.clear()
    fake_cupy.FakeCupy.host_transfers.clear()
    calls = fake.driver_calls
    _source_steps(q, up, u, 6)
    q.wait()
    be = q.runtime.backend
    q.shutdown()
    kernels = [k for k in fake.kernels if k[0] == "step"]
    memcpys = [t for t in fake_cupy.FakeCupy.host_transfers if t[0] == "memcpy"]
    assert len(kernels) == 12 and len(memcpys) == 12       # 2 chunks and 2 halo rows per step
    assert all(t[1] == (1, 16) for t in memcpys)
    if driver:
        # launches, copies and one event each
        assert fake.driver_calls - calls == 2 * (len(kernels) + len(memcpys))
        assert entered == []
        assert set(be._driver.devices_used) == {0}
    else:
        assert fake.driver_calls == calls == 0
        assert len(entered) >= len(kernels)


def test_the_driver_packs_each_kernel_parameter_into_its_own_8_byte_slot():
    """``CudaDriver.launch`` hands ``cuLaunchKernel`` an array of pointers to the values, each
    in an 8-byte slot: 4-byte scalars in the slot's first bytes, pointers and 8-byte scalars
    whole.  Checked against ctypes stand-ins for libcuda, reading the memory the driver would."""
    import ctypes
    import types

    from executor.backends.cuda_driver import CudaDriver, DriverError
    seen = {}

    def cu_launch(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        arr = (ctypes.c_void_p * 7).from_address(params)
        seen["slots"] = [ctypes.string_at(arr[i], 8) for i in range(7)]
        seen["rest"] = (f, gx, gy, gz, bx, by, bz, shmem, stream, extra)
        return 0 if f != 13 else 1

    def error_name(rc, out):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_char_p))[0] = b"CUDA_ERROR_INVALID_VALUE"
        return 0

    lib = types.SimpleNamespace(**{name: (lambda *a: 0) for name in (
        "cuMemcpyAsync", "cuEventCreate", "cuEventRecord", "cuEventQuery", "cuEventDestroy_v2",
        "cuEventSynchronize", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuDeviceGet", "cuDevicePrimaryCtxRetain")})
    lib.cuLaunchKernel = cu_launch
    lib.cuGetErrorName = error_name
    drv = CudaDriver(lib, lib)
    values = [np.int64(-3), 0x7F00_1234_5678, np.float32(1.5), np.int32(7), np.float64(2.25), 0, np.int64(1 << 40)]
    drv.launch(12, (4, 2, 1), (32, 8, 1), 99, values, "kernel 'k'")
    want = [np.int64(-3).tobytes(), (0x7F00_1234_5678).to_bytes(8, "little"),
            np.float32(1.5).tobytes() + bytes(4), np.int32(7).tobytes() + bytes(4),
            np.float64(2.25).tobytes(), bytes(8), np.int64(1 << 40).tobytes()]
    assert seen["slots"] == want
    assert seen["rest"] == (12, 4, 2, 1, 32, 8, 1, 0, 99, None)
    with pytest.raises(DriverError, match=r"kernel 'k' failed: CUDA_ERROR_INVALID_VALUE \(1\)"):
        drv.launch(13, (1, 1, 1), (1, 1, 1), 99, values, "kernel 'k'")
    with pytest.raises(DriverError, match="complex128 has no CUDA counterpart"):
        drv.launch(12, (1, 1, 1), (1, 1, 1), 99, [np.complex128(1)], "kernel 'k'")


def test_a_launch_the_driver_refuses_fails_the_task_naming_the_kernel(monkeypatch):
    from executor.backends.cuda_driver import DriverError
    fake = fake_cupy.install(monkeypatch, delay_ns=10_000)
    plain = fake_cupy.FakeDriver.launch

    def refuse(self, function, grid, block, stream, values, what):
        if fake.functions[function][0] == "step":
            raise DriverError(f"{what} failed: CUDA_ERROR_INVALID_VALUE (1)")
        return plain(self, function, grid, block, stream, values, what)

    monkeypatch.setattr(fake_cupy.FakeDriver, "launch", refuse)
    q = cl.Queue(devices="cuda")
    up = cl.Buffer(np.zeros((8, 8), np.float32))
    u = cl.Buffer(np.ones((8, 8), np.float32))
    _source_steps(q, up, u, 1)
    with pytest.raises(cl.CeleritasError, match=r"'step'.*CUDA_ERROR_INVALID_VALUE.*task T\d+, rank 0"):
        q.wait()
    q.shutdown()


def test_the_drivers_arguments_are_source_kernel_arguments_with_pointers(fake):
    """``driver_arguments`` (the driver's fast path) marshals exactly what the generic
    ``source_kernel_arguments`` does with integer pointers: every scalar type, an accessor
    that maps nothing, one whose allocation holds more than the chunk; an unusual type
    takes the generic path and a wrong one fails the same way."""
    import types

    from executor.backends.backend import BackendError, source_kernel_arguments
    from executor.backends.cuda import _pointer, driver_arguments
    from scheduler.geometry import Box
    from scheduler.instruction_graph import AccessorArg
    arr = fake.zeros((6, 8), np.float32)
    ctx = types.SimpleNamespace(box=Box((2, 0), (4, 8)), arrays=[arr, None],
                                accesses=[types.SimpleNamespace(allocation_box=Box((1, 0), (7, 8))),
                                          types.SimpleNamespace(allocation_box=None)])
    scalars = (True, np.bool_(False), 3, 2.5, np.int64(-4), np.int32(5), np.uint8(6), np.float32(0.5),
               np.float64(1.25), np.float16(0.75), np.uint64(7), np.int16(-2))
    for args in [(AccessorArg(0, "a"), AccessorArg(1, "b")) + scalars, scalars[::-1] + (AccessorArg(1, "b"),), ()]:
        want = source_kernel_arguments("k", ctx, args, _pointer, cache={})
        got = driver_arguments("k", ctx, args, {})
        assert got == want and [type(v) for v in got] == [type(v) for v in want]
    for bad in ("x", None, 1j):
        with pytest.raises(BackendError, match="neither an accessor nor a scalar"):
            driver_arguments("k", ctx, (AccessorArg(0, "a"), bad), {})


@pytest.mark.parametrize("value", [1 + 2j, np.complex64(1 + 2j), np.complex128(-0.5j)])
def test_a_complex_scalar_for_a_cuda_source_kernel_is_refused_at_submit(fake, value):
    """CUDA source kernels take real scalars and pointers; a complex scalar used to fail at
    launch, on the executor, as "neither an accessor nor a scalar"."""
    q = cl.Queue(devices="cuda")
    y = cl.Buffer(np.zeros((8, 8), np.float32))

    def cgf(cgh):
        cgh.parallel_for((8, 8), WAVE_SOURCE, args=(y.access(cgh, cl.one_to_one(), cl.read_write),
                                                    y.access(cgh, cl.one_to_one(), cl.read), value))

    with pytest.raises(cl.CeleritasError, match=r"kernel 'step': args\[2\] is the complex scalar .* two arguments"):
        q.submit(cgf)
    q.shutdown()
