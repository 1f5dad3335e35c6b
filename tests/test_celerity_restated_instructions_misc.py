"""Instruction-graph behaviours restated from the C++ Celerity runtime's tests
test/instruction_graph_misc_tests.cc and test/instruction_graph_grid_tests.cc.

Each docstring names the Celerity TEST_CASE it restates and the property pinned.  Where
celeritas does an implementation detail differently (a fence copies straight from device
memory into its user allocation instead of staging through host memory and hands that
allocation to the user itself instead of listing it as horizon / epoch garbage; every host
object gets a destroy instruction; diagnostics come from the task layer first; oversubscribed
reductions and side effects are made safe instead of refused), the test pins the semantic
property and says so.  Every graph is also run through ``ig_validator.validate`` (no races,
no leaks, no lost data).  The cases first failed in four places, since fixed: clones of
collective groups were not chained in one order, an empty-box fence did not depend on its
allocation, and boxes meeting at a corner (or, in 3-D, an edge) counted as connected, so
accessors and received parts that meet only there were allocated as one bounding box.
"""
import itertools
import threading

import numpy as np
import pytest
from graph_context import GraphContext
from ig_validator import validate

import celeritas as cl
from celeritas import range_mappers as rm
from celeritas.testing import run_cluster
from scheduler import task_graph as tg
from scheduler.errors import DiagnosticError
from scheduler.geometry import Box, Region, Subrange
from scheduler.instruction_graph import HOST_MEMORY, USER_MEMORY

R, RW, DW = tg.READ, tg.READ_WRITE, tg.DISCARD_WRITE
MASTER, COLLECTIVE, HOST, DEVICE = tg.MASTER_NODE, tg.COLLECTIVE, tg.HOST_COMPUTE, tg.DEVICE_COMPUTE

# collective group ids as the runtime numbers them: 0 is the root communicator (never a group
# of tasks), 1 the default group of ``on=cl.collective``, 2... ``cl.CollectiveGroup()``s
ROOT_GROUP, DEFAULT_GROUP = 0, 1


def one(xs):
    assert len(xs) == 1, xs
    return xs[0]


def fixedn(offset, size):
    return rm.fixed(Subrange(tuple(offset), tuple(size)))


def by_id(ctx, rank=0):
    return {i.id: i for i in ctx.instructions[rank]}


def preds(ctx, ins, rank=0):
    m = by_id(ctx, rank)
    return [m[d] for d in ins.dep_ids]


def succs(ctx, ins, rank=0):
    return [i for i in ctx.instructions[rank] if ins.id in i.dep_ids]


def ids(xs) -> set:
    return {i.id for i in xs}


def shutdown_epoch(ctx, rank=0):
    return one(ctx.instrs(rank, "epoch", action=tg.EPOCH_SHUTDOWN))


def init_epoch(ctx, rank=0):
    return one(ctx.instrs(rank, "epoch", action=tg.EPOCH_INIT))


def transitive_succs(ctx, ins, rank=0) -> set:
    cl_ = ctx.closure(rank)
    return {i for i, p in cl_.items() if ins.id in p}


def create_host_objects(ctx, *hoids):
    for igg in ctx.iggs.values():
        for h in hoids:
            igg.create_host_object(h)


def destroy_host_objects(ctx, *hoids):
    """What the runtime does at shutdown before the shutdown epoch (see
    ``GraphContext.destroy_buffer``): flush lookahead, then one destroy per host object."""
    for r, igg in ctx.iggs.items():
        out: list = []
        ctx.lookaheads[r].flush(out)
        ctx._collect(r, out)
        for h in hoids:
            ctx.instructions[r].extend(igg.destroy_host_object(h))


def box_tiling(boxes, full: Box) -> bool:
    got = Region.empty_region(full.dims)
    for b in boxes:
        if got.intersects(Region.from_box(b)):
            return False
        got = got | Region.from_box(b)
    return got == Region.from_box(full)


# =================================================================================================
# instruction_graph_misc_tests.cc
# =================================================================================================
def test_command_group_without_data_access_is_a_trivial_graph():
    """instruction_graph_misc_tests.cc "a command group without data access compiles to a
    trivial graph": init epoch -> one kernel (no accesses, the whole range, device 0) ->
    shutdown epoch; three instructions in all."""
    ctx = GraphContext(1)
    ctx.task((256,), name="kernel")
    ctx.finish()
    assert [i.kind for i in ctx.instructions[0]] == ["epoch", "device_kernel", "epoch"]
    k = one(ctx.instrs(0, "device_kernel", name="kernel"))
    assert k.accesses == [] and k.box == Box((0,), (256,)) and k.device == 0
    assert preds(ctx, k) == [init_epoch(ctx)]
    assert succs(ctx, k) == [shutdown_epoch(ctx)]
    validate(ctx)


def test_side_effects_order_host_tasks_per_host_object():
    """instruction_graph_misc_tests.cc "side-effects introduce dependencies between host-task
    instructions": two host objects, tasks affecting one, the other or both: each task
    depends exactly on the previous task on its object(s); the destroy of a host object
    follows its last task, the shutdown epoch follows the destroys.  (Celerity emits no
    destroy for a host object that does not own its instance; celeritas has no such host
    objects: both get one, each right after its last task.)"""
    ctx = GraphContext(1, horizon_step=999)
    create_host_objects(ctx, 0, 1)
    for name, hos in [("ho1 a", [0]), ("ho2 a", [1]), ("ho1 b", [0]), ("ho2 b", [1]),
                      ("both", [0, 1]), ("ho1 c", [0]), ("ho2 c", [1])]:
        ctx.task((), kind=MASTER, name=name, side_effects=hos)
    destroy_host_objects(ctx, 0, 1)
    ctx.finish()
    t = {n: one(ctx.instrs(0, "host_task", name=n)) for n in
         ("ho1 a", "ho2 a", "ho1 b", "ho2 b", "both", "ho1 c", "ho2 c")}
    d1 = one(ctx.instrs(0, "destroy_host_object", host_object=0))
    d2 = one(ctx.instrs(0, "destroy_host_object", host_object=1))
    assert preds(ctx, t["ho1 a"]) == [init_epoch(ctx)] and preds(ctx, t["ho2 a"]) == [init_epoch(ctx)]
    assert succs(ctx, t["ho1 a"]) == [t["ho1 b"]] and succs(ctx, t["ho2 a"]) == [t["ho2 b"]]
    assert succs(ctx, t["ho1 b"]) == [t["both"]] and succs(ctx, t["ho2 b"]) == [t["both"]]
    assert ids(succs(ctx, t["both"])) == {t["ho1 c"].id, t["ho2 c"].id}
    assert succs(ctx, t["ho1 c"]) == [d1] and succs(ctx, t["ho2 c"]) == [d2]
    assert succs(ctx, d1) == [shutdown_epoch(ctx)] and succs(ctx, d2) == [shutdown_epoch(ctx)]
    validate(ctx)


