"""The CUDA backend: runs where CuPy and a GPU are present, skips cleanly elsewhere."""
import numpy as np
import pytest

import celeritas as cl
from celeritas.testing import run_cluster

cupy = pytest.importorskip("cupy")
from executor.backends.cuda import cuda_device_count  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(cuda_device_count() == 0, reason="no CUDA GPU")]

SCALE = cl.Kernel(source={"cuda": """
extern "C" __global__ void scale(CHUNK_PARAMS, ACCESSOR(float, src), ACCESSOR(float, dst), float f) {
    if (!IN_CHUNK()) return;
    long long i = GID(0), j = GID(1);
    AT2(dst, i, j) = f * AT2(src, i, j) + i * 100 + j;
}"""}, name="scale")


@pytest.mark.parametrize("devices", ["cuda", "cuda:0,0"])
def test_apps_on_cuda(devices):
    from apps import matmul, wave_sim
    q = cl.Queue(devices=devices)
    assert q.runtime.backend_name == "cuda"
    np.testing.assert_array_equal(wave_sim.run(q, 64, 5), wave_sim.reference(64, 5))
    a, b = matmul.inputs(64)
    np.testing.assert_array_equal(matmul.run(q, 64), a @ b)
    q.shutdown()


@pytest.mark.parametrize("devices", ["cuda", "cuda:0,0"])
def test_cuda_source_kernel(devices):
    q = cl.Queue(devices=devices)
    x = cl.Buffer(np.arange(64 * 64, dtype=np.float32).reshape(64, 64))
    y = cl.Buffer(shape=(64, 64), dtype=np.float32)

    def cgf(cgh):
        r = x.access(cgh, cl.one_to_one(), cl.read)
        w = y.access(cgh, cl.one_to_one(), cl.discard_write)
        cgh.parallel_for((64, 64), SCALE, args=(r, w, np.float32(2.0)))

    q.submit(cgf)
    i, j = np.mgrid[0:64, 0:64]
    np.testing.assert_array_equal(q.fence(y).result(),
                                  2 * np.arange(64 * 64, dtype=np.float32).reshape(64, 64) + i * 100 + j)
    q.shutdown()


def test_cuda_reduction_and_cluster():
    def program(rank):
        q = cl.Queue()
        buf = cl.Buffer(shape=(1,), dtype=np.int64)

        def cgf(cgh):
            red = cl.reduction(buf, cgh, cl.plus, initialize_to_identity=True)

            @cgh.parallel_for((1000,), offset=(1,), reductions=(red,))
            def k(chunk, r):
                r.combine(chunk.arange(0))

        q.submit(cgf)
        return int(q.fence(buf).result()[0])

    assert run_cluster(program, nodes=2, CELERITAS_DEVICES="cuda:0,0") == [500500, 500500]


def test_strided_device_boxes_are_packed_on_the_device_for_cuda_aware_mpi():
    """What MpiCommunicator hands to a CUDA-aware MPI: contiguous device memory, landed back."""
    from types import SimpleNamespace

    from executor.mpi.wire import DatatypeCache, device_spec
    mpi = SimpleNamespace(BYTE="BYTE")
    types = DatatypeCache(mpi)          # (small messages take no datatype from it)
    alloc = cupy.arange(8 * 10, dtype=cupy.float32).reshape(8, 10)
    view = alloc[2:5, 3:7]                               # a box inside a larger allocation
    spec, keep, finish, nbytes = device_spec(mpi, view, receive=False, types=types)
    assert finish is None and nbytes == 3 * 4 * 4
    assert isinstance(spec[0], cupy.ndarray) and spec[0].flags.c_contiguous
    np.testing.assert_array_equal(cupy.asnumpy(spec[0]), cupy.asnumpy(view))
    spec, keep, finish, nbytes = device_spec(mpi, view, receive=True, types=types)
    spec[0][...] = -1                                    # "MPI" writes the staging buffer
    finish()
    np.testing.assert_array_equal(cupy.asnumpy(alloc[2:5, 3:7]), -np.ones((3, 4), np.float32))
    assert float(alloc[0, 0]) == 0 and float(alloc[7, 9]) == 79   # nothing outside the box
    whole = alloc[4:6]                                   # contiguous rows: passed as they are
    spec, keep, finish, _ = device_spec(mpi, whole, receive=True, types=types)
    assert spec[0] is whole and finish is None


