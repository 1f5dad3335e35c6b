"""The GPU path: celeritas on ``cuda`` against hand-written CuPy, measured in the same run.

    python -m benchmarks.bench_cuda [--size 8192] [--small 2048] [--steps 100] [--reps 3] [--launches 2000]

Needs CuPy and a CUDA GPU (it says so and exits 2 without them).  Every figure is the
best of ``--reps`` alternating runs after a warm-up (kernel builds, pool allocations).

* **wave_sim, CUDA C kernel**: the wave equation step as a CUDA source kernel (``WAVE``,
  the arithmetic of ``apps.wave_sim``: borders clamp) submitted through celeritas on one
  GPU, against the same kernel launched by hand: a ``cupy.RawKernel`` over the whole
  grid, one launch per step on one stream, the same block shape, synchronised once at
  the end.  At ``--size`` the step is bound by memory bandwidth; at ``--small`` by the
  per-step cost.  Also: the celeritas run with every step compiled before the first one
  runs (the scheduler off the critical path), and on ``cuda:0,0`` (two logical devices
  sharing the GPU: two chunks and a halo copy per step, against the same 1-launch
  baseline).  Under the celeritas figure: the CPU per step of its application,
  scheduler, executor and waiter threads (``benchmarks.threads``) in its fastest run,
  which at ``--small`` add up to the step.
* **wave_sim, array kernel**: ``apps.wave_sim`` as users write it (a Python kernel of
  CuPy array operations on its chunk) against the same CuPy array operations in a plain
  loop over the whole grid.
* **launch cost**: a one-thread source kernel launched ``--launches`` times through
  celeritas (one task each) against a bare ``RawKernel`` launch plus a stream
  synchronisation per launch.
* **transfers**: a ``--size``² field made into a buffer from a host array and read by a
  first kernel (both fields of the step, per field), and fenced home after a kernel
  wrote it, against ``cupy.asarray`` and ``get()`` (a new host array, as a fence hands
  back); the pinned ``get(out=...)`` beside it is the link's speed.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

import celeritas as cl
from apps import wave_sim
from benchmarks.gate import hold, launch_costs, release
from benchmarks.threads import cpu_per_step, format_cpu, thread_cpu

WAVE_SOURCE = """
extern "C" __global__ void wave(CHUNK_PARAMS, ACCESSOR(float, up), ACCESSOR(float, u), float a, float b, float c,
                                long long n) {
    if (!IN_CHUNK()) return;
    long long i = GID(0), j = GID(1);
    float center = AT2(u, i, j);
    float lap = AT2(u, i > 0 ? i - 1 : 0, j) + AT2(u, i < n - 1 ? i + 1 : n - 1, j)
              + AT2(u, i, j > 0 ? j - 1 : 0) + AT2(u, i, j < n - 1 ? j + 1 : n - 1) - 4.0f * center;
    AT2(up, i, j) = a * 2.0f * center - b * AT2(up, i, j) + c * lap;
}
"""
WAVE = cl.Kernel(source={"cuda": WAVE_SOURCE}, name="wave")

TINY_SOURCE = """
extern "C" __global__ void tiny(CHUNK_PARAMS, ACCESSOR(float, x)) {
    if (!IN_CHUNK()) return;
    AT1(x, GID(0)) += 1.0f;
}
"""
TINY = cl.Kernel(source={"cuda": TINY_SOURCE}, name="tiny")

# reads both fields on the GPU before the clock starts, as the hand-written loop's cupy.asarray does
TOUCH = cl.Kernel(source={"cuda": """
extern "C" __global__ void touch(CHUNK_PARAMS, ACCESSOR(float, a), ACCESSOR(float, b)) {}
"""}, name="touch")


@functools.cache
def _initial(n: int) -> np.ndarray:
    """The initial field, computed once per size (8192² takes seconds of numpy); callers copy it."""
    return wave_sim.initial_condition(n)


def _coefficients(s: int) -> tuple[np.float32, np.float32, np.float32]:
    return tuple(np.float32(v) for v in wave_sim.coefficients(s, 0.25, 1.0))   # type: ignore[return-value]


def _sync() -> None:
    import cupy
    cupy.cuda.Device().synchronize()


# ---- celeritas ------------------------------------------------------------------------------------------
def submit_wave_step(q: cl.Queue, up: cl.Buffer, u: cl.Buffer, s: int, n: int) -> None:
    a, b, c = _coefficients(s)

    def cgf(cgh):
        rw = up.access(cgh, cl.one_to_one(), cl.read_write)
        ru = u.access(cgh, cl.neighborhood(1, 1, shape="along_axes"), cl.read)
        cgh.parallel_for((n, n), WAVE, args=(rw, ru, a, b, c, np.int64(n)), name="wave")

    q.submit(cgf)


def wave_celeritas(q: cl.Queue, n: int, steps: int, compiled: bool = False,
                   submit=submit_wave_step, cpu: dict | None = None) -> tuple[float, np.ndarray]:
    """Seconds for ``steps`` steps and the final field.  ``compiled``: every step compiled
    first behind a gate; the gate is a host task on one element of ``u`` (a host task on the
    whole grid would time a copy of it to the GPU).  ``cpu``, where given, gets the CPU µs
    per step by thread role (``benchmarks.threads``): on a GPU a short step is the Python
    of the application, scheduler and executor threads under one GIL."""
    init = _initial(n).copy()
    u = cl.Buffer(init, name="u")
    up = cl.Buffer(init, name="up")

    def touch(cgh):
        cgh.parallel_for((n, n), TOUCH, args=(u.access(cgh, cl.one_to_one(), cl.read),
                                              up.access(cgh, cl.one_to_one(), cl.read)), name="touch")

    q.submit(touch)           # the upload of both fields is set-up, not part of the steps
    q.wait()
    if compiled:
        # a host task on one element of ``u``: its copy back to the GPU is the only work the gate adds
        gate = hold(q, steps, lambda cgh: u.access(cgh, cl.fixed(cl.Subrange((0, 0), (1, 1))), cl.read_write))
    c0 = thread_cpu() if cpu is not None else None
    t0 = time.perf_counter()
    for s in range(steps):
        submit(q, up, u, s, n)
        up, u = u, up
    if compiled:
        t0 = release(q, gate)
    q.wait()                                  # the last kernel has run: the fence's copy home is not timed
    t = time.perf_counter() - t0
    if c0 is not None:
        cpu.update(cpu_per_step(c0, thread_cpu(), steps))
    return t, q.fence(u).result()


def _array_step(q: cl.Queue, up: cl.Buffer, u: cl.Buffer, s: int, n: int) -> None:
    a, b, c = wave_sim.coefficients(s, 0.25, 1.0)
    wave_sim.submit_step(q, up, u, a, b, c, n)


# ---- hand-written CuPy ------------------------------------------------------------------------------------
class HandWritten:
    """wave_sim on one GPU, written directly against CuPy: the same kernel, launch shape and stream use."""

    def __init__(self, n: int):
        import cupy

        from executor.backends.cuda import source_kernel, thread_axes
        self.cupy, self.n = cupy, n
        self.axes = thread_axes("wave", 2, (n, n, 1), None)
        self.kernel = source_kernel(WAVE_SOURCE, "wave", self.axes)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        zero, one = np.int64(0), np.int64(1)
        self.nn = np.int64(n)
        self.box = (zero, zero, zero, self.nn, self.nn, one)   # the chunk, and each field's allocation

    def step(self, up, u, s: int) -> None:
        """Step ``s``: ``up`` from ``u`` and itself, launched on the current stream."""
        box = self.box
        a, b, c = _coefficients(s)
        self.kernel(self.axes.grid, self.axes.block, (*box, up, *box, u, *box, a, b, c, self.nn))

    def run(self, steps: int) -> tuple[float, np.ndarray]:
        cp, n = self.cupy, self.n
        init = _initial(n).copy()
        u, up = cp.asarray(init), cp.asarray(init)
        _sync()
        t0 = time.perf_counter()
        with self.stream:
            for s in range(steps):
                self.step(up, u, s)
                up, u = u, up
            self.stream.synchronize()
        t = time.perf_counter() - t0
        return t, cp.asnumpy(u)


def array_wave_cupy(n: int, steps: int) -> tuple[float, np.ndarray]:
    """apps.wave_sim's kernel body, the same CuPy array operations, over the whole grid in a
    plain loop (one chunk: what the kernel does on one GPU)."""
    import cupy as cp
    u = cp.asarray(_initial(n))
    up = u.copy()
    shift = wave_sim._shift
    _sync()
    t0 = time.perf_counter()
    for s in range(steps):
        a, b, c = (np.float32(x) for x in wave_sim.coefficients(s, 0.25, 1.0))

        def get(ya, yb, xa, xb, u=u):
            return u[ya:yb, xa:xb]

        lap = (shift(cp, get, 0, n, 0, n, -1, 0, n) + shift(cp, get, 0, n, 0, n, 1, 0, n)
               + shift(cp, get, 0, n, 0, n, 0, -1, n) + shift(cp, get, 0, n, 0, n, 0, 1, n) - 4 * u)
        up[...] = a * 2 * u - b * up + c * lap
        up, u = u, up
    _sync()
    t = time.perf_counter() - t0
    return t, cp.asnumpy(u)


# ---- launch cost ------------------------------------------------------------------------------------------
def launches_bare(count: int) -> float:
    """µs per bare launch + stream synchronisation of the same kernel."""
    import cupy

    from executor.backends.cuda import source_kernel, thread_axes
    axes = thread_axes("tiny", 1, (1, 1, 1), None)
    k = source_kernel(TINY_SOURCE, "tiny", axes)
    x = cupy.zeros(1, np.float32)
    zero, one = np.int64(0), np.int64(1)
    args = (zero, zero, zero, one, one, one, x, zero, zero, zero, one, one, one)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for _ in range(10):
            k(axes.grid, axes.block, args)
            stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(count):
            k(axes.grid, axes.block, args)
            stream.synchronize()
        t = time.perf_counter() - t0
    assert float(x[0]) == count + 10
    return t / count * 1e6


# ---- the measurement ------------------------------------------------------------------------------------------
def gpu_name() -> str | None:
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - no CuPy, no driver or no device
        return None


def _best(reps: int, runs: dict) -> tuple[dict, dict]:
    """Each of ``runs`` (name -> thunk returning (seconds, field)) ``reps`` times, alternating."""
    best = {k: float("inf") for k in runs}
    fields: dict = {}
    for _ in range(reps):
        for key, fn in runs.items():
            t, res = fn()
            best[key] = min(best[key], t)
            fields[key] = res
    return best, fields


def measure_wave(q: cl.Queue, n: int, steps: int, reps: int, *, compiled: bool) -> dict:
    """On ``q``'s devices, against the hand-written loop; ``compiled``: also compiled ahead."""
    hw = HandWritten(n)
    wave_celeritas(q, n, 2)                   # warm-up: kernel builds, pool allocations
    hw.run(2)
    timed: list = []        # (seconds, CPU by thread role) of every celeritas run

    def celeritas():
        cpu: dict = {}
        t, field = wave_celeritas(q, n, steps, cpu=cpu)
        timed.append((t, cpu))
        return t, field

    runs = {"celeritas_s": celeritas}
    if compiled:
        runs["compiled_s"] = lambda: wave_celeritas(q, n, steps, compiled=True)
    runs["cupy_s"] = lambda: hw.run(steps)
    best, fields = _best(reps, runs)
    ref = fields["cupy_s"]
    out = {"size": n, "steps": steps, **best, "ratio": best["cupy_s"] / best["celeritas_s"],
           "equal": all(np.array_equal(ref, fields[k]) for k in fields),
           "close": all(np.allclose(ref, fields[k], rtol=1e-5, atol=1e-6) for k in fields),
           "cpu_us_per_step": min(timed, key=lambda r: r[0])[1]}     # (the fastest run's)
    if compiled:
        out["compiled_ratio"] = best["cupy_s"] / best["compiled_s"]
    return out


