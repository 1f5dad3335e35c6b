"""celeritas over MPI against hand-written mpi4py, measured in the same run.

    python benchmarks/bench_mpi.py                 # wave_sim 256^2 and 1024^2, ping-pong up to 4 MiB
    python benchmarks/bench_mpi.py --full          # wave_sim 256^2, 1024^2 and 4096^2, 5 repetitions
    python benchmarks/bench_mpi.py --idle          # also: CPU use of a rank waiting at a fence
    python benchmarks/bench_mpi.py --strided       # also: strided payloads, datatype vs staging copy
    python benchmarks/bench_mpi.py --json out.json # every figure, for benchmarks/run_all.py

Started without mpiexec, it relaunches itself on ``--ranks`` ranks (default 2).
Every celeritas figure is taken alternately with its baseline, best of ``--reps``.
Sections:

* **wave_sim**: ``apps.wave_sim``'s step kernel under celeritas against a
  hand-written mpi4py + numpy halo exchange (persistent requests on the numpy
  rows) that evaluates the very same expressions (``wave_sim._shift``) on the
  same row split.  Reported: ms per step, ratio = handwritten / celeritas (1.0 =
  no overhead), and whether both final fields are bitwise equal.
* **ping-pong**: the one row of a (1, bytes) buffer hops rank 0 -> rank 1 -> rank 0
  (read and written by the receiving rank's chunk), one push/await_push per hop
  (no-op kernels), against the faster of a ``Send``/``Recv`` and an
  ``Irecv``-preposted ping-pong of the same bytes: one-way latency and bandwidth,
  measured the way the OSU micro-benchmarks do: ``WARMUP`` untimed round trips
  first (allocations, replay templates, the first transfers), then many timed ones
  (500 up to 64 KiB, 100 above; ``--hops``); at the largest size also paired windows
  (``pingpong_paired``: the median of 12 ratios, each from 100 celeritas round trips and
  100 mpi4py ones right after or before them), which this VM's seconds-long fast and slow
  phases cannot tilt towards either side.  "compiled ahead": the same hops
  compiled before the first one runs (see ``pingpong_compiled``), i.e. without the
  scheduler on the critical path.
* **streaming**: the bandwidth of a one-way stream with ``STREAM_WINDOW`` messages in
  flight, the way osu_bw measures bandwidth (64 KiB, 1 MiB, 4 MiB): ``window`` pushes of
  distinct rows per window against ``Isend``/``Irecv`` of the same rows, ``Waitall`` and an
  acknowledgement.  The ping-pong's bandwidth column is one message at a time, so each
  hop's latency bounds it; this one lets messages overlap, as a streaming application's do.
* **idle** (optional): CPU use of a rank waiting at a fence.
* **strided** (optional): one strided box through ``MpiCommunicator`` with an
  MPI ``hvector`` datatype versus a contiguous staging copy.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import benchmarks  # noqa: E402,F401  (the baselines get celeritas' allocator settings: see there)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="ranks when relaunching under mpiexec")
    p.add_argument("--full", action="store_true", help="wave_sim 256^2, 1024^2 and 4096^2, 5 repetitions")
    p.add_argument("--quick", action="store_true", help="a smoke run: few steps, small ping-pong boxes")
    p.add_argument("--sizes", default=None, help="wave_sim grid edges, comma-separated (default 256,1024)")
    p.add_argument("--size", type=int, default=None, help="one wave_sim grid edge (overrides --sizes)")
    p.add_argument("--steps", type=int, default=None, help="wave_sim steps (default: by size, see wave_steps)")
    p.add_argument("--reps", type=int, default=None, help="repetitions per measurement (best is kept)")
    p.add_argument("--max-bytes", type=int, default=4 << 20, help="largest ping-pong box")
    p.add_argument("--hops", type=int, default=None, help="round trips per ping-pong size (default adaptive)")
    p.add_argument("--skip-wave", action="store_true")
    p.add_argument("--skip-pingpong", action="store_true")
    p.add_argument("--skip-stream", action="store_true")
    p.add_argument("--strided", action="store_true", help="also compare strided datatypes with staging copies")
    p.add_argument("--idle", action="store_true", help="also: CPU use of a rank waiting at a fence")
    p.add_argument("--json", default=None, help="rank 0 writes every figure to this file")
    a = p.parse_args(argv)
    if a.size:
        a.sizes = [a.size]
    else:
        a.sizes = [int(x) for x in (a.sizes or ("256,1024,4096" if a.full else "256,1024")).split(",") if x]
    a.reps = a.reps or (5 if a.full else 3)
    if a.quick:
        a.max_bytes = min(a.max_bytes, 64 << 10)
    return a


# ---------------------------------------------------------------------------------- helpers


def _allmax(comm, x: float) -> float:
    from mpi4py import MPI
    return comm.allreduce(x, op=MPI.MAX)


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    """Lower quartile, median and upper quartile (by position: a handful of values)."""
    v = sorted(xs)
    n = len(v)
    return v[n // 4], (v[(n - 1) // 2] + v[n // 2]) / 2, v[(3 * n) // 4 if n > 1 else 0]


def _console():
    from rich.console import Console
    return Console(highlight=False, width=None if sys.stdout.isatty() else 130)


# ---------------------------------------------------------------------------------- wave_sim


def wave_celeritas(q, n: int, steps: int, cpu: dict | None = None) -> tuple[float, np.ndarray]:
    """Seconds for ``steps`` steps (from submission of the first to completion of the last);
    ``cpu``, where given, gets this rank's CPU µs per step by thread role (``threads``)."""
    import celeritas as cl
    from apps import wave_sim
    from benchmarks.threads import cpu_per_step, thread_cpu
    init = wave_sim.initial_condition(n)
    u = cl.Buffer(init, name="u")
    up = cl.Buffer(init, name="up")
    q.wait(barrier=True)
    c0 = thread_cpu()
    t0 = time.perf_counter()
    for s in range(steps):
        a, b, c = wave_sim.coefficients(s, 0.25, 1.0)
        wave_sim.submit_step(q, up, u, a, b, c, n)
        up, u = u, up
    q.wait()
    t = time.perf_counter() - t0
    if cpu is not None:
        cpu.update(cpu_per_step(c0, thread_cpu(), steps))
    result = q.fence(u).result()
    q.wait(barrier=True)        # celeritas idle on every rank before the hand-written run
    return t, result


