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
import logging

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
    order no device memory holds more than ``capacity`` bytes, every allocation there
    (transitively) depends on every free of that memory before it (so that no execution
    order exceeds the capacity), and every accessor of every device kernel lies inside the
    allocation it names.  Returns the peak per memory."""
    used: dict[int, int] = {}
    peak: dict[int, int] = {}
    live: dict[int, dict] = {}
    pos: dict[int, int] = {}
    closure: dict[int, int] = {}          # instruction id -> bitset of its predecessors' positions
    frees: dict[int, list[int]] = {}      # memory -> positions of its frees so far
    for k, i in enumerate(instructions):
        bits = 0
        for d in i["deps"]:
            if d["id"] in pos:            # (older than the record: before the first epoch)
                bits |= closure[d["id"]] | (1 << pos[d["id"]])
        pos[i["id"]], closure[i["id"]] = k, bits
        if i["kind"] == "alloc":
            live[i["allocation"]] = i
            if i["memory"] >= 2:
                missing = [f for f in frees.get(i["memory"], ()) if not bits >> f & 1]
                assert not missing, f"alloc I{i['id']} may run before frees at {missing} that made its room"
                used[i["memory"]] = used.get(i["memory"], 0) + i["size_bytes"]
                peak[i["memory"]] = max(peak.get(i["memory"], 0), used[i["memory"]])
                assert used[i["memory"]] <= capacity, (i, used[i["memory"]], capacity)
        elif i["kind"] == "free":
            a = live.pop(i["allocation"], None)
            if a is not None and a["memory"] >= 2:
                used[a["memory"]] -= a["size_bytes"]
                frees.setdefault(a["memory"], []).append(k)
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


@pytest.mark.parametrize("lookahead", ["auto", "none", "infinite"])
@pytest.mark.parametrize("devices", [1, 2])
def test_replay_hits_on_a_bounded_device_that_never_evicts(devices, lookahead):
    """Input: the stencil, 120 steps, on devices bounded at twice what both grids need (no
    eviction, no batch).  Happened: replay recorded a new template for every step and never
    replayed one (0 hits against 110 without a limit; on CUDA, bounded by default, replay
    never worked).  Expected: steps are replayed, the graph is the one replay off gives, and
    the grid equals numpy."""
    steps = 120
    cap = 4 * N * N * F8
    on = _run1(_stencil_program(steps, record=True), devices=devices, CELERITAS_HOST_DEVICE_MEMORY=str(cap),
               CELERITAS_LOOKAHEAD=lookahead)
    off = _run1(_stencil_program(steps, record=True), devices=devices, CELERITAS_HOST_DEVICE_MEMORY=str(cap),
                CELERITAS_LOOKAHEAD=lookahead, CELERITAS_REPLAY="off")
    want = _stencil_reference(steps)
    np.testing.assert_array_equal(on[0], want)
    np.testing.assert_array_equal(off[0], want)
    assert on[1]["evictions"] == 0 and on[1]["batches"] == 0
    assert on[2]["hits"] > steps // 2, on[2]
    assert _graph_signature(on[3]) == _graph_signature(off[3])
    check_records(on[3], cap)


def test_replay_hits_on_two_ranks_with_bounded_devices():
    """Input: as above on two ranks (halo transfers every step).  Happened: no replay hit on
    either rank.  Expected: hits on every rank, and both ranks equal numpy."""
    steps = 80
    outs = run_cluster(_stencil_program(steps), nodes=2, devices=1, CELERITAS_HOST_DEVICE_MEMORY=str(4 * N * N * F8))
    for got, stats, rp, _ in outs:
        np.testing.assert_array_equal(got, _stencil_reference(steps))
        assert stats["evictions"] == 0 and rp["hits"] > steps // 2


@pytest.mark.parametrize("what", ["reduction_only", "granule"])
def test_out_of_memory_names_the_reduction_target_and_the_granule(what):
    """Input: (a) a kernel with only a plus reduction into int64 ``s`` on a 1-byte device;
    (b) a stencil with constrain_split((8, 1)) on a device that holds 4 rows of the chunk.
    Happened: cl.OutOfMemoryError "one row of its chunk ... needs at least 8 bytes for
    buffers  and the reduction scratch of every batch" (no buffer named; in (b) "one row"
    for eight).  Expected: the message names the reduction's target buffer, and the
    granule ("8 rows") that cannot be cut further."""
    def reduction_only(rank):
        q = cl.Queue()
        s = cl.Buffer(np.zeros(1, np.int64), name="s")

        def cgf(cgh):
            r = cl.reduction(s, cgh, cl.plus, initialize_to_identity=True)
            cgh.parallel_for((100,), lambda c, r: r.combine(1), name="count", reductions=(r,))
        q.submit(cgf)
        return q.fence(s).result()

    def granule(rank):
        q = cl.Queue()
        a = cl.Buffer(np.zeros((N, N)), name="a")
        b = cl.Buffer(shape=(N, N), dtype=np.float64, name="b")

        def cgf(cgh):
            cl.constrain_split(cgh, (8, 1))
            r = a.access(cgh, cl.neighborhood((1, 1)), cl.read)
            w = b.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((N, N), lambda c: w.__setitem__(c, r[c]), name="copy8")
        q.submit(cgf)
        return q.fence(b).result()

    if what == "reduction_only":
        with pytest.raises(cl.OutOfMemoryError) as ei:
            _run1(reduction_only, CELERITAS_HOST_DEVICE_MEMORY="1")
        msg = str(ei.value)
        assert '"count"' in msg and 'reduction' in msg and '"s"' in msg and "buffers  " not in msg
    else:
        with pytest.raises(cl.OutOfMemoryError) as ei:
            _run1(granule, CELERITAS_HOST_DEVICE_MEMORY=str(4 * 2 * N * F8))
        msg = str(ei.value)
        assert '"copy8"' in msg and "8 rows" in msg and "one row" not in msg


@pytest.mark.parametrize("raw,want", [("2K", 2048), ("3m", 3 << 20), ("1GB", 1 << 30), (" 4096 ", 4096)])
def test_host_device_memory_takes_the_units_the_device_limit_takes(raw, want):
    """Input: CELERITAS_HOST_DEVICE_MEMORY=2K (3m, 1GB).  Happened: cl.ConfigError "is not an
    integer", while CELERITAS_DEVICE_MEMORY_LIMIT=2K means 2048 bytes and API.md says the
    host variable "does the same for host:N".  Expected: the same byte spellings (a
    fraction stays an error: host:N has no size to take it of)."""
    from celeritas import config
    assert config.from_env({"CELERITAS_HOST_DEVICE_MEMORY": raw}).host_device_memory == want


@pytest.mark.parametrize("lookahead", ["auto", "infinite"])
def test_evictions_in_batches_do_not_warn_of_a_growing_access_pattern(caplog, lookahead):
    """Input: the 2-D stencil on one device of a quarter of both grids, lookahead auto (the
    default) or infinite, 20 steps.  Happened: 'buffer B0 "a" was allocated 10 times on
    memory 1: its access pattern grows; lookahead 'auto' or 'infinite' allocates once
    instead', for a pattern that does not grow and under the lookahead it recommends:
    each batch's eviction saves its rows to their own host allocation.  Expected: no such
    warning (the host allocations stay the per-batch pieces: nothing is resized)."""
    caplog.set_level(logging.WARNING)
    got, _stats, _rp, instructions = _run1(_stencil_program(20, record=True), CELERITAS_LOOKAHEAD=lookahead,
                                           CELERITAS_HOST_DEVICE_MEMORY=str(N * N * F8 // 2))
    np.testing.assert_array_equal(got, _stencil_reference(20))
    assert [r.getMessage() for r in caplog.records if "access pattern grows" in r.getMessage()] == []
    host = [i for i in instructions if i["kind"] == "alloc" and i["memory"] == 1]
    assert len(host) >= 10 and not any(i["kind"] == "copy" and i["source_memory"] == i["dest_memory"] == 1
                                       for i in instructions)


def test_memory_stats_count_the_chunks_that_ran_as_batches():
    """Input: the evicting stencil on two devices, 6 steps (each device chunk of each step
    runs as batches).  Happened: the stats the summary gathers report batched_chunks = 0
    beside 48 batch kernels.  Expected: one batched chunk per (task, device) whose kernels
    are batches, 12 here."""
    cap = 2 * N * N * F8 // 3
    got, stats, _rp, instructions = _run1(_stencil_program(6, record=True), devices=2,
                                          CELERITAS_HOST_DEVICE_MEMORY=str(cap))
    np.testing.assert_array_equal(got, _stencil_reference(6))
    batched = {(k["task"], k["device"]) for k in instructions if k["kind"] == "device_kernel" and k.get("batch")}
    assert len(batched) == 12
    assert stats["batched_chunks"] == len(batched)


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


# ---- limits around one chunk's need ---------------------------------------------------------
@pytest.mark.parametrize("delta,batched", [(0, False), (F8, False), (-1, True), (-F8, True)])
def test_limit_at_exactly_one_allocation_and_one_byte_under(delta, batched):
    """A (16, 8) float64 buffer (1 KiB) incremented in place on one device bounded at exactly
    its size (one allocation, no batch), one element over, one byte under and one element
    under (batches): always arange + 1, never over the capacity."""
    shape = (16, 8)
    need = 16 * 8 * F8
    got, instructions = _run1(_increment_program(shape), CELERITAS_HOST_DEVICE_MEMORY=str(need + delta))
    np.testing.assert_array_equal(got, np.arange(128, dtype=np.float64).reshape(shape) + 1)
    kernels = [i for i in instructions if i["kind"] == "device_kernel"]
    assert all(bool(k.get("batch")) == batched for k in kernels)
    assert (len(kernels) > 1) == batched
    check_records(instructions, need + delta)


@pytest.mark.parametrize("cap", [1, 7, 63])
def test_limit_under_one_row_is_an_out_of_memory_error_naming_task_and_buffer(cap):
    """A (16, 8) float64 buffer has 64-byte rows; under 64 bytes no batch fits: a
    cl.OutOfMemoryError (also a MemoryError) naming the kernel, the buffer and the
    capacity, raised to the program, not a hang."""
    with pytest.raises(cl.OutOfMemoryError) as ei:
        _run1(_increment_program((16, 8), name="tiny_inc"), CELERITAS_HOST_DEVICE_MEMORY=str(cap))
    msg = str(ei.value)
    assert isinstance(ei.value, MemoryError)
    assert '"tiny_inc"' in msg and '"b"' in msg and f"{cap} bytes" in msg


def test_a_buffer_with_one_row_cannot_batch_and_says_so():
    """Batches cut dimension 0 only: a (1, 256) float64 buffer on a 1 KiB device cannot be
    cut; cl.OutOfMemoryError names the kernel, the 2 KiB its row needs and the capacity."""
    with pytest.raises(cl.OutOfMemoryError) as ei:
        _run1(_increment_program((1, 256), name="wide"), CELERITAS_HOST_DEVICE_MEMORY="1024")
    msg = str(ei.value)
    assert '"wide"' in msg and "2048 bytes" in msg and "1024 bytes" in msg


def test_a_0d_buffer_on_a_device_of_exactly_its_size():
    """A 0-d float64 buffer (8 bytes) on a device of 8 bytes: incremented 5 times."""
    def program(rank):
        q = cl.Queue(record=True)
        b = cl.Buffer(np.array(2.5), name="scalar")
        for _ in range(5):
            def cgf(cgh):
                w = b.access(cgh, cl.all(), cl.read_write)
                cgh.parallel_for((1,), lambda chunk: w.__setitem__((), w[()] + 1), name="bump")
            q.submit(cgf)
        got = q.fence(b).result()
        q.wait()
        return got, q.graphs()["instructions"]
    got, instructions = _run1(program, CELERITAS_HOST_DEVICE_MEMORY="8")
    assert got.shape == () and float(got) == 7.5
    check_records(instructions, 8)


# ---- many buffers, evicted data read by host tasks and fences ------------------------------
def test_many_buffers_competing_for_a_small_device():
    """Ten 512-byte buffers on a device of 1 KiB: each step reads two of them (all of
    one, one_to_one of the other) and writes a third; the device holds at most two, so
    almost every task evicts.  Every buffer equals numpy after 40 steps."""
    k, n = 10, 64

    def program(rank):
        q = cl.Queue(record=True)
        bufs = [cl.Buffer(np.full(n, float(i)), name=f"b{i}") for i in range(k)]
        for s in range(40):
            x, y, z = bufs[s % k], bufs[(3 * s + 1) % k], bufs[(7 * s + 2) % k]
            if len({id(x), id(y), id(z)}) < 3:
                continue

            def cgf(cgh, x=x, y=y, z=z):
                rx = x.access(cgh, cl.all(), cl.read)
                ry = y.access(cgh, cl.one_to_one(), cl.read)
                wz = z.access(cgh, cl.one_to_one(), cl.discard_write)

                @cgh.parallel_for((n,), name="mix")
                def kernel(chunk):
                    wz[chunk] = ry[chunk] + np.asarray(rx[0:n]).sum() / n
            q.submit(cgf)
        got = [q.fence(b).result() for b in bufs]
        q.wait()
        return got, q.graphs()["instructions"]

    want = [np.full(n, float(i)) for i in range(k)]
    for s in range(40):
        x, y, z = s % k, (3 * s + 1) % k, (7 * s + 2) % k
        if len({x, y, z}) < 3:
            continue
        want[z] = want[y] + want[x].sum() / n
    cap = 2 * n * F8 + n * F8 // 2
    got, instructions = _run1(program, CELERITAS_HOST_DEVICE_MEMORY=str(cap))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    check_records(instructions, cap)
    assert any(i.get("evict") for i in instructions if i["kind"] == "copy")


def test_host_tasks_and_fences_mid_run_read_evicted_data():
    """Between stencil steps that evict, a host task reads the whole grid (evicted to host
    in parts) into a host object and a fence snapshots it: every snapshot equals numpy at
    that step."""
    steps = 24

    def program(rank):
        q = cl.Queue(record=True)
        a = cl.Buffer(np.arange(N * N, dtype=np.float64).reshape(N, N) % 7, name="a")
        b = cl.Buffer(shape=(N, N), dtype=np.float64, name="b")
        seen = cl.HostObject([])
        fences = []
        for s in range(steps):
            src, dst = (a, b) if s % 2 == 0 else (b, a)
            _stencil_step(q, src, dst)
            if s % 5 == 2:
                def host(cgh, dst=dst):
                    r = dst.access(cgh, cl.all(), cl.read)
                    log = cl.side_effect(seen, cgh)
                    cgh.host_task(lambda part: log.append(np.array(r[0:N, 0:N])), on=cl.on_master_node)
                q.submit(host)
            if s % 7 == 3:
                fences.append((s, q.fence(dst)))
        last = q.fence(a if steps % 2 == 0 else b).result()
        snaps = q.fence(seen).result()
        q.wait()
        return last, [(s, f.result()) for s, f in fences], snaps, q.graphs()["instructions"]

    cap = 2 * N * N * F8 // 3
    last, fenced, snaps, instructions = _run1(program, devices=2, CELERITAS_HOST_DEVICE_MEMORY=str(cap))
    np.testing.assert_array_equal(last, _stencil_reference(steps))
    assert [s for s, _ in fenced] == [3, 10, 17]
    for s, got in fenced:
        np.testing.assert_array_equal(got, _stencil_reference(s + 1))
    assert len(snaps) == 5
    for k, got in zip(range(2, steps, 5), snaps):
        np.testing.assert_array_equal(got, _stencil_reference(k + 1))
    check_records(instructions, cap)


def test_fence_of_a_subrange_of_an_evicted_buffer():
    """A fence of rows 5..9, columns 3..30 of a grid that the next buffer's work evicted."""
    def program(rank):
        q = cl.Queue()
        a = cl.Buffer(np.arange(N * N, dtype=np.float64).reshape(N, N) % 7, name="a")
        b = cl.Buffer(shape=(N, N), dtype=np.float64, name="b")
        _stencil_step(q, a, b)
        _stencil_step(q, b, a)
        return q.fence(b, cl.Subrange((5, 3), (4, 27))).result()

    got = _run1(program, CELERITAS_HOST_DEVICE_MEMORY=str(N * N * F8))
    np.testing.assert_array_equal(got, _stencil_reference(1)[5:9, 3:30])


