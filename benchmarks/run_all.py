"""Every benchmark in one table, each beside a baseline measured in the same run.

    python -m benchmarks.run_all [--quick] [--devices host:2] [--markdown FILE] [--json FILE]

Baselines: plain numpy loops (the apps' sequential references), Dask's threaded
scheduler for independent tasks, ``dask.array.map_overlap`` for the wave_sim
stencil, a hand-written mpi4py halo exchange (``benchmarks/bench_mpi.py``, when it
exists), raw CuPy on a GPU (skipped without one).  Ratios are *baseline time /
celeritas time*: above 1 means celeritas is faster.  Baselines run in the same
process right beside the celeritas figure, so machine load affects both alike;
without ``--quick`` every timed figure is the best of three runs.

Resize copies (``copy`` instructions whose source and destination memory are the
same: an allocation grown by copying its old contents) are counted for wave_sim
and rsim under each lookahead mode from ``Queue(record=True).graphs()`` on a
simulated 2-rank cluster with two devices per rank; the goal is 0 with ``auto``.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from rich.console import Console
from rich.table import Table

import celeritas as cl
from benchmarks.bench_cuda import gpu_name
from benchmarks.threads import format_cpu

ROOT = Path(__file__).resolve().parents[1]
console = Console(width=None if sys.stdout.isatty() else 200)
CELERITY_CXX_US_PER_TASK = 26.0
REPS = {"quick": 1, "full": 3}     # runs per timed figure; the best is kept (least disturbed by other load)


@dataclass
class Row:
    section: str
    benchmark: str
    celeritas: str
    baseline: str
    ratio: str = "-"
    goal: str = ""
    values: dict = field(default_factory=dict)     # raw numbers for --json


def _ratio(baseline: float | None, ours: float | None) -> str:
    if not baseline or not ours or not math.isfinite(baseline) or not math.isfinite(ours):
        return "-"
    v = baseline / ours
    return f"{v:.2f}×" if v >= 0.1 else f"{v:.2g}×"


def _secs(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 0.1 else f"{x:.3f} s"


def best(reps: int, fn: Callable[[], float | None]) -> float | None:
    """The smallest of ``reps`` measurements (None when the measurement is unavailable)."""
    vals = [fn() for _ in range(max(1, reps))]
    vals = [v for v in vals if v is not None]
    return min(vals) if vals else None


def _time(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# ---- machine --------------------------------------------------------------------------------
def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines()
                      if ln.startswith("MemTotal")).split()[1])
        mem = f"{kb / 2 ** 20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    info = {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "memory": mem,
            "os": platform.platform(terse=True), "python": platform.python_version(), "numpy": np.__version__}
    for mod in ("dask", "mpi4py", "cupy"):
        try:
            info[mod] = importlib.import_module(mod).__version__
        except Exception:  # noqa: BLE001 - absent or broken: just not listed
            pass
    try:
        from celeritas import launcher
        path = launcher.find_mpiexec()
        if path:
            info["mpiexec"] = launcher.detect(path).version
    except Exception:  # noqa: BLE001
        pass
    info["gpu"] = gpu_name() or "none"
    return info


PACE_LOOP = 2_000_000     # additions in the pace probe's loop


def pace(reps: int = 3) -> float:
    """Milliseconds a fixed pure-Python loop takes (best of ``reps``): how fast this machine
    runs the interpreter right now.  A shared VM changes speed within tens of seconds (on the
    2-core CI machine a pure-Python loop took about 1.5x as long in its slow phases as in its
    fast ones), which moves every celeritas figure; the baselines beside them move too, but
    not by the same factor, since most of them spend their time in numpy or MPI rather than
    in the interpreter.  Printed before and after each section, so a figure can be read
    against the phase it was taken in."""
    best_s = float("inf")
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        x = 0
        for i in range(PACE_LOOP):
            x += i
        best_s = min(best_s, time.perf_counter() - t0)
    return best_s * 1e3


def pace_line(paces: dict) -> str:
    """The pace sentence of the console and the Markdown; ``paces``: section -> (ms before, ms after)."""
    return (f"Machine pace (ms for {PACE_LOOP:,} additions in a Python loop, before/after each section; "
            "lower is faster): " + ", ".join(f"{name} {a:.0f}/{b:.0f}" for name, (a, b) in paces.items()))


# ---- scheduler (bench_graphs) ----------------------------------------------------------------------
def scheduler_rows(quick: bool) -> list[Row]:
    from benchmarks import bench_graphs
    steps = 20 if quick else 100
    configs = [(1, 1), (4, 1), (16, 1)] if quick else [(1, 1), (4, 1), (16, 1), (1, 4), (128, 4)]
    rows = []
    replay = os.environ.get("CELERITAS_REPLAY", "on") != "off"   # (the runtime's default: on)
    for ranks, devices in configs:
        reps = max(2, REPS["quick" if quick else "full"])
        us = min(bench_graphs.measure("wave_sim", ranks, devices, steps=steps, replay=replay) for _ in range(reps))
        off = us if not replay else min(bench_graphs.measure("wave_sim", ranks, devices, steps=steps, replay=False)
                                        for _ in range(reps))
        goal = "≤ 60 µs at 1 × 1" if (ranks, devices) == (1, 1) else ""
        note = f"replay off: {off:.1f} µs" if replay else "replay off"
        rows.append(Row("scheduler", f"wave_sim graphs, {ranks} rank(s) × {devices} device(s), µs/task",
                        f"{us:.1f} µs", f"{CELERITY_CXX_US_PER_TASK:.0f} µs (C++ Celerity, published)",
                        _ratio(CELERITY_CXX_US_PER_TASK, us), "; ".join(x for x in (goal, note) if x),
                        {"us_per_task": us, "us_per_task_replay_off": off}))
    return rows


# ---- runtime overheads (bench_runtime) ---------------------------------------------------------------
def _steady_and_fixed(n: int, per_n: float, per_4n: float) -> tuple[float, float]:
    """(µs per iteration past the start, ms of start-up) from µs per iteration over ``n`` and
    ``4 n`` iterations: what a run of ``n`` pays once (the first lowerings, recording,
    compiling replay builders) shows against what every iteration costs."""
    steady = (4 * n * per_4n - n * per_n) / (3 * n)
    return steady, n * (per_n - steady) / 1e3


def runtime_rows(quick: bool) -> list[Row]:
    from benchmarks import bench_runtime as br
    k = REPS["quick" if quick else "full"]
    rows = []
    n = 300 if quick else 2500
    us = best(k, lambda: br.tiny_tasks(n))
    dk = best(k, lambda: br.dask_tiny_tasks(n))
    rows.append(Row("runtime", f"{n} independent tiny tasks, host:4, µs/task", f"{us:.1f} µs",
                    f"{dk:.1f} µs (dask threads)" if dk else "dask not installed", _ratio(dk, us),
                    "≤ 40 µs, ≥ 6× dask", {"celeritas_us": us, "dask_us": dk}))
    it = 50 if quick else 500
    st = best(k, lambda: br.stencil(128, it))
    st4 = best(k, lambda: br.stencil(128, 4 * it))
    nst = best(k, lambda: br.numpy_stencil(128, it))
    blk = best(k, lambda: br.numpy_blocks_stencil(128, it))
    steady, fixed = _steady_and_fixed(it, st, st4)
    rows.append(Row("runtime", f"128² stencil × {it}, host:4, µs/iteration", f"{st:.1f} µs",
                    f"{blk:.1f} µs (numpy, the 4 row blocks host:4 computes, halos copied); "
                    f"{nst:.1f} µs (numpy, whole array); celeritas {steady:.1f} µs/iteration steady "
                    f"+ {fixed:.1f} ms start-up (× {it} against × {4 * it})",
                    _ratio(blk, st), "≤ 150 µs", {"celeritas_us": st, "numpy_blocks_us": blk, "numpy_us": nst,
                                                 "steady_us": steady, "start_up_ms": fixed}))
    nop = best(k, lambda: br.stencil(128, it, noop=True))
    nop4 = best(k, lambda: br.stencil(128, 4 * it, noop=True))
    steady, fixed = _steady_and_fixed(it, nop, nop4)
    rows.append(Row("runtime", f"128² stencil × {it}, no-op kernels, host:4, µs/iteration", f"{nop:.1f} µs",
                    f"celeritas {steady:.1f} µs/iteration steady + {fixed:.1f} ms start-up "
                    f"(× {it} against × {4 * it})", "-", "≤ 60 µs",
                    {"celeritas_us": nop, "steady_us": steady, "start_up_ms": fixed}))
    size, steps = (512, 5) if quick else (4096, 10)
    if not quick:
        # one untimed run of each first: on this VM memory the guest has never touched costs
        # ~2.7 ms per MiB on first touch (12 ms for 64 MiB touched again against 173 ms fresh),
        # and celeritas, which runs first and keeps two device copies and a fetched result
        # beside the fields, would pay for the baseline's pages too; then alternated
        br.wave(size, steps)
        br.numpy_wave(size, steps)
    w, nw = br.best_alternating(k, lambda: br.wave(size, steps), lambda: br.numpy_wave(size, steps))
    rows.append(Row("runtime", f"wave_sim {size}² × {steps}, 1 rank, host:1", _secs(w), _secs(nw) + " (numpy)",
                    _ratio(nw, w), "≥ 0.97×", {"celeritas_s": w, "numpy_s": nw}))
    return rows


# ---- the executor alone (bench_executor) --------------------------------------------------------------
def executor_rows(quick: bool) -> list[Row]:
    """Instruction batches recorded from real programs, replayed through a bare executor:
    the executor thread's CPU per instruction (its Python, and with real kernels theirs)."""
    from benchmarks import bench_executor as be
    k = REPS["quick" if quick else "full"]
    it, tasks = (50, 300) if quick else (500, 2500)
    rows = []
    for name, prog, steps in (("128² stencil, no-op kernels", be.stencil_program(128, it, True), it),
                              ("128² stencil, wave_sim kernels", be.stencil_program(128, it, False), it),
                              ("tiny no-op tasks", be.tiny_program(tasks), tasks)):
        rec = be.record(prog, 4)
        wall, cpu = be.measure(rec, k)
        _, burst = be.measure(rec, k, steady=False)
        n = rec.num_instructions
        extra = ""
        if "no-op" in name:
            _, bare = be.measure(be.with_trivial_launchers(rec), k)
            extra = f"; {bare:.2f} µs with trivial launchers (the executor's own work)"
        rows.append(Row("executor", f"{name}, host:4, executor CPU per instruction (recorded batches replayed "
                                    f"one by one)", f"{cpu:.2f} µs",
                        f"{n / steps:.1f} instructions per step, {wall * n / steps:.1f} µs/step{extra}; "
                        f"{burst:.2f} µs with all batches at once", "-", "≤ 3 µs" if "no-op" in name else "",
                        {"cpu_us_per_instruction": cpu, "wall_us_per_instruction": wall, "instructions": n,
                         "burst_cpu_us_per_instruction": burst}))
    return rows


