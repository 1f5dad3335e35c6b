"""The OpenCL backend (PoCL on the CPU in CI): the same programs, plus device source kernels."""

import threading
import time

import numpy as np
import pytest

import celeritas as cl
from celeritas.testing import run_cluster

pyopencl = pytest.importorskip("pyopencl")
from executor.backends.opencl import opencl_devices  # noqa: E402

from device_queue_checks import check_failed_enqueue_skips_dependent_work, notifying, wait_notified  # noqa: E402

try:
    opencl_devices()
    HAVE_DEVICE = True
except Exception as exc:  # noqa: BLE001
    HAVE_DEVICE = False
    REASON = str(exc)

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not HAVE_DEVICE, reason="no OpenCL device that builds kernels "
                                 "(apt-get install pocl-opencl-icd)" if not HAVE_DEVICE else "")]

SCALE = cl.Kernel(source={"opencl": """
__kernel void scale(CHUNK_PARAMS, ACCESSOR(float, src), ACCESSOR(float, dst), float f) {
    long i = GID(0), j = GID(1);
    AT2(dst, i, j) = f * AT2(src, i, j) + i * 100 + j;
}"""}, name="scale")


@pytest.fixture(autouse=True)
def _pocl_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "pocl"))


@pytest.mark.parametrize("devices", ["opencl", "opencl:0:0,0:0"])
def test_apps_on_opencl(devices):
    from apps import matmul, wave_sim
    q = cl.Queue(devices=devices)
    assert q.runtime.backend_name == "opencl"
    np.testing.assert_array_equal(wave_sim.run(q, 32, 5), wave_sim.reference(32, 5))
    a, b = matmul.inputs(24)
    np.testing.assert_array_equal(matmul.run(q, 24), a @ b)
    q.shutdown()


@pytest.mark.parametrize("devices", ["opencl", "opencl:0:0,0:0"])
def test_source_kernel_indexes_in_global_coordinates(devices):
    q = cl.Queue(devices=devices)
    x = cl.Buffer(np.arange(64, dtype=np.float32).reshape(8, 8))
    y = cl.Buffer(shape=(8, 8), dtype=np.float32)

    def cgf(cgh):
        r = x.access(cgh, cl.one_to_one(), cl.read)
        w = y.access(cgh, cl.one_to_one(), cl.discard_write)
        cgh.parallel_for((8, 8), SCALE, args=(r, w, np.float32(2.0)))

    q.submit(cgf)
    i, j = np.mgrid[0:8, 0:8]
    want = 2 * np.arange(64, dtype=np.float32).reshape(8, 8) + i * 100 + j
    np.testing.assert_array_equal(q.fence(y).result(), want)
    q.shutdown()


def test_source_kernel_on_simulated_cluster():
    def program(rank):
        q = cl.Queue()
        x = cl.Buffer(np.ones((8, 8), np.float32))
        y = cl.Buffer(shape=(8, 8), dtype=np.float32)

        def cgf(cgh):
            r = x.access(cgh, cl.one_to_one(), cl.read)
            w = y.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((8, 8), SCALE, args=(r, w, np.float32(3.0)))

        q.submit(cgf)
        return q.fence(y).result()

    i, j = np.mgrid[0:8, 0:8]
    for res in run_cluster(program, nodes=2, CELERITAS_DEVICES="opencl"):
        np.testing.assert_array_equal(res, 3 + i * 100 + j)


def test_source_kernel_on_host_backend_is_a_clear_error():
    q = cl.Queue(devices="host:1")
    y = cl.Buffer(shape=(4, 4), dtype=np.float32)

    def cgf(cgh):
        w = y.access(cgh, cl.one_to_one(), cl.discard_write)
        cgh.parallel_for((4, 4), SCALE, args=(w, w, 1.0))

    with pytest.raises(cl.CeleritasError, match="runs only Python kernels"):
        q.submit(cgf)
    q.shutdown()


