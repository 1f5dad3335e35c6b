"""Command-graph behaviours restated from two files of the C++ Celerity runtime's tests:

* test/command_graph_general_tests.cc (dependencies between execution commands, pushes and
  await-pushes; collective groups, side effects, epochs, fences; diagnostics), and
* test/command_graph_granularity_tests.cc (how a task is split into one chunk per rank:
  granularity, split constraints, the split_2d hint, no empty chunks, empty accesses).

Each docstring names the Celerity TEST_CASE it restates and the property pinned; where
celeritas differs in an implementation detail, the docstring says how and the test pins
the semantic property.  Graph tests build every rank's commands with ``GraphContext``
(nothing runs); the few value tests run a small in-process cluster.  A Celerity nd-range
kernel's work-group size is, for splitting, a granularity: celeritas' handler turns
``local_range`` (and ``cl.constrain_split``) into the task geometry's granularity (their
lcm), so the graph tests give that granularity directly.
"""
import threading

import numpy as np
import pytest

import celeritas as cl
from celeritas import range_mappers as rm
from celeritas.testing import run_cluster
from scheduler import command_graph as cg
from scheduler import task_graph as tg
from scheduler.errors import DiagnosticError
from scheduler.geometry import Box, Region, Subrange

from graph_context import GraphContext

R, W, RW, DW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE


# ---- helpers ------------------------------------------------------------------------------
def ctx_n(n, **kw) -> GraphContext:
    return GraphContext(n, compile_ranks=[], **kw)


def one(cmds):
    assert len(cmds) == 1, cmds
    return cmds[0]


def exe(ctx, r, t):
    """The one command (execution or fence) of task ``t`` on rank ``r``."""
    return one([c for c in ctx.cmds(r, task=t.id) if c.kind in (cg.EXECUTION, cg.FENCE, cg.EPOCH)])


def depends(c, on, kind=None) -> bool:
    """``c`` directly depends on ``on`` (with dependency kind ``kind`` if given)."""
    d = c.deps.get(on.id)
    return d is not None and (kind is None or d[0] == kind)


def ancestors(ctx, rank, cmd, kinds=None) -> set[int]:
    """Ids of the transitive predecessors of ``cmd`` on ``rank`` (following only
    dependencies of the kinds in ``kinds``, if given)."""
    by_id = {c.id: c for c in ctx.commands[rank]}
    seen: set[int] = set()
    stack = [d for d, (k, _o) in cmd.deps.items() if kinds is None or k in kinds]
    while stack:
        d = stack.pop()
        if d in seen:
            continue
        seen.add(d)
        stack.extend(x for x, (k, _o) in by_id[d].deps.items() if kinds is None or k in kinds)
    return seen


def concurrent(ctx, rank, a, b) -> bool:
    """Neither command of ``rank`` transitively depends on the other."""
    return a.id not in ancestors(ctx, rank, b) and b.id not in ancestors(ctx, rank, a)


def successors(ctx, rank, cmd) -> list:
    """The commands of ``rank`` that directly depend on ``cmd``."""
    return [c for c in ctx.commands[rank] if cmd.id in c.deps]


def reg1(lo, hi) -> Region:
    return Region.from_box(Box((lo,), (hi,)))


def exec_boxes(ctx, t) -> dict:
    """rank -> box of task ``t``'s execution command, for the ranks that have one."""
    out = {}
    for r in range(ctx.num_ranks):
        cmds = ctx.cmds(r, cg.EXECUTION, task=t.id)
        assert len(cmds) <= 1
        if cmds:
            out[r] = cmds[0].box
    return out


