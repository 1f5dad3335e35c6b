"""Buffers larger than device memory: eviction and batched chunks.

Graph level: the generator never plans more than a device's capacity, and every
allocation on a bounded memory follows the frees that made its room, so no
execution order can exceed it.  End to end on host devices with a small capacity:
results equal numpy on 1 and 2 ranks.
"""
from __future__ import annotations

import os
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import celeritas as cl
from celeritas import range_mappers as rm
from celeritas.testing import run_cluster
from scheduler import task_graph as tg
from scheduler.geometry import Box, Subrange
from scheduler.errors import ConfigError, OutOfMemoryError

from graph_context import GraphContext
from ig_validator import validate

pytestmark = pytest.mark.timeout(300)

R, W, RW, DW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE


# ---- graph-level properties ---------------------------------------------------------------
def check_capacity(ctx: GraphContext, capacity: int, rank: int = 0) -> dict:
    """Program-order usage of every device memory stays within ``capacity``, and each
    allocation there (transitively) depends on every free of that memory emitted before it."""
    ins = ctx.instructions[rank]
    by_id = {i.id: i for i in ins}
    preds = ctx.closure(rank)
    used: Counter = Counter()
    peak: Counter = Counter()
    sizes = {}
    frees: dict[int, list[int]] = {}
    for i in ins:
        if i.kind == "alloc" and i.memory >= 2:
            missing = [f for f in frees.get(i.memory, []) if f not in preds[i.id]]
            assert not missing, f"I{i.id} may run before the frees {missing} that made its room"
            used[i.memory] += i.size_bytes
            sizes[i.allocation] = i.size_bytes
            peak[i.memory] = max(peak[i.memory], used[i.memory])
            assert used[i.memory] <= capacity, (i, used[i.memory], capacity)
        elif i.kind == "free" and i.allocation in sizes:
            used[i.memory] -= sizes.pop(i.allocation)
            frees.setdefault(i.memory, []).append(i.id)
    assert by_id
    return dict(peak)


def check_kernels_in_their_allocations(ctx: GraphContext, b, kernel: str, capacity: int) -> dict:
    """Every accessor of every chunk of ``kernel`` on buffer ``b`` lies inside the allocation
    it names, the device capacity holds, and the graph validates; returns ``b``'s
    allocations by id."""
    allocs = {a.allocation: a for a in ctx.instrs(0, "alloc") if a.buffer == b}
    kernels = ctx.instrs(0, "device_kernel", name=kernel)
    assert kernels
    for k in kernels:
        for acc in k.accesses:
            assert allocs[acc.allocation].box.contains(acc.box)
    check_capacity(ctx, capacity)
    validate(ctx)
    return allocs


def _stencil(ctx, n, steps):
    up, u = ctx.buffer((n, n), host_init=True), ctx.buffer((n, n), host_init=True)
    for _ in range(steps):
        ctx.task((n, n), [(up, rm.one_to_one(), RW), (u, rm.neighborhood(1, 1, shape="along_axes"), R)])
        up, u = u, up
    ctx.fence(u)


@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("lookahead", ["none", "auto", "infinite"])
def test_stencil_three_times_device_memory_stays_within_capacity(devices, lookahead):
    n = 64
    cap = 2 * n * n * 4 // 3          # the two buffers are three times one device's memory
    ctx = GraphContext(1, devices=devices, capacity=cap, lookahead=lookahead)
    _stencil(ctx, n, 4)
    ctx.finish()
    peak = check_capacity(ctx, cap)
    assert max(peak.values()) > cap // 2          # (the memory is really used)
    kernels = ctx.instrs(0, "device_kernel")
    assert all(k.batch is not None for k in kernels) and len(kernels) > 4 * devices
    batches = Counter((k.task, k.device) for k in kernels)
    for (task, device), count in batches.items():
        assert sorted(k.batch for k in kernels if k.task == task and k.device == device) == \
            [(i, count) for i in range(count)]
    evicting = [c for c in ctx.instrs(0, "copy") if c.evicts]
    assert evicting and all(c.source_memory >= 2 and c.dest_memory == 1 for c in evicting)
    stats = ctx.iggs[0].memory_stats
    assert stats["evictions"] > 0 and stats["bytes_written_back"] > 0 and stats["batches"] == len(kernels)
    validate(ctx)


