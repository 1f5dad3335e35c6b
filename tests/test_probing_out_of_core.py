"""Adversarial probes of out-of-core execution: bounded device memories under replay,
lookahead, reductions, host tasks, fences and several ranks.

Each probe runs a program on devices whose memory a hostile user bounds (at exactly one
allocation, one byte under a chunk's need, under a single row, far below the working set
so that every step evicts) and compares every buffer with a numpy reference computed on
the host; programs run for hundreds of steps so that replay repeats their lowering, and
are compared with ``CELERITAS_REPLAY=off`` and with no limit.  Graph-level invariants
hold on every program that records its graphs: in program order no bounded memory holds
more than its capacity, and every kernel's accessors lie inside the allocations they
name.  Wrong limits (odd units, zero, rows that cannot fit) must give a clear
``cl.*Error``, never a hang, a bare exception or silently wrong data.

The first group are the defects probing found (each was a strict xfail, fixed since; its
docstring gives the input, what happened, and what is expected).  The other tests pin
probes that already behaved well.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

import celeritas as cl
from celeritas.testing import run_cluster

pytestmark = pytest.mark.timeout(300)

N = 32          # side of the 2-D stencil grids
F8 = 8          # bytes of a float64 / int64


# ---- helpers ---------------------------------------------------------------------------------
def _box(rec_box) -> tuple[tuple[int, ...], tuple[int, ...]]:
    lo, hi = rec_box
    return tuple(lo), tuple(hi)


def check_records(instructions: list[dict], capacity: int) -> dict[int, int]:
    """The graph-level out-of-core invariants on a ``Queue.graphs()`` record: in program
    order no device memory holds more than ``capacity`` bytes, and every accessor of every
    device kernel lies inside the allocation it names.  Returns the peak per memory."""
    used: dict[int, int] = {}
    peak: dict[int, int] = {}
    live: dict[int, dict] = {}
    for i in instructions:
        if i["kind"] == "alloc":
            live[i["allocation"]] = i
            if i["memory"] >= 2:
                used[i["memory"]] = used.get(i["memory"], 0) + i["size_bytes"]
                peak[i["memory"]] = max(peak.get(i["memory"], 0), used[i["memory"]])
                assert used[i["memory"]] <= capacity, (i, used[i["memory"]], capacity)
        elif i["kind"] == "free":
            a = live.pop(i["allocation"], None)
            if a is not None and a["memory"] >= 2:
                used[a["memory"]] -= a["size_bytes"]
        elif i["kind"] == "device_kernel":
            for acc in i["accesses"]:
                a = live.get(acc["allocation"])
                assert a is not None, f"kernel I{i['id']} names allocation {acc['allocation']}, which is not live"
                (alo, ahi), (lo, hi) = _box(a["box"]), _box(acc["box"])
                empty = any(h <= l for l, h in zip(lo, hi))
                assert empty or all(al <= l and h <= ah for al, l, h, ah in zip(alo, lo, hi, ahi)), \
                    (i["id"], acc, a["box"])
    return peak


def _graph_signature(instructions: list[dict]) -> list[tuple]:
    """Kinds, dependencies and boxes of an instruction record, ids as given (replay must
    produce the same graph as a fresh lowering)."""
    keys = ("kind", "memory", "box", "size_bytes", "source_memory", "dest_memory", "batch", "evict")
    return [tuple(str(i.get(k)) for k in keys) + (tuple(d["id"] if isinstance(d, dict) else d[0]
                                                         for d in i["deps"]),) for i in instructions]


def _stencil_reference(steps: int, n: int = N) -> np.ndarray:
    a = np.arange(n * n, dtype=np.float64).reshape(n, n) % 7
    for _ in range(steps):
        p = np.pad(a, 1, mode="edge")
        a = (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] + a) / 5.0
    return a


def _stencil_step(q, src, dst, n: int = N, name: str = "stencil") -> None:
    """dst = mean of src's point and its four neighbours (edges clamped): a halo read
    through neighborhood(along_axes), a one_to_one discard_write."""
    def cgf(cgh):
        r = src.access(cgh, cl.neighborhood((1, 1), shape="along_axes"), cl.read)
        w = dst.access(cgh, cl.one_to_one(), cl.discard_write)

        @cgh.parallel_for((n, n), name=name)
        def kernel(chunk):
            (x0, y0), (x1, y1) = chunk.box.min, chunk.box.max
            xs = np.clip(np.arange(x0 - 1, x1 + 1), 0, n - 1)
            ys = np.clip(np.arange(y0 - 1, y1 + 1), 0, n - 1)
            ox, oy = max(x0 - 1, 0), max(y0 - 1, 0)
            blk = np.asarray(r[ox:min(x1 + 1, n), oy:min(y1 + 1, n)])
            full = blk[np.ix_(xs - ox, ys - oy)]
            w[chunk] = (full[:-2, 1:-1] + full[2:, 1:-1] + full[1:-1, :-2] + full[1:-1, 2:]
                        + full[1:-1, 1:-1]) / 5.0
    q.submit(cgf)


def _stencil_program(steps: int, n: int = N, record: bool = False):
    """A program for run_cluster: ``steps`` double-buffered stencil steps; returns the
    result, the instruction generator's memory stats, its replay stats and (with
    ``record``) the instruction records."""
    def program(rank):
        q = cl.Queue(record=record)
        a = cl.Buffer(np.arange(n * n, dtype=np.float64).reshape(n, n) % 7, name="a")
        b = cl.Buffer(shape=(n, n), dtype=np.float64, name="b")
        for s in range(steps):
            src, dst = (a, b) if s % 2 == 0 else (b, a)
            _stencil_step(q, src, dst, n)
        got = q.fence(a if steps % 2 == 0 else b).result()
        igg = q.runtime.scheduler.igg
        replay = igg.replay.stats() if igg.replay is not None else None
        q.wait()
        return got, dict(igg.memory_stats), replay, (q.graphs()["instructions"] if record else None)
    return program


def _run1(program, devices: int = 1, **env):
    """One rank of ``program`` on ``host:devices`` with ``env``."""
    (out,) = run_cluster(program, nodes=1, devices=devices, **env)
    return out


def _increment_program(shape, dtype=np.float64, name="inc"):
    """A read_write one_to_one increment of an arange buffer of ``shape``; returns the
    result and the instruction records."""
    def program(rank):
        q = cl.Queue(record=True)
        b = cl.Buffer(np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape), name="b")

        def cgf(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)

            @cgh.parallel_for(shape, name=name)
            def kernel(chunk):
                w[chunk] = w[chunk] + 1
        q.submit(cgf)
        got = q.fence(b).result()
        q.wait()
        return got, q.graphs()["instructions"]
    return program


# =====================================================================================
# Defects found by probing (fixed): each asserts what the rule requires
# =====================================================================================


@pytest.mark.parametrize("devices", [1, 2])
def test_replay_hits_on_a_bounded_device_that_never_evicts(devices):
    """Input: the stencil, 120 steps, on devices bounded at twice what both grids need (no
    eviction, no batch).  Happened: replay recorded a new template for every step and never
    replayed one (0 hits against 110 without a limit; on CUDA, bounded by default, replay
    never worked).  Expected: steps are replayed, the graph is the one replay off gives, and
    the grid equals numpy."""
    steps = 120
    cap = 4 * N * N * F8
    on = _run1(_stencil_program(steps, record=True), devices=devices, CELERITAS_HOST_DEVICE_MEMORY=str(cap))
    off = _run1(_stencil_program(steps, record=True), devices=devices, CELERITAS_HOST_DEVICE_MEMORY=str(cap),
                CELERITAS_REPLAY="off")
    want = _stencil_reference(steps)
    np.testing.assert_array_equal(on[0], want)
    np.testing.assert_array_equal(off[0], want)
    assert on[1]["evictions"] == 0 and on[1]["batches"] == 0
    assert on[2]["hits"] > steps // 2, on[2]
    assert _graph_signature(on[3]) == _graph_signature(off[3])
    check_records(on[3], cap)


# =====================================================================================
# Probes that behaved well
# =====================================================================================

@pytest.mark.parametrize("lookahead", ["auto", "none", "infinite"])
def test_stencil_evicting_every_step_for_hundreds_of_steps_is_exact(lookahead):
    """Two 8 KiB grids on two devices of 5461 B each: every step evicts and batches.  After
    200 steps the grid equals numpy bit for bit, with replay on, with replay off and with no
    limit, and the memory stats are the same with replay on and off."""
    steps = 200
    want = _stencil_reference(steps)
    cap = 2 * N * N * F8 // 3
    on = _run1(_stencil_program(steps), devices=2, CELERITAS_HOST_DEVICE_MEMORY=str(cap),
               CELERITAS_LOOKAHEAD=lookahead)
    off = _run1(_stencil_program(steps), devices=2, CELERITAS_HOST_DEVICE_MEMORY=str(cap),
                CELERITAS_LOOKAHEAD=lookahead, CELERITAS_REPLAY="off")
    free = _run1(_stencil_program(steps), devices=2, CELERITAS_LOOKAHEAD=lookahead)
    for got in (on[0], off[0], free[0]):
        np.testing.assert_array_equal(got, want)
    assert on[1] == off[1]
    assert on[1]["evictions"] > steps and on[1]["batches"] > steps
    assert free[1]["evictions"] == 0 and free[1]["batches"] == 0
