"""Task-graph behaviours restated from the C++ Celerity runtime's test/task_graph_tests.cc
(and the task-level part of test/graph_compaction_tests.cc) that celeritas had no test for.

Each docstring names the Celerity TEST_CASE it restates and the property pinned.  The
tests drive the task manager through ``GraphContext`` (no commands are compiled to
instructions: ``compile_ranks=[]``).
"""
import logging

import pytest

from celeritas import range_mappers as rm
from scheduler import task_graph as tg
from scheduler.errors import DiagnosticError
from scheduler.geometry import Box, Subrange

from graph_context import GraphContext

R, W, RW, DW, DRW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE, tg.DISCARD_READ_WRITE


def ctx1(**kw) -> GraphContext:
    return GraphContext(1, compile_ranks=[], **kw)


def fixed(lo, hi):
    return rm.fixed(Subrange((lo,), (hi - lo,)))


def fixed2(offset, size):
    return rm.fixed(Subrange(tuple(offset), tuple(size)))


def deps(ctx, t) -> dict[int, str]:
    """dependency id -> kind ("true" / "anti")"""
    return {d: k for d, (k, _o) in ctx.tasks()[t.id].deps.items()}


def dependents(ctx, t) -> list[int]:
    return [u.id for u in ctx.tasks().values() if t.id in u.deps]


def horizons(ctx) -> list[tg.Task]:
    return sorted((t for t in ctx.tasks().values() if t.kind == tg.HORIZON), key=lambda t: t.id)


def init_epoch(ctx) -> tg.Task:
    return min((t for t in ctx.tasks().values() if t.kind == tg.EPOCH), key=lambda t: t.id)


def master(ctx, accesses=(), **kw) -> tg.Task:
    return ctx.task((1,), accesses, kind=tg.MASTER_NODE, **kw)


# ---- dependencies between two tasks are unique -------------------------------------------
@pytest.mark.parametrize("first,second,expected", [
    ((DW, DW), (R, R), "true"),            # true dependencies through both buffers
    ((DW, DW), (DW, DW), "anti"),          # anti-dependencies through both buffers
    ((DW, DW), (R, DW), "true"),           # true declared first, anti second
    ((DW, DW), (DW, R), "true"),           # anti declared first, true second
])
def test_one_dependency_per_task_pair_and_true_wins_over_anti(first, second, expected):
    """task_graph_tests.cc "task_manager does not create multiple dependencies between the
    same tasks": two buffers linking the same pair of tasks give one dependency; when one
    buffer makes it true and the other anti, it is true whatever the declaration order."""
    ctx = ctx1()
    a, b = ctx.buffer((128,)), ctx.buffer((128,))
    ta = master(ctx, [(a, fixed(0, 128), first[0]), (b, fixed(0, 128), first[1])])
    tb = master(ctx, [(a, fixed(0, 128), second[0]), (b, fixed(0, 128), second[1])])
    d = deps(ctx, tb)
    assert d[ta.id] == expected
    # (a task with only anti-dependencies also depends on the epoch, as in Celerity)
    assert set(d) == ({ta.id} if expected == "true" else {ta.id, init_epoch(ctx).id})
    assert dependents(ctx, ta) == [tb.id]


def test_dependencies_follow_the_range_mapper_result():
    """task_graph_tests.cc "task_manager respects range mapper results for finding
    dependencies": on a host-initialized buffer, reading all of it after a write of its first
    half depends on the writer and on the init epoch (which wrote the second half); reading
    only the second half does not depend on the writer."""
    ctx = ctx1()
    b = ctx.buffer((128,), host_init=True)
    init = init_epoch(ctx)
    ta = ctx.task((128,), [(b, fixed(0, 64), DW)])
    tb = ctx.task((128,), [(b, fixed(0, 128), R)])
    assert deps(ctx, tb) == {ta.id: "true", init.id: "true"}
    tc = ctx.task((128,), [(b, fixed(64, 128), R)])
    assert deps(ctx, tc) == {init.id: "true"}
    assert ctx.tasks()[tc.id].deps[init.id][1] == tg.ORIGIN_DATAFLOW