# =================================================================================================
# command_graph_general_tests.cc
# =================================================================================================
def test_remote_data_is_awaited_before_the_reader():
    """command_graph_general_tests.cc "command_graph_generator generates dependencies for
    execution commands" ("if data is produced remotely"): two kernels write two buffers on 2
    ranks; a master-node task reading all of both makes rank 0 await rank 1's half of each
    buffer (one await-push per buffer, for exactly that half) and the reader truly depends on
    both await-pushes."""
    ctx = ctx_n(2)
    b0, b1 = ctx.buffer((128,)), ctx.buffer((128,))
    ctx.task((128,), [(b0, rm.one_to_one(), DW)])
    ctx.task((128,), [(b1, rm.one_to_one(), DW)])
    tc = ctx.task((1,), [(b0, rm.all(), R), (b1, rm.all(), R)], kind=tg.MASTER_NODE)
    awaits = ctx.cmds(0, cg.AWAIT_PUSH)
    assert len(awaits) == 2
    assert sorted(a.transfer[1] for a in awaits) == [b0, b1]
    assert all(a.region == reg1(64, 128) for a in awaits)
    assert all(depends(exe(ctx, 0, tc), a, "true") for a in awaits)
    assert ctx.cmds(1, cg.AWAIT_PUSH) == [] and ctx.cmds(1, cg.EXECUTION, task=tc.id) == []


def test_remote_data_already_received_is_not_awaited_again():
    """command_graph_general_tests.cc "command_graph_generator generates dependencies for
    execution commands" ("if data is produced remotely but already available from an earlier
    task"): a second master-node reader of the same data makes no new await-push; it depends
    directly on the await-push made for the first reader."""
    ctx = ctx_n(2)
    b0 = ctx.buffer((128,))
    ctx.task((128,), [(b0, rm.one_to_one(), DW)])
    ctx.task((1,), [(b0, rm.all(), R)], kind=tg.MASTER_NODE)
    aw = one(ctx.cmds(0, cg.AWAIT_PUSH))
    tc = ctx.task((1,), [(b0, rm.all(), R)], kind=tg.MASTER_NODE)
    assert ctx.cmds(0, cg.AWAIT_PUSH) == [aw]
    assert depends(exe(ctx, 0, tc), aw, "true")
    assert one(ctx.cmds(1, cg.PUSH)).task.id != tc.id   # (rank 1 pushed once, for the first reader)


def test_locally_produced_data_gives_true_dependencies():
    """command_graph_general_tests.cc "command_graph_generator generates dependencies for
    execution commands" ("if data is produced locally"): a one_to_one reader of two buffers
    written one_to_one truly depends, on each rank, on both writers' execution commands and
    needs no transfer."""
    ctx = ctx_n(2)
    b0, b1 = ctx.buffer((128,)), ctx.buffer((128,))
    ta = ctx.task((128,), [(b0, rm.one_to_one(), DW)])
    tb = ctx.task((128,), [(b1, rm.one_to_one(), DW)])
    tc = ctx.task((128,), [(b0, rm.one_to_one(), R), (b1, rm.one_to_one(), R)])
    for r in range(2):
        assert depends(exe(ctx, r, tc), exe(ctx, r, ta), "true")
        assert depends(exe(ctx, r, tc), exe(ctx, r, tb), "true")
        assert ctx.cmds(r, cg.PUSH) == [] and ctx.cmds(r, cg.AWAIT_PUSH) == []


def test_reader_depends_on_every_local_writer_of_its_range():
    """command_graph_general_tests.cc "command_graph_generator builds dependencies to all local
    commands if a given range is produced by multiple": on one rank, three kernels write one
    third of a buffer each (by offset); a reader of the whole buffer depends on all three."""
    ctx = ctx_n(1)
    b = ctx.buffer((96,))
    writers = [ctx.task((32,), [(b, rm.one_to_one(), DW)], offset=(32 * i,)) for i in range(3)]
    assert [exe(ctx, 0, w).box for w in writers] == [Box((32 * i,), (32 * i + 32,)) for i in range(3)]
    td = ctx.task((96,), [(b, rm.one_to_one(), R)])
    for w in writers:
        assert depends(exe(ctx, 0, td), exe(ctx, 0, w), "true")


