"""Scheduler and split behaviours restated from the C++ Celerity runtime's tests
(test/scheduler_tests.cc and test/split_tests.cc) that celeritas had no test for.

Each docstring names the Celerity TEST_CASE it restates and the property pinned.  The
scheduler cases are driven through ``GraphContext`` (which feeds every command through the
same ``Lookahead`` the scheduler thread uses) unless they are about the thread itself; a
Celerity "flush" is ``Lookahead.flush``, as the scheduler's ``FlushRequested`` event does.
Where Celerity's exact shape is an implementation detail celeritas does differently, the
test pins the semantic property and the docstring says so.  Every graph test ends with
``ig_validator.validate`` (no races, no leaks, no lost data).

split_tests.cc cases whose exact behaviour tests/test_split.py already pins with a concrete
example are not repeated here (see the section header below).
"""
from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import pytest

from celeritas import range_mappers as rm
from scheduler import task_graph as tg
from scheduler.geometry import Box, Subrange
from scheduler.instruction_graph import HOST_MEMORY
from scheduler.instruction_graph_generator import SystemInfo
from scheduler.scheduler import Scheduler
from scheduler.split import split_1d, split_2d

from graph_context import GraphContext
from ig_validator import validate

R, W, RW, DW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE


def fixed1(offset: int, size: int):
    """A 1-D fixed range mapper: ``size`` elements from ``offset``."""
    return rm.fixed(Subrange((offset,), (size,)))


def fixed2(offset, size):
    return rm.fixed(Subrange(tuple(offset), tuple(size)))


def count(ctx, kind: str, rank: int = 0) -> int:
    return sum(1 for i in ctx.instructions[rank] if i.kind == kind)


def kinds(ctx, rank: int = 0) -> Counter:
    return Counter(i.kind for i in ctx.instructions[rank])


def one(xs):
    assert len(xs) == 1, xs
    return xs[0]


def flush(ctx) -> None:
    """Compile every command lookahead holds (Celerity's ``flush_commands``)."""
    for r in ctx.compile_ranks:
        out: list = []
        ctx.lookaheads[r].flush(out)
        ctx._collect(r, out)


def create_host_objects(ctx, hoids) -> None:
    for igg in ctx.iggs.values():
        for h in hoids:
            igg.create_host_object(h)


def destroy_host_objects(ctx, hoids) -> None:
    """As the runtime does at shutdown: flush lookahead, then one destroy per host object."""
    flush(ctx)
    for r, igg in ctx.iggs.items():
        for h in hoids:
            ctx.instructions[r].extend(igg.destroy_host_object(h))


def wait_until(cond, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.001)
    return cond()


def grid(origin, rows):
    """The chunks of a 2-D split written as Celerity's split tests draw them: ``rows`` is a
    list of ``(height, [width, ...])`` in row-major order, laid out from ``origin``."""
    out = []
    x = origin[0]
    for height, widths in rows:
        y = origin[1]
        for w in widths:
            out.append(Box((x, y), (x + height, y + w)))
            y += w
        x += height
    return out


# =================================================================================================
# scheduler_tests.cc
# =================================================================================================
@pytest.mark.parametrize("lookahead", ["none", "auto", "infinite"])
def test_commands_that_allocate_nothing_are_compiled_at_once(lookahead):
    """scheduler_tests.cc "scheduler compiles non-allocating commands immediately": in every
    lookahead mode, kernels that access nothing (next to buffers and host objects nobody
    accesses) are compiled as soon as they are submitted: after the k-th submission the
    instruction graph is the init epoch and k kernels.  At shutdown, unaccessed buffers cost
    nothing (no alloc, no free) and every host object gets one destroy: 2N + 2 instructions."""
    n = 16
    ctx = GraphContext(1, lookahead=lookahead)
    assert [(i.kind, i.action) for i in ctx.instructions[0]] == [("epoch", tg.EPOCH_INIT)]
    create_host_objects(ctx, range(n))
    for k in range(1, n + 1):
        ctx.buffer((1,))
        ctx.task((1,), [])
        assert kinds(ctx) == Counter({"epoch": 1, "device_kernel": k})
    destroy_host_objects(ctx, range(n))
    ctx.finish()
    assert len(ctx.instructions[0]) == 2 * n + 2
    assert kinds(ctx) == Counter({"device_kernel": n, "destroy_host_object": n, "epoch": 2})
    validate(ctx)


