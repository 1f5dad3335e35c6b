"""Runtime overheads against baselines measured in the same run.

1. N independent tiny tasks on ``host:4`` (µs per task) beside Dask's threaded scheduler.
2. A 128² 2-D stencil (wave_sim's step) for 500 iterations on ``host:4`` (µs per
   iteration), beside two numpy loops: the whole array at once, and the honest floor
   for ``host:4``, the same four row blocks ``host:4`` computes, each with its own
   arrays and ghost rows, halo rows copied between blocks every iteration.
3. The same stencil with no-op kernels (same accessors, same split): the runtime alone.
4. wave_sim 4096² on one rank against a plain numpy loop of the same arithmetic.

    python -m benchmarks.bench_runtime [--quick] [--repeat N] [--only tiny,stencil,wave]

With ``--repeat N`` every measurement (celeritas and baseline alike) is taken N
times in alternation and the best is reported: on a small, shared machine the
minimum is the number least disturbed by other processes.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

import celeritas as cl
from apps import wave_sim
from benchmarks.threads import cpu_per_step, format_cpu, thread_cpu


def tiny_tasks(n: int, devices: str = "host:4", cpu: dict | None = None) -> float:
    """µs per task; ``cpu``, where given, gets the CPU µs per task by thread role (``threads``)."""
    q = cl.Queue(devices=devices)
    q.wait()

    def cgf(cgh):
        cgh.parallel_for((4,), _noop, name="tiny")

    c0 = thread_cpu()
    t0 = time.perf_counter()
    for _ in range(n):
        q.submit(cgf)
    q.wait()
    dt = time.perf_counter() - t0
    if cpu is not None:
        cpu.update(cpu_per_step(c0, thread_cpu(), n))
    q.shutdown()
    return dt / n * 1e6


def _noop(chunk):
    return None


def dask_tiny_tasks(n: int) -> float | None:
    try:
        import dask
    except ImportError:
        return None
    tasks = [dask.delayed(_noop)(i) for i in range(n)]
    t0 = time.perf_counter()
    dask.compute(*tasks, scheduler="threads", num_workers=4)
    return (time.perf_counter() - t0) / n * 1e6


def stencil(n: int, iterations: int, devices: str = "host:4", noop: bool = False, cpu: dict | None = None) -> float:
    """µs per iteration of wave_sim's step on ``devices`` (``noop``: a kernel that does nothing);
    ``cpu``, where given, gets the CPU µs per iteration by thread role (``threads``)."""
    q = cl.Queue(devices=devices)
    a = cl.Buffer(np.ones((n, n), np.float32))
    b = cl.Buffer(np.ones((n, n), np.float32))
    q.wait()
    c0 = thread_cpu()
    t0 = time.perf_counter()
    for _ in range(iterations):
        if noop:
            noop_step(q, a, b)
        else:
            wave_sim.submit_step(q, a, b, 1.0, 1.0, 0.1, n)
        a, b = b, a
    q.wait()
    dt = time.perf_counter() - t0
    if cpu is not None:
        cpu.update(cpu_per_step(c0, thread_cpu(), iterations))
    q.shutdown()
    return dt / iterations * 1e6


def noop_step(q: cl.Queue, up: cl.Buffer, u: cl.Buffer) -> None:
    """wave_sim's step with the same accessors and split, and a kernel that does nothing."""
    def cgf(cgh):
        up.access(cgh, cl.one_to_one(), cl.read_write)
        u.access(cgh, cl.neighborhood(1, 1, shape="along_axes"), cl.read)
        cgh.parallel_for(up.shape, _noop, name="step")
    q.submit(cgf)