def test_anti_dependency_where_only_another_rank_has_the_true_dependency():
    """command_graph_general_tests.cc "command_graph_generator generates anti-dependencies for
    execution commands that have a task-level true dependency": task A writes buffers 0 and 1;
    task B reads buffer 0 only in rank 1's chunk (so it truly depends on A at task level) and
    overwrites buffer 1.  Rank 0's execution of B reads nothing of A, yet must still come
    after A's (which wrote what it overwrites); on rank 1 it depends on A's as well."""
    ctx = ctx_n(2)
    b0, b1 = ctx.buffer((128,)), ctx.buffer((128,))
    ta = ctx.task((128,), [(b0, rm.one_to_one(), DW), (b1, rm.one_to_one(), DW)])

    def second_rank_reads(chunk, shape):
        if chunk.range[0] == 128:
            return Subrange((64,), (64,))
        return Subrange(chunk.offset, chunk.range) if chunk.offset[0] == 64 else Subrange((0,), (0,))

    tb = ctx.task((128,), [(b0, second_rank_reads, R), (b1, rm.one_to_one(), DW)])
    assert ctx.tasks()[tb.id].deps[ta.id][0] == tg.TRUE_DEP
    assert depends(exe(ctx, 0, tb), exe(ctx, 0, ta), "anti")
    assert depends(exe(ctx, 1, tb), exe(ctx, 1, ta), "true")


def test_reader_of_another_buffer_is_no_anti_dependency():
    """command_graph_general_tests.cc "command_graph_generator correctly handles
    anti-dependency edge cases" ("correctly handles false anti-dependencies that consume a
    different buffer from the last writer"): A writes buffers 0 and 1, B reads buffer 0, C
    overwrites buffer 1: B and C touch no common buffer and stay concurrent."""
    ctx = ctx_n(1)
    b0, b1 = ctx.buffer((128,)), ctx.buffer((128,))
    ta = ctx.task((128,), [(b0, rm.one_to_one(), DW), (b1, rm.one_to_one(), DW)])
    tb = ctx.task((128,), [(b0, rm.one_to_one(), R)])
    tc = ctx.task((128,), [(b1, rm.one_to_one(), DW)])
    assert concurrent(ctx, 0, exe(ctx, 0, tb), exe(ctx, 0, tc))
    assert depends(exe(ctx, 0, tc), exe(ctx, 0, ta), "anti")


def test_anti_successor_of_the_last_writer_is_no_anti_dependency():
    """command_graph_general_tests.cc "command_graph_generator correctly handles
    anti-dependency edge cases" ("does not consider anti-successors of last writer as
    potential anti-dependencies"): A writes buffers 0 and 1, B overwrites buffer 0 (an
    anti-successor of A), C overwrites buffer 1: B and C stay concurrent."""
    ctx = ctx_n(1)
    b0, b1 = ctx.buffer((128,)), ctx.buffer((128,))
    ta = ctx.task((128,), [(b0, rm.one_to_one(), DW), (b1, rm.one_to_one(), DW)])
    tb = ctx.task((128,), [(b0, rm.one_to_one(), DW)])
    tc = ctx.task((128,), [(b1, rm.one_to_one(), DW)])
    assert depends(exe(ctx, 0, tb), exe(ctx, 0, ta), "anti")
    assert concurrent(ctx, 0, exe(ctx, 0, tb), exe(ctx, 0, tc))


def test_overwrite_without_reader_anti_depends_on_the_producer():
    """command_graph_general_tests.cc "command_graph_generator generates anti-dependencies onto
    the original producer if no consumer exists in between": two consecutive discard_writes
    of the same buffer: on each rank the second execution command follows the first."""
    ctx = ctx_n(2)
    b = ctx.buffer((128,))
    ta = ctx.task((128,), [(b, rm.one_to_one(), DW)])
    tb = ctx.task((128,), [(b, rm.one_to_one(), DW)])
    for r in range(2):
        assert depends(exe(ctx, r, tb), exe(ctx, r, ta), "anti")