def measure_array_wave(q: cl.Queue, n: int, steps: int, reps: int) -> dict:
    wave_celeritas(q, n, 2, submit=_array_step)
    array_wave_cupy(n, 2)
    best, fields = _best(reps, {
        "celeritas_s": lambda: wave_celeritas(q, n, steps, submit=_array_step),
        "cupy_s": lambda: array_wave_cupy(n, steps)})
    ref = wave_sim.reference(n, steps) if n <= 1024 else fields["cupy_s"]
    return {"size": n, "steps": steps, **best, "ratio": best["cupy_s"] / best["celeritas_s"],
            "close": all(np.allclose(ref, fields[k], rtol=1e-4, atol=1e-5) for k in fields)}


def transfers_celeritas(q: cl.Queue, n: int) -> tuple[float, float, np.ndarray]:
    """Seconds to bring a new ``n``² buffer to the GPU (its first kernel, ``TOUCH``, after the
    buffer is made from a host array) and to fence it home again after a kernel wrote it."""
    init = _initial(n)
    _sync()
    t0 = time.perf_counter()
    u = cl.Buffer(init, name="u")
    up = cl.Buffer(init, name="up")
    q.submit(lambda cgh: cgh.parallel_for((n, n), TOUCH, args=(u.access(cgh, cl.one_to_one(), cl.read),
                                                              up.access(cgh, cl.one_to_one(), cl.read)),
                                          name="touch"))
    q.wait()
    up_s = (time.perf_counter() - t0) / 2
    submit_wave_step(q, up, u, 0, n)
    q.wait()
    t0 = time.perf_counter()
    field = q.fence(up).result()
    return up_s, time.perf_counter() - t0, field