def test_in_core_programs_do_not_batch_or_evict():
    n = 32
    ctx = GraphContext(1, devices=2, capacity=10 * n * n * 4, lookahead="auto")
    _stencil(ctx, n, 4)
    ctx.finish()
    assert all(k.batch is None for k in ctx.instrs(0, "device_kernel"))
    assert not any(c.evicts for c in ctx.instrs(0, "copy"))
    # the same graph as without a capacity, but for the allocations' order dependencies
    free = GraphContext(1, devices=2, lookahead="auto")
    _stencil(free, n, 4)
    free.finish()
    assert [i.kind for i in ctx.instructions[0]] == [i.kind for i in free.instructions[0]]


def test_batch_records_and_evict_labels_are_in_graph_records():
    n = 48
    cap = 2 * n * n * 4 // 3
    ctx = GraphContext(1, devices=1, capacity=cap)
    _stencil(ctx, n, 2)
    ctx.finish()
    recs = ctx.iggs[0].recorder.instructions
    assert any("batch" in r for r in recs if r["kind"] == "device_kernel")
    assert any(r.get("evict") for r in recs if r["kind"] == "copy")


def test_whole_buffer_reads_plan_batches_without_searching(monkeypatch):
    """A matmul-shaped chunk (rows of A and C, B whole) whose B fills more than half the
    device: no split meets the half-memory budget, so the planner goes to the full budget
    at once instead of evaluating ever finer splits (it used to evaluate thousands)."""
    from scheduler.device_chunks import ChunkPlanning
    calls = Counter()
    fill = ChunkPlanning._fill_plan

    def counting(self, plan, task):
        calls["plans"] += 1
        return fill(self, plan, task)
    monkeypatch.setattr(ChunkPlanning, "_fill_plan", counting)
    n = 256
    cap = 3 * n * n * 4 // 2                      # A, B, C are twice the device memory
    ctx = GraphContext(1, devices=1, capacity=cap)
    a, b = ctx.buffer((n, n), host_init=True), ctx.buffer((n, n), host_init=True)
    c = ctx.buffer((n, n))
    ctx.task((n, n), [(a, rm.slice(1), R), (b, rm.slice(0), R), (c, rm.one_to_one(), DW)], name="mm")
    ctx.finish()
    kernels = [i for i in ctx.instructions[0] if i.kind == "device_kernel"]
    assert len(kernels) == 4                        # B plus a quarter of A and C fit
    assert calls["plans"] < 20, calls
    check_capacity(ctx, cap)


def test_a_chunk_no_batch_can_fit_is_an_error_naming_everything():
    ctx = GraphContext(1, devices=1, capacity=1000)
    big = ctx.buffer((1024,), host_init=True, name="big")
    out = ctx.buffer((8,), name="out")
    with pytest.raises(OutOfMemoryError) as ei:
        ctx.task((8,), [(big, rm.all(), R), (out, rm.one_to_one(), DW)], name="sum_all")
    msg = str(ei.value)
    assert '"sum_all"' in msg and '"big"' in msg and '"out"' in msg and "1000 bytes" in msg
    assert str(1024 * 4 + 4) in msg