@pytest.mark.parametrize("writer", [0, 1])
def test_overwrite_anti_depends_on_the_push_of_the_same_task(writer):
    """command_graph_general_tests.cc "command_graph_generator generates anti-dependencies for
    execution commands onto pushes within the same task" (both sections: either rank
    writes): A writes a buffer one_to_one on 2 ranks; B reads all of it on both ranks while
    only rank ``writer`` overwrites its own half.  Each rank pushes its half to the other once;
    the writer's execution of B must wait for its push (which reads what it overwrites), the
    other rank's execution of B has no reason to wait for its push."""
    other = 1 - writer
    ctx = ctx_n(2)
    b = ctx.buffer((128,))
    ctx.task((128,), [(b, rm.one_to_one(), DW)])
    lo = 64 * writer

    def only_writer_writes(chunk, shape):
        if chunk.range[0] == 128:
            return Subrange((lo,), (64,))
        return Subrange(chunk.offset, chunk.range) if chunk.offset[0] == lo else Subrange((0,), (0,))

    tb = ctx.task((128,), [(b, rm.all(), R), (b, only_writer_writes, DW)])
    push_w, push_o = one(ctx.cmds(writer, cg.PUSH)), one(ctx.cmds(other, cg.PUSH))
    assert dict(push_w.targets) == {other: reg1(lo, lo + 64)}
    assert dict(push_o.targets) == {writer: reg1(64 - lo, 128 - lo)}
    assert depends(exe(ctx, writer, tb), push_w, "anti")
    assert not depends(exe(ctx, other, tb), push_o)
    assert concurrent(ctx, other, exe(ctx, other, tb), push_o)


def test_host_initialized_buffers_give_anti_dependencies():
    """command_graph_general_tests.cc "command_graph_generator generates anti-dependencies for
    commands accessing host-initialized buffers": A reads host-initialized buffer 0, B
    overwrites it (anti-dependency onto A on each rank), C overwrites host-initialized buffer
    1, which nobody read: C is concurrent with A and B."""
    ctx = ctx_n(2)
    b0 = ctx.buffer((128,), host_init=True)
    b1 = ctx.buffer((128,), host_init=True)
    ta = ctx.task((128,), [(b0, rm.one_to_one(), R)])
    tb = ctx.task((128,), [(b0, rm.one_to_one(), DW)])
    tc = ctx.task((128,), [(b1, rm.one_to_one(), DW)])
    for r in range(2):
        assert depends(exe(ctx, r, tb), exe(ctx, r, ta), "anti")
        assert concurrent(ctx, r, exe(ctx, r, tc), exe(ctx, r, ta))
        assert concurrent(ctx, r, exe(ctx, r, tc), exe(ctx, r, tb))


def test_collective_commands_of_one_group_are_serialized():
    """command_graph_general_tests.cc "command_graph_generator generates pseudo-dependencies for
    collective commands in the same collective group": after a master-node task, two
    collective host tasks of the default group and two of an explicit group.  Each collective
    command is concurrent with the master-node task; commands of different groups are
    concurrent; the second command of each group depends on the first (on every rank).
    (celeritas numbers collective groups: 0 is the default group, 1 an explicit one.)"""
    ctx = ctx_n(2)
    ta = ctx.task((1,), kind=tg.MASTER_NODE, name="task a")
    i1 = ctx.task((2,), kind=tg.COLLECTIVE, collective_group=0, name="implicit 1")
    i2 = ctx.task((2,), kind=tg.COLLECTIVE, collective_group=0, name="implicit 2")
    e1 = ctx.task((2,), kind=tg.COLLECTIVE, collective_group=1, name="explicit 1")
    e2 = ctx.task((2,), kind=tg.COLLECTIVE, collective_group=1, name="explicit 2")
    for t in (i1, i2, e1, e2):
        assert concurrent(ctx, 0, exe(ctx, 0, t), exe(ctx, 0, ta))
    for r in range(2):
        for a in (i1, i2):
            for b in (e1, e2):
                assert concurrent(ctx, r, exe(ctx, r, a), exe(ctx, r, b))
        assert depends(exe(ctx, r, i2), exe(ctx, r, i1), "true")
        assert depends(exe(ctx, r, e2), exe(ctx, r, e1), "true")


def test_side_effects_order_commands_affecting_the_same_host_object():
    """command_graph_general_tests.cc "side effects generate appropriate command-dependencies"
    (sequential order, the only one Celerity defines; celeritas side effects have no order
    parameter): three host tasks over 2 items on 2 ranks affect host objects {a},
    {common, b} and {common}.  The first two only depend on the init epoch (one per rank);
    the third depends on exactly one command per rank: the second task's."""
    ho_common, ho_a, ho_b = 0, 1, 2
    ctx = ctx_n(2)
    t0 = ctx.task((2,), kind=tg.HOST_COMPUTE, side_effects=[ho_a])
    t1 = ctx.task((2,), kind=tg.HOST_COMPUTE, side_effects=[ho_common, ho_b])
    t2 = ctx.task((2,), kind=tg.HOST_COMPUTE, side_effects=[ho_common])
    for r in range(2):
        epoch = one(ctx.cmds(r, cg.EPOCH))
        assert list(exe(ctx, r, t0).deps) == [epoch.id]
        assert list(exe(ctx, r, t1).deps) == [epoch.id]
        assert exe(ctx, r, t2).deps == {exe(ctx, r, t1).id: (tg.TRUE_DEP, tg.ORIGIN_SIDE_EFFECT)}