def _rw_chain(ctx, steps: int, probe=None) -> int:
    """One discard-write then ``steps - 1`` read-writes of a 1-element buffer (a dependency
    chain, so horizons come every ``horizon_step`` tasks).  ``probe(k)`` runs after k tasks."""
    b = ctx.buffer((1,))
    ctx.task((1,), [(b, rm.all(), DW)])
    for k in range(1, steps):
        if probe is not None:
            probe(k)
        ctx.task((1,), [(b, rm.all(), RW)])
    return b


def test_auto_lookahead_flushes_at_the_second_horizon_after_the_allocating_command():
    """scheduler_tests.cc "scheduler(lookahead::automatic) flushes allocating commands after
    two horizons" (horizon step 4): a discard-write that allocates followed by read-writes
    that allocate nothing more.  Up to the 7th task nothing is compiled (the allocating
    command and everything behind it is held); the 8th task brings the second horizon, and
    two horizons without a new allocation mean the allocations reached a steady state: all 8
    kernels are compiled, with one allocation of the single element."""
    ctx = GraphContext(1, lookahead="auto", horizon_step=4)

    def probe(k):
        assert len(ctx.cmds(0, "execution")) == k
        assert count(ctx, "device_kernel") == 0

    _rw_chain(ctx, 8, probe)
    assert len(ctx.cmds(0, "horizon")) == 2
    assert len(ctx.cmds(0, "execution")) == 8
    assert count(ctx, "device_kernel") == 8
    assert one(ctx.instrs(0, "alloc")).box == Box((0,), (1,))
    ctx.finish()
    validate(ctx)


@pytest.mark.parametrize("to", ["auto", "infinite"])
def test_any_change_of_lookahead_mode_compiles_what_is_held(to):
    """scheduler.cc (set_lookahead: "flushing on all changes to the lookahead setting"): a
    command held under ``infinite`` (or ``auto``) is compiled when the mode changes to any
    other mode, not only to ``none``, so that no held command is judged by another mode's rule;
    then the new mode holds again from the next command that needs memory."""
    start = "infinite" if to == "auto" else "auto"
    ctx = GraphContext(1, lookahead=start, horizon_step=4)
    b = ctx.buffer((1,))
    ctx.task((1,), [(b, rm.all(), DW)])
    ctx.task((1,), [(b, rm.all(), RW)])
    assert count(ctx, "device_kernel") == 0                   # (held: the first needs memory)
    out: list = []
    ctx.lookaheads[0].set_mode(to, out)
    ctx._collect(0, out)
    assert count(ctx, "device_kernel") == 2
    assert ctx.lookaheads[0].mode == to and ctx.lookaheads[0].held == []
    c = ctx.buffer((4,))
    ctx.task((4,), [(c, rm.one_to_one(), DW)])
    assert count(ctx, "device_kernel") == 2                   # (held again under the new mode)
    ctx.finish()
    assert count(ctx, "device_kernel") == 3
    validate(ctx)