def _collective_program(rank):
    ctx = GraphContext(2, horizon_step=999, compile_ranks=[rank])
    g1, g2 = 2, 3
    for name, group in [("default a", DEFAULT_GROUP), ("default b", DEFAULT_GROUP), ("custom 1 a", g1),
                        ("custom 2", g2), ("custom 1 b", g1), ("default c", DEFAULT_GROUP)]:
        ctx.task((2,), kind=COLLECTIVE, name=name, collective_group=group)
    ctx.finish()
    return ctx, g1, g2


@pytest.mark.parametrize("rank", [0, 1])
def test_collective_groups_are_ordered_within_each_group(rank):
    """instruction_graph_misc_tests.cc "collective-group instructions follow a single global
    total order" (the per-group part): every group is cloned from the root communicator
    once, before its first host task; the host tasks of one group form a chain in submission
    order, and a task of one group does not wait for tasks of other groups ("default c",
    submitted last, depends only on "default b")."""
    ctx, g1, g2 = _collective_program(rank)
    clones = ctx.instrs(rank, "clone_collective_group")
    assert sorted(c.new for c in clones) == [DEFAULT_GROUP, g1, g2]
    assert all(c.original == ROOT_GROUP for c in clones)
    clone = {c.new: c for c in clones}
    t = {i.name: i for i in ctx.instrs(rank, "host_task")}
    for group, chain in [(DEFAULT_GROUP, ["default a", "default b", "default c"]),
                         (g1, ["custom 1 a", "custom 1 b"]), (g2, ["custom 2"])]:
        prev = clone[group]
        for name in chain:
            assert t[name].collective_group == group
            assert preds(ctx, t[name], rank) == [prev], name
            prev = t[name]
        assert succs(ctx, prev, rank) == [shutdown_epoch(ctx, rank)]
    assert preds(ctx, clone[DEFAULT_GROUP], rank) == [init_epoch(ctx, rank)]
    validate(ctx, rank)


@pytest.mark.parametrize("rank", [0, 1])
def test_collective_group_clones_follow_one_total_order(rank):
    """instruction_graph_misc_tests.cc "collective-group instructions follow a single global
    total order" (the clone part): the clone of each new group depends on the clone of the
    group cloned before it, since cloning a communicator is a collective operation itself
    and every rank must do the clones in the same order."""
    ctx, g1, g2 = _collective_program(rank)
    clone = {c.new: c for c in ctx.instrs(rank, "clone_collective_group")}
    assert clone[DEFAULT_GROUP].id in clone[g1].dep_ids
    assert clone[g1].id in clone[g2].dep_ids
    validate(ctx, rank)


@pytest.mark.parametrize("dims", [0, 1, 2, 3])
@pytest.mark.parametrize("part", [False, True])
def test_buffer_fence_exports_data_to_user_memory(dims, part):
    """instruction_graph_misc_tests.cc "buffer fences export data to user memory": a device
    kernel writes the buffer, a fence exports all of it or the subrange (48, 64, 72)+128: the
    fence depends on a copy into a user-memory allocation of exactly the fenced box, which
    copies exactly that box of the buffer and follows the writer.  (Celerity stages the data
    through host memory first; celeritas copies device -> user memory directly: one copy,
    not two.)"""
    shape = (256,) * dims
    ctx = GraphContext(1)
    b = ctx.buffer(shape, dtype="int32")
    ctx.task(shape, [(b, rm.one_to_one() if dims else rm.all(), DW)], name="writer")
    box = Box(shape and (48, 64, 72)[:dims], shape and tuple(x + 128 for x in (48, 64, 72)[:dims])) \
        if part else Box.full(shape)
    fence_task = ctx.fence(b, box if part else None)
    ctx.finish()
    fence = one(ctx.instrs(0, "fence"))
    assert fence.task == fence_task.id and fence.allocation is not None
    user = one(ctx.instrs(0, "alloc", allocation=fence.allocation))
    assert user.memory == USER_MEMORY and user.buffer == b and user.box == box
    assert user.size_bytes == box.area * 4
    copy = one(preds(ctx, fence))
    assert copy.kind == "copy" and copy.dest == fence.allocation and copy.dest_memory == USER_MEMORY
    assert copy.buffer == b and copy.box == box and copy.size_bytes == box.area * 4
    writer = one(ctx.instrs(0, "device_kernel", name="writer"))
    assert copy.source == writer.accesses[0].allocation and ctx.depends_on(copy, writer)
    assert ctx.instrs(0, "copy") == [copy]
    validate(ctx)