def test_epochs_serialize_task_commands_on_every_rank():
    """command_graph_general_tests.cc "epochs serialize task commands on every node": two
    kernels depend on the init epoch and an epoch depends on both (one command each per
    rank).  Commands after the epoch depend on it (the last epoch, never the init one): a
    read_write and a discard_write of a fresh host-initialized buffer both follow the epoch,
    the second also the first, and none of them depends on anything older than the epoch."""
    ctx = ctx_n(2)
    ta = ctx.task((2,), name="task a")
    tb = ctx.task((2,), name="task b")
    ep = ctx.epoch(tg.EPOCH_NONE)
    buf = ctx.buffer((2,), host_init=True)
    tc = ctx.task((2,), [(buf, rm.one_to_one(), RW)], name="task c")
    td = ctx.task((2,), [(buf, rm.one_to_one(), DW)], name="task d")
    for r in range(2):
        init, epoch = ctx.cmds(r, cg.EPOCH)
        assert epoch.task.id == ep.id
        for t in (ta, tb):
            assert exe(ctx, r, t).deps == {init.id: (tg.TRUE_DEP, tg.ORIGIN_LAST_EPOCH)}
            assert depends(epoch, exe(ctx, r, t), "true")
        c, d = exe(ctx, r, tc), exe(ctx, r, td)
        assert depends(c, epoch, "true") and depends(d, epoch)
        assert depends(d, c, "anti")
        assert ancestors(ctx, r, d) == {epoch.id, c.id} | ancestors(ctx, r, epoch)
        assert set(c.deps) == {epoch.id} and set(d.deps) <= {epoch.id, c.id}


def test_back_to_back_epochs_form_a_chain():
    """command_graph_general_tests.cc "a sequence of epochs without intermediate commands has
    defined behavior": init, barrier and shutdown epochs with nothing in between: on each
    rank every epoch has exactly one predecessor (the previous epoch), which has exactly one
    successor."""
    ctx = ctx_n(2)
    ctx.epoch(tg.EPOCH_BARRIER)
    ctx.epoch(tg.EPOCH_SHUTDOWN)
    for r in range(2):
        epochs = ctx.cmds(r, cg.EPOCH)
        assert len(epochs) == 3 and len(ctx.commands[r]) == 3
        for before, after in zip(epochs, epochs[1:]):
            assert list(after.deps) == [before.id]
            assert successors(ctx, r, before) == [after]


def test_every_command_after_an_epoch_truly_depends_on_it_transitively():
    """command_graph_general_tests.cc "all commands have a transitive true-dependency on the
    preceding epoch": a kernel writes a 1-element buffer (on rank 0 only) and reduces into
    another; an epoch; then a kernel that overwrites a host-initialized buffer and reads the
    written buffer (push / await-push) and one that reads the reduction result (push,
    await-push and reduction command on each rank).  Every command after the epoch, on every
    rank, reaches the epoch through true dependencies alone."""
    ctx = ctx_n(2)
    b1 = ctx.buffer((2,), host_init=True)
    b2, b3 = ctx.buffer((1,)), ctx.buffer((1,))
    ctx.task((2,), [(b2, rm.one_to_one(), DW)], reductions=[ctx.reduction(b3)])
    ep = ctx.epoch(tg.EPOCH_NONE)
    ctx.task((2,), [(b1, rm.one_to_one(), DW), (b2, rm.all(), R)], name="task a")
    ctx.task((2,), [(b3, rm.all(), R)], name="task b")
    assert len(ctx.cmds(0, cg.PUSH)) == 2 and len(ctx.cmds(1, cg.AWAIT_PUSH)) == 2
    for r in range(2):
        epoch = one([c for c in ctx.cmds(r, cg.EPOCH) if c.task.id == ep.id])
        after = [c for c in ctx.commands[r] if c.id > epoch.id]
        assert {c.kind for c in after} >= {cg.EXECUTION, cg.PUSH, cg.AWAIT_PUSH, cg.REDUCTION}
        for c in after:
            assert epoch.id in ancestors(ctx, r, c, kinds={tg.TRUE_DEP}), (r, c.kind, c.deps)