def test_auto_lookahead_holds_allocating_commands_until_horizons_show_a_steady_state():
    """scheduler_tests.cc "scheduler(lookahead::automatic) flushes allocating commands after
    two horizons", the part celeritas shares (horizon step 4): nothing is compiled while
    fewer than two horizons have passed the allocating command, and once horizons show no
    new allocation the held commands are compiled by themselves (no flush, epoch or fence),
    in order, with a single allocation of the element and no resize, and stay compiled at
    once after that."""
    ctx = GraphContext(1, lookahead="auto", horizon_step=4)
    seen = []

    def probe(k):
        seen.append((k, len(ctx.cmds(0, "horizon")), count(ctx, "device_kernel")))

    _rw_chain(ctx, 12, probe)
    assert all(kernels == 0 for _, horizons, kernels in seen if horizons < 2)
    assert len(ctx.cmds(0, "horizon")) == 3
    kernels = ctx.instrs(0, "device_kernel")
    assert [k.task for k in kernels] == [c.task.id for c in ctx.cmds(0, "execution")]
    assert one(ctx.instrs(0, "alloc")).box == Box((0,), (1,))
    assert ctx.instrs(0, "copy") == []
    ctx.finish()
    validate(ctx)


def test_no_lookahead_compiles_and_allocates_every_growing_command_at_once():
    """scheduler_tests.cc "scheduler(lookahead::none) does not attempt to elide allocations":
    with lookahead none, a write to a new element every step is compiled when submitted (k
    kernels after k steps) and each step allocates its own element then and there (k
    allocations, the last one exactly the new element).  (The final count of 20 allocations
    and the warning that suggests lookahead are pinned already by test_instruction_graph.py's
    test_growing_writes_without_lookahead_allocate_every_time.)"""
    n = 20
    ctx = GraphContext(1, lookahead="none", diagnostics="off")
    b = ctx.buffer((n,))
    for i in range(n):
        assert count(ctx, "device_kernel") == i
        ctx.task((1,), [(b, fixed1(i, 1), DW)])
        assert count(ctx, "device_kernel") == i + 1
        allocs = ctx.instrs(0, "alloc")
        assert len(allocs) == i + 1 and allocs[-1].box == Box((i,), (i + 1,))
    ctx.finish()
    validate(ctx)


def test_infinite_lookahead_holds_commands_until_flushed():
    """scheduler_tests.cc "scheduler(lookahead::infinite) does not flush commands unless forced
    to" (horizon step 2): after an allocating discard-write, read-writes that allocate nothing
    pass four horizons, yet nothing (no alloc, no kernel) is compiled; an explicit flush
    compiles all 8 kernels with a single allocation of the element."""
    ctx = GraphContext(1, lookahead="infinite", horizon_step=2)

    def probe(k):
        assert len(ctx.cmds(0, "execution")) == k
        assert count(ctx, "alloc") == 0 and count(ctx, "device_kernel") == 0

    _rw_chain(ctx, 8, probe)
    assert len(ctx.cmds(0, "horizon")) == 4
    assert kinds(ctx) == Counter({"epoch": 1})
    flush(ctx)
    assert one(ctx.instrs(0, "alloc")).box == Box((0,), (1,))
    assert count(ctx, "device_kernel") == 8
    ctx.finish()
    validate(ctx)


def test_auto_lookahead_keeps_holding_while_allocations_keep_growing():
    """scheduler_tests.cc "scheduler(lookahead::automatic) delays flushing while reallocations
    are pending" (horizon step 2): two buffers of 10, swapped every step, step i reading
    [0, i) of one and writing [0, i + 1) of the other.  Every step needs a larger
    allocation, so although more than two horizons pass nothing is compiled; the flush then
    allocates each buffer once at its final extent ([0, 10) for the last written, [0, 9)
    for the other) and compiles the 10 kernels.  Nothing is freed before shutdown, where
    both allocations are."""
    n = 10
    ctx = GraphContext(1, lookahead="auto", horizon_step=2)
    a, b = ctx.buffer((n,)), ctx.buffer((n,))
    ctx.task((1,), [(a, rm.one_to_one(), DW)])
    for i in range(1, n):
        ctx.task((1,), [(a, fixed1(0, i), R), (b, fixed1(0, i + 1), DW)])
        a, b = b, a
    assert len(ctx.cmds(0, "horizon")) > 2
    assert len(ctx.cmds(0, "execution")) == n
    assert count(ctx, "horizon") == 0 and count(ctx, "device_kernel") == 0
    flush(ctx)
    allocs = ctx.instrs(0, "alloc")
    assert len(allocs) == 2
    assert one([x for x in allocs if x.buffer == a]).box == Box((0,), (n,))
    assert one([x for x in allocs if x.buffer == b]).box == Box((0,), (n - 1,))
    assert ctx.instrs(0, "copy") == []          # no resize
    assert count(ctx, "free") == 0
    assert count(ctx, "device_kernel") == n
    ctx.finish()
    assert sorted(f.allocation for f in ctx.instrs(0, "free")) == sorted(x.allocation for x in allocs)
    validate(ctx)