@pytest.mark.parametrize("rank", [0, 1])
def test_empty_buffer_fence_moves_nothing(rank):
    """instruction_graph_misc_tests.cc "instruction_graph_generator gracefully handles
    empty-range buffer fences": a fence of an empty subrange of a buffer written on both
    ranks: no send, receive, await or copy; the fence waits for nothing the writer did and
    only the shutdown epoch follows it.  It does follow the alloc of its (empty) user
    allocation, which it hands to the user (Celerity has no alloc for user memory at all)."""
    ctx = GraphContext(2, compile_ranks=[rank])
    b = ctx.buffer((256,), dtype="int32")
    ctx.task((256,), [(b, rm.one_to_one(), DW)], name="writer")
    ctx.tm.fence(buffer=b, box=Box.empty_box(1), promise=None)
    ctx.finish()
    fence = one(ctx.instrs(rank, "fence"))
    writer = one(ctx.instrs(rank, "device_kernel", name="writer"))
    assert not ctx.depends_on(fence, writer, rank)
    assert succs(ctx, fence, rank) == [shutdown_epoch(ctx, rank)]
    for kind in ("send", "receive", "split_receive", "await_receive", "copy"):
        assert ctx.instrs(rank, kind) == [], kind
    assert ctx.pilots[rank] == []
    user = one(ctx.instrs(rank, "alloc", allocation=fence.allocation))
    assert user.memory == USER_MEMORY and user.size_bytes == 0
    assert ctx.depends_on(fence, user, rank)
    validate(ctx, rank)


def test_empty_buffer_fence_returns_an_empty_array():
    """instruction_graph_misc_tests.cc "instruction_graph_generator gracefully handles
    empty-range buffer fences", executed on 2 ranks: the future of an empty-subrange fence
    holds an empty array of the buffer's dtype, and a full fence afterwards still sees the
    written values."""
    def program(rank):
        q = cl.Queue()
        buf = cl.Buffer(shape=(256,), dtype=np.int32, name="buf")

        def write(cgh):
            acc = buf.access(cgh, cl.one_to_one(), cl.discard_write)

            @cgh.parallel_for((256,), name="writer")
            def k(chunk):
                acc[chunk] = chunk.arange(0)
        q.submit(write)
        empty = q.fence(buf, cl.Subrange((0,), (0,))).result()
        full = q.fence(buf).result()
        q.shutdown()
        return empty.shape, empty.dtype, full.tolist()

    for shape, dtype, full in run_cluster(program, nodes=2, devices=1, timeout=60):
        assert shape == (0,) and dtype == np.int32 and full == list(range(256))


@pytest.mark.parametrize("trigger", ["horizon", "epoch"])
def test_fence_user_allocation_is_handed_over_once(trigger):
    """instruction_graph_misc_tests.cc "horizons and epochs notify the executor of unreferenced
    user allocations after buffer fences": the user allocation that a buffer fence fills is
    released exactly once.  (Celerity lists it as garbage of the next horizon or epoch;
    celeritas' fence instruction hands it to the user itself, so no horizon or epoch lists
    it, whether a horizon follows the fence or only the shutdown epoch.)"""
    ctx = GraphContext(1, horizon_step=2 if trigger == "horizon" else 999)
    b = ctx.buffer((256,), dtype="int32")
    ctx.task((256,), [(b, rm.one_to_one(), DW)], kind=HOST, name="writer")
    ctx.fence(b)
    if trigger == "horizon":
        ctx.task((256,), [(b, rm.one_to_one(), RW)], kind=HOST, name="horizon trigger")
    ctx.finish()
    fence = one(ctx.instrs(0, "fence"))
    user = one(ctx.instrs(0, "alloc", allocation=fence.allocation))
    assert user.memory == USER_MEMORY
    horizons = ctx.instrs(0, "horizon")
    assert len(horizons) == (1 if trigger == "horizon" else 0)
    for i in horizons + ctx.instrs(0, "epoch"):
        assert fence.allocation not in i.garbage
    assert not any(f.allocation == fence.allocation for f in ctx.instrs(0, "free"))
    validate(ctx)


@pytest.mark.parametrize("host_initialized", [False, True])
def test_shutdown_epoch_releases_user_allocation_of_destroyed_buffer(host_initialized):
    """instruction_graph_misc_tests.cc "epochs notify the executor of unreferenced user
    allocations after a buffer is destroyed": destroying a host-initialized buffer makes its
    user allocation garbage of the (shutdown) epoch; a buffer without host data has none."""
    ctx = GraphContext(1)
    b = ctx.buffer((256,), dtype="int32", host_init=host_initialized)
    user = ctx.iggs[0]._buffers[b].user
    ctx.finish()
    garbage = shutdown_epoch(ctx).garbage
    if host_initialized:
        assert garbage == [user.id] and user.memory == USER_MEMORY
    else:
        assert user is None and garbage == []
    validate(ctx)


def test_host_object_fence_is_ordered_between_its_tasks():
    """instruction_graph_misc_tests.cc "host-object fences introduce the appropriate
    dependencies": task 1 -> fence -> task 2 on one host object, the fence naming it."""
    ctx = GraphContext(1)
    create_host_objects(ctx, 0)
    ctx.task((), kind=MASTER, name="task 1", side_effects=[0])
    ctx.tm.fence(host_object=0, promise=None)
    ctx.task((), kind=MASTER, name="task 2", side_effects=[0])
    destroy_host_objects(ctx, 0)
    ctx.finish()
    t1 = one(ctx.instrs(0, "host_task", name="task 1"))
    t2 = one(ctx.instrs(0, "host_task", name="task 2"))
    fence = one(ctx.instrs(0, "fence"))
    assert fence.host_object == 0 and fence.allocation is None
    assert succs(ctx, t1) == [fence]
    assert succs(ctx, fence) == [t2]
    validate(ctx)


def _producers_and_consumer(ctx, b):
    ctx.task((1,), [(b, rm.all(), DW)], name="producer")
    ctx.task((1,), [(b, fixedn((0,), (128,)), DW)], name="producer")
    ctx.task((1,), [(b, fixedn((128,), (128,)), DW)], name="producer")