def wave_compiled(q, comm, n: int, steps: int) -> tuple[float, np.ndarray]:
    """``wave_celeritas`` with every step compiled before the first one runs.

    A host task over the whole grid (each rank runs its chunk) waits for a gate
    while reading and writing ``u``, so step 0 depends on it; the steps are
    submitted and compiled meanwhile (``flush``, then the scheduler is
    synchronized) and the clock starts when the gates open, after a barrier.
    What is left on the critical path is the executor, the communicator and MPI
    of both ranks: the part after the scheduler hands the instructions over.
    """
    import celeritas as cl
    from apps import wave_sim
    from benchmarks.gate import hold, release
    init = wave_sim.initial_condition(n)
    u = cl.Buffer(init, name="u")
    up = cl.Buffer(init, name="up")
    q.wait(barrier=True)
    gate = hold(q, steps, lambda cgh: u.access(cgh, cl.one_to_one(), cl.read_write), range=(n, n))
    for s in range(steps):
        a, b, c = wave_sim.coefficients(s, 0.25, 1.0)
        wave_sim.submit_step(q, up, u, a, b, c, n)
        up, u = u, up
    t0 = release(q, gate, comm)
    q.wait()
    t = time.perf_counter() - t0
    result = q.fence(u).result()
    q.wait(barrier=True)
    return t, result


def wave_handwritten(comm, n: int, steps: int) -> tuple[float, np.ndarray]:
    """Row-split wave_sim with one halo row per neighbour and step, same arithmetic as the kernel:
    ``cluster.workloads.wave_mpi4py`` (persistent requests on the numpy rows), timed between
    barriers; returns (seconds, the whole final field)."""
    from apps import wave_sim
    from cluster.workloads import wave_mpi4py
    init = wave_sim.initial_condition(n)
    comm.Barrier()
    t0 = time.perf_counter()
    rows, _y0, _y1 = wave_mpi4py(comm, init, n, steps)
    t = time.perf_counter() - t0
    parts = comm.allgather(rows)
    return t, np.concatenate(parts, axis=0)