def test_host_initialized_and_uninitialized_buffers():
    """task_graph_tests.cc "task_manager correctly handles host-initialized buffers": reading a
    host-initialized buffer depends on the init epoch, reading a never-written one does not
    (a true dependency through another buffer keeps the fallback epoch dependency away);
    overwriting the host-initialized buffer anti-depends on its reader, overwriting the
    never-written one does not order behind its (garbage) reader."""
    ctx = ctx1(diagnostics="off")
    host = ctx.buffer((128,), host_init=True)
    raw = ctx.buffer((128,))
    art = ctx.buffer((1,))
    init = init_epoch(ctx)
    ta = ctx.task((128,), [(host, fixed(0, 128), R), (art, rm.all(), DW)])
    assert deps(ctx, ta) == {init.id: "true"}
    tb = ctx.task((128,), [(raw, fixed(0, 128), R), (art, rm.all(), R)])
    assert deps(ctx, tb) == {ta.id: "true"}
    tc = ctx.task((128,), [(host, fixed(0, 128), DW)])
    assert deps(ctx, tc).get(ta.id) == "anti"
    td = ctx.task((128,), [(raw, fixed(0, 128), DW)])
    assert tb.id not in deps(ctx, td)


@pytest.mark.parametrize("modes", [(DRW,), (RW,), (DW, R)])
def test_read_write_mode_sets_are_overwritten_with_an_anti_dependency(modes):
    """task_graph_tests.cc "task_manager correctly handles dependencies for R/W modes": a task
    that reads and writes (discard_read_write, read_write, or discard_write + read) and is then
    overwritten by a discard_write gets an anti-dependency from the overwriting task."""
    ctx = ctx1()
    b = ctx.buffer((128,), host_init=True)
    ta = ctx.task((128,), [(b, fixed(0, 128), m) for m in modes])
    tb = ctx.task((128,), [(b, fixed(0, 128), DW)])
    assert deps(ctx, tb) == {ta.id: "anti", init_epoch(ctx).id: "true"}


def test_collective_groups_order_only_their_own_tasks():
    """task_graph_tests.cc "task_manager generates pseudo-dependencies for collective host
    tasks": collective tasks of one group are serialized by a true dependency; a master-node
    task and the tasks of another group are unrelated to them."""
    ctx = ctx1()
    m = master(ctx)
    i1 = ctx.task((1,), kind=tg.COLLECTIVE, collective_group=0)
    i2 = ctx.task((1,), kind=tg.COLLECTIVE, collective_group=0)
    e1 = ctx.task((1,), kind=tg.COLLECTIVE, collective_group=1)
    e2 = ctx.task((1,), kind=tg.COLLECTIVE, collective_group=1)
    ts = [m, i1, i2, e1, e2]
    allowed = {(i2.id, i1.id), (e2.id, e1.id)}
    for x in ts:
        for y in ts:
            if x is not y:
                assert ((y.id in deps(ctx, x)) == ((x.id, y.id) in allowed)), (x.id, y.id)
    assert ctx.tasks()[i2.id].deps[i1.id] == (tg.TRUE_DEP, tg.ORIGIN_COLLECTIVE)
    assert ctx.tasks()[e2.id].deps[e1.id] == (tg.TRUE_DEP, tg.ORIGIN_COLLECTIVE)


def test_critical_path_length_and_execution_front():
    """task_graph_tests.cc "task_manager keeps track of max pseudo critical path length and
    task front": a write / read_write / read chain grows the critical path by one per task and
    the front is its last task; an independent task joins the front without lengthening the
    path.  (The front is observed through the epoch, which depends on exactly the front.)"""
    ctx = ctx1(horizon_step=100)
    b = ctx.buffer((128,))
    ta = master(ctx, [(b, fixed(0, 128), DW)])
    tb = master(ctx, [(b, fixed(0, 128), RW)])
    tc = master(ctx, [(b, fixed(0, 128), R)])
    td = master(ctx)
    assert [t.critical_path_length for t in (ta, tb, tc, td)] == [1, 2, 3, 1]
    ep = ctx.epoch()
    assert set(deps(ctx, ep)) == {tc.id, td.id}
    assert all(o == tg.ORIGIN_EXECUTION_FRONT for _k, o in ctx.tasks()[ep.id].deps.values())