@pytest.mark.parametrize("lookahead", ["auto", "infinite"])
@pytest.mark.parametrize("sync", ["epoch", "fence"])
def test_epochs_and_fences_flush_held_commands(lookahead, sync):
    """scheduler_tests.cc "epochs and fences implicitly flush the scheduler queue": 20 writes,
    each to a new element, are all held (only the init epoch is compiled); an epoch or a
    fence compiles them all: 20 kernels, and the epoch or the fence itself.  Being held
    until then, they share one device allocation of all 20 elements."""
    n = 20
    ctx = GraphContext(1, lookahead=lookahead)
    b = ctx.buffer((n,))
    for i in range(n):
        ctx.task((1,), [(b, fixed1(i, 1), DW)])
    assert [i.kind for i in ctx.instructions[0]] == ["epoch"]
    if sync == "epoch":
        ctx.epoch(tg.EPOCH_NONE)
    else:
        ctx.fence(b)
    assert count(ctx, "device_kernel") == n
    assert count(ctx, "epoch") == 1 + (sync == "epoch")
    assert count(ctx, "fence") == (sync == "fence")
    assert one([x for x in ctx.instrs(0, "alloc") if x.memory >= 2]).box == Box((0,), (n,))
    ctx.finish()
    validate(ctx)


def _host_merge_program(lookahead: str) -> GraphContext:
    ctx = GraphContext(2, lookahead=lookahead, compile_ranks=[0], diagnostics="off")
    b = ctx.buffer((1024, 1024), np.float32, host_init=True)
    ctx.task((2, 1024), [(b, rm.one_to_one(), DW)])                              # rank r writes row r
    ctx.task((2, 1024), [(b, fixed2((0, 0), (2, 1024)), R)])                      # rank 0: push 0, await 1
    ctx.task((1,), [(b, fixed2((2, 0), (1, 1024)), R)], kind=tg.HOST_COMPUTE)     # host-read row 2
    ctx.task((1,), [(b, fixed2((3, 0), (1, 1024)), DW)], kind=tg.HOST_COMPUTE)    # host-write row 3
    ctx.fence(b, Box((4, 0), (5, 1024)))                                          # fence row 4
    ctx.finish()
    return ctx


def test_lookahead_merges_the_host_allocation_needed_by_every_command_type():
    """scheduler_tests.cc "scheduler lookahead merges host-buffer allocations from all command
    types": on rank 0 of 2, a pushed row (staged through host memory), an awaited row
    (received into host memory), a host task's read of host-initialized data and a host
    task's write all need the buffer in host memory; with auto lookahead they get one host
    allocation, rows [0, 4) x 1024 floats, and no resize (no host-to-host copy).  Without
    lookahead each of them allocates separately.  (Celerity also stages the fence of row 4
    through that allocation, making it rows [0, 5); celeritas copies a fence straight into
    its user allocation, so row 4 needs no host allocation: the test pins the merge.)"""
    ctx = _host_merge_program("auto")
    host = [a for a in ctx.instrs(0, "alloc") if a.memory == HOST_MEMORY and a.buffer == 0]
    alloc = one(host)
    assert alloc.box == Box((0, 0), (4, 1024))
    assert alloc.size_bytes == 4 * 1024 * np.dtype(np.float32).itemsize
    assert [c for c in ctx.instrs(0, "copy") if c.source_memory == c.dest_memory == HOST_MEMORY] == []
    # what shares it: the staged push, the receive, the host reads and writes
    assert one(ctx.instrs(0, "send")).source == alloc.allocation
    assert one(ctx.instrs(0, "receive")).dest == alloc.allocation
    assert {a.allocation for h in ctx.instrs(0, "host_task") for a in h.accesses} == {alloc.allocation}
    validate(ctx)

    unmerged = _host_merge_program("none")
    assert len([a for a in unmerged.instrs(0, "alloc") if a.memory == HOST_MEMORY and a.buffer == 0]) == 4
    validate(unmerged)