def test_build_error_names_the_kernel():
    bad = cl.Kernel(source={"opencl": "__kernel void broken(CHUNK_PARAMS, ACCESSOR(float, a)) { syntax error }"}, name="broken")
    q = cl.Queue(devices="opencl")
    y = cl.Buffer(shape=(4,), dtype=np.float32)

    def cgf(cgh):
        w = y.access(cgh, cl.one_to_one(), cl.discard_write)
        cgh.parallel_for((4,), bad, args=(w,))

    q.submit(cgf)
    with pytest.raises(cl.CeleritasError, match="broken"):
        q.wait()


def test_heterogeneous_ranks_opencl_and_host():
    """Ranks of one job may use different backends; data moves between them as usual."""
    from apps import matmul, wave_sim

    def program(rank):
        q = cl.Queue(devices="opencl" if rank == 0 else "host:2")
        backend = q.runtime.backend_name
        w = wave_sim.run(q, 32, 6)
        m = matmul.run(q, 24)
        return backend, w, m

    res = run_cluster(program, nodes=2)
    assert [r[0] for r in res] == ["opencl", "host"]
    a, b = matmul.inputs(24)
    for _backend, w, m in res:
        np.testing.assert_array_equal(w, wave_sim.reference(32, 6))
        np.testing.assert_array_equal(m, a @ b)


IOTA = cl.Kernel(source={"opencl": """
__kernel void iota(CHUNK_PARAMS, ACCESSOR(int, dst)) {
    long i = GID(0);
    AT1(dst, i) = (int)i * 3 + (int)get_local_id(0);
}"""}, name="iota")


@pytest.mark.parametrize("nodes,devices", [(3, "opencl"), (1, "opencl:0:0,0:0"), (2, "opencl:0:0,0:0")])
def test_local_range_chunks_are_whole_work_groups_on_opencl(nodes, devices):
    """320 items in work groups of 32: on 3 ranks the chunks are 128/96/96, never a partial group
    (which OpenCL rejects with INVALID_WORK_GROUP_SIZE)."""
    def program(rank):
        q = cl.Queue()
        y = cl.Buffer(shape=(320,), dtype=np.int32)

        def cgf(cgh):
            w = y.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((320,), IOTA, args=(w,), local_range=(32,))

        q.submit(cgf)
        return q.fence(y).result()

    i = np.arange(320)
    for res in run_cluster(program, nodes=nodes, CELERITAS_DEVICES=devices):
        np.testing.assert_array_equal(res, i * 3 + i % 32)


def test_launches_alternating_between_buffers_get_their_own_arguments():
    """The backend skips set_args when a queue's kernel object already holds a launch's
    arguments; launches with the same chunk and scalars on other buffers must not be taken
    for repeats.  Two pairs alternate; each destination is zeroed in between, so a launch
    that wrote the other pair's destination would leave zeros behind."""
    q = cl.Queue(devices="opencl")
    pairs = [(cl.Buffer(np.arange(64, dtype=np.float32).reshape(8, 8) * s), cl.Buffer(shape=(8, 8), dtype=np.float32))
             for s in (1.0, -1.0)]

    def scale(x, y):
        def cgf(cgh):
            r = x.access(cgh, cl.one_to_one(), cl.read)
            w = y.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((8, 8), SCALE, args=(r, w, np.float32(2.0)))
        q.submit(cgf)

    def zero(y):
        def cgf(cgh):
            w = y.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((8, 8), lambda chunk: w.__setitem__(chunk, 0.0), name="zero")
        q.submit(cgf)

    i, j = np.mgrid[0:8, 0:8]
    for _ in range(3):
        for s, (x, y) in zip((1.0, -1.0), pairs):
            zero(y)
            scale(x, y)
        for s, (x, y) in zip((1.0, -1.0), pairs):
            np.testing.assert_array_equal(q.fence(y).result(),
                                          2 * s * np.arange(64, dtype=np.float32).reshape(8, 8) + i * 100 + j)
    q.shutdown()


def test_device_arrays_are_page_aligned_and_large_ones_huge_page_aligned():
    """USE_HOST_PTR wants page-aligned host memory; from 2 MiB up it is on huge-page boundaries
    (``host_empty``), and either way it is an ``OclArray`` that can carry its cl buffer."""
    from executor.backends.host import HUGE_PAGE
    from executor.backends.opencl import OclArray, _aligned_empty
    small = _aligned_empty((3, 5), np.float32)
    large = _aligned_empty((1024, 1024), np.float32)
    assert isinstance(small, OclArray) and isinstance(large, OclArray)
    assert small.ctypes.data % 4096 == 0 and large.ctypes.data % HUGE_PAGE == 0
    assert small.shape == (3, 5) and large.shape == (1024, 1024) and large.dtype == np.float32
    large[...] = 2
    assert large.sum() == 2 * 1024 * 1024