def test_horizons_depend_on_the_execution_front_including_the_previous_horizon():
    """task_graph_tests.cc "task horizons are being generated with correct dependencies":
    with step 2, a write and a read make a horizon that depends on the read only; three
    independent tasks and two read_writes later the next horizon depends on the whole front:
    the previous horizon, the three independent tasks and the last read_write."""
    ctx = ctx1(horizon_step=2)
    b = ctx.buffer((128,), host_init=True)
    master(ctx, [(b, fixed(0, 128), DW)])
    assert horizons(ctx) == []
    tc = master(ctx, [(b, fixed(0, 128), R)])
    (h1,) = horizons(ctx)
    assert h1.id == tc.id + 1
    assert set(deps(ctx, h1)) == {tc.id}
    expected = {h1.id}
    for _ in range(3):
        expected.add(master(ctx).id)
    assert len(horizons(ctx)) == 1
    master(ctx, [(b, fixed(0, 128), RW)])
    td = master(ctx, [(b, fixed(0, 128), RW)])
    h1_, h2 = horizons(ctx)
    assert h2.id == td.id + 1
    expected.add(td.id)
    assert set(deps(ctx, h2)) == expected


def test_horizons_for_the_parallelism_limit():
    """task_graph_tests.cc "task horizons are being generated for the parallelism limit":
    independent tasks with a huge step and max parallelism 3 make horizons because of the
    width of the front, and each later horizon depends on the previous horizon plus the new
    tasks.  Difference: Celerity makes a horizon when the front *reaches* the limit (9 tasks,
    4 horizons of 3 dependencies); celeritas when it *exceeds* it, as DESIGN.md says ("wider
    than horizon_max_parallelism"): 2 horizons, after tasks 4 and 7, of 4 dependencies."""
    ctx = ctx1(horizon_step=256, horizon_max_parallelism=3)
    b = ctx.buffer((128,), host_init=True)
    ts = [master(ctx, [(b, fixed(14 * i, 14 * i + 14), RW)]) for i in range(9)]
    h1, h2 = horizons(ctx)
    assert set(deps(ctx, h1)) == {t.id for t in ts[:4]}
    assert set(deps(ctx, h2)) == {h1.id} | {t.id for t in ts[4:7]}


def _writers_then_one_horizon():
    ctx = ctx1(horizon_step=2)
    a, b = ctx.buffer((128,)), ctx.buffer((128,))
    t1 = master(ctx, [(a, fixed(0, 64), DW), (b, fixed(0, 128), DW)])
    t2 = master(ctx, [(a, fixed(64, 128), DW)])
    master(ctx, [(a, fixed(32, 96), RW)])
    t4 = master(ctx, [(a, fixed(32, 96), RW)])
    (h,) = horizons(ctx)
    master(ctx, [(b, fixed(0, 128), RW)])
    master(ctx, [(b, fixed(0, 128), RW)])
    assert len(horizons(ctx)) == 1
    return ctx, a, b, (t1, t2, t4), h


@pytest.mark.parametrize("lo,hi,writer", [(0, 32, 0), (96, 128, 1), (32, 96, 2)])
def test_last_writers_before_a_horizon_is_applied(lo, hi, writer):
    """task_graph_tests.cc "task horizons update previous writer data structure" (first half):
    before the first horizon is applied, a reader of each part of the buffer depends on the
    real last writer of that part.  (One probe per context: a probe lengthens the critical
    path and could itself trigger the next horizon.)"""
    ctx, a, _b, writers, _h = _writers_then_one_horizon()
    assert deps(ctx, master(ctx, [(a, fixed(lo, hi), R)])) == {writers[writer].id: "true"}


def test_applied_horizon_stands_in_for_older_writers():
    """task_graph_tests.cc "task horizons update previous writer data structure" (second half):
    once a second horizon applies the first, that horizon is the last writer of everything
    written before it, later writers stay, and a new write of part of the buffer is the last
    writer of that part only.  (celeritas places the first horizon after the third task,
    where the critical path reaches the step; the fourth task is newer than it and stays a
    last writer.)"""
    ctx, a, b, (_t1, _t2, t4), h = _writers_then_one_horizon()
    assert h.id < t4.id
    master(ctx, [(b, fixed(0, 128), RW)])
    assert len(horizons(ctx)) == 2
    assert ctx.tm.epoch_for_new_tasks is h
    assert deps(ctx, master(ctx, [(a, fixed(0, 32), R)])) == {h.id: "true"}
    assert deps(ctx, master(ctx, [(a, fixed(96, 128), R)])) == {h.id: "true"}
    assert deps(ctx, master(ctx, [(a, fixed(32, 96), R)])) == {t4.id: "true"}
    t9 = master(ctx, [(a, fixed(96, 128), RW)])
    assert deps(ctx, t9)[h.id] == "true"   # (and anti on the probe that read 96..128)
    assert deps(ctx, master(ctx, [(a, fixed(0, 32), R)])) == {h.id: "true"}
    assert deps(ctx, master(ctx, [(a, fixed(96, 128), R)])) == {t9.id: "true"}


