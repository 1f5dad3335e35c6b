"""Inline execution: cheap work on an idle host lane runs on the executor thread itself.

It must behave exactly like a lane run: dependencies respected, errors reported
(and surfaced as cl.KernelError naming task, kernel, rank and chunk), every
instruction traced under its lane; long kernels (after their first run, which
measures them) and host tasks still go to the lane worker threads.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import Future

import numpy as np
import pytest

import celeritas as cl
from executor.backends import HostBackend
from executor.communicator import SingleRankCommunicator
from executor.executor import Executor
from executor.instruction_handlers import cost_key
from scheduler.geometry import Box
from scheduler.instruction_graph import (HOST_MEMORY, AccessAllocation, AllocInstruction, CopyInstruction,
                                         DeviceKernelInstruction, EpochInstruction, FenceInstruction,
                                         FreeInstruction, HorizonInstruction, HostTaskInstruction, device_memory)

pytestmark = pytest.mark.timeout(60)
from instruction_builder import Graph  # tests/ is on sys.path (conftest)

TIMEOUT = 20


class Harness:
    """An executor on a 1-device host backend; ``run`` submits a batch and waits for its fence."""

    def __init__(self, devices: int = 1, **kw):
        self.backend = HostBackend(devices)
        self.errors = []
        trace = kw.pop("trace", True)
        self.ex = Executor(self.backend, SingleRankCommunicator(), trace=trace,
                           on_error=lambda exc, instr: self.errors.append((exc, instr)), **kw)
        self.ex.start()
        self.g = Graph()
        self.last = self.g.add(EpochInstruction, task=0, action="init")

    def kernel(self, fn, *deps, name="k", device=0, box=Box((0,), (4,)), accesses=()):
        deps = deps or (self.last,)
        self.last = self.g.add(DeviceKernelInstruction, *deps, device=device, task=self.g.next_id, box=box,
                               accesses=list(accesses), launcher=fn, name=name)
        return self.last

    def known_slow(self, instr, seconds: float = 1.0):
        """As if ``instr``'s kind had been measured at ``seconds``: it runs on its lane (and
        may be queued there behind its running predecessors)."""
        self.ex._costs[cost_key(instr)] = int(seconds * 1e9)
        return instr

    def host_task(self, fn, *deps):
        deps = deps or (self.last,)
        self.last = self.g.add(HostTaskInstruction, *deps, task=self.g.next_id, box=Box((0,), (1,)),
                               launcher=fn, name="h")
        return self.last

    def run(self, shape=None):
        fut = Future()
        self.last = self.g.add(FenceInstruction, self.last, task=self.g.next_id, promise=fut)
        self.ex.submit(self.g.batch(shape=shape))
        return fut.result(TIMEOUT)

    def close(self):
        self.g.add(EpochInstruction, self.last, task=self.g.next_id, action="shutdown")
        self.ex.submit(self.g.batch())
        assert self.ex.join(TIMEOUT)
        self.backend.close()

    def lanes_of(self, instrs):
        by_id = {e.instruction_id: e.lane for e in self.ex.trace}
        return [by_id[i.id] for i in instrs]


def _thread_recorder(out):
    def launcher(ctx):
        out.append(threading.current_thread().name)
    return launcher


def test_cheap_kernel_runs_inline_from_its_first_run_and_is_traced_on_its_lane():
    h = Harness()
    try:
        threads = []
        ks = []
        for _ in range(3):
            ks.append(h.kernel(_thread_recorder(threads)))
            h.run()
        executor_thread = h.ex._thread.name
        # the first run (unknown cost) is measured inline, in CPU time; so are the later ones
        assert threads == [executor_thread] * 3
        assert h.ex._costs[("k", 3)] < 1_000_000
        assert h.lanes_of(ks) == ["D0.lane0"] * 3
        assert h.errors == []
    finally:
        h.close()


def test_inline_is_off_with_a_zero_threshold():
    h = Harness(inline_threshold=0)
    try:
        threads = []
        for _ in range(3):
            h.kernel(_thread_recorder(threads))
            h.run()
        assert all(t.startswith("celeritas-D0.lane") for t in threads)
    finally:
        h.close()


def test_long_kernels_and_host_tasks_stay_on_their_lanes():
    # (the quiet threshold as low: a kernel of a few ms alone runs inline under the default)
    h = Harness(inline_threshold=1e-3, inline_quiet_threshold=2e-3)
    try:
        slow, host = [], []

        def sleepy(ctx):
            slow.append(threading.current_thread().name)
            time.sleep(0.005)        # 5 ms: wall time well over the 1 ms threshold

        def busy(ctx):
            slow.append(threading.current_thread().name)
            t = time.thread_time()
            while time.thread_time() - t < 0.003:   # 3 ms of CPU
                pass

        for _ in range(3):
            h.kernel(busy, name="busy")
            h.host_task(_thread_recorder(host))
            h.run()
        # the first run measures the kernel (inline, in CPU time), the later ones use its lane
        assert slow[0] == h.ex._thread.name, slow
        assert all(t.startswith("celeritas-") and "lane" in t for t in slow[1:]), slow
        assert all(t.startswith("celeritas-host.lane") for t in host), host
        slow.clear()
        for _ in range(2):
            h.known_slow(h.kernel(sleepy, name="sleepy"), 5e-3)     # as a lane run measures it
            h.run()
        assert all("lane" in t for t in slow), slow
    finally:
        h.close()


def test_inline_kernels_respect_dependencies_and_lane_order():
    h = Harness()
    try:
        order = []

        def step(i):
            def launcher(ctx):
                order.append(i)
            return launcher

        h.kernel(step(-1), name="s")           # learn the cost of "s"
        h.run()
        order.clear()
        # a diamond plus a chain, all in one batch: 0 -> (1, 2) -> 3 -> 4
        k0 = h.kernel(step(0), name="s")
        k1 = h.kernel(step(1), k0, name="s")
        k2 = h.kernel(step(2), k0, name="s")
        k3 = h.kernel(step(3), k1, k2, name="s")
        h.kernel(step(4), k3, name="s")
        h.run()
        assert order[0] == 0 and sorted(order[1:3]) == [1, 2] and order[3:] == [3, 4]
    finally:
        h.close()


@pytest.mark.parametrize("trace", [True, False])       # untraced: the second batch runs directly
def test_inline_kernel_error_is_reported_and_dependents_never_run(trace):
    h = Harness(trace=trace)
    try:
        for _ in range(2):
            h.kernel(lambda ctx: None, name="maybe")
            h.run()
        ran = []

        def boom(ctx):
            raise ValueError("inline boom")

        bad = h.kernel(boom, name="maybe")
        h.kernel(lambda ctx: ran.append(threading.current_thread().name), bad, name="maybe")
        with pytest.raises(ValueError, match="inline boom"):
            h.run()
        assert ran == []                         # the dependent of the failed kernel is retired unrun
        assert len(h.errors) == 1 and h.errors[0][1] is bad
        if trace:
            assert "D0.lane0" in h.lanes_of([bad])
    finally:
        h.close()


def test_small_copies_run_inline_large_ones_on_the_lane():
    h = Harness(inline_copy_bytes=1024, inline_alone_copy_bytes=0)
    try:
        small, large = Box((0,), (16,)), Box((0,), (1024,))
        a = h.g.add(AllocInstruction, h.last, allocation=1, memory=HOST_MEMORY, box=large, shape=(1024,),
                    dtype=np.float64)
        b = h.g.add(AllocInstruction, h.last, allocation=2, memory=device_memory(0), box=large,
                    shape=(1024,), dtype=np.float64)
        fill = h.g.add(HostTaskInstruction, a, task=1, box=large,
                       accesses=[AccessAllocation(0, 1, large, large)],
                       launcher=lambda ctx: ctx.arrays[0].__setitem__(Ellipsis, np.arange(1024.0)))
        c_small = h.g.add(CopyInstruction, fill, b, source=1, dest=2, source_memory=HOST_MEMORY,
                          dest_memory=device_memory(0), box=small, source_box=large, dest_box=large,
                          size_bytes=small.area * 8)
        h.last = c_small
        h.run()
        assert "D0.lane" not in " ".join(l.name for l in h.backend.lanes)   # no worker was needed
        c_large = h.g.add(CopyInstruction, h.last, source=1, dest=2, source_memory=HOST_MEMORY,
                          dest_memory=device_memory(0), box=large, source_box=large, dest_box=large,
                          size_bytes=large.area * 8)
        h.last = c_large
        h.run()
        assert any(l.name == "D0.lane0" for l in h.backend.lanes)
        np.testing.assert_array_equal(h.ex._allocs[2], np.arange(1024.0))
        assert h.lanes_of([c_small, c_large]) == ["D0.lane0", "D0.lane0"]
    finally:
        h.close()


def _burn(seconds: float):
    def launcher(ctx):
        t = time.thread_time()
        while time.thread_time() - t < seconds:
            pass
    return launcher


def test_a_longer_kernel_runs_inline_when_the_executor_has_nothing_else_to_do():
    """Over ``inline_threshold`` but under ``inline_alone_threshold``: inline once its cost is
    known, as long as no lane work is in flight and nothing else is ready."""
    h = Harness(inline_threshold=1e-4, inline_alone_threshold=0.5)
    try:
        threads = []

        def kernel(ctx):
            threads.append(threading.current_thread().name)
            _burn(2e-3)(ctx)                 # 2 ms of CPU: over 100 us, under 500 ms

        for _ in range(3):
            h.kernel(kernel, name="mid")
            h.run()
        # the first run measures it (inline), the later ones run inline because nothing else can run
        assert threads == [h.ex._thread.name] * 3
        assert h.ex._costs[("mid", 3)] >= 2_000_000
    finally:
        h.close()


def test_a_longer_kernel_stays_on_its_lane_beside_other_work():
    """Two such kernels on two devices, ready together: running one inline would hold the
    other back, so both go to their lanes (once the kind's inline re-measurements,
    ``_probe``, are spent)."""
    from executor.executor import PROBES
    h = Harness(devices=2, inline_threshold=1e-4, inline_alone_threshold=0.5)
    try:
        threads = []

        def kernel(ctx):
            threads.append(threading.current_thread().name)
            _burn(2e-3)(ctx)

        for _ in range(2 * PROBES):          # the first run measures it; later ones, ready beside
            start = h.last                   # the other device's, are the inline re-measurements
            for d in (0, 1):
                last = h.kernel(kernel, start, name="mid", device=d)
            h.run()
            if h.ex._probes.get(cost_key(last), 0) == PROBES:
                break
        assert h.ex._probes.get(cost_key(last), 0) == PROBES
        assert h.ex._thread.name in threads[:4], threads
        threads.clear()
        start = h.last
        for d in (0, 1):
            h.kernel(kernel, start, name="mid", device=d)
        h.run()
        assert sorted(threads) == ["celeritas-D0.lane0", "celeritas-D1.lane0"], threads
    finally:
        h.close()


def test_inline_kernel_error_surfaces_as_kernel_error_naming_task_kernel_rank_chunk():
    q = cl.Queue(devices="host:2")
    b = cl.Buffer(np.zeros(8, np.float32))

    def submit(fail):
        def cgf(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)

            @cgh.parallel_for((8,), name="sometimes")
            def k(chunk):
                if fail and chunk.box.min[0] >= 4:
                    raise ZeroDivisionError("late failure")
                w[chunk] += 1
        q.submit(cgf)

    for _ in range(3):       # the kernel's cost is known: later chunks run inline
        submit(False)
    np.testing.assert_array_equal(q.fence(b).result(TIMEOUT), np.full(8, 3))
    assert q.runtime.executor._costs          # measured
    submit(True)
    with pytest.raises(cl.KernelError) as ei:
        q.wait()
    msg = str(ei.value)
    assert "sometimes" in msg and "rank 0" in msg and "late failure" in msg and "Box" in msg and "T" in msg
    assert isinstance(ei.value.__cause__, ZeroDivisionError)


def test_many_tiny_tasks_end_to_end_with_inline_execution():
    q = cl.Queue(devices="host:4")
    b = cl.Buffer(np.zeros(64, np.int64))

    def cgf(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((64,), lambda chunk: w.__setitem__(chunk, w[chunk] + 1), name="inc")

    for _ in range(200):
        q.submit(cgf)
    np.testing.assert_array_equal(q.fence(b).result(TIMEOUT), np.full(64, 200))
    q.shutdown()


def test_a_repeating_kernel_run_directly_gets_its_chunk_made_once_with_the_launchs_values():
    """The executor keeps the launch context of a repeating step's direct runs, and the
    launcher keeps the chunk it made for it: every launch of one chunk sees the same values
    (box, device, array module, global range and offset); a task of another range (another
    geometry) gets its own chunk."""
    q = cl.Queue(devices="host:2")
    seen: list = []

    def cgf_of(n, offset):
        def cgf(cgh):
            cgh.parallel_for((n,), lambda chunk: seen.append((chunk, chunk.box, chunk.device, chunk.global_range,
                                                               chunk.global_offset, chunk.xp)),
                             offset=(offset,), name="look")
        return cgf

    for _ in range(30):
        q.submit(cgf_of(8, 0))
    q.wait()
    first = list(seen)
    seen.clear()
    for _ in range(30):
        q.submit(cgf_of(8, 4))
    q.wait()
    q.shutdown()
    for runs, offset in ((first, 0), (seen, 4)):
        assert len(runs) == 60
        for chunk, box, device, global_range, global_offset, xp in runs:
            assert chunk.box == box and chunk.device == device and xp is np
            assert tuple(global_range) == (8,) and tuple(global_offset) == (offset,)
            assert box.lo[0] in (offset, offset + 4) and box.hi[0] - box.lo[0] == 4
        assert {(c.offset, c.device) for c, *_ in runs} == {((offset,), 0), ((offset + 4,), 1)}
        # (the objects held here stay alive, so equal ids are one object used again)
        assert max(Counter(id(c) for c, *_ in runs).values()) > 1


@pytest.mark.parametrize("nbytes,queued", [(64, False), (4096, True)])
def test_only_work_too_big_to_run_inline_is_queued_behind_a_running_kernel(nbytes, queued):
    """A copy that depends on a kernel running on its lane: a small one waits for the kernel
    and then runs on the executor thread (no second thread beside the lane's next work); one
    over ``inline_copy_bytes`` is queued on the lane right behind the kernel (eager)."""
    h = Harness(inline_copy_bytes=1024)
    launches = []
    real_launch = h.backend.launch

    def launch(lane, fn, *, dependent=False):
        launches.append(dependent)
        return real_launch(lane, fn, dependent=dependent)

    h.backend.launch = launch
    try:
        n = nbytes // 8
        box = Box((0,), (n,))
        a = h.g.add(AllocInstruction, h.last, allocation=1, memory=device_memory(0), box=box, shape=(n,),
                    dtype=np.float64)
        b = h.g.add(AllocInstruction, h.last, allocation=2, memory=HOST_MEMORY, box=box, shape=(n,),
                    dtype=np.float64)
        k = h.known_slow(h.kernel(lambda ctx: ctx.arrays[0].__setitem__(Ellipsis, 7.0), a, name="long",
                                  box=box, accesses=[AccessAllocation(0, 1, box, box)]))
        h.last = h.g.add(CopyInstruction, k, b, source=1, dest=2, source_memory=device_memory(0),
                         dest_memory=HOST_MEMORY, box=box, source_box=box, dest_box=box, size_bytes=nbytes)
        h.run()
        np.testing.assert_array_equal(h.ex._allocs[2], np.full(n, 7.0))
        # the kernel (known to be long) goes to its lane; the copy only when queued eagerly
        assert launches == ([False, True] if queued else [False])
    finally:
        h.close()


# ---- direct issue: cheap work whose predecessors all completed runs straight from its batch


def _engine_spy(h):
    """Ids of the instructions that went through the engine."""
    seen = []
    real = h.ex._engine.submit

    def submit(instr, deps=None):
        seen.append(instr.id)
        return real(instr, deps)

    h.ex._engine.submit = submit
    return seen


def _host_and_device_arrays(h, n):
    box = Box((0,), (n,))
    a = h.g.add(AllocInstruction, h.last, allocation=1, memory=HOST_MEMORY, box=box, shape=(n,), dtype=np.float64)
    b = h.g.add(AllocInstruction, a, allocation=2, memory=device_memory(0), box=box, shape=(n,), dtype=np.float64)
    h.last = b
    return box


def test_cheap_ready_kernels_and_copies_run_straight_from_their_batch():
    h = Harness(trace=False, inline_copy_bytes=1024)
    try:
        box = _host_and_device_arrays(h, 16)
        acc = [AccessAllocation(0, 2, box, box)]

        def add(v):
            return lambda ctx: ctx.arrays[0].__iadd__(v)

        def copy(*deps):
            h.last = h.g.add(CopyInstruction, *deps, source=2, dest=1, source_memory=device_memory(0),
                             dest_memory=HOST_MEMORY, box=box, source_box=box, dest_box=box, size_bytes=box.area * 8)
            return h.last

        for _ in range(2):                   # learn the kernel's cost and that such copies run inline
            h.kernel(add(1.0), name="add", box=box, accesses=acc)
            copy(h.last)
            h.run()
        seen = _engine_spy(h)
        threads = []
        k0 = h.kernel(lambda ctx: (threads.append(threading.current_thread().name), ctx.arrays[0].__iadd__(10.0)),
                      name="add", box=box, accesses=acc)
        k1 = h.kernel(add(100.0), k0, name="add", box=box, accesses=acc)
        c = copy(k1)
        h.run()
        np.testing.assert_array_equal(h.ex._allocs[1], np.full(16, 112.0))
        assert threads == [h.ex._thread.name]
        assert not {k0.id, k1.id, c.id} & set(seen)          # no engine node for any of them
        assert h.errors == []
    finally:
        h.close()


def test_a_horizon_after_directly_run_work_runs_directly_drops_its_garbage_and_tells_the_runtime():
    """A horizon whose predecessors all ran directly needs no engine node either (its node
    depended on the whole execution front); one with a predecessor still on its lane goes
    through the engine, and both drop their garbage and reach ``on_horizon`` in order."""
    horizons = []
    h = Harness(trace=False, on_horizon=horizons.append)
    try:
        box = _host_and_device_arrays(h, 16)
        acc = [AccessAllocation(0, 2, box, box)]
        h.kernel(lambda ctx: ctx.arrays[0].fill(0.0), name="zero", box=box, accesses=acc)   # (memory is reused)
        for _ in range(2):                   # learn the kernel's cost
            h.kernel(lambda ctx: ctx.arrays[0].__iadd__(1.0), name="add", box=box, accesses=acc)
            h.run()
        seen = _engine_spy(h)
        k = h.kernel(lambda ctx: ctx.arrays[0].__iadd__(1.0), name="add", box=box, accesses=acc)
        h.ex._costs[cost_key(k)] = 1000      # (cheap, whatever a busy machine made of the runs so far)
        hz = h.last = h.g.add(HorizonInstruction, k, task=h.g.next_id, garbage=[1])
        h.run()
        assert not {k.id, hz.id} & set(seen)
        assert horizons == [hz.task]
        assert 1 not in h.ex._allocs and 2 in h.ex._allocs
        slow = h.known_slow(h.kernel(lambda ctx: ctx.arrays[0].__iadd__(1.0), name="slow", box=box, accesses=acc))
        hz2 = h.last = h.g.add(HorizonInstruction, slow, task=h.g.next_id)
        h.run()
        assert {slow.id, hz2.id} <= set(seen)
        assert horizons == [hz.task, hz2.task]
        np.testing.assert_array_equal(h.ex._allocs[2], np.full(16, 4.0))
        assert h.errors == []
    finally:
        h.close()


def test_batches_of_one_shape_share_what_direct_issue_knows_until_copies_of_a_new_pair_run_inline():
    """``InstructionBatch.shape`` (the replay templates a batch was made from): the executor
    works out once per shape which copies would not run directly, and forgets that once
    copies between another pair of memories have run inline (then they run directly too)."""
    h = Harness(trace=False, inline_copy_bytes=1024)
    try:
        box = _host_and_device_arrays(h, 16)
        h.run()
        seen = _engine_spy(h)

        def copy():
            h.last = h.g.add(CopyInstruction, h.last, source=2, dest=1, source_memory=device_memory(0),
                             dest_memory=HOST_MEMORY, box=box, source_box=box, dest_box=box,
                             size_bytes=box.area * 8, priority=1)
            return h.last

        first = copy()
        h.run(shape=(7,))
        assert first.id in seen                 # a pair not seen before: through the engine, inline
        assert (7,) not in h.ex._plans          # (forgotten: the pair now copies directly)
        second = copy()
        h.run(shape=(7,))
        assert second.id not in seen            # straight from its batch
        assert h.ex._plans[(7,)] == (2, 0)      # (the copy runs directly, the batch's fence does not)
        third = copy()
        h.ex._plans[(7,)] = (0, 0)              # what the shape says is what counts
        h.run(shape=(7,))
        assert third.id in seen
        assert h.errors == []
    finally:
        h.close()


def test_direct_issue_waits_for_a_predecessor_still_on_its_lane():
    h = Harness(trace=False)
    try:
        order = []
        h.kernel(lambda ctx: order.append("learn"), name="cheap")
        h.run()
        order.clear()
        seen = _engine_spy(h)

        def slow(ctx):
            time.sleep(0.02)
            order.append("slow")

        s = h.kernel(slow, name="first-of-its-kind")          # unknown cost: to its lane
        d = h.kernel(lambda ctx: order.append("dependent"), s, name="cheap")
        h.run()
        assert order == ["slow", "dependent"]
        assert s.id in seen and d.id in seen                  # the dependent waited in the engine
    finally:
        h.close()


def test_direct_issue_does_not_run_ahead_of_more_urgent_work_later_in_its_batch():
    """A cheap kernel first in the batch, an independent copy too large to run inline
    (priority above the kernel's) after it: the engine issues the copy first, so the
    kernel must not run straight from the batch."""
    h = Harness(trace=False, inline_copy_bytes=64, inline_alone_copy_bytes=0)
    order = []
    real_launch = h.backend.launch

    def launch(lane, fn, *, dependent=False):
        order.append("copy")
        return real_launch(lane, fn, dependent=dependent)

    try:
        box = _host_and_device_arrays(h, 1024)
        for _ in range(2):                   # its cost, then that it runs inline
            h.kernel(lambda ctx: None, name="cheap")
            h.run()
        start = h.last
        seen = _engine_spy(h)
        h.backend.launch = launch
        k = h.kernel(lambda ctx: order.append("kernel"), start, name="cheap")
        c = h.g.add(CopyInstruction, start, source=1, dest=2, source_memory=HOST_MEMORY,
                    dest_memory=device_memory(0), box=box, source_box=box, dest_box=box, size_bytes=box.area * 8,
                    priority=1)                       # as the generator gives copies (PRIORITY_COPY)
        h.last = h.g.add(EpochInstruction, k, c, task=h.g.next_id, action="barrier")
        h.run()
        assert order == ["copy", "kernel"]
        assert k.id in seen
    finally:
        h.close()


@pytest.mark.parametrize("setting,inline", [(None, True), ("0", False), ("1000000", True)])
def test_inline_setting_reaches_the_executor(monkeypatch, setting, inline):
    """CELERITAS_INLINE_US: the threshold (µs) of measured kernel cost under which work runs
    on the executor thread; 0 sends every kernel to its lane."""
    if setting is not None:
        monkeypatch.setenv("CELERITAS_INLINE_US", setting)
    q = cl.Queue(devices="host:1")
    threads = []
    try:
        def cgf(cgh):
            cgh.parallel_for((1,), lambda chunk: threads.append(threading.current_thread().name), name="same")
        for _ in range(3):
            q.submit(cgf)
            q.wait()
        ex = q.runtime.executor
        assert ex._inline_ns == (0 if setting == "0" else 1_000_000_000 if setting else 100_000)
        assert (threads[-1] == ex._thread.name) is inline
    finally:
        q.shutdown()


def test_one_slow_inline_run_does_not_move_a_cheap_kernel_off_the_executor_thread():
    """An inline run's wall time counts preemptions and other threads' GIL turns: one slow
    run leaves the estimate alone and marks the kind suspect; the next run's CPU time
    decides.  Lane runs (CPU time) and runs over a suspect kind count as measured."""
    h = Harness(trace=False, inline_threshold=100e-6)
    try:
        ex = h.ex
        key = ("k", 3)
        ex._costs[key] = 5_000
        ex._note_cost(key, 5_000_000, True)
        assert ex._costs[key] == 5_000 and key in ex._suspect      # still inline
        ex._note_cost(key, 4_000, True)
        assert ex._costs[key] == 4_000                             # a fast run counts at once
        ex._note_cost(key, 5_000_000)                              # CPU time (a lane, a suspect run)
        assert ex._costs[key] == 4_000 + (5_000_000 - 4_000) // 4
        ex._note_cost(key, 9_000_000, True)                        # already over the threshold:
        assert ex._costs[key] == 1_253_000 + (9_000_000 - 1_253_000) // 4   # wall time counts
    finally:
        h.close()


@pytest.mark.parametrize("ran_ns, estimate, suspect", [
    (3_000, 3_000, False),                       # faster than the estimate: counts at once
    (45_000, 5_000 + 40_000 // 4, False),        # slower, the step stays inline: a quarter of the way
    (500_000, 5_000, True),                      # a step past the threshold: left alone, suspect
])
def test_an_inline_runs_wall_time_updates_its_kinds_estimate(monkeypatch, ran_ns, estimate, suspect):
    """What one inline run does to its kind's estimate (threshold 100 us, estimate 5 us),
    on a clock the kernel advances by exactly ``ran_ns``."""
    import executor.instruction_handlers as ih
    clock = [0]
    monkeypatch.setattr(ih, "_perf_ns", lambda: clock[0])
    h = Harness(trace=False, inline_threshold=100e-6)
    try:
        ex = h.ex
        instr = h.kernel(lambda ctx: None, name="k")
        key = cost_key(instr)
        ex._costs[key] = 5_000

        def launcher(ctx):
            clock[0] += ran_ns

        ex._kernel_inline(instr, launcher, None, key, 5_000)
        assert ex._costs[key] == estimate
        assert (key in ex._suspect) == suspect
    finally:
        h.close()


def test_a_kernel_timed_slow_once_inline_still_runs_inline():
    h = Harness(trace=False, inline_threshold=100e-6)
    try:
        threads = []
        slow_once = [True]

        def k(ctx):
            threads.append(threading.current_thread().name)
            if len(threads) == 3 and slow_once[0]:
                slow_once[0] = False
                time.sleep(0.02)                       # "preempted" for 20 ms

        for _ in range(5):
            h.kernel(k, name="cheap")
            h.run()
        executor_thread = h.ex._thread.name
        assert threads == [executor_thread] * 5          # the slow third run did not move it
    finally:
        h.close()


def test_a_kernel_that_became_slow_moves_to_its_lane_after_its_cpu_time_confirmed_it():
    h = Harness(trace=False, inline_threshold=100e-6, inline_alone_threshold=100e-6, inline_quiet_threshold=100e-6)
    try:
        threads = []
        slow = [False]

        def k(ctx):
            threads.append(threading.current_thread().name)
            if slow[0]:
                _burn(5e-3)(ctx)                       # 5 ms of CPU from now on

        for _ in range(2):
            h.kernel(k, name="changes")
            h.run()
        slow[0] = True
        for _ in range(3):
            h.kernel(k, name="changes")
            h.run()
        ex_thread = h.ex._thread.name
        # inline (unknown: measured), inline (cheap), inline (slow: suspect), inline (CPU time
        # confirms), lane
        assert threads[0:4] == [ex_thread] * 4 and threads[4] != ex_thread, threads
    finally:
        h.close()


def _cheap_beside_a_long_kernel(h, threads, slow_s=None):
    """A cheap kernel on device 0 beside a 10 ms one on device 1 (so it is never alone),
    its kind first set to ``slow_s`` where given; returns the cheap kernel."""
    def cheap(ctx):
        threads.append(threading.current_thread().name)

    start = h.last
    a = h.kernel(cheap, start, name="cheap", device=0)
    if slow_s is not None:
        h.known_slow(a, slow_s)
    h.known_slow(h.kernel(lambda ctx: time.sleep(0.01), start, name="long", device=1))
    h.run()
    return a


def test_a_kind_measured_slow_is_measured_inline_up_to_probes_times():
    """A kind's first runs are cold and a lane run's CPU time counts the GIL hand-overs of
    its numpy calls, so an estimate between the inline threshold and
    ``inline_alone_threshold`` gets up to ``PROBES`` inline runs timed in CPU time
    (``_probe``), even beside other work; a cheap kernel then stays inline.  Past that
    the estimate decides: the kernel goes to its lane."""
    from executor.executor import PROBES
    h = Harness(devices=2, trace=False)
    try:
        threads = []
        for _ in range(PROBES):
            a = _cheap_beside_a_long_kernel(h, threads, 500e-6)     # as its lane runs measured it
            assert threads[-1] == h.ex._thread.name, threads
            assert h.ex._costs[cost_key(a)] < 500_000
        assert h.ex._probes[cost_key(a)] == PROBES
        threads.clear()
        _cheap_beside_a_long_kernel(h, threads, 500e-6)          # slow again: no more probes
        assert threads and threads[0].startswith("celeritas-D0.lane"), threads
    finally:
        h.close()


def test_a_measured_run_that_takes_an_inline_kind_over_the_threshold_rearms_its_probes():
    """Once a kind's probes are spent, a run measured in CPU time that moves its estimate
    from inline to over the threshold (a lane run's GIL hand-overs, a cold inline run)
    gives it its probes again, so one noisy figure cannot keep a cheap kernel on the lanes."""
    from executor.executor import PROBES
    h = Harness(devices=2, trace=False)
    try:
        threads = []
        for _ in range(PROBES):
            a = _cheap_beside_a_long_kernel(h, threads, 500e-6)
        key = cost_key(a)
        inline = h.ex._inline_ns
        h.ex._costs[key] = inline - 1000
        h.ex._note_cost(key, 10 * inline)            # a CPU-timed figure: over the threshold
        assert h.ex._costs[key] > inline and key not in h.ex._probes
        for _ in range(PROBES):      # (the probes given back: on a busy machine one may be slow too)
            threads.clear()
            _cheap_beside_a_long_kernel(h, threads)
            assert threads == [h.ex._thread.name], threads
            if h.ex._costs[key] < inline:
                break
        assert h.ex._costs[key] < inline
        h.ex._costs[key] = inline - 1000
        h.ex._note_cost(key, 10 * inline, wall=True)  # wall time: suspect, the estimate kept
        assert h.ex._costs[key] == inline - 1000 and key in h.ex._suspect
    finally:
        h.close()


@pytest.mark.parametrize("at_once", [16, 0])
def test_batches_queued_behind_directly_run_work_are_taken_without_a_step_between(monkeypatch, at_once):
    """The scheduler queues a batch per task while the executor is busy: every batch whose
    work ran straight from it leaves the engine empty, and the loop takes the next one at
    once instead of stepping (polling and issuing nothing) between them.  Checked against
    the loop that steps after every batch (``_BATCHES_AT_ONCE = 0``)."""
    import executor.executor as executor_module
    monkeypatch.setattr(executor_module, "_BATCHES_AT_ONCE", at_once)
    h = Harness(trace=False)
    try:
        gate, entered = threading.Event(), threading.Event()
        gate.set()
        for name in ("cheap", "blocker", "cheap"):          # both kinds' costs: cheap, run directly
            h.kernel(lambda ctx: (entered.set(), gate.wait(TIMEOUT)), name=name)
            h.run()
        gate.clear()
        entered.clear()
        order = []
        h.kernel(lambda ctx: (order.append("blocker"), entered.set(), gate.wait(TIMEOUT)), name="blocker")
        h.ex.submit(h.g.batch())                             # runs on the executor thread, holding its loop
        assert entered.wait(TIMEOUT)
        for i in range(8):                                   # queued meanwhile, one batch per "task"
            h.kernel(lambda ctx, i=i: order.append(i), name="cheap")
            h.ex.submit(h.g.batch())
        polls = []
        real_poll = h.ex._poll_comm
        h.ex._poll_comm = lambda: (polls.append(len(order)), real_poll())[1]
        fut = Future()
        h.last = h.g.add(FenceInstruction, h.last, task=h.g.next_id, promise=fut)
        h.ex.submit(h.g.batch())
        gate.set()
        fut.result(TIMEOUT)
        assert order == ["blocker", *range(8)]
        if at_once:
            # no step between the blocker's batch and the fence's: all eight ran first
            assert polls and polls[0] == 9 and len(polls) <= 3
        else:
            assert [p for p in polls if p < 9] == list(range(1, 9))   # a step after every batch
        assert h.errors == []
    finally:
        del h.ex._poll_comm
        h.close()


def test_a_direct_kernel_keeps_its_launch_context_while_its_accesses_list_is_the_same():
    """A replayed kernel comes with the accesses list of its last replay (the scheduler's
    compiled builder keeps it), so direct runs reuse the launch context built for that list
    and set only the task (names compared by value); another list, even an equal one, gets
    its own context; a kernel that waited in the engine and then runs inline takes it too;
    and when an allocation goes, no context keeps its array."""
    h = Harness(trace=False, inline_threshold=1.0)     # (cheap however slow this machine is now)
    try:
        box = _host_and_device_arrays(h, 16)
        acc = [AccessAllocation(0, 2, box, box)]
        seen = []

        def add(ctx):
            seen.append((ctx, ctx.task, ctx.arrays[0] is h.ex._allocs[2]))
            ctx.arrays[0][...] += 1.0

        def kernel(accesses):
            # (a name made at each submit, as f"hop{src}{dst}" is: equal, never the same object)
            k = h.kernel(add, name="".join(["a", "dd"]), box=box)
            k.accesses = accesses
            return k

        for _ in range(2):                   # its cost, then that it runs inline
            kernel(acc)
            h.run()
        seen.clear()
        h.ex._allocs[2][...] = 0.0           # (a new allocation is not initialized)
        engine = _engine_spy(h)
        ks = [kernel(acc) for _ in range(3)]
        other = kernel([AccessAllocation(0, 2, box, box)])
        h.run()
        assert h.errors == []
        assert not {k.id for k in ks} & set(engine)          # all ran directly
        assert [t for _c, t, _a in seen] == [k.task for k in ks + [other]]
        assert all(a for _c, _t, a in seen)
        assert seen[0][0] is seen[1][0] is seen[2][0] and seen[3][0] is not seen[0][0]
        ctx = seen[0][0]
        np.testing.assert_array_equal(h.ex._allocs[2], np.full(16, 4.0))
        # a kernel that waited in the engine (behind one on its lane) and then runs inline
        # takes the same context
        seen.clear()
        slow = h.known_slow(h.kernel(lambda ctx: time.sleep(0.02), name="slow"), 5.0)   # (past the 1 s threshold)
        waited = kernel(acc)
        waited.deps = [(slow.id, "read")]
        h.run()
        assert waited.id in engine and [(c, t) for c, t, _a in seen] == [(ctx, waited.task)]
        h.last = h.g.add(FreeInstruction, h.last, allocation=2, memory=device_memory(0))
        h.run()
        assert 2 not in h.ex._allocs and not h.ex._contexts
        assert h.errors == []
    finally:
        h.close()


def test_a_longer_kernel_run_inline_alone_keeps_its_launch_context():
    """A kernel over ``inline_threshold`` that runs inline because nothing else can run (as
    wave_sim's step does on 2 ranks at 256²) takes the context kept for its accesses list, as
    a cheap one does, instead of a new one each run; its first run (which measures it) and the
    probe of a kind measured slow still go through the general path."""
    h = Harness(trace=False, inline_threshold=1e-4, inline_alone_threshold=0.5)
    try:
        box = _host_and_device_arrays(h, 16)
        acc = [AccessAllocation(0, 2, box, box)]
        seen = []

        def kernel(ctx):
            seen.append((ctx, ctx.task, threading.current_thread().name))
            ctx.arrays[0][...] = ctx.task    # (a new allocation is not initialized: not +=)
            _burn(1e-3)(ctx)                 # 1 ms of CPU: over 100 us, under 500 ms

        ks = []
        for _ in range(4):
            k = h.kernel(kernel, name="mid", box=box)
            k.accesses = acc
            ks.append(k)
            h.run()
        assert h.errors == []
        assert [t for _c, t, _n in seen] == [k.task for k in ks]
        assert {n for _c, _t, n in seen} == {h.ex._thread.name}
        assert h.ex._costs[("mid", (16).bit_length())] >= 1_000_000
        # the first run built a context of its own (measured through _dispatch); from the
        # second on, one kept context serves every run
        assert seen[1][0] is seen[2][0] is seen[3][0] and seen[0][0] is not seen[1][0]
        np.testing.assert_array_equal(h.ex._allocs[2], np.full(16, float(ks[-1].task)))
    finally:
        h.close()