def _random_capacity_program(seed: int):
    rng = random.Random(seed)

    def prog(ctx):
        n = 32
        bufs = [ctx.buffer((n, n), host_init=True) for _ in range(3)]
        red = ctx.buffer((1,))
        for _ in range(rng.randint(3, 10)):
            w = rng.randrange(3)
            accs = [(bufs[w], rm.one_to_one(), rng.choice([RW, DW, W]))]
            r = rng.randrange(3)
            if r != w:
                accs.append((bufs[r], rng.choice([rm.one_to_one(), rm.neighborhood(1, 1),
                                                  rm.neighborhood(2, 0, shape="along_axes"), rm.slice(1)]), R))
            reds = [ctx.reduction(red)] if rng.random() < 0.2 else []
            kind = tg.HOST_COMPUTE if rng.random() < 0.15 else tg.DEVICE_COMPUTE
            ctx.task((n, n), accs, kind=kind, reductions=reds if kind == tg.DEVICE_COMPUTE else [],
                     oversubscribe=rng.choice([1, 2]))
            if rng.random() < 0.2:
                ctx.fence(bufs[rng.randrange(3)])
        ctx.fence(bufs[0])
    return prog


@settings(max_examples=int(os.environ.get("CELERITAS_OUT_OF_CORE_EXAMPLES", "30")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), devices=st.integers(1, 3), ranks=st.integers(1, 2),
       lookahead=st.sampled_from(["none", "auto"]), fraction=st.sampled_from([0.5, 1.0, 2.0]))
def test_random_programs_never_exceed_capacity(seed, devices, ranks, lookahead, fraction):
    """Capacities from half to twice one buffer (32 x 32 float32): evictions, batches and
    in-core stretches mixed; usage stays within bounds and the graph stays valid."""
    cap = int(fraction * 32 * 32 * 4)
    ctx = GraphContext(ranks, devices=devices, capacity=cap, lookahead=lookahead)
    _random_capacity_program(seed)(ctx)
    ctx.finish()
    for r in range(ranks):
        check_capacity(ctx, cap, r)
        validate(ctx, r)


# ---- end to end on host devices -------------------------------------------------------------
def _wave(rank):
    from apps import wave_sim
    return wave_sim.run(cl.Queue(), 64, 6)