@pytest.mark.parametrize("barrier", [False, True])
def test_epoch_serializes_and_compacts_tracking(barrier):
    """instruction_graph_misc_tests.cc "epochs serialize execution and compact dependency
    tracking": three device producers (the last two writing one half each) and a host-object
    producer; a master-node consumer reads everything.  Without an epoch the device-to-host
    copy is split in two, one per half-writer.  With a barrier epoch in between: the epoch
    transitively follows exactly the init epoch, the device allocation and the producers;
    the host allocation follows the epoch; one single copy brings the buffer to host memory
    (the epoch replaced the two writers in the tracking); everything after the epoch follows
    it, nothing before it has a successor after it, nothing after it depends on anything
    before it."""
    ctx = GraphContext(1, horizon_step=999)
    create_host_objects(ctx, 0)
    b = ctx.buffer((256,))
    _producers_and_consumer(ctx, b)
    ctx.task((), kind=MASTER, name="producer", side_effects=[0])
    if barrier:
        ctx.epoch(tg.EPOCH_BARRIER)
    ctx.task((), [(b, rm.all(), R)], kind=MASTER, name="consumer", side_effects=[0])
    destroy_host_objects(ctx, 0)
    ctx.finish()
    validate(ctx)
    assert len(ctx.instrs(0, "epoch")) == (3 if barrier else 2)
    if not barrier:
        assert len(ctx.instrs(0, "copy")) == 2
        return
    init = init_epoch(ctx)
    assert init.dep_ids == []
    dev_allocs = [a for a in ctx.instrs(0, "alloc") if a.memory != HOST_MEMORY]
    assert all(preds(ctx, a) == [init] for a in dev_allocs)
    producers = ctx.instrs(0, "device_kernel", name="producer") + ctx.instrs(0, "host_task", name="producer")
    assert len(producers) == 4
    before = {init.id} | ids(dev_allocs) | ids(producers)
    epoch = one(ctx.instrs(0, "epoch", action=tg.EPOCH_BARRIER))
    assert ctx.closure(0)[epoch.id] == before
    host_alloc = one([a for a in ctx.instrs(0, "alloc") if a.memory == HOST_MEMORY])
    assert preds(ctx, host_alloc) == [epoch]
    copy = one(ctx.instrs(0, "copy"))
    assert host_alloc.id in copy.dep_ids and copy.box == Box((0,), (256,))
    consumer = one(ctx.instrs(0, "host_task", name="consumer"))
    after = {host_alloc.id, copy.id, consumer.id, shutdown_epoch(ctx).id} | \
        ids(ctx.instrs(0, "free")) | ids(ctx.instrs(0, "destroy_host_object"))
    assert transitive_succs(ctx, epoch) == after
    assert succs(ctx, shutdown_epoch(ctx)) == []
    for i in ctx.instructions[0]:
        if i.id in before:
            assert all(s.id in before | {epoch.id} for s in succs(ctx, i)), i
        if i.id in after:
            assert all(d in after | {epoch.id} for d in i.dep_ids), i


@pytest.mark.parametrize("mode", ["no horizons", "unapplied horizon", "applied horizon"])
def test_horizon_application_serializes_and_compacts_tracking(mode):
    """instruction_graph_misc_tests.cc "horizon application serializes execution and compacts
    dependency tracking": horizon step 3, producers as in the epoch case, then 0, 3 or 6 tasks
    on a second host object (0, 1 or 2 horizons), then a consumer.  Until a horizon is
    applied (the second one applies the first) the device-to-host copy is split per writer.
    Once applied: the applied horizon follows the allocations and producers and precedes the
    host allocation, the single copy, the consumer, the frees, the destroys and the current
    horizon; nothing of that precedes the current horizon, and only the shutdown epoch
    follows the current horizon."""
    n = {"no horizons": 0, "unapplied horizon": 1, "applied horizon": 2}[mode]
    ctx = GraphContext(1, horizon_step=999 if n == 0 else 3)
    create_host_objects(ctx, 0, 1)
    b = ctx.buffer((256,))
    ctx.task((), kind=MASTER, name="producer", side_effects=[0])
    _producers_and_consumer(ctx, b)
    for _ in range(3 * n):
        ctx.task((), kind=MASTER, name="age", side_effects=[1])
    ctx.task((), [(b, rm.all(), R)], kind=MASTER, name="consumer", side_effects=[0, 1])
    destroy_host_objects(ctx, 0, 1)
    ctx.finish()
    validate(ctx)
    horizons = ctx.instrs(0, "horizon")
    assert len(horizons) == n
    if n < 2:
        assert len(ctx.instrs(0, "copy")) == 2
        return
    applied, current = horizons
    dev_allocs = [a for a in ctx.instrs(0, "alloc") if a.memory != HOST_MEMORY]
    producers = ctx.instrs(0, "device_kernel", name="producer") + ctx.instrs(0, "host_task", name="producer")
    assert (ids(dev_allocs) | ids(producers)) <= ctx.closure(0)[applied.id]
    host_alloc = one([a for a in ctx.instrs(0, "alloc") if a.memory == HOST_MEMORY])
    copy = one(ctx.instrs(0, "copy"))
    assert host_alloc.id in copy.dep_ids
    consumer = one(ctx.instrs(0, "host_task", name="consumer"))
    later = {host_alloc.id, copy.id, consumer.id, current.id} | ids(ctx.instrs(0, "free")) | \
        ids(ctx.instrs(0, "destroy_host_object"))
    assert later <= transitive_succs(ctx, applied)
    assert not any(i in ctx.closure(0)[current.id] for i in later - {current.id})
    assert succs(ctx, current) == [shutdown_epoch(ctx)]


def _uninitialized_read_programs():
    def fully(ctx):
        b = ctx.buffer((1,))
        return lambda: ctx.task((2,), [(b, rm.all(), R)]), Region.from_box(Box((0,), (1,)))

    def partially_local(ctx):
        b = ctx.buffer((2,))
        ctx.task((1,), [(b, rm.one_to_one(), DW)])
        return lambda: ctx.task((2,), [(b, rm.all(), R)]), Region.from_box(Box((1,), (2,)))

    def partially_remote(ctx):
        b = ctx.buffer((2,))
        ctx.task((1,), [(b, rm.one_to_one(), DW)])
        return lambda: ctx.task((2,), [(b, rm.one_to_one(), R)]), Region.from_box(Box((1,), (2,)))

    def reduction_including_current(ctx):
        b = ctx.buffer((1,))
        return (lambda: ctx.task((2,), [], reductions=[ctx.reduction(b, include_current=True)]),
                Region.from_box(Box((0,), (1,))))
    return [fully, partially_local, partially_remote, reduction_including_current]


