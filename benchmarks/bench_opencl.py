"""The device path: celeritas on ``opencl`` against hand-written pyopencl, measured in the same run.

    python -m benchmarks.bench_opencl [--size 1024] [--steps 50] [--reps 3] [--launches 2000]

The stand-in for GPU figures while no GPU is at hand: two PoCL CPU devices
(``POCL_DEVICES="pthread pthread"``, set here unless already set), both with
the same OpenCL C source kernel.

* **wave_sim**: the wave equation step as an OpenCL C kernel (``WAVE``, the same
  arithmetic as ``apps.wave_sim``: borders clamp), submitted through celeritas
  on both devices (split into two row chunks, one halo row exchanged per device
  and step), against a hand-written pyopencl loop that keeps each device's rows
  plus ghost rows in zero-copy buffers (``USE_HOST_PTR`` over page-aligned host
  arrays, as the backend does), enqueues the same kernel on both devices' queues,
  waits, and copies the halo rows between the two devices' host arrays.  Both
  final fields are compared.  Also: the celeritas run with every step compiled
  before the first one runs (the scheduler off the critical path).
* **launch cost**: a one-work-item source kernel launched ``--launches`` times
  through celeritas (one task each, one device) against a bare
  ``enqueue_nd_range_kernel(...).wait()`` loop on the same device.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("POCL_DEVICES", "pthread pthread")
os.environ.setdefault("POCL_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"celeritas-bench-pocl-{os.getuid()}"))

import numpy as np  # noqa: E402

import celeritas as cl  # noqa: E402
from apps import wave_sim  # noqa: E402
from benchmarks.gate import hold, launch_costs, release  # noqa: E402

WAVE_SOURCE = """
__kernel void wave(CHUNK_PARAMS, ACCESSOR(float, up), ACCESSOR(float, u), float a, float b, float c, long n) {
    long i = GID(0), j = GID(1);
    float center = AT2(u, i, j);
    float lap = AT2(u, i > 0 ? i - 1 : 0, j) + AT2(u, i < n - 1 ? i + 1 : n - 1, j)
              + AT2(u, i, j > 0 ? j - 1 : 0) + AT2(u, i, j < n - 1 ? j + 1 : n - 1) - 4.0f * center;
    AT2(up, i, j) = a * 2.0f * center - b * AT2(up, i, j) + c * lap;
}
"""
WAVE = cl.Kernel(source={"opencl": WAVE_SOURCE}, name="wave")

TINY_SOURCE = """
__kernel void tiny(CHUNK_PARAMS, ACCESSOR(float, x)) {
    long i = GID(0);
    AT1(x, i) += 1.0f;
}
"""
TINY = cl.Kernel(source={"opencl": TINY_SOURCE}, name="tiny")


def _coefficients(s: int) -> tuple[np.float32, np.float32, np.float32]:
    return tuple(np.float32(v) for v in wave_sim.coefficients(s, 0.25, 1.0))   # type: ignore[return-value]


def submit_wave_step(q: cl.Queue, up: cl.Buffer, u: cl.Buffer, s: int, n: int) -> None:
    a, b, c = _coefficients(s)

    def cgf(cgh):
        rw = up.access(cgh, cl.one_to_one(), cl.read_write)
        ru = u.access(cgh, cl.neighborhood(1, 1, shape="along_axes"), cl.read)
        cgh.parallel_for((n, n), WAVE, args=(rw, ru, a, b, c, np.int64(n)), name="wave")

    q.submit(cgf)


def wave_celeritas(q: cl.Queue, n: int, steps: int, compiled: bool = False) -> tuple[float, np.ndarray]:
    """Seconds for ``steps`` steps and the final field; ``compiled``: every step compiled first,
    behind a gate (a host task over the grid waiting for an event), the clock starting at the gate."""
    init = wave_sim.initial_condition(n)
    u = cl.Buffer(init, name="u")
    up = cl.Buffer(init, name="up")
    q.wait()
    if compiled:
        gate = hold(q, steps, lambda cgh: u.access(cgh, cl.one_to_one(), cl.read_write), range=(n, n))
    t0 = time.perf_counter()
    for s in range(steps):
        submit_wave_step(q, up, u, s, n)
        up, u = u, up
    if compiled:
        t0 = release(q, gate)
    result = q.fence(u).result()
    return time.perf_counter() - t0, result


def _aligned(shape: tuple[int, ...], dtype=np.float32, align: int = 4096) -> np.ndarray:
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes].view(dtype).reshape(shape)


class HandWritten:
    """wave_sim on the backend's first two OpenCL devices, written directly against pyopencl."""

    def __init__(self, n: int):
        import pyopencl as ocl

        from executor.backends.opencl import PRELUDE, opencl_devices
        self.ocl = ocl
        devs = opencl_devices()[:2]
        if len(devs) < 2:
            raise SystemExit("bench_opencl needs two OpenCL devices (POCL_DEVICES='pthread pthread')")
        self.n = n
        half = n // 2
        self.rows = [(0, half), (half, n)]                  # owned rows per device, as split_1d makes them
        self.ctx = [ocl.Context([d]) for d in devs]
        self.queue = [ocl.CommandQueue(c, d) for c, d in zip(self.ctx, devs)]
        self.kernel = [ocl.Kernel(ocl.Program(c, PRELUDE + WAVE_SOURCE).build(), "wave") for c in self.ctx]
        self.ghost = []                                     # (first row held, rows held) per device
        for y0, y1 in self.rows:
            g0, g1 = max(y0 - 1, 0), min(y1 + 1, n)
            self.ghost.append((g0, g1 - g0))

    def run(self, steps: int) -> tuple[float, np.ndarray]:
        ocl, n = self.ocl, self.n
        init = wave_sim.initial_condition(n)
        host, bufs = [], []
        for d, (g0, rows) in enumerate(self.ghost):
            pair = []
            for _ in range(2):                              # u, up
                arr = _aligned((rows, n))
                arr[...] = init[g0:g0 + rows]
                pair.append(arr)
            host.append(pair)
            flags = ocl.mem_flags.READ_WRITE | ocl.mem_flags.USE_HOST_PTR
            bufs.append([ocl.Buffer(self.ctx[d], flags, hostbuf=a) for a in pair])
        cur = 0                                             # index of u in each pair
        t0 = time.perf_counter()
        for s in range(steps):
            a, b, c = _coefficients(s)
            events = []
            for d, ((y0, y1), (g0, rows)) in enumerate(zip(self.rows, self.ghost)):
                k = self.kernel[d]
                alloc = [np.int64(g0), np.int64(0), np.int64(0), np.int64(rows), np.int64(n), np.int64(1)]
                k.set_args(np.int64(y0), np.int64(0), np.int64(0), np.int64(y1 - y0), np.int64(n), np.int64(1),
                           bufs[d][1 - cur], *alloc, bufs[d][cur], *alloc, a, b, c, np.int64(n))
                events.append(ocl.enqueue_nd_range_kernel(self.queue[d], k, (y1 - y0, n), None,
                                                          global_work_offset=(y0, 0)))
            for ev in events:
                ev.wait()
            # halo rows of the new field (the ``up`` just written) into the neighbour's ghost rows
            new0, new1 = host[0][1 - cur], host[1][1 - cur]
            (_, y1a), (g0a, _), (y0b, _), (g0b, _) = self.rows[0], self.ghost[0], self.rows[1], self.ghost[1]
            new1[y0b - 1 - g0b] = new0[y1a - 1 - g0a]       # device 0's last row -> device 1's top ghost
            new0[y1a - g0a] = new1[y0b - g0b]               # device 1's first row -> device 0's bottom ghost
            cur = 1 - cur
        t = time.perf_counter() - t0
        out = np.concatenate([host[d][cur][y0 - g0:y1 - g0] for d, ((y0, y1), (g0, _))
                              in enumerate(zip(self.rows, self.ghost))], axis=0)
        return t, out