@pytest.mark.parametrize("nodes,devices", [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_double_buffered_stencil_on_buffers_three_times_device_memory(nodes, devices):
    from apps import wave_sim
    cap = 2 * 64 * 64 * 4 // 3
    for la in ("none", "auto"):
        for got in run_cluster(_wave, nodes=nodes, devices=devices, CELERITAS_HOST_DEVICE_MEMORY=str(cap),
                               CELERITAS_LOOKAHEAD=la):
            np.testing.assert_allclose(got, wave_sim.reference(64, 6), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nodes,devices", [(1, 1), (1, 2), (2, 1)])
def test_matmul_twice_device_memory_equals_numpy(nodes, devices):
    from apps import matmul
    n = 64
    cap = 3 * n * n * 4 // 2          # A, B and C together are twice one device's memory
    a, b = matmul.inputs(n)
    for got in run_cluster(lambda r: matmul.run(cl.Queue(), n, repeat=2), nodes=nodes, devices=devices,
                           CELERITAS_HOST_DEVICE_MEMORY=str(cap)):
        np.testing.assert_array_equal(got, a @ b)


@pytest.mark.parametrize("nodes", [1, 2])
def test_reductions_and_host_tasks_under_memory_pressure(nodes):
    n = 64

    def program(rank):
        q = cl.Queue()
        x = cl.Buffer(np.arange(n * n, dtype=np.int64).reshape(n, n), name="x")
        y = cl.Buffer(shape=(n, n), dtype=np.int64, name="y")
        s = cl.Buffer(np.zeros(1, np.int64), name="s")
        seen = cl.HostObject([])

        def double(cgh):
            rx = x.access(cgh, cl.one_to_one(), cl.read)
            wy = y.access(cgh, cl.one_to_one(), cl.discard_write)
            red = cl.reduction(s, cgh, cl.plus, initialize_to_identity=True)

            @cgh.parallel_for((n, n), reductions=(red,))
            def kernel(chunk, r):
                wy[chunk] = rx[chunk] * 2
                r.combine(rx[chunk])

        def host(cgh):
            ry = y.access(cgh, cl.one_to_one(), cl.read_write)
            log = cl.side_effect(seen, cgh)

            def task(part):
                ry[part.slices] = ry[part.slices] + 1
                log.append(int(np.asarray(ry[part.slices]).sum()))
            cgh.host_task(task, range=(n, n))

        q.submit(double)
        q.submit(host)
        q.submit(double)
        return q.fence(y).result(), int(q.fence(s).result()[0]), sum(q.fence(seen).result())

    cap = n * n * 8 // 2               # x and y: four times one device's memory
    results = run_cluster(program, nodes=nodes, devices=2, CELERITAS_HOST_DEVICE_MEMORY=str(cap))
    x = np.arange(n * n, dtype=np.int64).reshape(n, n)
    host_sum = int((2 * x + 1).sum())
    observed = sum(r[2] for r in results)
    assert observed == host_sum
    for y, s, _ in results:
        np.testing.assert_array_equal(y, 2 * x)
        assert s == int(x.sum())


# ---- configuration --------------------------------------------------------------------------
def test_device_memory_limit_values():
    from celeritas import config
    assert config.from_env({"CELERITAS_DEVICE_MEMORY_LIMIT": "4096"}).device_memory_limit == 4096
    assert config.from_env({"CELERITAS_DEVICE_MEMORY_LIMIT": "2M"}).device_memory_limit == 2 << 20
    assert config.from_env({"CELERITAS_DEVICE_MEMORY_LIMIT": "1G"}).device_memory_limit == 1 << 30
    assert config.from_env({"CELERITAS_DEVICE_MEMORY_LIMIT": "0.8"}).device_memory_limit == 0.8
    for bad in ("0", "1.5", "lots", "-3"):
        with pytest.raises(ConfigError, match="CELERITAS_DEVICE_MEMORY_LIMIT"):
            config.from_env({"CELERITAS_DEVICE_MEMORY_LIMIT": bad})


def test_device_memory_limit_caps_the_backends_capacity():
    from celeritas.runtime import memory_capacities
    from executor.backends.host import HostBackend
    assert memory_capacities(HostBackend(2, memory_capacity=1000), None) == {2: 1000, 3: 1000}
    assert memory_capacities(HostBackend(2, memory_capacity=1000), 0.5) == {2: 500, 3: 500}
    assert memory_capacities(HostBackend(2, memory_capacity=1000), 600) == {2: 600, 3: 600}
    assert memory_capacities(HostBackend(2), 600) == {2: 600, 3: 600}
    assert memory_capacities(HostBackend(2), None) == {}
    with pytest.raises(ConfigError, match="CELERITAS_HOST_DEVICE_MEMORY"):
        memory_capacities(HostBackend(2), 0.5)


def test_device_memory_limit_end_to_end():
    from apps import wave_sim
    got = run_cluster(_wave, nodes=1, devices=1, CELERITAS_DEVICE_MEMORY_LIMIT=str(2 * 64 * 64 * 4 // 3))
    np.testing.assert_allclose(got[0], wave_sim.reference(64, 6), rtol=1e-5, atol=1e-6)


def test_dot_labels_name_evicting_copies_and_batches():
    from celeritas.graphs import GraphRecord
    n = 48
    ctx = GraphContext(1, devices=1, capacity=2 * n * n * 4 // 3)
    _stencil(ctx, n, 2)
    ctx.finish()
    rec = GraphRecord(tasks=ctx.tm.recorder.tasks, commands={0: ctx.cdags[0].recorder.commands},
                      instructions=ctx.iggs[0].recorder.instructions, pilots=ctx.iggs[0].recorder.pilots)
    dot = rec.to_dot_instructions()
    assert "evicting copy" in dot and "batch 1 of " in dot


def test_receives_under_a_capacity_never_wait_for_room():
    """A kernel reading a whole buffer of which another rank produced a part, with transfers
    allowed straight into device memory.  A new device allocation under a capacity waits for
    the frees that made its room, which wait for sends, which wait for the peer's receive: a
    receive behind such an allocation could deadlock the ranks, so it lands in host memory
    (and a part-sized receive allocation grown afterwards needed both at once: 32 + 72 bytes
    on a device of 76, an OutOfMemoryError for a buffer that fits)."""
    ctx = GraphContext(2, devices=1, capacity=76, comm_memories=frozenset((1, 2)))
    b0 = ctx.buffer((9,), np.int64)
    b1 = ctx.buffer((1, 1, 2), np.uint8)
    ctx.task((9,), [(b0, rm.one_to_one(), tg.DISCARD_WRITE)], kind=tg.HOST_COMPUTE)
    ctx.task((1, 1, 2), [(b0, rm.all(), tg.READ), (b1, rm.one_to_one(), tg.DISCARD_WRITE)])
    ctx.finish()
    check_capacity(ctx, 76, 0)   # (rank 0 runs the whole kernel: its range splits into one chunk)
    ins = ctx.instructions[0]
    recv = [i for i in ins if i.kind == "receive"]
    allocs = {i.allocation: i for i in ins if i.kind == "alloc"}
    assert len(recv) == 1 and recv[0].region == cl.Region([Box((5,), (9,))])
    assert allocs[recv[0].dest].memory == 1
    # one device allocation of b0 (the whole buffer, filled by copies): nothing was grown
    dev = [a for a in allocs.values() if a.buffer == b0 and a.memory == 2]
    assert len(dev) == 1 and dev[0].box == Box((0,), (9,))


def test_an_unbounded_device_receives_into_the_allocation_the_kernel_uses():
    ctx = GraphContext(2, devices=1, comm_memories=frozenset((1, 2)))
    b0 = ctx.buffer((9,), np.int64)
    b1 = ctx.buffer((1, 1, 2), np.uint8)
    ctx.task((9,), [(b0, rm.one_to_one(), tg.DISCARD_WRITE)], kind=tg.HOST_COMPUTE)
    ctx.task((1, 1, 2), [(b0, rm.all(), tg.READ), (b1, rm.one_to_one(), tg.DISCARD_WRITE)])
    ctx.finish()
    ins = ctx.instructions[0]
    recv = [i for i in ins if i.kind == "receive"]
    allocs = {i.allocation: i for i in ins if i.kind == "alloc"}
    assert len(recv) == 1
    dest = allocs[recv[0].dest]
    assert dest.memory == 2 and dest.box == Box((0,), (9,))   # the kernel's whole box, not [5, 9)
    assert sum(1 for a in allocs.values() if a.buffer == b0 and a.memory == 2) == 1


def test_trace_names_evicting_copies_and_batches(tmp_path):
    """The execution trace names out-of-core work as the graph dumps do."""
    import json
    from apps import wave_sim
    path = tmp_path / "trace.json"
    got = run_cluster(_wave, nodes=1, devices=1, CELERITAS_HOST_DEVICE_MEMORY=str(2 * 64 * 64 * 4 // 3),
                      CELERITAS_TRACE=str(path))
    np.testing.assert_allclose(got[0], wave_sim.reference(64, 6), rtol=1e-5, atol=1e-6)
    names = [e["name"] for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert any(n.startswith("evicting copy") for n in names)
    batches = [n for n in names if "(batch " in n]
    assert batches and all(" of " in n for n in batches)


@pytest.mark.parametrize("rows,capacity", [(3, 36), (5, 36), (5, 40)])
def test_batches_reach_one_row_each_when_only_that_fits(monkeypatch, rows, capacity):
    """One row of an (rows, 8) int32 buffer is 32 bytes; with a capacity under 64 only one
    row per batch fits.  The search grew the number of batches from 2 straight to the
    worst part's suggestion (4 for 3 rows, 6 for 5), past the rows, and raised
    OutOfMemoryError without trying one row per batch.  Found by the fuzzer."""
    monkeypatch.setenv("CELERITAS_HOST_DEVICE_MEMORY", str(capacity))
    q = cl.Queue(devices="host:1", record=True)
    try:
        b = cl.Buffer(np.arange(rows * 8, dtype=np.int32).reshape(rows, 8), name="b")

        def cgf(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)

            @cgh.parallel_for((rows, 8), name="inc")
            def kernel(chunk):
                w[chunk] = w[chunk] + 1
        q.submit(cgf)
        got = q.fence(b).result()
        kernels = [i for i in q.graphs()["instructions"] if i["kind"] == "device_kernel"]
    finally:
        q.shutdown()
    assert got.tolist() == (np.arange(rows * 8).reshape(rows, 8) + 1).tolist()
    assert len(kernels) == rows      # (one batch per row)


def _reused_allocation_program(capacity: int, oversubscribe: int, monkeypatch):
    """T1 reads all of ``b0`` and leaves it allocated whole (256 B); T2 reads only a
    third of it per device chunk, but all of ``b1`` (128 B), and keeps a reduction's
    scratch per chunk.  Found by the fuzzer (seed 406963), where T1 read ``b0`` through
    ``cl.even_split(3)``, which granted each of its three chunks its own rows while
    even_split gave every item a proportional share; under Celerity's split (the leftover
    granules to the first items) that mapper grants them other rows, so T1 reads through
    ``one_to_one``, the same regions as before."""
    monkeypatch.setenv("CELERITAS_HOST_DEVICE_MEMORY", str(capacity))
    q = cl.Queue(devices="host:1", record=True)
    try:
        b0 = cl.Buffer(np.arange(32, dtype=np.int64).reshape(8, 4), name="b0")
        b1 = cl.Buffer(shape=(8, 4), dtype=np.float32, name="b1")
        r0 = cl.Buffer(np.ones((), dtype=bool), name="r0")
        r1 = cl.Buffer(np.ones(1, dtype=bool), name="r1")

        def first(cgh):
            src = b0.access(cgh, cl.one_to_one(), cl.read)
            dst = b1.access(cgh, cl.one_to_one(), cl.discard_write)
            cl.hint(cgh, cl.oversubscribe(oversubscribe))

            @cgh.parallel_for((8, 4), name="first")
            def kernel(chunk):
                lo, hi = chunk.offset[0], chunk.offset[0] + chunk.range[0]
                dst[chunk] = np.asarray(src[lo:hi, 0:4], dtype=np.float32) + 1

        def second(cgh):
            whole = b1.access(cgh, cl.slice(0), cl.read)
            part = b0.access(cgh, cl.even_split(), cl.read)
            red0 = cl.reduction(r0, cgh, cl.logical_and)
            red1 = cl.reduction(r1, cgh, cl.logical_and)
            cl.hint(cgh, cl.oversubscribe(oversubscribe))

            @cgh.parallel_for((8, 5), name="second", reductions=(red0, red1))
            def kernel(chunk, a, b):
                a.combine(bool(np.asarray(whole[0:8, 0:4]).all()))
                b.combine(True)

        q.submit(first)
        q.submit(second)
        got = (q.fence(b1).result(), bool(q.fence(r0).result()), bool(q.fence(r1).result()[0]))
        instructions = q.graphs()["instructions"]
    finally:
        q.shutdown()
    return got, instructions


def _peak_device_bytes(instructions) -> int:
    """The most bytes live on device memory M2 in the instructions' program order."""
    used = peak = 0
    sizes = {}
    for i in instructions:
        if i["kind"] == "alloc" and i["memory"] == 2:
            sizes[i["allocation"]] = i["size_bytes"]
            used += i["size_bytes"]
            peak = max(peak, used)
        elif i["kind"] == "free" and i["allocation"] in sizes:
            used -= sizes.pop(i["allocation"])
    return peak


@pytest.mark.parametrize("capacity", [180, 228, 388, 390])
def test_a_larger_allocation_an_earlier_task_left_is_cut_back_for_the_batches(monkeypatch, capacity):
    """T2's three chunks on one device need 384 B of buffers together plus 6 B of scratch,
    so under 390 B they run as batches.  Each batch fits with its own scratch, but not
    beside b0's whole allocation and the scratch of the batches before it: that allocation
    is evicted and only what the batch reads is allocated, instead of OutOfMemoryError
    (388 B: "388 are held by allocations this task itself uses").  At 180 B the chunks
    are cut further, and the scratch of every earlier batch counts against each one."""
    (b1, r0, r1), instructions = _reused_allocation_program(capacity, 3, monkeypatch)
    np.testing.assert_array_equal(b1, np.arange(32).reshape(8, 4).astype(np.float32) + 1)
    assert r0 is True and r1 is True
    second = [i for i in instructions if i["kind"] == "device_kernel" and i["name"] == "second"]
    assert all(bool(k.get("batch")) == (capacity < 390) for k in second)
    assert len(second) == (8 if capacity == 180 else 3)
    assert _peak_device_bytes(instructions) <= capacity


def test_a_chunk_whose_batches_scratch_cannot_fit_names_the_bytes_it_needs(monkeypatch):
    """At 162 B one row of b0 and all of b1 fit (160 B), but one row per batch means three
    batches of the first chunk, each keeping 2 B of reduction scratch: the error gives the
    least any split needs (166 B), not the 162 B of one row with its own scratch."""
    with pytest.raises(OutOfMemoryError, match=r"needs at least 166 bytes .* capacity is 162 bytes"):
        _reused_allocation_program(162, 3, monkeypatch)


@pytest.mark.parametrize("cap", range(72, 420, 8))
def test_anticipated_growth_never_evicts_the_commands_own_allocation(cap):
    """A reader of two boxes of a buffer that do not touch ([0:4, 0:2] and [3:4, 4:5]) allocates
    each, and lookahead anticipates the next task's row [3:4, 0:6], which touches the second and
    reaches into the first.  Under a capacity where growing the first over the row does not fit
    but growing the second does, the grown second allocation used to evict the first, which the
    reader uses (its kernel then had no allocation): now a growth never covers an allocation the
    command holds without merging it."""
    ctx = GraphContext(1, devices=1, capacity=cap, lookahead="auto")
    b = ctx.buffer((4, 6), np.int64, host_init=True)
    ctx.task((1,), [(b, rm.fixed(Subrange((0, 0), (4, 2))), R), (b, rm.fixed(Subrange((3, 4), (1, 1))), R)],
             name="reader")
    ctx.task((1,), [(b, rm.fixed(Subrange((3, 0), (1, 6))), DW)], name="row")
    ctx.finish()
    (_k,) = ctx.instrs(0, "device_kernel", name="reader")
    check_kernels_in_their_allocations(ctx, b, "reader", cap)


@pytest.mark.parametrize("nodes,devices", [(1, 1), (1, 2), (2, 2)])
def test_disconnected_accessors_fit_where_their_bounding_box_does_not(nodes, devices):
    """Two 2-element reads at both ends of an 8 KiB buffer on 1 KiB devices: each gets its own
    allocation, so the kernel fits (the bounding box of both, 8 KiB, was an OutOfMemoryError:
    one row of the chunk could not be split any further)."""
    n = 1024

    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(n, dtype=np.int64), name="b")
        out = cl.Buffer(shape=(4,), dtype=np.int64, name="out")

        def cgf(cgh):
            lo = b.access(cgh, cl.fixed(cl.Subrange((0,), (2,))), cl.read)
            hi = b.access(cgh, cl.fixed(cl.Subrange((n - 2,), (2,))), cl.read)
            w = out.access(cgh, cl.one_to_one(), cl.discard_write)

            def k(chunk):
                w[chunk] = lo[0] + lo[1] + hi[n - 2] + hi[n - 1] + np.arange(chunk.box.min[0], chunk.box.max[0])
            cgh.parallel_for((4,), k)
        q.submit(cgf)
        return q.fence(out).result().tolist()

    want = [0 + 1 + (n - 2) + (n - 1) + i for i in range(4)]
    assert run_cluster(program, nodes=nodes, devices=devices, CELERITAS_HOST_DEVICE_MEMORY="1024") == [want] * nodes


def test_a_missing_group_is_allocated_before_the_allocation_another_group_was_found_in():
    """A chunk reads two boxes of a buffer that do not touch: [0:3, 0:1], which an earlier
    task's [0:6, 0:8] allocation holds, and [5:9, 4:7], which meets that allocation. Found
    first, the held allocation was pinned, and the second box's allocation had to grow over
    it: [0:9, 0:8], 576 B on a 620 B device with 384 B held, an OutOfMemoryError. The missing
    box is now allocated first: growing over the old allocation does not fit, so it is
    evicted and each box gets its own allocation (fuzzer seed 2609)."""
    ctx = GraphContext(1, devices=1, capacity=620)
    b = ctx.buffer((9, 8), np.int64, host_init=True)
    ctx.task((6, 8), [(b, rm.one_to_one(), R)], name="first")
    ctx.task((3, 1), [(b, rm.fixed(Subrange((5, 4), (4, 3))), R), (b, rm.one_to_one(), R)], oversubscribe=3,
             name="second")
    ctx.finish()
    allocs = check_kernels_in_their_allocations(ctx, b, "second", 620)
    assert sorted((a.box.min, a.box.max) for a in allocs.values()) == \
        [((0, 0), (3, 1)), ((0, 0), (6, 8)), ((5, 4), (9, 7))]


@pytest.mark.parametrize("cap", range(600, 768, 8))
def test_a_growth_that_would_force_a_later_box_to_merge_counts_that_box(cap):
    """A chunk needs [0:6, 4:8] and [6:9, 0:2] of a buffer (they do not touch) where an earlier
    task left [5:7, 0:8]. Growing the first box over that allocation ([0:7, 0:8]) reaches into
    the second box, whose allocation then had to merge it, pinned by then, whether or not that
    fit: 576 B, an OutOfMemoryError under 624-752 B. The growth now counts the second box: where
    all of it does not fit, the old allocation is evicted instead (fuzzer seed 2604492)."""
    ctx = GraphContext(1, devices=1, capacity=cap)
    b = ctx.buffer((9, 8), np.int64, host_init=True)
    ctx.task((1,), [(b, rm.fixed(Subrange((5, 0), (2, 8))), R)], name="first")
    ctx.task((1,), [(b, rm.fixed(Subrange((0, 4), (6, 4))), R), (b, rm.fixed(Subrange((6, 0), (3, 2))), R)],
             name="second")
    ctx.finish()
    (_k,) = ctx.instrs(0, "device_kernel", name="second")
    check_kernels_in_their_allocations(ctx, b, "second", cap)


@pytest.mark.parametrize("cap", range(680, 880, 16))
def test_a_growth_that_reaches_the_commands_own_allocation_counts_it(cap):
    """A chunk needs [0:2, 0:4, 2:3] and [2:3, 1:5, 0:2] of a buffer (they meet only along an
    edge: two allocations) where an earlier task left [0:4, 4:5, 0:4]. The first box is
    allocated on its own and pinned; growing the second over the old allocation ([0:4, 1:5,
    0:4]) reaches into the first's allocation, which then had to be merged as well whether or
    not that fit: the whole buffer, an OutOfMemoryError under 704-816 B (fuzzer seed 2908375).
    The growth now counts the command's own allocations it reaches: where that does not fit,
    the old allocation is evicted instead."""
    ctx = GraphContext(1, devices=1, capacity=cap)
    b = ctx.buffer((4, 5, 4), np.int64, host_init=True)
    ctx.task((1,), [(b, rm.fixed(Subrange((0, 4, 0), (4, 1, 4))), R)], name="first")
    ctx.task((1,), [(b, rm.fixed(Subrange((0, 0, 2), (2, 4, 1))), R),
                    (b, rm.fixed(Subrange((2, 1, 0), (1, 4, 2))), R)], name="second")
    ctx.finish()
    (_k,) = ctx.instrs(0, "device_kernel", name="second")
    check_kernels_in_their_allocations(ctx, b, "second", cap)
