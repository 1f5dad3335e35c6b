"""Ranks that submit different work must fail with a DivergenceError, not deadlock.

mode ``extra``: rank 1 submits an extra kernel; the epoch hashes differ.
mode ``stuck``: rank 1 submits a kernel that rank 0 does not and then blocks on a
fence that needs data rank 0 never sends; rank 0 reaches its shutdown epoch and
waits for rank 1's, which never comes (timeout).
"""
import sys

import _setup  # noqa: F401
import numpy as np

import celeritas as cl

mode = sys.argv[1]
q = cl.Queue()
b = cl.Buffer(np.zeros(64, np.float32), name="b")


def touch(name):
    def cgf(cgh):
        b.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((64,), lambda chunk: None, name=name)
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
elif mode == "stuck":
    if q.rank == 1:
        q.submit(touch("only_on_rank_1"))
    print(f"rank {q.rank}: {q.fence(b).result().sum()}", flush=True)
else:
    raise SystemExit(f"unknown mode {mode}")
q.shutdown()
print(f"rank {q.rank}: finished normally", flush=True)
