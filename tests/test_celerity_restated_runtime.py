"""Cases restated from the C++ Celerity runtime's ``test/runtime_tests.cc`` (40 TEST_CASEs):
the lifetime of queues, buffers and the runtime, what a command group records, the handler's
checks, fences, 0-D buffers and kernels, diagnostics, dry runs, configuration and lookahead.

How the fixtures map: Celerity's ``runtime_fixture`` (a fresh runtime per test, torn down
afterwards) becomes ``run_cluster`` with one simulated rank (more where the case is about
ranks), which gives every test its own runtime and shuts it down when the program returns;
``runtime_testspy`` / ``scheduler_testspy`` inspection becomes the public attributes of
``q.runtime`` (``task_manager``, ``scheduler``, ``config``, ``tasks_ahead``) and the graph
records of ``Queue(record=True)``; ``test_utils::log_contains_exact`` becomes pytest's
``caplog``; ``env::scoped_test_environment`` becomes ``run_cluster``'s ``CELERITAS_*``
keywords, or ``celeritas.config.from_env`` for the two cases that build a configuration
without a runtime.  A ``host_task(on_master_node)`` that CHECKs a value becomes one that
records it into a host object (or a list) that the test reads afterwards.

Already pinned elsewhere (not restated here):

* "handler throws when accessing host objects within device tasks":
  test_errors.py::test_command_group_misuse_is_a_clear_error[side_effect_kernel]
  (``cl.side_effect`` in a ``parallel_for`` is a ``CeleritasError`` naming the kernel).
* "fences extract data from host objects":
  test_fence_snapshot.py::test_host_object_fence_result_does_not_change_when_later_host_tasks_run
  (two fences between host tasks each see the state of their own point, and are copies).

Not applicable to celeritas (no test written):

* "handler throws when accessor target does not match command type": celeritas has one
  accessor type for kernels and host tasks; there is no device / host_task target to mismatch.
* "handler throws when not all accessors / side-effects are copied into the kernel",
  "handler recognizes copies of same accessor being captured multiple times" and "handler
  recognizes copies of same side-effect being captured multiple times" (a ``[!shouldfail]``
  case): they detect C++ lambdas capturing by reference instead of by value; a Python
  closure captures references by design, and an accessor a kernel declares but never uses
  is legal.

Where celeritas differs by design, the test pins the documented behaviour and says so:
host data is copied when a buffer is made (so destroying one never waits for tasks), the
runtime checks for no single application thread but refuses calls from inside its own
kernels and host tasks (which would wait for themselves), and diagnostics are logged as
warnings.

Two cases found defects, now fixed: ``copy.copy`` of a
buffer gave a second handle whose garbage collection destroyed the buffer under the first,
and under ``run_cluster`` ``cl.Buffer()`` / ``cl.HostObject()`` / ``cl.Queue()`` inside a
host task started a second, process-level runtime instead of being refused.
"""
from __future__ import annotations

import copy
import gc
import logging
import threading
import time

import numpy as np
import pytest

import celeritas as cl
from celeritas import context, summary
from celeritas.config import from_env
from celeritas.testing import run_cluster

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 60   # every run_cluster: a hang is a failure, not a stuck suite


# ---- helpers ----------------------------------------------------------------------------------
def no_process_runtime() -> bool:
    """No runtime is current on this (the test's) thread: every runtime a test made ran
    inside ``run_cluster`` and was shut down with it."""
    try:
        context.current_runtime(create=False)
    except cl.CeleritasError:
        return True
    return False


def shut_down_stray_process_runtime() -> None:
    """Clean up a process-level runtime should a host task start one (the defect the test below pins)."""
    try:
        rt = context.current_runtime(create=False)
    except cl.CeleritasError:
        return
    rt.shutdown()


def task_records(q) -> list[dict]:
    return q.graphs()["tasks"]


def instruction_records(q, kind: str) -> list[dict]:
    return [i for i in q.graphs()["instructions"] if i["kind"] == kind]


def warnings_matching(caplog, *parts: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and all(p in r.getMessage() for p in parts)]