@pytest.mark.parametrize("program", _uninitialized_read_programs(), ids=lambda p: p.__name__)
def test_uninitialized_reads_are_reported(program):
    """instruction_graph_misc_tests.cc "instruction_graph_generator throws in tests if it
    detects an uninitialized read": with diagnostics as errors, on one rank with two devices,
    reading a never-written buffer, the unwritten half of a partially written one (through
    ``all`` or ``one_to_one``), or reducing into an uninitialized buffer including its current
    value raises, naming exactly the unwritten region.  (Celerity silences the task and
    command layers to see the instruction layer throw; celeritas reports it once, from the
    task layer.)"""
    ctx = GraphContext(1, devices=2, diagnostics="error")
    submit, unwritten = program(ctx)
    with pytest.raises(DiagnosticError, match="uninitialized read") as exc:
        submit()
    assert repr(unwritten) in str(exc.value)


@pytest.mark.parametrize("mapper, region", [(rm.all(), Box((0, 0), (20, 20))),
                                            (rm.neighborhood(1, 1), Box((9, 0), (11, 20)))],
                         ids=["all", "neighborhood"])
def test_overlapping_writes_are_reported(mapper, region):
    """instruction_graph_misc_tests.cc "instruction_graph_generator throws in tests if it
    detects overlapping writes": one rank, two devices, a 20x20 kernel writing through
    ``all`` (both devices write everything) or ``neighborhood(1, 1)`` (rows 9 and 10 twice):
    with diagnostics as errors this raises, naming the doubly written region and devices."""
    ctx = GraphContext(1, devices=2, diagnostics="error")
    b = ctx.buffer((20, 20))
    with pytest.raises(DiagnosticError, match="overlapping writes") as exc:
        ctx.task((20, 20), [(b, mapper, DW)])
    assert repr(Region.from_box(region)) in str(exc.value) and "devices 0 and 1" in str(exc.value)


@pytest.mark.parametrize("what", ["device kernel", "reduction", "host task"])
def test_unchecked_uninitialized_reads_depend_on_the_allocation(what):
    """instruction_graph_misc_tests.cc "instruction_graph_generator gracefully handles
    uninitialized reads when check is disabled": with diagnostics off, reading a
    never-written buffer treats the allocation as the last writer: the reader follows the
    alloc and the free follows the reader.  For a reduction including the current value the
    kernel follows its allocation and, where its partial is combined on the host, the reduce
    follows the buffer's host allocation, whose free follows the reduce."""
    ctx = GraphContext(1, diagnostics="off")
    b = ctx.buffer((1,))
    if what == "reduction":
        ctx.task((1,), [], reductions=[ctx.reduction(b, include_current=True)], name="k")
    else:
        ctx.task((1,), [(b, rm.all(), R)], kind=DEVICE if what == "device kernel" else HOST, name="k")
    ctx.finish()
    validate(ctx)
    k = one(ctx.instrs(0, "device_kernel" if what != "host task" else "host_task", name="k"))
    if what != "reduction":
        alloc, free = one(ctx.instrs(0, "alloc")), one(ctx.instrs(0, "free"))
        assert alloc.id in k.dep_ids and k.id in free.dep_ids
        assert k.accesses[0].allocation == alloc.allocation
        return
    target = k.reductions[0].allocation
    assert ctx.depends_on(k, one(ctx.instrs(0, "alloc", allocation=target)))
    assert ctx.depends_on(one(ctx.instrs(0, "free", allocation=target)), k)
    reduces = ctx.instrs(0, "reduce")
    if reduces:
        rd = one(reduces)
        host = one([a for a in ctx.instrs(0, "alloc") if a.buffer == b and a.memory == HOST_MEMORY])
        assert rd.dest == host.allocation and ctx.depends_on(rd, host)
        assert rd.id in one(ctx.instrs(0, "free", allocation=host.allocation)).dep_ids


@pytest.mark.parametrize("devices, oversubscribe", [(2, 1), (1, 2)], ids=["two devices", "oversubscribed"])
def test_unchecked_overlapping_writes_stay_ordered(devices, oversubscribe):
    """instruction_graph_misc_tests.cc "instruction_graph_generator gracefully handles
    overlapping writes when check is disabled": a 2-item kernel writes all of a 1-element
    buffer, split over two devices or oversubscribed on one; a reader follows.  One
    allocation per device, one writer per chunk, each following its allocation; the reader
    follows all writers and the free of its allocation follows it; every allocation is freed
    after its writer.  (Writers sharing an allocation are serialized, so the graph stays race
    free.)"""
    ctx = GraphContext(1, devices=devices, diagnostics="off")
    b = ctx.buffer((1,))
    ctx.task((2,), [(b, rm.all(), DW)], name="writer", oversubscribe=oversubscribe)
    ctx.task((1,), [(b, rm.all(), R)], name="reader")
    ctx.finish()
    validate(ctx)
    allocs, frees = ctx.instrs(0, "alloc"), ctx.instrs(0, "free")
    writers = ctx.instrs(0, "device_kernel", name="writer")
    reader = one(ctx.instrs(0, "device_kernel", name="reader"))
    assert len(allocs) == devices and len(writers) == devices * oversubscribe and len(frees) == len(allocs)
    for w in writers:
        alloc = one(ctx.instrs(0, "alloc", allocation=w.accesses[0].allocation))
        assert ctx.depends_on(w, alloc) and ctx.depends_on(reader, w)
        assert ctx.depends_on(one(ctx.instrs(0, "free", allocation=alloc.allocation)), w)
    assert succs(ctx, reader) == [one(ctx.instrs(0, "free", allocation=reader.accesses[0].allocation))]