def test_buffers_destroyed_while_evicted_and_new_ones_reuse_the_room():
    """Six buffers written in turn on a device that holds two, so that each is evicted
    (its only up-to-date copy saved to host) by the next; then all are dropped (garbage
    collected) while evicted, and six new ones take their room.  The survivor's data is
    intact, the capacity holds, and by the wait every dropped buffer's allocations are
    freed."""
    n = 64

    def bump(q, keep, tmp, r):
        def cgf(cgh):
            rk = keep.access(cgh, cl.one_to_one(), cl.read_write)
            rt = tmp.access(cgh, cl.one_to_one(), cl.discard_write)

            @cgh.parallel_for((n,), name="pair")
            def kernel(chunk):
                rt[chunk] = rk[chunk] * 2 + r
                rk[chunk] = rk[chunk] + 1
        q.submit(cgf)

    def program(rank):
        q = cl.Queue(record=True)
        keep = cl.Buffer(np.arange(n, dtype=np.float64), name="keep")
        tmps = [cl.Buffer(shape=(n,), dtype=np.float64, name=f"old{r}") for r in range(6)]
        for r, tmp in enumerate(tmps):
            bump(q, keep, tmp, r)
        del tmp, tmps
        gc.collect()
        news = [cl.Buffer(shape=(n,), dtype=np.float64, name=f"new{r}") for r in range(6)]
        for r, new in enumerate(news):
            bump(q, keep, new, 10 + r)
        got = q.fence(keep).result(), q.fence(news[5]).result()
        q.wait()
        return got, q.graphs()["instructions"]

    cap = 2 * n * F8
    (got, last), instructions = _run1(program, CELERITAS_HOST_DEVICE_MEMORY=str(cap))
    np.testing.assert_array_equal(got, np.arange(n, dtype=np.float64) + 12)
    np.testing.assert_array_equal(last, (np.arange(n, dtype=np.float64) + 11) * 2 + 15)
    check_records(instructions, cap)
    assert any(i.get("evict") for i in instructions if i["kind"] == "copy")
    old = {i["allocation"] for i in instructions if i["kind"] == "alloc" and 1 <= i["buffer"] <= 6}
    freed = {i["allocation"] for i in instructions if i["kind"] == "free"}
    assert old and old <= freed