@pytest.mark.parametrize("split", ["1d", "2d"])
@pytest.mark.parametrize("oversubscribe", [1, 4])
def test_auto_lookahead_allocates_each_buffer_once_per_device_in_wave_sim(split, oversubscribe):
    """scheduler_tests.cc "scheduler(lookahead::automatic) avoids reallocations in the wave_sim
    pattern": 4 devices, horizon step 2, 10 steps of a 2-D stencil (read a neighbourhood of
    1 of one buffer, discard-write the other, swap), split 1-D or 2-D, oversubscribed 1x or
    4x: exactly one allocation per buffer and device (8), all freed at shutdown (8), and no
    resize copy within a memory.  (A 256 x 256 grid instead of 16384 x 16384: the validator
    replays each allocation element by element; the allocation pattern does not depend on
    the size.  test_instruction_graph.py's test_wave_sim_on_four_devices_with_auto_lookahead
    covers a read-write variant with a 1-D split only.)"""
    num_devices, n = 4, 256
    ctx = GraphContext(1, devices=num_devices, lookahead="auto", horizon_step=2)
    a, b = ctx.buffer((n, n)), ctx.buffer((n, n))
    ctx.task((n, n), [(a, rm.one_to_one(), DW)], split=split, oversubscribe=oversubscribe)
    for _ in range(1, 10):
        ctx.task((n, n), [(a, rm.neighborhood(1, 1), R), (b, rm.one_to_one(), DW)],
                 split=split, oversubscribe=oversubscribe)
        a, b = b, a
    ctx.finish()
    allocs = ctx.instrs(0, "alloc")
    assert len(allocs) == 2 * num_devices
    assert sorted((x.memory, x.buffer) for x in allocs) == sorted(
        (2 + d, bid) for d in range(num_devices) for bid in (0, 1))
    assert count(ctx, "free") == 2 * num_devices
    assert [c for c in ctx.instrs(0, "copy") if c.source_memory == c.dest_memory] == []
    assert count(ctx, "device_kernel") == 10 * num_devices * oversubscribe
    validate(ctx)


def test_auto_lookahead_allocates_once_per_device_in_the_rsim_pattern():
    """scheduler_tests.cc "scheduler(lookahead::automatic) avoids reallocations in the RSim
    pattern": 4 devices, horizon step 2, a 4096 x 4096 buffer, a 1-D kernel over 4096 columns
    where step i reads rows [0, i) and writes row i of its columns.  The read region grows
    every step, yet lookahead gives each device one allocation (rows [0, 10) of its quarter
    of the columns) and one free; no resize copy."""
    num_devices, n, steps = 4, 4096, 10
    ctx = GraphContext(1, devices=num_devices, lookahead="auto", horizon_step=2)
    b = ctx.buffer((n, n))
    for i in range(steps):
        def read_rows(chunk, shape, i=i):
            return Subrange((0, chunk.offset[0]), (i, chunk.range[0]))

        def write_row(chunk, shape, i=i):
            return Subrange((i, chunk.offset[0]), (1, chunk.range[0]))

        ctx.task((n,), [(b, read_rows, R), (b, write_row, DW)])
    ctx.finish()
    allocs = ctx.instrs(0, "alloc")
    assert len(allocs) == num_devices
    q = n // num_devices
    assert sorted((x.memory, x.box) for x in allocs) == [
        (2 + d, Box((0, d * q), (steps, (d + 1) * q))) for d in range(num_devices)]
    assert count(ctx, "free") == num_devices
    assert ctx.instrs(0, "copy") == []
    validate(ctx)