def test_cuda_device_memories_go_to_mpi_only_if_it_is_cuda_aware():
    from types import SimpleNamespace

    from celeritas.runtime import scheduler_system
    from executor.backends.cuda import CudaBackend
    backend = CudaBackend([0, 0])
    try:
        assert {2, 3} <= set(scheduler_system(backend, "auto", SimpleNamespace(cuda_aware=True)).comm_memories)
        assert set(scheduler_system(backend, "auto", SimpleNamespace(cuda_aware=False)).comm_memories) == {0, 1}
        with pytest.raises(cl.ConfigError, match="CUDA support"):
            scheduler_system(backend, "direct", SimpleNamespace(cuda_aware=False))
    finally:
        backend.close()


IDS = cl.Kernel(source={"cuda": """
extern "C" __global__ void ids(CHUNK_PARAMS, ACCESSOR(long long, dst), long long dims) {
    if (!IN_CHUNK()) return;
    long long i = GID(0), j = GID(1), k = GID(2);
    long long v = i * 1000000 + j * 1000 + k;
    if (dims == 1) AT1(dst, i) = v; else if (dims == 2) AT2(dst, i, j) = v; else AT3(dst, i, j, k) = v;
}"""}, name="ids")


@pytest.mark.parametrize("devices", ["cuda", "cuda:0,0"])
@pytest.mark.parametrize("shape, offset, local_range", [
    ((1000,), None, None), ((37, 70), None, None), ((37, 70), (3, 5), None), ((6, 7, 9), None, None),
    ((6, 8, 8), None, (2, 2, 4)), ((4, 64), None, (2, 32)),
    ((600_000, 2), None, None),     # 75000 blocks of 8 rows: more than grid axis y holds, rows go along x
])
def test_every_item_of_a_cuda_source_kernel_sees_its_own_global_index(devices, shape, offset, local_range):
    """The launch runs the last index dimension along thread axis x (coalesced); GID(d) must
    still be index d of the item, with the chunk's and the kernel's offsets, in every chunk."""
    q = cl.Queue(devices=devices)
    dims = len(shape)
    full = tuple(s + (offset[d] if offset else 0) for d, s in enumerate(shape))
    y = cl.Buffer(np.full(full, -1, np.int64))
    kw = {"offset": offset} if offset else {}

    def cgf(cgh):
        w = y.access(cgh, cl.one_to_one(), cl.write)
        cgh.parallel_for(shape, IDS, args=(w, dims), local_range=local_range, **kw)

    q.submit(cgf)
    got = q.fence(y).result()
    idx = np.indices(full, dtype=np.int64)
    want = sum(idx[d] * (1000000, 1000, 1)[d] for d in range(dims))
    if offset:
        inside = tuple(slice(o, None) for o in offset)
        want = np.full(full, -1, np.int64)
        want[inside] = sum(idx[d][inside] * (1000000, 1000, 1)[d] for d in range(dims))
    np.testing.assert_array_equal(got, want)
    q.shutdown()


APP_CLI = {"wave_sim": ["-N", "40", "-T", "6"], "matmul": ["-N", "36"],
           "reduction": ["-N", "33", "-T", "2", "--no-progress"], "nbody": ["-N", "48", "-T", "3", "--no-progress"],
           "jacobi3d": ["-N", "14", "-T", "20", "--no-progress"], "rsim": ["-N", "21", "-T", "9", "--no-progress"],
           "convolution": ["-N", "37", "-T", "2", "--no-progress"]}