# ---- reductions on a bounded device ---------------------------------------------------------
@pytest.mark.parametrize("nodes,devices", [(1, 1), (1, 2), (2, 2)])
def test_sum_max_and_custom_reductions_on_bounded_devices(nodes, devices):
    """plus, maximum and a numpy ufunc (bitwise_xor, identity 0) over a 4 KiB int64
    buffer on 1 KiB devices (batches, each keeping its reduction scratch); a reduction
    without initialize_to_identity adds to the 42 the target holds."""
    n = 512

    def program(rank):
        q = cl.Queue()
        x = cl.Buffer((np.arange(n, dtype=np.int64) * 37) % 1001, name="x")
        s = cl.Buffer(np.array([42], dtype=np.int64), name="s")
        m = cl.Buffer(np.zeros(1, dtype=np.int64), name="m")
        z = cl.Buffer(np.zeros(1, dtype=np.int64), name="z")

        def cgf(cgh):
            rx = x.access(cgh, cl.one_to_one(), cl.read)
            rs = cl.reduction(s, cgh, cl.plus)
            rm = cl.reduction(m, cgh, cl.maximum, initialize_to_identity=True)
            rz = cl.reduction(z, cgh, np.bitwise_xor, initialize_to_identity=True)

            @cgh.parallel_for((n,), name="reduce", reductions=(rs, rm, rz))
            def kernel(chunk, a, b, c):
                v = np.asarray(rx[chunk])
                a.combine(v)
                b.combine(v)
                c.combine(np.bitwise_xor.reduce(v))
        q.submit(cgf)
        return int(q.fence(s).result()[0]), int(q.fence(m).result()[0]), int(q.fence(z).result()[0])

    x = (np.arange(n, dtype=np.int64) * 37) % 1001
    want = (42 + int(x.sum()), int(x.max()), int(np.bitwise_xor.reduce(x)))
    got = run_cluster(program, nodes=nodes, devices=devices, CELERITAS_HOST_DEVICE_MEMORY="1024")
    assert got == [want] * nodes


def test_reduction_over_evicting_steps_with_replay_on_and_off():
    """A stencil step plus a sum of the grid every step, 60 steps, evicting: the sums equal
    numpy's at every step, with replay on and off."""
    steps = 60

    def program(rank):
        q = cl.Queue()
        a = cl.Buffer(np.arange(N * N, dtype=np.float64).reshape(N, N) % 7, name="a")
        b = cl.Buffer(shape=(N, N), dtype=np.float64, name="b")
        sums = []
        for s in range(steps):
            src, dst = (a, b) if s % 2 == 0 else (b, a)
            _stencil_step(q, src, dst)
            t = cl.Buffer(shape=(1,), dtype=np.float64, name="total")

            def red(cgh, dst=dst, t=t):
                r = dst.access(cgh, cl.one_to_one(), cl.read)
                rr = cl.reduction(t, cgh, cl.plus, initialize_to_identity=True)
                cgh.parallel_for((N, N), lambda chunk, acc: acc.combine(np.asarray(r[chunk]).sum()),
                                 name="total", reductions=(rr,))
            q.submit(red)
            sums.append(q.fence(t))
        return [float(f.result()[0]) for f in sums]

    ref = [float(_stencil_reference(s + 1).sum()) for s in range(steps)]
    cap = 2 * N * N * F8 // 3
    for replay in ("on", "off"):
        got = _run1(program, devices=2, CELERITAS_HOST_DEVICE_MEMORY=str(cap), CELERITAS_REPLAY=replay)
        np.testing.assert_allclose(got, ref, rtol=1e-12)


