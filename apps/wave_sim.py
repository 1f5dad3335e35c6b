"""2-D wave equation (leapfrog finite differences), Celerity's wave_sim.

Two buffers ``u`` (current) and ``up`` (previous, overwritten with the next step)
swap roles every step.  The stencil reads ``u`` through ``neighborhood(1, 1,
along_axes)``, so ranks exchange exactly one halo row per neighbour and step.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import celeritas as cl

from ._common import Timer, base_parser, cli, console, nonnegative, output_folder, positive, report_verification


def initial_condition(n: int, dtype=np.float32) -> np.ndarray:
    y, x = np.mgrid[0:n, 0:n].astype(np.float64)
    c = n / 2
    return np.exp(-((x - c) ** 2 + (y - c) ** 2) / (2 * (n / 16) ** 2)).astype(dtype)


def _shift(xp, get, y0, y1, x0, x1, dy, dx, n):
    """u[y+dy, x+dx] over the box, clamped at the global borders (a chunk reads only the cross)."""
    if dy == -1:
        if y0 == 0:
            return xp.concatenate([get(0, 1, x0, x1), get(0, y1 - 1, x0, x1)], axis=0)
        return get(y0 - 1, y1 - 1, x0, x1)
    if dy == 1:
        if y1 == n:
            return xp.concatenate([get(y0 + 1, n, x0, x1), get(n - 1, n, x0, x1)], axis=0)
        return get(y0 + 1, y1 + 1, x0, x1)
    if dx == -1:
        if x0 == 0:
            return xp.concatenate([get(y0, y1, 0, 1), get(y0, y1, 0, x1 - 1)], axis=1)
        return get(y0, y1, x0 - 1, x1 - 1)
    if x1 == n:
        return xp.concatenate([get(y0, y1, x0 + 1, n), get(y0, y1, n - 1, n)], axis=1)
    return get(y0, y1, x0 + 1, x1 + 1)


def step_arrays(up: np.ndarray, u: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    """The sequential reference: returns the new ``up``."""
    n = u.shape[0]

    def get(ya, yb, xa, xb):
        return u[ya:yb, xa:xb]

    lap = (_shift(np, get, 0, n, 0, n, -1, 0, n) + _shift(np, get, 0, n, 0, n, 1, 0, n)
           + _shift(np, get, 0, n, 0, n, 0, -1, n) + _shift(np, get, 0, n, 0, n, 0, 1, n) - 4 * u)
    return (a * 2 * u - b * up + c * lap).astype(u.dtype)


def coefficients(step: int, dt: float, dx: float) -> tuple[float, float, float]:
    # the first step starts from rest (u_prev == u): half the update
    c = (dt * dt) / (dx * dx)
    return (0.5, 0.0, 0.5 * c) if step == 0 else (1.0, 1.0, c)


def reference(n: int, steps: int, dt: float = 0.25, dx: float = 1.0) -> np.ndarray:
    u = initial_condition(n)
    up = u.copy()
    for s in range(steps):
        a, b, c = coefficients(s, dt, dx)
        up = step_arrays(up, u, np.float32(a), np.float32(b), np.float32(c))
        up, u = u, up
    return u


def submit_step(q: cl.Queue, up: cl.Buffer, u: cl.Buffer, a: float, b: float, c: float, n: int) -> None:
    a, b, c = np.float32(a), np.float32(b), np.float32(c)

    def cgf(cgh):
        rw = up.access(cgh, cl.one_to_one(), cl.read_write)
        ru = u.access(cgh, cl.neighborhood(1, 1, shape="along_axes"), cl.read)

        @cgh.parallel_for((n, n), name="step")
        def kernel(chunk):
            (y0, x0), (y1, x1) = chunk.box.min, chunk.box.max
            xp = chunk.xp
            # the chunk's neighbourhood and its rows of ``up`` straight from the accessors'
            # allocations (global coordinates minus their offsets): the kernel indexes them
            # eleven times, and a plain slice costs a third of an accessor index
            arr = ru.array
            oy, ox = ru.offset

            def get(ya, yb, xa, xb):
                return arr[ya - oy:yb - oy, xa - ox:xb - ox]

            center = get(y0, y1, x0, x1)
            lap = (_shift(xp, get, y0, y1, x0, x1, -1, 0, n) + _shift(xp, get, y0, y1, x0, x1, 1, 0, n)
                   + _shift(xp, get, y0, y1, x0, x1, 0, -1, n) + _shift(xp, get, y0, y1, x0, x1, 0, 1, n)
                   - 4 * center)
            (wy, wx), w = rw.offset, rw.array
            out = w[y0 - wy:y1 - wy, x0 - wx:x1 - wx]
            out[...] = a * 2 * center - b * out + c * lap

    q.submit(cgf)


def run(q: cl.Queue, n: int, steps: int, *, dt: float = 0.25, dx: float = 1.0, output: str | None = None,
        output_every: int = 0) -> np.ndarray:
    """``steps`` steps on an ``n`` x ``n`` grid; the final field on every rank.  With ``output`` (a
    folder) a master-node host task saves ``frame_STEP.npy`` every ``output_every`` steps (0: never)
    and after the last step."""
    init = initial_condition(n)
    u = cl.Buffer(init, name="u")
    up = cl.Buffer(init, name="up")
    frames = cl.HostObject([]) if output else None
    for s in range(steps):
        a, b, c = coefficients(s, dt, dx)
        submit_step(q, up, u, a, b, c, n)
        up, u = u, up
        if frames is not None and output_every and (s + 1) % output_every == 0:
            _write_frame(q, u, frames, s + 1, output)
    if frames is not None and not (output_every and steps % output_every == 0):
        _write_frame(q, u, frames, steps, output)      # the last step, unless the loop just wrote it
    result = q.fence(u).result()
    return result


def _write_frame(q, u, frames, step, output):
    def cgf(cgh):
        acc = u.access(cgh, cl.all(), cl.read)
        lst = cl.side_effect(frames, cgh)

        def task(part):
            path = Path(output) / f"frame_{step:05d}.npy"
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, np.asarray(acc[...]))
            lst.append(str(path))

        cgh.host_task(task, on=cl.on_master_node, name=f"output_{step}")

    q.submit(cgf)


def main(argv=None) -> int:
    p = base_parser(__doc__)
    p.add_argument("-N", "--size", type=positive, default=512, help="grid edge length")
    p.add_argument("-T", "--steps", type=positive, default=100, help="time steps")
    p.add_argument("--output", type=output_folder, default=None,
                   help="folder for .npy frames of u: frame_STEP.npy after the last step and every --output-every "
                        "steps (written by a master-node host task)")
    p.add_argument("--output-every", type=nonnegative, default=0,
                   help="steps between frames written to --output (0: the last step only)")
    args = p.parse_args(argv)
    if args.output_every and not args.output:
        p.error("--output-every needs --output (the folder the frames go to)")
    q = cl.Queue(devices=args.devices, lookahead=args.lookahead)
    with Timer() as t:
        result = run(q, args.size, args.steps, output=args.output, output_every=args.output_every)
        q.wait()
    rank = q.rank
    nranks = q.num_ranks
    q.shutdown()
    if rank == 0:
        console.print(f"wave_sim {args.size}x{args.size}, {args.steps} steps on {nranks} rank(s): "
                      f"{t.seconds:.3f} s, checksum {float(np.sum(result, dtype=np.float64)):.6f}")
    if args.verify:
        ref = reference(args.size, args.steps)
        ok = np.allclose(result, ref, rtol=1e-5, atol=1e-6)
        return report_verification(ok, rank, "" if ok else f"max error {np.abs(result - ref).max()}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
