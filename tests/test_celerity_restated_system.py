"""Cases restated from two files of the C++ Celerity runtime's test suite:

* ``test/system/distr_tests.cc``: end-to-end behaviour on several nodes (reductions read by
  the master node and by collective host tasks, fences, graph dumps, diagnostics, transfers
  of transposed data, the geometry an nd-range kernel sees);
* ``test/range_mapper_tests.cc``: the results of the built-in range mappers for given chunks
  and buffer shapes, and the clipping of every result to the buffer.

Each test names the case it restates and pins the values that case checks, in celeritas's
terms: Celerity's ``runtime_fixture`` under ``mpiexec`` becomes ``run_cluster`` with 1-4
simulated ranks, a ``host_task(on_master_node)`` that CHECKs a value becomes one that
records the value into a host object the test then fences.
"""
from __future__ import annotations

import json
import logging
import threading

import numpy as np
import pytest

import celeritas as cl
from celeritas import range_mappers as rm
from celeritas.testing import run_cluster
from scheduler.geometry import Box, Region, Subrange

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 60   # every run_cluster: a hang is a failure, not a stuck suite


# ---- helpers ----------------------------------------------------------------------------------
def map_chunk(mapper, offset, rng, buffer_shape, global_range=None):
    """What ``mapper`` grants the chunk ``(offset, rng)`` of a kernel over ``global_range``
    (default: the chunk itself) of a buffer of ``buffer_shape``, clipped to the buffer as
    the runtime clips it (Celerity's ``range_mapper{fn, buffer_range}.map_N(chunk)``)."""
    global_range = tuple(rng) if global_range is None else tuple(global_range)
    wrapped = rm.to_scheduler_mapper(mapper, buffer_label="B0", buffer_dims=len(buffer_shape),
                                     kernel_dims=len(offset), global_box=Box.full(global_range))
    return wrapped(Subrange(tuple(offset), tuple(rng)).box, tuple(buffer_shape))


def single_box(region):
    """``(offset, range)`` of a region that must be one box (Celerity's ``rm_result_to_subrange``)."""
    boxes = list(region)
    assert len(boxes) == 1, boxes
    return tuple(boxes[0].offset), tuple(boxes[0].range)


def _record(q, buffer, log, where: str, placement) -> None:
    """Submit a host task (``placement``) that appends (``where``, rank, the buffer's one
    element) to ``log``."""
    def cgf(cgh):
        acc = buffer.access(cgh, cl.all(), cl.read)
        out = cl.side_effect(log, cgh)
        cgh.host_task(lambda part: out.append((where, part.rank, int(acc[0]))), on=placement)

    q.submit(cgf)


def record_on_master(q, buffer, log):
    """A master-node host task appends the buffer's one element to ``log``."""
    _record(q, buffer, log, "master", cl.on_master_node)


def record_on_every_rank(q, buffer, log):
    """A collective host task appends the buffer's one element to ``log`` on every rank."""
    _record(q, buffer, log, "collective", cl.collective)


