"""Ranks that submit different work must fail with a DivergenceError naming the first
task that differs, not deadlock.

mode ``extra``: rank 1 submits an extra kernel between two common tasks.
mode ``extra_last``: rank 1 submits an extra kernel right before q.wait().
mode ``different``: rank 1 submits its kernel under another name and range.
mode ``stuck``: rank 1 submits a kernel that rank 0 does not and then blocks on a
fence that needs data rank 0 never sends, so it never reaches an epoch; rank 0
reaches its shutdown epoch.
mode ``buffer_shape``: rank 1 makes its second buffer one element longer.
mode ``buffer_extra``: rank 1 makes a buffer rank 0 does not (so their later buffer ids differ).
mode ``silent``: rank 1 never reaches its epoch and submits nothing different (it
blocks in its own code): rank 0 can only time out.
"""
import sys
import time

import _setup  # noqa: F401
import numpy as np

import celeritas as cl

mode = sys.argv[1]
q = cl.Queue()
b = cl.Buffer(np.zeros(64, np.float32), name="b")


def touch(name, n=64):
    def cgf(cgh):
        b.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((n,), lambda chunk: None, name=name)
    return cgf


def read_all(cgh):
    b.access(cgh, cl.all(), cl.read)
    b.access(cgh, cl.one_to_one(), cl.read_write)
    cgh.parallel_for((64,), lambda chunk: None, name="reader")


if mode == "extra":
    q.submit(touch("step"))
    if q.rank == 1:
        q.submit(touch("extra"))
    q.submit(read_all)
    q.wait()
elif mode == "extra_last":
    q.submit(touch("step"))
    if q.rank == 1:
        q.submit(touch("extra"))
    q.wait()
elif mode == "different":
    q.submit(touch("step"))
    q.submit(touch("update") if q.rank == 0 else touch("update_v2", 32))
    q.wait()
elif mode == "stuck":
    q.submit(touch("step"))
    q.wait()
    if q.rank == 1:
        q.submit(touch("only_on_rank_1"))
        print(f"rank {q.rank}: {q.fence(b).result().sum()}", flush=True)
elif mode == "buffer_shape":
    q.submit(touch("step"))
    c = cl.Buffer(np.zeros(32 + q.rank, np.float32), name="c")
    q.submit(touch("after"))
    q.wait()
elif mode == "buffer_extra":
    q.submit(touch("step"))
    if q.rank == 1:
        cl.Buffer(np.zeros(8, np.int32), name="only_on_rank_1")
    c = cl.Buffer(np.zeros(32, np.float32), name="c")
    q.wait()
elif mode == "silent":
    q.submit(touch("step"))
    q.wait()
    if q.rank == 1:
        time.sleep(60)
else:
    raise SystemExit(f"unknown mode {mode}")
q.shutdown()
print(f"rank {q.rank}: finished normally", flush=True)