# ---- shapes and mappers ------------------------------------------------------------------------
def test_3d_stencil_with_neighborhood_one_to_one_and_all_together():
    """A 3-D (12, 8, 6) float64 grid updated from its bounding-box neighbourhood, a 1-D
    weights buffer read whole through all(), and an output written one_to_one, on two
    devices each bounded at a third of the grids: equals numpy for 6 steps."""
    shape = (12, 8, 6)
    size = int(np.prod(shape))
    w_host = np.array([0.5, 0.25, 0.125, 0.125])

    def program(rank):
        q = cl.Queue(record=True)
        a = cl.Buffer(np.arange(size, dtype=np.float64).reshape(shape) % 5, name="a")
        b = cl.Buffer(shape=shape, dtype=np.float64, name="b")
        w = cl.Buffer(w_host, name="w")
        for s in range(6):
            src, dst = (a, b) if s % 2 == 0 else (b, a)

            def cgf(cgh, src=src, dst=dst):
                r = src.access(cgh, cl.neighborhood((1, 1, 1)), cl.read)
                rw = w.access(cgh, cl.all(), cl.read)
                o = dst.access(cgh, cl.one_to_one(), cl.discard_write)

                @cgh.parallel_for(shape, name="st3")
                def kernel(chunk):
                    lo, hi = chunk.box.min, chunk.box.max
                    glo = [max(l - 1, 0) for l in lo]
                    ghi = [min(h + 1, n) for h, n in zip(hi, shape)]
                    blk = np.asarray(r[glo[0]:ghi[0], glo[1]:ghi[1], glo[2]:ghi[2]])
                    ww = np.asarray(rw[0:4])
                    center = blk[tuple(slice(l - g, h - g) for l, h, g in zip(lo, hi, glo))]
                    up = blk[tuple(slice(max(l - 1, 0) - g, h - 1 - g) if d == 0 else slice(l - g, h - g)
                                   for d, (l, h, g) in enumerate(zip(lo, hi, glo)))] if lo[0] > 0 else None
                    out = ww[0] * center
                    if up is not None:
                        out = out + ww[1] * up
                    else:
                        top = center.copy()
                        top[1:] = center[:-1]
                        out = out + ww[1] * top
                    o[chunk] = out + ww[2] * center.sum() / center.size * 0 + ww[3]
            q.submit(cgf)
        got = q.fence(a).result()
        q.wait()
        return got, q.graphs()["instructions"]

    want = np.arange(size, dtype=np.float64).reshape(shape) % 5
    for _ in range(6):
        up = np.concatenate([want[:1], want[:-1]], axis=0)
        want = w_host[0] * want + w_host[1] * up + w_host[3]
    cap = 2 * size * F8 // 3
    got, instructions = _run1(program, devices=2, CELERITAS_HOST_DEVICE_MEMORY=str(cap))
    np.testing.assert_array_equal(got, want)
    check_records(instructions, cap)


def _two_strips(chunk, shape):
    """A non-contiguous region: the chunk's rows, columns 0..2 and shape[1]-2..shape[1]."""
    lo, hi = chunk.offset[0], chunk.offset[0] + chunk.range[0]
    return cl.Region([cl.Box((lo, 0), (hi, 2)), cl.Box((lo, shape[1] - 2), (hi, shape[1]))])


@pytest.mark.parametrize("devices", [1, 2])
def test_non_contiguous_region_mapper_on_a_bounded_device(devices):
    """A custom mapper returning two column strips at both edges of a (64, 64) int64 grid
    (32 KiB) on 2 KiB devices: the strips of each row are summed into a column vector;
    equals numpy, and the kernels' accessors lie inside their allocations."""
    n = 64

    def program(rank):
        q = cl.Queue(record=True)
        g = cl.Buffer(np.arange(n * n, dtype=np.int64).reshape(n, n), name="grid")
        out = cl.Buffer(shape=(n, 1), dtype=np.int64, name="edges")

        def cgf(cgh):
            r = g.access(cgh, _two_strips, cl.read)
            w = out.access(cgh, cl.one_to_one(), cl.discard_write)

            @cgh.parallel_for((n, 1), name="edges")
            def kernel(chunk):
                lo, hi = chunk.box.min[0], chunk.box.max[0]
                left = np.asarray(r[lo:hi, 0:2]).sum(axis=1)
                right = np.asarray(r[lo:hi, n - 2:n]).sum(axis=1)
                w[chunk] = (left + right).reshape(-1, 1)
        q.submit(cgf)
        got = q.fence(out).result()
        q.wait()
        return got, q.graphs()["instructions"]

    grid = np.arange(n * n, dtype=np.int64).reshape(n, n)
    want = (grid[:, :2].sum(axis=1) + grid[:, -2:].sum(axis=1)).reshape(n, 1)
    got, instructions = _run1(program, devices=devices, CELERITAS_HOST_DEVICE_MEMORY="2048")
    np.testing.assert_array_equal(got, want)
    check_records(instructions, 2048)
    # (the strips are allocated, never the 32 KiB bounding box of both)
    assert all(i["size_bytes"] <= 2048 for i in instructions if i["kind"] == "alloc" and i["memory"] >= 2)


def test_transposed_read_of_a_2d_buffer_larger_than_the_device():
    """out = transpose(a) through cl.transposed() for a (32, 32) float64 (8 KiB) on 3 KiB
    devices: each batch of out's rows reads a column strip of a."""
    def program(rank):
        q = cl.Queue(record=True)
        a = cl.Buffer(np.arange(N * N, dtype=np.float64).reshape(N, N), name="a")
        t = cl.Buffer(shape=(N, N), dtype=np.float64, name="t")

        def cgf(cgh):
            r = a.access(cgh, cl.transposed(), cl.read)
            w = t.access(cgh, cl.one_to_one(), cl.discard_write)

            @cgh.parallel_for((N, N), name="transpose")
            def kernel(chunk):
                (x0, y0), (x1, y1) = chunk.box.min, chunk.box.max
                w[chunk] = np.asarray(r[y0:y1, x0:x1]).T
        q.submit(cgf)
        got = q.fence(t).result()
        q.wait()
        return got, q.graphs()["instructions"]

    got, instructions = _run1(program, devices=2, CELERITAS_HOST_DEVICE_MEMORY="3072")
    np.testing.assert_array_equal(got, np.arange(N * N, dtype=np.float64).reshape(N, N).T)
    check_records(instructions, 3072)


