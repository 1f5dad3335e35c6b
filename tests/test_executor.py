"""Executor on hand-built instruction graphs (no scheduler)."""
from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np
import pytest

from executor.backends import HostBackend
from executor.communicator import InProcessCluster, SingleRankCommunicator
from executor.executor import Executor, ExecutorStopped
from scheduler.geometry import Box, Region
from scheduler.instruction_graph import (HOST_MEMORY, USER_MEMORY, AccessAllocation,
                                         AllocInstruction, AwaitReceiveInstruction,
                                         CloneCollectiveGroupInstruction, CopyInstruction,
                                         DeviceKernelInstruction, EpochInstruction,
                                         FenceInstruction, FillIdentityInstruction,
                                         FreeInstruction, GatherReceiveInstruction,
                                         HorizonInstruction, HostTaskInstruction,
                                         Pilot, ReceiveInstruction, ReduceInstruction,
                                         ReductionAllocation, SendInstruction,
                                         SplitReceiveInstruction, device_memory)

from instruction_builder import Graph  # tests/ is on sys.path (conftest)

TIMEOUT = 20


class Recorder:
    def __init__(self, wrap_error=None):
        self.horizons, self.epochs, self.errors = [], [], []
        self.epoch_event = threading.Event()
        self.wrap_error = wrap_error

    def on_epoch(self, task):
        self.epochs.append(task)
        self.epoch_event.set()

    def on_error(self, exc, instr):
        self.errors.append((exc, instr))
        return self.wrap_error(exc) if self.wrap_error else None

    def executor(self, backend, comm, **kw):
        return Executor(backend, comm, on_horizon=self.horizons.append, on_epoch=self.on_epoch,
                        on_error=self.on_error, **kw)


def acc(allocation, allocation_box, box=None, buffer=0):
    return AccessAllocation(buffer=buffer, allocation=allocation, allocation_box=allocation_box,
                            box=box if box is not None else allocation_box)


def grid(box):
    """Global-coordinate test pattern: 10*i + j."""
    i, j = np.meshgrid(np.arange(box.min[0], box.max[0]), np.arange(box.min[1], box.max[1]),
                       indexing="ij")
    return (10 * i + j).astype(np.float64)


@pytest.fixture
def backend():
    b = HostBackend(2)
    yield b
    b.close()