def launches_bare(count: int) -> float:
    """µs per ``enqueue_nd_range_kernel(...).wait()`` of the same kernel on the first device."""
    import pyopencl as ocl

    from executor.backends.opencl import PRELUDE, opencl_devices
    dev = opencl_devices()[0]
    ctx = ocl.Context([dev])
    queue = ocl.CommandQueue(ctx, dev)
    k = ocl.Kernel(ocl.Program(ctx, PRELUDE + TINY_SOURCE).build(), "tiny")
    arr = _aligned((1,))
    arr[0] = 0
    buf = ocl.Buffer(ctx, ocl.mem_flags.READ_WRITE | ocl.mem_flags.USE_HOST_PTR, hostbuf=arr)
    one, zero = np.int64(1), np.int64(0)
    k.set_args(zero, zero, zero, one, one, one, buf, zero, zero, zero, one, one, one)
    for _ in range(10):
        ocl.enqueue_nd_range_kernel(queue, k, (1,), None).wait()
    t0 = time.perf_counter()
    for _ in range(count):
        ocl.enqueue_nd_range_kernel(queue, k, (1,), None).wait()
    t = time.perf_counter() - t0
    queue.finish()
    assert arr[0] == count + 10
    return t / count * 1e6


def measure(n: int, steps: int, reps: int, launches: int) -> dict:
    hw = HandWritten(n)
    q = cl.Queue(devices="opencl")
    if q.num_devices < 2:
        raise SystemExit(f"celeritas sees {q.num_devices} OpenCL device(s); set POCL_DEVICES='pthread pthread'")
    wave_celeritas(q, n, 2)                 # warm-up: program builds on both devices, allocations, costs
    hw.run(2)
    best = {"celeritas_s": float("inf"), "compiled_s": float("inf"), "pyopencl_s": float("inf")}
    results = {}
    for _ in range(reps):                   # alternating, best of each
        for key, fn in (("celeritas_s", lambda: wave_celeritas(q, n, steps)),
                        ("compiled_s", lambda: wave_celeritas(q, n, steps, compiled=True)),
                        ("pyopencl_s", lambda: hw.run(steps))):
            t, res = fn()
            best[key] = min(best[key], t)
            results[key] = res
    equal = all(np.array_equal(results["pyopencl_s"], results[k]) for k in ("celeritas_s", "compiled_s"))
    close = all(np.allclose(results["pyopencl_s"], results[k], rtol=1e-5, atol=1e-6)
                for k in ("celeritas_s", "compiled_s"))
    lc, lg, lb = launch_costs(q, TINY, launches, reps, launches_bare)
    q.shutdown()
    return {"size": n, "steps": steps, "devices": os.environ.get("POCL_DEVICES"), **best,
            "ratio": best["pyopencl_s"] / best["celeritas_s"], "compiled_ratio": best["pyopencl_s"] / best["compiled_s"],
            "equal": equal, "close": close, "launch_celeritas_us": lc, "launch_compiled_us": lg, "launch_bare_us": lb}