# ---- hints, lookahead, overlap ------------------------------------------------------------------
@pytest.mark.parametrize("hint", ["oversubscribe", "split_2d", "granularity"])
def test_hints_with_a_limit(hint):
    """oversubscribe(3), split_2d and constrain_split((4, 1)) on a stencil under a limit that
    batches: equals numpy after 10 steps, within capacity."""
    steps = 10

    def program(rank):
        q = cl.Queue(record=True)
        a = cl.Buffer(np.arange(N * N, dtype=np.float64).reshape(N, N) % 7, name="a")
        b = cl.Buffer(shape=(N, N), dtype=np.float64, name="b")
        for s in range(steps):
            src, dst = (a, b) if s % 2 == 0 else (b, a)

            def cgf(cgh, src=src, dst=dst):
                if hint == "oversubscribe":
                    cl.hint(cgh, cl.oversubscribe(3))
                elif hint == "split_2d":
                    cl.hint(cgh, cl.split_2d())
                else:
                    cl.constrain_split(cgh, (4, 1))
                r = src.access(cgh, cl.neighborhood((1, 1), shape="along_axes"), cl.read)
                w = dst.access(cgh, cl.one_to_one(), cl.discard_write)

                @cgh.parallel_for((N, N), name="stencil")
                def kernel(chunk):
                    (x0, y0), (x1, y1) = chunk.box.min, chunk.box.max
                    xs = np.clip(np.arange(x0 - 1, x1 + 1), 0, N - 1)
                    ys = np.clip(np.arange(y0 - 1, y1 + 1), 0, N - 1)
                    ox, oy = max(x0 - 1, 0), max(y0 - 1, 0)
                    full = np.asarray(r[ox:min(x1 + 1, N), oy:min(y1 + 1, N)])[np.ix_(xs - ox, ys - oy)]
                    w[chunk] = (full[:-2, 1:-1] + full[2:, 1:-1] + full[1:-1, :-2] + full[1:-1, 2:]
                                + full[1:-1, 1:-1]) / 5.0
            q.submit(cgf)
        got = q.fence(a).result()
        q.wait()
        return got, q.graphs()["instructions"]

    cap = N * N * F8 // 2
    got, instructions = _run1(program, devices=2, CELERITAS_HOST_DEVICE_MEMORY=str(cap))
    np.testing.assert_array_equal(got, _stencil_reference(steps))
    check_records(instructions, cap)


@pytest.mark.parametrize("lookahead", ["auto", "none", "infinite"])
def test_growing_reads_under_a_limit_with_every_lookahead(lookahead):
    """RSim-shaped: step t writes row t of a (48, 32) float64 buffer from the sum of the
    four rows before it, so that the rows touched grow over the buffer step by step, on a
    device of 4 KiB (the buffer is 12 KiB): lookahead's anticipated allocation of the
    whole pattern cannot fit and must not be forced; equals numpy."""
    rows, cols = 48, 32

    def program(rank):
        q = cl.Queue(record=True)
        q.set_lookahead(lookahead)
        b = cl.Buffer(np.ones((rows, cols)), name="rows")
        for t in range(1, rows):
            lo = max(0, t - 4)

            def cgf(cgh, t=t, lo=lo):
                r = b.access(cgh, cl.fixed(cl.Subrange((lo, 0), (t - lo, cols))), cl.read)
                w = b.access(cgh, cl.fixed(cl.Subrange((t, 0), (1, cols))), cl.discard_write)
                cgh.parallel_for((1,), lambda chunk: w.__setitem__(
                    (slice(t, t + 1), slice(0, cols)),
                    np.asarray(r[lo:t, 0:cols]).sum(axis=0, keepdims=True) % 1000), name="grow")
            q.submit(cgf)
        got = q.fence(b).result()
        q.wait()
        return got, q.graphs()["instructions"]

    want = np.ones((rows, cols))
    for t in range(1, rows):
        want[t] = want[max(0, t - 4):t].sum(axis=0) % 1000
    got, instructions = _run1(program, CELERITAS_HOST_DEVICE_MEMORY="4096")
    np.testing.assert_array_equal(got, want)
    check_records(instructions, 4096)


def test_overlap_off_gives_the_same_results_and_replays_like_a_fresh_lowering():
    """CELERITAS_OUT_OF_CORE_OVERLAP=off (batches strictly one after the other) on the
    evicting stencil for 40 steps: equals numpy, and the graph with replay on is the one
    replay off gives."""
    steps = 40
    cap = 2 * N * N * F8 // 3
    on = _run1(_stencil_program(steps, record=True), devices=2, CELERITAS_HOST_DEVICE_MEMORY=str(cap),
               CELERITAS_OUT_OF_CORE_OVERLAP="off")
    off = _run1(_stencil_program(steps, record=True), devices=2, CELERITAS_HOST_DEVICE_MEMORY=str(cap),
                CELERITAS_OUT_OF_CORE_OVERLAP="off", CELERITAS_REPLAY="off")
    np.testing.assert_array_equal(on[0], _stencil_reference(steps))
    np.testing.assert_array_equal(off[0], _stencil_reference(steps))
    assert _graph_signature(on[3]) == _graph_signature(off[3])
    check_records(on[3], cap)


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_replay_under_a_limit_that_evicts_every_step(overlap):
    """Three grids, each step reading one and writing the next, on a device that holds two
    and a half grids: every step evicts the grid the step before read (an evicting lowering
    is never replayed: the key does not hold the other buffers on the memory).  120 steps
    equal numpy; the graph and the memory stats equal replay off's."""
    steps, n = 120, 16

    def program(rank):
        q = cl.Queue(record=True)
        bufs = [cl.Buffer(np.full((n, n), float(i)), name=f"g{i}") for i in range(3)]
        for s in range(steps):
            src, dst = bufs[s % 3], bufs[(s + 1) % 3]

            def cgf(cgh, src=src, dst=dst):
                r = src.access(cgh, cl.one_to_one(), cl.read)
                w = dst.access(cgh, cl.one_to_one(), cl.read_write)
                cgh.parallel_for((n, n), lambda c: w.__setitem__(c, (w[c] + r[c]) % 97), name="acc")
            q.submit(cgf)
        got = [q.fence(b).result() for b in bufs]
        igg = q.runtime.scheduler.igg
        q.wait()
        return got, q.graphs()["instructions"], (igg.replay.stats() if igg.replay else None), dict(igg.memory_stats)

    want = [np.full((n, n), float(i)) for i in range(3)]
    for s in range(steps):
        want[(s + 1) % 3] = (want[(s + 1) % 3] + want[s % 3]) % 97
    cap = 5 * n * n * F8 // 2
    on = _run1(program, CELERITAS_HOST_DEVICE_MEMORY=str(cap), CELERITAS_OUT_OF_CORE_OVERLAP=overlap)
    off = _run1(program, CELERITAS_HOST_DEVICE_MEMORY=str(cap), CELERITAS_OUT_OF_CORE_OVERLAP=overlap,
                CELERITAS_REPLAY="off")
    for got in (on[0], off[0]):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert _graph_signature(on[1]) == _graph_signature(off[1])
    assert on[3] == off[3] and on[3]["evictions"] > 0
    check_records(on[1], cap)