# =================================================================================================
# distr_tests.cc
# =================================================================================================
@pytest.mark.parametrize("nodes,devices", [(1, 1), (2, 1), (3, 2), (4, 1)])
def test_two_reductions_of_one_kernel_are_read_by_the_master_node(nodes, devices):
    """distr_tests.cc "simple reductions produce the expected results": one kernel over the
    ids 1..1000 (range 1000, offset 1) reduces into two buffers at once, a sum and a maximum
    whose operator has no known identity (Celerity passes the identity 0 explicitly; here
    ``np.fmax``, a ufunc without an identity, with ``identity=0``), both initialized to the
    identity (the buffers' initial 7 and 99999 are ignored).  A master-node host task reads
    500500 and 1000; no other rank runs it."""
    n = 1000

    def program(rank):
        q = cl.Queue()
        total = cl.Buffer(np.full(1, 7, dtype=np.uint64), name="sum")     # (size_t in Celerity)
        top = cl.Buffer(np.full(1, 99999, dtype=np.uint64), name="max")
        log = cl.HostObject([])

        def reduce(cgh):
            s = cl.reduction(total, cgh, cl.plus, initialize_to_identity=True)
            m = cl.reduction(top, cgh, np.fmax, identity=0, initialize_to_identity=True)

            @cgh.parallel_for((n,), offset=(1,), reductions=[s, m], name="sum_and_max")
            def kernel(chunk, s, m):
                ids = chunk.arange(0).astype(np.uint64)
                s.combine(ids)
                m.combine(ids)

        def report(cgh):
            a = total.access(cgh, cl.all(), cl.read)
            b = top.access(cgh, cl.all(), cl.read)
            out = cl.side_effect(log, cgh)
            cgh.host_task(lambda part: out.append((int(a[0]), int(b[0]))), on=cl.on_master_node)

        q.submit(reduce)
        q.submit(report)
        return q.fence(log).result()

    results = run_cluster(program, nodes=nodes, devices=devices, timeout=TIMEOUT)
    assert results[0] == [((n + 1) * n // 2, n)]
    assert all(r == [] for r in results[1:])


@pytest.mark.parametrize("nodes,devices", [(1, 1), (2, 1), (2, 2), (4, 1)])
def test_a_reduction_chained_onto_a_reduction_includes_its_result(nodes, devices):
    """distr_tests.cc "multiple chained reductions produce correct results": a first reduction
    (from the identity) adds 1 per index of a range of 1000, a second one into the same buffer
    (not initialized to the identity) adds 2 per index on top of the first one's result, which
    lies distributed over the ranks' partials.  The master node reads 3 * 1000."""
    n = 1000

    def program(rank):
        q = cl.Queue()
        total = cl.Buffer(shape=(1,), dtype=np.int32, name="sum")
        log = cl.HostObject([])

        for per_item, init in ((1, True), (2, False)):
            def cgf(cgh, per_item=per_item, init=init):
                red = cl.reduction(total, cgh, cl.plus, initialize_to_identity=init)
                cgh.parallel_for((n,), lambda c, r: r.combine(np.full(c.range[0], per_item, np.int32)),
                                 reductions=(red,), name=f"add{per_item}")
            q.submit(cgf)
        record_on_master(q, total, log)
        return q.fence(log).result(), int(q.fence(total).result()[0])

    results = run_cluster(program, nodes=nodes, devices=devices, timeout=TIMEOUT)
    assert results[0] == ([("master", 0, 3 * n)], 3 * n)
    assert all(r == ([], 3 * n) for r in results[1:])


@pytest.mark.parametrize("nodes,devices", [(1, 1), (2, 1), (3, 2), (4, 1)])
def test_a_reduction_result_read_by_the_master_node_then_by_every_rank(nodes, devices):
    """distr_tests.cc "subsequently requiring reduction results on different subsets of nodes
    produces correct data flow": the sum of the linear ids 0..999 is read first by a
    master-node host task (the partials go to rank 0 only), then by a collective host task on
    every rank (rank 0's result must reach the others, which never computed it).  Every read
    sees 999 * 1000 / 2."""
    n = 1000
    expected = (n - 1) * n // 2

    def program(rank):
        q = cl.Queue()
        total = cl.Buffer(shape=(1,), dtype=np.int64, name="sum")
        log = cl.HostObject([])

        def reduce(cgh):
            red = cl.reduction(total, cgh, cl.plus, initialize_to_identity=True)
            cgh.parallel_for((n,), lambda c, r: r.combine(c.arange(0)), reductions=(red,), name="ids")

        q.submit(reduce)
        record_on_master(q, total, log)
        record_on_every_rank(q, total, log)
        return q.fence(log).result()

    results = run_cluster(program, nodes=nodes, devices=devices, timeout=TIMEOUT)
    assert results[0] == [("master", 0, expected), ("collective", 0, expected)]
    for rank, log in enumerate(results[1:], start=1):
        assert log == [("collective", rank, expected)]


def test_the_shutdown_graph_dump_shows_a_finished_reduction(tmp_path):
    """distr_tests.cc "runtime-shutdown graph printing works in the presence of a finished
    reduction": on 2 ranks, a kernel reduces into a one-element buffer and a master-node host
    task reads it; the graphs are printed at shutdown.  Rank 0's (merged) command graph holds
    a reduction command of that reduction into that buffer, and the await-push before it
    receives that reduction's partial (its transfer names the reduction) for the element
    [0, 1) (Celerity: "(R1) await push" and "reduction R1 B0 {[0,0,0] - [1,1,1]}").
    (Celerity greps its log for the DOT text; celeritas writes the dump as DOT and JSON
    files: both are checked here.)"""
    def program(rank):
        q = cl.Queue()
        total = cl.Buffer(shape=(1,), dtype=np.int32, name="sum")

        def reduce(cgh):
            red = cl.reduction(total, cgh, cl.plus, initialize_to_identity=True)
            cgh.parallel_for((100,), lambda c, r: None, reductions=(red,), name="nothing")

        def read(cgh):
            acc = total.access(cgh, cl.all(), cl.read)
            cgh.host_task(lambda part: acc[0], on=cl.on_master_node, name="read")

        q.submit(reduce)
        q.submit(read)
        bid = total.id
        q.shutdown()
        return bid

    bids = run_cluster(program, nodes=2, timeout=TIMEOUT, CELERITAS_PRINT_GRAPHS=str(tmp_path))
    assert bids[0] == bids[1]
    record = cl.GraphRecord.from_json((tmp_path / "command_graph.json").read_text())
    rank0 = record["commands"][0]
    reductions = [c for c in rank0 if c["kind"] == "reduction"]
    assert len(reductions) == 1 and reductions[0]["buffer"] == bids[0]
    rid = reductions[0]["reduction"]
    assert rid != 0
    awaits = [c for c in rank0 if c["kind"] == "await_push" and c["transfer"][2] == rid]
    assert len(awaits) == 1
    assert awaits[0]["transfer"][1] == bids[0] and awaits[0]["region"] == [[[0], [1]]]
    assert awaits[0]["id"] in [d["id"] for d in reductions[0]["deps"]]
    pushes = [c for c in record["commands"][1] if c["kind"] == "push" and c["transfer"][2] == rid]
    assert len(pushes) == 1 and [t["rank"] for t in pushes[0]["targets"]] == [0]
    dot = (tmp_path / "command_graph.dot").read_text()
    assert dot.startswith("digraph")
    assert f"<b>reduction</b> R{rid}<br/>B{bids[0]}" in dot
    assert f"<b>await push</b> T{awaits[0]['transfer'][0]}.B{bids[0]}.R{rid}" in dot


@pytest.mark.parametrize("nodes,devices", [(2, 1), (2, 2), (3, 1)])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_an_nd_range_kernel_sees_its_geometry_on_every_rank(dims, nodes, devices):
    """distr_tests.cc "nd_item and group return correct execution space geometry" (1-, 2- and
    3-D): a kernel over (nodes*4*3, 3*5, 2*11) in work groups of (3, 5, 11), cut to ``dims``,
    on 2 ranks (here also 3 ranks, and 2 devices each).  celeritas calls a Python kernel once
    per chunk, not per work item, and has no nd_item/group objects (those are SYCL's): the
    semantic counterpart pinned here is that every chunk knows the whole global range and is
    made of whole work groups, and that the global ids each index sees are the indices of the
    global range, each seen once, so that the global linear id and the group and local
    linear ids derived from them (as SYCL defines them, row-major) are those Celerity checks."""
    global_range = (nodes * 4 * 3, 3 * 5, 2 * 11)[:dims]
    local_range = (3, 5, 11)[:dims]
    group_range = tuple(g // lr for g, lr in zip(global_range, local_range))

    def group_and_local_ids(ids):
        """group linear id * 1000 + local linear id of every index of ``ids`` (index grids)"""
        group = np.ravel_multi_index([i // lr for i, lr in zip(ids, local_range)], group_range)
        local = np.ravel_multi_index([i % lr for i, lr in zip(ids, local_range)], local_range)
        return group * 1000 + local

    def program(rank):
        q = cl.Queue()
        linear = cl.Buffer(shape=global_range, dtype=np.int64, name="linear")
        group = cl.Buffer(shape=global_range, dtype=np.int64, name="group_and_local")
        seen = []
        lock = threading.Lock()

        def cgf(cgh):
            wl = linear.access(cgh, cl.one_to_one(), cl.discard_write)
            wg = group.access(cgh, cl.one_to_one(), cl.discard_write)

            @cgh.parallel_for(global_range, local_range=local_range, name="geometry")
            def kernel(chunk):
                with lock:
                    seen.append((chunk.offset, chunk.range, tuple(chunk.global_range)))
                ids = chunk.indices()
                wl[chunk] = np.ravel_multi_index(ids, global_range)
                wg[chunk] = group_and_local_ids(ids)

        q.submit(cgf)
        return seen, q.fence(linear).result(), q.fence(group).result()

    results = run_cluster(program, nodes=nodes, devices=devices, timeout=TIMEOUT)
    chunks = [c for seen, _, _ in results for c in seen]
    assert len(chunks) == nodes * devices
    assert sum(int(np.prod(r)) for _, r, _ in chunks) == int(np.prod(global_range))
    for offset, rng, whole in chunks:
        assert whole == global_range
        assert all(o % lr == 0 and r % lr == 0 for o, r, lr in zip(offset, rng, local_range))
    want_groups = group_and_local_ids(np.indices(global_range))
    assert want_groups.max() == (int(np.prod(group_range)) - 1) * 1000 + int(np.prod(local_range)) - 1
    for _, lin, grp in results:
        np.testing.assert_array_equal(lin, np.arange(int(np.prod(global_range))).reshape(global_range))
        np.testing.assert_array_equal(grp, want_groups)


def test_every_rank_builds_the_same_task_graph():
    """distr_tests.cc "generating same task graph on different nodes": on 2 ranks, five
    kernels writing and reading two buffers one-to-one (write a, write b, read-write a,
    read-write a and b, write a).  Each rank's task graph record, and its Graphviz text, are
    identical; both hold the five kernels in submission order."""
    def program(rank):
        q = cl.Queue(record=True)
        a = cl.Buffer(shape=(1000,), dtype=np.int32, name="a")
        b = cl.Buffer(shape=(1000,), dtype=np.int32, name="b")
        steps = [("write_a", [(a, cl.discard_write)]), ("write_b", [(b, cl.discard_write)]),
                 ("rw_a", [(a, cl.read_write)]), ("rw_ab", [(a, cl.read_write), (b, cl.read_write)]),
                 ("write_a_again", [(a, cl.discard_write)])]
        for name, accesses in steps:
            def cgf(cgh, name=name, accesses=accesses):
                accs = [buf.access(cgh, cl.one_to_one(), mode) for buf, mode in accesses]

                def kernel(chunk):
                    for acc in accs:
                        acc[chunk] = 1
                cgh.parallel_for((1000,), kernel, name=name)
            q.submit(cgf)
        q.wait()
        rec = q.graphs()
        return json.dumps(rec["tasks"], sort_keys=True), rec.to_dot_tasks(), \
            [t["name"] for t in rec["tasks"] if t["kind"] == "device_compute"]

    (tasks0, dot0, names0), (tasks1, dot1, names1) = run_cluster(program, nodes=2, timeout=TIMEOUT)
    assert tasks0 == tasks1 and dot0 == dot1
    assert names0 == names1 == ["write_a", "write_b", "rw_a", "rw_ab", "write_a_again"]


@pytest.mark.parametrize("rows,nodes,devices", [(1, 2, 1), (1, 2, 2), (1, 4, 1), (2, 3, 2)])
def test_ranks_without_rows_get_no_chunk_and_no_command(rows, nodes, devices):
    """distr_tests.cc "nodes do not receive commands for empty chunks": a kernel over (1, 100),
    the shape of its buffer, on 2 ranks (here also 4 ranks, and 2 rows on 3 ranks).  The split
    along dimension 0 cannot cut a row, so with one row the range mapper only ever sees the
    whole range; it never sees an empty chunk, exactly ``rows`` ranks execute the kernel and
    the others get no execution command for it at all."""
    def program(rank):
        q = cl.Queue(record=True)
        buf = cl.Buffer(shape=(rows, 100), dtype=np.float32, name="rows")
        chunks = []

        def checked_one_to_one(chunk, shape):
            chunks.append((tuple(chunk.offset), tuple(chunk.range)))
            return chunk

        def cgf(cgh):
            w = buf.access(cgh, checked_one_to_one, cl.discard_write)
            cgh.parallel_for((rows, 100), lambda c: w.__setitem__(c, 5.0), name="few_rows")

        q.submit(cgf)
        values = q.fence(buf).result()
        q.wait()
        rec = q.graphs()
        tid = next(t["id"] for t in rec["tasks"] if t["name"] == "few_rows")
        executions = [c for c in rec["commands"][rank] if c["kind"] == "execution" and c["task"] == tid]
        return set(chunks), len(executions), values

    results = run_cluster(program, nodes=nodes, devices=devices, timeout=TIMEOUT)
    for chunks, _, values in results:
        if rows == 1:
            assert chunks == {((0, 0), (1, 100))}
        assert all(r[0] >= 1 and r[1] == 100 for _, r in chunks), chunks
        assert (values == 5.0).all()
    assert sorted(n for _, n, _ in results) == [0] * (nodes - rows) + [1] * rows


@pytest.mark.parametrize("nodes,devices", [(1, 1), (2, 1), (3, 2), (4, 1)])
def test_fences_bring_a_subrange_and_host_object_to_every_rank(nodes, devices):
    """distr_tests.cc "fences transfer data correctly between nodes": a collective host task
    stores each rank's index in that rank's host object; a master-node host task writes 42 at
    (1, 2, 3) of an oddly-shaped (5, 4, 7) buffer.  On every rank, a fence of the subrange
    offset (1, 2, 3), range (1, 1, 1) is a (1, 1, 1) array holding 42 (fetched from rank 0),
    and a fence of the host object holds that rank's own index.  (Celerity's host object holds
    an int; ``cl.side_effect`` returns the object itself, so here it is a one-element list.)"""
    def program(rank):
        q = cl.Queue()
        buf = cl.Buffer(shape=(5, 4, 7), dtype=np.int32, name="odd")
        obj = cl.HostObject([None])

        def who(cgh):
            box = cl.side_effect(obj, cgh)

            def task(part):
                box[0] = part.box.min[0]
            cgh.host_task(task, on=cl.collective)

        def poke(cgh):
            acc = buf.access(cgh, cl.all(), cl.discard_write)
            cgh.host_task(lambda part: acc.__setitem__((1, 2, 3), 42), on=cl.on_master_node)

        q.submit(who)
        q.submit(poke)
        element = q.fence(buf, cl.Subrange((1, 2, 3), (1, 1, 1))).result()
        mine = q.fence(obj).result()
        return element.shape, element.tolist(), mine

    results = run_cluster(program, nodes=nodes, devices=devices, timeout=TIMEOUT)
    assert results == [((1, 1, 1), [[[42]]], [r]) for r in range(nodes)]


def test_rank_0_dump_collects_the_command_graph_of_every_rank(tmp_path):
    """distr_tests.cc "command graph can be collected across distributed nodes": on 2 ranks,
    rank 0's shutdown dump of the command graph holds every rank's commands, each rank's
    exactly as that rank recorded them itself (``Queue.graphs()``), and its DOT text has one
    cluster of nodes per rank.  (Celerity tests its gather function on two hand-written DOT
    strings; celeritas gathers records, so the property pinned is that the merged dump is
    the union of the ranks' own graphs.)"""
    def program(rank):
        q = cl.Queue(record=True)
        a = cl.Buffer(np.arange(16, dtype=np.float32), name="a")
        log = cl.HostObject([])

        def shift(cgh):
            r = a.access(cgh, cl.neighborhood(1), cl.read)
            out = cl.side_effect(log, cgh)
            cgh.host_task(lambda part: out.append(float(r[part.box].sum())), range=(16,))

        q.submit(shift)
        q.wait()
        own = json.loads(q.graphs().to_json())["commands"][str(rank)]
        q.shutdown()
        return own

    own = run_cluster(program, nodes=2, timeout=TIMEOUT, CELERITAS_PRINT_GRAPHS=str(tmp_path))
    dumped = json.loads((tmp_path / "command_graph.json").read_text())["commands"]
    assert set(dumped) == {"0", "1"}
    for rank in (0, 1):
        ids = {c["id"] for c in own[rank]}
        assert ids and ids <= {c["id"] for c in dumped[str(rank)]}
        assert [c for c in dumped[str(rank)] if c["id"] in ids] == own[rank]
    dot = (tmp_path / "command_graph.dot").read_text()
    assert "R0_C" in dot and "R1_C" in dot


@pytest.mark.parametrize("where", ["kernel", "collective"])
@pytest.mark.parametrize("policy", ["off", "warn", "error"])
def test_overlapping_writes_between_ranks_are_reported_iff_diagnostics_are_on(where, policy, caplog):
    """distr_tests.cc "runtime logs errors on overlapping writes between commands iff access
    pattern diagnostics are enabled" (both sections): on 2 ranks, every chunk of a device
    kernel over (2,), or every rank's part of a collective host task, writes the whole
    one-element buffer.  With diagnostics off nothing is reported; under ``warn`` rank 0 logs
    a warning naming the buffer's element and "overlapping writes"; under ``error`` the program
    fails with a ``cl.DiagnosticError`` saying the same.  (Celerity's switch is the build
    option CELERITY_ACCESS_PATTERN_DIAGNOSTICS and its message an error log; celeritas's is the
    environment variable CELERITAS_DIAGNOSTICS.)"""
    def program(rank):
        q = cl.Queue()
        buf = cl.Buffer(shape=(1,), dtype=np.int32, name="one")

        def cgf(cgh):
            w = buf.access(cgh, cl.all(), cl.discard_write)
            if where == "kernel":
                cgh.parallel_for((2,), lambda c: w.__setitem__(slice(0, 1), 1), name="both_write")
            else:
                cgh.host_task(lambda part: w.__setitem__(slice(0, 1), 1), on=cl.collective, name="both_write")

        q.submit(cgf)
        q.wait()
        return True

    def reports(text):
        return "overlapping writes" in text and "both_write" in text and "one" in text and "[0], [1]" in text

    with caplog.at_level(logging.WARNING, logger="celeritas"):
        if policy == "error":
            with pytest.raises(cl.DiagnosticError) as info:
                run_cluster(program, nodes=2, timeout=TIMEOUT, CELERITAS_DIAGNOSTICS=policy)
            assert reports(str(info.value)), str(info.value)
        else:
            assert run_cluster(program, nodes=2, timeout=TIMEOUT, CELERITAS_DIAGNOSTICS=policy) == [True, True]
    warnings = [r.getMessage() for r in caplog.records if "overlapping writes" in r.getMessage()]
    if policy == "warn":
        assert len(warnings) == 1 and reports(warnings[0]), warnings
    elif policy == "off":
        assert warnings == []


def _transposed_program(n, over_producer, over_consumer):
    def program(rank):
        q = cl.Queue()
        transposed = cl.Buffer(shape=(n, n), dtype=np.int64, name="transposed")
        copy = cl.Buffer(shape=(n, n), dtype=np.int64, name="copy")

        def swap(chunk, shape):
            return cl.Subrange(tuple(reversed(chunk.offset)), tuple(reversed(chunk.range)))

        def produce(cgh):
            w = transposed.access(cgh, swap, cl.discard_write)
            if over_producer:
                cl.hint(cgh, cl.oversubscribe(2))

            @cgh.parallel_for((n, n), name="produce")
            def kernel(chunk):
                (i0, j0), (i1, j1) = chunk.box.min, chunk.box.max
                rows = np.arange(j0, j1)[:, None]
                cols = np.arange(i0, i1)[None, :]
                w[j0:j1, i0:i1] = rows * n + cols      # element (j, i) holds its own index

        def consume(cgh):
            r = transposed.access(cgh, cl.one_to_one(), cl.read)
            w = copy.access(cgh, cl.one_to_one(), cl.discard_write)
            if over_consumer:
                cl.hint(cgh, cl.oversubscribe(2))
            cgh.parallel_for((n, n), lambda c: w.__setitem__(c, r[c]), name="consume")

        q.submit(produce)
        q.submit(consume)
        return q.fence(copy).result()

    return program


@pytest.mark.parametrize("nodes,devices", [(2, 1), (2, 2), (3, 2)])
@pytest.mark.parametrize("over_producer,over_consumer", [(False, False), (False, True), (True, False),
                                                          (True, True)])
def test_transposed_writes_are_transferred_to_one_to_one_readers(nodes, devices, over_producer,
                                                                 over_consumer):
    """distr_tests.cc "buffer transfers are performed correctly on transposed access patterns"
    (all four oversubscription combinations): a producer writes a 2-D buffer through a
    transposing mapper, so each rank / device owns columns; a consumer copies it one-to-one,
    so each needs rows gathered from every producer (on several devices, a receive that does
    not know how the sender cuts its sends).  The copy holds, at every (i, j), its own index.
    (Celerity stores the id itself; here the linear index i * n + j.)"""
    n = 24
    for result in run_cluster(_transposed_program(n, over_producer, over_consumer), nodes=nodes,
                              devices=devices, timeout=TIMEOUT):
        np.testing.assert_array_equal(result, np.arange(n * n).reshape(n, n))


# =================================================================================================
# range_mapper_tests.cc
# =================================================================================================
@pytest.mark.parametrize("kernel_dims", [1, 2, 3])
@pytest.mark.parametrize("buffer_dims", [1, 2, 3])
def test_a_mapper_gets_a_chunk_of_the_kernels_and_a_shape_of_the_buffers_dimensionality(kernel_dims,
                                                                                        buffer_dims):
    """range_mapper_tests.cc "range mappers are only invocable with correctly-dimensioned
    chunks": Celerity checks at compile time which (chunk, buffer range) dimensionalities a
    mapper accepts.  Python mappers are untyped, so the property pinned is the contract that
    makes a mapper correct for a (kernel, buffer) pair: both accepted forms, ``mapper(chunk)``
    and ``mapper(chunk, shape)``, receive a chunk of the kernel's dimensionality and the shape
    of the buffer's, and a result of the buffer's dimensionality is used as given; a result
    of another dimensionality is a ``cl.RangeMapperError`` (pinned for every form in
    test_range_mapper_errors.py, so only the accepted side is here)."""
    kernel = (4, 5, 6)[:kernel_dims]
    shape = (7, 8, 9)[:buffer_dims]
    calls = []

    def two_args(chunk, buffer_shape):
        calls.append((len(chunk.offset), len(chunk.range), tuple(buffer_shape)))
        return cl.Subrange((1,) * len(buffer_shape), (2,) * len(buffer_shape))

    def one_arg(chunk):
        calls.append((len(chunk.offset), len(chunk.range), None))
        return cl.Box((0,) * buffer_dims, (1,) * buffer_dims)

    got = map_chunk(two_args, (0,) * kernel_dims, kernel, shape)
    assert single_box(got) == ((1,) * buffer_dims, (2,) * buffer_dims)
    got = map_chunk(one_arg, (0,) * kernel_dims, kernel, shape)
    assert single_box(got) == ((0,) * buffer_dims, (1,) * buffer_dims)
    assert calls == [(kernel_dims, kernel_dims, shape), (kernel_dims, kernel_dims, None)]


def test_a_mapper_result_is_clipped_to_the_buffer():
    """range_mapper_tests.cc "range mapper results are clamped to buffer range": a mapper
    returning offset (0, 100, 127), range (256, 64, 32) on a 128^3 buffer grants offset
    (0, 100, 127), range (128, 28, 1)."""
    def too_large(chunk):
        return cl.Subrange((0, 100, 127), (256, 64, 32))

    got = map_chunk(too_large, (0, 0, 0), (1, 1, 1), (128, 128, 128))
    assert single_box(got) == ((0, 100, 127), (128, 28, 1))


def test_one_to_one_grants_the_chunk():
    """range_mapper_tests.cc "one_to_one built-in range mapper behaves as expected": the chunk
    offset (64, 32), range (32, 4) of a 128x128 buffer is granted exactly that box."""
    got = map_chunk(cl.one_to_one(), (64, 32), (32, 4), (128, 128), global_range=(128, 128))
    assert single_box(got) == ((64, 32), (32, 4))


def test_fixed_grants_its_subrange_whatever_the_chunk():
    """range_mapper_tests.cc "fixed built-in range mapper behaves as expected": ``fixed`` with
    offset 3, range 97 of a 128-element buffer, asked for a 2-D chunk (64, 32)+(32, 4), grants
    offset 3, range 97 (the kernel's dimensionality does not matter)."""
    got = map_chunk(cl.fixed(cl.Subrange((3,), (97,))), (64, 32), (32, 4), (128,), global_range=(128, 128))
    assert single_box(got) == ((3,), (97,))


@pytest.mark.parametrize("dim, want", [
    (0, ((0, 32, 32), (128, 32, 32))),
    (1, ((32, 0, 32), (32, 128, 32))),
    (2, ((32, 32, 0), (32, 32, 128))),
])
def test_slice_spans_the_buffer_along_its_dimension(dim, want):
    """range_mapper_tests.cc "slice built-in range mapper behaves as expected": for the chunk
    offset (32, 32, 32), range (32, 32, 32) of a 128^3 buffer, ``slice(d)`` grants the chunk's
    box with dimension d widened to the whole buffer, for d = 0, 1, 2."""
    got = map_chunk(cl.slice(dim), (32, 32, 32), (32, 32, 32), (128, 128, 128), global_range=(128, 128, 128))
    assert single_box(got) == want


@pytest.mark.parametrize("shape", [(128,), (128, 64), (128, 64, 32)])
def test_all_grants_the_whole_buffer_of_any_dimensionality(shape):
    """range_mapper_tests.cc "all built-in range mapper behaves as expected": a 1-D chunk is
    granted the whole 128, 128x64 and 128x64x32 buffer, offset zero."""
    got = map_chunk(cl.all(), (0,), (1,), shape)
    assert single_box(got) == ((0,) * len(shape), shape)


@pytest.mark.parametrize("shape_kind, extent, offset, rng, want", [
    ("bounding_box", (10,), (15,), (10,), [Box((5,), (35,))]),
    ("bounding_box", (10, 10), (5, 100), (10, 20), [Box((0, 90), (25, 128))]),
    ("bounding_box", (3, 4, 5), (3, 4, 5), (1, 1, 1), [Box((0, 0, 0), (7, 9, 11))]),
    ("along_axes", (10,), (15,), (10,), [Box((5,), (35,))]),
    ("along_axes", (10, 10), (5, 100), (10, 20), [Box((0, 100), (25, 120)), Box((5, 90), (15, 128))]),
    ("along_axes", (3, 4, 5), (3, 4, 5), (1, 1, 1),
     [Box((0, 4, 5), (7, 5, 6)), Box((3, 0, 5), (4, 9, 6)), Box((3, 4, 0), (4, 5, 11))]),
])
def test_neighborhood_grows_the_chunk_clipped_to_the_buffer(shape_kind, extent, offset, rng, want):
    """range_mapper_tests.cc "neighborhood built-in range mapper behaves as expected" (both
    sections): on 128-wide buffers of 1 to 3 dimensions, ``neighborhood`` grows the chunk by
    its extents on both sides and clips at the buffer's edges: as one box (bounding_box), or
    as the union of the chunk grown along one axis at a time (along_axes: a cross without
    corners; in 1-D the same box).  The granted point set equals Celerity's region."""
    dims = len(offset)
    got = map_chunk(cl.neighborhood(*extent, shape=shape_kind), offset, rng, (128,) * dims,
                    global_range=(128,) * dims)
    assert got == Region(want)
    assert got.area == Region(want).area


@pytest.mark.parametrize("shape, granularity, chunk, want", [
    ((128, 345, 678), None, ((0,), (1,), (8,)), ((0, 0, 0), (16, 345, 678))),
    ((128, 345, 678), None, ((4,), (2,), (8,)), ((64, 0, 0), (32, 345, 678))),
    ((131, 992, 613), None, ((5,), (2,), (7,)), ((95, 0, 0), (36, 992, 613))),
    ((128, 345, 678), 10, ((0,), (1,), (8,)), ((0, 0, 0), (20, 345, 678))),
    ((131, 992, 613), 10, ((0,), (1,), (7,)), ((0, 0, 0), (20, 992, 613))),
    ((131, 992, 613), 10, ((5,), (2,), (7,)), ((100, 0, 0), (31, 992, 613))),
    ((236, 992, 613), 10, ((6,), (1,), (7,)), ((200, 0, 0), (36, 992, 613))),
])
def test_even_split_grants_the_chunks_share_of_dimension_0(shape, granularity, chunk, want):
    """range_mapper_tests.cc "even_split built-in range mapper behaves as expected" (all seven
    checks): a chunk (offset, range) of a 1-D kernel over ``global`` items is granted its
    share of the 3-D buffer's rows, every other dimension whole.  Each item gets the same
    number of whole granules; the granules left over go one each to the first items (131 rows
    over 7: items 0..4 get 19 rows, 5..6 get 18, so chunk [5, 7) gets rows [95, 131)); rows
    that do not fill a granule go to the last item (131 rows in granules of 10 over 7: chunk
    [5, 7) gets [100, 131))."""
    offset, rng, whole = chunk
    got = map_chunk(cl.even_split(granularity), offset, rng, shape, global_range=whole)
    assert single_box(got) == want


def test_even_split_with_fewer_granules_than_items_fills_the_first_items():
    """The same split where the rows do not give every item a granule: 5 rows over 8 items
    give items 0..4 a row each and nothing to items 5..7; 7 rows in granules of 10 over 3
    items are all the last item's (the odd rest goes last)."""
    def share(rows, gran, item, parts):
        return list(map_chunk(cl.even_split(gran), (item,), (1,), (rows, 2), global_range=(parts,)))

    assert [share(5, None, p, 8) for p in range(8)] == [[Box((p, 0), (p + 1, 2))] for p in range(5)] + [[]] * 3
    assert [share(7, 10, p, 3) for p in range(3)] == [[], [], [Box((0, 0), (7, 2))]]


@pytest.mark.parametrize("rows, granularity, parts", [(131, None, 7), (128, 10, 8), (131, 10, 7),
                                                      (236, 10, 7), (128, None, 8), (25, 10, 2)])
def test_even_split_tiles_dimension_0_in_granules_with_the_odd_rest_last(rows, granularity, parts):
    """range_mapper_tests.cc "even_split built-in range mapper behaves as expected", the
    properties behind its checks, for every item of several splits: the shares tile the
    buffer's dimension 0 in order without gaps or overlap, every share but the last is a
    whole number of granules, shares differ by at most one granule (ignoring the odd rest of
    the last one) and the larger ones come first, every other dimension is granted whole, and
    a chunk of two items gets the two one-item shares together.  (celeritas used to give each
    item its proportional share, ``floor(p * granules / parts)`` granules from its start p:
    the same tiling, with the larger shares spread out instead of first.)"""
    gran = granularity or 1
    shape = (rows, 3)
    shares = []
    for p in range(parts):
        offset, rng = single_box(map_chunk(cl.even_split(granularity), (p,), (1,), shape, global_range=(parts,)))
        assert offset[1] == 0 and rng[1] == 3
        shares.append((offset[0], rng[0]))
    assert shares[0][0] == 0
    assert all(a + r == b for (a, r), (b, _) in zip(shares, shares[1:]))
    assert shares[-1][0] + shares[-1][1] == rows
    assert all(r % gran == 0 for _, r in shares[:-1])
    granules = [r // gran for _, r in shares[:-1]] + [-(-shares[-1][1] // gran)]
    assert max(granules) - min(granules) <= 1, shares
    whole = [r // gran for _, r in shares[:-1]]
    assert whole == sorted(whole, reverse=True), shares          # the larger shares first
    # a chunk of two items gets the two one-item shares together
    for p in range(parts - 1):
        both = single_box(map_chunk(cl.even_split(granularity), (p,), (2,), shape, global_range=(parts,)))
        assert both == ((shares[p][0], 0), (shares[p][1] + shares[p + 1][1], 3))