@pytest.mark.parametrize("dims", [2, 3])
def test_split_2d_hint_gives_a_2d_split(dims):
    """instruction_graph_misc_tests.cc "hints::split_2d results in a 2d split": one rank, four
    devices: four kernels, none spanning dimension 0 or 1 entirely, each writing exactly its
    own box, together tiling the range."""
    shape = (256,) * dims
    ctx = GraphContext(1, devices=4)
    b = ctx.buffer(shape)
    ctx.task(shape, [(b, rm.one_to_one(), DW)], split="2d")
    ctx.finish()
    ks = ctx.instrs(0, "device_kernel")
    assert len(ks) == 4 and sorted(k.device for k in ks) == [0, 1, 2, 3]
    for k in ks:
        assert k.box.range[0] < 256 and k.box.range[1] < 256
        assert one(k.accesses).box == k.box
    assert box_tiling([k.box for k in ks], Box.full(shape))
    validate(ctx)


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("split", ["1d", "2d"])
@pytest.mark.parametrize("kind", [DEVICE, HOST])
def test_oversubscription_splits_local_chunks(dims, split, kind):
    """instruction_graph_misc_tests.cc "oversubscription splits local chunks recursively": one
    rank, two devices, oversubscription 4, 1-D or 2-D split: 8 kernels (4 per device) or, for a
    host task, 4 host-task instructions; each writes exactly its own box and the boxes tile
    the range."""
    shape = (256,) * dims
    ctx = GraphContext(1, devices=2)
    b = ctx.buffer(shape)
    ctx.task(shape, [(b, rm.one_to_one(), DW)], kind=kind, split=split, oversubscribe=4)
    ctx.finish()
    if kind == DEVICE:
        chunks = ctx.instrs(0, "device_kernel")
        assert len(chunks) == 8
        assert [k.device for k in chunks].count(0) == 4 and [k.device for k in chunks].count(1) == 4
    else:
        chunks = ctx.instrs(0, "host_task")
        assert len(chunks) == 4
    for c in chunks:
        assert one(c.accesses).box == c.box
    assert box_tiling([c.box for c in chunks], Box.full(shape))
    validate(ctx)


def test_unsafe_oversubscription_is_ignored_or_made_safe():
    """instruction_graph_misc_tests.cc "instruction_graph_generator throws in tests when
    detecting unsafe oversubscription" and "... gracefully handles unsafe oversubscription when
    check is disabled": Celerity refuses (or ignores) oversubscribing master-node tasks,
    collective tasks, host tasks with side effects and kernels with reductions.  celeritas
    raises nothing, even with diagnostics as errors: master-node and collective tasks stay
    one instruction; a host task with a side effect is split but its chunks run one after the
    other; a reduction kernel is split but every chunk reduces into its own slot and one
    reduce combines them after all chunks."""
    ctx = GraphContext(1, diagnostics="error")
    create_host_objects(ctx, 0)
    b = ctx.buffer((1,))
    ctx.task((), kind=MASTER, name="master", oversubscribe=2)
    ctx.task((1,), kind=COLLECTIVE, name="collective", collective_group=DEFAULT_GROUP, oversubscribe=2)
    ctx.task((256,), kind=HOST, name="side effect", side_effects=[0], oversubscribe=2)
    ctx.task((256,), [], name="reduction", reductions=[ctx.reduction(b)], oversubscribe=2)
    destroy_host_objects(ctx, 0)
    ctx.finish()
    validate(ctx)
    assert len(ctx.instrs(0, "host_task", name="master")) == 1
    assert len(ctx.instrs(0, "host_task", name="collective")) == 1
    side = ctx.instrs(0, "host_task", name="side effect")
    assert box_tiling([s.box for s in side], Box((0,), (256,)))
    for x, y in itertools.pairwise(side):
        assert ctx.depends_on(y, x)
    ks = ctx.instrs(0, "device_kernel", name="reduction")
    assert box_tiling([k.box for k in ks], Box((0,), (256,)))
    slots = {k.reductions[0].allocation for k in ks}
    assert len(slots) == len(ks)
    rd = one(ctx.instrs(0, "reduce"))
    assert rd.count == len(ks) and all(ctx.depends_on(rd, k) for k in ks)


def test_oversubscribed_reduction_and_side_effect_values():
    """instruction_graph_misc_tests.cc "... gracefully handles unsafe oversubscription when
    check is disabled", executed: an oversubscribed reduction over 1..100 gives 5050 (plus the
    buffer's 7), and an oversubscribed host task with a side effect appends each of its
    chunks exactly once, never two at a time."""
    def program(rank):
        q = cl.Queue(devices="host:2")
        total = cl.Buffer(np.array([7], dtype=np.int64), name="total")
        log = cl.HostObject([])
        busy = threading.Lock()

        def reduce(cgh):
            r = cl.reduction(total, cgh, cl.plus)
            cl.hint(cgh, cl.oversubscribe(2))

            @cgh.parallel_for((100,), offset=(1,), reductions=[r], name="sum")
            def k(chunk, r):
                r.combine(chunk.arange(0))
        q.submit(reduce)

        def record(cgh):
            entries = cl.side_effect(log, cgh)
            cl.hint(cgh, cl.oversubscribe(2))

            def body(part):
                assert busy.acquire(blocking=False), "two chunks ran at once"
                try:
                    entries.append((part.offset[0], part.range[0]))
                finally:
                    busy.release()
            cgh.host_task(body, range=(64,), name="record")
        q.submit(record)
        got = q.fence(total).result()[0], sorted(q.fence(log).result())
        q.shutdown()
        return got

    (value, entries), = run_cluster(program, nodes=1, timeout=60)
    assert value == 5057
    covered = sorted(i for lo, n in entries for i in range(lo, lo + n))
    assert covered == list(range(64))


# =================================================================================================
# instruction_graph_grid_tests.cc
# =================================================================================================
def _b(lo, hi):
    return Box(tuple(lo), tuple(hi))


Q2 = [_b((10, 10), (20, 20)), _b((20, 10), (30, 20)), _b((10, 20), (20, 30)), _b((20, 20), (30, 30))]
Q3 = [_b((10, 10, 10), (20, 20, 20)), _b((20, 10, 10), (30, 20, 20)), _b((10, 20, 10), (20, 30, 20)),
      _b((20, 20, 10), (30, 30, 20)), _b((10, 10, 20), (20, 20, 30)), _b((20, 10, 20), (30, 20, 30)),
      _b((10, 20, 20), (20, 30, 30)), _b((20, 20, 20), (30, 30, 30))]