def transfers_cupy(n: int) -> tuple[float, float, float, np.ndarray]:
    """The same by hand: ``cupy.asarray`` of the host array (per field), then one wave step
    and ``get()`` of the result into a new host array (what a fence hands back), and, as the
    hardware's speed, ``get(out=...)`` into pinned memory allocated beforehand."""
    import cupy
    import cupyx
    init = _initial(n)
    _sync()
    t0 = time.perf_counter()
    u = cupy.asarray(init)
    _sync()
    up_s = time.perf_counter() - t0
    hw = HandWritten(n)
    up = u.copy()
    with hw.stream:
        hw.step(up, u, 0)
    hw.stream.synchronize()
    t0 = time.perf_counter()
    field = up.get()
    down_s = time.perf_counter() - t0
    pinned = cupyx.empty_pinned((n, n), np.float32)
    t0 = time.perf_counter()
    up.get(out=pinned)
    pinned_s = time.perf_counter() - t0
    return up_s, down_s, pinned_s, field


def measure_transfers(q: cl.Queue, n: int, reps: int) -> dict:
    transfers_celeritas(q, 256)
    transfers_cupy(256)
    best = {k: float("inf") for k in ("up_s", "down_s", "cupy_up_s", "cupy_down_s", "cupy_pinned_s")}
    equal = True
    for _ in range(reps):
        up_s, down_s, f1 = transfers_celeritas(q, n)
        cu, cd, cp_, f2 = transfers_cupy(n)
        equal = equal and bool(np.array_equal(f1, f2))
        for k, v in zip(best, (up_s, down_s, cu, cd, cp_)):
            best[k] = min(best[k], v)
    return {"size": n, **best, "equal": equal, "mib": n * n * 4 / 2**20}