@pytest.mark.parametrize("source, name, args, match", [
    ("__kernel void k(__global float* a, int n) { a[0] = n; }", "k", "acc",
     r"kernel 'k' has 2 parameters, but its arguments make 13: CHUNK_PARAMS \(6\), 1 accessor"),
    ("__kernel void k(CHUNK_PARAMS) { }", "other", "",
     r"kernel 'other': its OpenCL source defines no __kernel named 'other'"),
    ("__kernel void k(CHUNK_PARAMS, int n) { }", "k", "object", r"kernel 'k': args\[0\] is <object .*> of type object: a source kernel takes accessors and scalars"),
    ("__kernel void k(CHUNK_PARAMS) { syntax error }", "k", "", r"(?s)OpenCL kernel 'k' failed to build.*undeclared identifier 'syntax'"),
])
def test_source_kernel_mistakes_are_backend_errors_naming_the_kernel(source, name, args, match):
    """A BackendError is a cl.CeleritasError (cl.BackendError), with the task and chunk added."""
    q = cl.Queue(devices="opencl")
    b = cl.Buffer(np.zeros(4, np.float32))
    kernel = cl.Kernel(source={"opencl": source}, name=name)

    def cgf(cgh):
        acc = b.access(cgh, cl.one_to_one(), cl.write)
        a = {"acc": (acc,), "object": (object(),), "": ()}[args]
        cgh.parallel_for((4,), kernel, args=a)

    with pytest.raises(cl.BackendError, match=match) as ei:
        q.submit(cgf)
        q.wait()
    assert isinstance(ei.value, cl.CeleritasError)


