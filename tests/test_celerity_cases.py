"""Cases restated from the C++ Celerity runtime's own test suite (task, command and
instruction graph tests, split tests, runtime tests) that an earlier version got wrong.

Each test pins one behaviour: the graph shape where the defect was a shape, the values
where it gave a wrong answer.
"""
import numpy as np
import pytest

import celeritas as cl
from celeritas import range_mappers as rm
from celeritas.testing import run_cluster
from scheduler import command_graph as cg
from scheduler import task_graph as tg
from scheduler.errors import CeleritasError, DiagnosticError
from scheduler.geometry import Box, Subrange

from graph_context import GraphContext
from ig_validator import validate

pytestmark = pytest.mark.timeout(120)

R, W, RW, DW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE


# ---- reductions that fold in a current value held by another rank ---------------------------
def _second_chunk_owns_element(chunk, shape):
    """A custom mapper: the one element belongs to the chunk that holds index 1."""
    holds = chunk.offset[0] <= 1 < chunk.offset[0] + chunk.range[0]
    return cl.Subrange((0,), (1 if holds else 0,))


def _current_value_on_another_rank(rank):
    q = cl.Queue()
    b = cl.Buffer(shape=(1,), dtype=np.int64, name="acc")

    def write(cgh):
        w = b.access(cgh, _second_chunk_owns_element, cl.discard_write)

        @cgh.parallel_for((2,))
        def kernel(chunk):
            if chunk.box.contains((1,)):
                w[0] = 5

    def reduce(cgh):
        red = cl.reduction(b, cgh, cl.plus, initialize_to_identity=False)

        @cgh.parallel_for((1,), reductions=(red,))
        def kernel(chunk, r):
            r.combine(np.ones(chunk.range[0], dtype=np.int64))

    q.submit(write)
    q.submit(reduce)
    return int(q.fence(b).result()[0])


@pytest.mark.parametrize("nodes,devices", [(1, 1), (2, 1), (2, 2), (3, 1)])
def test_reduction_includes_a_current_value_written_on_another_rank(nodes, devices):
    assert run_cluster(_current_value_on_another_rank, nodes=nodes, devices=devices) == [6] * nodes


# ---- reductions into a target of another dtype --------------------------------------------
def _cross_dtype(values_dtype, target_dtype, op=cl.plus, n=1000, value=0.5):
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.zeros(1, dtype=target_dtype), name="target")

        def cgf(cgh):
            red = cl.reduction(b, cgh, op, initialize_to_identity=True)

            @cgh.parallel_for((n,), reductions=(red,))
            def kernel(chunk, r):
                r.combine(np.full(chunk.range[0], value, dtype=values_dtype))

        q.submit(cgf)
        return q.fence(b).result()[0]

    return program


@pytest.mark.parametrize("nodes,devices", [(1, 1), (1, 2), (1, 4), (2, 2)])
def test_float_values_into_an_int_target_are_an_error_naming_buffer_and_dtypes(nodes, devices):
    with pytest.raises(CeleritasError) as info:
        run_cluster(_cross_dtype(np.float32, np.int32), nodes=nodes, devices=devices)
    msg = str(info.value)
    assert "target" in msg and "int32" in msg and "float32" in msg and "same_kind" in msg


def test_uint8_maximum_of_float_values_is_an_error():
    with pytest.raises(CeleritasError, match="uint8.*float64|float64.*uint8"):
        run_cluster(_cross_dtype(np.float64, np.uint8, op=cl.maximum, value=299.7), nodes=1, devices=1)


@pytest.mark.parametrize("nodes,devices", [(1, 1), (1, 3), (2, 2), (4, 1)])
@pytest.mark.parametrize("op,value", [(cl.multiplies, 3), (cl.plus, 2**30 + 7)])
def test_int32_partials_combine_with_wrap_around_in_any_split(nodes, devices, op, value):
    """Partial results gathered from chunks, devices and ranks are combined in the target's
    dtype: numpy reduces int32 in an int64 accumulator, whose result did not fit back into
    the buffer (an internal OverflowError on 2+ chunks)."""
    got = run_cluster(_cross_dtype(np.int32, np.int32, op=op, value=value, n=64), nodes=nodes, devices=devices)
    want = op.reduce(np.full(64, value, dtype=np.int32), dtype=np.int32)
    assert [int(x) for x in got] == [int(want)] * nodes


@pytest.mark.parametrize("nodes,devices", [(1, 1), (1, 2), (1, 4), (2, 2), (4, 1)])
def test_allowed_cross_dtype_reductions_do_not_depend_on_the_split(nodes, devices):
    # int64 values into int32 wrap element-wise (same_kind), so the total is the same
    # however the range is cut: 1000 * (2**31 + 3) wraps to 1000 * 3 in int32
    got = run_cluster(_cross_dtype(np.int64, np.int32, value=2**31 + 3), nodes=nodes, devices=devices)
    assert [int(x) for x in got] == [3000] * nodes
    got = run_cluster(_cross_dtype(np.float32, np.float64, value=0.25), nodes=nodes, devices=devices)
    assert [float(x) for x in got] == [250.0] * nodes
    got = run_cluster(_cross_dtype(np.int16, np.float32, op=cl.maximum, value=7), nodes=nodes, devices=devices)
    assert [float(x) for x in got] == [7.0] * nodes