def test_fence_on_a_host_object_orders_its_users():
    """command_graph_general_tests.cc "fences introduce dependencies on host objects": a
    collective host task affecting a host object, a fence of the host object, another such
    task: on each rank one command each, chained task -> fence -> task."""
    ctx = ctx_n(2)
    ta = ctx.task((2,), kind=tg.COLLECTIVE, collective_group=0, side_effects=[0])
    fence = ctx.tm.fence(host_object=0)
    tb = ctx.task((2,), kind=tg.COLLECTIVE, collective_group=0, side_effects=[0])
    for r in range(2):
        f = one(ctx.cmds(r, cg.FENCE))
        assert f.task.id == fence.id
        assert depends(f, exe(ctx, r, ta), "true")
        assert depends(exe(ctx, r, tb), f, "true")


def test_fence_on_a_buffer_orders_its_writers_and_transfers():
    """command_graph_general_tests.cc "fences introduce dependencies on buffers": a master-node
    task writes a 2-element buffer, a fence of the buffer, then a collective task overwrites
    it one_to_one.  Rank 0 runs the writer and pushes the buffer to rank 1 (which awaits it)
    for its fence; the fence follows the writer on rank 0 and the await-push on rank 1; on
    both ranks the overwrite follows the fence."""
    ctx = ctx_n(2)
    b = ctx.buffer((2,))
    ta = ctx.task((1,), [(b, rm.all(), DW)], kind=tg.MASTER_NODE)
    fence = ctx.fence(b)
    tb = ctx.task((2,), [(b, rm.one_to_one(), DW)], kind=tg.COLLECTIVE, collective_group=0)
    assert [len(ctx.cmds(r, cg.EXECUTION, task=ta.id)) for r in range(2)] == [1, 0]
    assert [len(ctx.cmds(r, cg.PUSH)) for r in range(2)] == [1, 0]
    assert [len(ctx.cmds(r, cg.AWAIT_PUSH)) for r in range(2)] == [0, 1]
    push, aw = one(ctx.cmds(0, cg.PUSH)), one(ctx.cmds(1, cg.AWAIT_PUSH))
    assert dict(push.targets) == {1: reg1(0, 2)} and aw.region == reg1(0, 2)
    assert depends(push, exe(ctx, 0, ta), "true")
    f0, f1 = exe(ctx, 0, fence), exe(ctx, 1, fence)
    assert f0.kind == f1.kind == cg.FENCE
    assert depends(f0, exe(ctx, 0, ta), "true")
    assert depends(f1, aw, "true")
    for r, f in ((0, f0), (1, f1)):
        assert depends(exe(ctx, r, tb), f)


@pytest.mark.parametrize("case", ["fully uninitialized", "partially, locally", "partially, remotely"])
def test_uninitialized_read_is_an_error(case):
    """command_graph_general_tests.cc "command_graph_generator throws in tests if it detects an
    uninitialized read" (three sections).  Celerity turns off its task-level check to reach
    the command-level one; celeritas checks reads of never-written data once, at task level
    (a chunk's read lies inside the whole range's, which the command graph checks), so with
    diagnostics="error" each section raises there, naming the task, the never-written region
    and the buffer."""
    ctx = ctx_n(2, diagnostics="error")
    if case == "fully uninitialized":
        b = ctx.buffer((1,))
        access, missing = rm.all(), "Region([[0], [1]])"
    else:
        b = ctx.buffer((2,))
        ctx.task((1,), [(b, rm.one_to_one(), DW)])
        access = rm.all() if case == "partially, locally" else rm.one_to_one()
        missing = "Region([[1], [2]])"
    with pytest.raises(DiagnosticError, match=r"uninitialized read") as info:
        ctx.task((2,), [(b, access, R)], name="uninitialized")
    assert f'"uninitialized" reads {missing} of buffer B0' in str(info.value)