def wave_steps(n: int, args) -> int:
    """Steps per run: about the same work for every size."""
    if args.steps:
        return args.steps
    base = {256: 200, 512: 100, 1024: 50, 2048: 20, 4096: 20}.get(n, max(5, int(50 * (1024 / n) ** 2)))
    return max(5, base // 5) if args.quick else (50 if args.full and n >= 4096 else base)


def bench_wave(q, comm, args, console) -> list[dict]:
    out = []
    for n in args.sizes:
        steps = wave_steps(n, args)
        best_c = best_g = best_h = float("inf")
        res_c = res_g = res_h = None
        best_cpu: dict = {}
        pairs: list[tuple[float, float]] = []    # per repetition: hand-written / celeritas, / compiled ahead
        for _ in range(args.reps):          # alternating, best of each
            cpu: dict = {}
            tc, res_c = wave_celeritas(q, n, steps, cpu)
            tc = _allmax(comm, tc)
            if tc < best_c:
                best_c, best_cpu = tc, cpu
            tg, res_g = wave_compiled(q, comm, n, steps)
            tg = _allmax(comm, tg)
            best_g = min(best_g, tg)
            th, res_h = wave_handwritten(comm, n, steps)
            th = _allmax(comm, th)
            best_h = min(best_h, th)
            pairs.append((th / tc, th / tg))
        equal = bool(comm.allreduce(int(np.array_equal(res_c, res_h) and np.array_equal(res_g, res_h)))
                     == comm.Get_size())
        out.append({"size": n, "steps": steps, "ranks": comm.Get_size(), "celeritas_s": best_c, "mpi4py_s": best_h,
                    "compiled_s": best_g, "ratio": best_h / best_c, "compiled_ratio": best_h / best_g,
                    # the median over repetitions of each repetition's own ratio: runs a few tenths of a
                    # second apart see one phase of a machine whose speed changes every few seconds
                    # (best-of figures may come from different phases)
                    "paired_ratio": _quartiles([a for a, _ in pairs])[1],
                    "paired_compiled_ratio": _quartiles([b for _, b in pairs])[1],
                    "equal": equal, "cpu_us_per_step": comm.gather(best_cpu, root=0)})
    if comm.Get_rank() == 0:
        from rich.table import Table

        from benchmarks.threads import format_cpu
        t = Table(title=f"wave_sim on {comm.Get_size()} ranks: celeritas against hand-written mpi4py + numpy "
                        f"(best of {args.reps}, alternating)")
        for col in ("size", "steps", "hand-written [ms/step]", "celeritas [ms/step]", "ratio", "paired",
                    "compiled ahead [ms/step]", "ratio", "paired", "bitwise equal",
                    "celeritas CPU per step, rank 0 [µs]"):
            t.add_column(col, justify="right")
        for r in out:
            t.add_row(f"{r['size']}²", str(r["steps"]), f"{r['mpi4py_s'] / r['steps'] * 1e3:.3f}",
                      f"{r['celeritas_s'] / r['steps'] * 1e3:.3f}", f"{r['ratio']:.3f}", f"{r['paired_ratio']:.3f}",
                      f"{r['compiled_s'] / r['steps'] * 1e3:.3f}", f"{r['compiled_ratio']:.3f}",
                      f"{r['paired_compiled_ratio']:.3f}",
                      "yes" if r["equal"] else "NO", format_cpu(r["cpu_us_per_step"][0]))
        console.print(t)
    return out


# ---------------------------------------------------------------------------------- ping-pong


def _rows_of(item: int, first: int, end: int):
    """The chunk holding item ``item`` accesses rows ``first:end`` (whole rows); a chunk
    without it accesses nothing.  (A pure function of ints: the runtime replays the
    tasks' lowering.)"""
    import celeritas as cl

    def mapper(chunk, shape):
        if chunk.offset[0] <= item < chunk.offset[0] + chunk.range[0]:
            return cl.Subrange((first, 0), (end - first, shape[1]))
        return cl.Subrange((0, 0), (0, shape[1]))
    return mapper


def _row_mapper(item: int, row: int):
    """The chunk holding item ``item`` accesses row ``row``; a chunk without it accesses
    nothing.  (So the whole range maps to the row too, as a range mapper's chunks must
    add up to it: the task graph's dependencies and horizons come from that mapping.)"""
    return _rows_of(item, row, row + 1)


def _hop(x):
    """``hop(src, dst)``: the command group moving row 0 of ``x`` from rank src to rank dst:
    chunk dst (on rank dst) reads and writes it.  The one row goes back and forth, the data
    movement of the mpi4py baselines, which send back the buffer they just received.
    (Receiving one row and sending another, as this hop did until 2026-11-27, is slower in
    plain mpi4py too: at 4 MiB 222-272 against 212-217 us per hop, minimum and median,
    alternated in one job, since the row sent is no longer the one just copied.)"""
    import celeritas as cl

    def hop(src: int, dst: int):
        def cgf(cgh):
            x.access(cgh, _row_mapper(dst, 0), cl.read_write)
            cgh.parallel_for((2,), lambda chunk: None, name=f"hop{src}{dst}")
        return cgf
    return hop


WARMUP = 20     # untimed round trips before each ping-pong measurement


def _round_trips(q, hop, n: int) -> None:
    for _ in range(n):
        q.submit(hop(0, 1))
        q.submit(hop(1, 0))


def _warmed_pingpong(q, nbytes: int):
    """The ping-pong's buffer and ``hop``, after ``WARMUP`` untimed round trips (allocations,
    replay templates, the first transfers) and a barrier."""
    import celeritas as cl
    x = cl.Buffer(np.zeros((1, nbytes), np.uint8), name="pingpong")
    hop = _hop(x)
    _round_trips(q, hop, WARMUP)
    q.wait(barrier=True)
    return x, hop


def _timed_round_trips(q, hop, hops: int) -> float:
    """One-way seconds per hop of ``hops`` round trips, from their first submit until they are done."""
    t0 = time.perf_counter()
    _round_trips(q, hop, hops)
    q.wait()
    return (time.perf_counter() - t0) / (2 * hops)


def pingpong_celeritas(q, nbytes: int, hops: int) -> float:
    """One-way seconds per hop: the row from rank src to rank dst (``_hop``)."""
    _x, hop = _warmed_pingpong(q, nbytes)
    t = _timed_round_trips(q, hop, hops)
    q.wait(barrier=True)
    return t


def pingpong_compiled(q, comm, nbytes: int, hops: int) -> float:
    """One-way seconds per hop with every hop compiled before the first one runs.

    A master-node host task that waits for a gate writes the row the first hop
    reads; the hops are submitted and compiled (``flush``, then the scheduler is
    synchronized) while it waits, and the clock starts when the gate opens on
    rank 0, after a barrier.  What is left on the critical path is the
    executor, the communicator and MPI of both ranks: the part after the
    scheduler hands the instructions over.
    """
    import celeritas as cl
    from benchmarks.gate import hold, release
    x, hop = _warmed_pingpong(q, nbytes)
    gate = hold(q, 2 * hops, lambda cgh: x.access(cgh, cl.fixed(cl.Subrange((0, 0), (1, nbytes))), cl.write),
                on=cl.on_master_node)
    _round_trips(q, hop, hops)
    t0 = release(q, gate, comm)
    q.wait()
    t = (time.perf_counter() - t0) / (2 * hops)
    q.wait(barrier=True)
    return t


def _message_buffer(nbytes: int) -> np.ndarray:
    """The baselines' message memory: what the host backend allocates for celeritas's buffer
    (``host_empty``: from 2 MiB up, 2 MiB-aligned and advised for huge pages), so both sides
    copy between the same kind of pages.  On a plain ``np.zeros`` a 4 MiB message takes
    1.5-3.5x as long, depending on how many huge pages malloc's placement happens to give it."""
    from executor.backends.host import host_empty
    buf = host_empty((nbytes,), np.uint8)
    buf[:] = 0
    return buf


def pingpong_mpi_preposted(comm, nbytes: int, hops: int) -> float:
    """Ping-pong with the next receive posted before the send (``Irecv``, ``Send``, ``Wait``)."""
    rank = comm.Get_rank()
    out, inb = _message_buffer(nbytes), _message_buffer(nbytes)
    peer = 1 - rank
    comm.Barrier()
    t0 = time.perf_counter()
    if rank == 1:
        req = comm.Irecv(inb, 0, 8)
    for _ in range(hops):
        if rank == 0:
            req = comm.Irecv(inb, 1, 8)
            comm.Send(out, 1, 8)
            req.Wait()
        elif rank == 1:
            req.Wait()
            req = comm.Irecv(inb, 0, 8) if _ < hops - 1 else None
            comm.Send(out, 0, 8)
    t = (time.perf_counter() - t0) / (2 * hops)
    del peer
    return t


def pingpong_mpi(comm, nbytes: int, hops: int) -> float:
    rank = comm.Get_rank()
    buf = _message_buffer(nbytes)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(hops):
        if rank == 0:
            comm.Send(buf, 1, 7)
            comm.Recv(buf, 1, 7)
        elif rank == 1:
            comm.Recv(buf, 0, 7)
            comm.Send(buf, 0, 7)
    return (time.perf_counter() - t0) / (2 * hops)


PAIRED_WINDOWS = 12     # windows of the paired measurement (largest size only)
PAIRED_HOPS = 100       # round trips per window and side (as many as a best-of repetition of a large size)


def pingpong_paired(q, comm, nbytes: int, windows: int = PAIRED_WINDOWS, hops: int = PAIRED_HOPS) -> list[float]:
    """Per window, mpi4py's one-way hop time over celeritas's: ``hops`` round trips of each, one
    right after the other (which goes first alternates), the celeritas ones on one warmed buffer
    throughout.  This VM's fast and slow phases last seconds, longer than a best-of
    repetition: in one run every celeritas repetition of the 4 MiB hop met a slow phase (1.2 ms
    a hop) and the mpi4py ones between them a fast one (0.18 ms).  A pair taken within tens of
    milliseconds sees one phase, so the median of the pairs' ratios does not depend on which
    side the phases happened to hit."""
    _x, hop = _warmed_pingpong(q, nbytes)

    def ours() -> float:
        q.wait(barrier=True)
        return _allmax(comm, _timed_round_trips(q, hop, hops))

    ratios = []
    for w in range(windows):
        if w % 2:
            tm = _allmax(comm, pingpong_mpi(comm, nbytes, hops))
            tc = ours()
        else:
            tc = ours()
            tm = _allmax(comm, pingpong_mpi(comm, nbytes, hops))
        ratios.append(tm / tc)
    q.wait(barrier=True)
    return ratios


def bench_pingpong(q, comm, args, console) -> list[dict]:
    sizes = []
    s = 8
    while s <= args.max_bytes:
        sizes.append(s)
        s *= 8 if s < 4096 else 4
    if sizes[-1] != args.max_bytes:
        sizes.append(args.max_bytes)
    rows = []
    for nbytes in sizes:
        hops = args.hops or (500 if nbytes <= 65536 else 100)
        tc = tg = tm = float("inf")
        for _ in range(args.reps):              # alternating, best of each
            tc = min(tc, _allmax(comm, pingpong_celeritas(q, nbytes, hops)))
            tg = min(tg, _allmax(comm, pingpong_compiled(q, comm, nbytes, hops)))
            tm = min(tm, _allmax(comm, pingpong_mpi(comm, nbytes, hops * 10)),
                     _allmax(comm, pingpong_mpi_preposted(comm, nbytes, hops * 10)))
        rows.append((nbytes, tc, tg, tm))
    paired = pingpong_paired(q, comm, sizes[-1], windows=4 if args.quick else PAIRED_WINDOWS)
    if comm.Get_rank() == 0:
        from rich.table import Table
        t = Table(title=f"push/await_push vs mpi4py Send/Recv ping-pong (one-way, best of {args.reps})")
        for col in ("box", "celeritas latency", "mpi4py latency", "celeritas bandwidth", "mpi4py bandwidth",
                    "ratio mpi4py/celeritas", "compiled ahead: latency", "bandwidth", "ratio"):
            t.add_column(col, justify="right")
        for nbytes, tc, tg, tm in rows:
            t.add_row(_bytes(nbytes), f"{tc * 1e6:,.1f} us", f"{tm * 1e6:,.1f} us", f"{nbytes / tc / 1e6:,.1f} MB/s",
                      f"{nbytes / tm / 1e6:,.1f} MB/s", f"{tm / tc:.3f}", f"{tg * 1e6:,.1f} us",
                      f"{nbytes / tg / 1e6:,.1f} MB/s", f"{tm / tg:.3f}")
        console.print(t)
        lo, med, hi = _quartiles(paired)
        console.print(f"{_bytes(sizes[-1])}, paired (mpi4py / celeritas one-way time, {len(paired)} windows of "
                      f"{PAIRED_HOPS} round trips each, alternating): median {med:.3f}, quartiles {lo:.3f}-{hi:.3f}")
    out = [{"bytes": nb, "celeritas_s": tc, "compiled_s": tg, "mpi4py_s": tm} for nb, tc, tg, tm in rows]
    out[-1]["paired_ratios"] = paired
    return out


# ---------------------------------------------------------------------------------- streaming


STREAM_WINDOW = 16          # messages in flight per window (osu_bw's default is 64)
STREAM_WARMUP = 8           # untimed windows first (allocations, replay templates, first transfers)


def stream_celeritas(q, nbytes: int, window: int, windows: int) -> float:
    """Seconds per message of a one-way stream rank 0 -> rank 1, osu_bw's way: per window,
    rank 0 writes ``window`` rows of a (window, nbytes) buffer (one no-op kernel), then
    ``window`` tasks each read one row on rank 1, so ``window`` pushes of ``nbytes`` are
    in flight together.  The next window's write waits for the sends (their reads of the
    rows), as osu_bw's next window waits for its ``Waitall``."""
    import celeritas as cl
    x = cl.Buffer(np.zeros((window, nbytes), np.uint8), name="stream")

    def produce(cgh):
        x.access(cgh, _rows_of(0, 0, window), cl.discard_write)
        cgh.parallel_for((2,), lambda chunk: None, name="produce")

    def consume(row: int):
        def cgf(cgh):
            x.access(cgh, _rows_of(1, row, row + 1), cl.read)
            cgh.parallel_for((2,), lambda chunk: None, name="consume")
        return cgf

    def one_window():
        q.submit(produce)
        for r in range(window):
            q.submit(consume(r))

    for _ in range(STREAM_WARMUP):          # allocations, replay templates, the first transfers
        one_window()
    # then the timed sequence once, untimed, as osu_bw warms up with its timed loop: the
    # windows after a barrier meet replay states (the barrier's epoch, the horizons'
    # phases across windows) that the first windows do not, and were lowered in full
    # inside the clock (17 commands of the first window, 1 per window of the next ones)
    q.wait(barrier=True)
    for _ in range(windows):
        one_window()
    q.wait(barrier=True)
    t0 = time.perf_counter()
    for _ in range(windows):
        one_window()
    q.wait()
    t = (time.perf_counter() - t0) / (windows * window)
    q.wait(barrier=True)
    return t


def stream_mpi(comm, nbytes: int, window: int, windows: int) -> float:
    """osu_bw with distinct rows: per window ``window`` ``Isend`` / ``Irecv`` of ``nbytes``
    each (the rows of a (window, nbytes) array), ``Waitall``, a 4-byte acknowledgement."""
    from mpi4py import MPI
    rank = comm.Get_rank()
    rows = _message_buffer(window * nbytes).reshape(window, nbytes)
    ack = np.zeros(1, np.int32)

    def one_window():
        if rank == 0:
            MPI.Request.Waitall([comm.Isend(rows[r], 1, 9) for r in range(window)])
            comm.Recv(ack, 1, 10)
        elif rank == 1:
            MPI.Request.Waitall([comm.Irecv(rows[r], 0, 9) for r in range(window)])
            comm.Send(ack, 0, 10)

    for _ in range(2):
        one_window()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(windows):
        one_window()
    return (time.perf_counter() - t0) / (windows * window)


def bench_stream(q, comm, args, console) -> list[dict]:
    """Bandwidth of a one-way stream with ``STREAM_WINDOW`` messages in flight (osu_bw),
    beside the ping-pong's bandwidth, which is one message at a time and so bounded by
    the latency of each hop."""
    sizes = [s for s in (64 << 10, 1 << 20, 4 << 20) if s <= args.max_bytes] or [args.max_bytes]
    rows = []
    for nbytes in sizes:
        windows = 20 if nbytes >= 1 << 20 else 100
        tc = tm = float("inf")
        for _ in range(args.reps):              # alternating, best of each
            tc = min(tc, _allmax(comm, stream_celeritas(q, nbytes, STREAM_WINDOW, windows)))
            tm = min(tm, _allmax(comm, stream_mpi(comm, nbytes, STREAM_WINDOW, windows)))
        rows.append((nbytes, tc, tm))
    if comm.Get_rank() == 0:
        from rich.table import Table
        t = Table(title=f"streaming bandwidth, {STREAM_WINDOW} messages in flight (osu_bw), rank 0 -> rank 1, "
                        f"best of {args.reps}")
        for col in ("message", "celeritas", "mpi4py Isend/Irecv", "ratio celeritas/mpi4py"):
            t.add_column(col, justify="right")
        for nbytes, tc, tm in rows:
            t.add_row(_bytes(nbytes), f"{nbytes / tc / 1e6:,.0f} MB/s", f"{nbytes / tm / 1e6:,.0f} MB/s",
                      f"{tm / tc:.3f}")
        console.print(t)
    return [{"bytes": nb, "window": STREAM_WINDOW, "celeritas_s": tc, "mpi4py_s": tm} for nb, tc, tm in rows]


def _bytes(n: int) -> str:
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:g} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------------------------- idle CPU


