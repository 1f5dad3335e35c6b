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

    from executor.mpi.wire import device_spec
    mpi = SimpleNamespace(BYTE="BYTE")
    alloc = cupy.arange(8 * 10, dtype=cupy.float32).reshape(8, 10)
    view = alloc[2:5, 3:7]                               # a box inside a larger allocation
    spec, keep, finish, nbytes = device_spec(mpi, view, receive=False)
    assert finish is None and nbytes == 3 * 4 * 4
    assert isinstance(spec[0], cupy.ndarray) and spec[0].flags.c_contiguous
    np.testing.assert_array_equal(cupy.asnumpy(spec[0]), cupy.asnumpy(view))
    spec, keep, finish, nbytes = device_spec(mpi, view, receive=True)
    spec[0][...] = -1                                    # "MPI" writes the staging buffer
    finish()
    np.testing.assert_array_equal(cupy.asnumpy(alloc[2:5, 3:7]), -np.ones((3, 4), np.float32))
    assert float(alloc[0, 0]) == 0 and float(alloc[7, 9]) == 79   # nothing outside the box
    whole = alloc[4:6]                                   # contiguous rows: passed as they are
    spec, keep, finish, _ = device_spec(mpi, whole, receive=True)
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