@pytest.mark.timeout(60)
def test_kernel_copy_host_task_fence_pipeline(backend):
    rec = Recorder()
    ex = rec.executor(backend, SingleRankCommunicator(), trace=True)
    full = Box((0, 0), (8, 6))
    lower = Box((2, 0), (8, 6))
    upper = Box((0, 0), (2, 6))
    seen = {}

    def write_pattern(ctx):
        seen["xp"] = ctx.xp
        seen["device"] = ctx.device
        seen["task"] = ctx.task
        seen["accesses"] = ctx.accesses
        ctx.arrays[0][...] = grid(ctx.box)

    def host_sum(ctx):
        seen["sum"] = float(ctx.arrays[0].sum())
        seen["host_box"] = ctx.box
        seen["global_range"] = ctx.global_range

    g = Graph()
    init = g.add(EpochInstruction, task=0, action="init")
    a_dev0 = g.add(AllocInstruction, init, allocation=2, memory=device_memory(0), box=full,
                   shape=full.shape, dtype=np.float64)
    k0 = g.add(DeviceKernelInstruction, a_dev0, device=0, task=1, box=full,
               accesses=[acc(2, full)], launcher=write_pattern, name="pattern")
    ex.start()
    ex.submit(g.batch())          # the rest arrives in a later batch, as from the scheduler
    a_dev1 = g.add(AllocInstruction, init, allocation=3, memory=device_memory(1), box=lower,
                   shape=lower.shape, dtype=np.float64)
    c01 = g.add(CopyInstruction, k0, a_dev1, source=2, dest=3, source_memory=device_memory(0),
                dest_memory=device_memory(1), box=lower, source_box=full, dest_box=lower)
    k1 = g.add(DeviceKernelInstruction, c01, device=1, task=2, box=lower,
               accesses=[acc(3, lower)], launcher=lambda ctx: ctx.arrays[0].__iadd__(1))
    a_user = g.add(AllocInstruction, init, allocation=4, memory=USER_MEMORY, box=full,
                   shape=full.shape, dtype=np.float64)
    c1u = g.add(CopyInstruction, k1, a_user, source=3, dest=4, source_memory=device_memory(1),
                dest_memory=USER_MEMORY, box=lower, source_box=lower, dest_box=full)
    c0u = g.add(CopyInstruction, k0, a_user, source=2, dest=4, source_memory=device_memory(0),
                dest_memory=USER_MEMORY, box=upper, source_box=full, dest_box=full)
    ht = g.add(HostTaskInstruction, c1u, c0u, task=3, box=full, global_range=(8, 6),
               accesses=[acc(4, full)], launcher=host_sum, name="sum")
    fut = Future()
    fence = g.add(FenceInstruction, ht, task=4, promise=fut, allocation=4)
    f2 = g.add(FreeInstruction, c0u, allocation=2, memory=device_memory(0))
    f3 = g.add(FreeInstruction, c1u, allocation=3, memory=device_memory(1))
    hz = g.add(HorizonInstruction, fence, f2, f3, task=5)
    g.add(EpochInstruction, hz, task=6, action="shutdown")
    ex.submit(g.batch())

    result = fut.result(TIMEOUT)
    want = grid(full)
    want[2:] += 1
    np.testing.assert_array_equal(result, want)
    assert ex.join(TIMEOUT)
    assert rec.errors == []
    assert seen["sum"] == want.sum() and seen["host_box"] == full and seen["global_range"] == (8, 6)
    assert seen["xp"] is np and seen["device"] == 0
    assert seen["task"] == 1 and seen["accesses"] is k0.accesses
    assert rec.horizons == [5] and rec.epochs == [0, 6]
    for m in (USER_MEMORY, HOST_MEMORY, device_memory(0), device_memory(1)):
        assert backend.live_bytes(m) == 0
    lanes = {e.instruction_id: e.lane for e in ex.trace}
    assert len(ex.trace) == 15
    assert lanes[k0.id] == "D0.lane0" and lanes[k1.id] == "D1.lane0"
    assert lanes[ht.id] == "host.lane0" and lanes[a_dev0.id] == "alloc"
    # the device-to-device copy may run on either device's lane
    assert lanes[c01.id] in ("D0.lane0", "D1.lane0")
    assert all(e.start_ns <= e.end_ns for e in ex.trace)


