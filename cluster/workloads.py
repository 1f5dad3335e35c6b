"""The applications as timed workloads: one place that knows how to run each app for a given size.

The scaling harness (through ``cluster.run_app`` under ``mpiexec``/``srun``) and the
dry-run study share this table.  A workload is split into ``prepare`` (host-side
inputs, not timed: every rank would build them anyway and numpy set-up is not
what a scaling study measures) and ``run`` (submits the steps; ends without
gathering results, because fencing a whole buffer to every rank is an all-gather
whose cost grows with the rank count and would hide the scaling of the steps).

Apps with a ``handwritten`` baseline also exist as plain mpi4py + numpy programs
doing the same arithmetic on the same decomposition, written as an MPI expert would
(persistent requests on numpy rows and planes, ``Allgatherv`` in place): the scaling
harness runs them beside celeritas (``python -m cluster.workloads --handwritten APP``
under ``mpiexec`` prints the same timing line as ``cluster.run_app``).
"""
from __future__ import annotations

import argparse
import csv
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

import celeritas as cl


@dataclass(frozen=True)
class Workload:
    name: str
    prepare: Callable[[int], Any]                       # size -> host inputs
    run: Callable[[cl.Queue, Any, int, int], None]      # (queue, inputs, size, steps)
    size: int                                           # default problem size (strong scaling base)
    steps: int                                          # default step count
    dims: int                                           # work per step grows like size ** dims
    unit: str = "edge length"
    dry_size: int | None = None                         # dry-run default: big enough for 1024 ranks, host data small
    # (mpi4py communicator, inputs, size, steps) -> this rank's part of the result: the
    # same computation written by hand against mpi4py + numpy (None: no such baseline)
    handwritten: Callable[[Any, Any, int, int], Any] | None = None

    def dry_run_size(self) -> int:
        return self.dry_size if self.dry_size is not None else self.size

    def weak_size(self, base: int, ranks: float) -> int:
        """The size whose work per step is ``ranks`` times that of ``base``."""
        return max(1, int(round(base * ranks ** (1.0 / self.dims))))


def _none(size: int) -> None:
    return None


# ---- apps owned by others: drive their public step functions ---------------------------
def _wave_prepare(n: int) -> np.ndarray:
    from apps import wave_sim
    return wave_sim.initial_condition(n)


def _wave_run(q: cl.Queue, init: np.ndarray, n: int, steps: int) -> None:
    from apps import wave_sim
    u = cl.Buffer(init, name="u")
    up = cl.Buffer(init, name="up")
    for s in range(steps):
        a, b, c = wave_sim.coefficients(s, 0.25, 1.0)
        wave_sim.submit_step(q, up, u, a, b, c, n)
        up, u = u, up
    q.wait()


def _matmul_prepare(n: int):
    from apps import matmul
    return matmul.inputs(n)


def _matmul_run(q: cl.Queue, ab, n: int, steps: int) -> None:
    from apps import matmul
    a = cl.Buffer(ab[0], name="A")
    b = cl.Buffer(ab[1], name="B")
    c = cl.Buffer(shape=(n, n), dtype=np.float32, name="C")
    for _ in range(steps):
        matmul.submit_matmul(q, a, b, c)
    q.wait()


# ---- the apps of this directory's issue: their run() with fetch=False ------------------
def _conv_prepare(n: int) -> np.ndarray:
    from apps import convolution
    return convolution.synthetic_image(n, n)


def _conv_run(q, image, n, steps):
    from apps import convolution
    convolution.run(q, image, iterations=steps, fetch=False)
    q.wait()


def _reduction_prepare(n: int) -> np.ndarray:
    from apps import reduction
    return reduction.low_contrast_image(n, n)


def _reduction_run(q, image, n, steps):
    from apps import reduction
    reduction.run(q, image, repeat=steps, fetch=False)
    q.wait()


def _nbody_run(q, _, n, steps):
    from apps import nbody
    nbody.run(q, n, steps, fetch=False)
    q.wait()


def _jacobi_run(q, _, n, steps):
    from apps import jacobi3d
    jacobi3d.run(q, n, steps, tol=0.0, check_every=max(1, steps), fetch=False)   # fixed step count
    q.wait()


def _rsim_run(q, _, n, steps):
    from apps import rsim
    rsim.run(q, n, steps, fetch=False)
    q.wait()


# ---- hand-written mpi4py baselines -------------------------------------------------------
def split_1d(n: int, parts: int, index: int) -> tuple[int, int]:
    """celeritas' ``split_1d`` of ``n`` items: equal chunks, the remainder spread from the front."""
    base, extra = divmod(n, parts)
    lo = index * base + min(index, extra)
    return lo, lo + base + (1 if index < extra else 0)