# ---- several ranks ------------------------------------------------------------------------------
@pytest.mark.parametrize("nodes,devices", [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_stencil_on_bounded_devices_of_several_ranks(nodes, devices):
    """The evicting stencil for 30 steps on 2 and 4 simulated ranks (halo transfers every
    step) with 1 and 2 bounded devices each: every rank's result equals numpy, with replay
    on and off."""
    steps = 30
    cap = 2 * N * N * F8 // (3 * nodes)
    want = _stencil_reference(steps)
    for replay in ("on", "off"):
        outs = run_cluster(_stencil_program(steps), nodes=nodes, devices=devices,
                           CELERITAS_HOST_DEVICE_MEMORY=str(cap), CELERITAS_REPLAY=replay)
        for got, stats, _rp, _ in outs:
            np.testing.assert_array_equal(got, want)
        assert sum(o[1]["evictions"] for o in outs) > 0


@pytest.mark.parametrize("nodes", [2, 4])
def test_all_reads_of_data_other_ranks_wrote_on_bounded_devices(nodes):
    """Each rank writes its rows of a (64, 16) int64 grid; then each rank sums its columns
    over all rows (received from the other ranks) through a custom mapper, on a device
    that holds half the grid: equals numpy on every rank."""
    n, m = 64, 16

    def columns(chunk, shape):
        lo, hi = chunk.offset[0], chunk.offset[0] + chunk.range[0]
        return cl.Subrange((0, lo), (shape[0], hi - lo))

    def program(rank):
        q = cl.Queue(record=True)
        g = cl.Buffer(shape=(n, m), dtype=np.int64, name="g")
        out = cl.Buffer(shape=(m,), dtype=np.int64, name="out")

        def fill(cgh):
            w = g.access(cgh, cl.one_to_one(), cl.discard_write)

            @cgh.parallel_for((n, m), name="fill")
            def kernel(chunk):
                (x0, y0), (x1, y1) = chunk.box.min, chunk.box.max
                w[chunk] = np.add.outer(np.arange(x0, x1) * 3, np.arange(y0, y1))

        def col(cgh):
            r = g.access(cgh, columns, cl.read)
            w = out.access(cgh, cl.one_to_one(), cl.discard_write)

            @cgh.parallel_for((m,), name="colsum")
            def kernel(chunk):
                j0, j1 = chunk.box.min[0], chunk.box.max[0]
                w[chunk] = np.asarray(r[0:n, j0:j1]).sum(axis=0)
        q.submit(fill)
        q.submit(col)
        got = q.fence(out).result()
        q.wait()
        return got, q.graphs()["instructions"]

    grid = np.add.outer(np.arange(n) * 3, np.arange(m)).astype(np.int64)
    cap = n * m * F8 // 2
    for got, instructions in run_cluster(program, nodes=nodes, devices=1, CELERITAS_HOST_DEVICE_MEMORY=str(cap)):
        np.testing.assert_array_equal(got, grid.sum(axis=0))
        check_records(instructions, cap)


# ---- the memory stats the runtime reports -----------------------------------------------------
def test_memory_stats_match_the_instruction_records():
    """The summary's out-of-core numbers agree with the recorded graph: batch kernels are
    the device kernels with a batch label, bytes saved to host are the bytes of the
    evicting copies, and each eviction frees one device allocation."""
    steps = 12
    cap = 2 * N * N * F8 // 3
    got, stats, _rp, instructions = _run1(_stencil_program(steps, record=True), devices=2,
                                          CELERITAS_HOST_DEVICE_MEMORY=str(cap))
    np.testing.assert_array_equal(got, _stencil_reference(steps))
    kernels = [i for i in instructions if i["kind"] == "device_kernel"]
    assert stats["batches"] == sum(1 for k in kernels if k.get("batch")) > 0

    def nbytes(rec_box):
        lo, hi = rec_box
        return int(np.prod([h - l for l, h in zip(lo, hi)])) * F8
    evicting = [c for c in instructions if c["kind"] == "copy" and c.get("evict")]
    assert stats["bytes_written_back"] == sum(nbytes(c["box"]) for c in evicting) > 0
    device_frees = {i["allocation"] for i in instructions if i["kind"] == "free"} & \
        {i["allocation"] for i in instructions if i["kind"] == "alloc" and i["memory"] >= 2}
    assert 0 < stats["evictions"] <= len(device_frees)


def test_summary_prints_the_out_of_core_line(monkeypatch, capsys):
    """CELERITAS_SUMMARY=1 on an evicting program prints evictions, bytes saved to host and
    batch kernels, the same numbers as the generator's stats."""
    monkeypatch.setenv("CELERITAS_SUMMARY", "1")
    monkeypatch.setenv("CELERITAS_HOST_DEVICE_MEMORY", str(2 * N * N * F8 // 3))
    q = cl.Queue(devices="host:1")
    a = cl.Buffer(np.arange(N * N, dtype=np.float64).reshape(N, N) % 7, name="a")
    b = cl.Buffer(shape=(N, N), dtype=np.float64, name="b")
    for s in range(4):
        src, dst = (a, b) if s % 2 == 0 else (b, a)
        _stencil_step(q, src, dst)
    np.testing.assert_array_equal(q.fence(a).result(), _stencil_reference(4))
    stats = dict(q.runtime.scheduler.igg.memory_stats)
    q.shutdown()
    err = " ".join(capsys.readouterr().err.replace("\u2502", " ").split())   # (the table wraps its cells)
    assert "out of core" in err
    assert f"{stats['evictions']} evictions" in err and f"{stats['batches']} batch kernels" in err
    assert stats["batched_chunks"] == 4 and "(4 chunks larger than their device)" in err


# ---- configuration ------------------------------------------------------------------------------
@pytest.mark.parametrize("raw,want", [("4096", 4096), (" 2k ", 2048), ("2KB", 2048), ("3m", 3 << 20),
                                      ("1G", 1 << 30), ("1.0", 1.0), ("0.25", 0.25), (".5", 0.5),
                                      ("2GiB", 2 << 30), ("512MiB", 512 << 20), ("1.5G", 3 << 29), ("2T", 2 << 40),
                                      ("1e9", 10**9), ("1.5K", 1536)])
def test_device_memory_limit_spellings_that_are_accepted(raw, want):
    """Bytes with K/M/G/T or KiB/MiB/GiB/TiB (any case, optional B, surrounding blanks, a
    decimal number before the unit, an exponent) and fractions in (0, 1]."""
    from celeritas import config
    got = config.from_env({"CELERITAS_DEVICE_MEMORY_LIMIT": raw}).device_memory_limit
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("raw", ["0", "0.0", "-1K", "1.5", "lots", "B", "nan", "inf", "0x100", "1e400", "2P",
                                 "50%", "2 GB extra"])
def test_device_memory_limit_spellings_that_are_config_errors(raw):
    """Anything else is a cl.ConfigError naming the variable and the value, raised when
    the runtime starts."""
    from celeritas import config
    with pytest.raises(cl.ConfigError, match="CELERITAS_DEVICE_MEMORY_LIMIT"):
        config.from_env({"CELERITAS_DEVICE_MEMORY_LIMIT": raw})
    with pytest.raises(cl.ConfigError, match="CELERITAS_DEVICE_MEMORY_LIMIT"):
        run_cluster(lambda r: cl.Queue(), nodes=1, devices=1, CELERITAS_DEVICE_MEMORY_LIMIT=raw)


@pytest.mark.parametrize("raw", ["0", "-5", "0.5", "lots", "1.5", "2P"])
def test_host_device_memory_that_is_no_positive_byte_count_is_a_config_error(raw):
    from celeritas import config
    with pytest.raises(cl.ConfigError, match="CELERITAS_HOST_DEVICE_MEMORY"):
        config.from_env({"CELERITAS_HOST_DEVICE_MEMORY": raw})


def test_the_smaller_of_both_limits_bounds_a_host_device():
    """CELERITAS_HOST_DEVICE_MEMORY=8192 with CELERITAS_DEVICE_MEMORY_LIMIT=0.5: the device
    holds 4 KiB (the stencil batches and evicts); with a byte limit above 8192 it holds
    8192.  A fraction without a host device size is a ConfigError."""
    half = _run1(_stencil_program(4, record=True), CELERITAS_HOST_DEVICE_MEMORY="8192",
                 CELERITAS_DEVICE_MEMORY_LIMIT="0.5")
    np.testing.assert_array_equal(half[0], _stencil_reference(4))
    assert max(check_records(half[3], 4096).values()) <= 4096 and half[1]["batches"] > 0
    big = _run1(_stencil_program(4, record=True), CELERITAS_HOST_DEVICE_MEMORY="8192",
                CELERITAS_DEVICE_MEMORY_LIMIT="1M")
    np.testing.assert_array_equal(big[0], _stencil_reference(4))
    assert 4096 < max(check_records(big[3], 8192).values()) <= 8192
    with pytest.raises(cl.ConfigError, match="CELERITAS_HOST_DEVICE_MEMORY"):
        _run1(_stencil_program(1), CELERITAS_DEVICE_MEMORY_LIMIT="0.5")


# ---- failures inside batches ----------------------------------------------------------------
def test_a_kernel_failing_in_its_third_batch_names_the_kernel_and_nothing_after_runs():
    """A kernel raising in one of its batches: cl.KernelError naming the kernel, at the
    fence; the task after it (which depends on it) never runs."""
    ran = []

    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(64 * 8, dtype=np.float64).reshape(64, 8), name="b")

        def bad(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)

            @cgh.parallel_for((64, 8), name="explodes")
            def kernel(chunk):
                if chunk.box.min[0] <= 40 < chunk.box.max[0]:
                    raise ValueError("row 40 is cursed")
                w[chunk] = w[chunk] + 1

        def after(cgh):
            r = b.access(cgh, cl.all(), cl.read)
            cgh.host_task(lambda part: ran.append(True), on=cl.on_master_node)
        q.submit(bad)
        q.submit(after)
        return q.fence(b).result()

    with pytest.raises(cl.KernelError, match=r'explodes.*|.*row 40 is cursed'):
        _run1(program, CELERITAS_HOST_DEVICE_MEMORY="1024")
    assert ran == []


# ---- OpenCL on PoCL -----------------------------------------------------------------------------
def _opencl_available() -> bool:
    try:
        import pyopencl  # noqa: F401
        from executor.backends.opencl import opencl_devices
        return bool(opencl_devices())
    except Exception:  # noqa: BLE001 - any failure: no usable OpenCL device here
        return False


_OPENCL = pytest.mark.skipif(not _opencl_available(), reason="no OpenCL device that builds kernels "
                             "(apt-get install pocl-opencl-icd)")

SMOOTH = cl.Kernel(source={"opencl": """
__kernel void smooth(CHUNK_PARAMS, ACCESSOR(double, src), ACCESSOR(double, dst), long n) {
    long i = GID(0);
    long lo = i > 0 ? i - 1 : 0, hi = i + 1 < n ? i + 1 : n - 1;
    AT1(dst, i) = (AT1(src, lo) + 2.0 * AT1(src, i) + AT1(src, hi)) / 4.0;
}"""}, name="smooth")


@pytest.fixture
def pocl(tmp_path_factory, monkeypatch):
    """Two PoCL pthread devices with their own kernel cache."""
    monkeypatch.setenv("POCL_DEVICES", "pthread pthread")
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "pocl"))
    import pyopencl
    n = len(pyopencl.get_platforms()[0].get_devices())
    return "opencl:0:0,0:1" if n >= 2 else "opencl:0:0,0:0"


@_OPENCL
@pytest.mark.parametrize("replay", ["on", "off"])
def test_opencl_source_kernel_stencil_in_batches(pocl, replay):
    """A 3-point smoothing source kernel on a 1024-element float64 line (8 KiB) with
    CELERITAS_DEVICE_MEMORY_LIMIT=3K on two PoCL devices: batches pass their allocation's
    offset to the kernel; 20 steps equal numpy, the device memory stays bounded."""
    n, steps = 1024, 20

    def program(rank):
        q = cl.Queue(record=True)
        a = cl.Buffer(np.sin(np.arange(n, dtype=np.float64)), name="a")
        b = cl.Buffer(shape=(n,), dtype=np.float64, name="b")
        for s in range(steps):
            src, dst = (a, b) if s % 2 == 0 else (b, a)

            def cgf(cgh, src=src, dst=dst):
                r = src.access(cgh, cl.neighborhood(1), cl.read)
                w = dst.access(cgh, cl.one_to_one(), cl.discard_write)
                cgh.parallel_for((n,), SMOOTH, args=(r, w, n))
            q.submit(cgf)
        got = q.fence(a).result()
        stats = dict(q.runtime.scheduler.igg.memory_stats)
        q.wait()
        return got, stats, q.graphs()["instructions"]

    want = np.sin(np.arange(n, dtype=np.float64))
    for _ in range(steps):
        p = np.pad(want, 1, mode="edge")
        want = (p[:-2] + 2 * p[1:-1] + p[2:]) / 4
    got, stats, instructions = _run1(program, devices=None, CELERITAS_DEVICES=pocl,
                                     CELERITAS_DEVICE_MEMORY_LIMIT="3K", CELERITAS_REPLAY=replay)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    assert stats["batches"] > 0 and stats["evictions"] > 0
    check_records(instructions, 3072)


@_OPENCL
def test_opencl_python_kernel_stencil_under_a_fraction_of_global_memory(pocl):
    """CELERITAS_DEVICE_MEMORY_LIMIT as a fraction of the PoCL device's global memory,
    chosen so that about 5 KiB remain: the 2-D stencil evicts and batches and equals
    numpy."""
    import pyopencl
    dev = pyopencl.get_platforms()[0].get_devices()[0]
    frac = 5461 / dev.global_mem_size
    steps = 8
    got, stats, _rp, instructions = _run1(_stencil_program(steps, record=True), devices=None,
                                          CELERITAS_DEVICES=pocl, CELERITAS_DEVICE_MEMORY_LIMIT=repr(frac))
    np.testing.assert_array_equal(got, _stencil_reference(steps))
    assert stats["batches"] > 0
    check_records(instructions, 5461)


# ---- more shapes of trouble --------------------------------------------------------------------
def test_out_of_memory_on_one_rank_only_ends_every_rank_with_it():
    """A custom mapper makes rank 0's chunk read a 2 KiB buffer whole while rank 1's reads
    one element, on 1 KiB devices; rank 1 then needs data rank 0 never produces.  The
    cl.OutOfMemoryError of rank 0 ends the cluster (naming the kernel), never a hang."""
    n = 256

    def lopsided(chunk, shape):
        return cl.Subrange((0,), (n,)) if chunk.offset[0] == 0 else cl.Subrange((0,), (1,))

    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(n, dtype=np.int64), name="big")
        out = cl.Buffer(shape=(2,), dtype=np.int64, name="out")

        def first(cgh):
            r = b.access(cgh, lopsided, cl.read)
            w = out.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((2,), lambda c: w.__setitem__(c, np.asarray(r[0:1]).sum()), name="lopsided")

        def second(cgh):
            r = out.access(cgh, cl.all(), cl.read)
            w = b.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((n,), lambda c: w.__setitem__(c, np.asarray(r[0:2]).sum()), name="after")
        q.submit(first)
        q.submit(second)
        return q.fence(b).result()

    with pytest.raises(cl.OutOfMemoryError, match='"lopsided".*"big"'):
        run_cluster(program, nodes=2, devices=1, timeout=120, CELERITAS_HOST_DEVICE_MEMORY="1024")


