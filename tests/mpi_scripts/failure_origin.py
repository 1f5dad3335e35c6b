"""A kernel divides by zero on rank 1 (of 2): the abort message must show where, in this file."""
import _setup  # noqa: F401
import numpy as np

import celeritas as cl

q = cl.Queue()
b = cl.Buffer(np.ones(64, np.float32), name="b")


def divide(cgh):
    w = b.access(cgh, cl.one_to_one(), cl.read_write)

    @cgh.parallel_for((64,), name="divides")
    def kernel(chunk):
        w[chunk] = w[chunk] * (1 / (q.rank - 1))   # FAILS HERE on rank 1


q.submit(divide)
q.wait()
q.shutdown()
print(f"rank {q.rank}: finished normally", flush=True)
