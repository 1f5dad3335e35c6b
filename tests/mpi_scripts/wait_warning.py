"""Rank 1 sleeps 3 s before it submits (``data``) or before its barrier (``barrier``);
rank 0 blocks in q.wait() meanwhile and, with CELERITAS_WAIT_WARNING=1, must say what for."""
import sys
import time

import _setup  # noqa: F401
import numpy as np

import celeritas as cl

mode = sys.argv[1]
q = cl.Queue()
b = cl.Buffer(shape=(64,), dtype=np.float32, name="halo")


def produce(cgh):
    w = b.access(cgh, cl.one_to_one(), cl.discard_write)
    cgh.parallel_for((64,), lambda chunk: w.__setitem__(chunk, 1.0), name="produce")


def consume(cgh):
    b.access(cgh, cl.all(), cl.read)
    cgh.parallel_for((64,), lambda chunk: None, name="consume")


if mode == "data":
    if q.rank == 1:
        time.sleep(3)
    q.submit(produce)
    q.submit(consume)
    q.wait()
elif mode == "barrier":
    if q.rank == 1:
        time.sleep(3)
    q.wait(barrier=True)
else:
    raise SystemExit(f"unknown mode {mode}")
q.shutdown()
print(f"rank {q.rank}: finished normally", flush=True)