def test_host_initialized_buffer_created_after_horizons_depends_on_the_applied_horizon():
    """task_graph_tests.cc "previous task horizon is used as last writer for host-initialized
    buffers": once horizons have been applied (and the older tasks pruned), a host-initialized
    buffer made afterwards counts as written by the applied horizon (the epoch for new tasks),
    which is older than the current horizon, not by the pruned init epoch."""
    ctx = ctx1(horizon_step=2)
    first = ctx.buffer((1,), host_init=True)
    t = master(ctx, [(first, rm.all(), RW)])
    (initial_writer,) = deps(ctx, t)
    scratch = ctx.buffer((1,))
    for _ in range(8):
        master(ctx, [(scratch, rm.all(), DW)])
    eft = ctx.tm.epoch_for_new_tasks
    ctx.tm.prune_before(eft.id)
    assert initial_writer not in ctx.tasks()
    late = ctx.buffer((1,), host_init=True)
    t = master(ctx, [(late, rm.all(), RW)])
    ((dep, kind),) = deps(ctx, t).items()
    assert kind == "true" and ctx.tasks()[dep].kind == tg.HORIZON
    assert dep == eft.id and dep < horizons(ctx)[-1].id


def test_collective_task_behind_a_horizon_orders_after_the_horizon():
    """task_graph_tests.cc "collective host tasks do not order-depend on their predecessor if
    it is shadowed by a horizon" (and graph_compaction_tests.cc's command-level twin): after
    two horizons, a second collective task of the group depends on the applied horizon (which
    stands in for the first collective task) and on the master-node writer of what it reads,
    both true: two dependencies in all."""
    ctx = ctx1(horizon_step=2)
    b = ctx.buffer((1,))
    first = ctx.task((1,), kind=tg.COLLECTIVE, collective_group=0)
    writers = [master(ctx, [(b, rm.all(), DW)]) for _ in range(4)]
    assert len(horizons(ctx)) == 2
    second = ctx.task((1,), [(b, rm.all(), R)], kind=tg.COLLECTIVE, collective_group=0)
    d = deps(ctx, second)
    assert first.id not in d
    assert len(d) == 2 and set(d.values()) == {"true"}
    kinds = sorted(ctx.tasks()[i].kind for i in d)
    assert kinds == [tg.HORIZON, tg.MASTER_NODE]
    assert writers[-1].id in d


@pytest.mark.parametrize("write_empty", [True, False])
@pytest.mark.parametrize("read_empty", [True, False])
def test_empty_accesses_make_no_dataflow_dependency(write_empty, read_empty):
    """task_graph_tests.cc "buffer accesses with empty ranges do not generate data-flow
    dependencies": a 2-D write and a read of overlapping boxes are linked only when neither
    access is empty."""
    ctx = ctx1()
    b = ctx.buffer((32, 32), host_init=True)
    w = ctx.task((1,), [(b, fixed2((16, 16), (0, 0) if write_empty else (8, 8)), DW)])
    r = ctx.task((1,), [(b, fixed2((1, 1) if read_empty else (8, 8), (0, 0) if read_empty else (16, 16)), R)])
    assert (w.id in deps(ctx, r)) == (not write_empty and not read_empty)


def test_side_effects_order_tasks_sharing_a_host_object_only():
    """task_graph_tests.cc "side effects generate appropriate task-dependencies": two tasks
    with a common host object (and one private object each): the first depends on the init
    epoch only, the second has exactly one dependency, a true one on the first."""
    ctx = ctx1()
    a = master(ctx, side_effects=[0, 1])
    b = master(ctx, side_effects=[0, 2])
    assert deps(ctx, a) == {init_epoch(ctx).id: "true"}
    assert deps(ctx, b) == {a.id: "true"}


def test_side_effect_dependency_is_subsumed_by_a_horizon():
    """task_graph_tests.cc "side-effect dependencies are correctly subsumed by horizons" (and
    its graph_compaction_tests.cc twin): after horizons applied, the next task on the host
    object depends on exactly one task, the applied horizon, with a true dependency."""
    ctx = ctx1(horizon_step=2)
    first = master(ctx, side_effects=[0])
    b = ctx.buffer((1,))
    for _ in range(5):
        master(ctx, [(b, rm.all(), DW)])
    assert len(horizons(ctx)) >= 2
    second = master(ctx, side_effects=[0])
    ((dep, kind),) = deps(ctx, second).items()
    assert kind == "true" and ctx.tasks()[dep].kind == tg.HORIZON and dep != first.id