@pytest.mark.parametrize("case", ["all", "neighborhood"])
def test_overlapping_writes_between_ranks_are_an_error(case):
    """command_graph_general_tests.cc "command_graph_generator throws in tests if it detects
    overlapping writes" (both sections): on 2 ranks and a 20x20 buffer, a kernel that writes
    all of it from every chunk overlaps in the whole buffer; a host task writing a
    one-element neighborhood of its chunk overlaps in rows 9 and 10.  Both are errors naming
    the task, the overlapping region and the buffer."""
    ctx = ctx_n(2, diagnostics="error")
    b = ctx.buffer((20, 20))
    if case == "all":
        kw, mapper, region = {"name": "all-write"}, rm.all(), "Region([[0, 0], [20, 20]])"
    else:
        kw = {"name": "host neighborhood", "kind": tg.HOST_COMPUTE}
        mapper, region = rm.neighborhood(1, 1), "Region([[9, 0], [11, 20]])"
    with pytest.raises(DiagnosticError, match="overlapping writes") as info:
        ctx.task((20, 20), [(b, mapper, DW)], **kw)
    assert f'"{kw["name"]}" writes {region} of buffer B0' in str(info.value)
    assert "ranks 0 and 1" in str(info.value)


# =================================================================================================
# command_graph_granularity_tests.cc
# =================================================================================================
@pytest.mark.parametrize("tail", [(), (19,), (19, 31)])
def test_split_respects_task_granularity(tail):
    """command_graph_granularity_tests.cc "command_graph_generator respects task granularity when
    splitting" (1-, 2- and 3-D): on 4 ranks, a plain range of 255 rows gives chunks of 63 or
    64 rows summing to 255; an nd-range of 256 rows in work groups of 32 gives four chunks
    of 64; one of 320 rows gives chunks of 64 or 96 rows summing to 320.  Chunks never cut
    the inner dimensions, cover the range and are cut at whole work groups."""
    ctx = ctx_n(4)
    gran = (32,) + tail

    def rows(t):
        boxes = exec_boxes(ctx, t)
        assert all(b.range[1:] == tail for b in boxes.values())
        assert Region(list(boxes.values())) == Region.from_box(t.geometry.box)
        return [boxes[r].range[0] for r in sorted(boxes)]

    simple = rows(ctx.task((255,) + tail))
    assert set(simple) <= {63, 64} and sum(simple) == 255
    perfect = ctx.task((256,) + tail, granularity=gran)
    assert rows(perfect) == [64] * 4
    rebalance = ctx.task((320,) + tail, granularity=gran)
    rebalanced = rows(rebalance)
    assert set(rebalanced) <= {64, 96} and sum(rebalanced) == 320
    for t in (perfect, rebalance):
        assert all(b.offset[0] % 32 == 0 for b in exec_boxes(ctx, t).values())


def test_split_constraints_apply_to_the_command_graph():
    """command_graph_granularity_tests.cc "command_graph_generator respects split constraints"
    (graph shape): on 4 ranks, 128 items split at multiples of 64 make two chunks of 64 (on
    ranks 0 and 1); an nd-range of 192 in work groups of 32 further constrained to multiples
    of 3 is split at multiples of lcm(32, 3) = 96: two chunks of 96."""
    ctx = ctx_n(4)
    ta = ctx.task((128,), granularity=(64,))
    assert exec_boxes(ctx, ta) == {0: Box((0,), (64,)), 1: Box((64,), (128,))}
    tb = ctx.task((192,), granularity=(96,))
    assert exec_boxes(ctx, tb) == {0: Box((0,), (96,)), 1: Box((96,), (192,))}


def _constrained_chunks(rank):
    q = cl.Queue()
    b = cl.Buffer(shape=(192,), dtype=np.int32)
    seen, lock = [], threading.Lock()

    def constrained(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.discard_write)
        cl.constrain_split(cgh, 3)

        @cgh.parallel_for((192,), local_range=(32,), name="constrained")
        def kernel(chunk):
            with lock:
                seen.append((chunk.offset[0], chunk.range[0]))
            w[chunk] = chunk.arange(0)

    q.submit(constrained)
    values = q.fence(b).result()
    q.wait()
    return sorted(seen), values


