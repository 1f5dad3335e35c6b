"""A radiosity-style simulation whose read region grows every step (Celerity's RSim pattern).

``N`` patches exchange energy; light from patch ``j`` reaches patch ``i`` after a
delay of ``1 + |i - j|`` steps.  Row ``t`` of the result buffer ``R`` (shape
``(T, N)``) holds every patch's radiance at step ``t``:

    R[t, i] = (e_i + sum_j v(i, j) * R[t - 1 - |i - j|, j]) mod P    (terms with a negative step vanish)

so step ``t`` reads rows ``[0, t)`` of ``R`` (a ``cl.fixed`` mapper that grows
each step) and writes row ``t`` (a custom mapper: the chunk's columns of that
row).  Without lookahead every step grows each memory's allocation of ``R`` by
one row, and the runtime must resize (allocate bigger, copy the old rows over,
free); with lookahead the first allocation already covers every row the held-back
steps will touch.  Integer arithmetic (modulo a prime) keeps the result exact for
any split.
"""
from __future__ import annotations

import logging
import sys

import numpy as np

import celeritas as cl

from ._common import Timer, base_parser, cli, console, positive, print_timing, progress_bar, report_verification

log = logging.getLogger("celeritas.apps")

MODULUS = 2_147_483_647        # 2^31 - 1: N * 4 * MODULUS stays far below 2^63



def emission(n: int) -> np.ndarray:
    i = np.arange(n, dtype=np.int64)
    return (i * 31 + 7) % 101


def radiance_row(xp, t: int, i, n: int, history):
    """Row ``t`` for patches ``i`` from ``history`` = rows [0, t) (shared by kernel and reference)."""
    j = xp.arange(n, dtype=np.int64)[None, :]
    ii = i.astype(np.int64)[:, None]
    src = t - 1 - xp.abs(ii - j)                               # the step whose light arrives now
    visible = (ii * 7 + j * 13 + 3) % 5 * (src >= 0)             # form factors 0..4, 0 before time began
    arriving = history[xp.clip(src, 0, t - 1), xp.broadcast_to(j, src.shape)]
    e = (ii[:, 0] * 31 + 7) % 101
    return (e + (visible * arriving).sum(axis=1)) % MODULUS


def reference(n: int, steps: int) -> np.ndarray:
    r = np.zeros((steps, n), dtype=np.int64)
    r[0] = emission(n)
    for t in range(1, steps):
        r[t] = radiance_row(np, t, np.arange(n), n, r[:t])
    return r


def _row(t: int):
    """Chunk [x0, x1) of a 1-D kernel writes columns [x0, x1) of row ``t``."""
    def mapper(chunk, shape):
        return cl.Subrange((t, chunk.offset[0]), (1, chunk.range[0]))

    mapper.__name__ = f"row_{t}"
    return mapper


def submit_step(q: cl.Queue, r: cl.Buffer, t: int) -> None:
    n = r.shape[1]

    def cgf(cgh):
        hist = r.access(cgh, cl.fixed(cl.Subrange((0, 0), (t, n))), cl.read)
        out = r.access(cgh, _row(t), cl.discard_write)

        @cgh.parallel_for((n,), name="radiate")
        def kernel(chunk):
            x0, x1 = chunk.box.min[0], chunk.box.max[0]
            out[t:t + 1, x0:x1] = radiance_row(chunk.xp, t, chunk.arange(0), n, hist[0:t, 0:n])[None, :]

    q.submit(cgf)


def run(q: cl.Queue, n: int, steps: int, *, fetch: bool = True, progress: bool = False) -> np.ndarray | None:
    """Simulate ``steps`` rows (row 0 is the emission) of ``n`` patches; returns R or None with ``fetch=False``."""
    init = np.zeros((steps, n), dtype=np.int64)
    init[0] = emission(n)
    r = cl.Buffer(init, name="R")
    with progress_bar(progress and q.rank == 0) as bar:
        task = bar.add_task("rsim", total=max(0, steps - 1))
        for t in range(1, steps):
            submit_step(q, r, t)
            bar.advance(task)
    if not fetch:
        return None
    return q.fence(r).result()


def main(argv=None) -> int:
    p = base_parser(__doc__, timed=True)
    p.add_argument("-N", "--size", type=positive, default=1024, help="number of patches")
    p.add_argument("-T", "--steps", type=positive, default=100, help="time steps (rows of the result)")
    args = p.parse_args(argv)
    q = cl.Queue(devices=args.devices, lookahead=args.lookahead)
    with Timer() as t:
        result = run(q, args.size, args.steps, progress=not args.no_progress)
        q.wait()
    rank, nranks, ndev = q.rank, q.num_ranks, q.num_devices
    q.shutdown()
    if rank == 0:
        console.print(f"rsim {args.size} patches, {args.steps} steps on {nranks} rank(s): {t.seconds:.3f} s, "
                      f"checksum {int(result[-1].sum()) % MODULUS}", soft_wrap=True)
        if args.json:
            print_timing("rsim", nranks, ndev, args.size, args.steps, t.seconds)
    if args.verify:
        ok = np.array_equal(result, reference(args.size, args.steps))
        return report_verification(ok, rank)
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
