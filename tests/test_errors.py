"""Every bad input raises its specific cl.*Error; failures never hang."""
import threading

import numpy as np
import pytest

import celeritas as cl
from celeritas.testing import run_cluster

pytestmark = pytest.mark.timeout(120)


def _no_runtime_threads_left():
    names = [t.name for t in threading.enumerate() if t.name.startswith(("celeritas-scheduler", "celeritas-executor"))]
    return not any(t.is_alive() for t in threading.enumerate() if t.name in names)


def test_kernel_error_surfaces_at_wait_with_task_kernel_rank_chunk():
    q = cl.Queue()
    b = cl.Buffer(np.zeros(8, np.float32))

    def cgf(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.read_write)

        @cgh.parallel_for((8,), name="explodes")
        def k(chunk):
            raise ValueError("boom")

    q.submit(cgf)
    with pytest.raises(cl.KernelError) as ei:
        q.wait()
    msg = str(ei.value)
    assert "explodes" in msg and "rank 0" in msg and "boom" in msg and "T" in msg and "Box" in msg
    assert isinstance(ei.value.__cause__, ValueError)
    # the runtime is down; nothing keeps running, and the next queue starts fresh
    assert _no_runtime_threads_left()
    q2 = cl.Queue()
    b2 = cl.Buffer(np.ones(4, np.float32))
    np.testing.assert_array_equal(q2.fence(b2).result(), np.ones(4))
    q2.shutdown()


def test_kernel_error_surfaces_at_fence_result():
    q = cl.Queue()
    b = cl.Buffer(np.zeros(8, np.float32))

    def cgf(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.host_task(lambda part: 1 / 0, range=(8,), name="divides")

    q.submit(cgf)
    with pytest.raises(cl.KernelError, match="divides"):
        q.fence(b).result(timeout=30)
    # (the fence raised it: shutdown returns quietly, as after wait(); every later call raises it)
    q.shutdown()
    with pytest.raises(cl.KernelError, match="divides"):
        q.wait()


def test_shutdown_raises_a_failure_that_nothing_raised_yet():
    q = cl.Queue()
    b = cl.Buffer(np.zeros(8, np.float32))

    def cgf(cgh):
        b.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.host_task(lambda part: 1 / 0, range=(8,), name="divides")

    q.submit(cgf)
    with pytest.raises(cl.KernelError, match="divides"):
        q.shutdown()
    q.shutdown()   # (raised once: quiet after)


@pytest.mark.parametrize("target", ["buffer", "host_object"])
def test_a_failure_while_a_fence_is_being_submitted_resolves_its_future(target):
    """The scheduler thread may fail (an overlapping write under ``error``) after ``fence``
    checked the runtime is alive and before its future is tracked: the future must still
    get the error, or ``result()`` blocks forever (a fuzzer-found hang)."""
    q = cl.Queue()
    rt = q._rt
    obj = cl.Buffer(np.zeros(4, np.float32)) if target == "buffer" else cl.HostObject({"n": 1})
    submit_fence = rt.task_manager.fence

    def fence_then_fail(**kwargs):
        task = submit_fence(**kwargs)
        rt._fail(cl.CeleritasError("injected: the scheduler failed right now"))
        return task

    rt.task_manager.fence = fence_then_fail
    fut = q.fence(obj)
    with pytest.raises(cl.CeleritasError, match="injected"):
        fut.result(timeout=30)
    with pytest.raises(cl.CeleritasError, match="injected"):
        q.fence(obj)                    # and a later fence raises at once
    q.shutdown()                        # the error was shown: not raised a third time
    assert _no_runtime_threads_left()


def test_a_fence_outstanding_when_the_queue_is_left_by_an_exception_gets_an_error():
    """Leaving ``with cl.Queue()`` by an exception aborts the runtime; a fence still
    waiting for its task then resolves with an error instead of blocking forever."""
    gate = threading.Event()
    b = None
    with pytest.raises(KeyError):
        with cl.Queue() as q:
            b = cl.Buffer(np.zeros(4, np.float32))

            def slow(cgh):
                b.access(cgh, cl.all(), cl.discard_write)
                cgh.host_task(lambda part: gate.wait(30), name="slow")

            q.submit(slow)
            fut = q.fence(b)
            raise KeyError("the application failed")
    gate.set()
    # (the executor fails the fences it holds; the runtime those not yet handed over)
    with pytest.raises(cl.CeleritasError, match=r"rank 0: the (executor|runtime was) stopped before fence T\d+"):
        fut.result(timeout=30)
    assert _no_runtime_threads_left()


def test_kernel_error_on_one_simulated_rank_ends_all_ranks():
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.zeros(16, np.float32))

        def cgf(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)

            @cgh.parallel_for((16,), name="fails_on_rank_1")
            def k(chunk):
                if chunk.box.min[0] >= 8:
                    raise RuntimeError("rank 1 fails")
                w[chunk] = 1

        q.submit(cgf)

        def reader(cgh):
            r = b.access(cgh, cl.all(), cl.read)
            cgh.host_task(lambda p: None, range=(16,))

        q.submit(reader)
        q.wait()

    with pytest.raises(cl.CeleritasError, match="fails_on_rank_1"):
        run_cluster(program, nodes=2, timeout=60)


def test_mapper_with_wrong_dimensionality():
    q = cl.Queue()
    b = cl.Buffer(shape=(4, 4), dtype=np.float32)

    def cgf(cgh):
        b.access(cgh, lambda chunk, shape: cl.Subrange((0,), (4,)), cl.discard_write)
        cgh.parallel_for((4, 4), lambda chunk: None)

    with pytest.raises(cl.RangeMapperError, match="1-D subrange for a 2-D buffer"):
        q.submit(cgf)
    q.shutdown()


def test_one_to_one_on_other_dimensionality():
    q = cl.Queue()
    b = cl.Buffer(shape=(16,), dtype=np.float32)

    def cgf(cgh):
        b.access(cgh, cl.one_to_one(), cl.discard_write)
        cgh.parallel_for((4, 4), lambda chunk: None)

    with pytest.raises(cl.RangeMapperError, match="one_to_one"):
        q.submit(cgf)
    q.shutdown()


def test_access_outside_mapped_region_with_checks(monkeypatch):
    monkeypatch.setenv("CELERITAS_ACCESSOR_CHECKS", "1")
    q = cl.Queue(devices="host:2")
    b = cl.Buffer(np.arange(16, dtype=np.float32))
    out = cl.Buffer(shape=(16,), dtype=np.float32)

    def cgf(cgh):
        r = b.access(cgh, cl.one_to_one(), cl.read)
        w = out.access(cgh, cl.one_to_one(), cl.discard_write)

        @cgh.parallel_for((16,), name="reads_neighbour")
        def k(chunk):
            lo, hi = chunk.box.min[0], chunk.box.max[0]
            w[chunk] = r[max(lo - 1, 0):hi - 1 if lo else hi]   # the second chunk reads one element too low

    q.submit(cgf)
    with pytest.raises(cl.AccessError, match="outside what its range mapper grants"):
        q.wait()