# ---- wave_sim against dask.array.map_overlap --------------------------------------------------------
def dask_wave(n: int, steps: int, workers: int) -> tuple[float, np.ndarray] | None:
    """The wave_sim steps as a lazy dask.array graph (ghost cells through map_overlap), computed once."""
    try:
        import dask.array as da
    except ImportError:
        return None
    from apps import wave_sim

    def laplacian(block):
        out = np.zeros_like(block)
        out[1:-1, 1:-1] = (block[:-2, 1:-1] + block[2:, 1:-1] + block[1:-1, :-2] + block[1:-1, 2:]
                           - 4 * block[1:-1, 1:-1])
        return out

    def build_and_compute():
        init = wave_sim.initial_condition(n)
        u = da.from_array(init, chunks=(-(-n // workers), n))
        up = u
        for s in range(steps):
            a, b, c = (np.float32(x) for x in wave_sim.coefficients(s, 0.25, 1.0))
            lap = u.map_overlap(laplacian, depth=1, boundary="nearest", dtype=np.float32)
            up, u = u, a * 2 * u - b * up + c * lap
        return u.compute(scheduler="threads", num_workers=workers)

    return _time(build_and_compute)


def celeritas_wave(n: int, steps: int, devices: str) -> tuple[float, np.ndarray]:
    from benchmarks import bench_runtime
    return bench_runtime.timed_wave(n, steps, devices)


def overlap_rows(quick: bool, devices: str) -> list[Row]:
    n, steps = (512, 10) if quick else (2048, 50)
    workers = int(devices.split(":")[1]) if devices.startswith("host:") and ":" in devices else 2
    k = REPS["quick" if quick else "full"]
    runs = [celeritas_wave(n, steps, devices) for _ in range(k)]
    ours, res = min(r[0] for r in runs), runs[-1][1]
    base = [dask_wave(n, steps, workers) for _ in range(k)]
    if base[0] is None:
        return [Row("stencil", f"wave_sim {n}² × {steps}, {devices}", _secs(ours), "dask not installed")]
    bt, bres = min(b[0] for b in base), base[-1][1]
    same = np.allclose(res, bres, rtol=1e-5, atol=1e-6)
    return [Row("stencil", f"wave_sim {n}² × {steps}, {devices}", _secs(ours),
                _secs(bt) + f" (dask map_overlap, {workers} threads)", _ratio(bt, ours),
                "≥ 1×" + ("" if same else " (RESULTS DIFFER)"), {"celeritas_s": ours, "dask_s": bt, "same": same})]


# ---- the apps against their numpy references ---------------------------------------------------------
def app_rows(quick: bool, devices: str) -> list[Row]:
    from apps import convolution, jacobi3d, nbody, reduction, rsim
    q_sizes = {
        "convolution": (256, 1) if quick else (2048, 2),
        "reduction": (512, 2) if quick else (4096, 4),
        "nbody": (512, 2) if quick else (2048, 5),
        "jacobi3d": (32, 20) if quick else (128, 100),
        "rsim": (256, 30) if quick else (1024, 100),
    }
    # inputs are built once, outside both timings: only the computation is compared
    cases = {
        "convolution": (lambda n: convolution.synthetic_image(n, n),
                        lambda q, x, n, t: convolution.run(q, x, iterations=t),
                        lambda x, n, t: convolution.reference(x, iterations=t), np.array_equal),
        "reduction": (lambda n: reduction.low_contrast_image(n, n),
                      lambda q, x, n, t: reduction.run(q, x, repeat=t)[0],
                      lambda x, n, t: [reduction.reference(x) for _ in range(t)][-1][0], np.array_equal),
        "nbody": (lambda n: None, lambda q, x, n, t: nbody.run(q, n, t)[0], lambda x, n, t: nbody.reference(n, t)[0],
                  lambda a, b: np.allclose(a, b, rtol=1e-9, atol=1e-12)),
        "jacobi3d": (lambda n: None, lambda q, x, n, t: jacobi3d.run(q, n, t, tol=0.0).u,
                     lambda x, n, t: jacobi3d.reference(n, t, tol=0.0).u, np.array_equal),
        "rsim": (lambda n: None, lambda q, x, n, t: rsim.run(q, n, t), lambda x, n, t: rsim.reference(n, t),
                 np.array_equal),
    }
    rows = []
    k = REPS["quick" if quick else "full"]
    for name, (prepare, ours_fn, ref_fn, same_fn) in cases.items():
        n, t = q_sizes[name]
        x = prepare(n)
        ours = base = float("inf")
        for _ in range(k):
            q = cl.Queue(devices=devices)
            q.wait()
            dt, res = _time(lambda: ours_fn(q, x, n, t))
            q.shutdown()
            ours = min(ours, dt)
            dt, ref = _time(lambda: ref_fn(x, n, t))
            base = min(base, dt)
        ok = bool(same_fn(res, ref))
        rows.append(Row("apps", f"{name} (size {n}, {t} steps), {devices}", _secs(ours), _secs(base) + " (numpy)",
                        _ratio(base, ours), "" if ok else "RESULTS DIFFER", {"celeritas_s": ours, "numpy_s": base,
                                                                             "same": ok}))
    return rows


# ---- resize copies under each lookahead mode -----------------------------------------------------------
def count_resizes(app: str, mode: str, *, nodes: int = 2, devices: int = 2, fence: bool = False,
                  quick: bool = True) -> dict:
    """Same-memory copies and allocations over all ranks of a simulated cluster (from graph records)."""
    from apps import rsim, wave_sim
    from celeritas.testing import run_cluster

    n, steps = (64, 16) if quick else (256, 64)

    def program(rank):
        q = cl.Queue(record=True, lookahead=mode)
        if app == "rsim":
            rsim.run(q, n, steps, fetch=fence)
        else:
            init = wave_sim.initial_condition(n)
            u, up = cl.Buffer(init, name="u"), cl.Buffer(init, name="up")
            for s in range(steps):
                wave_sim.submit_step(q, up, u, *wave_sim.coefficients(s, 0.25, 1.0), n)
                up, u = u, up
            if fence:
                q.fence(u).result()
        q.wait()
        ins = q.graphs()["instructions"]
        return (sum(1 for i in ins if i["kind"] == "copy" and i["source_memory"] == i["dest_memory"]),
                sum(1 for i in ins if i["kind"] == "alloc"))

    out = run_cluster(program, nodes=nodes, devices=devices, CELERITAS_DIAGNOSTICS="off")
    return {"resize_copies": sum(r[0] for r in out), "allocs": sum(r[1] for r in out)}


def resize_rows(quick: bool) -> list[Row]:
    rows = []
    for app in ("wave_sim", "rsim"):
        counts = {m: count_resizes(app, m, quick=quick) for m in ("none", "auto", "infinite")}
        fenced = count_resizes(app, "auto", fence=True, quick=quick)
        auto = counts["auto"]["resize_copies"]
        rows.append(Row("lookahead", f"{app} resize copies, 2 ranks × host:2",
                        f"auto: {auto} ({counts['auto']['allocs']} allocs)",
                        f"none: {counts['none']['resize_copies']} ({counts['none']['allocs']} allocs), "
                        f"infinite: {counts['infinite']['resize_copies']}",
                        "-", f"0 with auto {'✓' if auto == 0 else '✗'}; "
                             f"with final fence: {fenced['resize_copies']}",
                        {"counts": counts, "auto_with_fence": fenced}))
    return rows


# ---- MPI halo exchange (bench_mpi, written separately) -------------------------------------------------------
MPI_TIMEOUT_S = 300


def mpi_rows(quick: bool) -> tuple[list[Row], str | None]:
    """bench_mpi's figures as rows of this table: it runs as its own program (it relaunches
    itself under mpiexec on 2 ranks) and writes them as JSON; its output is shown below the
    table when it fails."""
    import tempfile
    what = "halo exchange vs hand-written mpi4py"
    if importlib.util.find_spec("benchmarks.bench_mpi") is None:
        return [Row("mpi", what, "skipped", "benchmarks/bench_mpi.py not present")], None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench_mpi.json"
        argv = [sys.executable, "-m", "benchmarks.bench_mpi", "--json", str(out), "--idle"]
        argv += ["--quick", "--reps", "2"] if quick else ["--full", "--reps", str(REPS["full"])]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        env.setdefault("CELERITAS_DEVICES", "host:1")
        try:
            proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=MPI_TIMEOUT_S * (1 if quick else 3), start_new_session=True)
        except subprocess.TimeoutExpired:
            return [Row("mpi", what, "skipped", "bench_mpi took too long")], None
        text = (proc.stdout + "\n" + proc.stderr).strip()
        if proc.returncode != 0 or not out.exists():
            return [Row("mpi", what, f"bench_mpi exited {proc.returncode}", "see its output below")], text
        data = json.loads(out.read_text())
    return mpi_rows_from(data), None


def _size(nbytes: int) -> str:
    return f"{nbytes / 2 ** 20:g} MiB" if nbytes >= 2 ** 20 else f"{nbytes >> 10} KiB"


def mpi_rows_from(data: dict) -> list[Row]:
    """Rows from bench_mpi's JSON (see its ``--json``)."""
    rows: list[Row] = []
    ranks = data.get("ranks", 2)
    for w in data.get("wave", []):
        n, steps = w["size"], w["steps"]
        note = "≥ 0.95×" + ("" if w.get("equal", True) else " (RESULTS DIFFER)")
        if "paired_ratio" in w:
            note += (f"; median of the repetitions' own ratios: {w['paired_ratio']:.2f}× "
                     f"(compiled ahead {w['paired_compiled_ratio']:.2f}×)")
        rows.append(Row("mpi", f"wave_sim {n}² × {steps}, {ranks} MPI ranks, ms/step",
                        f"{w['celeritas_s'] / steps * 1e3:.3f} ms (compiled ahead: {w['compiled_s'] / steps * 1e3:.3f}, "
                        f"{w['compiled_ratio']:.2f}×)",
                        f"{w['mpi4py_s'] / steps * 1e3:.3f} ms (hand-written mpi4py, persistent requests)",
                        _ratio(w["mpi4py_s"], w["celeritas_s"]), note, w))
    ping = data.get("pingpong", [])
    if ping:
        p = ping[0]
        rows.append(Row("mpi", f"push/await_push one-way latency, {p['bytes']} B",
                        f"{p['celeritas_s'] * 1e6:.1f} µs (compiled ahead: {p['compiled_s'] * 1e6:.1f})",
                        f"{p['mpi4py_s'] * 1e6:.1f} µs (mpi4py, blocking or preposted, the faster)",
                        _ratio(p["mpi4py_s"], p["celeritas_s"]), "≤ 100 µs", p))
        p = ping[-1]

        def bw(t: float) -> str:
            return f"{p['bytes'] / t / 1e6:,.0f} MB/s"
        note = "≥ 0.8×"
        paired = p.get("paired_ratios")
        if paired:
            from benchmarks.bench_mpi import _quartiles
            lo, med, hi = _quartiles(paired)
            note += f"; paired windows: {med:.2f}× (median of {len(paired)}, quartiles {lo:.2f}–{hi:.2f})"
        rows.append(Row("mpi", f"push/await_push bandwidth, {_size(p['bytes'])}, ping-pong",
                        f"{bw(p['celeritas_s'])} (compiled ahead: {bw(p['compiled_s'])}, "
                        f"{p['mpi4py_s'] / p['compiled_s']:.2f}×)",
                        f"{bw(p['mpi4py_s'])} (mpi4py)", _ratio(p["mpi4py_s"], p["celeritas_s"]), note, p))
    stream = [x for x in data.get("stream", []) if x["bytes"] == 4 << 20] or data.get("stream", [])[-1:]
    for x in stream:
        rows.append(Row("mpi", f"push/await_push streaming bandwidth, {_size(x['bytes'])}, {x['window']} in "
                               f"flight (osu_bw)",
                        f"{x['bytes'] / x['celeritas_s'] / 1e6:,.0f} MB/s",
                        f"{x['bytes'] / x['mpi4py_s'] / 1e6:,.0f} MB/s (mpi4py Isend/Irecv, Waitall)",
                        _ratio(x["mpi4py_s"], x["celeritas_s"]), "", x))
    idle = data.get("idle")
    if idle:
        rows.append(Row("mpi", "CPU use of a rank waiting 2 s at a fence",
                        f"{idle['waiting_for_peer_percent']:.1f} % (receive outstanding), "
                        f"{idle['waiting_for_own_kernel_percent']:.1f} % (own kernel)", "-", "-", "", idle))
    return rows


# ---- the device path: OpenCL on two PoCL devices (bench_opencl) ------------------------------------------
def _bench_process(section: str, module: str, label: str, args: list[str]) -> tuple[dict, tuple | None]:
    """``benchmarks.<module> --json F <args>`` in a process of its own: (its figures, None), or
    (None, the rows and output to report) when it timed out or failed."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{module}.json"
        argv = [sys.executable, "-m", f"benchmarks.{module}", "--json", str(out), *args]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        try:
            proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=MPI_TIMEOUT_S,
                                  start_new_session=True)
        except subprocess.TimeoutExpired:
            return {}, ([Row(section, label, "skipped", f"{module} took too long")], None)
        if proc.returncode != 0 or not out.exists():
            return {}, ([Row(section, label, f"{module} exited {proc.returncode}", "see its output below")],
                        (proc.stdout + "\n" + proc.stderr).strip())
        return json.loads(out.read_text()), None


def device_rows(quick: bool) -> tuple[list[Row], str | None]:
    """bench_opencl in a process of its own (it sets ``POCL_DEVICES`` before OpenCL starts)."""
    try:
        import pyopencl  # noqa: F401
    except ImportError:
        return [Row("device", "wave_sim on opencl vs hand-written pyopencl", "skipped", "pyopencl not installed")], None
    r, failed = _bench_process("device", "bench_opencl", "wave_sim on opencl",
                               ["--size", "256", "--steps", "10", "--reps", "1", "--launches", "200"] if quick else
                               ["--reps", str(REPS["full"])])
    if failed is not None:
        return failed
    s = r["steps"]
    return [Row("device", f"wave_sim {r['size']}² × {s}, OpenCL C kernel, opencl on 2 PoCL devices, ms/step",
                f"{r['celeritas_s'] / s * 1e3:.3f} ms (compiled ahead: {r['compiled_s'] / s * 1e3:.3f}, "
                f"{r['compiled_ratio']:.2f}×)", f"{r['pyopencl_s'] / s * 1e3:.3f} ms (hand-written pyopencl)",
                _ratio(r["pyopencl_s"], r["celeritas_s"]),
                "≥ 0.9×" + ("" if r["close"] else " (RESULTS DIFFER)"), r),
            Row("device", "one-item OpenCL source kernel, µs per launch",
                f"{r['launch_celeritas_us']:.1f} µs (compiled ahead: {r['launch_compiled_us']:.1f})",
                f"{r['launch_bare_us']:.1f} µs (bare enqueue_nd_range_kernel + wait)",
                _ratio(r["launch_bare_us"], r["launch_celeritas_us"]), "", r)], None


# ---- hand-written CuPy on a GPU -----------------------------------------------------------------------------
def cupy_rows(quick: bool) -> tuple[list[Row], str | None]:
    """bench_cuda in a process of its own (one runtime per process: it runs ``cuda`` and then
    ``cuda:0,0``)."""
    if gpu_name() is None:
        return [Row("gpu", "wave_sim on cuda vs hand-written CuPy", "skipped", "no CuPy or no CUDA GPU")], None
    r, failed = _bench_process("gpu", "bench_cuda", "wave_sim on cuda",
                               ["--size", "2048", "--small", "512", "--steps", "20", "--reps", "1", "--launches", "200"]
                               if quick else ["--reps", str(REPS["full"])])
    if failed is not None:
        return failed
    rows = []
    for w, w2 in zip(r["wave"], r["wave_two_devices"]):
        s = w["steps"]
        rows.append(Row("gpu", f"wave_sim {w['size']}² × {s}, CUDA C kernel, 1 GPU, µs/step",
                        f"{w['celeritas_s'] / s * 1e6:.1f} µs (compiled ahead: {w['compiled_s'] / s * 1e6:.1f}, "
                        f"{w['compiled_ratio']:.2f}×; cuda:0,0: {w2['celeritas_s'] / s * 1e6:.1f}, {w2['ratio']:.2f}×"
                        + (f"; CPU per step {format_cpu(w['cpu_us_per_step'])}" if w.get("cpu_us_per_step") else "")
                        + ")",
                        f"{w['cupy_s'] / s * 1e6:.1f} µs (the same kernel as a RawKernel loop)",
                        _ratio(w["cupy_s"], w["celeritas_s"]),
                        "≥ 0.9×" + ("" if w["close"] and w2["close"] else " (RESULTS DIFFER)"), w))
    for w in r["array_wave"]:
        s = w["steps"]
        rows.append(Row("gpu", f"wave_sim {w['size']}² × {s}, CuPy array kernel, 1 GPU, µs/step",
                        f"{w['celeritas_s'] / s * 1e6:.1f} µs", f"{w['cupy_s'] / s * 1e6:.1f} µs (CuPy array loop)",
                        _ratio(w["cupy_s"], w["celeritas_s"]),
                        "≥ 0.9×" + ("" if w["close"] else " (RESULTS DIFFER)"), w))
    rows.append(Row("gpu", "one-thread CUDA source kernel, µs per launch",
                    f"{r['launch_celeritas_us']:.1f} µs (compiled ahead: {r['launch_compiled_us']:.1f})",
                    f"{r['launch_bare_us']:.1f} µs (bare RawKernel launch + sync)",
                    _ratio(r["launch_bare_us"], r["launch_celeritas_us"]), "", r))
    x = r["transfers"]
    gb = x["mib"] * 2**20 / 1e9
    differ = "" if x["equal"] else " (RESULTS DIFFER)"
    rows.append(Row("gpu", f"{x['size']}² float32 field to the GPU (a new buffer's first kernel), GB/s",
                    f"{gb / x['up_s']:.1f} GB/s", f"{gb / x['cupy_up_s']:.1f} GB/s (cupy.asarray)",
                    _ratio(x["cupy_up_s"], x["up_s"]), "", x))
    rows.append(Row("gpu", f"{x['size']}² float32 field fenced home after a kernel, GB/s",
                    f"{gb / x['down_s']:.1f} GB/s",
                    f"{gb / x['cupy_down_s']:.1f} GB/s (get() into a new array; "
                    f"{gb / x['cupy_pinned_s']:.1f} into pinned memory)",
                    _ratio(x["cupy_down_s"], x["down_s"]), differ.strip(), x))
    return rows, None


# ---- output ------------------------------------------------------------------------------------------------
def render(rows: list[Row], info: dict) -> Table:
    t = Table(title="celeritas benchmarks (baselines measured in the same run; ratio = baseline / celeritas)")
    for col in ("section", "benchmark", "celeritas", "baseline", "ratio", "goal / note"):
        t.add_column(col, justify="right" if col in ("celeritas", "ratio") else "left",
                     overflow="fold")
    for r in rows:
        t.add_row(r.section, r.benchmark, r.celeritas, r.baseline, r.ratio, r.goal)
    return t


def machine_line(info: dict) -> str:
    keys = ("cpu", "cores", "memory", "gpu", "os", "python", "numpy", "dask", "mpi4py", "mpiexec", "cupy")
    return ", ".join(f"{k} {info[k]}" for k in keys if info.get(k) not in (None, ""))


def markdown(rows: list[Row], info: dict, quick: bool, seconds: float) -> str:
    lines = [f"Machine: {machine_line(info)}.", "",
             f"`python -m benchmarks.run_all{' --quick' if quick else ''}` ({seconds:.0f} s). "
             "Ratio = baseline time / celeritas time (above 1: celeritas is faster).", ""]
    if info.get("pace_ms"):
        lines += [pace_line(info["pace_ms"]) + ".", ""]
    lines += ["| section | benchmark | celeritas | baseline | ratio | goal / note |", "|---|---|---:|---|---:|---|"]
    for r in rows:
        cells = [r.section, r.benchmark, r.celeritas, r.baseline, r.ratio, r.goal]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


SECTIONS = ("scheduler", "executor", "runtime", "stencil", "apps", "lookahead", "mpi", "device", "gpu")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute on two cores)")
    p.add_argument("--devices", default="host:2", help="devices for the stencil and app comparisons")
    p.add_argument("--only", default=None, help=f"comma-separated sections: {', '.join(SECTIONS)}")
    p.add_argument("--markdown", default=None, help="also write the table as Markdown to this file")
    p.add_argument("--json", default=None, help="also write the raw numbers as JSON to this file")
    args = p.parse_args(argv)
    only = set(args.only.split(",")) if args.only else set(SECTIONS)
    unknown = only - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    info = machine()
    console.print(f"[bold]machine[/bold]: {machine_line(info)}", soft_wrap=True)
    t0 = time.perf_counter()
    rows: list[Row] = []
    mpi_output: list[str] = []

    def mpi() -> list[Row]:
        got, text = mpi_rows(args.quick)
        if text:
            mpi_output.append(text)
        return got

    def device() -> list[Row]:
        got, text = device_rows(args.quick)
        if text:
            mpi_output.append(text)
        return got

    def gpu() -> list[Row]:
        got, text = cupy_rows(args.quick)
        if text:
            mpi_output.append(text)
        return got

    sections: dict[str, Callable[[], list[Row]]] = {
        "scheduler": lambda: scheduler_rows(args.quick),
        "executor": lambda: executor_rows(args.quick),
        "runtime": lambda: runtime_rows(args.quick),
        "stencil": lambda: overlap_rows(args.quick, args.devices),
        "apps": lambda: app_rows(args.quick, args.devices),
        "lookahead": lambda: resize_rows(args.quick),
        "mpi": mpi,
        "device": device,
        "gpu": gpu,
    }
    paces: dict[str, tuple[float, float]] = {}
    info["pace_ms"] = paces
    reps = REPS["quick" if args.quick else "full"]
    for name in SECTIONS:
        if name in only:
            with console.status(f"running the {name} benchmarks"):
                before = pace(reps)
                rows += sections[name]()
                paces[name] = (before, pace(reps))
    seconds = time.perf_counter() - t0
    console.print(render(rows, info))
    console.print(pace_line(paces), soft_wrap=True)
    for text in mpi_output:
        console.print("[bold]bench_mpi / bench_opencl output[/bold]")
        console.print(text, markup=False, highlight=False)
    console.print(f"total {seconds:.1f} s")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(markdown(rows, info, args.quick, seconds))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "quick": args.quick, "seconds": seconds,
                                               "rows": [asdict(r) for r in rows]}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