def measure(size: int, small: int, steps: int, reps: int, launches: int) -> dict:
    """One runtime per process: first everything on ``cuda``, then ``cuda:0,0`` (two logical
    devices sharing the GPU) against the hand-written loop again."""
    name = gpu_name()
    if name is None:
        raise SystemExit(2)
    out: dict = {"gpu": name}
    q = cl.Queue(devices="cuda")
    try:
        out["wave"] = [measure_wave(q, n, steps, reps, compiled=True) for n in (size, small)]
        out["array_wave"] = [measure_array_wave(q, n, steps, reps) for n in (size, small)]
        lc, lg, lb = launch_costs(q, TINY, launches, reps, launches_bare)
        out.update(launch_celeritas_us=lc, launch_compiled_us=lg, launch_bare_us=lb)
        out["transfers"] = measure_transfers(q, size, reps)
    finally:
        q.shutdown()
    q = cl.Queue(devices="cuda:0,0")
    try:
        out["wave_two_devices"] = [measure_wave(q, n, steps, reps, compiled=False) for n in (size, small)]
    finally:
        q.shutdown()
    return out


def main(argv=None) -> dict:
    from rich.console import Console
    from rich.table import Table
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--small", type=int, default=2048)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--launches", type=int, default=2000)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    if gpu_name() is None:
        Console(stderr=True).print("bench_cuda needs CuPy and a CUDA GPU; none is visible here")
        sys.exit(2)
    r = measure(args.size, args.small, args.steps, args.reps, args.launches)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    t = Table(title=f"cuda, {r['gpu']}: celeritas against hand-written CuPy (best of {args.reps}, alternating)")
    for col in ("benchmark", "celeritas", "compiled ahead", "cuda:0,0", "hand-written", "ratio"):
        t.add_column(col, justify="left" if col == "benchmark" else "right")
    for w, w2 in zip(r["wave"], r["wave_two_devices"]):
        s = w["steps"]
        cpu = w.get("cpu_us_per_step")
        t.add_row(f"wave_sim {w['size']}² × {s}, CUDA C kernel, µs/step", f"{w['celeritas_s'] / s * 1e6:.1f}"
                  + (f"\n(CPU {format_cpu(cpu)})" if cpu else ""),
                  f"{w['compiled_s'] / s * 1e6:.1f} ({w['compiled_ratio']:.2f}×)",
                  f"{w2['celeritas_s'] / s * 1e6:.1f} ({w2['ratio']:.2f}×)",
                  f"{w['cupy_s'] / s * 1e6:.1f} (RawKernel)", f"{w['ratio']:.2f}"
                  + ("" if w["close"] and w2["close"] else " RESULTS DIFFER"))
    for w in r["array_wave"]:
        s = w["steps"]
        t.add_row(f"wave_sim {w['size']}² × {s}, array kernel, µs/step", f"{w['celeritas_s'] / s * 1e6:.1f}", "", "",
                  f"{w['cupy_s'] / s * 1e6:.1f} (CuPy arrays)", f"{w['ratio']:.2f}"
                  + ("" if w["close"] else " RESULTS DIFFER"))
    t.add_row("one-thread source kernel, µs/launch", f"{r['launch_celeritas_us']:.1f}",
              f"{r['launch_compiled_us']:.1f}", "", f"{r['launch_bare_us']:.1f} (launch + sync)",
              f"{r['launch_bare_us'] / r['launch_celeritas_us']:.2f}")
    x = r["transfers"]
    gbs = x["mib"] * 2**20 / 1e9
    for what, ours, theirs, note in (("to the GPU (a new buffer's first kernel)", x["up_s"], x["cupy_up_s"],
                                      "cupy.asarray"),
                                     ("home (fence)", x["down_s"], x["cupy_down_s"],
                                      f"get(); {gbs / x['cupy_pinned_s']:.1f} GB/s pinned")):
        t.add_row(f"{x['size']}² field ({x['mib']:.0f} MiB) {what}, GB/s", f"{gbs / ours:.1f}", "", "",
                  f"{gbs / theirs:.1f} ({note})", f"{theirs / ours:.2f}" + ("" if x["equal"] else " RESULTS DIFFER"))
    Console().print(t)
    return r


if __name__ == "__main__":
    main()