def test_epoch_dependencies_on_predecessors_and_successors():
    """task_graph_tests.cc "epochs create appropriate dependencies to predecessors and
    successors": the epoch depends on both earlier writers; after it, a reader of the first
    buffer depends on the epoch (not the writer), an overwriter of the second depends on the
    epoch (true, since it has no other true dependency) and not on the old writer, an empty
    task depends on the epoch, a reader of the new data on its writer only, and its
    overwriter anti-depends on that reader and truly on the epoch."""
    ctx = ctx1()
    ba, bb = ctx.buffer((1,)), ctx.buffer((1,))
    ta = ctx.task((1,), [(ba, rm.all(), DW)])
    tb = ctx.task((1,), [(bb, rm.all(), DW)])
    ep = ctx.epoch()
    tc = ctx.task((1,), [(ba, rm.all(), R)])
    td = ctx.task((1,), [(bb, rm.all(), DW)])
    te = ctx.task((1,), [])
    tf = ctx.task((1,), [(bb, rm.all(), R)])
    tgk = ctx.task((1,), [(bb, rm.all(), DW)])
    assert deps(ctx, ep) == {ta.id: "true", tb.id: "true"}
    assert deps(ctx, tc) == {ep.id: "true"}
    assert deps(ctx, td) == {ep.id: "true"}
    assert deps(ctx, te) == {ep.id: "true"}
    assert deps(ctx, tf) == {td.id: "true"}
    assert deps(ctx, tgk) == {tf.id: "anti", ep.id: "true"}


def test_consecutive_epochs_chain():
    """task_graph_tests.cc "a sequence of epochs without intermediate tasks has defined
    behavior": a barrier epoch right after init, and a shutdown epoch right after it, each
    depend on exactly the previous epoch, with a true dependency."""
    ctx = ctx1()
    before = init_epoch(ctx)
    for action in (tg.EPOCH_BARRIER, tg.EPOCH_SHUTDOWN):
        ep = ctx.epoch(action)
        assert deps(ctx, ep) == {before.id: "true"}
        before = ep


def test_fence_on_a_host_object_orders_its_side_effects():
    """task_graph_tests.cc "fences introduce dependencies on host objects": a fence on a host
    object depends on the earlier task affecting it, and the next such task on the fence."""
    ctx = ctx1()
    a = ctx.task((1,), kind=tg.COLLECTIVE, collective_group=0, side_effects=[5])
    fence = ctx.tm.fence(host_object=5)
    b = ctx.task((1,), kind=tg.COLLECTIVE, collective_group=0, side_effects=[5])
    assert deps(ctx, fence) == {a.id: "true"}
    assert deps(ctx, b).get(fence.id) == "true"


def test_fence_on_a_buffer_is_a_reader():
    """task_graph_tests.cc "fences introduce data dependencies": a buffer fence truly depends
    on the writer, and the next overwrite anti-depends on the fence."""
    ctx = ctx1()
    b = ctx.buffer((1,))
    a = master(ctx, [(b, rm.all(), DW)])
    fence = ctx.fence(b)
    c = master(ctx, [(b, rm.all(), DW)])
    assert deps(ctx, fence) == {a.id: "true"}
    assert deps(ctx, c).get(fence.id) == "anti"


def test_uninitialized_reads_are_errors_naming_the_missing_part():
    """task_graph_tests.cc "task_manager throws in tests if it detects an uninitialized read":
    a read of a never-written buffer, and a consuming ``write`` access of a partially
    written 2-D buffer, raise under the error policy; the message names the task, the buffer
    and exactly the part never written (not what was written)."""
    ctx = ctx1(diagnostics="error")
    b = ctx.buffer((1,), name="one")
    with pytest.raises(DiagnosticError, match=r'"uninit_read".*one.*uninitialized'):
        ctx.task((1,), [(b, rm.all(), R)], name="uninit_read")
    ctx = ctx1(diagnostics="error")
    b2 = ctx.buffer((64, 64), name="grid")
    ctx.task((1,), [(b2, fixed2((0, 0), (32, 32)), DW)])
    with pytest.raises(DiagnosticError) as info:
        ctx.task((1,), [(b2, rm.all(), W)], name="uninit_read")
    msg = str(info.value)
    assert "uninit_read" in msg and "grid" in msg
    assert "32" in msg and "64" in msg


