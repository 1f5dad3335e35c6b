"""The programs bench_mpi times move the bytes they claim to: its row mappers, with
kernels that write on rank 0 and check on rank 1 (the benchmark's own kernels do
nothing), as a ping-pong of hops and as a stream of windows; prints ``rank R: ok``."""
import _setup  # noqa: F401
import numpy as np
from mpi4py import MPI

import celeritas as cl
from benchmarks.bench_mpi import _row_mapper, _rows_of

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
problems = []
q = cl.Queue()

W, NB = 4, 256
x = cl.Buffer(np.zeros((W, NB), np.int64), name="stream")


def produce(window):
    def cgf(cgh):
        w = x.access(cgh, _rows_of(0, 0, W), cl.discard_write)

        @cgh.parallel_for((2,), name="produce")
        def k(chunk):
            if chunk.offset[0] == 0:
                for r in range(W):
                    w[r:r + 1, 0:NB] = window * 1000 + r
    return cgf


def consume(window, row):
    def cgf(cgh):
        r_ = x.access(cgh, _rows_of(1, row, row + 1), cl.read)

        @cgh.parallel_for((2,), name="consume")
        def k(chunk):
            if chunk.offset[0] == 1:
                got = r_[row:row + 1, 0:NB]
                if not (got == window * 1000 + row).all():
                    problems.append(f"window {window} row {row}: {got[0, :3]}")
    return cgf


for window in range(6):
    q.submit(produce(window))
    for r in range(W):
        q.submit(consume(window, r))
q.wait(barrier=True)

# the ping-pong: the one row goes rank src -> rank dst, read and written by chunk dst
y = cl.Buffer(np.zeros((1, NB), np.int64), name="pingpong")


def hop(src, dst, value):
    def cgf(cgh):
        a = y.access(cgh, _row_mapper(dst, 0), cl.read_write)

        @cgh.parallel_for((2,), name=f"hop{src}{dst}")
        def k(chunk):
            if chunk.offset[0] == dst:
                got = a[0:1, 0:NB]
                if not (got == value - 1).all():
                    problems.append(f"hop {src}->{dst}: {got[0, :3]}, expected {value - 1}")
                a[0:1, 0:NB] = value
    return cgf


v = 1
for _ in range(5):
    q.submit(hop(0, 1, v))
    q.submit(hop(1, 0, v + 1))
    v += 2
q.wait(barrier=True)
q.shutdown()
print(f"rank {rank}: ok" if not problems else f"rank {rank}: {problems[:5]}", flush=True)