def test_box_touches_on_overlap_and_shared_faces_only():
    """instruction_graph_grid_tests.cc "boxes_edge_connected_correctly detects 2/4/6-
    connectivity" (the cases celeritas agrees on): ``Box.touches``, which decides which
    boxes are allocated together, holds for overlapping boxes and boxes sharing a face (1-D:
    an end point; 2-D: an edge; 3-D: a face), and not for boxes with a gap between them."""
    a = _b((10,), (20,))
    for other in [(0, 10), (9, 10), (10, 11), (10, 20), (8, 12), (19, 20), (20, 21), (20, 30)]:
        assert a.touches(_b(*[(x,) for x in other])), other
    for other in [(0, 9), (21, 22), (21, 30)]:
        assert not a.touches(_b(*[(x,) for x in other])), other
    q1, q2, q3, q4 = Q2
    for x, y in [(q1, q2), (q1, q3), (q2, q1), (q2, q4), (q3, q1), (q3, q4), (q4, q2), (q4, q3)]:
        assert x.touches(y)
    left, right = _b((10, 0), (30, 9)), _b((10, 31), (30, 40))
    for q in Q2:
        assert not q.touches(left) and not q.touches(right)
    for i, j in [(0, 0), (0, 1), (0, 2), (0, 4), (1, 1), (1, 0), (1, 3), (1, 5), (6, 6), (6, 2), (6, 4), (6, 7)]:
        assert Q3[i].touches(Q3[j]), (i, j)


def test_box_touches_not_at_corners_or_edges():
    """instruction_graph_grid_tests.cc "boxes_edge_connected_correctly detects 2/4/6-
    connectivity" (the corner cases): 2-D quadrants meeting at one point and 3-D octants
    meeting along an edge or at a point are not connected."""
    q1, q2, q3, q4 = Q2
    for x, y in [(q1, q4), (q2, q3), (q3, q2), (q4, q1)]:
        assert not x.touches(y)
    for i, j in [(0, 3), (0, 5), (0, 6), (0, 7), (1, 2), (1, 4), (1, 6), (1, 7),
                 (6, 0), (6, 1), (6, 3), (6, 5)]:
        assert not Q3[i].touches(Q3[j]), (i, j)


def test_touching_groups_in_1d():
    """instruction_graph_grid_tests.cc "connected_subregion_bounding_boxes correctly merges
    bounding boxes" (1-D): the groups of a normalized 1-D region are its maximal intervals;
    an interval one element away stays apart.  An empty input has no group."""
    region = Region([_b((0,), (5,)), _b((6,), (10,)), _b((10,), (15,)), _b((19,), (25,)), _b((12,), (21,)),
                     _b((30,), (39,)), _b((35,), (40,))])
    assert Box.touching_groups(region.boxes) == (_b((0,), (5,)), _b((6,), (25,)), _b((30,), (40,)))
    assert Box.touching_groups([]) == ()
    assert Box.touching_groups([Box.empty_box(1), Box.empty_box(1)]) == ()


_GROUP_CASES = {
    # Celerity's connected parts, after its allocator merged those whose bounding boxes overlap
    "2d": ([_b((5, 0), (10, 15)), _b((10, 10), (20, 30)), _b((20, 10), (30, 20)), _b((25, 25), (40, 30)),
            _b((20, 30), (25, 35))],
           [_b((5, 0), (40, 30)), _b((20, 30), (25, 35))]),
    "3d": ([_b((10, 10, 10), (20, 20, 30)), _b((20, 10, 10), (30, 20, 20)), _b((10, 20, 10), (20, 30, 20)),
            _b((21, 21, 21), (29, 29, 29)), _b((0, 0, 10), (10, 10, 30)), _b((20, 20, 30), (25, 25, 35))],
           [_b((0, 0, 10), (10, 10, 30)), _b((10, 10, 10), (30, 30, 30)), _b((20, 20, 30), (25, 25, 35))]),
}


def test_touching_groups_are_disjoint_and_cover_the_region():
    """instruction_graph_grid_tests.cc "connected_subregion_bounding_boxes correctly merges
    bounding boxes" (the invariant celeritas keeps): for the 2-D and 3-D inputs of the
    Celerity case, the groups are pairwise disjoint bounding boxes that cover the region."""
    for boxes, _ in _GROUP_CASES.values():
        region = Region(boxes)
        groups = Box.touching_groups(region.boxes)
        for i, g in enumerate(groups):
            assert not any(g.intersects(h) for h in groups[i + 1:])
        cover = Region(groups)
        assert cover.contains(region)


@pytest.mark.parametrize("case", sorted(_GROUP_CASES))
def test_touching_groups_keep_corner_connected_parts_apart(case):
    """instruction_graph_grid_tests.cc "connected_subregion_bounding_boxes correctly merges
    bounding boxes" (2-D, 3-D): parts of a region that meet only at a corner or along an edge
    are separate groups; what Celerity finally allocates contiguously is its connected parts'
    bounding boxes, merged where they overlap."""
    boxes, expected = _GROUP_CASES[case]
    assert sorted(Box.touching_groups(Region(boxes).boxes), key=lambda b: b.lo) == expected


@pytest.mark.parametrize("remote", [False, True], ids=["local accesses", "await-push"])
def test_corner_touching_accesses_are_not_allocated_as_one_box(remote):
    """instruction_graph_grid_tests.cc "boxes_edge_connected_correctly detects 2/4/6-
    connectivity" / "connected_subregion_bounding_boxes correctly merges bounding boxes",
    at the graph level: a host task with one accessor for [10,20)^2 and one for [20,30)^2 of
    a 30x30 buffer (boxes meeting at one point), written by a host task with the same two
    accessors on the same rank or by rank 0, needs no more than those 200 elements of host
    memory: Celerity allocates each accessor's box (and each connected part of a received
    region) separately."""
    quads = [fixedn(q.lo[:2], q.range) for q in (Q2[0], Q2[3])]
    rank = 1 if remote else 0
    ctx = GraphContext(2 if remote else 1, compile_ranks=[rank])
    b = ctx.buffer((30, 30))
    if remote:
        ctx.task((), [(b, rm.all(), DW)], kind=MASTER, name="writer")
    else:
        ctx.task((1,), [(b, q, DW) for q in quads], kind=HOST, name="writer")
    ctx.task((2,) if remote else (1,), [(b, q, R) for q in quads], kind=HOST, name="reader")
    ctx.finish()
    validate(ctx, rank)
    allocs = [a for a in ctx.instrs(rank, "alloc") if a.buffer == b and a.memory == HOST_MEMORY]
    assert sum(a.box.area for a in allocs) <= 200, [a.box for a in allocs]