def _exchange_program(rank, n_ranks, full, own, other, g, promise, reverse_dims=False):
    """Each rank computes its part on device 0, sends it, receives the other, fences all."""
    pattern = lambda ctx: ctx.arrays[0].__setitem__(Ellipsis, grid(ctx.box))  # noqa: E731
    peer = 1 - rank
    transfer = (5, 0, 0)
    init = g.add(EpochInstruction, task=0, action="init")
    a_dev = g.add(AllocInstruction, init, allocation=1, memory=device_memory(0), box=own,
                  shape=own.shape, dtype=np.float64)
    k = g.add(DeviceKernelInstruction, a_dev, device=0, task=1, box=own, accesses=[acc(1, own)],
              launcher=pattern)
    a_host = g.add(AllocInstruction, init, allocation=2, memory=HOST_MEMORY, box=full,
                   shape=full.shape, dtype=np.float64)
    cp = g.add(CopyInstruction, k, a_host, source=1, dest=2, source_memory=device_memory(0),
               dest_memory=HOST_MEMORY, box=own, source_box=own, dest_box=full)
    send = g.add(SendInstruction, cp, to=peer, msg_id=100 + rank, transfer=transfer, box=own,
                 source=2, source_box=full, dtype=np.float64)
    recv = g.add(ReceiveInstruction, a_host, transfer=transfer, region=Region.from_box(other),
                 dest=2, dest_box=full, dtype=np.float64)
    a_user = g.add(AllocInstruction, init, allocation=3, memory=USER_MEMORY, box=full,
                   shape=full.shape, dtype=np.float64)
    cu = g.add(CopyInstruction, recv, cp, a_user, source=2, dest=3, source_memory=HOST_MEMORY,
               dest_memory=USER_MEMORY, box=full, source_box=full, dest_box=full)
    fence = g.add(FenceInstruction, cu, task=2, promise=promise, allocation=3)
    barrier = g.add(EpochInstruction, fence, send, task=3, action="barrier")
    f1 = g.add(FreeInstruction, barrier, allocation=1, memory=device_memory(0))
    f2 = g.add(FreeInstruction, barrier, allocation=2, memory=HOST_MEMORY)
    g.add(EpochInstruction, f1, f2, task=4, action="shutdown")
    return [Pilot(msg_id=100 + rank, to=peer, transfer=transfer, box=own)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strided_comm", [True, False])
def test_two_rank_exchange(strided_comm):
    # columns split between ranks: each part is strided inside the full allocation
    full = Box((0, 0), (4, 8))
    parts = [Box((0, 0), (4, 4)), Box((0, 4), (4, 8))]
    cluster = InProcessCluster(2, timeout=TIMEOUT)
    execs, backends, recs, futs = [], [], [], []
    for r in range(2):
        comm = cluster.communicator(r)
        comm.accepts_strided = strided_comm    # False: staging copies on both sides
        b = HostBackend(1)
        rec = Recorder()
        ex = rec.executor(b, comm)
        g = Graph()
        fut = Future()
        pilots = _exchange_program(r, 2, full, parts[r], parts[1 - r], g, fut)
        execs.append(ex)
        backends.append(b)
        recs.append(rec)
        futs.append(fut)
        ex.start()
        ex.submit(g.batch(pilots))
    try:
        for r in range(2):
            np.testing.assert_array_equal(futs[r].result(TIMEOUT), grid(full))
        for ex in execs:
            assert ex.join(TIMEOUT)
        for rec in recs:
            assert rec.errors == [] and rec.epochs == [0, 3, 4]
    finally:
        cluster.abort()
        for b in backends:
            b.close()


class KernelFailed(RuntimeError):
    pass


@pytest.mark.timeout(60)
def test_failing_launcher_reaches_on_error_and_nothing_hangs(backend):
    rec = Recorder(wrap_error=lambda exc: KernelFailed(f"task 1 failed: {exc}"))
    ex = rec.executor(backend, SingleRankCommunicator())
    box = Box((0,), (4,))
    after = {}

    def boom(ctx):
        raise ZeroDivisionError("kernel exploded")

    g = Graph()
    a = g.add(AllocInstruction, allocation=1, memory=device_memory(0), box=box, shape=(4,),
              dtype=np.float32)
    bad = g.add(DeviceKernelInstruction, a, device=0, task=1, box=box, accesses=[acc(1, box)],
                launcher=boom, name="boom")
    ok = g.add(HostTaskInstruction, bad, task=2, box=box, launcher=lambda ctx: after.setdefault("ran", 1))
    fut = Future()
    fence = g.add(FenceInstruction, ok, task=3, promise=fut, host_object=7)
    free = g.add(FreeInstruction, fence, allocation=1, memory=device_memory(0))
    g.add(EpochInstruction, free, task=4, action="shutdown")
    ex.track_host_object(7, {"state": "x"})
    ex.start()
    ex.submit(g.batch())
    with pytest.raises(KernelFailed, match="kernel exploded"):
        fut.result(TIMEOUT)
    assert ex.join(TIMEOUT)
    assert len(rec.errors) == 1
    exc, instr = rec.errors[0]
    assert isinstance(exc, ZeroDivisionError) and instr is bad
    assert after == {}                     # policy: dependents of a failure never run
    assert rec.epochs == [4]
    assert isinstance(ex.error, ZeroDivisionError)


@pytest.mark.timeout(60)
def test_dependent_queued_behind_a_failing_kernel_on_its_lane_never_runs(backend):
    """Eager assignment queues a dependent on the lane of its predecessor before that one
    ran; when the predecessor fails the lane must skip it, and nothing later is issued."""
    from executor.backends import Lane
    rec = Recorder()
    ex = rec.executor(backend, SingleRankCommunicator())
    box = Box((0,), (4,))
    ran = []

    def fails_once_dependent_is_queued(ctx):
        worker = backend._workers[Lane("device", 0, 0)]
        for _ in range(2000):                      # the dependent is queued right after this starts
            if not worker.queue.empty():
                break
            threading.Event().wait(0.005)
        ran.append("queued" if not worker.queue.empty() else "not queued")
        raise ZeroDivisionError("kernel exploded")

    g = Graph()
    a = g.add(AllocInstruction, allocation=1, memory=device_memory(0), box=box, shape=(4,), dtype=np.float32)
    bad = g.add(DeviceKernelInstruction, a, device=0, task=1, box=box, accesses=[acc(1, box)],
                launcher=fails_once_dependent_is_queued, name="boom")
    dep = g.add(DeviceKernelInstruction, bad, device=0, task=2, box=box, accesses=[acc(1, box)],
                launcher=lambda ctx: ran.append("dependent"), name="dependent")
    later = g.add(HostTaskInstruction, dep, task=3, box=box, launcher=lambda ctx: ran.append("host task"))
    cp = g.add(CopyInstruction, dep, source=1, dest=1, source_memory=device_memory(0),
               dest_memory=device_memory(0), box=box, source_box=box, dest_box=box)
    fut = Future()
    fence = g.add(FenceInstruction, later, cp, task=4, promise=fut, host_object=7)
    free = g.add(FreeInstruction, fence, allocation=1, memory=device_memory(0))
    g.add(EpochInstruction, free, task=5, action="shutdown")
    ex.track_host_object(7, [])
    if ex._inline_ns:       # both known to be long: on their lane, the dependent queued eagerly
        from executor.instruction_handlers import cost_key
        ex._costs[cost_key(bad)] = ex._costs[cost_key(dep)] = 10 ** 9
    ex.start()
    ex.submit(g.batch())
    with pytest.raises(ZeroDivisionError):
        fut.result(TIMEOUT)
    assert ex.join(TIMEOUT)
    assert ran == ["queued"]
    assert [(type(e), i) for e, i in rec.errors] == [(ZeroDivisionError, bad)]
    assert rec.epochs == [5]
    assert backend.live_bytes(device_memory(0)) == 0       # the allocation was still freed


@pytest.mark.timeout(60)
def test_missing_allocation_is_reported_and_fence_fails(backend):
    rec = Recorder()
    ex = rec.executor(backend, SingleRankCommunicator())
    g = Graph()
    fut = Future()
    box = Box((0,), (2,))
    cp = g.add(CopyInstruction, source=41, dest=42, source_memory=1, dest_memory=0, box=box,
               source_box=box, dest_box=box)
    g.add(FenceInstruction, cp, task=1, promise=fut, allocation=42)
    g.add(EpochInstruction, task=2, action="shutdown")
    ex.start()
    ex.submit(g.batch())
    with pytest.raises(KeyError):
        fut.result(TIMEOUT)
    assert ex.join(TIMEOUT)
    assert [i.id for _, i in rec.errors] == [1]     # the fence is failed with the copy's error, not run


@pytest.mark.timeout(60)
def test_fill_identity_kernel_reductions_and_reduce(backend):
    rec = Recorder()
    ex = rec.executor(backend, SingleRankCommunicator())
    user = np.array([42.0])
    ex.track_user_allocation(9, user)
    g = Graph()
    r0 = g.add(AllocInstruction, allocation=1, memory=device_memory(0), shape=(1,), dtype=np.float64)
    r1 = g.add(AllocInstruction, allocation=2, memory=device_memory(1), shape=(1,), dtype=np.float64)
    parts = g.add(AllocInstruction, allocation=3, memory=HOST_MEMORY, shape=(2,), dtype=np.float64)
    fills = [g.add(FillIdentityInstruction, r, reduction=1, allocation=r.allocation, count=1, identity=0.0)
             for r in (r0, r1)]
    fill_parts = g.add(FillIdentityInstruction, parts, reduction=1, allocation=3, count=2, identity=0.0)

    def combine(value):
        def launcher(ctx):
            ctx.reduction_arrays[0][0] += value
        return launcher

    ks = [g.add(DeviceKernelInstruction, fills[d], device=d, task=1, box=Box((0,), (1,)),
                reductions=[ReductionAllocation(reduction=1, buffer=0, allocation=1 + d,
                                                include_current=False)],
                launcher=combine(5.0 + 2 * d)) for d in (0, 1)]
    copies = [g.add(CopyInstruction, ks[d], fill_parts, source=1 + d, dest=3,
                    source_memory=device_memory(d), dest_memory=HOST_MEMORY,
                    box=Box((d,), (d + 1,)), source_box=Box((d,), (d + 1,)), dest_box=Box((0,), (2,)))
              for d in (0, 1)]
    red = g.add(ReduceInstruction, *copies, reduction=1, source=3, dest=9, count=2, op=np.add,
                include_dest=True)
    fut = Future()
    fence = g.add(FenceInstruction, red, task=2, promise=fut, allocation=9)
    g.add(EpochInstruction, fence, task=3, action="shutdown")
    ex.start()
    ex.submit(g.batch())
    result = fut.result(TIMEOUT)
    assert result is user and result[0] == 42.0 + 5.0 + 7.0
    assert ex.join(TIMEOUT) and rec.errors == []


@pytest.mark.timeout(60)
def test_collective_host_task_and_gather_across_ranks():
    n = 3
    cluster = InProcessCluster(n, timeout=TIMEOUT)
    transfer = (8, 2, 1)
    results = [dict() for _ in range(n)]
    execs, backends, futs = [], [], []
    for r in range(n):
        comm = cluster.communicator(r)
        b = HostBackend(1)
        ex = Recorder().executor(b, comm)
        g = Graph()
        clone = g.add(CloneCollectiveGroupInstruction, original=0, new=1)

        def collective(ctx, r=r):
            results[r]["sum"] = ctx.communicator.allreduce(ctx.rank + 1)
            results[r]["size"] = ctx.communicator.Get_size()

        ht = g.add(HostTaskInstruction, clone, task=1, box=Box((r,), (r + 1,)), collective_group=1,
                   launcher=collective)
        part = g.add(AllocInstruction, allocation=1, memory=HOST_MEMORY, shape=(1,), dtype=np.float64)
        k = g.add(HostTaskInstruction, part, task=2, box=Box((0,), (1,)),
                  accesses=[acc(1, Box((0,), (1,)))],
                  launcher=lambda ctx, r=r: ctx.arrays[0].__setitem__(0, 10.0 * (r + 1)))
        gather = g.add(AllocInstruction, allocation=2, memory=HOST_MEMORY, shape=(n,), dtype=np.float64)
        fill = g.add(FillIdentityInstruction, gather, reduction=1, allocation=2, count=n, identity=0.0)
        own = g.add(CopyInstruction, k, fill, source=1, dest=2, source_memory=HOST_MEMORY,
                    dest_memory=HOST_MEMORY, box=Box((r,), (r + 1,)), source_box=Box((r,), (r + 1,)),
                    dest_box=Box((0,), (n,)))
        pilots = []
        sends = []
        # rank 2 contributes nothing (empty box), like a rank without a chunk
        for peer in range(n):
            if peer == r:
                continue
            if r == 2:
                pilots.append(Pilot(msg_id=1000 + peer, to=peer, transfer=transfer, box=Box((0,), (0,))))
            else:
                pilots.append(Pilot(msg_id=1000 + peer, to=peer, transfer=transfer, box=Box((0,), (1,))))
                sends.append(g.add(SendInstruction, k, to=peer, msg_id=1000 + peer, transfer=transfer,
                                   box=Box((0,), (1,)), source=1, source_box=Box((0,), (1,))))
        grecv = g.add(GatherReceiveInstruction, fill, transfer=transfer, dest=2, chunk_bytes=8, num_ranks=n)
        out = g.add(AllocInstruction, allocation=3, memory=USER_MEMORY, shape=(1,), dtype=np.float64)
        red = g.add(ReduceInstruction, grecv, own, out, reduction=1, source=2, dest=3, count=n, op=np.add)
        fut = Future()
        fence = g.add(FenceInstruction, red, task=3, promise=fut, allocation=3)
        g.add(EpochInstruction, fence, ht, *sends, task=4, action="shutdown")
        ex.start()
        ex.submit(g.batch(pilots))
        execs.append(ex)
        backends.append(b)
        futs.append(fut)
    try:
        for r in range(n):
            # rank 2's own partial only counts on rank 2 itself
            want = 10.0 + 20.0 + (30.0 if r == 2 else 0.0)
            assert futs[r].result(TIMEOUT)[0] == want
        for ex in execs:
            assert ex.join(TIMEOUT)
            assert ex.error is None
        assert results == [{"sum": 6, "size": n}] * n
    finally:
        cluster.abort()
        for b in backends:
            b.close()


@pytest.mark.timeout(60)
def test_the_executor_goes_on_while_a_collective_groups_clone_is_incomplete(monkeypatch):
    """A clone that the other ranks have yet to complete (an MPI Idup): its collective host
    task goes to its lane, which waits for it, and the executor meanwhile runs independent
    work, tests the clone with its polls and says what it waits for; once the clone
    completes, the collective runs on every rank."""
    import time

    from executor.communicator import InProcessCommunicator
    n = 2
    cluster = InProcessCluster(n, timeout=TIMEOUT)
    release = threading.Event()
    tests = []

    def clone_completed(self):
        tests.append(threading.current_thread().name)
        return release.is_set()

    # (Communicator.wait_cloned, on the lane, tests it until it completes)
    monkeypatch.setattr(InProcessCommunicator, "clone_completed", clone_completed)
    results = [dict() for _ in range(n)]
    independent = [threading.Event() for _ in range(n)]
    execs, backends = [], []
    try:
        for r in range(n):
            b = HostBackend(1)
            ex = Recorder().executor(b, cluster.communicator(r))
            g = Graph()
            clone = g.add(CloneCollectiveGroupInstruction, original=0, new=1)

            def collective(ctx, r=r):
                results[r]["sum"] = ctx.communicator.allreduce(ctx.rank + 1)

            ht = g.add(HostTaskInstruction, clone, task=1, box=Box((r,), (r + 1,)), collective_group=1,
                       launcher=collective)
            other = g.add(HostTaskInstruction, task=2, box=Box((0,), (1,)),
                          launcher=lambda ctx, r=r: independent[r].set())
            g.add(EpochInstruction, ht, other, task=3, action="shutdown")
            ex.start()
            ex.submit(g.batch())
            execs.append(ex)
            backends.append(b)
        for r in range(n):
            assert independent[r].wait(TIMEOUT), f"rank {r}: independent work did not run"
        deadline = time.monotonic() + TIMEOUT
        while not all(ex._cloning for ex in execs) and time.monotonic() < deadline:
            time.sleep(0.001)
        for r, ex in enumerate(execs):
            waits = ex.describe_waits()
            assert any("1 collective group communicator clone(s) that the other ranks have yet to make" in w
                       for w in waits), (r, waits)
            assert any(w.startswith("host_task of task T1") for w in waits), (r, waits)
        # (the executors keep testing: a later test than any so far comes from one)
        polled = sum("executor" in t for t in tests)
        deadline = time.monotonic() + TIMEOUT
        while sum("executor" in t for t in tests) <= polled and time.monotonic() < deadline:
            time.sleep(0.001)
        assert sum("executor" in t for t in tests) > polled
        release.set()
        for ex in execs:
            assert ex.join(TIMEOUT) and ex.error is None
        assert results == [{"sum": 3}] * n
        assert all(not ex._cloning for ex in execs)
    finally:
        cluster.abort()
        for b in backends:
            b.close()


@pytest.mark.timeout(60)
def test_split_receive_awaits_do_not_wait_for_the_whole_region():
    cluster = InProcessCluster(2, timeout=TIMEOUT)
    full = Box((0,), (8,))
    halves = [Box((0,), (4,)), Box((4,), (8,))]
    transfer = (3, 0, 0)
    b0, b1 = HostBackend(1), HostBackend(1)
    ex0 = Recorder().executor(b0, cluster.communicator(0))
    ex1 = Recorder().executor(b1, cluster.communicator(1))
    first_half = {}
    release_second = threading.Event()
    try:
        # rank 1: split receive, an await per half; a host task reads the first half only
        g = Graph()
        a = g.add(AllocInstruction, allocation=1, memory=HOST_MEMORY, box=full, shape=(8,), dtype=np.float64)
        split = g.add(SplitReceiveInstruction, a, transfer=transfer, region=Region.from_box(full),
                      dest=1, dest_box=full)
        aw = [g.add(AwaitReceiveInstruction, split, transfer=transfer, region=Region.from_box(h))
              for h in halves]

        def read_first(ctx):
            first_half["values"] = ctx.arrays[0][:4].copy()
            release_second.set()        # only now may rank 0 send the second half

        ht = g.add(HostTaskInstruction, aw[0], task=4, box=halves[0], accesses=[acc(1, full, halves[0])],
                   launcher=read_first)
        u = g.add(AllocInstruction, allocation=2, memory=USER_MEMORY, box=full, shape=(8,), dtype=np.float64)
        cu = g.add(CopyInstruction, aw[1], aw[0], u, source=1, dest=2, source_memory=HOST_MEMORY,
                   dest_memory=USER_MEMORY, box=full, source_box=full, dest_box=full)
        fut = Future()
        fence = g.add(FenceInstruction, cu, ht, task=5, promise=fut, allocation=2)
        g.add(EpochInstruction, fence, split, task=6, action="shutdown")
        ex1.start()
        ex1.submit(g.batch())

        # rank 0: sends the first half, then (after rank 1 consumed it) the second
        g0 = Graph()
        src = g0.add(AllocInstruction, allocation=1, memory=HOST_MEMORY, box=full, shape=(8,), dtype=np.float64)
        fill = g0.add(HostTaskInstruction, src, task=1, box=full, accesses=[acc(1, full)],
                      launcher=lambda ctx: ctx.arrays[0].__setitem__(Ellipsis, np.arange(8.0) + 1))
        s0 = g0.add(SendInstruction, fill, to=1, msg_id=1, transfer=transfer, box=halves[0], source=1,
                    source_box=full)
        gate = g0.add(HostTaskInstruction, fill, task=2, box=full,
                      launcher=lambda ctx: release_second.wait(TIMEOUT))
        s1 = g0.add(SendInstruction, gate, to=1, msg_id=2, transfer=transfer, box=halves[1], source=1,
                    source_box=full)
        g0.add(EpochInstruction, s0, s1, task=6, action="shutdown")
        ex0.start()
        ex0.submit(g0.batch([Pilot(msg_id=1, to=1, transfer=transfer, box=halves[0]),
                             Pilot(msg_id=2, to=1, transfer=transfer, box=halves[1])]))
        np.testing.assert_array_equal(fut.result(TIMEOUT), np.arange(8.0) + 1)
        np.testing.assert_array_equal(first_half["values"], [1, 2, 3, 4])
        assert ex0.join(TIMEOUT) and ex1.join(TIMEOUT)
        assert ex0.error is None and ex1.error is None
    finally:
        release_second.set()
        cluster.abort()
        b0.close()
        b1.close()


@pytest.mark.timeout(60)
def test_shutdown_drains_and_abort_fails_pending_fences(backend):
    ex = Executor(backend, SingleRankCommunicator())
    ex.start()
    g = Graph()
    gate = threading.Event()
    ht = g.add(HostTaskInstruction, task=1, box=Box((0,), (1,)), launcher=lambda ctx: gate.wait(TIMEOUT))
    fut = Future()
    g.add(FenceInstruction, ht, task=2, promise=fut, host_object=None)
    ex.submit(g.batch())
    assert not ex.shutdown(timeout=0.2)     # drain: still waiting for the host task
    gate.set()
    assert ex.join(TIMEOUT)
    assert fut.result(TIMEOUT) is None

    ex2 = Executor(backend, SingleRankCommunicator())
    ex2.start()
    gate2 = threading.Event()
    g = Graph()
    ht = g.add(HostTaskInstruction, task=1, box=Box((0,), (1,)), launcher=lambda ctx: gate2.wait(TIMEOUT))
    fut2 = Future()
    g.add(FenceInstruction, ht, task=2, promise=fut2)
    ex2.submit(g.batch())
    assert ex2.shutdown(TIMEOUT, drain=False)
    with pytest.raises(ExecutorStopped):
        fut2.result(TIMEOUT)
    gate2.set()


@pytest.mark.timeout(60)
def test_many_tiny_tasks_with_horizons(backend):
    """A long stream of dependent kernels: exercises eager lane chains and horizon callbacks."""
    rec = Recorder()
    ex = rec.executor(backend, SingleRankCommunicator())
    ex.start()
    box = Box((0,), (1,))
    g = Graph()
    a = g.add(AllocInstruction, allocation=1, memory=device_memory(0), box=box, shape=(1,), dtype=np.int64)
    prev = g.add(FillIdentityInstruction, a, reduction=0, allocation=1, count=1, identity=0)
    horizons = []
    for i in range(300):
        prev = g.add(DeviceKernelInstruction, prev, device=0, task=i, box=box,
                     accesses=[acc(1, box)], launcher=lambda ctx: ctx.arrays[0].__iadd__(1))
        if i % 50 == 49:
            prev = g.add(HorizonInstruction, prev, task=1000 + i)
            horizons.append(1000 + i)
        if i % 20 == 0:
            ex.submit(g.batch())
    u = g.add(AllocInstruction, allocation=2, memory=USER_MEMORY, box=box, shape=(1,), dtype=np.int64)
    cp = g.add(CopyInstruction, prev, u, source=1, dest=2, source_memory=device_memory(0),
               dest_memory=USER_MEMORY, box=box, source_box=box, dest_box=box)
    fut = Future()
    g.add(FenceInstruction, cp, task=9999, promise=fut, allocation=2)
    ex.submit(g.batch())
    assert fut.result(TIMEOUT)[0] == 300
    assert ex.shutdown(TIMEOUT)
    assert rec.horizons == horizons and rec.errors == []


@pytest.mark.timeout(60)
def test_unknown_instruction_kind_is_an_error_not_a_crash(backend):
    from dataclasses import dataclass

    from scheduler.instruction_graph import Instruction

    @dataclass(slots=True, eq=False)
    class Mystery(Instruction):
        kind = "mystery"

    rec = Recorder()
    ex = rec.executor(backend, SingleRankCommunicator())
    g = Graph()
    m = g.add(Mystery)
    g.add(EpochInstruction, m, task=1, action="shutdown")
    ex.start()
    ex.submit(g.batch())
    assert ex.join(TIMEOUT)
    assert len(rec.errors) == 1 and isinstance(rec.errors[0][0], TypeError)
    assert rec.errors[0][1] is m and rec.epochs == [1]


@pytest.mark.timeout(60)
def test_cluster_abort_stops_a_rank_waiting_for_data():
    cluster = InProcessCluster(2)
    b = HostBackend(1)
    rec = Recorder()
    ex = rec.executor(b, cluster.communicator(1))
    try:
        g = Graph()
        box = Box((0,), (4,))
        a = g.add(AllocInstruction, allocation=1, memory=HOST_MEMORY, box=box, shape=(4,), dtype=np.float64)
        recv = g.add(ReceiveInstruction, a, transfer=(1, 0, 0), region=Region.from_box(box), dest=1,
                     dest_box=box)
        fut = Future()
        g.add(FenceInstruction, recv, task=2, promise=fut)
        ex.start()
        ex.submit(g.batch())          # rank 0 never sends: only an abort can end this
        with pytest.raises(TimeoutError):
            fut.result(0.2)
        cluster.abort()
        with pytest.raises(Exception, match="abort"):
            fut.result(TIMEOUT)
        assert ex.join(TIMEOUT)
        assert rec.errors and "abort" in str(rec.errors[-1][0])
    finally:
        b.close()


def test_inbox_wakes_on_put_and_times_out_without_one():
    """The executor's inbox: a put from another thread ends a wait at once, a wait with
    nothing put ends at its timeout, and a signal left over from a put made while the
    consumer was not yet blocked never makes a later wait on an empty inbox spin."""
    import time

    from executor.executor import _Inbox
    box = _Inbox()
    t0 = time.monotonic()
    box.wait(0.05)
    assert 0.04 <= time.monotonic() - t0 < 2.0 and box.empty()
    assert _waits_for(box, box.put, "item") < 5.0 and box.get_nowait() == "item"
    # a put racing with the announcement: the signal is consumed, the next wait blocks
    box._sleeping = True
    box.put("x")
    box.wait(10.0)                       # returns at once: the item is there
    assert box.get_nowait() == "x" and box.empty()
    t0 = time.monotonic()
    box.wait(0.05)
    assert time.monotonic() - t0 >= 0.04


def test_inbox_hands_out_completions_before_batches_and_keeps_batches_in_order():
    """A completion must not wait behind a backlog of batches (it is what lets accepted work
    run); batches and control signals keep their order; an urgent put wakes a sleeper."""
    from executor.executor import _Inbox
    box = _Inbox()
    box.put("batch1")
    box.put("batch2")
    box.put_urgent("completion")
    box.put("drain")
    assert [box.get_nowait() for _ in range(4)] == ["completion", "batch1", "batch2", "drain"]
    assert box.empty()
    assert _waits_for(box, box.put_urgent, "done") < 5.0 and not box.empty() and box.get_nowait() == "done"


def _waits_for(box, put, item) -> float:
    """Seconds ``box.wait(10)`` took while another thread calls ``put(item)`` after 50 ms."""
    import threading
    import time

    def later():
        time.sleep(0.05)
        put(item)
    threading.Thread(target=later).start()
    t0 = time.monotonic()
    box.wait(10.0)
    return time.monotonic() - t0