def test_write_through_read_accessor(monkeypatch):
    q = cl.Queue()
    b = cl.Buffer(np.arange(4, dtype=np.float32))

    def cgf(cgh):
        r = b.access(cgh, cl.one_to_one(), cl.read)

        @cgh.parallel_for((4,), name="writes_read_only")
        def k(chunk):
            r[chunk] = 0

    q.submit(cgf)
    with pytest.raises(cl.AccessError, match="read-only"):
        q.wait()


def test_reduction_into_buffer_of_more_than_one_element():
    q = cl.Queue()
    b = cl.Buffer(shape=(4,), dtype=np.float32)

    def cgf(cgh):
        cl.reduction(b, cgh, cl.plus)

    with pytest.raises(cl.AccessError, match="exactly one element"):
        q.submit(cgf)
    q.shutdown()


def test_overlapping_writes_under_error_policy(monkeypatch):
    monkeypatch.setenv("CELERITAS_DIAGNOSTICS", "error")

    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(shape=(8,), dtype=np.float32)

        def cgf(cgh):
            w = b.access(cgh, cl.all(), cl.discard_write)
            cgh.parallel_for((8,), lambda chunk: None, name="all_write_all")

        q.submit(cgf)
        q.wait()

    with pytest.raises(cl.DiagnosticError, match="overlapping writes"):
        run_cluster(program, nodes=2, timeout=60)


def test_uninitialized_read_under_error_policy(monkeypatch):
    monkeypatch.setenv("CELERITAS_DIAGNOSTICS", "error")
    q = cl.Queue()
    b = cl.Buffer(shape=(8,), dtype=np.float32, name="fresh")

    def cgf(cgh):
        b.access(cgh, cl.all(), cl.read)
        cgh.parallel_for((8,), lambda chunk: None)

    with pytest.raises(cl.DiagnosticError, match="fresh"):
        q.submit(cgf)
    q.shutdown()