def test_a_source_kernel_on_a_buffer_of_non_native_byte_order_is_an_error():
    """The device read the big-endian floats' bytes as its own: 0, 4.25e37, -0, ... instead of
    0, 2, 4, ... silently.  Python kernels on the same buffer stay exact."""
    q = cl.Queue(devices="opencl")
    try:
        b = cl.Buffer(np.arange(16, dtype=">f4").reshape(4, 4), name="big_endian")

        def source(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for((4, 4), SCALE, args=(w, w, 2.0))

        with pytest.raises(cl.CeleritasError, match=r"kernel 'scale': buffer B0 \"big_endian\" has the non-native "
                                                    r"byte order dtype >f4, which device source code would misread; "
                                                    r"make the buffer from data.astype\('<f4'\)"):
            q.submit(source)

        def python(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for((4, 4), lambda c: w.__setitem__(c, w[c] * 2), name="double")
        q.submit(python)
        assert q.fence(b).result().tolist() == (np.arange(16).reshape(4, 4) * 2).tolist()
    finally:
        q.shutdown()


# ---- source kernels enqueued by the executor (enqueue_now), waited for by the lane's waiter

SLOW = cl.Kernel(source={"opencl": """
__kernel void slow(CHUNK_PARAMS, ACCESSOR(float, x), int rounds) {
    long i = GID(0);
    float s = AT1(x, i);
    for (int r = 0; r < rounds; r++) s = s * 0.5f + 1.0f;
    AT1(x, i) += 1.0f + 0.0f * s;   /* (the loop's result kept alive: 0 * s is not folded for floats) */
}"""}, name="slow")
SLOW_ROUNDS = 200_000           # ~10-50 ms per launch of 4096 items on PoCL: far above the inline threshold


def test_long_source_kernels_are_enqueued_by_the_executor_and_completed_by_the_lane_waiter(monkeypatch):
    """A source kernel too long to run inline used to go to the lane's worker, which enqueued
    it and waited: each launch then needed that thread to wake up, which on a CPU device waits
    for a core behind the other device's kernel (bench_opencl's wave_sim lost 10-20 % that
    way).  Now the executor enqueues it and the lane's waiter waits for its event; the
    kernel's cost estimate still counts the device's time, so it never runs inline."""
    from executor.backends.opencl import OpenCLBackend
    direct = []
    original = OpenCLBackend.enqueue_now

    def counting(self, lane, fn, *, dependent=False, **kw):
        c = original(self, lane, fn, dependent=dependent, **kw)
        direct.append(c is not None)
        return c

    monkeypatch.setattr(OpenCLBackend, "enqueue_now", counting)
    q = cl.Queue(devices="opencl")
    try:
        x = cl.Buffer(np.zeros(4096, np.float32), name="x")
        launches = 6
        for _ in range(launches):
            def cgf(cgh):
                a = x.access(cgh, cl.one_to_one(), cl.read_write)
                cgh.parallel_for((4096,), SLOW, args=(a, np.int32(SLOW_ROUNDS)))
            q.submit(cgf)
        np.testing.assert_array_equal(q.fence(x).result(), np.full(4096, launches, np.float32))
        # the first launch (cost unknown) ran inline and measured it; the others went to enqueue_now
        assert len(direct) == launches - 1 and all(direct), direct
        waiters = [t.name for t in threading.enumerate() if t.name.endswith("waiter") or "-waiter" in t.name]
        assert any("lane" in n for n in waiters), waiters
        costs = [v for k, v in q.runtime.executor._costs.items() if type(k) is tuple and k[0] == "slow"]
        assert costs and min(costs) > q.runtime.executor._inline_ns     # the device's time, not the enqueue's
    finally:
        q.shutdown()


@pytest.fixture
def ocl_backend():
    from executor.backends.opencl import OpenCLBackend
    b = notifying(OpenCLBackend())
    yield b
    b.close()


def _enqueue_slow(backend, lane, arr, rounds: int):
    """What a source kernel launch does under enqueue_now: enqueue, and leave the event to the waiter."""
    prg = pyopencl.Program(backend.context_of(lane.device), """
        __kernel void k(__global float* x, int n) {
            float s = x[get_global_id(0)];
            for (int r = 0; r < n; r++) s = s * 0.5f + 1.0f;
            x[get_global_id(0)] += 1.0f + 0.0f * s;
        }""").build()
    buf = backend._buffer(arr, lane.device)
    queue = backend.lane_handle(lane)
    k = pyopencl.Kernel(prg, "k")
    k.set_args(buf, np.int32(rounds))

    def fn():
        ev = pyopencl.enqueue_nd_range_kernel(queue, k, (arr.size,), None)
        backend._enqueue_only.pending.append((ev, queue, []))
    return fn


def test_enqueue_now_returns_before_the_device_finishes_and_the_waiter_notifies_after(ocl_backend):
    from executor.backends.backend import Lane
    from scheduler.instruction_graph import device_memory
    lane = Lane("device", 0, 0)
    arr = ocl_backend.allocate(device_memory(0), (4096,), np.float32)
    arr[...] = 0
    ran_on = []
    enqueue = _enqueue_slow(ocl_backend, lane, arr, SLOW_ROUNDS)

    def fn():
        ran_on.append(threading.current_thread())
        enqueue()

    c = ocl_backend.enqueue_now(lane, fn)
    assert c is not None and c.notifying and ran_on == [threading.current_thread()]
    assert not c.is_done() and c not in ocl_backend.notified      # the device still runs it
    wait_notified(ocl_backend, c)
    assert c.is_done() and c.error() is None
    np.testing.assert_array_equal(arr, 1.0)
    # its cost counts the device's time (the enqueue alone takes microseconds)
    assert c.cpu_ns > 1_000_000


def test_enqueue_now_declines_while_the_lanes_worker_holds_work_and_keeps_the_lanes_order(ocl_backend):
    from executor.backends.backend import Lane
    lane = Lane("device", 0, 0)
    order = []
    gate = threading.Event()
    first = ocl_backend.launch(lane, lambda: (gate.wait(30), order.append("worker")))
    t0 = time.monotonic()
    assert ocl_backend.enqueue_now(lane, lambda: order.append("direct")) is None
    assert time.monotonic() - t0 < 0.5       # no waiting for a worker that holds a kernel for its whole run
    gate.set()
    wait_notified(ocl_backend, first)
    second = ocl_backend.enqueue_now(lane, lambda: order.append("direct"))
    assert second is not None and order == ["worker", "direct"]
    wait_notified(ocl_backend, second)           # (nothing enqueued: done at once, still notified)
    assert second.is_done() and second.error() is None


def test_a_failed_enqueue_now_fails_its_completion_and_skips_dependent_work(ocl_backend):
    from executor.backends.backend import Lane
    check_failed_enqueue_skips_dependent_work(ocl_backend, Lane("device", 0, 0))


def test_copies_back_for_non_cpu_devices_run_on_the_waiter(monkeypatch):
    """On a non-CPU device a source kernel's buffers are written to the device before it and
    read back after it; under enqueue_now the read-back is the waiter's.  (Forced on PoCL's
    CPU device, where it is a copy onto the same memory: the values must come out right.)"""
    q = cl.Queue(devices="opencl")
    try:
        be = q.runtime.backend
        monkeypatch.setattr(be, "_cpu", [False] * len(be._cpu))
        x = cl.Buffer(np.zeros(4096, np.float32), name="x")
        for _ in range(4):
            def cgf(cgh):
                a = x.access(cgh, cl.one_to_one(), cl.read_write)
                cgh.parallel_for((4096,), SLOW, args=(a, np.int32(SLOW_ROUNDS)))
            q.submit(cgf)
        np.testing.assert_array_equal(q.fence(x).result(), np.full(4096, 4.0, np.float32))
    finally:
        q.shutdown()


def test_python_kernels_after_an_enqueued_source_kernel_wait_for_the_device(monkeypatch):
    """With almost nothing inline (CELERITAS_INLINE_US=1) every source kernel is enqueued by the
    executor and left to the lane's waiter.  A Python kernel reading its output on the same
    device must not be queued behind it on the lane's worker, which would run it at once,
    while the kernel still runs on the device (the fuzzer found that: stale values)."""
    monkeypatch.setenv("CELERITAS_INLINE_US", "1")
    q = cl.Queue(devices="opencl")
    try:
        x = cl.Buffer(np.zeros(4096, np.float32), name="x")
        y = cl.Buffer(np.zeros(4096, np.float32), name="y")
        rounds = 6
        for _ in range(rounds):
            def slow(cgh):
                a = x.access(cgh, cl.one_to_one(), cl.read_write)
                cgh.parallel_for((4096,), SLOW, args=(a, np.int32(SLOW_ROUNDS // 4)))
            q.submit(slow)

            def accumulate(cgh):
                r = x.access(cgh, cl.one_to_one(), cl.read)
                w = y.access(cgh, cl.one_to_one(), cl.read_write)
                cgh.parallel_for((4096,), lambda c: w.__setitem__(c, w[c] + r[c]), name="accumulate")
            q.submit(accumulate)
        np.testing.assert_array_equal(q.fence(y).result(), np.full(4096, rounds * (rounds + 1) / 2, np.float32))
    finally:
        q.shutdown()


def test_enqueued_events_synchronize_once_whichever_thread_asks_first(monkeypatch):
    """The waiter and a caller of ``QueueCompletion.wait`` may both synchronize what one
    enqueue_now enqueued: each returns only once the events are done, the copies back to the
    host (non-CPU devices) run once, and it is not done before they ran."""
    from executor.backends import opencl as ocl_mod
    release = threading.Event()
    waits, copies = [], []

    class Ev:
        command_execution_status = 0

        def wait(self):
            waits.append(threading.current_thread().name)
            release.wait(10)
            Ev.command_execution_status = pyopencl.command_execution_status.COMPLETE

    class Done:
        def wait(self):
            pass

    monkeypatch.setattr(ocl_mod.cl, "enqueue_copy", lambda q, dst, src: (copies.append(src), Done())[1])
    e = ocl_mod._Enqueued([(Ev(), None, [("buf", np.zeros(4, np.float32))])])
    assert not e.done
    finished = []
    threads = [threading.Thread(target=lambda: (e.synchronize(), finished.append(1))) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    assert finished == [] and not e.done           # both wait for the device
    release.set()
    for t in threads:
        t.join(10)
    assert finished == [1, 1] and copies == ["buf"] and len(waits) == 1 and e.done