# =================================================================================================
# queues, buffers and the runtime's lifetime
# =================================================================================================
def test_any_number_of_queues_share_one_runtime():
    """runtime_tests.cc "any number of queues can be created": four queues (one a
    ``copy.copy`` of the first) are made; all are handles of the one runtime of the rank,
    and work submitted through one is seen by a fence through another (a kernel through q1
    writes the buffer, q3 fences it, q4 waits)."""
    def program(rank):
        q1 = cl.Queue()
        q2 = copy.copy(q1)
        q3 = cl.Queue()
        q4 = cl.Queue()
        rts = {id(q.runtime) for q in (q1, q2, q3, q4)}
        b = cl.Buffer(shape=(8,), dtype=np.int32, name="b")

        def cgf(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((8,), lambda c: w.__setitem__(c, c.arange(0) * 3), name="triple")

        q1.submit(cgf)
        values = q3.fence(b).result().tolist()
        q4.wait()
        q2.wait()
        return len(rts), values

    assert run_cluster(program, nodes=1, timeout=TIMEOUT) == [(1, [3 * i for i in range(8)])]


def test_dropping_every_queue_keeps_the_runtime_and_a_new_queue_after_shutdown_starts_afresh():
    """runtime_tests.cc "new queues can be created after the last one has been destroyed":
    once the only queue is dropped (and collected) the runtime is still current, and the next
    ``cl.Queue()`` is a handle of that same runtime.  In celeritas a runtime ends only with
    ``q.shutdown()``; a queue made after that starts a new runtime, which runs work too."""
    def program(rank):
        q = cl.Queue()
        first = q.runtime
        del q
        gc.collect()
        still_current = context.current_runtime(create=False) is first
        q = cl.Queue()
        same = q.runtime is first
        q.shutdown()
        q = cl.Queue()
        fresh = q.runtime is not first and not q.runtime.is_shut_down
        b = cl.Buffer(np.arange(4, dtype=np.int64))

        def cgf(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for((4,), lambda c: w.__setitem__(c, w[c] + 10))

        q.submit(cgf)
        return still_current, same, first.is_shut_down, fresh, q.fence(b).result().tolist()

    assert run_cluster(program, nodes=2, timeout=TIMEOUT) == [(True, True, True, True, [10, 11, 12, 13])] * 2


@pytest.mark.parametrize("first", ["Queue", "Buffer", "HostObject"])
def test_the_first_queue_buffer_or_host_object_starts_the_runtime(first):
    """runtime_tests.cc "queue implicitly initializes the runtime" and "buffer implicitly
    initializes the runtime" (and, as docs/api.md says, a host object too): before anything
    is made there is no runtime on the rank; the first of these starts it, and a queue made
    afterwards is a handle of that runtime."""
    def program(rank):
        before = True
        try:
            context.current_runtime(create=False)
            before = False
        except cl.CeleritasError:
            pass
        if first == "Queue":
            obj = cl.Queue()
            rt = obj.runtime
        elif first == "Buffer":
            obj = cl.Buffer(shape=(1,), dtype=np.float32)
            rt = context.current_runtime(create=False)
        else:
            obj = cl.HostObject([])
            rt = context.current_runtime(create=False)
        started = rt is not None and not rt.is_shut_down
        return before, started, cl.Queue().runtime is rt

    assert run_cluster(program, nodes=1, timeout=TIMEOUT) == [(True, True, True)]


def test_names_bound_to_one_buffer_share_it_and_dropping_one_keeps_it():
    """runtime_tests.cc "buffer can be copied", the part Python shares: a buffer is a handle,
    so ``c = a`` and ``b = c`` (rebinding a name that held another buffer) give names of the
    same buffer.  A write through one name is what a fence through another sees, and
    dropping names (and collecting) destroys nothing while one is left."""
    def program(rank):
        q = cl.Queue()
        a = cl.Buffer(np.zeros(10, dtype=np.int32), name="a")
        b = cl.Buffer(shape=(10,), dtype=np.int32, name="b")
        c = a
        b = c
        del a, c
        gc.collect()

        def cgf(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for((10,), lambda ch: w.__setitem__(ch, w[ch] + ch.arange(0)))

        q.submit(cgf)
        return b.name, q.fence(b).result().tolist()

    assert run_cluster(program, nodes=1, timeout=TIMEOUT) == [("a", list(range(10)))]


def test_a_copied_buffer_handle_keeps_the_buffer_alive():
    """runtime_tests.cc "buffer can be copied": in Celerity a copy of a buffer is another
    handle of the same buffer, which lives until the last handle goes.  The Python analogue
    is ``copy.copy(buffer)``: the copy names the same buffer, and dropping it must not
    destroy the buffer that the original still uses.  (Before, the copy was a second object
    whose finalizer destroyed the buffer under the original: RangeMapperError "accesses
    buffer B0, which was destroyed".)  ``copy.deepcopy`` and host objects alike: a handle
    copies as itself."""
    def program(rank):
        q = cl.Queue()
        a = cl.Buffer(np.arange(10, dtype=np.float32), name="a")
        h = cl.HostObject([1])
        c = copy.copy(a)
        same = c.id == a.id and c is a and copy.deepcopy([a, h])[0] is a and copy.copy(h) is h
        del c
        gc.collect()

        def cgf(cgh):
            w = a.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for((10,), lambda ch: w.__setitem__(ch, w[ch] + 1))

        q.submit(cgf)
        return same, q.fence(a).result().tolist()

    assert run_cluster(program, nodes=1, timeout=TIMEOUT) == [(True, [float(i + 1) for i in range(10)])]


# =================================================================================================
# what a command group records
# =================================================================================================
def test_an_accessor_records_one_buffer_access_in_its_task():
    """runtime_tests.cc "buffer::get_access records a buffer access in the command group": a
    kernel over 32x64 that declares one ``read`` accessor of a host-initialized 32x64 buffer
    through ``one_to_one`` becomes a task with exactly one access: that buffer, mode read,
    over the whole buffer (the mapper applied to the whole index space), and a true
    dependency on the init epoch that holds the host data."""
    def program(rank):
        q = cl.Queue(record=True)
        a = cl.Buffer(np.zeros((32, 64), dtype=np.float32), name="a")

        def cgf(cgh):
            acc = a.access(cgh, cl.one_to_one(), cl.read)
            cgh.parallel_for((32, 64), lambda c: acc[c], name="reads_a")

        q.submit(cgf)
        q.wait()
        (t,) = [t for t in task_records(q) if t["name"] == "reads_a"]
        return a.id, t["accesses"], t["deps"]

    ((bid, accesses, deps),) = run_cluster(program, nodes=1, timeout=TIMEOUT)
    assert accesses == [{"buffer": bid, "mode": "read", "region": [[[0, 0], [32, 64]]]}]
    assert deps == [{"id": 0, "kind": "true", "origin": "dataflow"}]


# =================================================================================================
# synchronization
# =================================================================================================
@pytest.mark.parametrize("nodes,devices", [(1, 1), (2, 2)])
def test_wait_returns_after_every_task_submitted_before_it_completed(nodes, devices):
    """runtime_tests.cc "queue::wait() returns only after all preceding tasks have completed":
    a kernel writes each element's index into a buffer of 10, a master-node host task sleeps
    (to give a wrong wait a chance to return early) and then copies the buffer into a plain
    list of the rank (no host object orders anything); right after ``q.wait()`` rank 0's list
    holds 0..9 and no other rank ran the host task."""
    n = 10

    def program(rank):
        q = cl.Queue()
        buf = cl.Buffer(shape=(n,), dtype=np.int32, name="ids")
        host_copy: list[int] = []

        def fill(cgh):
            w = buf.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((n,), lambda c: w.__setitem__(c, c.arange(0)), name="fill")

        def copy_out(cgh):
            r = buf.access(cgh, cl.fixed(cl.Subrange((0,), (n,))), cl.read)

            def task(part):
                time.sleep(0.05)
                host_copy.extend(int(r[i]) for i in range(n))

            cgh.host_task(task, on=cl.on_master_node, name="copy_out")

        q.submit(fill)
        q.submit(copy_out)
        q.wait()
        return list(host_copy)

    results = run_cluster(program, nodes=nodes, devices=devices, timeout=TIMEOUT)
    assert results[0] == list(range(n))
    assert all(r == [] for r in results[1:])


# =================================================================================================
# collective host tasks
# =================================================================================================
@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_a_collective_host_task_runs_once_per_rank(nodes):
    """runtime_tests.cc "collective host_task produces one item per rank": a collective host
    task runs on every rank, once, with a partition whose global range is the number of
    ranks, whose box is the rank's own item, and whose communicator spans all ranks."""
    def program(rank):
        q = cl.Queue()
        seen = cl.HostObject([])

        def cgf(cgh):
            out = cl.side_effect(seen, cgh)

            def task(part):
                out.append((part.global_range, part.box.min, part.box.max, part.comm is not None and part.comm.size,
                            part.comm.rank))

            cgh.host_task(task, on=cl.collective, name="per_rank")

        q.submit(cgf)
        return q.fence(seen).result()

    results = run_cluster(program, nodes=nodes, timeout=TIMEOUT)
    assert results == [[((nodes,), (r,), (r + 1,), nodes, r)] for r in range(nodes)]


def test_collective_host_tasks_share_a_communicator_iff_they_share_a_group():
    """runtime_tests.cc "collective host_task share MPI a communicator iff they are on the
    same collective_group": two rounds of collective host tasks in the default group and in
    two ``cl.CollectiveGroup()``s, on 2 ranks.  Tasks of one group get the same communicator
    object both times; the three groups' communicators are distinct.  The same case asks
    that groups add no ordering between each other (an order that differs between ranks
    could deadlock user collectives): in the task graph each task depends on the previous
    task of its own group and on nothing of the other groups."""
    order = [("default", None), ("primary", 0), ("secondary", 1)] * 2

    def program(rank):
        q = cl.Queue(record=True)
        groups = [cl.CollectiveGroup(), cl.CollectiveGroup()]
        comms: dict[str, list] = {"default": [], "primary": [], "secondary": []}
        tids: dict[str, list] = {"default": [], "primary": [], "secondary": []}
        for label, g in order:
            def cgf(cgh, label=label, g=g):
                placement = cl.collective if g is None else cl.collective(groups[g])
                cgh.host_task(lambda part: comms[label].append(part.comm), on=placement, name=label)
            q.submit(cgf)
        q.wait()
        tasks = [t for t in task_records(q) if t["kind"] == "collective"]
        for t in tasks:
            tids[t["name"]].append(t["id"])
        deps = {t["id"]: {d["id"] for d in t["deps"]} for t in tasks}
        same = {k: len(v) == 2 and v[0] is v[1] for k, v in comms.items()}
        distinct = len({id(v[0]) for v in comms.values()}) == 3
        chained = {k: tids[k][0] in deps[tids[k][1]] for k in tids}
        crossed = [(a, b) for a in tids for b in tids if a != b
                   for t in tids[a] for u in tids[b] if u in deps[t]]
        return same, distinct, chained, crossed

    for same, distinct, chained, crossed in run_cluster(program, nodes=2, timeout=TIMEOUT):
        assert same == {"default": True, "primary": True, "secondary": True}
        assert distinct
        assert chained == {"default": True, "primary": True, "secondary": True}
        assert crossed == []


# =================================================================================================
# the handler's checks
# =================================================================================================
def test_one_to_one_needs_kernel_and_buffer_of_one_dimensionality():
    """runtime_tests.cc "submitting a kernel with range-mapper dimensionality mismatch in
    accessors throws": a 10x10 buffer through ``one_to_one`` in a 1-D or a 3-D kernel is a
    ``cl.RangeMapperError`` from ``submit`` naming the mapper, the buffer and both
    dimensionalities; in a 2-D kernel it is fine, and ``all()`` suits a 3-D kernel.  The
    rejected submits leave no task behind: the graph holds the two accepted kernels only."""
    def program(rank):
        q = cl.Queue(record=True)
        buf = cl.Buffer(shape=(10, 10), dtype=np.int32, name="grid")
        outcome = {}
        for key, rng, mapper, mode in [("1-D one_to_one", (10,), cl.one_to_one(), cl.discard_write),
                                       ("2-D one_to_one", (10, 10), cl.one_to_one(), cl.discard_write),
                                       ("3-D one_to_one", (10, 10, 10), cl.one_to_one(), cl.discard_write),
                                       ("3-D all", (10, 10, 10), cl.all(), cl.read)]:
            def cgf(cgh, rng=rng, mapper=mapper, mode=mode, key=key):
                buf.access(cgh, mapper, mode)
                cgh.parallel_for(rng, lambda c: None, name=key)
            try:
                q.submit(cgf)
                outcome[key] = None
            except cl.RangeMapperError as exc:
                outcome[key] = str(exc)
        q.wait()
        return outcome, [t["name"] for t in task_records(q) if t["kind"] == "device_compute"]

    ((outcome, kernels),) = run_cluster(program, nodes=1, timeout=TIMEOUT)
    assert outcome["2-D one_to_one"] is None and outcome["3-D all"] is None
    for key, dims in (("1-D one_to_one", 1), ("3-D one_to_one", 3)):
        msg = outcome[key]
        assert msg is not None
        assert "cl.one_to_one()" in msg and 'buffer B0 "grid"' in msg
        assert f"the kernel is {dims}-D and the buffer 2-D" in msg
    assert kernels == ["2-D one_to_one", "3-D all"]


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_kernel_indices_include_the_offset_and_the_global_offset_removes_it(dims):
    """runtime_tests.cc "item::get_id() includes global offset, item::get_linear_id() does
    not" (1, 2 and 3 dims, one device so one chunk): a kernel over range (3, 1, 1) with offset
    (4, 5, 6) sees its indices (``chunk.indices()``, ``chunk.box``) in global coordinates,
    offset included; ``chunk.global_offset`` is that offset, and subtracting it gives the
    offset-free index 0, 1, 2, whose linearization over ``chunk.global_range`` is the item's
    linear id."""
    n = 3
    offset = (4, 5, 6)[:dims]
    rng = (n,) + (1,) * (dims - 1)

    def program(rank):
        q = cl.Queue()
        out = cl.Buffer(shape=(n, dims + 1), dtype=np.int64, name="ids")
        meta = []

        def cgf(cgh):
            w = out.access(cgh, cl.all(), cl.discard_write)

            @cgh.parallel_for(rng, offset=offset, name="ids")
            def kernel(chunk):
                meta.append((chunk.box.min, chunk.global_offset, chunk.global_range))
                ids = [np.asarray(x).ravel() for x in chunk.indices()]
                local = [ids[d] - chunk.global_offset[d] for d in range(dims)]
                linear = np.ravel_multi_index(local, chunk.global_range)
                for k in range(ids[0].size):
                    row = int(local[0][k])
                    for d in range(dims):
                        w[row, d] = int(ids[d][k])
                    w[row, dims] = int(linear[k])

        q.submit(cgf)
        return q.fence(out).result(), meta

    ((ids, meta),) = run_cluster(program, nodes=1, devices=1, timeout=TIMEOUT)
    assert meta == [(offset, offset, rng)]
    for i in range(n):
        assert ids[i, 0] == offset[0] + i
        assert [ids[i, d] for d in range(1, dims)] == list(offset[1:])
        assert ids[i, dims] == i


@pytest.mark.parametrize("shape,ok", [((2,), False), ((1,), True), ((1, 2), False), ((1, 2, 1), False),
                                      ((1, 1), True), ((1, 1, 1), True)])
def test_a_reduction_target_must_hold_exactly_one_element(shape, ok):
    """runtime_tests.cc "attempting a reduction on buffers with size != 1 throws": a
    ``plus`` reduction (from the identity) into a float buffer of shape (2,), (1, 2) or
    (1, 2, 1) is a ``cl.AccessError`` naming the buffer and its shape; into (1,), (1, 1) or
    (1, 1, 1) it is accepted, and a kernel over one item per dimension adding 1.5 leaves
    1.5 in it."""
    def program(rank):
        q = cl.Queue()
        target = cl.Buffer(np.full(shape, 7.0, dtype=np.float32), name="target")

        def cgf(cgh):
            red = cl.reduction(target, cgh, cl.plus, initialize_to_identity=True)
            cgh.parallel_for((1,) * len(shape), lambda c, r: r.combine(1.5), reductions=[red])

        try:
            q.submit(cgf)
        except cl.AccessError as exc:
            return "error", str(exc)
        return "ran", q.fence(target).result().tolist()

    ((what, detail),) = run_cluster(program, nodes=1, timeout=TIMEOUT)
    if ok:
        assert (what, detail) == ("ran", np.full(shape, 1.5).tolist())
    else:
        assert what == "error"
        assert f'buffer B0 "target" of shape {shape}' in detail and "exactly one element" in detail


@pytest.mark.parametrize("global_range,local_range,why", [
    ((256,), (19,), "not a multiple"), ((256,), (0,), "must be positive"),
    ((256, 256), (64, 63), "not a multiple"), ((256, 256), (64, 0), "must be positive"),
    ((256, 256, 256), (2, 64, 9), "not a multiple"), ((256, 256, 256), (2, 1, 0), "must be positive"),
])
def test_a_local_range_must_divide_the_global_range(global_range, local_range, why):
    """runtime_tests.cc "nd_range throws on global_range indivisible by local_range" (1, 2
    and 3 dims, and a zero extent): ``parallel_for(..., local_range=)`` whose work groups
    do not tile the global range, or with a zero extent, is a ``cl.CeleritasError`` from
    ``submit`` naming the kernel, both ranges and what is wrong; the runtime goes on (a
    tiling local range of the same global range runs)."""
    def program(rank):
        q = cl.Queue()
        try:
            q.submit(lambda cgh: cgh.parallel_for(global_range, lambda c: None, local_range=local_range,
                                                  name="grouped"))
            return None
        except cl.CeleritasError as exc:
            msg = str(exc)
        ran = []
        q.submit(lambda cgh: cgh.parallel_for(global_range, lambda c: ran.append(c.range),
                                              local_range=(1,) * len(global_range), name="tiled"))
        q.wait()
        return msg, ran

    ((msg, ran),) = run_cluster(program, nodes=1, timeout=TIMEOUT)
    assert f"parallel_for 'grouped' with global range {global_range}" in msg
    assert f"local_range {local_range}" in msg and why in msg
    assert ran == [global_range]


def _have_opencl_device() -> bool:
    try:
        from executor.backends.opencl import opencl_devices
        opencl_devices()
        return True
    except Exception:  # noqa: BLE001 - no pyopencl, no platform, or no device that builds kernels
        return False


MIRROR = cl.Kernel(source={"opencl": """
__kernel void mirror(CHUNK_PARAMS, ACCESSOR(int, out)) {
    __local int group[32];
    size_t l = get_local_id(0);
    group[l] = (int)GID(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    AT1(out, GID(0)) = group[get_local_size(0) - 1 - l];
}"""}, name="mirror")


@pytest.mark.skipif(not _have_opencl_device(), reason="needs an OpenCL device (PoCL) for work-group local memory")
@pytest.mark.parametrize("nodes", [1, 2])
def test_work_groups_of_a_local_range_share_local_memory(nodes, tmp_path, monkeypatch):
    """runtime_tests.cc "nd_range kernels support local memory": celeritas's Python kernels
    run once per chunk and have no work groups, so the case is restated with a device source
    kernel on the OpenCL backend: 64 items in work groups of 32 each store their global id in
    ``__local`` memory, meet at a barrier and write the id their group's mirror item stored.
    Element i is i // 32 * 32 + 31 - i % 32 on 1 and 2 ranks (chunks are whole groups)."""
    def program(rank):
        q = cl.Queue()
        out = cl.Buffer(shape=(64,), dtype=np.int32, name="out")

        def cgf(cgh):
            w = out.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((64,), MIRROR, args=(w,), local_range=(32,))

        q.submit(cgf)
        return q.fence(out).result()

    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "pocl"))
    i = np.arange(64)
    for res in run_cluster(program, nodes=nodes, timeout=TIMEOUT, CELERITAS_DEVICES="opencl"):
        np.testing.assert_array_equal(res, i // 32 * 32 + 31 - i % 32)


@pytest.mark.parametrize("nodes,devices", [(1, 1), (1, 2), (2, 2)])
def test_a_reduction_in_a_kernel_with_a_local_range(nodes, devices):
    """runtime_tests.cc "reductions can be passed into nd_range kernels": an 8x8 kernel in
    4x4 work groups with a ``plus`` reduction (from the identity) of every item's linear id
    (8 * i + j) gives 0 + 1 + ... + 63 = 2016 on every rank."""
    def program(rank):
        q = cl.Queue()
        total = cl.Buffer(np.full(1, 99, dtype=np.int32), name="sum")

        def cgf(cgh):
            red = cl.reduction(total, cgh, cl.plus, initialize_to_identity=True)

            @cgh.parallel_for((8, 8), local_range=(4, 4), reductions=[red], name="linear_ids")
            def kernel(chunk, r):
                i, j = chunk.indices()
                r.combine((8 * i + j).astype(np.int32))

        q.submit(cgf)
        return int(q.fence(total).result()[0])

    assert run_cluster(program, nodes=nodes, devices=devices, timeout=TIMEOUT) == [2016] * nodes


def test_kernel_names_are_optional():
    """runtime_tests.cc "handler::parallel_for kernel names are optional": plain kernels,
    kernels with a local range, with a reduction, and with both, each submitted once without
    and once with ``name=``, all run.  An unnamed kernel takes its function's name (a lambda:
    ``<lambda>``), a named one its name.  The four reductions (the first from the identity,
    the others adding to it) each add 0 + ... + 63 = 2016: 8064 in all."""
    def program(rank):
        q = cl.Queue(record=True)
        total = cl.Buffer(shape=(1,), dtype=np.int64, name="sum")
        first = [True]

        def add_ids(chunk, r):
            r.combine(chunk.arange(0))

        def submit(kind, name):
            def cgf(cgh):
                local = (32,) if "local" in kind else None
                if "reduction" in kind:
                    red = cl.reduction(total, cgh, cl.plus, initialize_to_identity=first[0])
                    first[0] = False
                    cgh.parallel_for((64,), add_ids, reductions=[red], local_range=local, name=name)
                else:
                    cgh.parallel_for((64,), lambda c: None, local_range=local, name=name)
            q.submit(cgf)

        kinds = ["plain", "local", "reduction", "local reduction"]
        for kind in kinds:
            submit(kind, None)
        for kind in kinds:
            submit(kind, f"named {kind}")
        value = int(q.fence(total).result()[0])
        return value, [t["name"] for t in task_records(q) if t["kind"] == "device_compute"]

    ((value, names),) = run_cluster(program, nodes=1, devices=2, timeout=TIMEOUT)
    assert value == 4 * 2016
    assert names == ["<lambda>", "<lambda>", "add_ids", "add_ids",
                     "named plain", "named local", "named reduction", "named local reduction"]


def test_a_host_object_used_only_for_ordering_need_not_be_touched():
    """runtime_tests.cc "handler does not throw when void side effects are not copied into a
    kernel": a ``cl.HostObject()`` holding nothing, declared as a side effect by two
    master-node host tasks that never use it, is accepted; it orders them (the second has a
    ``side_effect`` dependency on the first) and both run, in that order."""
    def program(rank):
        q = cl.Queue(record=True)
        order_only = cl.HostObject()
        ran: list[str] = []

        for label in ("first", "second"):
            def cgf(cgh, label=label):
                cl.side_effect(order_only, cgh)
                cgh.host_task(lambda part: ran.append(label), on=cl.on_master_node, name=label)
            q.submit(cgf)
        q.wait()
        by_name = {t["name"]: t for t in task_records(q)}
        return order_only.obj, list(ran), by_name["first"]["id"], by_name["second"]["deps"]

    ((obj, ran, first_id, deps),) = run_cluster(program, nodes=1, timeout=TIMEOUT)
    assert obj is None and ran == ["first", "second"]
    assert deps == [{"id": first_id, "kind": "true", "origin": "side_effect"}]


# =================================================================================================
# horizons prune the task graph
# =================================================================================================
def test_tasks_behind_the_horizon_the_executor_reached_are_deleted():
    """runtime_tests.cc "tasks behind the deletion horizon are deleted" (horizon step 2): a
    chain of 1000 master-node host tasks on one 0-D buffer, each flushed and waited for (by
    an event, not ``q.wait()``, which would prune by itself) before the next is submitted.
    The task manager never holds more than two horizon steps of host tasks after the
    effective epoch, the two horizons and the step being built: at most 8 live tasks; and
    every host task ran, in order."""
    chain = 1000
    step = 2
    limit = (2 + 1) * step + 2

    def program(rank):
        q = cl.Queue()
        tm = q.runtime.task_manager
        buf = cl.Buffer(np.array(42, dtype=np.int32), name="token")
        done: list[int] = []
        cond = threading.Condition()
        most = 0
        for i in range(chain):
            def cgf(cgh, i=i):
                acc = buf.access(cgh, cl.all(), cl.read_write)

                def task(part):
                    acc[()] = acc[()]
                    with cond:
                        done.append(i)
                        cond.notify_all()

                cgh.host_task(task, on=cl.on_master_node)
            q.submit(cgf)
            q.flush()
            with cond:
                if not cond.wait_for(lambda i=i: done and done[-1] == i, timeout=20):
                    raise AssertionError(f"host task {i} did not run")
            most = max(most, len(tm.tasks))
        return most, done == list(range(chain))

    ((most, in_order),) = run_cluster(program, nodes=1, timeout=TIMEOUT, CELERITAS_HORIZON_STEP=str(step))
    assert in_order
    assert most <= limit


# =================================================================================================
# host objects
# =================================================================================================
def test_side_effects_on_owned_referenced_and_empty_host_objects():
    """runtime_tests.cc "side_effect API works as expected on a single node": three host
    objects, one owning a new list, one wrapping a list the program keeps (the object is that
    very list, not a copy), one holding nothing.  Two master-node host tasks append 1, then 2
    to both lists (declaring all three objects); a third sees the owned list as [1, 2].  After
    ``q.wait()`` the program's own list is [1, 2]."""
    def program(rank):
        q = cl.Queue()
        owned = cl.HostObject([])
        exterior: list[int] = []
        referenced = cl.HostObject(exterior)
        empty = cl.HostObject()
        checked = []

        for value in (1, 2):
            def append(cgh, value=value):
                mine = cl.side_effect(owned, cgh)
                theirs = cl.side_effect(referenced, cgh)
                cl.side_effect(empty, cgh)

                def task(part):
                    mine.append(value)
                    theirs.append(value)

                cgh.host_task(task, on=cl.on_master_node)
            q.submit(append)

        def check(cgh):
            mine = cl.side_effect(owned, cgh)
            cgh.host_task(lambda part: checked.append(list(mine)), on=cl.on_master_node)

        q.submit(check)
        q.wait()
        return checked, list(exterior), referenced.obj is exterior, empty.obj

    assert run_cluster(program, nodes=1, timeout=TIMEOUT) == [([[1, 2]], [1, 2], True, None)]


# =================================================================================================
# dry runs
# =================================================================================================
@pytest.mark.parametrize("nodes", [4, 8, 16])
def test_a_dry_run_builds_rank_0s_commands_for_any_number_of_ranks(nodes):
    """runtime_tests.cc "dry run generates commands for an arbitrary number of simulated
    worker nodes" (horizon step 2, one device): a master-node host task writes a buffer of 10,
    a host task over range 2N reads all of it.  As rank 0 of N, the command graph is exactly:
    the init epoch, the master-node execution, one push of the whole buffer to each of the
    N - 1 other ranks, the execution of rank 0's chunk [0, 2) and one horizon; and no host
    task ran."""
    def program(rank):
        q = cl.Queue(record=True)
        buf = cl.Buffer(shape=(10,), dtype=np.int32, name="buf")
        ran = []

        def produce(cgh):
            buf.access(cgh, cl.all(), cl.discard_write)
            cgh.host_task(lambda part: ran.append("produce"), on=cl.on_master_node)

        def consume(cgh):
            buf.access(cgh, cl.all(), cl.read)
            cgh.host_task(lambda part: ran.append("consume"), range=(2 * nodes,))

        q.submit(produce)
        q.submit(consume)
        q.flush()
        commands = q.graphs()["commands"][0]
        return q.rank, q.num_ranks, commands, ran

    ((rank, num_ranks, commands, ran),) = run_cluster(program, nodes=1, devices=1, timeout=TIMEOUT,
                                                      CELERITAS_DRY_RUN_NODES=str(nodes),
                                                      CELERITAS_HORIZON_STEP="2")
    assert (rank, num_ranks, ran) == (0, nodes, [])
    assert [c["kind"] for c in commands] == ["epoch", "execution", "push", "execution", "horizon"]
    push = commands[2]
    assert push["targets"] == [{"rank": r, "region": [[[0], [10]]]} for r in range(1, nodes)]
    assert commands[3]["box"] == [[0], [2]]


def test_a_dry_run_resolves_fences_without_running_tasks(caplog):
    """runtime_tests.cc "dry run proceeds on fences" (one simulated rank): a master-node host
    task that would set a 0-D bool buffer and a host object to True never runs, yet fences
    of both resolve at once.  What they hold is celeritas's (the dry-run executor's): zeros
    of the fenced shape for the buffer, here False, and a copy of the host object as it was
    made, False.  Each fence logs a warning that fenced data is not real, as Celerity's
    does."""
    def program(rank):
        q = cl.Queue()
        flag = cl.Buffer(np.array(False), name="flag")
        obj = cl.HostObject(False)
        ran = []

        def set_buffer(cgh):
            w = flag.access(cgh, cl.all(), cl.write)

            def task(part):
                ran.append("buffer")
                w[()] = True

            cgh.host_task(task, on=cl.on_master_node)

        def set_object(cgh):
            cl.side_effect(obj, cgh)
            cgh.host_task(lambda part: ran.append("object"), on=cl.on_master_node)

        q.submit(set_buffer)
        f1 = q.fence(flag)
        q.submit(set_object)
        f2 = q.fence(obj)
        got = f1.result(timeout=5), f2.result(timeout=5)
        return got, ran

    caplog.set_level(logging.WARNING)
    (((flag, obj), ran),) = run_cluster(program, nodes=1, timeout=TIMEOUT, CELERITAS_DRY_RUN_NODES="1")
    assert flag.shape == () and flag.dtype == np.bool_ and not flag
    assert obj is False
    assert ran == []
    assert len(warnings_matching(caplog, "q.fence() in a dry run (CELERITAS_DRY_RUN_NODES)")) == 2


def test_a_dry_run_processes_horizons():
    """runtime_tests.cc "dry run processes horizons" (horizon step 1, lookahead none): two
    master-node host tasks each close a horizon; although nothing runs, the dry run reaches
    them, so without any ``wait()`` the application's count of tasks past the newest reached
    horizon or epoch (``tasks_ahead``) drops to 0 (the init epoch, two host tasks and two
    horizons were submitted), and neither host task ran."""
    def program(rank):
        q = cl.Queue()
        q.set_lookahead("none")
        rt = q.runtime
        ran = []
        for label in ("a", "b"):
            q.submit(lambda cgh, label=label: cgh.host_task(lambda part: ran.append(label), on=cl.on_master_node))
        submitted = rt.task_manager.next_task_id
        deadline = time.monotonic() + 10
        while rt.tasks_ahead > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        return submitted, rt.tasks_ahead, ran

    assert run_cluster(program, nodes=1, timeout=TIMEOUT, CELERITAS_DRY_RUN_NODES="1",
                       CELERITAS_HORIZON_STEP="1") == [(5, 0, [])]


# =================================================================================================
# configuration
# =================================================================================================
@pytest.mark.parametrize("level", ["debug", "info", "error"])
def test_the_configuration_reads_the_environment(level, tmp_path):
    """runtime_tests.cc "Config reads environment variables correctly": the log level, the
    dry-run node count, the graph-dump folder, the trace file and the summary / record flags
    are read as given (Celerity's profiling and Tracy switches have no counterpart; the
    summary is celeritas's profiling report)."""
    env = {"CELERITAS_LOG_LEVEL": level, "CELERITAS_DRY_RUN_NODES": "4",
           "CELERITAS_PRINT_GRAPHS": str(tmp_path / "graphs"), "CELERITAS_TRACE": str(tmp_path / "t.json"),
           "CELERITAS_SUMMARY": "1", "CELERITAS_RECORD": "true"}
    cfg = from_env(env)
    assert cfg.log_level == level
    assert cfg.dry_run_nodes == 4
    assert cfg.print_graphs == str(tmp_path / "graphs")
    assert cfg.trace == str(tmp_path / "t.json")
    assert cfg.summary is True and cfg.record is True
    assert summary.enabled(cfg)
    unset = from_env({})
    assert (unset.log_level, unset.dry_run_nodes, unset.print_graphs, unset.summary) == ("warning", None, None, False)


@pytest.mark.parametrize("var", ["CELERITAS_LOG_LEVEL", "CELERITAS_DEVICES", "CELERITAS_DRY_RUN_NODES",
                                 "CELERITAS_SUMMARY", "CELERITAS_RECORD", "CELERITAS_ACCESSOR_CHECKS",
                                 "CELERITAS_LOOKAHEAD", "CELERITAS_DIAGNOSTICS", "CELERITAS_HORIZON_STEP"])
def test_an_invalid_environment_value_is_a_config_error_naming_it(var):
    """runtime_tests.cc "config reports incorrect environment varibles": the value "a" for the
    log level, the devices, the dry-run node count, a boolean switch (Celerity's profiling
    flags; here summary, record, accessor checks) and the other choices is a
    ``cl.ConfigError`` (also a ``ValueError``) whose message names the variable and the
    value.  (test_errors.py::test_bad_environment_values pins other values through
    ``cl.Queue()``; this pins the non-numeric, non-choice value of Celerity's case.)"""
    with pytest.raises(cl.ConfigError) as info:
        from_env({var: "a"})
    assert isinstance(info.value, ValueError)
    assert f"{var}='a'" in str(info.value)


# =================================================================================================
# fences
# =================================================================================================
@pytest.mark.parametrize("nodes,devices", [(1, 1), (1, 2), (2, 2)])
def test_fences_of_subranges_of_a_buffer_written_by_a_kernel(nodes, devices):
    """runtime_tests.cc "fences extract data from buffers": a kernel writes each element's
    linear id into a 4x4 buffer (on the devices of every rank); fences in turn of the
    subrange at (0, 3) of extent (1, 1), of the one at (2, 2) of extent (2, 1) and of the
    whole buffer hold [[3]], [[10], [14]] and 0..15 in the shape fenced, on every rank."""
    def program(rank):
        q = cl.Queue()
        buf = cl.Buffer(shape=(4, 4), dtype=np.int32, name="ids")

        def cgf(cgh):
            w = buf.access(cgh, cl.one_to_one(), cl.discard_write)

            @cgh.parallel_for((4, 4), name="linear_ids")
            def kernel(chunk):
                i, j = chunk.indices()
                w[chunk] = 4 * i + j

        q.submit(cgf)
        one = q.fence(buf, cl.Subrange((0, 3), (1, 1))).result()
        column = q.fence(buf, cl.Subrange((2, 2), (2, 1))).result()
        whole = q.fence(buf, cl.Subrange((0, 0), (4, 4))).result()
        return one.tolist(), column.tolist(), whole.tolist()

    for one, column, whole in run_cluster(program, nodes=nodes, devices=devices, timeout=TIMEOUT):
        assert one == [[3]]
        assert column == [[10], [14]]
        assert whole == np.arange(16).reshape(4, 4).tolist()


def test_a_fence_of_a_0d_buffer():
    """runtime_tests.cc "fences extract data from 0-dimensional buffers": a 0-D kernel
    writes 42 into an uninitialized 0-D int buffer (``no_init``); its fence is a 0-D array
    holding 42."""
    def program(rank):
        q = cl.Queue()
        buf = cl.Buffer(shape=(), dtype=np.int32, name="scalar")

        def cgf(cgh):
            w = buf.access(cgh, cl.all(), cl.write, no_init=True)
            cgh.parallel_for((), lambda c: w.__setitem__((), 42), name="answer")

        q.submit(cgf)
        return q.fence(buf).result()

    (value,) = run_cluster(program, nodes=1, timeout=TIMEOUT)
    assert value.shape == () and value == 42


@pytest.mark.parametrize("nodes", [1, 2])
def test_0d_kernels_and_host_tasks_write_0d_buffers(nodes):
    """runtime_tests.cc "0-dimensional kernels work as expected": three 0-D buffers holding
    13.37 are overwritten with 42.0 by a 0-D ``parallel_for``, a 0-D ``parallel_for`` with a
    0-D local range and a host task over the 0-D range; a master-node host task then reads
    42.0 from all three, and every rank's fences agree."""
    a_value, b_value = np.float32(13.37), np.float32(42.0)

    def program(rank):
        q = cl.Queue()
        bufs = [cl.Buffer(np.array(a_value), name=n) for n in ("a", "b", "c")]
        seen = cl.HostObject([])

        def write(buf, how):
            def cgf(cgh):
                w = buf.access(cgh, cl.all(), cl.write, no_init=True)
                if how == "kernel":
                    cgh.parallel_for((), lambda c: w.__setitem__((), b_value))
                elif how == "nd kernel":
                    cgh.parallel_for((), lambda c: w.__setitem__((), b_value), local_range=())
                else:
                    cgh.host_task(lambda part: w.__setitem__((), b_value), range=())
            return cgf

        for buf, how in zip(bufs, ("kernel", "nd kernel", "host task")):
            q.submit(write(buf, how))

        def check(cgh):
            rs = [b.access(cgh, cl.all(), cl.read) for b in bufs]
            out = cl.side_effect(seen, cgh)
            cgh.host_task(lambda part: out.append([float(r[()]) for r in rs]), on=cl.on_master_node)

        q.submit(check)
        return q.fence(seen).result(), [float(q.fence(b).result()) for b in bufs]

    results = run_cluster(program, nodes=nodes, timeout=TIMEOUT)
    assert results[0] == ([[42.0] * 3], [42.0] * 3)
    assert all(r == ([], [42.0] * 3) for r in results[1:])


# =================================================================================================
# diagnostics
# =================================================================================================
@pytest.mark.parametrize("diagnostics", ["warn", "off"])
@pytest.mark.parametrize("where,mode", [("kernel", "read"), ("kernel", "write"),
                                        ("host task", "read"), ("host task", "write")])
def test_uninitialized_reads_are_reported_iff_diagnostics_are_on(caplog, diagnostics, where, mode):
    """runtime_tests.cc "runtime warns on uninitialized reads iff access pattern diagnostics
    are enabled" (its four sections): a kernel or a master-node host task declaring a
    ``read`` or a ``write`` access (``write`` consumes: it brings the region up to date
    first) of ``all()`` of a never-written buffer of 1 logs one warning naming the task, the
    region [0, 1), the buffer and "uninitialized read" under ``CELERITAS_DIAGNOSTICS=warn``,
    and nothing under ``off``; for the ``write`` case it also suggests ``no_init``, as
    Celerity's does."""
    def program(rank):
        q = cl.Queue()
        buf = cl.Buffer(shape=(1,), dtype=np.int32, name="fresh")

        def cgf(cgh):
            buf.access(cgh, cl.all(), cl.read if mode == "read" else cl.write)
            if where == "kernel":
                cgh.parallel_for((1,), lambda c: None, name="probe")
            else:
                cgh.host_task(lambda part: None, on=cl.on_master_node, name="probe")

        q.submit(cgf)
        q.wait()

    caplog.set_level(logging.WARNING)
    run_cluster(program, nodes=1, timeout=TIMEOUT, CELERITAS_DIAGNOSTICS=diagnostics)
    found = warnings_matching(caplog, "uninitialized read")
    if diagnostics == "off":
        assert found == []
    else:
        hint = ("; a write or read_write access keeps what the task does not write: declare it with "
                "no_init=True if the task overwrites all of it") if mode == "write" else ""
        assert found == [('T1 "probe" reads Region([[0], [1]]) of buffer B0 "fresh", which has never been '
                          'written (uninitialized read)' + hint)]


@pytest.mark.parametrize("diagnostics", ["warn", "off"])
def test_overlapping_writes_of_two_devices_are_reported_iff_diagnostics_are_on(caplog, diagnostics):
    """runtime_tests.cc "runtime logs errors on overlapping writes between instructions iff
    access pattern diagnostics are enabled": on one rank with 2 devices, a kernel over 2 items
    whose chunks both write ``all()`` of a buffer of 1 logs one warning naming the kernel, the
    element, the buffer and both devices under ``warn`` (Celerity logs it as an error; the
    ``error`` policy, raising ``cl.DiagnosticError``, is pinned by test_celerity_cases.py),
    and nothing under ``off``."""
    def program(rank):
        q = cl.Queue()
        buf = cl.Buffer(shape=(1,), dtype=np.int32, name="shared")

        def cgf(cgh):
            buf.access(cgh, cl.all(), cl.discard_write)
            cgh.parallel_for((q.num_devices,), lambda c: None, name="both_write")

        q.submit(cgf)
        q.wait()
        return q.num_devices

    caplog.set_level(logging.WARNING)
    assert run_cluster(program, nodes=1, devices=2, timeout=TIMEOUT, CELERITAS_DIAGNOSTICS=diagnostics) == [2]
    found = warnings_matching(caplog, "overlapping writes")
    if diagnostics == "off":
        assert found == []
    else:
        assert found == [('T1 "both_write" writes Region([[0], [1]]) of buffer B0 "shared" from the chunks of '
                          'devices 0 and 1 of rank 0 (overlapping writes)')]


# =================================================================================================
# runtime calls from where they cannot work
# =================================================================================================
@pytest.mark.parametrize("where", ["kernel", "host task"])
def test_submit_wait_and_fences_from_inside_a_task_are_refused_on_a_simulated_rank(where):
    """runtime_tests.cc "runtime types throw when used from the wrong thread", the part that
    applies: celeritas checks for no single application thread, but it refuses calls from
    inside its own kernels and host tasks, which would wait for themselves.  Under ``run_cluster`` (2 devices), ``q.submit``, ``q.wait``, a fence of a
    buffer and a fence of a host object called inside a kernel or a host task each raise a
    ``cl.CeleritasError`` naming the call and the task; the runtime goes on.
    (test_errors.py pins the same for the process runtime, without the host-object fence.)"""
    calls = {
        "q.submit()": lambda q, b, h: q.submit(lambda cgh: cgh.host_task(lambda p: None)),
        "q.wait()": lambda q, b, h: q.wait(),
        "q.fence() of a buffer": lambda q, b, h: q.fence(b),
        "q.fence() of a host object": lambda q, b, h: q.fence(h),
    }

    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.zeros(2), name="b")
        h = cl.HostObject(42)
        outcome: dict[str, str] = {}
        lock = threading.Lock()

        def body(*_):
            for label, call in calls.items():
                try:
                    call(q, b, h)
                    result = "accepted"
                except cl.CeleritasError as exc:
                    result = str(exc)
                with lock:
                    outcome.setdefault(label, result)

        def cgf(cgh):
            if where == "kernel":
                cgh.parallel_for((2,), body, name="nested")
            else:
                cgh.host_task(body, on=cl.on_master_node, name="nested")

        q.submit(cgf)
        q.wait()
        return outcome, q.fence(h).result()

    ((outcome, h),) = run_cluster(program, nodes=1, devices=2, timeout=TIMEOUT)
    assert h == 42
    assert set(outcome) == set(calls)
    for label, msg in outcome.items():
        call = label.split(" ")[0]
        assert f"{call} inside {where} 'nested'" in msg and "cannot submit, wait, fence" in msg, (label, msg)


def test_making_runtime_objects_inside_a_host_task_of_a_simulated_rank_is_refused():
    """runtime_tests.cc "runtime types throw when used from the wrong thread", the
    constructors: docs/api.md lists ``cl.Buffer`` and ``cl.HostObject`` called inside a
    kernel or host task as a ``cl.CeleritasError``, and ``run_cluster`` promises what holds
    under ``mpiexec`` holds there.  Inside a master-node host task of a simulated rank, both
    must raise naming the call and the task, and nothing made there (``cl.Queue()``
    included) may start a second runtime beside the rank's.  (Before, the lane thread had no
    rank context, so these calls reached the process runtime and started one.)"""
    def program(rank):
        q = cl.Queue()
        outcome: dict[str, str] = {}

        def task(part):
            for label, make in (("cl.Buffer()", lambda: cl.Buffer(np.zeros(1))),
                                ("cl.HostObject()", lambda: cl.HostObject([])),
                                ("cl.Queue()", lambda: cl.Queue())):
                try:
                    made = make()
                    outcome[label] = ("made" if not isinstance(made, cl.Queue) else
                                      "the rank's runtime" if made.runtime is q.runtime else "another runtime")
                except cl.CeleritasError as exc:
                    outcome[label] = str(exc)

        q.submit(lambda cgh: cgh.host_task(task, on=cl.on_master_node, name="maker"))
        q.wait()
        return outcome

    try:
        (outcome,) = run_cluster(program, nodes=1, timeout=TIMEOUT)
        stray = not no_process_runtime()
    finally:
        shut_down_stray_process_runtime()
    assert not stray, "a process-level runtime was started from inside the rank's host task"
    for label in ("cl.Buffer()", "cl.HostObject()"):
        assert f"{label} inside host task 'maker'" in outcome[label], outcome
    assert outcome["cl.Queue()"] == "the rank's runtime" or "inside host task 'maker'" in outcome["cl.Queue()"]


def test_a_buffer_keeps_its_own_copy_and_destroying_it_does_not_wait_for_its_tasks():
    """runtime_tests.cc "buffers constructed from a user pointer synchronize on destruction":
    Celerity must block a buffer's destruction until the tasks reading the user's memory are
    done.  celeritas copies host data when the buffer is made (docs/api.md), so the user's
    array may change at once and ``destroy()`` need not wait: a host task reading the buffer
    is held (by an event) while the program overwrites its array and destroys the buffer;
    ``destroy()`` returns while the task still runs, and the task, once released, reads the
    42 the buffer was made with."""
    def program(rank):
        q = cl.Queue()
        data = np.array([42], dtype=np.int32)
        buf = cl.Buffer(data, name="from_user")
        data[0] = -1
        started, release = threading.Event(), threading.Event()
        seen: list[int] = []

        def cgf(cgh):
            r = buf.access(cgh, cl.all(), cl.read)

            def task(part):
                started.set()
                release.wait(20)
                seen.append(int(r[0]))

            cgh.host_task(task, on=cl.once, name="slow_reader")

        q.submit(cgf)
        q.flush()
        running = started.wait(20)
        buf.destroy()
        returned_before_task_finished = not seen
        release.set()
        q.wait()
        return running, returned_before_task_finished, seen

    assert run_cluster(program, nodes=1, timeout=TIMEOUT) == [(True, True, [42])]


# =================================================================================================
# lookahead
# =================================================================================================
@pytest.mark.parametrize("mode", ["none", "auto", "infinite"])
def test_the_lookahead_setting_comes_from_the_environment(mode):
    """runtime_tests.cc "runtime applies lookahead setting from environment": with
    ``CELERITAS_LOOKAHEAD`` set, the scheduler runs in that mode, and it shows in the graph
    (BEHAVIOURS.md 10): discard-writes of [0, 128) then of [64, 256) of a buffer of 256 make
    two device allocations and one resize copy of [0, 64) under ``none``, and one allocation
    of [0, 256) and no copy under ``auto`` and ``infinite``."""
    def program(rank):
        q = cl.Queue(record=True)
        mode_seen = q.runtime.scheduler.lookahead.mode
        buf = cl.Buffer(shape=(256,), dtype=np.float32, name="b")
        for lo, hi in ((0, 128), (64, 256)):
            def cgf(cgh, lo=lo, hi=hi):
                w = buf.access(cgh, cl.fixed(cl.Subrange((lo,), (hi - lo,))), cl.discard_write)
                cgh.parallel_for((1,), lambda c: w.__setitem__(slice(lo, hi), 1.0))
            q.submit(cgf)
        q.wait()
        allocs = [(i["box"], i["memory"]) for i in instruction_records(q, "alloc") if i["buffer"] == buf.id]
        copies = [i["box"] for i in instruction_records(q, "copy") if i["buffer"] == buf.id]
        return q.runtime.config.lookahead, mode_seen, allocs, copies

    ((configured, running, allocs, copies),) = run_cluster(program, nodes=1, devices=1, timeout=TIMEOUT,
                                                            CELERITAS_LOOKAHEAD=mode)
    assert configured == running == mode
    if mode == "none":
        assert allocs == [([[0], [128]], 2), ([[0], [256]], 2)]
        assert copies == [[[0], [64]]]
    else:
        assert allocs == [([[0], [256]], 2)]
        assert copies == []


@pytest.mark.parametrize("mode", ["none", "auto", "infinite"])
def test_lookahead_gives_a_growing_access_pattern_a_single_allocation(caplog, mode):
    """runtime_tests.cc "lookahead ensures that a single allocation is used for a growing
    access pattern": 20 steps, step i discard-writing element i of two buffers (so that
    their allocations interleave), record the address of the element they write.  Under
    ``auto`` and ``infinite`` the 20 addresses are consecutive (one allocation per buffer, of
    all 20 elements, on the device) and nothing warns; under ``none`` every step allocates
    anew (20 device allocations per buffer), the addresses are not consecutive, and a
    warning per buffer says its pattern grows and names lookahead as the remedy."""
    n = 20

    def program(rank):
        q = cl.Queue(record=True)
        q.set_lookahead(mode)
        pointers = cl.Buffer(shape=(n,), dtype=np.uint64, name="pointers")
        dummy = cl.Buffer(shape=(n,), dtype=np.uint64, name="dummy")
        for i in range(n):
            def cgf(cgh, i=i):
                p = pointers.access(cgh, cl.fixed(cl.Subrange((i,), (1,))), cl.discard_write)
                d = dummy.access(cgh, cl.fixed(cl.Subrange((i,), (1,))), cl.discard_write)

                def kernel(chunk):
                    p[i] = p.array.ctypes.data + (i - p.offset[0]) * p.array.itemsize
                    d[i] = 0

                cgh.parallel_for((1,), kernel, name=f"step{i}")
            q.submit(cgf)
        addresses = q.fence(pointers).result().astype(np.int64)
        device_allocs = {b.id: sorted(tuple(i["box"][0]) + tuple(i["box"][1])
                                      for i in instruction_records(q, "alloc")
                                      if i["buffer"] == b.id and i["memory"] >= 2)
                         for b in (pointers, dummy)}
        return addresses, device_allocs

    caplog.set_level(logging.WARNING)
    ((addresses, device_allocs),) = run_cluster(program, nodes=1, devices=1, timeout=TIMEOUT)
    consecutive = bool((np.diff(addresses) == 8).all())
    warned = warnings_matching(caplog, "its access pattern grows")
    if mode == "none":
        assert not consecutive
        assert all(boxes == [(i, i + 1) for i in range(n)] for boxes in device_allocs.values())
        assert sorted(w.split(" was allocated")[0] for w in warned) == ['buffer B0 "pointers"', 'buffer B1 "dummy"']
        assert all("lookahead 'auto' or 'infinite' allocates once" in w for w in warned)
    else:
        assert consecutive
        assert all(boxes == [(0, n)] for boxes in device_allocs.values())
        assert warned == []


# =================================================================================================
# executor starvation
# =================================================================================================
@pytest.mark.parametrize("held", [True, False])
def test_the_summary_measures_executor_idle_and_starvation(held):
    """runtime_tests.cc "runtime prints a warning when executor starvation time is high":
    with ``CELERITAS_SUMMARY=1``, a host task that runs 100 ms is submitted and the program
    sleeps 35 ms before it flushes; with ``held`` the lookahead is ``infinite``, so the task
    is held back all that while, else ``none``.  As in Celerity, commands held by lookahead
    count as a busy scheduler: with ``held`` the executor starves for at least 30 ms of the
    135 ms run and the summary warns (above 20 %); without, it starves for at most the
    microseconds the scheduler compiles and does not.  Starvation is never more than the
    executor's idle time nor than the scheduler's busy time.  (Before, only compiling
    counted, and neither run warned.)"""
    def program(rank):
        q = cl.Queue()
        q.set_lookahead("infinite" if held else "none")
        buf = cl.Buffer(shape=(1,), dtype=np.int32, name="out")

        def cgf(cgh):
            w = buf.access(cgh, cl.all(), cl.discard_write)

            def task(part):
                w[0] = 42
                time.sleep(0.1)

            cgh.host_task(task, on=cl.once, name="slow")

        q.submit(cgf)
        time.sleep(0.035)
        q.flush()
        rt = q.runtime
        value = int(q.fence(buf).result()[0])
        q.shutdown()
        numbers = summary.rank_numbers(rt.outputs())
        return value, numbers, summary.combine([numbers])["starvation_warning"]

    ((value, numbers, warning),) = run_cluster(program, nodes=1, timeout=TIMEOUT, CELERITAS_SUMMARY="1")
    assert value == 42
    assert numbers["window_ns"] >= 100e6
    assert 0 <= numbers["starvation_ns"] <= min(numbers["idle_ns"], numbers["scheduler_busy_ns"])
    if held:
        assert numbers["idle_ns"] >= 30e6 and numbers["starvation_ns"] >= 30e6
        assert warning is True
    else:
        assert numbers["starvation_ns"] < 10e6 and warning is False