def test_batches_of_a_chunk_whose_other_accessor_maps_a_fixed_corner():
    """A kernel writing 64 elements one_to_one and reading elements 0..2 of another buffer
    through cl.fixed, on two 100-byte devices: each batch allocates the corner (16 B) and
    its slice of the output; equals numpy."""
    n = 64

    def program(rank):
        q = cl.Queue(record=True)
        src = cl.Buffer(np.arange(n, dtype=np.float64), name="src")
        out = cl.Buffer(shape=(n,), dtype=np.float64, name="out")

        def cgf(cgh):
            r = src.access(cgh, cl.fixed(cl.Subrange((0,), (2,))), cl.read)
            w = out.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((n,), lambda c: w.__setitem__(c, r[0] + r[1] + np.arange(c.box.min[0], c.box.max[0])),
                             name="corner")
        q.submit(cgf)
        got = q.fence(out).result()
        q.wait()
        return got, q.graphs()["instructions"]

    got, instructions = _run1(program, devices=2, CELERITAS_HOST_DEVICE_MEMORY="100")
    np.testing.assert_array_equal(got, 1 + np.arange(n, dtype=np.float64))
    assert len([i for i in instructions if i["kind"] == "device_kernel"]) > 2
    check_records(instructions, 100)


@pytest.mark.parametrize("dtype", [np.complex128, np.bool_, np.int8, np.float16])
def test_odd_item_sizes_with_a_capacity_that_is_no_multiple_of_them(dtype):
    """A (37, 5) buffer of 16-, 1- and 2-byte items read through a neighbourhood into
    another, on two devices of 7 rows plus 3 bytes: bit-identical copy, capacity holds."""
    shape = (37, 5)
    data = (np.arange(185) % 3).astype(dtype).reshape(shape)

    def program(rank):
        q = cl.Queue(record=True)
        b = cl.Buffer(data, name="b")
        c = cl.Buffer(shape=shape, dtype=dtype, name="c")

        def cgf(cgh):
            r = b.access(cgh, cl.neighborhood((1, 0)), cl.read)
            w = c.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for(shape, lambda ch: w.__setitem__(ch, r[ch]), name="cp")
        q.submit(cgf)
        got = q.fence(c).result()
        q.wait()
        return got, q.graphs()["instructions"]

    cap = 7 * 5 * np.dtype(dtype).itemsize + 3
    got, instructions = _run1(program, devices=2, CELERITAS_HOST_DEVICE_MEMORY=str(cap))
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, data)
    check_records(instructions, cap)