# ---- local_range: chunks are whole work groups -------------------------------------------
def _chunks_with_local_range(rank, oversubscribe=1):
    q = cl.Queue()
    b = cl.Buffer(shape=(320,), dtype=np.int32)
    seen = []

    def cgf(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.discard_write)
        if oversubscribe > 1:
            cl.hint(cgh, cl.oversubscribe(oversubscribe))

        @cgh.parallel_for((320,), local_range=(32,))
        def kernel(chunk):
            seen.append((chunk.offset[0], chunk.range[0]))
            w[chunk] = chunk.arange(0)

    q.submit(cgf)
    result = q.fence(b).result()
    q.wait()
    return sorted(seen), result


def test_local_range_splits_ranks_into_whole_work_groups():
    results = run_cluster(_chunks_with_local_range, nodes=4, devices=1)
    chunks = sorted(c for seen, _ in results for c in seen)
    assert [r for _, r in chunks] == [96, 96, 64, 64]
    for _, result in results:
        np.testing.assert_array_equal(result, np.arange(320))


@pytest.mark.parametrize("nodes,devices,k", [(1, 2, 1), (1, 3, 1), (2, 2, 3), (3, 1, 2)])
def test_local_range_splits_devices_into_whole_work_groups(nodes, devices, k):
    results = run_cluster(lambda rank: _chunks_with_local_range(rank, k), nodes=nodes, devices=devices)
    chunks = sorted(c for seen, _ in results for c in seen)
    assert sum(r for _, r in chunks) == 320
    assert all(o % 32 == 0 and r % 32 == 0 for o, r in chunks)
    assert len(chunks) == min(10, nodes * devices * k)


def test_local_range_must_divide_the_global_range():
    def program(rank):
        q = cl.Queue()

        def cgf(cgh):
            cgh.parallel_for((100,), lambda chunk: None, local_range=(32,), name="ragged")

        q.submit(cgf)

    with pytest.raises(CeleritasError, match="ragged.*not a multiple of local_range"):
        run_cluster(program, nodes=1)


# ---- overlapping writes between devices of one rank ---------------------------------------
def test_overlapping_writes_between_devices_are_reported_like_between_ranks():
    ctx = GraphContext(1, devices=2, diagnostics="error")
    b = ctx.buffer((64,))
    with pytest.raises(DiagnosticError, match=r"writes .* of buffer B0 from the chunks of devices 0 and 1 "
                                              r"of rank 0 \(overlapping writes\)"):
        ctx.task((64,), [(b, rm.all(), DW)], name="everyone_writes_all")
        ctx.finish()


def test_overlapping_device_writes_surface_at_wait_under_diagnostics_error():
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(shape=(64,), dtype=np.float32, name="shared")

        def cgf(cgh):
            w = b.access(cgh, cl.all(), cl.discard_write)

            @cgh.parallel_for((64,), name="writes_all")
            def kernel(chunk):
                w[chunk] = 1

        q.submit(cgf)
        q.wait()

    with pytest.raises(DiagnosticError, match="writes_all.*shared.*devices 0 and 1.*overlapping writes"):
        run_cluster(program, nodes=1, devices=2, CELERITAS_DIAGNOSTICS="error")


def test_disjoint_device_writes_are_not_reported():
    ctx = GraphContext(1, devices=4, diagnostics="error")
    b = ctx.buffer((64, 64))
    ctx.task((64, 64), [(b, rm.one_to_one(), DW)], split="2d")
    ctx.task((64, 64), [(b, rm.one_to_one(), RW)], oversubscribe=3)
    ctx.finish()
    assert len(ctx.instrs(0, "device_kernel")) == 4 + 12


# ---- a reduction consumed on one rank ------------------------------------------------------
def test_reduction_read_by_the_master_node_only():
    def program(rank):
        q = cl.Queue(record=True)
        b = cl.Buffer(shape=(1,), dtype=np.int64, name="sum")
        seen = cl.HostObject([])

        def reduce(cgh):
            red = cl.reduction(b, cgh, cl.plus, initialize_to_identity=True)

            @cgh.parallel_for((64,), reductions=(red,))
            def kernel(chunk, r):
                r.combine(chunk.arange(0))

        def report(cgh):
            acc = b.access(cgh, cl.all(), cl.read)
            log = cl.side_effect(seen, cgh)
            cgh.host_task(lambda part: log.append(int(acc[0])), on=cl.on_master_node)

        q.submit(reduce)
        q.submit(report)
        observed = q.fence(seen).result()
        g = q.graphs()["commands"][rank]
        return observed, sum(c["kind"] == "reduction" for c in g), sum(c["kind"] == "push" for c in g)

    results = run_cluster(program, nodes=4, devices=1)
    assert results[0] == ([sum(range(64))], 1, 0)
    for observed, reductions, pushes in results[1:]:
        assert (observed, reductions, pushes) == ([], 0, 1)


