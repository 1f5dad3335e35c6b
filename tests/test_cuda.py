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