class _GatedDelegate:
    """A scheduler delegate whose ``submit`` waits while ``gate`` is clear (Celerity's test
    slows its delegate's flush the same way to keep the scheduler busy)."""

    def __init__(self):
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.batches = []

    def submit(self, batch):
        self.entered.set()
        self.gate.wait(10)
        self.batches.append(batch)


def test_scheduler_thread_reports_idle_and_busy():
    """scheduler_tests.cc "scheduler reports idle and busy phases": a scheduler thread is idle
    before it gets work; while it processes an event (here: blocked handing the init epoch to
    a slow delegate) it is busy, and it stays busy while more events (a buffer, a kernel, host
    objects, a lookahead change, a flush) queue up behind; once they are processed it is idle
    again, and again after the shutdown epoch.  As in Celerity ("while the queue is full the
    scheduler remains busy"), the events processed back to back are one busy phase: one busy
    interval for the init epoch and the seven queued behind it, one for the shutdown epoch;
    the intervals do not overlap.  (Celerity reports the transitions through delegate
    callbacks; celeritas exposes them as ``Scheduler.idle`` and ``busy_intervals``, which the
    test polls.)"""
    dlg = _GatedDelegate()
    sched = Scheduler(num_ranks=1, rank=0, system=SystemInfo(1), delegate=dlg, lookahead="auto")
    sched.busy_intervals = []
    sched.start()
    try:
        assert sched.idle
        dlg.gate.clear()
        tm = tg.TaskManager(on_task=sched.notify_task)          # posts the init epoch
        assert dlg.entered.wait(10)
        assert not sched.idle
        info = tm.create_buffer(0, (8,), np.dtype(np.float32), "", False)
        sched.notify_buffer_created(info)
        tm.submit(tg.DEVICE_COMPUTE, geometry=tg.TaskGeometry(1, (1,), (0,), (1,)), accesses=[])
        sched.notify_host_object_created(0)
        sched.notify_host_object_destroyed(0)
        sched.set_lookahead("none")
        sched.flush()
        sched.notify_buffer_destroyed(0)
        assert not sched.idle
        dlg.gate.set()
        assert wait_until(lambda: sched.idle and len(sched.busy_intervals) == 1)
        assert sched.busy_ns > 0
        compiled = [i.kind for b in dlg.batches for i in b.instructions]
        assert compiled == ["epoch", "device_kernel", "destroy_host_object"]

        tm.epoch(tg.EPOCH_SHUTDOWN)
        assert wait_until(lambda: sched.idle and len(sched.busy_intervals) == 2)
        assert [i.kind for i in dlg.batches[-1].instructions] == ["epoch"]
        assert dlg.batches[-1].instructions[0].action == tg.EPOCH_SHUTDOWN
    finally:
        dlg.gate.set()
        sched.stop(10)
    assert sched.idle
    spans = sched.busy_intervals
    assert all(t0 <= t1 for t0, t1 in spans)
    assert all(spans[k][1] <= spans[k + 1][0] for k in range(len(spans) - 1))