@pytest.mark.parametrize("app", sorted(APP_CLI))
def test_every_app_verifies_against_numpy_on_two_cuda_devices(app, tmp_path):
    """Each app's Python kernels run on CuPy arrays of their chunk (``chunk.xp``)."""
    import sys

    import jobs
    argv = [sys.executable, "-m", f"apps.{app}", "--verify", *APP_CLI[app]]
    if app == "convolution":
        argv += ["--output", str(tmp_path / "out.png")]
    r = jobs.run_job(argv, jobs.clean_env({"CELERITAS_DEVICES": "cuda:0,0"}), 180)
    assert r.returncode == 0 and "verified" in r.stdout + r.stderr, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-4000:]}"


@pytest.mark.mpi
@pytest.mark.parametrize("devices, transfers", [("cuda:0,0", "auto"), ("cuda", "staged")])
def test_apps_on_cuda_under_mpiexec_match_the_single_rank_host_result(devices, transfers, tmp_path):
    """Two ranks sharing the GPU: halos leave device memory through MPI (staged through pinned
    host memory unless the MPI is CUDA-aware)."""
    import sys
    from pathlib import Path

    import jobs
    from celeritas import launcher
    mpiexec = launcher.find_mpiexec()
    pytest.importorskip("mpi4py")
    if mpiexec is None:
        pytest.skip("no mpiexec next to the interpreter or on PATH")
    script = Path(__file__).resolve().parent / "mpi_scripts" / "apps_check.py"
    ref, out = tmp_path / "host.npz", tmp_path / "cuda.npz"
    r = jobs.run_job([sys.executable, str(script), str(ref)], jobs.clean_env({"CELERITAS_DEVICES": "host:1"}), 180)
    assert r.returncode == 0, r.stderr[-4000:]
    r = jobs.run_job([mpiexec, "-n", "2", sys.executable, str(script), str(out)],
                     jobs.clean_env({"CELERITAS_DEVICES": devices, "CELERITAS_MPI_DEVICE_MEMORY": transfers}), 240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-6000:]}"
    assert "rank 0/2 MpiCommunicator ok" in r.stdout and "rank 1/2 MpiCommunicator ok" in r.stdout
    want, got = dict(np.load(ref)), dict(np.load(out))
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("box", [((2, 0), (5, 8)), ((2, 3), (5, 6)), ((1, 0), (6, 8))])
def test_host_device_copies_of_contiguous_and_strided_boxes_land_exactly(box):
    """Host (pinned) to device and back, whole rows (one direct transfer each way: ``set``,
    and ``get`` into the host view, asynchronous until the copy's event) and a column band
    (through a contiguous temporary), between allocations whose extents differ."""
    from executor.backends.backend import Lane
    from executor.backends.cuda import CudaBackend
    from scheduler.geometry import Box
    from scheduler.instruction_graph import HOST_MEMORY
    lane = Lane("device", 0, 0)
    b = CudaBackend([0])
    try:
        ext_host, ext_dev = Box((0, 0), (6, 8)), Box((1, 0), (7, 8))
        host = b.allocate(HOST_MEMORY, (6, 8), np.float32)
        host[...] = np.arange(48, dtype=np.float32).reshape(6, 8)
        dev = cupy.zeros((6, 8), np.float32)
        bx = Box(*box)
        (y0, x0), (y1, x1) = box
        assert b.copy(host, ext_host, dev, ext_dev, bx, lane).wait(30)
        want = np.zeros((6, 8), np.float32)
        want[y0 - 1:y1 - 1, x0:x1] = host[y0:y1, x0:x1]
        np.testing.assert_array_equal(cupy.asnumpy(dev), want)
        back = np.full((6, 8), -1, np.float32)
        c = b.copy(dev, ext_dev, back, ext_host, bx, lane)
        assert c.wait(30) and c.error() is None
        want_back = np.full((6, 8), -1, np.float32)
        want_back[y0:y1, x0:x1] = host[y0:y1, x0:x1]
        np.testing.assert_array_equal(back, want_back)
    finally:
        b.close()