def idle_cpu(q, comm, seconds: float) -> tuple[float, float]:
    """CPU use (% of one core, whole process) of rank 0 while it waits at a fence.

    The chunk of a 2-element kernel on rank ``owner`` sleeps ``seconds``; rank 0
    then fences the buffer: (a) ``owner`` 1: rank 0 waits for rank 1's row (a
    receive is outstanding the whole time), (b) ``owner`` 0: for its own kernel
    (nothing outstanding in MPI).
    """
    import resource

    import celeritas as cl
    x = cl.Buffer(np.zeros((2, 8), np.float64), name="idle")

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def produce(owner: int):
        def cgf(cgh):
            x.access(cgh, lambda chunk, shape: cl.Subrange((chunk.offset[0], 0), (chunk.range[0], shape[1])),
                     cl.write)
            cgh.parallel_for((2,), _sleep_on(owner, seconds), name="produce")
        return cgf

    out = []
    for owner in (1, 0):
        q.wait(barrier=True)
        c0, t0 = cpu(), time.perf_counter()
        q.submit(produce(owner))
        result = q.fence(x).result()          # rank 0 needs row ``owner``
        dt = time.perf_counter() - t0
        c1 = cpu()
        assert result.shape == (2, 8)
        out.append(100 * (c1 - c0) / dt)
    q.wait(barrier=True)
    return out[0], out[1]