# =================================================================================================
# split_tests.cc
#
# Already pinned by tests/test_split.py with a concrete example of the same behaviour:
#   "split_1d creates evenly sized chunks if possible"           test_split_1d_examples (8 on 8)
#   "split_1d distributes remainder evenly"                     test_behaviours_item_6_split_sizes
#   "split_1d creates fewer chunks than requested if mandated by granularity"
#                                                               test_split_1d_examples (128 g64 on 4)
#   "split_1d preserves offset of original chunk"               test_split_1d_examples (3..19 g4)
#   "split_1d preserves ranges of original chunk in other dimensions"
#                                                               test_split_1d_examples (3x4x5 on 3)
#   "split_2d produces perfectly square chunks if possible"     test_behaviours_item_6_split_sizes
#   "split_2d minimizes edge lengths for non-square domains"    test_split_2d_examples (300x100, 100x300)
#   "split_2d preserves offset of original chunk"               test_split_2d_examples (10,20 offsets)
#   "split_2d preserves ranges of original chunk in other dimensions"
#                                                               test_split_2d_examples (8x8x7 on 4)
#   "the behavior of split_2d on 1-dimensional chunks is well-defined"
#                                                               test_split_2d_examples, test_split_2d_properties
# =================================================================================================
def test_split_1d_deals_whole_granules_larger_chunks_first():
    """split_tests.cc "split_1d respects granularity constraints": 80 elements in granules of
    16 on 3 chunks: five granules dealt out 2, 2, 1, so 32, 32, 16, contiguous from 0."""
    chunks = split_1d(Box((0,), (80,)), (16, 1, 1), 3)
    assert chunks == [Box((0,), (32,)), Box((32,), (64,)), Box((64,), (80,))]


@pytest.mark.parametrize("full, granularity, num_chunks, rows", [
    # simple constrained split: 4 rows x 2 columns
    ((128, 128), (8, 8), 8, [(32, [64, 64])] * 4),
    # non-square box, granularity leaves one column: 8 rows
    ((256, 128), (8, 128), 8, [(32, [128])] * 8),
    # very imbalanced granularity: still 2 x 2
    ((128, 128), (32, 8), 4, [(64, [64, 64])] * 2),
], ids=["simple", "one_column", "imbalanced"])
def test_split_2d_respects_granularity(full, granularity, num_chunks, rows):
    """split_tests.cc "split_2d respects granularity constraints" (its three sections): the
    grid and every chunk edge follow the granularity, chunks in row-major order."""
    assert split_2d(Box((0, 0), full), granularity, num_chunks) == grid((0, 0), rows)


@pytest.mark.parametrize("full, granularity, num_chunks, rows", [
    ((100, 100), (1, 1), 6, [(34, [50, 50]), (33, [50, 50]), (33, [50, 50])]),
    ((128, 120), (8, 8), 4, [(64, [64, 56])] * 2),
    ((128, 128), (16, 8), 12, [(32, [48, 40, 40])] * 4),
], ids=["unconstrained", "constrained_1", "constrained_2"])
def test_split_2d_distributes_remainder_evenly(full, granularity, num_chunks, rows):
    """split_tests.cc "split_2d distributes remainder evenly" (its three sections): along each
    dimension the leftover elements (or whole granules) go one each to the first rows or
    columns, so sizes differ by at most one granule."""
    assert split_2d(Box((0, 0), full), granularity, num_chunks) == grid((0, 0), rows)


def test_split_2d_makes_fewer_chunks_when_granularity_demands():
    """split_tests.cc "split_2d creates fewer chunks than requested if mandated by
    granularity": 128 x 128 in 64 x 64 granules on 3 chunks: 3 is prime, so the grid is 1-D,
    and only two granules fit along a dimension: two 64 x 128 rows."""
    assert split_2d(Box((0, 0), (128, 128)), (64, 64, 1), 3) == grid((0, 0), [(64, [128])] * 2)


@pytest.mark.parametrize("granularity, rows", [
    ((8, 64), [(32, [64, 64])] * 4),
    ((64, 8), [(64, [32, 32, 32, 32])] * 2),
], ids=["case_1", "case_2"])
def test_split_2d_transposes_the_grid_to_fit_granularity(granularity, rows):
    """split_tests.cc "split_2d transposes split to better fit granularity constraints": 8
    chunks of 128 x 128 factor as 4 x 2 or 2 x 4; the orientation is the one that the
    granularity allows in full (4 rows of 2 when columns come in 64s, 2 rows of 4 when
    rows do)."""
    assert split_2d(Box((0, 0), (128, 128)), granularity, 8) == grid((0, 0), rows)