# ---- halo copies come from the producer -------------------------------------------------------
def test_split_2d_halo_copies_never_go_between_diagonal_devices():
    ctx = GraphContext(1, devices=4)
    a, b = ctx.buffer((64, 64), host_init=True), ctx.buffer((64, 64), host_init=True)
    for _ in range(4):
        ctx.task((64, 64), [(a, rm.neighborhood(1, 1, shape="along_axes"), R), (b, rm.one_to_one(), DW)],
                 split="2d")
        a, b = b, a
    ctx.finish()
    # devices on a 2x2 grid, row-major: memories 2 3 / 4 5; axis neighbours only
    axis = {(2, 3), (2, 4), (3, 5), (4, 5)}
    d2d = [(c.source_memory, c.dest_memory) for c in ctx.instrs(0, "copy")
           if c.source_memory >= 2 and c.dest_memory >= 2 and c.source_memory != c.dest_memory]
    assert d2d, "the stencil exchanges halos between devices"
    assert all(tuple(sorted(p)) in axis for p in d2d), d2d
    # and a halo copy never forwards what another copy brought into its source device
    by_id = {i.id: i for i in ctx.instructions[0]}
    for c in ctx.instrs(0, "copy"):
        if c.source_memory >= 2 and c.dest_memory >= 2 and c.source_memory != c.dest_memory:
            for d in c.dep_ids:
                p = by_id.get(d)
                assert not (p is not None and p.kind == "copy" and p.dest_memory == c.source_memory
                            and p.source_memory != p.dest_memory and p.box.intersects(c.box)), (p, c)
    validate(ctx)


# ---- epochs reset the horizon count ---------------------------------------------------------
def test_epochs_reset_the_horizon_counter():
    ctx = GraphContext(1, horizon_step=2)
    b = ctx.buffer((8,), host_init=True)
    for _ in range(3):
        ctx.task((8,), [(b, rm.all(), RW)], kind=tg.MASTER_NODE)
        ctx.epoch()
    assert [r["kind"] for r in ctx.tm.recorder.tasks].count(tg.HORIZON) == 0
    # without epochs, the same tasks do make horizons
    ctx2 = GraphContext(1, horizon_step=2)
    b2 = ctx2.buffer((8,), host_init=True)
    for _ in range(3):
        ctx2.task((8,), [(b2, rm.all(), RW)], kind=tg.MASTER_NODE)
    assert [r["kind"] for r in ctx2.tm.recorder.tasks].count(tg.HORIZON) == 1


def test_epochs_reset_the_horizon_counter_end_to_end():
    def program(rank):
        q = cl.Queue(record=True)
        b = cl.Buffer(np.zeros(8, dtype=np.int64))
        for _ in range(3):
            def cgf(cgh):
                acc = b.access(cgh, cl.all(), cl.read_write)
                cgh.host_task(lambda part: None, on=cl.on_master_node)
            q.submit(cgf)
            q.wait()
        return [t["kind"] for t in q.graphs()["tasks"]].count("horizon")

    assert run_cluster(program, nodes=1, CELERITAS_HORIZON_STEP="2") == [0]


# ---- oversubscribed host tasks --------------------------------------------------------------
def test_oversubscribed_host_task_with_a_range_becomes_k_instructions():
    ctx = GraphContext(1, devices=2)
    b = ctx.buffer((64,), host_init=True)
    ctx.task((64,), [(b, rm.one_to_one(), RW)], kind=tg.HOST_COMPUTE, oversubscribe=4)
    ctx.finish()
    hts = ctx.instrs(0, "host_task")
    assert sorted((h.box.min[0], h.box.max[0]) for h in hts) == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert all(ctx.concurrent(x, y) for x in hts for y in hts if x is not y)
    validate(ctx)


def test_oversubscribed_host_task_partitions_end_to_end():
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.zeros(64, dtype=np.int64))
        parts = cl.HostObject([])

        def cgf(cgh):
            acc = b.access(cgh, cl.one_to_one(), cl.read_write)
            log = cl.side_effect(parts, cgh)
            cl.hint(cgh, cl.oversubscribe(4))

            def task(part):
                acc[part.slices] = np.arange(part.box.min[0], part.box.max[0]) + 1
                log.append((part.box.min[0], part.box.max[0]))
            cgh.host_task(task, range=(64,))

        q.submit(cgf)
        return sorted(q.fence(parts).result()), q.fence(b).result()

    (parts, values), = run_cluster(program, nodes=1, devices=1)
    assert parts == [(0, 16), (16, 32), (32, 48), (48, 64)]
    np.testing.assert_array_equal(values, np.arange(64) + 1)
    results = run_cluster(program, nodes=2, devices=1)
    assert sorted(p for parts, _ in results for p in parts) == [(0, 8), (8, 16), (16, 24), (24, 32),
                                                                  (32, 40), (40, 48), (48, 56), (56, 64)]
    for _, values in results:
        np.testing.assert_array_equal(values, np.arange(64) + 1)