def test_uninitialized_read_region_is_exact():
    """task_graph_tests.cc "task_manager throws in tests if it detects an uninitialized read"
    (partially initialized case), checked on the region rather than the message text: the
    reported part is the buffer minus the written 32x32 corner."""
    from scheduler.geometry import Region
    ctx = ctx1(diagnostics="error")
    b = ctx.buffer((64, 64), name="grid")
    ctx.task((1,), [(b, fixed2((0, 0), (32, 32)), DW)])
    expected = Region.from_box(Box((0, 0), (64, 64))) - Region.from_box(Box((0, 0), (32, 32)))
    with pytest.raises(DiagnosticError) as info:
        ctx.task((1,), [(b, rm.all(), W)], name="uninit_read")
    assert str(expected) in str(info.value)


def test_reading_after_epochs_depends_on_the_latest_epoch():
    """graph_compaction_tests.cc "reaching an epoch will prune all nodes of the preceding task
    graph" (dependency part): the first task depends on the init epoch (last_epoch origin); after
    an epoch, a read_write of an early host-initialized buffer depends on that epoch as a
    dataflow dependency, and a discard write of a buffer made after it on the epoch (last_epoch
    origin); after a second epoch and pruning, a task reading all three depends on the second
    epoch only (dataflow) and the earlier tasks are gone."""
    ctx = ctx1()
    init = init_epoch(ctx)
    early = ctx.buffer((2,), host_init=True)
    written = ctx.buffer((2,))
    w = ctx.task((2,), [(written, rm.one_to_one(), DW)])
    assert ctx.tasks()[w.id].deps == {init.id: (tg.TRUE_DEP, tg.ORIGIN_LAST_EPOCH)}
    e1 = ctx.epoch()
    rw = ctx.task((2,), [(early, rm.one_to_one(), RW)])
    assert ctx.tasks()[rw.id].deps == {e1.id: (tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)}
    late = ctx.buffer((2,), host_init=True)
    lw = ctx.task((2,), [(late, rm.one_to_one(), DW)])
    assert ctx.tasks()[lw.id].deps == {e1.id: (tg.TRUE_DEP, tg.ORIGIN_LAST_EPOCH)}
    e2 = ctx.epoch()
    ctx.tm.prune_before(e2.id)
    reader = ctx.task((2,), [(early, rm.one_to_one(), R), (late, rm.one_to_one(), R),
                             (written, rm.one_to_one(), DW)])
    assert ctx.tasks()[reader.id].deps == {e2.id: (tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)}
    for gone in (init, w, e1, rw, lw):
        assert gone.id not in ctx.tasks()
    assert e2.id in ctx.tasks()


def test_task_record_holds_geometry_and_merged_accesses():
    """task_graph_tests.cc "task_manager correctly records compute task information" and
    "buffer_access_map merges multiple accesses with the same mode": a 2-D task records its
    range, offset, name and kind; two accesses of one buffer with the same mode are each
    recorded, and the task's dependencies treat their union as the accessed region."""
    ctx = ctx1()
    b = ctx.buffer((64, 64), host_init=True)
    t = ctx.task((32, 16), [(b, fixed2((0, 0), (8, 8)), R), (b, fixed2((8, 8), (8, 8)), R)],
                 offset=(2, 3), name="k")
    rec = ctx.task_record(t.id)
    assert rec["kind"] == tg.DEVICE_COMPUTE and rec["name"] == "k"
    assert rec["range"] == [32, 16] and rec["offset"] == [2, 3]
    assert [a["mode"] for a in rec["accesses"]] == ["read", "read"]
    ep = init_epoch(ctx).id
    w = ctx.task((1,), [(b, fixed2((8, 8), (1, 1)), DW)])
    assert deps(ctx, w) == {t.id: "anti", ep: "true"}
    w2 = ctx.task((1,), [(b, fixed2((4, 4), (1, 1)), DW)])
    assert deps(ctx, w2) == {t.id: "anti", ep: "true"}
    w3 = ctx.task((1,), [(b, fixed2((20, 20), (1, 1)), DW)])   # between the two: not accessed
    assert t.id not in deps(ctx, w3)