@pytest.mark.parametrize("box", [((2, 0), (5, 8)), ((2, 3), (5, 6))])
def test_device_to_device_copies_of_rows_and_columns_land_exactly(box):
    """Whole rows (one ``cudaMemcpyAsync``) and a column band (CuPy's strided copy) between
    two device allocations whose extents differ."""
    from executor.backends.backend import Lane
    from executor.backends.cuda import CudaBackend
    from scheduler.geometry import Box
    b = CudaBackend([0])
    try:
        a = cupy.arange(48, dtype=cupy.float32).reshape(6, 8)
        other = cupy.zeros((6, 8), cupy.float32)
        c = b.copy(a, Box((0, 0), (6, 8)), other, Box((1, 0), (7, 8)), Box(*box), Lane("device", 0, 0))
        assert c.wait(30) and c.error() is None
        (y0, x0), (y1, x1) = box
        want = np.zeros((6, 8), np.float32)
        want[y0 - 1:y1 - 1, x0:x1] = np.arange(48, dtype=np.float32).reshape(6, 8)[y0:y1, x0:x1]
        np.testing.assert_array_equal(cupy.asnumpy(other), want)
    finally:
        b.close()



MIXED = cl.Kernel(source={"cuda": """
extern "C" __global__ void mixed(CHUNK_PARAMS, ACCESSOR(double, dst), int flag, float f, double d, long long k,
                                 ACCESSOR(double, src)) {
    if (!IN_CHUNK()) return;
    long long i = GID(0);
    AT1(dst, i) = flag * 1000.0 + f * AT1(src, i) + d + k * i;
}"""}, name="mixed")


@pytest.mark.parametrize("driver", [True, False])
def test_source_kernel_scalars_of_every_width_arrive_through_both_enqueue_paths(driver):
    """Scalars of 4 and 8 bytes between accessors (a bool as int, float32, float64, int64)
    reach the kernel by value, whether the backend launches through its GIL-keeping driver
    calls (each parameter in an 8-byte slot) or through CuPy's ``RawKernel``."""
    q = cl.Queue(devices="cuda:0,0")
    be = q.runtime.backend
    assert be._driver is not None, "libcuda could not be bound through ctypes"
    if not driver:
        be._driver = None
    src = cl.Buffer(np.arange(100, dtype=np.float64))
    dst = cl.Buffer(np.zeros(100, np.float64))

    def cgf(cgh):
        w = dst.access(cgh, cl.one_to_one(), cl.discard_write)
        r = src.access(cgh, cl.one_to_one(), cl.read)
        cgh.parallel_for((100,), MIXED, args=(w, True, np.float32(0.5), 0.25, 7, r))

    for _ in range(3):
        q.submit(cgf)
    i = np.arange(100, dtype=np.float64)
    np.testing.assert_array_equal(q.fence(dst).result(), 1000.0 + 0.5 * i + 0.25 + 7 * i)
    q.shutdown()


def test_the_driver_reports_a_failed_launch_as_the_kernels_error():
    """A launch the driver refuses (here: more threads per block than a GPU has) fails the
    task with the driver's error name, not a bare ctypes error."""
    q = cl.Queue(devices="cuda")
    assert q.runtime.backend._driver is not None
    x = cl.Buffer(np.zeros(4096, np.float64))
    y = cl.Buffer(np.zeros(4096, np.float64))

    def cgf(cgh):
        w = y.access(cgh, cl.one_to_one(), cl.discard_write)
        r = x.access(cgh, cl.one_to_one(), cl.read)
        cgh.parallel_for((4096,), MIXED, args=(w, 0, np.float32(1), 0.0, 0, r), local_range=(4096,))

    q.submit(cgf)
    with pytest.raises(cl.CeleritasError, match=r"'mixed'.*CUDA_ERROR_INVALID_VALUE"):
        q.wait()
    q.shutdown()