def main(argv=None) -> dict:
    from rich.console import Console
    from rich.table import Table
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--launches", type=int, default=2000)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    r = measure(args.size, args.steps, args.reps, args.launches)
    if args.json:
        import json
        Path(args.json).write_text(json.dumps(r, indent=2))
    t = Table(title=f"opencl, 2 PoCL devices ({r['devices']}): celeritas against hand-written pyopencl "
                    f"(best of {args.reps}, alternating)")
    for col in ("benchmark", "celeritas", "compiled ahead", "hand-written", "ratio", "ratio (compiled)"):
        t.add_column(col, justify="left" if col == "benchmark" else "right")
    s = r["steps"]
    t.add_row(f"wave_sim {r['size']}² × {s}, ms/step", f"{r['celeritas_s'] / s * 1e3:.3f}",
              f"{r['compiled_s'] / s * 1e3:.3f}", f"{r['pyopencl_s'] / s * 1e3:.3f}", f"{r['ratio']:.2f}",
              f"{r['compiled_ratio']:.2f}")
    t.add_row("one-item source kernel, µs/launch", f"{r['launch_celeritas_us']:.1f}", f"{r['launch_compiled_us']:.1f}",
              f"{r['launch_bare_us']:.1f} (bare enqueue + wait)",
              f"{r['launch_bare_us'] / r['launch_celeritas_us']:.2f}",
              f"{r['launch_bare_us'] / r['launch_compiled_us']:.2f}")
    Console().print(t)
    Console().print(f"results bitwise equal: {'yes' if r['equal'] else 'no'}; within 1e-5: {'yes' if r['close'] else 'NO'}")
    return r


if __name__ == "__main__":
    main()
