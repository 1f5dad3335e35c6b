"""A kernel raises on rank 2 (of 4): every rank must exit non-zero within seconds."""
import _setup  # noqa: F401
import numpy as np

import celeritas as cl

q = cl.Queue()
b = cl.Buffer(shape=(64,), dtype=np.float32, name="b")


def writer(cgh):
    w = b.access(cgh, cl.one_to_one(), cl.discard_write)

    @cgh.parallel_for((64,), name="boom")
    def kernel(chunk):
        if q.rank == 2:
            raise ValueError("kaboom on purpose")
        w[chunk] = 1


def reader(cgh):
    r = b.access(cgh, cl.all(), cl.read)
    cgh.parallel_for((64,), lambda chunk: None, name="reader")


q.submit(writer)
q.submit(reader)
print(f"rank {q.rank}: sum {q.fence(b).result().sum()}", flush=True)
q.wait()
q.shutdown()
print(f"rank {q.rank}: finished normally", flush=True)