def test_constrained_nd_range_kernel_splits_at_the_lcm():
    """command_graph_granularity_tests.cc "command_graph_generator respects split constraints"
    (values, through the public API): a kernel over 192 items with local_range 32 and
    ``cl.constrain_split(cgh, 3)`` on 4 ranks runs as two chunks of 96 (ranks 0 and 1; ranks
    2 and 3 run nothing), and writes every element."""
    results = run_cluster(_constrained_chunks, nodes=4, devices=1)
    assert [seen for seen, _ in results] == [[(0, 96)], [(96, 96)], [], []]
    for _, values in results:
        np.testing.assert_array_equal(values, np.arange(192))


def test_split_2d_hint_makes_square_chunks():
    """command_graph_granularity_tests.cc "command_graph_generator creates 2-dimensional chunks
    when providing the split_2d hint": 128x128 on 4 ranks makes four 64x64 chunks, one per
    rank, covering the range."""
    ctx = ctx_n(4)
    t = ctx.task((128, 128), split="2d")
    boxes = exec_boxes(ctx, t)
    assert sorted(boxes) == [0, 1, 2, 3]
    assert all(b.range == (64, 64) for b in boxes.values())
    assert Region(list(boxes.values())) == Region.from_box(Box((0, 0), (128, 128)))


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("nd_range", [False, True])
def test_split_makes_no_empty_chunks(dims, nd_range):
    """command_graph_granularity_tests.cc "command_graph_generator does not create empty chunks"
    (1-, 2-, 3-D; simple and nd-range sections): on 3 ranks, a range of 2 rows (or of 16 rows
    in work groups of 8) has only two units of work: ranks 0 and 1 each get half the rows,
    rank 2 gets no execution command."""
    ctx = ctx_n(3)
    if nd_range:
        rng, gran = (16, 2, 2)[:dims], (8, 1, 1)[:dims]
    else:
        rng, gran = (2, 2, 2)[:dims], None
    t = ctx.task(rng, granularity=gran)
    boxes = exec_boxes(ctx, t)
    assert sorted(boxes) == [0, 1]
    half = (rng[0] // 2,) + rng[1:]
    assert boxes[0].range == boxes[1].range == half
    assert boxes[0].offset[0] == 0 and boxes[1].offset[0] == rng[0] // 2


def test_empty_accesses_make_no_transfers_or_dependencies():
    """command_graph_granularity_tests.cc "buffer accesses with empty ranges do not generate
    pushes or data-flow dependencies": 2 ranks write a 16-element buffer one_to_one; a kernel
    over 8 items reads [4, end of its chunk): empty for rank 0's chunk [0, 4), [4, 8) for rank
    1's.  At task level the reader depends on the writer; at command level rank 0's empty
    read makes no dependency, and the only transfer is rank 0 pushing [4, 8) to rank 1, which
    awaits it; the reader's execution commands are concurrent with the writer's."""
    ctx = ctx_n(2)
    b = ctx.buffer((16,))
    writer = ctx.task((16,), [(b, rm.one_to_one(), DW)])

    def window(chunk, shape):
        end = chunk.offset[0] + chunk.range[0]
        return Subrange((4,), (max(0, end - 4),))

    reader = ctx.task((8,), [(b, window, R)])
    assert writer.id in ctx.tasks()[reader.id].deps
    for r in range(2):
        assert concurrent(ctx, r, exe(ctx, r, reader), exe(ctx, r, writer))
    assert [len(ctx.cmds(r, cg.PUSH)) for r in range(2)] == [1, 0]
    assert [len(ctx.cmds(r, cg.AWAIT_PUSH)) for r in range(2)] == [0, 1]
    assert dict(one(ctx.cmds(0, cg.PUSH)).targets) == {1: reg1(4, 8)}
    aw = one(ctx.cmds(1, cg.AWAIT_PUSH))
    assert aw.region == reg1(4, 8)
    assert depends(exe(ctx, 1, reader), aw, "true")
    assert set(exe(ctx, 0, reader).deps) == {one(ctx.cmds(0, cg.EPOCH)).id}
