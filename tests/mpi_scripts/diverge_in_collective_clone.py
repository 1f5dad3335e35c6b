"""Rank 0: a collective host task on a new group (its executor then waits in the group's
Idup, which rank 1 never joins), then q.wait(); rank 1: a kernel on b, then a fence of b
(waiting for rank 0's part).  See test_divergence_at_fences."""
import numpy as np
import celeritas as cl
q = cl.Queue()
b = cl.Buffer(np.arange(16.0), name="b")
if q.rank == 0:
    g = cl.CollectiveGroup()
    q.submit(lambda cgh: cgh.host_task(lambda p: None, on=cl.collective(g), name="step"))
    q.wait()
    print("rank 0 waited", flush=True)
else:
    def cgf(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((16,), lambda c: w.__setitem__(c, w[c] + 1), name="step")
    q.submit(cgf)
    print("rank 1 fence", q.fence(b).result().sum(), flush=True)