@pytest.mark.parametrize("var,value", [
    ("CELERITAS_DEVICES", "gpu:3"), ("CELERITAS_DEVICES", "host:0"), ("CELERITAS_LOOKAHEAD", "sometimes"),
    ("CELERITAS_HORIZON_STEP", "0"), ("CELERITAS_HORIZON_MAX_PARALLELISM", "x"),
    ("CELERITAS_DRY_RUN_NODES", "-1"), ("CELERITAS_RECORD", "maybe"), ("CELERITAS_DIAGNOSTICS", "loud"),
    ("CELERITAS_ACCESSOR_CHECKS", "2"), ("CELERITAS_LOG_LEVEL", "verbose"),
    ("CELERITAS_MPI_DEVICE_MEMORY", "sometimes"), ("CELERITAS_GC", "never"), ("CELERITAS_HOST_ALLOCATOR", "big"),
    ("CELERITAS_HUGE_PAGES", "big"), ("CELERITAS_HUGE_PAGES", "-1"),
    ("CELERITAS_INLINE_US", "fast"), ("CELERITAS_INLINE_US", "-5"), ("CELERITAS_PAUSE_AHEAD", "many"),
])
def test_bad_environment_values(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(cl.ConfigError, match=var):
        cl.Queue()


def test_bad_queue_arguments():
    with pytest.raises(cl.ConfigError, match="lookahead"):
        cl.Queue(lookahead="eventually")


@pytest.mark.parametrize("kwargs,match", [
    (dict(data=np.zeros((2, 2)), shape=(4,)), "does not match shape"),
    (dict(data=np.zeros(3, dtype=np.float64), dtype=np.int8), "cannot be stored"),
    (dict(shape=(2, 2, 2, 2)), "0 to 3 dimensions"),
    (dict(data=np.array(["a", "b"])), "not supported"),
    (dict(), "needs data or a shape"),
])
def test_bad_buffer_construction(kwargs, match):
    q = cl.Queue()
    with pytest.raises(cl.BufferError, match=match):
        cl.Buffer(**kwargs)
    q.shutdown()


def test_records_need_record_mode():
    q = cl.Queue()
    with pytest.raises(cl.CeleritasError, match="record=True"):
        q.graphs()
    q.shutdown()


def test_fence_subrange_outside_buffer():
    q = cl.Queue()
    b = cl.Buffer(np.zeros(4))
    with pytest.raises(cl.CeleritasError, match="not inside buffer"):
        q.fence(b, cl.Subrange((2,), (4,)))
    q.shutdown()


def test_fence_takes_a_region_of_one_box_and_names_what_else_it_got():
    """A region of one box is that box; before, any cl.Region (and any other object) failed
    with "Subrange.__init__() missing 1 required positional argument"."""
    q = cl.Queue()
    try:
        b = cl.Buffer(np.arange(16).reshape(4, 4), name="b")
        assert q.fence(b, cl.Region([cl.Box((1, 1), (3, 3))])).result().tolist() == [[5, 6], [9, 10]]
        assert q.fence(b, ((0, 0), (2, 2))).result().tolist() == [[0, 1], [4, 5]]
        with pytest.raises(cl.CeleritasError, match=r'fence of buffer B0 "b": a fence returns one array, so it '
                                                    r'takes a cl.Subrange or cl.Box, not a region of 2 boxes'):
            q.fence(b, cl.Region([cl.Box((0, 0), (1, 1)), cl.Box((2, 2), (3, 3))]))
        with pytest.raises(cl.CeleritasError, match=r"the subrange is a cl.Subrange, a cl.Box or an \(offset, "
                                                    r"range\) pair, got 5"):
            q.fence(b, 5)
        with pytest.raises(cl.GeometryError, match="negative extent"):
            q.fence(b, ((0, 0), (2, -1)))
        assert q.fence(b).result().sum() == 120
    finally:
        q.shutdown()


def test_two_kernels_in_one_command_group():
    q = cl.Queue()

    def cgf(cgh):
        cgh.parallel_for((1,), lambda c: None)
        cgh.parallel_for((1,), lambda c: None)

    with pytest.raises(cl.CeleritasError, match="exactly one"):
        q.submit(cgf)
    q.shutdown()


def test_buffer_larger_than_device_memory_runs_in_batches(monkeypatch):
    monkeypatch.setenv("CELERITAS_HOST_DEVICE_MEMORY", str(64 * 1024))
    q = cl.Queue(devices="host:1")
    big = cl.Buffer(np.arange(1 << 16, dtype=np.float32), name="big")  # 256 KiB > 64 KiB

    def cgf(cgh):
        w = big.access(cgh, cl.one_to_one(), cl.read_write)

        @cgh.parallel_for(big.shape)
        def kernel(chunk):
            w[chunk] = w[chunk] * 2 + 1

    q.submit(cgf)
    np.testing.assert_array_equal(q.fence(big).result(), np.arange(1 << 16, dtype=np.float32) * 2 + 1)
    q.shutdown()


def test_out_of_memory_names_task_buffers_bytes_and_capacity(monkeypatch):
    """A chunk that no split can make fit (an all() read of a buffer larger than the device)."""
    monkeypatch.setenv("CELERITAS_HOST_DEVICE_MEMORY", str(64 * 1024))
    q = cl.Queue(devices="host:1")
    big = cl.Buffer(np.ones(1 << 16, np.float32), name="big")        # 256 KiB
    out = cl.Buffer(shape=(8,), dtype=np.float32, name="out")

    def cgf(cgh):
        r = big.access(cgh, cl.all(), cl.read)
        w = out.access(cgh, cl.one_to_one(), cl.discard_write)
        cgh.parallel_for((8,), lambda chunk: None, name="reads_everything")

    q.submit(cgf)
    with pytest.raises(cl.OutOfMemoryError) as ei:
        q.wait()
    msg = str(ei.value)
    assert "reads_everything" in msg and '"big"' in msg and '"out"' in msg
    assert str(64 * 1024) in msg and str((1 << 16) * 4 + 4) in msg   # capacity, bytes of one row


def test_an_allocation_the_backend_refuses_names_the_buffer_and_the_box():
    """800 TB is beyond any machine's address space, so the host backend's allocation fails
    at execution time; the error named only the instruction ("alloc I1") before."""
    q = cl.Queue(devices="host:1")
    huge = cl.Buffer(shape=(10**7, 10**7), dtype=np.float64, name="huge")

    def cgf(cgh):
        huge.access(cgh, cl.one_to_one(), cl.discard_write)
        cgh.parallel_for((10**7, 10**7), lambda chunk: None, name="fill")

    q.submit(cgf)
    with pytest.raises(cl.OutOfMemoryError,
                       match=r'rank 0: out of memory for alloc I\d+ of buffer B\d+ "huge" '
                             r'Box\(\[0, 0\], \[10000000, 10000000\]\): cannot allocate 800000000000000 bytes'):
        q.wait()
    q.shutdown()      # (the error was shown: shutdown only winds down)


_FAILING_SCRIPT = """
import numpy as np
import celeritas as cl

q = cl.Queue()
b = cl.Buffer(np.zeros(8, np.float32), name="b")


def cgf(cgh):
    w = b.access(cgh, cl.one_to_one(), cl.read_write)

    @cgh.parallel_for((8,), name="explodes")
    def kernel(chunk):
        w[chunk] = 1 / 0


q.submit(cgf)
{sync}
"""


@pytest.mark.parametrize("sync", ["q.wait()", "print(q.fence(b).result())", "q.shutdown()", "pass"])
def test_a_failing_kernel_is_reported_exactly_once(tmp_path, sync):
    """Once, where it surfaces (wait, fence result, explicit shutdown, or the shutdown at
    exit when the program never synchronized): no log line from the executor, no second
    report from the shutdown at exit."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    script = tmp_path / "fails.py"
    script.write_text(_FAILING_SCRIPT.format(sync=sync))
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERITAS_")}
    env["PYTHONPATH"] = str(root)
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    message = "kernel 'explodes' of task T1 failed on rank 0, chunk Box([0], [8]), device 0: " \
              "ZeroDivisionError: division by zero"
    assert r.stderr.count(message) == 1, r.stderr
    assert r.stderr.count("ZeroDivisionError: division by zero") == 2, r.stderr   # + the cause's own line
    assert "w[chunk] = 1 / 0" in r.stderr, r.stderr                               # the user's line
    assert r.returncode == 1, r.stderr    # (also when it surfaced only at the shutdown at exit)


def test_destroyed_buffer_is_named_when_used_again():
    q = cl.Queue()
    b = cl.Buffer(np.zeros(8, np.float32), name="gone")
    s = cl.Buffer(np.zeros(1, np.float32))
    b.destroy()

    def cgf(cgh):
        b.access(cgh, cl.all(), cl.read)
        cgh.parallel_for((8,), lambda chunk: None)
    with pytest.raises(cl.AccessError, match='buffer B0 "gone" was destroyed'):
        q.submit(cgf)
    with pytest.raises(cl.AccessError, match='"gone" was destroyed'):
        q.fence(b)
    s.destroy()

    def red(cgh):
        cl.reduction(s, cgh, cl.plus)
        cgh.parallel_for((8,), lambda chunk, r: None)
    with pytest.raises(cl.AccessError, match="B1 was destroyed"):
        q.submit(red)
    q.shutdown()


def test_task_graph_names_a_destroyed_buffer():
    """Below the user API too (a mapper kept from before the destroy): an error naming the
    buffer, not a KeyError from the dependency tracking."""
    from scheduler import task_graph as tg
    from scheduler.geometry import Region
    tm = tg.TaskManager()
    tm.create_buffer(0, (8,), np.float32, "gone", True)
    tm.destroy_buffer(0)
    acc = tg.BufferAccess(0, tg.READ, lambda box, shape: Region.from_box(box))
    with pytest.raises(cl.RangeMapperError, match='buffer B0 "gone", which was destroyed'):
        tm.submit(tg.DEVICE_COMPUTE, name="k", geometry=tg.TaskGeometry(1, (8,), (0,), (1,)), accesses=[acc])


def _item_mapper(item: int):
    """Row ``item`` for the chunk whose offset is ``item``, nothing otherwise: for item 1
    the whole range (offset 0) maps to nothing, although rank 1's chunk reads row 1."""
    def mapper(chunk, shape):
        if chunk.offset[0] == item:
            return cl.Subrange((item, 0), (1, shape[1]))
        return cl.Subrange((0, 0), (0, shape[1]))
    return mapper


def _mapper_program(mapper_of):
    """Rank 1's chunk of a 2-item host task reads row 1 through ``mapper_of(1)``; returns
    what each rank read."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(8.0).reshape(2, 4), name="rows")
        seen = []

        def cgf(cgh):
            r = b.access(cgh, mapper_of(1), cl.read)

            def task(part):
                if part.box.min[0] <= 1 < part.box.max[0]:
                    seen.append(r[1:2, 0:4].copy())
            cgh.host_task(task, range=(2,), name="reads_row_1")
        q.submit(cgf)
        q.wait()
        q.shutdown()
        return seen
    return program


def test_a_mapper_whose_chunks_exceed_the_whole_range_is_a_diagnostic(monkeypatch):
    monkeypatch.setenv("CELERITAS_DIAGNOSTICS", "error")
    with pytest.raises(cl.DiagnosticError, match=r'T\d+ "reads_row_1".*buffer B\d+ "rows".*rank 1.*whole range'):
        run_cluster(_mapper_program(_item_mapper), nodes=2, timeout=60)


def test_a_mapper_whose_chunks_exceed_the_whole_range_warns_once_and_still_runs(caplog):
    import logging
    with caplog.at_level(logging.WARNING, logger="celeritas"):
        got = run_cluster(_mapper_program(_item_mapper), nodes=2, timeout=60)
    assert [len(g) for g in got] == [0, 1] and got[1][0].tolist() == [[4.0, 5.0, 6.0, 7.0]]
    msgs = [r.getMessage() for r in caplog.records if "whole range" in r.getMessage()]
    assert len(msgs) == 1 and "reads_row_1" in msgs[0] and "rows" in msgs[0]


def test_a_mapper_that_tests_whether_the_chunk_holds_the_item_is_fine(monkeypatch):
    monkeypatch.setenv("CELERITAS_DIAGNOSTICS", "error")

    def holds(item):
        def mapper(chunk, shape):
            if chunk.offset[0] <= item < chunk.offset[0] + chunk.range[0]:
                return cl.Subrange((item, 0), (1, shape[1]))
            return cl.Subrange((0, 0), (0, shape[1]))
        return mapper
    got = run_cluster(_mapper_program(holds), nodes=2, timeout=60)
    assert got[1][0].tolist() == [[4.0, 5.0, 6.0, 7.0]]


def _device_chunk_program(mapper, reads: int = 1):
    """T0 writes src (4 rows, one_to_one: on 2 ranks rank 1 writes rows 2-3), T1 (8 items)
    reads src through ``mapper``: the chunk at offset 2 is device 1's chunk [2, 4) of
    rank 0's [0, 4) on 2 ranks × host:2, and of [0, 8) on one rank × host:4.  Returns
    what that chunk read of row 2."""
    def program(rank):
        q = cl.Queue()
        src = cl.Buffer(np.zeros(4, dtype=np.int64), name="src")
        out = cl.Buffer(np.zeros(8, dtype=np.int64), name="out")
        seen = []

        def write(cgh):
            w = src.access(cgh, cl.one_to_one(), cl.discard_write)

            def kernel(chunk):
                w[chunk.box] = 100 + np.arange(chunk.offset[0], chunk.offset[0] + chunk.range[0])
            cgh.parallel_for((4,), kernel, name="writer")
        q.submit(write)

        def read(cgh):
            r = src.access(cgh, mapper, cl.read)
            o = out.access(cgh, cl.one_to_one(), cl.discard_write)

            def kernel(chunk):
                if chunk.offset[0] == 2:
                    seen.append(int(r[2:3][0]))
                o[chunk.box] = 0
            cgh.parallel_for((8,), kernel, name="reads_row_2")
        for _ in range(reads):
            q.submit(read)
        q.wait()
        q.shutdown()
        return seen
    return program


def _offset_is_2(chunk, shape):
    """Meant: "the chunk holds row 2"; written: "the chunk starts at row 2"."""
    if chunk.offset[0] == 2:
        return cl.Subrange((2,), (1,))
    return cl.Subrange((0,), (0,))


@pytest.mark.parametrize("diagnostics", ["off", "warn", "error"])
def test_a_mapper_whose_device_chunk_exceeds_the_ranks_chunk_fails_on_several_ranks(diagnostics):
    """Rank 0's chunk [0, 4) maps to nothing, so no rank sends it row 2, but its device
    chunk [2, 4) maps row 2 (written by rank 1): it read the initial 0 instead of 102,
    silently, under every diagnostics setting.  The command graph's check compares rank
    chunks with the whole range only; the instruction graph compares its device chunks
    with the rank's chunk, and on several ranks that is an error whatever the setting."""
    with pytest.raises(cl.RangeMapperError,
                       match=r'T\d+ "reads_row_2".*buffer B\d+ "src".*device 1\'s chunk.*rank 0.*never arrived'):
        run_cluster(_device_chunk_program(_offset_is_2), nodes=2, timeout=60, CELERITAS_DEVICES="host:2",
                    CELERITAS_DIAGNOSTICS=diagnostics)


def test_a_mapper_whose_device_chunk_exceeds_the_ranks_chunk_on_one_rank(monkeypatch, caplog):
    """On one rank every access is local and the data right (102): a diagnostic, an error
    under ``error``, else a warning once per task name and buffer."""
    import logging
    monkeypatch.setenv("CELERITAS_DEVICES", "host:4")
    with caplog.at_level(logging.WARNING, logger="celeritas"):
        got = _device_chunk_program(_offset_is_2, reads=3)(0)
    assert got == [102, 102, 102]
    msgs = [r.getMessage() for r in caplog.records if "rank's chunk" in r.getMessage()]
    assert len(msgs) == 1 and all('"reads_row_2"' in m and '"src"' in m and "device 1" in m for m in msgs), msgs
    monkeypatch.setenv("CELERITAS_DIAGNOSTICS", "error")
    with pytest.raises(cl.DiagnosticError, match=r'"reads_row_2".*"src".*device 1\'s chunk.*rank 0'):
        _device_chunk_program(_offset_is_2)(0)


def test_a_mapper_that_tests_whether_a_device_chunk_holds_the_item_is_fine():
    def holds_2(chunk, shape):
        if chunk.offset[0] <= 2 < chunk.offset[0] + chunk.range[0]:
            return cl.Subrange((2,), (1,))
        return cl.Subrange((0,), (0,))
    got = run_cluster(_device_chunk_program(holds_2), nodes=2, timeout=60, CELERITAS_DEVICES="host:2",
                      CELERITAS_DIAGNOSTICS="error")
    assert got == [[102], []]


# ---- bad arguments found by probing the API: each a clear cl.*Error, never a bare TypeError,
# ---- a silent truncation or numpy's complaint from inside a kernel

@pytest.mark.parametrize("make", [
    lambda: cl.Subrange((0,), (1, 2)),
    lambda: cl.Subrange(("a",), (1,)),
    lambda: cl.Subrange((0.5,), (2,)),
    lambda: cl.Subrange((0, 0, 0, 0), (1, 1, 1, 1)),
    lambda: cl.Subrange((0, 0), (2, -1)),          # (accepted before, as an empty subrange)
    lambda: cl.Box((0,), (1, 2)),
    lambda: cl.Box(5, 6),
    lambda: cl.Box((0.5,), (2,)),
    lambda: cl.Region([5]),
])
def test_bad_geometry_raises_geometry_error_which_is_also_value_and_type_error(make):
    with pytest.raises(cl.GeometryError) as ei:
        make()
    assert isinstance(ei.value, cl.CeleritasError)
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, TypeError)


