"""A kernel fails on rank 1; its dependents (same chunk, whole buffer, a host task) must not run.

Every dependent that runs leaves a marker file in the folder given as argv[1]; the
failing chunk waits a little before it raises, so the dependent that reads the
same chunk is already queued behind it on its lane.
"""
import sys
import time
from pathlib import Path

import _setup  # noqa: F401
import numpy as np

import celeritas as cl

markers = Path(sys.argv[1])
q = cl.Queue()
b = cl.Buffer(shape=(16,), dtype=np.float32, name="produced")


def mark(what, chunk):
    (markers / f"{what}-rank{q.rank}-{chunk.offset[0]}").write_text("ran")


def produce(cgh):
    w = b.access(cgh, cl.one_to_one(), cl.discard_write)

    @cgh.parallel_for((16,), name="explodes")
    def kernel(chunk):
        if q.rank == 1:
            time.sleep(0.3)
            raise ValueError("boom on purpose")
        w[chunk] = 1


def same_chunk(cgh):
    b.access(cgh, cl.one_to_one(), cl.read)
    cgh.parallel_for((16,), lambda chunk: mark("reads_same_chunk", chunk), name="reads_same_chunk")


def whole(cgh):
    b.access(cgh, cl.all(), cl.read)
    cgh.parallel_for((16,), lambda chunk: mark("reads_all", chunk), name="reads_all")


def host(cgh):
    b.access(cgh, cl.all(), cl.read)
    cgh.host_task(lambda part: mark("host_task", part), range=(16,), name="host_reader")


q.submit(produce)
q.submit(same_chunk)
q.submit(whole)
q.submit(host)
q.wait()
print(f"rank {q.rank}: finished normally", flush=True)