def block_rows(n: int, blocks: int) -> list[tuple[int, int]]:
    """split_1d's row chunks: equal, the remainder spread from the front."""
    base, extra = divmod(n, blocks)
    out, lo = [], 0
    for k in range(blocks):
        hi = lo + base + (1 if k < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def blocks_stencil_field(init: np.ndarray, iterations: int, coefficients, blocks: int = 4) -> np.ndarray:
    """The stencil as ``host:N`` computes it, by hand: row blocks with their own arrays (owned
    rows plus one ghost row per neighbour), each iteration the halo rows copied into the
    neighbours' ghost rows and every block computed with wave_sim's kernel expressions.
    ``coefficients(i)`` gives (a, b, c) of iteration i.  Returns the final field."""
    n = init.shape[0]
    parts = []
    for y0, y1 in block_rows(n, blocks):
        g0, g1 = max(y0 - 1, 0), min(y1 + 1, n)
        parts.append((y0, y1, g0, [init[g0:g1].copy(), init[g0:g1].copy()]))
    cur = 0
    for it in range(iterations):
        a, b, c = (np.float32(v) for v in coefficients(it))
        for k in range(len(parts) - 1):                 # halos of the current field
            ya0, ya1, ga0, pa = parts[k]
            yb0, yb1, gb0, pb = parts[k + 1]
            pb[cur][yb0 - 1 - gb0] = pa[cur][ya1 - 1 - ga0]
            pa[cur][ya1 - ga0] = pb[cur][yb0 - gb0]
        for y0, y1, g0, pair in parts:
            u, up = pair[cur], pair[1 - cur]

            def get(ya, yb, xa, xb, _u=u, _g0=g0):
                return _u[ya - _g0:yb - _g0, xa:xb]

            center = get(y0, y1, 0, n)
            lap = (wave_sim._shift(np, get, y0, y1, 0, n, -1, 0, n) + wave_sim._shift(np, get, y0, y1, 0, n, 1, 0, n)
                   + wave_sim._shift(np, get, y0, y1, 0, n, 0, -1, n)
                   + wave_sim._shift(np, get, y0, y1, 0, n, 0, 1, n) - 4 * center)
            rw = up[y0 - g0:y1 - g0]
            rw[...] = a * 2 * center - b * rw + c * lap
        cur = 1 - cur
    return np.concatenate([pair[cur][y0 - g0:y1 - g0] for y0, y1, g0, pair in parts], axis=0)


def numpy_blocks_stencil(n: int, iterations: int, blocks: int = 4) -> float:
    """µs per iteration of ``blocks_stencil_field`` with the benchmark's coefficients."""
    init = np.ones((n, n), np.float32)
    t0 = time.perf_counter()
    blocks_stencil_field(init, iterations, lambda it: (1.0, 1.0, 0.1), blocks)
    return (time.perf_counter() - t0) / iterations * 1e6


def numpy_stencil(n: int, iterations: int) -> float:
    up = np.ones((n, n), np.float32)
    u = np.ones((n, n), np.float32)
    t0 = time.perf_counter()
    for _ in range(iterations):
        up = wave_sim.step_arrays(up, u, np.float32(1), np.float32(1), np.float32(0.1))
        up, u = u, up
    return (time.perf_counter() - t0) / iterations * 1e6


def timed_wave(n: int, steps: int, devices: str = "host:1") -> tuple[float, np.ndarray]:
    """(seconds, final field) for ``steps`` wave_sim steps plus the fence of the result (set-up excluded)."""
    init = wave_sim.initial_condition(n)
    q = cl.Queue(devices=devices)
    u = cl.Buffer(init, name="u")
    up = cl.Buffer(init, name="up")
    q.wait()
    t0 = time.perf_counter()
    for s in range(steps):
        a, b, c = wave_sim.coefficients(s, 0.25, 1.0)
        wave_sim.submit_step(q, up, u, a, b, c, n)
        up, u = u, up
    result = q.fence(u).result()
    dt = time.perf_counter() - t0
    q.shutdown()
    return dt, result


def wave(n: int, steps: int, devices: str = "host:1") -> float:
    """Seconds for ``steps`` wave_sim steps plus the fence of the result (set-up excluded)."""
    return timed_wave(n, steps, devices)[0]


def numpy_wave(n: int, steps: int) -> float:
    """The same arithmetic as a plain numpy loop (set-up excluded)."""
    u = wave_sim.initial_condition(n)
    up = u.copy()
    t0 = time.perf_counter()
    for s in range(steps):
        a, b, c = wave_sim.coefficients(s, 0.25, 1.0)
        up = wave_sim.step_arrays(up, u, np.float32(a), np.float32(b), np.float32(c))
        up, u = u, up
    return time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (CI smoke run)")
    p.add_argument("--tasks", type=int, default=2500)
    p.add_argument("--iterations", type=int, default=500)
    p.add_argument("--wave-size", type=int, default=4096)
    p.add_argument("--wave-steps", type=int, default=10)
    p.add_argument("--repeat", type=int, default=1, help="take each measurement N times, report the best")
    p.add_argument("--only", default="tiny,stencil,noop,wave", help="comma-separated subset of tiny,stencil,noop,wave")
    args = p.parse_args(argv)
    only = set(args.only.split(","))
    rep = max(1, args.repeat)
    if args.quick:
        args.tasks, args.iterations, args.wave_size, args.wave_steps = 300, 50, 512, 5
    console = Console()
    t = Table(title="celeritas runtime overheads (baselines run in the same process)")
    for col in ("benchmark", "celeritas", "baseline", "ratio", "goal"):
        t.add_column(col, justify="right" if col != "benchmark" else "left")

    if "tiny" in only:
        runs: list = []
        us, dk = best_alternating(rep, _with_cpu(runs, lambda cpu: tiny_tasks(args.tasks, cpu=cpu)),
                       lambda: dask_tiny_tasks(args.tasks))
        t.add_row(f"{args.tasks} tiny tasks, host:4", f"{us:.1f} µs/task\n(CPU {_cpu_of(runs)})",
                  f"{dk:.1f} µs/task (dask threads)" if dk else "dask not installed",
                  f"{dk / us:.2f}× faster" if dk else "-", "≤ 40 µs/task, ≥ 6× dask")
    if "stencil" in only:
        runs = []
        it, base = best_alternating(rep, _with_cpu(runs, lambda cpu: stencil(128, args.iterations, cpu=cpu)),
                         lambda: numpy_stencil(128, args.iterations))
        _, blk = best_alternating(rep, lambda: 0.0, lambda: numpy_blocks_stencil(128, args.iterations))
        t.add_row(f"128² stencil × {args.iterations}, host:4", f"{it:.1f} µs/iter\n(CPU {_cpu_of(runs)})",
                  f"{base:.1f} µs/iter (numpy, whole array); {blk:.1f} (numpy, the 4 blocks of host:4)",
                  f"{blk / it:.2f} of the 4-block loop", "≤ 150 µs/iter")
    if "noop" in only:
        runs = []
        it, _ = best_alternating(rep, _with_cpu(runs, lambda cpu: stencil(128, args.iterations, noop=True, cpu=cpu)),
                      lambda: None)
        t.add_row(f"128² stencil × {args.iterations}, no-op kernels, host:4",
                  f"{it:.1f} µs/iter\n(CPU {_cpu_of(runs)})", "-", "-", "≤ 60 µs/iter")
    if "wave" in only:
        w, nw = best_alternating(rep, lambda: wave(args.wave_size, args.wave_steps),
                      lambda: numpy_wave(args.wave_size, args.wave_steps))
        t.add_row(f"wave_sim {args.wave_size}² × {args.wave_steps}, 1 rank", f"{w:.3f} s", f"{nw:.3f} s (numpy)",
                  f"{nw / w:.3f} of numpy", "≥ 0.97")
    console.print(t)


def _with_cpu(runs: list, fn):
    """``fn(cpu)`` as a run for ``best_alternating`` that keeps (time, CPU by thread role) in ``runs``."""
    def run() -> float:
        cpu: dict = {}
        t = fn(cpu)
        runs.append((t, cpu))
        return t
    return run


def _cpu_of(runs: list) -> str:
    """The CPU by thread role of the fastest of ``runs`` (µs per task or iteration)."""
    return format_cpu(min(runs, key=lambda r: r[0])[1])


def best_alternating(repeat: int, ours, baseline) -> tuple[float, float | None]:
    """Minimum of ``repeat`` alternating runs of ``ours`` and ``baseline`` (None stays None)."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(repeat):
        a.append(ours())
        r = baseline()
        if r is not None:
            b.append(r)
    if repeat > 1:
        print(f"  samples: {', '.join(f'{x:.4g}' for x in a)} | baseline: {', '.join(f'{x:.4g}' for x in b)}")
    return min(a), (min(b) if b else None)


if __name__ == "__main__":
    main()