def test_geometry_accepts_numpy_integers():
    s = cl.Subrange((np.int64(1),), (np.int32(3),))
    assert s.offset == (1,) and s.range == (3,) and type(s.offset[0]) is int
    assert cl.Box((np.int64(0), 1), (2, np.int16(3))).max == (2, 3)


def test_buffer_shape_must_be_integers_not_truncated():
    with pytest.raises(cl.BufferError, match=r"shape \(2\.5,\)"):
        cl.Buffer(shape=(2.5,), dtype=np.float32)
    with pytest.raises(cl.BufferError, match="shape"):
        cl.Buffer(shape="ab", dtype=np.float32)
    with pytest.raises(cl.BufferError, match=r"shape \(4\.0,\) must be a sequence of integers"):
        cl.Buffer(np.zeros(4), shape=(4.0,))
    assert cl.Buffer(shape=(np.int64(3),), dtype=np.float32).shape == (3,)


@pytest.mark.parametrize("rng, what", [("abc", "global range 'abc'"), (None, "global range None"),
                                       ((2.5,), r"global range \(2\.5,\)")])
def test_parallel_for_range_must_be_integers(rng, what):
    q = cl.Queue()
    with pytest.raises(cl.CeleritasError, match=what):
        q.submit(lambda cgh: cgh.parallel_for(rng, lambda c: None))
    with pytest.raises(cl.CeleritasError, match=r"offset \(0\.5,\)"):
        q.submit(lambda cgh: cgh.parallel_for((4,), lambda c: None, offset=(0.5,)))
    q.wait()   # the queue still works
    q.shutdown()


