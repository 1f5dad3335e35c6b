"""The hand-written baselines of the benchmarks compute what the celeritas runs compute.

(Their speed is measured by the benchmarks; here only their results: a baseline that
skipped work would make every ratio look worse than it is.)
"""
from __future__ import annotations

import numpy as np
import pytest

import celeritas as cl
from apps import wave_sim
from benchmarks import bench_runtime


@pytest.mark.parametrize("n,blocks", [(16, 4), (19, 4), (12, 3), (10, 1)])
def test_block_stencil_floor_equals_the_sequential_reference(n, blocks):
    steps = 7
    got = bench_runtime.blocks_stencil_field(wave_sim.initial_condition(n), steps,
                                             lambda s: wave_sim.coefficients(s, 0.25, 1.0), blocks)
    np.testing.assert_array_equal(got, wave_sim.reference(n, steps))


def test_block_rows_are_split_1d_chunks():
    assert bench_runtime.block_rows(128, 4) == [(0, 32), (32, 64), (64, 96), (96, 128)]
    assert bench_runtime.block_rows(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_noop_stencil_reads_and_writes_like_the_stencil_and_computes_nothing():
    q = cl.Queue(devices="host:4", record=True)
    init = wave_sim.initial_condition(16)
    a, b = cl.Buffer(init), cl.Buffer(init)
    bench_runtime.noop_step(q, a, b)
    np.testing.assert_array_equal(q.fence(a).result(), init)
    kernels = [i for i in q.graphs()["instructions"] if i["kind"] == "device_kernel"]
    assert len(kernels) == 4 and {k["device"] for k in kernels} == {0, 1, 2, 3}
    q.shutdown()


@pytest.mark.timeout(120)
def test_compiled_ahead_gate_holds_more_work_than_the_submit_bound_and_restores_it():
    """benchmarks.gate: the work behind the gate runs only once released, even where it is
    more than CELERITAS_MAX_TASKS_AHEAD lets the application submit ahead (the gate raises
    the bound for its stretch; submit would otherwise wait for the gate until it timed
    out), and the bound is back at its setting after the release."""
    from benchmarks.gate import hold, release
    from celeritas.testing import run_cluster

    def program(rank):
        q = cl.Queue()
        x = cl.Buffer(np.zeros(4, np.int64), name="x")

        def inc(cgh):
            a = x.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for((4,), lambda chunk: a.__setitem__(chunk, a[chunk] + 1), name="inc")

        rt = q.runtime
        small = hold(q, 7, lambda cgh: x.access(cgh, cl.all(), cl.read_write))
        assert rt.max_tasks_ahead == 16          # (7 tasks and their horizons fit)
        for _ in range(7):
            q.submit(inc)
        assert not small.is_set()
        release(q, small)
        assert q.fence(x).result().tolist() == [7] * 4
        big = hold(q, 40, lambda cgh: x.access(cgh, cl.all(), cl.read_write))
        assert rt.max_tasks_ahead == 82
        for _ in range(40):
            q.submit(inc)
        assert not big.is_set() and rt.throttled_count == 0
        release(q, big)
        assert rt.max_tasks_ahead == 16
        return q.fence(x).result().tolist()

    assert run_cluster(program, nodes=1, devices=2, CELERITAS_MAX_TASKS_AHEAD="16") == [[47] * 4]


def test_runtime_submit_bound_is_checked():
    q = cl.Queue(devices="host:1")
    try:
        with pytest.raises(cl.ConfigError, match="max_tasks_ahead"):
            q.runtime.max_tasks_ahead = 1
        with pytest.raises(cl.ConfigError, match="max_tasks_ahead"):
            q.runtime.max_tasks_ahead = 2.5
        q.runtime.max_tasks_ahead = 64
        assert q.runtime.max_tasks_ahead == 64
    finally:
        q.shutdown()


def test_bench_mpi_row_mappers_map_the_whole_range_to_what_their_chunk_gets():
    """A range mapper's whole-range result must cover its chunks' (the task graph's
    dependencies and horizons come from it): the row the chunk holding ``item`` gets,
    and nothing for a chunk without it."""
    from types import SimpleNamespace

    from benchmarks.bench_mpi import _row_mapper, _rows_of

    def chunk(offset, rng):
        return SimpleNamespace(offset=(offset,), range=(rng,))

    shape = (16, 64)
    m = _rows_of(1, 3, 5)
    whole, holder, other = m(chunk(0, 2), shape), m(chunk(1, 1), shape), m(chunk(0, 1), shape)
    assert (whole.offset, whole.range) == ((3, 0), (2, 64))
    assert (holder.offset, holder.range) == ((3, 0), (2, 64))
    assert other.range[0] == 0
    r = _row_mapper(0, 7)(chunk(0, 2), shape)
    assert (r.offset, r.range) == ((7, 0), (1, 64))


def test_thread_cpu_by_role_counts_the_runtime_threads_that_worked():
    """benchmarks.threads: the per-role CPU the MPI benchmark reports beside each wave_sim row."""
    from benchmarks.threads import cpu_per_step, format_cpu, role, thread_cpu
    assert [role(n) for n in ("MainThread", "celeritas-scheduler-0", "celeritas-executor-1", "celeritas-D0.lane0-1",
                              "celeritas-host.lane2", "celeritas-D1.lane0-waiter-0", "celeritas-rank-3", "pool-1")] \
        == ["application", "scheduler", "executor", "lanes", "lanes", "waiters", "other", "other"]
    q = cl.Queue(devices="host:2")
    init = wave_sim.initial_condition(64)
    u, up = cl.Buffer(init), cl.Buffer(init)
    before = thread_cpu()
    steps = 50
    for s in range(steps):
        a, b, c = wave_sim.coefficients(s, 0.25, 1.0)
        wave_sim.submit_step(q, up, u, a, b, c, 64)
        up, u = u, up
    np.testing.assert_array_equal(q.fence(u).result(), wave_sim.reference(64, steps))
    per = cpu_per_step(before, thread_cpu(), steps)
    q.shutdown()
    assert set(per) == {"application", "scheduler", "executor", "lanes", "waiters", "other"}
    # every step was submitted, compiled and executed: each of the three threads worked
    assert per["application"] > 0 and per["scheduler"] > 0 and per["executor"] > 0
    assert format_cpu(per).startswith("app ") and " · sched " in format_cpu(per)


def test_run_all_gpu_rows_report_every_bench_cuda_figure(monkeypatch):
    """The GPU section's rows from a bench_cuda result (no GPU needed): each figure lands in
    its row, ratios are baseline over celeritas, and a transfer whose field differs says so."""
    from benchmarks import run_all
    wave = {"size": 64, "steps": 10, "celeritas_s": 2e-3, "compiled_s": 1e-3, "cupy_s": 1e-3, "ratio": 0.5,
            "compiled_ratio": 1.0, "close": True,
            "cpu_us_per_step": {"application": 51.2, "scheduler": 40.0, "executor": 70.4, "lanes": 0.0,
                                "waiters": 0.2, "other": 0.0}}
    r = {"gpu": "G", "wave": [wave], "wave_two_devices": [dict(wave, celeritas_s=4e-3, ratio=0.25)],
         "array_wave": [dict(wave, celeritas_s=1e-3)],
         "launch_celeritas_us": 100.0, "launch_compiled_us": 50.0, "launch_bare_us": 10.0,
         "transfers": {"size": 64, "mib": 1e6 / 2**20, "up_s": 4e-4, "down_s": 2e-4, "cupy_up_s": 1e-4,
                       "cupy_down_s": 2e-4, "cupy_pinned_s": 1e-5, "equal": False}}     # 1 MB
    monkeypatch.setattr(run_all, "gpu_name", lambda: "G")
    monkeypatch.setattr(run_all, "_bench_process", lambda *a, **k: (r, None))
    rows, failed = run_all.cupy_rows(quick=True)
    assert failed is None
    by = {row.benchmark: row for row in rows}
    assert [row.ratio for row in rows] == ["0.50×", "1.00×", "0.10×", "0.25×", "1.00×"]   # baseline / ours
    # where a short step's time goes: the threads' CPU per step (waiters under 0.5 µs left out)
    assert by["wave_sim 64² × 10, CUDA C kernel, 1 GPU, µs/step"].celeritas.endswith(
        "; CPU per step app 51 · sched 40 · exec 70)")
    up = by["64² float32 field to the GPU (a new buffer's first kernel), GB/s"]
    assert up.celeritas == "2.5 GB/s" and up.baseline == "10.0 GB/s (cupy.asarray)"
    home = by["64² float32 field fenced home after a kernel, GB/s"]
    assert home.celeritas == "5.0 GB/s" and home.baseline.endswith("; 100.0 into pinned memory)")
    assert home.goal == "(RESULTS DIFFER)"


@pytest.mark.parametrize("program", ["noop", "tiny", "hop"])
def test_bench_instructions_programs_run_as_the_dry_runs_it_counts(program):
    """The child that bench_instructions runs under valgrind, run plainly: every program
    builds its graphs in a dry run and ends cleanly."""
    import os
    import subprocess
    import sys
    from benchmarks import bench_instructions as bi
    env = {**os.environ, **bi.PROGRAMS[program][0], "PYTHONPATH": str(bi.ROOT)}
    p = subprocess.run([sys.executable, "-c", bi._CHILD, program, "5", str(bi.ROOT)], env=env, cwd=bi.ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


def test_bench_instructions_subtracts_start_up_and_needs_valgrind(monkeypatch, capsys):
    from benchmarks import bench_instructions as bi
    counts = {200: (1_000_000, 3_000_000), 600: (1_400_000, 5_000_000)}
    monkeypatch.setattr(bi, "count", lambda tree, program, steps: counts[steps])
    assert bi.per_step(bi.ROOT, "noop") == (1000.0, 5000.0)
    monkeypatch.setattr(bi.shutil, "which", lambda name: None)
    assert bi.main(["--programs", "noop"]) == 2
    assert "needs valgrind" in capsys.readouterr().out


def test_run_all_splits_a_per_iteration_figure_into_steady_cost_and_start_up():
    """A run of n iterations pays its start-up once: 60 µs an iteration and 10 ms of
    start-up read as 80 µs over 500 iterations and 65 over 2000; the split gives both back."""
    from benchmarks.run_all import _steady_and_fixed
    steady, fixed = _steady_and_fixed(500, 80.0, 65.0)
    assert abs(steady - 60.0) < 1e-9 and abs(fixed - 10.0) < 1e-9
    steady, fixed = _steady_and_fixed(50, 70.0, 70.0)     # no start-up at all
    assert abs(steady - 70.0) < 1e-9 and abs(fixed) < 1e-9