def _sleep_on(owner: int, seconds: float):
    """A kernel of a (2,) range whose chunk ``owner`` (on rank ``owner``) sleeps."""
    def kernel(chunk):
        if chunk.offset[0] == owner:
            time.sleep(seconds)
    return kernel


def bench_idle(q, comm, args, console) -> dict:
    a, b = idle_cpu(q, comm, 2.0)
    if comm.Get_rank() == 0:
        console.print(f"CPU use of rank 0 waiting 2 s at a fence: {a:.1f} % of a core while it waits for "
                      f"a peer's data (a receive outstanding), {b:.1f} % while it waits for its own kernel")
    return {"waiting_for_peer_percent": a, "waiting_for_own_kernel_percent": b}


# ---------------------------------------------------------------------------------- strided


def bench_strided(comm, args, console) -> None:
    """Ping-pong of one strided view through MpiCommunicator, each policy (ranks 0 and 1)."""
    from executor.mpi import MpiCommunicator
    mc = MpiCommunicator(comm, install_hooks=False, divergence_timeout=None)
    rank = comm.Get_rank()
    cases = [((1024, 1024), np.s_[:, 0:1]), ((1024, 1024), np.s_[:, 0:16]), ((1024, 1024), np.s_[:, 0:512]),
             ((4096, 4096), np.s_[:, 0:2048]), ((1024, 8192), np.s_[:, 0:4096]), ((32, 262144), np.s_[:, 0:131072]),
             ((256, 256, 256), np.s_[:, 0:128, :]), ((256, 256, 256), np.s_[:, :, 0:1]), ((1024, 1024), np.s_[0:512, 0:512])]

    def spin(r):
        while not r.test():
            time.sleep(2e-5)

    def one(view, msg):
        if rank == 0:
            spin(mc.send_payload(1, msg, view))
            spin(mc.receive_payload(1, msg + 1, view))
        elif rank == 1:
            spin(mc.receive_payload(0, msg, view))
            spin(mc.send_payload(0, msg + 1, view))

    rows = []
    msg = 0
    for shape, sl in cases:
        view = np.ones(shape, np.float32)[sl]
        res = {}
        for policy in ("datatype", "staging", "auto"):
            mc._strided = policy
            reps = 2 if view.nbytes >= 16 << 20 else 10
            ts = []
            for _ in range(reps + 1):
                comm.Barrier()
                t0 = time.perf_counter()
                one(view, msg)
                msg += 2
                ts.append((time.perf_counter() - t0) / 2)
            res[policy] = _allmax(comm, min(ts[1:]))
        rows.append((shape, view.shape, view.nbytes, res))
    mc.close()
    if rank == 0:
        from rich.table import Table
        t = Table(title="strided payloads: MPI hvector datatype vs contiguous staging copy (one-way)")
        for col in ("allocation", "box", "bytes", "datatype", "staging", "auto", "staging/datatype"):
            t.add_column(col, justify="right")
        for shape, vshape, nb, r in rows:
            t.add_row(str(shape), str(vshape), _bytes(nb), f"{r['datatype'] * 1e6:,.0f} us",
                      f"{r['staging'] * 1e6:,.0f} us", f"{r['auto'] * 1e6:,.0f} us",
                      f"{r['staging'] / r['datatype']:.2f}")
        console.print(t)