def test_constrain_split_with_more_dimensions_than_the_range_is_an_error():
    q = cl.Queue()

    def cgf(cgh):
        cl.constrain_split(cgh, (2, 2))
        cgh.parallel_for((4,), lambda c: None, name="one_d")

    with pytest.raises(cl.CeleritasError, match=r"granularity \(2, 2\).*1-D range \(4,\) of 'one_d'"):
        q.submit(cgf)
    with pytest.raises(cl.CeleritasError, match="granularity"):
        q.submit(lambda cgh: (cl.constrain_split(cgh, "x"), cgh.parallel_for((4,), lambda c: None)))
    q.shutdown()


def test_fence_of_a_host_object_with_a_subrange_is_an_error():
    q = cl.Queue()
    h = cl.HostObject([1])
    with pytest.raises(cl.CeleritasError, match="host object H.*applies to buffers only"):
        q.fence(h, cl.Subrange((0,), (1,)))
    assert q.fence(h).result() == [1]
    q.shutdown()


@pytest.mark.parametrize("dtype, identity, ok", [
    (np.float64, "x", False), (np.float64, [0.0, 1.0], False), (np.int32, np.inf, False),
    (np.uint8, -1, False), (np.uint8, 0, True), (np.uint8, 255, True), (np.uint8, 256, False),
    (np.float32, np.float64(0.0), True), (np.float32, 0, True), (np.int64, np.int32(5), True),
    (np.bool_, True, True), (np.int32, 1.5, False),
])
def test_reduction_identity_must_cast_same_kind_into_the_target(dtype, identity, ok):
    q = cl.Queue()
    t = cl.Buffer(np.zeros(1, dtype), name="target")

    def cgf(cgh):
        r = cl.reduction(t, cgh, cl.maximum, identity=identity, initialize_to_identity=True)
        cgh.parallel_for((4,), lambda c, red: red.combine(np.arange(c.offset[0], c.offset[0] + c.range[0]).astype(dtype)),
                         reductions=[r])

    if ok:
        q.submit(cgf)
        assert q.fence(t).result()[0] == max(np.asarray(identity).astype(dtype), np.asarray(3).astype(dtype))
    else:
        with pytest.raises(cl.CeleritasError, match=r'reduction into buffer B\d+ "target": identity'):
            q.submit(cgf)
    q.shutdown()


@pytest.mark.parametrize("checks", ["0", "1"])
@pytest.mark.parametrize("dims", [1, 2])
def test_indexing_a_chunk_that_holds_none_of_the_buffer_is_an_access_error(monkeypatch, checks, dims):
    """A one_to_one kernel range larger than the buffer: the chunks past the buffer hold
    none of it.  Indexing there is an AccessError naming the buffer (with accessor checks
    on or off), not numpy's TypeError about a missing array."""
    monkeypatch.setenv("CELERITAS_ACCESSOR_CHECKS", checks)
    q = cl.Queue(devices="host:2")
    shape = (4,) if dims == 1 else (4, 4)
    b = cl.Buffer(np.zeros(shape), name="small")

    def cgf(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.read_write)

        @cgh.parallel_for((8,) + shape[1:], name="too_wide")
        def k(c):
            w[c] = 1

    q.submit(cgf)
    with pytest.raises(cl.AccessError, match=r'buffer B\d+ "small"') as ei:
        q.wait()
    assert "too_wide" in str(ei.value)


@pytest.mark.parametrize("body, call", [
    (lambda q, b: q.wait(), r"q\.wait\(\)"),
    (lambda q, b: q.submit(lambda cgh: cgh.parallel_for((1,), lambda c: None)), r"q\.submit\(\)"),
    (lambda q, b: q.fence(b), r"q\.fence\(\)"),
    (lambda q, b: cl.Buffer(np.zeros(2)), r"cl\.Buffer\(\)"),
    (lambda q, b: cl.HostObject([]), r"cl\.HostObject\(\)"),
])
@pytest.mark.parametrize("where", ["kernel", "host task"])
def test_submit_wait_or_fence_inside_a_task_is_an_error_not_a_hang(body, call, where):
    """q.wait() or a fence's result inside a kernel waited for the kernel itself (a hang);
    a submit from a kernel made the task stream depend on timing."""
    q = cl.Queue(devices="host:2")
    b = cl.Buffer(np.zeros(4), name="b")

    def cgf(cgh):
        if where == "kernel":
            cgh.parallel_for((4,), lambda c: body(q, b), name="nested")
        else:
            cgh.host_task(lambda p: body(q, b), on=cl.on_master_node, name="nested")

    q.submit(cgf)
    with pytest.raises(cl.CeleritasError, match=call + f" inside {where} 'nested'.*cannot submit, wait"):
        q.wait()
    assert _no_runtime_threads_left()


def test_after_a_task_the_application_thread_may_submit_again():
    """The marker is per thread and cleared after every launch (host:1 runs kernels inline on
    the executor thread, a lane per device otherwise)."""
    for devices in ("host:1", "host:3"):
        q = cl.Queue(devices=devices)
        b = cl.Buffer(np.zeros(6), name="b")
        for _ in range(3):
            def cgf(cgh):
                w = b.access(cgh, cl.one_to_one(), cl.read_write)
                cgh.parallel_for((6,), lambda c: w.__setitem__(c, w[c] + 1))
            q.submit(cgf)
            q.wait()
        np.testing.assert_array_equal(q.fence(b).result(), np.full(6, 3.0))
        q.shutdown()