_NESTED = [_b((0, 0), (20, 20)), _b((0, 0), (15, 15)), _b((5, 5), (15, 15)), _b((8, 8), (12, 12))]
_PARTIAL = [Region([_b((0, 8), (10, 18)), _b((8, 0), (18, 10))]),
            Region([_b((5, 13), (15, 23)), _b((13, 5), (23, 15))]),
            Region([_b((0, 0), (4, 4))]), Region([_b((30, 30), (34, 34))])]
_DISJOINT = [_b((0, 0), (10, 10)), _b((10, 0), (20, 10)), _b((0, 10), (10, 20)), _b((10, 10), (20, 20))]
_DUPLICATE = [_b((0, 0), (10, 10))] * 4


def _as_reg(r) -> Region:
    return r if isinstance(r, Region) else Region.from_box(r)


def _pattern_mapper(pattern):
    """Item i maps to ``pattern[i % 4]``; a chunk to the union of what its items map to."""
    def mapper(chunk, shape):
        out = Region.empty_region(2)
        for i in range(chunk.offset[0], chunk.offset[0] + chunk.range[0]):
            out = out | _as_reg(pattern[i % 4])
        return out
    return mapper


def _check_arrivals_per_reader(ctx, rank: int, pattern, arrivals: list[tuple]) -> None:
    """``arrivals``: (instruction, region) of the receives or copies bringing the readers' data.
    They are pairwise disjoint and make up what the pattern reads; every reader depends on
    arrivals covering what it reads, and on none that brings data it does not read."""
    readers = ctx.instrs(rank, "device_kernel", name="reader")
    assert len(readers) == 4
    wanted = Region.empty_region(2)
    for r in pattern:
        wanted = wanted | _as_reg(r)
    got = Region.empty_region(2)
    for _ins, region in arrivals:
        assert not got.intersects(region)
        got = got | region
    assert got == wanted
    for k in readers:
        need = Region.empty_region(2)
        for acc in k.accesses:
            need = need | (acc.region if acc.region is not None else Region.from_box(acc.box))
        have = Region.empty_region(2)
        for ins, region in arrivals:
            if ctx.depends_on(k, ins, rank):
                have = have | region
                assert need.contains(region), (k.box, region, need)
        assert have.contains(need)


@pytest.mark.parametrize("pattern", [_DISJOINT, _DUPLICATE, _NESTED, _PARTIAL],
                         ids=["disjoint", "duplicate", "nested", "partially overlapping"])
def test_overlapping_remote_reads_are_received_once_per_element(pattern):
    """instruction_graph_grid_tests.cc "instruction_graph_generator computes concurrent splits
    for potentially-overlapping receive- and copy regions", at the graph level: rank 1's four
    device chunks read the regions of the Celerity case (disjoint, duplicate, nested,
    partially overlapping) of data written on rank 0.  Every element is received exactly once
    (the receive / await-receive regions are pairwise disjoint and their union is what rank 1
    reads), and every reader depends on receives covering what it reads and on none that
    brings data it does not read: overlapping regions are split symmetrically into A-B,
    A&B, B-A, as Celerity splits them.  (Until 2026-11-28 each reader got what the readers
    before it had not taken, so a later reader also waited for an earlier one's whole part.)"""
    ctx = GraphContext(2, devices=4, compile_ranks=[1])
    b = ctx.buffer((40, 40), dtype="int32")
    ctx.task((), kind=MASTER, accesses=[(b, rm.all(), DW)], name="writer")
    ctx.task((8,), [(b, _pattern_mapper(pattern), R)], name="reader")   # rank 1: items 4-7
    ctx.finish()
    validate(ctx, 1)
    arrivals = ctx.instrs(1, "receive") + ctx.instrs(1, "await_receive")
    _check_arrivals_per_reader(ctx, 1, pattern, [(a, a.region) for a in arrivals])
    for s in ctx.instrs(1, "split_receive"):
        parts = [a for a in ctx.instrs(1, "await_receive") if a.transfer == s.transfer and ctx.depends_on(a, s, 1)]
        assert Region(tuple(x for p in parts for x in p.region.boxes)) == s.region


@pytest.mark.parametrize("pattern", [_DISJOINT, _DUPLICATE, _NESTED, _PARTIAL],
                         ids=["disjoint", "duplicate", "nested", "partially overlapping"])
def test_overlapping_local_reads_are_copied_once_per_element(pattern):
    """The copy half of the same Celerity case: four chunks on one device (oversubscribed)
    read the four regions of data that lies in host memory.  Every element is copied to the
    device once (the copies' regions are pairwise disjoint and make up what the chunks read),
    every reader depends on copies covering what it reads and on none that brings data it
    does not read: the concurrent copies are split symmetrically, as Celerity splits them.
    (Until 2026-11-28 a later chunk waited for its neighbour's whole copy.)"""
    ctx = GraphContext(1, devices=1)
    b = ctx.buffer((40, 40), dtype="int32")
    ctx.task((), kind=MASTER, accesses=[(b, rm.all(), DW)], name="writer")
    ctx.task((4,), [(b, _pattern_mapper(pattern), R)], name="reader", oversubscribe=4)
    ctx.finish()
    validate(ctx, 0)
    copies = [c for c in ctx.instrs(0, "copy") if c.dest_memory >= 2]
    _check_arrivals_per_reader(ctx, 0, pattern, [(c, Region.from_box(c.box)) for c in copies])