def test_kernels_without_buffers_and_host_tasks_run_on_a_one_byte_device():
    """A 1-byte device: a kernel with no accessors and a host task reading and writing a
    buffer need no device memory and run; a kernel with a plus reduction needs 8 bytes of
    scratch and is a cl.OutOfMemoryError, then 8 bytes are enough."""
    def program(rank):
        q = cl.Queue()
        hits = []
        q.submit(lambda cgh: cgh.parallel_for((8,), lambda c: hits.append(c.range[0]), name="noacc"))
        b = cl.Buffer(np.arange(100, dtype=np.int64), name="b")

        def host(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.host_task(lambda p: w.__setitem__(p.slices, w[p.slices] * 3), range=(100,))
        q.submit(host)
        got = q.fence(b).result()
        q.wait()
        return sum(hits), got

    def reduction(rank):
        q = cl.Queue()
        s = cl.Buffer(np.zeros(1, np.int64), name="s")

        def cgf(cgh):
            r = cl.reduction(s, cgh, cl.plus, initialize_to_identity=True)
            cgh.parallel_for((100,), lambda c, r: r.combine(np.arange(c.box.min[0], c.box.max[0])), name="red",
                             reductions=(r,))
        q.submit(cgf)
        return int(q.fence(s).result()[0])

    for devices in (1, 2):
        hits, got = _run1(program, devices=devices, CELERITAS_HOST_DEVICE_MEMORY="1")
        assert hits == 8
        np.testing.assert_array_equal(got, np.arange(100) * 3)
        with pytest.raises(cl.OutOfMemoryError, match='"red"'):
            _run1(reduction, devices=devices, CELERITAS_HOST_DEVICE_MEMORY="1")
        assert _run1(reduction, devices=devices, CELERITAS_HOST_DEVICE_MEMORY="8") == 4950


def test_lookahead_switched_mid_run_under_a_limit():
    """infinite for 10 steps, none for 10, auto for 10, on the evicting stencil: what is
    held is compiled at each switch; the grid equals numpy."""
    def program(rank):
        q = cl.Queue(record=True)
        a = cl.Buffer(np.arange(N * N, dtype=np.float64).reshape(N, N) % 7, name="a")
        b = cl.Buffer(shape=(N, N), dtype=np.float64, name="b")
        for s in range(30):
            if s % 10 == 0:
                q.set_lookahead(("infinite", "none", "auto")[s // 10])
            _stencil_step(q, a if s % 2 == 0 else b, b if s % 2 == 0 else a)
        got = q.fence(a).result()
        q.wait()
        return got, q.graphs()["instructions"]

    cap = 2 * N * N * F8 // 3
    got, instructions = _run1(program, devices=2, CELERITAS_HOST_DEVICE_MEMORY=str(cap))
    np.testing.assert_array_equal(got, _stencil_reference(30))
    check_records(instructions, cap)


def test_strided_fortran_order_input_round_trips_through_eviction():
    """A Fortran-ordered, strided (every other column) float64 view as buffer data, pushed
    through a device a quarter its size and back: the buffer holds the view's values."""
    base = np.asfortranarray(np.arange(64 * 32, dtype=np.float64).reshape(64, 32))
    view = base[:, ::2]

    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(view, name="strided")

        def cgf(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for(view.shape, lambda c: w.__setitem__(c, w[c] * 2), name="twice")
        q.submit(cgf)
        return q.fence(b).result()

    got = _run1(program, CELERITAS_HOST_DEVICE_MEMORY=str(view.size * F8 // 4))
    np.testing.assert_array_equal(got, view * 2)


def test_device_memory_limit_alone_bounds_the_plan_of_an_unbounded_host_device():
    """CELERITAS_DEVICE_MEMORY_LIMIT=3K on host:2 without CELERITAS_HOST_DEVICE_MEMORY: the
    generator plans within 3 KiB per device (batches, evictions) although the backend
    would allow more; equals numpy."""
    got, stats, _rp, instructions = _run1(_stencil_program(6, record=True), devices=2,
                                          CELERITAS_DEVICE_MEMORY_LIMIT="3K")
    np.testing.assert_array_equal(got, _stencil_reference(6))
    assert stats["batches"] > 0 and stats["evictions"] > 0
    assert max(check_records(instructions, 3072).values()) <= 3072