def test_destroyed_host_object_cannot_be_fenced_or_used():
    q = cl.Queue()
    h = cl.HostObject([1])
    h.destroy()
    with pytest.raises(cl.AccessError, match=r"host object H\d+ was destroyed"):
        q.fence(h)
    with pytest.raises(cl.AccessError, match=r"host object H\d+ was destroyed"):
        q.submit(lambda cgh: (cl.side_effect(h, cgh), cgh.host_task(lambda p: None, on=cl.on_master_node)))
    q.wait()
    q.shutdown()


def test_reduction_target_cannot_be_reduced_twice_or_also_accessed():
    """As Celerity's task manager: one reduction per target and task, and a target is not
    also accessed through an accessor in that task."""
    q = cl.Queue()
    t = cl.Buffer(np.zeros(1), name="t")
    with pytest.raises(cl.AccessError, match=r"kernel 'twice': more than one reduction writes buffer B\d+ \"t\""):
        q.submit(lambda cgh: cgh.parallel_for((4,), lambda c, r1, r2: None, name="twice",
                                              reductions=[cl.reduction(t, cgh, cl.plus), cl.reduction(t, cgh, cl.plus)]))
    with pytest.raises(cl.AccessError, match=r"kernel 'both': buffer B\d+ \"t\" is both accessed"):
        q.submit(lambda cgh: (t.access(cgh, cl.all(), cl.read),
                              cgh.parallel_for((4,), lambda c, r: None, name="both",
                                               reductions=[cl.reduction(t, cgh, cl.plus)])))
    q.wait()
    q.shutdown()


def test_a_reducer_kept_past_its_kernel_cannot_combine():
    q = cl.Queue()
    t = cl.Buffer(np.zeros(1), name="t")
    kept = []

    def k(c, r):
        r.combine(1.0)
        kept.append(r)

    q.submit(lambda cgh: cgh.parallel_for((4,), k, reductions=[cl.reduction(t, cgh, cl.plus,
                                                                            initialize_to_identity=True)]))
    assert q.fence(t).result()[0] == 1.0 * len(kept)
    with pytest.raises(cl.AccessError, match=r"reducer of buffer B\d+ \"t\" used outside its kernel"):
        kept[0].combine(5.0)
    q.shutdown()


@pytest.mark.parametrize("make, match", [
    (lambda: cl.Kernel(source=5, name="k"), "cl.Kernel needs source"),
    (lambda: cl.Kernel(source={"opencl": "x"}, name="not an identifier"), "name must be the entry point"),
    (lambda: cl.even_split("x"), "granularity must be an integer"),
    (lambda: cl.even_split(0), "granularity must be >= 1"),
    (lambda: cl.slice("x"), "dimension must be an integer"),
    (lambda: cl.neighborhood(1.5), "extent must be an integer"),
])
def test_bad_kernel_and_mapper_arguments(make, match):
    with pytest.raises(cl.CeleritasError, match=match):
        make()


def test_buffer_name_none_clears_it():
    q = cl.Queue()
    b = cl.Buffer(np.zeros(2), name="x")
    b.name = None
    assert b.name == "" and '"' not in b.label
    q.shutdown()


def test_a_buffer_of_a_shut_down_runtime_says_so_not_that_it_was_destroyed():
    q = cl.Queue()
    b = cl.Buffer(np.zeros(4), name="old")
    h = cl.HostObject([])
    q.shutdown()
    q2 = cl.Queue()
    with pytest.raises(cl.AccessError, match=r'buffer B\d+ "old" belongs to a runtime that was shut down'):
        q2.fence(b)
    with pytest.raises(cl.AccessError, match=r"host object H\d+ belongs to a runtime that was shut down"):
        q2.fence(h)
    q2.shutdown()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_a_kernel_raising_keyboard_interrupt_or_system_exit_is_a_kernel_error(exc):
    """Not 'internal error': the kernel raised it, so the message names the kernel."""
    q = cl.Queue(devices="host:2")

    def k(c):
        raise exc(3)

    q.submit(lambda cgh: cgh.parallel_for((4,), k, name="quits"))
    with pytest.raises(cl.KernelError, match=rf"kernel 'quits' of task T\d+ failed on rank 0.*{exc.__name__}"):
        q.wait()


@pytest.mark.parametrize("var, value, match", [
    ("CELERITAS_PRINT_GRAPHS", "/proc/celeritas_no_such_folder", "CELERITAS_PRINT_GRAPHS: cannot create the folder"),
    ("CELERITAS_TRACE", "{file}/trace.json", "CELERITAS_TRACE: cannot create the folder"),
])
def test_an_unwritable_output_path_is_a_config_error_at_start_not_a_log_at_shutdown(
        monkeypatch, tmp_path, var, value, match):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    monkeypatch.setenv(var, value.format(file=a_file))
    with pytest.raises(cl.ConfigError, match=match):
        cl.Queue()
    monkeypatch.delenv(var)
    q = cl.Queue()      # nothing was left half-started
    q.wait()
    q.shutdown()


def test_host_device_memory_bounds_the_default_devices_too(monkeypatch):
    """Without a GPU the default devices are host:1; CELERITAS_HOST_DEVICE_MEMORY held only
    when CELERITAS_DEVICES named host:N, so the same program ran unbounded by default."""
    monkeypatch.delenv("CELERITAS_DEVICES", raising=False)
    monkeypatch.setenv("CELERITAS_HOST_DEVICE_MEMORY", str(64 * 1024))
    q = cl.Queue()
    if q.runtime.backend_name != "host":
        q.shutdown()
        pytest.skip("the default devices here are GPUs")
    big = cl.Buffer(np.arange(1 << 16, dtype=np.float32), name="big")

    def cgf(cgh):
        w = big.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for(big.shape, lambda chunk: w.__setitem__(chunk, w[chunk] * 2 + 1))

    q.submit(cgf)
    np.testing.assert_array_equal(q.fence(big).result(), np.arange(1 << 16, dtype=np.float32) * 2 + 1)
    assert q.runtime.scheduler.igg.memory_stats["batches"] > 0
    q.submit(lambda cgh: (big.access(cgh, cl.all(), cl.read), cgh.parallel_for((4,), lambda c: None, name="reads_all")))
    with pytest.raises(cl.OutOfMemoryError, match=r"reads_all.*capacity is 65536 bytes"):
        q.wait()


@pytest.mark.parametrize("devices", [2, ("host", 2), 2.0])
def test_queue_devices_that_are_not_a_string_are_a_config_error(devices):
    """Found by the fuzzer: an int reached the runtime and failed with AttributeError."""
    with pytest.raises(cl.ConfigError, match=r"devices=.* is not a device list; use a string such as 'host:2'"):
        cl.Queue(devices=devices)
    q = cl.Queue(devices="host:2")
    assert q.num_devices == 2
    q.shutdown()


