"""All-pairs N-body gravity with double-buffered positions.

Every chunk of bodies reads *all* positions (``cl.all()``) of the current buffer
and writes its own rows of the other one, so each step every rank broadcasts its
bodies to every other rank: the communication pattern of an all-to-all
dependency.  Velocities are updated in place (``read_write``).

The force on a body is a floating-point sum over all others.  It is computed in
fixed tiles of the ``j`` range, so a body's sum does not depend on how the bodies
were split, but numpy/CuPy reduction kernels may still order the additions
differently for differently shaped blocks: ``--verify`` compares with a
tolerance (float64).
"""
from __future__ import annotations

import logging
import sys

import numpy as np

import celeritas as cl

from ._common import (Timer, base_parser, cli, console, finite_float, positive, print_timing, progress_bar,
                      report_verification)

log = logging.getLogger("celeritas.apps")

TILE_I = 256
TILE_J = 1024



def initial_state(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions in a unit ball, a slow rotation, unequal masses (float64)."""
    rng = np.random.default_rng(seed)
    pos = rng.normal(size=(n, 3))
    pos *= (rng.random(n) ** (1 / 3) / np.linalg.norm(pos, axis=1))[:, None]
    vel = np.stack([-pos[:, 1], pos[:, 0], np.zeros(n)], axis=1) * 0.3
    mass = rng.uniform(0.5, 1.5, n) / n
    return pos, vel, mass


def accelerations(xp, p_own, p_all, mass, eps2: float):
    """a_i = sum_j m_j (p_j - p_i) / (|p_j - p_i|^2 + eps^2)^(3/2), tiled to bound temporary memory."""
    out = xp.zeros_like(p_own)
    n_all = p_all.shape[0]
    for i0 in range(0, p_own.shape[0], TILE_I):
        pi = p_own[i0:i0 + TILE_I]
        acc = xp.zeros_like(pi)
        for j0 in range(0, n_all, TILE_J):
            d = p_all[None, j0:j0 + TILE_J, :] - pi[:, None, :]
            r2 = (d * d).sum(axis=2) + eps2
            inv = mass[None, j0:j0 + TILE_J] / (r2 * xp.sqrt(r2))
            acc += (d * inv[:, :, None]).sum(axis=1)
        out[i0:i0 + TILE_I] = acc
    return out


def reference(n: int, steps: int, dt: float = 1e-3, eps: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    pos, vel, mass = initial_state(n)
    for _ in range(steps):
        vel = vel + accelerations(np, pos, pos, mass, eps * eps) * dt
        pos = pos + vel * dt
    return pos, vel


def submit_step(q: cl.Queue, p_cur: cl.Buffer, p_next: cl.Buffer, vel: cl.Buffer, mass: cl.Buffer,
                dt: float, eps2: float) -> None:
    n = p_cur.shape[0]

    def cgf(cgh):
        rp = p_cur.access(cgh, cl.all(), cl.read)
        rm = mass.access(cgh, cl.all(), cl.read)
        v = vel.access(cgh, cl.slice(1), cl.read_write)
        wp = p_next.access(cgh, cl.slice(1), cl.discard_write)

        @cgh.parallel_for((n,), name="nbody_step")
        def kernel(chunk):
            i0, i1 = chunk.box.min[0], chunk.box.max[0]
            p_all = rp[0:n, 0:3]
            p_own = p_all[i0:i1]
            v_new = v[i0:i1, 0:3] + accelerations(chunk.xp, p_own, p_all, rm[0:n], eps2) * dt
            v[i0:i1, 0:3] = v_new
            wp[i0:i1, 0:3] = p_own + v_new * dt

    q.submit(cgf)


def run(q: cl.Queue, n: int, steps: int, *, dt: float = 1e-3, eps: float = 0.05, fetch: bool = True,
        progress: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """Integrate ``steps`` steps of ``n`` bodies; returns (positions, velocities) or None with ``fetch=False``."""
    pos, vel, mass = initial_state(n)
    p = [cl.Buffer(pos, name="pos0"), cl.Buffer(shape=pos.shape, dtype=np.float64, name="pos1")]
    v = cl.Buffer(vel, name="vel")
    m = cl.Buffer(mass, name="mass")
    with progress_bar(progress and q.rank == 0) as bar:
        task = bar.add_task("nbody", total=steps)
        for s in range(steps):
            submit_step(q, p[s % 2], p[(s + 1) % 2], v, m, dt, eps * eps)
            bar.advance(task)
    if not fetch:
        return None
    return q.fence(p[steps % 2]).result(), q.fence(v).result()


def main(argv=None) -> int:
    p = base_parser(__doc__, timed=True)
    p.add_argument("-N", "--size", type=positive, default=2048, help="number of bodies")
    p.add_argument("-T", "--steps", type=positive, default=10, help="time steps")
    p.add_argument("--dt", type=finite_float, default=1e-3, help="time step")
    args = p.parse_args(argv)
    q = cl.Queue(devices=args.devices, lookahead=args.lookahead)
    with Timer() as t:
        pos, vel = run(q, args.size, args.steps, dt=args.dt, progress=not args.no_progress)
        q.wait()
    rank, nranks, ndev = q.rank, q.num_ranks, q.num_devices
    q.shutdown()
    if rank == 0:
        ke = 0.5 * float(np.sum(initial_state(args.size)[2][:, None] * vel * vel))
        console.print(f"nbody {args.size} bodies, {args.steps} steps on {nranks} rank(s): {t.seconds:.3f} s, "
                      f"kinetic energy {ke:.6e}", soft_wrap=True)
        if args.json:
            print_timing("nbody", nranks, ndev, args.size, args.steps, t.seconds)
    if args.verify:
        rp, rv = reference(args.size, args.steps, args.dt)
        ok = np.allclose(pos, rp, rtol=1e-9, atol=1e-12) and np.allclose(vel, rv, rtol=1e-9, atol=1e-12)
        return report_verification(ok, rank, "" if ok else f"max position error {np.abs(pos - rp).max()}",
                                   against="numpy (rtol 1e-9)")
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
