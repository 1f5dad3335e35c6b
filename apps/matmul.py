"""Dense matrix multiplication C = A @ B, split by rows (and columns with split_2d).

Each chunk of C reads its rows of A (``slice(1)``) and its columns of B
(``slice(0)``).  Inputs hold small integers so every partial sum is exact in
float32: the result is identical for any split, rank or device count.
"""
from __future__ import annotations

import sys

import numpy as np

import celeritas as cl

from ._common import Timer, base_parser, cli, console, positive, report_verification


def inputs(n: int, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    i, j = np.mgrid[0:n, 0:n]
    a = ((i * 3 + j) % 7 - 3).astype(dtype)
    b = ((i + 2 * j) % 5 - 2).astype(dtype)
    return a, b


def submit_matmul(q: cl.Queue, a: cl.Buffer, b: cl.Buffer, c: cl.Buffer, split_2d: bool = False) -> None:
    n, k = a.shape
    _, m = b.shape

    def cgf(cgh):
        ra = a.access(cgh, cl.slice(1), cl.read)
        rb = b.access(cgh, cl.slice(0), cl.read)
        wc = c.access(cgh, cl.one_to_one(), cl.discard_write)
        if split_2d:
            cl.hint(cgh, cl.split_2d())

        @cgh.parallel_for((n, m), name="matmul")
        def kernel(chunk):
            (i0, j0), (i1, j1) = chunk.box.min, chunk.box.max
            wc[chunk] = chunk.xp.matmul(ra[i0:i1, 0:k], rb[0:k, j0:j1])

    q.submit(cgf)


def run(q: cl.Queue, n: int, *, split_2d: bool = False, repeat: int = 1) -> np.ndarray:
    a_np, b_np = inputs(n)
    a = cl.Buffer(a_np, name="A")
    b = cl.Buffer(b_np, name="B")
    c = cl.Buffer(shape=(n, n), dtype=np.float32, name="C")
    for _ in range(repeat):
        submit_matmul(q, a, b, c, split_2d)
    return q.fence(c).result()


def main(argv=None) -> int:
    p = base_parser(__doc__)
    p.add_argument("-N", "--size", type=positive, default=512, help="matrix edge length (N x N times N x N)")
    p.add_argument("--split-2d", action="store_true", help="split C by rows and columns (split_2d hint)")
    p.add_argument("--repeat", type=positive, default=1, help="multiplications to run (timed together)")
    args = p.parse_args(argv)
    q = cl.Queue(devices=args.devices, lookahead=args.lookahead)
    with Timer() as t:
        result = run(q, args.size, split_2d=args.split_2d, repeat=args.repeat)
    rank = q.rank
    q.shutdown()
    if rank == 0:
        gflops = 2 * args.size ** 3 * args.repeat / t.seconds / 1e9
        console.print(f"matmul {args.size}^3 x{args.repeat}: {t.seconds:.3f} s ({gflops:.2f} GFLOP/s)")
    if args.verify:
        a_np, b_np = inputs(args.size)
        ok = np.array_equal(result, a_np @ b_np)
        return report_verification(ok, rank)
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