@pytest.mark.parametrize("value, match", [
    ("1.5", r"CELERITAS_DEVICE_MEMORY_LIMIT='1.5': a fraction of the device memory must be in \(0, 1\]"),
    ("x", r"CELERITAS_DEVICE_MEMORY_LIMIT='x' is neither a number of bytes"),
    ("0", r"CELERITAS_DEVICE_MEMORY_LIMIT='0' must be at least 1 byte"),
])
def test_device_memory_limit_messages_say_what_is_wrong(monkeypatch, value, match):
    """Found by the fuzzer: 1.5 got the generic 'neither bytes nor a fraction' message."""
    monkeypatch.setenv("CELERITAS_DEVICE_MEMORY_LIMIT", value)
    with pytest.raises(cl.ConfigError, match=match):
        cl.Queue()


def _declare(kind: str, a, s, h, saved: dict):
    """A command group function that misuses the handler in the way ``kind`` names."""
    def cgf(cgh):
        if kind == "access_none":
            a.access(None, cl.one_to_one(), cl.read)
        elif kind == "reduction_none":
            cl.reduction(s, None, cl.plus)
        elif kind == "side_effect_none":
            cl.side_effect(h, None)
        elif kind == "hint_none":
            cl.hint(None, cl.split_2d())
        elif kind == "constrain_none":
            cl.constrain_split(None, 2)
        elif kind == "access_old_cgh":
            a.access(saved["cgh"], cl.all(), cl.read)
        elif kind == "parallel_for_old_cgh":
            saved["cgh"].parallel_for((8,), lambda c: None)
            return
        elif kind == "reduction_not_buffer":
            cl.reduction(np.zeros(1), cgh, cl.plus)
        cgh.parallel_for((8,), lambda c: None)
    return cgf


@pytest.mark.parametrize("kind, match", [
    ("access_none", r'Buffer.access of buffer B0 "a" takes the command group handler \(the cgh argument of the '
                    r'command group function\) as its cgh, got NoneType'),
    ("reduction_none", r"cl.reduction takes the command group handler .* got NoneType"),
    ("side_effect_none", r"cl.side_effect takes the command group handler .* got NoneType"),
    ("hint_none", r"cl.hint takes the command group handler .* got NoneType"),
    ("constrain_none", r"cl.constrain_split takes the command group handler .* got NoneType"),
    ("access_old_cgh", r'Buffer.access of buffer B0 "a": this cgh belongs to a command group that was already '
                       r'submitted'),
    ("parallel_for_old_cgh", r"this cgh belongs to a command group that was already submitted"),
    ("reduction_not_buffer", r"cl.reduction takes a cl.Buffer as its target, got ndarray"),
])
def test_a_handler_that_is_not_the_current_one_is_an_error(kind, match):
    """None failed with AttributeError deep inside, and the cgh of an earlier submit took an
    access silently: the task being submitted then ran without it (a lost dependency)."""
    q = cl.Queue(devices="host:1")
    try:
        a = cl.Buffer(np.arange(8, dtype=np.float32), name="a")
        s = cl.Buffer(np.zeros(1, np.float32), name="s")
        h = cl.HostObject([])
        saved: dict = {}

        def first(cgh):
            saved["cgh"] = cgh
            cgh.parallel_for((8,), lambda c: None)
        q.submit(first)
        with pytest.raises(cl.CeleritasError, match=match):
            q.submit(_declare(kind, a, s, h, saved))
        q.submit(_declare("fine", a, s, h, saved))     # the runtime goes on
        assert q.fence(a).result().tolist() == list(range(8))
    finally:
        q.shutdown()


@pytest.mark.parametrize("cgf, error, match", [
    (5, cl.CeleritasError, r"q.submit takes a command group function cgf\(cgh\), got int"),
    (lambda cgh: cgh.host_task(lambda p: None, range=(8,), on=cl.once), cl.CeleritasError,
     r"host_task\(on=cl.once\) runs once; range=\(8,\) would be ignored"),
    (lambda cgh: cgh.host_task(lambda p: None, range=(8,), on=cl.collective), cl.CeleritasError,
     r"host_task\(on=cl.collective\) runs once per rank; range=\(8,\) would be ignored"),
    (lambda cgh: cgh.parallel_for((8,), lambda c: None, name=5), cl.CeleritasError,
     r"a kernel's or host task's name= is a str, got int 5"),
    (lambda cgh: cgh.host_task(lambda p: None, on=cl.collective("g")), cl.CeleritasError,
     r"cl.collective\(group\) takes a cl.CollectiveGroup\(\), got str"),      # (was AttributeError: 'id')
    (lambda cgh: cgh.host_task(lambda p: None, on=cl.on_master_node()), cl.CeleritasError,
     r"cl.on_master_node is a placement, not a function: write on=cl.on_master_node"),   # (was TypeError)
    (lambda cgh: cgh.host_task(lambda p: None, on=cl.once()), cl.CeleritasError,
     r"cl.once is a placement, not a function"),
    ("no_init_read", cl.AccessError, r'buffer B0 "a": no_init=True discards the old contents, which a cl.read '
                                     r'access reads'),
    ("side_effect_kernel", cl.CeleritasError, r"kernel 'k': cl.side_effect orders host tasks only"),
])
def test_command_group_misuse_is_a_clear_error(cgf, error, match):
    """Each was accepted silently (range ignored, no_init meaningless, a side effect that
    orders nothing on a device) or failed with a bare TypeError/AttributeError."""
    q = cl.Queue(devices="host:1")
    try:
        a = cl.Buffer(np.arange(8, dtype=np.float32), name="a")
        h = cl.HostObject([])
        if cgf == "no_init_read":
            def cgf(cgh):
                a.access(cgh, cl.one_to_one(), cl.read, no_init=True)
                cgh.parallel_for((8,), lambda c: None)
        elif cgf == "side_effect_kernel":
            def cgf(cgh):
                cl.side_effect(h, cgh)
                cgh.parallel_for((8,), lambda c: None, name="k")
        with pytest.raises(error, match=match):
            q.submit(cgf)
        assert q.fence(a).result().tolist() == list(range(8))
    finally:
        q.shutdown()


def _generator_kernel(chunk):
    yield chunk


async def _async_kernel(chunk):
    return chunk


async def _async_generator_kernel(chunk):
    yield chunk


@pytest.mark.parametrize("fn, what", [(_generator_kernel, r"a generator \(it yields\)"),
                                      (_async_kernel, r"a coroutine \(async def\)"),
                                      (_async_generator_kernel, r"a coroutine \(async def\)")])
@pytest.mark.parametrize("host", [False, True])
def test_a_generator_or_coroutine_kernel_is_an_error_not_a_kernel_that_never_runs(fn, what, host):
    """Calling one only makes a generator or coroutine object, so the kernel's writes never
    happened and the buffer silently kept its old contents."""
    q = cl.Queue(devices="host:1")
    try:
        a = cl.Buffer(np.zeros(4), name="a")

        def cgf(cgh):
            a.access(cgh, cl.one_to_one(), cl.discard_write)
            if host:
                cgh.host_task(fn, range=(4,))
            else:
                cgh.parallel_for((4,), fn)
        kind = "host_task" if host else "parallel_for"
        with pytest.raises(cl.CeleritasError, match=rf"{kind} '{fn.__name__}': the function is {what}; a kernel "
                                                    r"or host task is a plain function"):
            q.submit(cgf)
    finally:
        q.shutdown()