# ---------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse(argv)
    from executor.mpi import launched_under_mpi
    if not launched_under_mpi():
        from celeritas import launcher
        env_devices = os.environ.get("CELERITAS_DEVICES", "host:1")
        return launcher.run(args.ranks, str(Path(__file__).resolve()), list(sys.argv[1:] if argv is None else argv),
                            devices=env_devices)
    import celeritas as cl
    from mpi4py import MPI

    from executor.mpi import library_version
    comm = MPI.COMM_WORLD
    console = _console()
    # mpi4py's first pickled allreduce on a communicator duplicates it (a blocking
    # collective) while holding the GIL; do that before celeritas has threads that
    # peers depend on (it deadlocked a run where one rank got there first)
    comm.allreduce(0)
    q = cl.Queue()
    if comm.Get_rank() == 0:
        console.print(f"[bold]bench_mpi[/bold]: {comm.Get_size()} ranks, CELERITAS_DEVICES="
                      f"{os.environ.get('CELERITAS_DEVICES')}, {library_version(MPI)}, "
                      f"{os.cpu_count()} cores")
    results: dict = {"ranks": comm.Get_size(), "devices": os.environ.get("CELERITAS_DEVICES"),
                     "mpi": library_version(MPI), "load_average": os.getloadavg()[0]}
    if not args.skip_wave:
        results["wave"] = bench_wave(q, comm, args, console)
    if not args.skip_pingpong and comm.Get_size() >= 2:
        results["pingpong"] = bench_pingpong(q, comm, args, console)
    if not args.skip_stream and comm.Get_size() >= 2:
        results["stream"] = bench_stream(q, comm, args, console)
    if args.idle and comm.Get_size() >= 2:
        results["idle"] = bench_idle(q, comm, args, console)
    if args.strided and comm.Get_size() >= 2:
        bench_strided(comm, args, console)
    q.shutdown()
    if args.json and comm.Get_rank() == 0:
        import json
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