def wave_mpi4py(comm: Any, init: np.ndarray, n: int, steps: int) -> tuple[np.ndarray, int, int]:
    """wave_sim split by rows, one halo row per neighbour and step, the kernel's arithmetic.

    Each rank keeps its rows plus a ghost row per neighbour in two numpy arrays; the halo
    exchange is a set of persistent requests per array (receives into the ghost rows,
    sends straight from the boundary rows), started together, completed with one
    ``Waitall``.  Returns (this rank's rows of the final field, first row, end row)."""
    from mpi4py import MPI

    from apps import wave_sim
    rank, size = comm.Get_rank(), comm.Get_size()
    y0, y1 = split_1d(n, size, rank)
    g0, g1 = max(y0 - 1, 0), min(y1 + 1, n)
    bufs = (init[g0:g1].copy(), init[g0:g1].copy())

    def exchange(u: np.ndarray) -> list:
        reqs = []
        if rank > 0:                 # my first row up, the upper neighbour's last row into my top ghost
            reqs += [comm.Recv_init(u[0], rank - 1, 2), comm.Send_init(u[y0 - g0], rank - 1, 1)]
        if rank < size - 1:          # my last row down, the lower neighbour's first row into my bottom ghost
            reqs += [comm.Recv_init(u[y1 - g0], rank + 1, 1), comm.Send_init(u[y1 - 1 - g0], rank + 1, 2)]
        return reqs

    halo = (exchange(bufs[0]), exchange(bufs[1]))
    cur = 0                          # bufs[cur] is u, the other up
    for s in range(steps):
        a, b, c = (np.float32(v) for v in wave_sim.coefficients(s, 0.25, 1.0))
        u, up = bufs[cur], bufs[1 - cur]
        reqs = halo[cur]
        if reqs:
            MPI.Prequest.Startall(reqs)
            MPI.Request.Waitall(reqs)

        def get(ya, yb, xa, xb, _u=u):
            return _u[ya - g0:yb - g0, xa:xb]

        center = get(y0, y1, 0, n)
        lap = (wave_sim._shift(np, get, y0, y1, 0, n, -1, 0, n) + wave_sim._shift(np, get, y0, y1, 0, n, 1, 0, n)
               + wave_sim._shift(np, get, y0, y1, 0, n, 0, -1, n) + wave_sim._shift(np, get, y0, y1, 0, n, 0, 1, n)
               - 4 * center)
        rw = up[y0 - g0:y1 - g0]
        rw[...] = a * 2 * center - b * rw + c * lap
        cur = 1 - cur
    for reqs in halo:
        for r in reqs:
            r.Free()
    return bufs[cur][y0 - g0:y1 - g0], y0, y1


def _wave_handwritten(comm, init, n, steps):
    return wave_mpi4py(comm, init, n, steps)[0]


def nbody_mpi4py(comm: Any, _inputs: Any, n: int, steps: int, dt: float = 1e-3, eps: float = 0.05) -> np.ndarray:
    """All-pairs n-body: each rank moves its bodies (split_1d) against all positions, then the
    new positions are gathered into every rank's next position array (``Allgatherv``)."""
    from mpi4py import MPI

    from apps import nbody
    rank, size = comm.Get_rank(), comm.Get_size()
    pos, vel, mass = nbody.initial_state(n)
    parts = [split_1d(n, size, r) for r in range(size)]
    i0, i1 = parts[rank]
    counts = [3 * (hi - lo) for lo, hi in parts]
    displs = [3 * lo for lo, _hi in parts]
    p_cur, p_next = pos.copy(), np.empty_like(pos)
    v = vel[i0:i1].copy()
    eps2 = eps * eps
    for _ in range(steps):
        p_own = p_cur[i0:i1]
        v = v + nbody.accelerations(np, p_own, p_cur, mass, eps2) * dt
        own = p_own + v * dt
        comm.Allgatherv(own, [p_next, counts, displs, MPI.DOUBLE])
        p_cur, p_next = p_next, p_cur
    return p_cur