def test_a_cuda_device_that_does_not_exist_is_a_config_error_listing_the_visible_ones(monkeypatch):
    """With CuPy seeing GPUs, CELERITAS_DEVICES=cuda:99 raised the backend's BackendError (not a
    ConfigError, listing nothing).  Found by the fuzzer's device-error draws; a stub stands for
    a CuPy that sees two GPUs (only the device count is reached before the check)."""
    import types
    import executor.backends.cuda as cuda_backend
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 2)
    monkeypatch.setattr(cuda_backend, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)),
                        raising=False)
    from celeritas.config import DeviceSpec
    from celeritas.runtime import make_backend
    with pytest.raises(cl.ConfigError, match=r"^CELERITAS_DEVICES='cuda:1,99': CUDA device 99 does not exist; this "
                                             r"machine has 2 visible: cuda:0, cuda:1$"):
        make_backend(DeviceSpec.parse("cuda:1,99"))


def test_run_cluster_times_out_once_for_the_cluster_and_names_the_late_ranks():
    """The timeout was applied to each rank's thread in turn (two hung ranks with timeout=1
    took 2 s), and the ranks were listed after the abort had ended them ("ranks []")."""
    import time
    from celeritas.testing import run_cluster
    release = threading.Event()

    def program(rank):
        if rank > 0:
            release.wait(30)     # (hung ranks; the abort cannot end a plain wait, the event does)
        return rank

    t0 = time.monotonic()
    timer = threading.Timer(1.3, release.set)     # (ends the hung ranks during the grace after the abort)
    timer.start()
    try:
        with pytest.raises(cl.CeleritasError, match=r"run_cluster: ranks \[1, 2\] did not finish within 1(\.0)? s"):
            run_cluster(program, nodes=3, timeout=1.0)
    finally:
        timer.cancel()
        release.set()
    assert time.monotonic() - t0 < 2.5


# ---- the divergence check on a simulated cluster (run_cluster), as under MPI -------------------
def _divergent(mode: str, release: threading.Event):
    """tests/mpi_scripts/divergence.py's modes as a run_cluster program."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.zeros(64, np.float32), name="b")

        def touch(name, n=64):
            def cgf(cgh):
                b.access(cgh, cl.one_to_one(), cl.read_write)
                cgh.parallel_for((n,), lambda chunk: None, name=name)
            return cgf

        def read_all(cgh):
            b.access(cgh, cl.all(), cl.read)
            b.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for((64,), lambda chunk: None, name="reader")

        q.submit(touch("step"))
        if mode == "extra":
            if rank == 1:
                q.submit(touch("extra"))
            q.submit(read_all)
        elif mode == "different":
            q.submit(touch("update") if rank == 0 else touch("update_v2", 32))
        elif mode == "buffer_shape":
            cl.Buffer(np.zeros(32 + rank, np.float32), name="c")
            q.submit(touch("after"))
        elif mode == "stuck":
            q.wait()
            if rank == 1:
                q.submit(touch("only_on_rank_1"))
                q.fence(b).result()
        elif mode == "silent":
            q.wait()
            if rank == 1:
                release.wait(30)
        if mode not in ("stuck", "silent"):
            q.wait()
        return rank
    return program


@pytest.mark.parametrize("mode, rank0, rank1", [
    ("extra", "T2 (device_compute 'reader', range [64])", "T2 (device_compute 'extra', range [64])"),
    # (a different range hung: each rank waited for data the other never sent)
    ("different", "T2 (device_compute 'update', range [64])", "T2 (device_compute 'update_v2', range [32])"),
    ("buffer_shape", "buffer B1 float32 of shape (32,) (made before T2)",
     "buffer B1 float32 of shape (33,) (made before T2)"),
    ("stuck", "T3 (shutdown epoch", "T3 (device_compute 'only_on_rank_1', range [64])"),
])
def test_a_simulated_cluster_reports_divergent_task_streams_as_mpi_does(mode, rank0, rank1):
    """run_cluster's ranks had no divergence check: different kernel names finished silently and
    different ranges hung until run_cluster's timeout."""
    from celeritas.testing import run_cluster
    with pytest.raises(cl.DivergenceError, match=r"ranks [01] and [01] submitted different task streams; the "
                                                 r"first differing task") as ei:
        run_cluster(_divergent(mode, threading.Event()), nodes=2, timeout=60, CELERITAS_DEVICES="host:1",
                    CELERITAS_DIVERGENCE_TIMEOUT="30")
    assert f"rank 0 submitted {rank0}" in str(ei.value) and f"rank 1 submitted {rank1}" in str(ei.value)


def test_a_simulated_cluster_times_out_a_rank_that_never_reaches_the_epoch():
    from celeritas.testing import run_cluster
    release = threading.Event()
    timer = threading.Timer(5.0, release.set)
    timer.start()
    try:
        with pytest.raises(cl.DivergenceError, match=r"rank 0 reached epoch #2 \(T3, shutdown\) but rank 1 did not "
                                                     r"submit a matching epoch within 1 s"):
            run_cluster(_divergent("silent", release), nodes=2, timeout=60, CELERITAS_DEVICES="host:1",
                        CELERITAS_DIVERGENCE_TIMEOUT="1")
    finally:
        timer.cancel()
        release.set()


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_simulated_cluster_whose_ranks_agree_passes_the_check(nodes):
    from celeritas.testing import run_cluster
    assert run_cluster(_divergent("none", threading.Event()), nodes=nodes, timeout=60) == list(range(nodes))


def test_an_interrupt_while_a_wait_gives_its_lock_up_stays_a_keyboard_interrupt():
    """SIGINT can land inside Condition.wait just after it released the lock; the caller's
    ``with cond:`` exit then failed with 'cannot release un-acquired lock', so a rank under
    mpiexec reported a RuntimeError instead of the KeyboardInterrupt (a flaky
    test_probing_mpi case).  The runtime's condition takes the lock back first."""
    import threading
    from celeritas.runtime import _InterruptSafeCondition

    def interrupted(cls) -> type:
        c = cls()
        release = c._release_save

        def release_then_interrupt():
            release()
            raise KeyboardInterrupt
        c._release_save = release_then_interrupt
        try:
            with c:
                c.wait(0.01)
        except BaseException as exc:  # noqa: BLE001
            return type(exc)
        return type(None)

    assert interrupted(threading.Condition) is RuntimeError     # (the failure, provoked)
    assert interrupted(_InterruptSafeCondition) is KeyboardInterrupt
