"""3-D Jacobi iteration (7-point stencil) for Laplace's equation, until it converges.

The cube's faces hold Dirichlet boundary values (one hot face); the kernel runs
over the interior only, with ``offset=(1, 1, 1)``, reading the previous iterate
through ``neighborhood(1, 1, 1, along_axes)`` and writing the next one.  Every
``check_every`` steps the kernel also reduces the largest change into a 0-D
buffer (``cl.maximum``); the application fences that buffer and stops once it
falls below the tolerance.  Between checks nothing blocks: the fence is the only
synchronization.

Each point is updated with the same float operations in the same order on any
split, and a maximum is exact, so the iterates (and the step at which the
iteration stops) match the numpy reference exactly.
"""
from __future__ import annotations

import logging
import sys
from typing import NamedTuple

import numpy as np
from rich.progress import TextColumn

import celeritas as cl

from ._common import (Timer, at_least, base_parser, cli, console, finite_float, positive, print_timing, progress_bar,
                      report_verification)

log = logging.getLogger("celeritas.apps")

SIXTH = np.float32(1.0 / 6.0)


class JacobiResult(NamedTuple):
    u: np.ndarray | None
    steps: int
    residual: float



def initial_condition(n: int) -> np.ndarray:
    """Zero inside, 1 on the x = 0 face, a ramp on the y = 0 face."""
    u = np.zeros((n, n, n), dtype=np.float32)
    u[0, :, :] = 1.0
    u[:, 0, :] = np.linspace(1.0, 0.0, n, dtype=np.float32)[:, None]
    return u


def update(xm, xp_, ym, yp, zm, zp):
    """The 7-point average, one shared expression so kernel and reference round alike."""
    return (((((xm + xp_) + ym) + yp) + zm) + zp) * SIXTH


def reference(n: int, max_steps: int, tol: float = 1e-4, check_every: int = 10) -> JacobiResult:
    a = initial_condition(n)
    b = a.copy()
    res = float("inf")
    steps = 0
    for it in range(max_steps):
        i = slice(1, n - 1)
        b[i, i, i] = update(a[:-2, i, i], a[2:, i, i], a[i, :-2, i], a[i, 2:, i], a[i, i, :-2], a[i, i, 2:])
        steps = it + 1
        check = steps % check_every == 0 or steps == max_steps
        if check:
            res = float(np.abs(b[i, i, i] - a[i, i, i]).max())
        a, b = b, a
        if check and res < tol:
            break
    return JacobiResult(a, steps, res)


def submit_step(q: cl.Queue, src: cl.Buffer, dst: cl.Buffer, residual: cl.Buffer | None) -> None:
    n = src.shape[0]

    def cgf(cgh):
        r = src.access(cgh, cl.neighborhood(1, 1, 1, shape="along_axes"), cl.read)
        w = dst.access(cgh, cl.one_to_one(), cl.discard_write)
        reds = (cl.reduction(residual, cgh, cl.maximum, initialize_to_identity=True),) if residual is not None else ()

        @cgh.parallel_for((n - 2, n - 2, n - 2), offset=(1, 1, 1), name="jacobi" if not reds else "jacobi_check",
                          reductions=reds)
        def kernel(chunk, *reducers):
            (x0, y0, z0), (x1, y1, z1) = chunk.box.min, chunk.box.max
            new = update(r[x0 - 1:x1 - 1, y0:y1, z0:z1], r[x0 + 1:x1 + 1, y0:y1, z0:z1],
                         r[x0:x1, y0 - 1:y1 - 1, z0:z1], r[x0:x1, y0 + 1:y1 + 1, z0:z1],
                         r[x0:x1, y0:y1, z0 - 1:z1 - 1], r[x0:x1, y0:y1, z0 + 1:z1 + 1])
            if reducers:
                reducers[0].combine(chunk.xp.abs(new - r[chunk]).max())
            w[chunk] = new

    q.submit(cgf)


def run(q: cl.Queue, n: int, max_steps: int, *, tol: float = 1e-4, check_every: int = 10, fetch: bool = True,
        progress: bool = False) -> JacobiResult:
    """Iterate until the largest change drops below ``tol`` (checked every ``check_every`` steps).

    ``tol <= 0`` never converges (fixed step count, used by the scaling studies).
    """
    init = initial_condition(n)
    a = cl.Buffer(init, name="u0")
    b = cl.Buffer(init, name="u1")           # boundaries live in both buffers; kernels write the interior
    residual = cl.Buffer(shape=(), dtype=np.float32, name="residual")
    res = float("inf")
    steps = 0
    with progress_bar(progress and q.rank == 0, TextColumn("{task.fields[res]}")) as bar:
        task = bar.add_task("jacobi3d", total=max_steps, res="")
        for it in range(max_steps):
            steps = it + 1
            check = steps % check_every == 0 or steps == max_steps
            submit_step(q, a, b, residual if check else None)
            a, b = b, a
            if check:
                res = float(q.fence(residual).result())
                bar.update(task, completed=steps, res=f"max change {res:.2e}")
                if res < tol:
                    break
            else:
                bar.advance(task)
        bar.update(task, total=steps)
    return JacobiResult(q.fence(a).result() if fetch else None, steps, res)


def main(argv=None) -> int:
    p = base_parser(__doc__, timed=True)
    p.add_argument("-N", "--size", type=at_least(3), default=128,
                   help="cube edge length, boundary included (at least 3: one interior point)")
    p.add_argument("-T", "--steps", type=positive, default=1000, help="maximum number of steps")
    p.add_argument("--tol", type=finite_float, default=1e-4,
                   help="stop when the largest change is below this (0 or less: run all --steps)")
    p.add_argument("--check-every", type=positive, default=10, help="steps between convergence checks")
    args = p.parse_args(argv)
    q = cl.Queue(devices=args.devices, lookahead=args.lookahead)
    with Timer() as t:
        result = run(q, args.size, args.steps, tol=args.tol, check_every=args.check_every,
                     progress=not args.no_progress)
        q.wait()
    rank, nranks, ndev = q.rank, q.num_ranks, q.num_devices
    q.shutdown()
    if rank == 0:
        console.print(f"jacobi3d {args.size}^3: {result.steps} steps (max change {result.residual:.3e}) on "
                      f"{nranks} rank(s): {t.seconds:.3f} s", soft_wrap=True)
        if args.json:
            print_timing("jacobi3d", nranks, ndev, args.size, result.steps, t.seconds,
                         residual=result.residual)
    if args.verify:
        ref = reference(args.size, args.steps, args.tol, args.check_every)
        ok = ref.steps == result.steps and np.allclose(result.u, ref.u, rtol=1e-6, atol=1e-7)
        return report_verification(ok, rank, "" if ok else f"{result.steps} vs {ref.steps} steps, max error "
                                   f"{np.abs(result.u - ref.u).max()}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