def jacobi_mpi4py(comm: Any, _inputs: Any, n: int, steps: int) -> tuple[float, np.ndarray, int]:
    """Jacobi 3-D split by x planes of the interior, one ghost plane per neighbour and step
    (persistent requests), the residual of the last step reduced with ``allreduce``.
    Returns (residual, this rank's planes of the final field with a ghost plane each side,
    the first of those planes' x)."""
    from mpi4py import MPI

    from apps import jacobi3d
    rank, size = comm.Get_rank(), comm.Get_size()
    lo, hi = split_1d(n - 2, size, rank)
    x0, x1 = lo + 1, hi + 1                   # owned interior planes
    init = jacobi3d.initial_condition(n)
    bufs = (init[x0 - 1:x1 + 1].copy(), init[x0 - 1:x1 + 1].copy())

    def exchange(u: np.ndarray) -> list:
        reqs = []
        if rank > 0:
            reqs += [comm.Recv_init(u[0], rank - 1, 4), comm.Send_init(u[1], rank - 1, 3)]
        if rank < size - 1:
            reqs += [comm.Recv_init(u[-1], rank + 1, 3), comm.Send_init(u[-2], rank + 1, 4)]
        return reqs

    halo = (exchange(bufs[0]), exchange(bufs[1]))
    cur = 0
    i = slice(1, n - 1)
    res = 0.0
    for it in range(steps):
        a, b = bufs[cur], bufs[1 - cur]
        reqs = halo[cur]
        if reqs:
            MPI.Prequest.Startall(reqs)
            MPI.Request.Waitall(reqs)
        new = jacobi3d.update(a[:-2, i, i], a[2:, i, i], a[1:-1, :-2, i], a[1:-1, 2:, i], a[1:-1, i, :-2],
                              a[1:-1, i, 2:])
        if it == steps - 1:
            res = comm.allreduce(float(np.abs(new - a[1:-1, i, i]).max()), op=MPI.MAX)
        b[1:-1, i, i] = new
        cur = 1 - cur
    for reqs in halo:
        for r in reqs:
            r.Free()
    return res, bufs[cur], x0 - 1


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("wave_sim", _wave_prepare, _wave_run, size=2048, steps=50, dims=2, dry_size=1024,
             handwritten=_wave_handwritten),
    Workload("matmul", _matmul_prepare, _matmul_run, size=1024, steps=4, dims=3, dry_size=1024),
    Workload("convolution", _conv_prepare, _conv_run, size=2048, steps=2, dims=2, dry_size=1024),
    Workload("reduction", _reduction_prepare, _reduction_run, size=4096, steps=4, dims=2, dry_size=1024),
    Workload("nbody", _none, _nbody_run, size=2048, steps=5, dims=2, unit="bodies", dry_size=1024,
             handwritten=nbody_mpi4py),
    Workload("jacobi3d", _none, _jacobi_run, size=128, steps=50, dims=3, dry_size=128, handwritten=jacobi_mpi4py),
    Workload("rsim", _none, _rsim_run, size=1024, steps=100, dims=2, unit="patches", dry_size=1024),
)}


def get(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise SystemExit(f"unknown app {name!r}; choose one of {', '.join(WORKLOADS)}") from None


def write_csv(rows: Sequence[dict], path: Path, fields: Sequence[str]) -> Path:
    """One row per measurement, floats to 6 significant digits (what the studies plot from)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        wr.writeheader()
        for row in rows:
            wr.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return path


def app_list(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The apps of an ``--app a,b`` option, each a known workload, in order and without repeats;
    a usage error (``parser.error``) for an unknown name or an empty list."""
    apps = list(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    if not apps:
        parser.error(f"argument --app: name one or more of {', '.join(WORKLOADS)}, got {text!r}")
    for a in apps:
        if a not in WORKLOADS:
            parser.error(f"argument --app: unknown app {a!r}; choose one of {', '.join(WORKLOADS)}")
    return apps


def count_list(option: str, what: str) -> Callable[[str], list[int]]:
    """An argparse ``type`` for ``--ranks 1,2,4``-style options: sorted distinct positive ints."""
    def parse(text: str) -> list[int]:
        try:
            counts = sorted({int(x) for x in text.split(",") if x.strip()})
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{option} takes a comma-separated list of integers, got {text!r}") from None
        if not counts or counts[0] < 1:
            raise argparse.ArgumentTypeError(f"{option} needs positive {what} counts, got {text!r}")
        return counts
    return parse


def measure_handwritten(app: str, size: int | None = None, steps: int | None = None) -> dict:
    """Time the hand-written baseline of ``app`` on this process's MPI rank, as ``cluster.run_app``
    times the celeritas run: from a barrier after set-up to a barrier after the last step."""
    from mpi4py import MPI

    from celeritas.runtime import baseline_allocator
    baseline_allocator()      # (malloc as the celeritas run sets it: see there)
    w = get(app)
    if w.handwritten is None:
        raise SystemExit(f"{app} has no hand-written baseline")
    size = w.size if size is None else size
    steps = w.steps if steps is None else steps
    comm = MPI.COMM_WORLD
    inputs = w.prepare(size)
    comm.Barrier()
    t0 = time.perf_counter()
    w.handwritten(comm, inputs, size, steps)
    comm.Barrier()
    seconds = time.perf_counter() - t0
    return {"app": app, "impl": "mpi4py", "rank": comm.Get_rank(), "ranks": comm.Get_size(), "devices": 1,
            "backend": "numpy", "size": size, "steps": steps, "seconds": seconds}


def main(argv=None) -> int:
    import json
    p = argparse.ArgumentParser(description="Run an app's hand-written mpi4py baseline on every rank of an MPI "
                                            "job; rank 0 prints one JSON timing line.")
    p.add_argument("--handwritten", required=True, choices=sorted(k for k, w in WORKLOADS.items() if w.handwritten))
    from apps._common import positive
    p.add_argument("--size", type=positive, default=None)
    p.add_argument("--steps", type=positive, default=None)
    args = p.parse_args(argv)
    info = measure_handwritten(args.handwritten, args.size, args.steps)
    if info["rank"] == 0:
        print(json.dumps(info), flush=True)
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
