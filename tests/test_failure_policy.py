"""After an instruction fails, nothing that depends on it runs (no work on corrupt data).

The failing kernel raises on the failing rank's first chunk; its dependents read that
chunk (one_to_one, queued right behind it on the same lane) or the whole buffer
(cl.all: a kernel and a host task).  None of them may run; the error surfaces
once as a cl.KernelError naming task, kernel, rank and chunk.
"""
from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import celeritas as cl
from celeritas.testing import run_cluster

pytestmark = pytest.mark.timeout(120)


def submit_failure_and_dependents(q: cl.Queue, fail_rank: int, seen: list, log: list) -> None:
    b = cl.Buffer(shape=(16,), dtype=np.float32, name="produced")
    lock = threading.Lock()

    def produce(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.discard_write)

        @cgh.parallel_for((16,), name="explodes")
        def kernel(chunk):
            if q.rank == fail_rank and chunk.offset[0] == 8 * fail_rank:   # the rank's first chunk
                raise ValueError("boom on purpose")
            w[chunk] = 1

    def same_chunk(cgh):
        r = b.access(cgh, cl.one_to_one(), cl.read)

        @cgh.parallel_for((16,), name="reads_same_chunk")
        def kernel(chunk):
            with lock:
                seen.append(("reads_same_chunk", q.rank, chunk.offset[0], float(r[chunk].sum()), chunk.range[0]))

    def whole(cgh):
        r = b.access(cgh, cl.all(), cl.read)

        @cgh.parallel_for((16,), name="reads_all")
        def kernel(chunk):
            with lock:
                seen.append(("reads_all", q.rank, chunk.offset[0], float(r[0:16].sum()), 16))

    ho = cl.HostObject(log)

    def host(cgh):
        r = b.access(cgh, cl.all(), cl.read)
        lst = cl.side_effect(ho, cgh)
        cgh.host_task(lambda part: lst.append(float(r[0:16].sum())), on=cl.on_master_node, name="host_reader")

    q.submit(produce)
    q.submit(same_chunk)
    q.submit(whole)
    q.submit(host)


def assert_names_everything(err: BaseException, rank: int) -> None:
    msg = str(err)
    assert isinstance(err, cl.KernelError), msg
    assert re.search(r"kernel 'explodes' of task T\d+ failed on rank %d, chunk Box" % rank, msg), msg
    assert "ValueError: boom on purpose" in msg, msg
    assert isinstance(err.__cause__, ValueError)


def assert_no_dependent_ran(seen: list, log: list, fail_rank: int) -> None:
    # a dependent of the failed chunk, or of the whole buffer, never runs; a one_to_one
    # reader of another, complete chunk may have (it does not depend on the failure)
    bad = [s for s in seen if s[0] == "reads_all" or (s[1] == fail_rank and s[2] == 8 * fail_rank)]
    assert bad == [], f"dependents of the failed kernel ran: {bad}"
    assert all(s[3] == s[4] for s in seen), seen         # what did run read complete data (all ones)
    assert log == [], f"the host task reading the failed kernel's output ran: {log}"


def test_dependents_of_a_failed_kernel_never_run_on_one_rank():
    seen: list = []
    log: list = []
    q = cl.Queue(devices="host:2")
    submit_failure_and_dependents(q, 0, seen, log)
    with pytest.raises(cl.KernelError) as ei:
        q.wait()
    assert_names_everything(ei.value, 0)
    assert_no_dependent_ran(seen, log, 0)


@pytest.mark.parametrize("fail_rank,barrier", [(0, False), (1, True)])
def test_dependents_of_a_failed_kernel_never_run_on_a_simulated_cluster(fail_rank, barrier):
    """The other rank needs the failed chunk (and, with ``barrier``, waits in a barrier the
    failing rank skips): it must be released, not hang, and run nothing that depends on it."""
    seen: list = []
    logs: list = [[], []]

    def program(rank):
        q = cl.Queue()
        submit_failure_and_dependents(q, fail_rank, seen, logs[rank])
        q.wait(barrier=barrier)

    with pytest.raises(cl.KernelError) as ei:
        run_cluster(program, nodes=2, devices=2, timeout=60)
    assert_names_everything(ei.value, fail_rank)
    assert_no_dependent_ran(seen, logs[0] + logs[1], fail_rank)


def test_failure_in_a_host_task_stops_its_dependents():
    ran: list = []
    q = cl.Queue(devices="host:1")
    b = cl.Buffer(np.zeros(8, np.float32), name="b")

    def failing(cgh):
        b.access(cgh, cl.all(), cl.read_write)
        cgh.host_task(lambda part: 1 / 0, on=cl.on_master_node, name="divides")

    def after(cgh):
        b.access(cgh, cl.all(), cl.read)
        cgh.host_task(lambda part: ran.append(1), on=cl.on_master_node, name="after")

    q.submit(failing)
    q.submit(after)
    with pytest.raises(cl.KernelError, match="host task 'divides'.*ZeroDivisionError"):
        q.fence(b).result(timeout=30)
    q.shutdown()    # (quiet: the fence raised the failure)
    with pytest.raises(cl.KernelError):
        q.wait()
    assert ran == []


def test_a_lane_skips_dependent_work_queued_behind_a_failure_and_runs_the_rest():
    from executor.backends import HostBackend, Lane, LaneSkipped
    backend = HostBackend(1)
    lane = Lane("device", 0, 0)
    ran = []
    gate = threading.Event()
    try:
        def fail():
            gate.wait(10)
            raise ZeroDivisionError("boom")

        c1 = backend.launch(lane, fail)
        c2 = backend.launch(lane, lambda: ran.append("dependent"), dependent=True)
        c3 = backend.launch(lane, lambda: ran.append("independent"))
        src, dst = np.arange(4.0), np.zeros(4)
        box = cl.Box((0,), (4,))
        c4 = backend.copy(src, box, dst, box, box, lane, dependent=True)
        gate.set()
        assert c4.wait(10)
        assert isinstance(c1.error(), ZeroDivisionError)
        assert isinstance(c2.error(), LaneSkipped) and isinstance(c4.error(), LaneSkipped)
        assert c3.error() is None and ran == ["independent"]
        assert not dst.any()
    finally:
        backend.close()
