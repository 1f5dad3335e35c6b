"""Instruction-graph behaviours restated from the C++ Celerity runtime's tests
(test/instruction_graph_reduction_tests.cc and instruction_graph_memory_tests.cc) that
celeritas had no test for.

Each docstring names the Celerity TEST_CASE it restates and the property pinned.  Where the
exact Celerity shape is an implementation detail celeritas does differently (it always
reduces a chunk's partial through a host gather allocation; it stages device-to-device
copies without peer access through the buffer's host allocation rather than a separate
staging allocation; copies are per box rather than one region copy), the test pins the
semantic property (dependencies that must exist, data moved once, concurrency kept) and the
docstring says so.  Every graph is also run through ``ig_validator.validate`` (no races,
no leaks).
"""
import pytest

from celeritas import range_mappers as rm
from scheduler import task_graph as tg
from scheduler.geometry import Box, Region, Subrange
from scheduler.instruction_graph import HOST_MEMORY

from graph_context import GraphContext
from ig_validator import validate

R, W, RW, DW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE


def fixed(lo, hi):
    return rm.fixed(Subrange((lo,), (hi - lo,)))


def fixedn(offset, size):
    return rm.fixed(Subrange(tuple(offset), tuple(size)))


def disjoint_union(copies) -> Region:
    """The union of the copies' boxes, which must not overlap (each element copied once)."""
    got = Region.empty_region(copies[0].box.dims if copies else 1)
    for c in copies:
        assert not got.intersects(Region.from_box(c.box)), c.box
        got = got | Region.from_box(c.box)
    return got


def one(xs):
    assert len(xs) == 1, xs
    return xs[0]


def by_id(ctx, rank=0):
    return {i.id: i for i in ctx.instructions[rank]}


def preds(ctx, ins, rank=0, kind=None):
    m = by_id(ctx, rank)
    out = [m[d] for d in ins.dep_ids if d in m]
    return [p for p in out if kind is None or p.kind == kind]


def all_concurrent(ctx, xs, rank=0) -> bool:
    return all(ctx.concurrent(a, b, rank) for i, a in enumerate(xs) for b in xs[i + 1:])


def kernels(ctx, name, rank=0):
    return ctx.instrs(rank, "device_kernel", name=name)


def reduce_task(ctx, b, n, include_current=False, **kw):
    red = ctx.reduction(b, include_current=include_current)
    return ctx.task((n,), [], reductions=[red], **kw), red


def global_reduce(ctx, rank):
    """The reduce instruction fed by the gather-receive (celeritas also emits a local reduce
    per execution command, over the devices' partials)."""
    gr = one(ctx.instrs(rank, "gather_receive"))
    return one([r for r in ctx.instrs(rank, "reduce") if r.source == gr.dest])


# =================================================================================================
# instruction_graph_reduction_tests.cc
# =================================================================================================
def test_single_device_reduction_is_a_plain_write():
    """instruction_graph_reduction_tests.cc "reductions are equivalent to writes on a
    single-node single-device setup": the reader's predecessor is the reducing kernel itself;
    there is no copy, reduce, send, gather-receive or fill-identity, and the graph is race free.
    (Before, the partial went device scratch -> host gather copy -> reduce (count 1) ->
    host-to-device copy.)"""
    ctx = GraphContext(1)
    b = ctx.buffer((1,))
    reduce_task(ctx, b, 256, name="writer")
    ctx.task((256,), [(b, rm.all(), R)], name="reader")
    ctx.finish()
    writer, reader = one(kernels(ctx, "writer")), one(kernels(ctx, "reader"))
    assert writer.id in reader.dep_ids
    for kind in ("copy", "reduce", "send", "gather_receive", "fill_identity"):
        assert ctx.instrs(0, kind) == [], kind
    validate(ctx)


def test_single_device_reduction_folds_in_the_host_initialized_value():
    """instruction_graph_reduction_tests.cc "single-node single-device reductions locally
    include the initial buffer value": a host task initializes the element on the host, the
    device kernel reduces including the current value.  The kernel is concurrent with the
    initializing host task (different memories); the partial is copied to a host gather
    allocation; one reduce (marked to include the destination) reads both the initial value
    and the partial, and the reader depends on it.  (Celerity copies the initial value into
    a 2-slot gather allocation; celeritas reduces the partials into the buffer's host
    allocation, folding in the value already there.)"""
    ctx = GraphContext(1)
    b = ctx.buffer((1,), host_init=True)
    ctx.task((1,), [(b, rm.one_to_one(), DW)], kind=tg.HOST_COMPUTE, name="init")
    reduce_task(ctx, b, 256, include_current=True, name="writer")
    ctx.task((256,), [(b, rm.all(), R)], name="reader")
    ctx.finish()
    init = one(ctx.instrs(0, "host_task", name="init"))
    writer, reader = one(kernels(ctx, "writer")), one(kernels(ctx, "reader"))
    assert ctx.concurrent(init, writer)
    rd = one(ctx.instrs(0, "reduce"))
    assert rd.include_dest and rd.count == 1
    gather_copy = one([c for c in ctx.instrs(0, "copy") if c.dest == rd.source])
    assert gather_copy.source_memory == 2 and gather_copy.dest_memory == HOST_MEMORY
    assert ctx.depends_on(gather_copy, writer)
    assert ctx.depends_on(rd, init) and ctx.depends_on(rd, gather_copy)
    assert ctx.depends_on(reader, rd)
    validate(ctx)


@pytest.mark.parametrize("devices", [2, 4])
def test_multi_device_reduction_on_one_rank_is_local_only(devices):
    """instruction_graph_reduction_tests.cc "reduction accesses on a single-node multi-device
    setup generate local reduce-instructions only": one concurrent kernel per device; one
    concurrent gather copy per kernel into a single host gather allocation of one slot per
    device, the slot given by the device (deterministic order: the operator need not be
    associative); no fill-identity; one reduce over all slots; the readers are concurrent
    and follow the reduce."""
    ctx = GraphContext(1, devices=devices)
    b = ctx.buffer((1,), dtype="int32")
    reduce_task(ctx, b, 256, name="writer")
    ctx.task((256,), [(b, rm.all(), R)], name="reader")
    ctx.finish()
    writers = kernels(ctx, "writer")
    assert len(writers) == devices and all_concurrent(ctx, writers)
    rd = one(ctx.instrs(0, "reduce"))
    assert rd.count == devices
    gather_alloc = one([a for a in ctx.instrs(0, "alloc") if a.allocation == rd.source])
    assert gather_alloc.memory == HOST_MEMORY and gather_alloc.size_bytes == devices * 4
    copies = [c for c in ctx.instrs(0, "copy") if c.dest == rd.source]
    assert len(copies) == devices and all_concurrent(ctx, copies)
    for c in copies:
        (w,) = [k for k in writers if ctx.depends_on(c, k)]
        assert c.box == Box((w.device,), (w.device + 1,))
        assert c.id in rd.dep_ids
    assert ctx.instrs(0, "fill_identity") == []
    readers = kernels(ctx, "reader")
    assert len(readers) == devices and all_concurrent(ctx, readers)
    assert all(ctx.depends_on(r, rd) for r in readers)
    validate(ctx)


@pytest.mark.parametrize("devices", [1, 2, 4])
@pytest.mark.parametrize("ranks,rank", [(2, 0), (2, 1), (4, 0), (4, 1)])
def test_multi_rank_reduction_gathers_partials_globally(ranks, rank, devices):
    """instruction_graph_reduction_tests.cc "reduction accesses on a multi-node single-device
    setup generate global reduce-instructions only" and "... multi-node multi-device setup
    generate global and local reduce-instructions": the global reduce combines one value per
    rank from a host gather allocation of one slot per rank, filled with the identity first
    (a peer may send nothing); this rank's partial is copied into its own slot (after the
    fill, concurrently with the gather-receive, which writes the other slots); one send of
    the partial (the one element) to every other rank, all concurrent, each before the
    global reduce (which overwrites what they read) and after the local reduce; the
    gather-receive's transfer names the reader task, the buffer and the reduction.
    (celeritas always reduces locally first, also over a single device.)"""
    ctx = GraphContext(ranks, devices=devices, compile_ranks=[rank])
    b = ctx.buffer((1,), dtype="int32")
    _, red = reduce_task(ctx, b, 256, name="writer")
    reader = ctx.task((256,), [(b, rm.all(), R)], name="reader")
    ctx.finish()
    grd = global_reduce(ctx, rank)
    assert grd.count == ranks and grd.reduction == red.id
    local = one([r for r in ctx.instrs(rank, "reduce") if r is not grd])
    assert local.count == devices
    gr = one(ctx.instrs(rank, "gather_receive"))
    assert gr.transfer == (reader.id, b, red.id) and gr.num_ranks == ranks and gr.chunk_bytes == 4
    fill = one(ctx.instrs(rank, "fill_identity"))
    assert fill.allocation == gr.dest and fill.count == ranks and fill.reduction == red.id
    gather_alloc = one([a for a in ctx.instrs(rank, "alloc") if a.allocation == gr.dest])
    assert gather_alloc.size_bytes == ranks * 4 and gather_alloc.memory == HOST_MEMORY
    assert ctx.depends_on(gr, fill, rank)
    copy = one([c for c in ctx.instrs(rank, "copy") if c.dest == gr.dest])
    assert copy.box == Box((rank,), (rank + 1,))
    assert ctx.depends_on(copy, fill, rank) and ctx.concurrent(copy, gr, rank)
    assert ctx.concurrent(gr, local, rank)
    assert ctx.depends_on(grd, gr, rank) and ctx.depends_on(grd, copy, rank)
    sends = ctx.instrs(rank, "send")
    assert sorted(s.to for s in sends) == [r for r in range(ranks) if r != rank]
    assert all_concurrent(ctx, sends, rank)
    for s in sends:
        assert s.box == Box((0,), (1,)) and s.transfer == (reader.id, b, red.id)
        assert ctx.depends_on(grd, s, rank) and ctx.depends_on(s, local, rank)
    validate(ctx, rank)


@pytest.mark.parametrize("rank", [0, 1])
def test_reduction_folds_in_a_value_held_by_another_rank(rank):
    """instruction_graph_reduction_tests.cc "local reductions can be initialized to a buffer
    value that is not present locally": rank 1 writes the element, a one-item reduction that
    folds in the current value runs on rank 0.  Rank 0 receives the element (a transfer
    without reduction id) and its reduce includes it with the kernel's partial; the kernel has
    no ordinary buffer access, only the reduction.  Rank 1 sends the element with a pilot to
    rank 0."""
    ctx = GraphContext(2, compile_ranks=[rank])
    b = ctx.buffer((1,), dtype="int32")

    def second_item_writes(chunk, shape):
        return Subrange((0,), (1 if chunk.offset[0] + chunk.range[0] > 1 else 0,))

    ctx.task((2,), [(b, second_item_writes, DW)], name="init")
    t, red = reduce_task(ctx, b, 1, include_current=True, name="writer")
    ctx.finish()
    transfer = (t.id, b, 0)
    if rank == 0:
        recv = one(ctx.instrs(0, "receive"))
        assert recv.transfer == transfer and recv.region == Region.from_box(Box((0,), (1,)))
        writer = one(kernels(ctx, "writer"))
        assert all(a.allocation == -1 or a.buffer != b for a in writer.accesses)
        assert [(r.reduction, r.buffer) for r in writer.reductions] == [(red.id, b)]
        rd = one(ctx.instrs(0, "reduce"))
        assert rd.include_dest and rd.reduction == red.id
        assert ctx.depends_on(rd, recv) and ctx.depends_on(rd, writer)
    else:
        send = one(ctx.instrs(1, "send"))
        assert send.transfer == transfer and send.box == Box((0,), (1,)) and send.to == 0
        pilot = one(ctx.pilots[1])
        assert pilot.to == 0 and pilot.transfer == transfer and pilot.box == Box((0,), (1,))
    validate(ctx, rank)


def test_only_participating_devices_contribute_partials():
    """instruction_graph_reduction_tests.cc "local reductions only include values from
    participating devices": 4 devices, 2 items: two kernels, one gather copy each (from the
    kernel's reduction scratch, into the slot of its device), and a reduce over 2 values."""
    ctx = GraphContext(1, devices=4)
    b = ctx.buffer((1,))
    reduce_task(ctx, b, 2, name="writer")
    ctx.finish()
    writers = kernels(ctx, "writer")
    assert len(writers) == 2
    rd = one(ctx.instrs(0, "reduce"))
    assert rd.count == 2
    for w in writers:
        assert all(a.allocation == -1 or a.buffer != b for a in w.accesses)
        (ra,) = w.reductions
        c = one([c for c in ctx.instrs(0, "copy") if c.source == ra.allocation])
        assert c.dest == rd.source and c.box == Box((w.device,), (w.device + 1,))
        assert c.id in rd.dep_ids
    validate(ctx)


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_rank_without_a_partial_sends_empty_pilots_and_copies_nothing(rank):
    """instruction_graph_reduction_tests.cc "global reductions without a local contribution do
    not read stale local values": 3 ranks, a reduction over 2 items (ranks 0 and 1), read on
    all three.  Every rank fills its gather allocation with the identity before the
    gather-receive.  Ranks 0 and 1 copy their partial into their slot (concurrently with the
    receive) and send it to both peers (concurrently with that copy, and before the reduce
    that overwrites it), announced by pilots with the element's box.  Rank 2 has no partial:
    no send, no copy into the gather allocation, and empty pilots to ranks 0 and 1 with the
    reduction's transfer id.  Every reader follows its global reduce."""
    ctx = GraphContext(3, compile_ranks=[rank])
    b = ctx.buffer((1,))
    _, red = reduce_task(ctx, b, 2, name="writer")
    reader = ctx.task((3,), [(b, rm.all(), R)], name="reader")
    ctx.finish()
    grd = global_reduce(ctx, rank)
    gr = one(ctx.instrs(rank, "gather_receive"))
    fill = one(ctx.instrs(rank, "fill_identity"))
    assert fill.allocation == gr.dest and fill.count == 3 and ctx.depends_on(gr, fill, rank)
    transfer = (reader.id, b, red.id)
    gather_copies = [c for c in ctx.instrs(rank, "copy") if c.dest == gr.dest]
    if rank < 2:
        (copy,) = gather_copies
        assert copy.box == Box((rank,), (rank + 1,)) and ctx.concurrent(copy, gr, rank)
        assert ctx.depends_on(copy, fill, rank)
        sends = ctx.instrs(rank, "send")
        assert len(sends) == 2
        for s in sends:
            assert s.transfer == transfer and ctx.concurrent(s, copy, rank) and ctx.depends_on(grd, s, rank)
            pilot = one([p for p in ctx.pilots[rank] if p.to == s.to])
            assert pilot.transfer == transfer and pilot.box == Box((0,), (1,)) and pilot.msg_id == s.msg_id
    else:
        assert gather_copies == [] and ctx.instrs(rank, "send") == []
        assert sorted(p.to for p in ctx.pilots[rank]) == [0, 1]
        assert all(p.transfer == transfer and p.box.empty for p in ctx.pilots[rank])
    assert ctx.depends_on(one(kernels(ctx, "reader", rank)), grd, rank)
    validate(ctx, rank)


def test_rank_without_a_chunk_does_not_fold_in_its_stale_host_value():
    """instruction_graph_reduction_tests.cc "global reductions do not include stale local
    values even if the local node did not receive an execution_command for the kernel
    initiating the reduction": rank 2 holds the (stale) host-initialized value but has no
    chunk of the reduction; its global reduce reads only the gather allocation, into which
    nothing is copied, and does not fold in its destination."""
    ctx = GraphContext(3, compile_ranks=[2])
    b = ctx.buffer((1,), host_init=True)
    reduce_task(ctx, b, 2, name="writer")
    ctx.task((3,), [(b, rm.all(), R)], name="reader")
    ctx.finish()
    rd = one(ctx.instrs(2, "reduce"))
    gr = one(ctx.instrs(2, "gather_receive"))
    assert rd.source == gr.dest and not rd.include_dest
    assert [c for c in ctx.instrs(2, "copy") if c.dest == gr.dest] == []
    assert ctx.depends_on(rd, gr, 2)
    validate(ctx, 2)


# =================================================================================================
# instruction_graph_memory_tests.cc
# =================================================================================================
def test_empty_accesses_allocate_nothing_and_order_nothing():
    """instruction_graph_memory_tests.cc "empty-range buffer accesses do not trigger allocations
    or cause dependencies": empty discard_write and read_write accesses (from kernels and
    master-node host tasks) make no alloc and no copy; each instruction still lists the access,
    bound to no allocation (-1); all four are concurrent."""
    ctx = GraphContext(1)
    b = ctx.buffer((256,))
    ctx.task((1,), [(b, fixed(0, 0), DW)])
    ctx.task((1,), [(b, fixed(128, 128), DW)])
    ctx.task((1,), [(b, fixed(0, 0), RW)], kind=tg.MASTER_NODE)
    ctx.task((1,), [(b, fixed(128, 128), RW)], kind=tg.MASTER_NODE)
    ctx.finish()
    assert ctx.instrs(0, "alloc") == [] and ctx.instrs(0, "copy") == []
    ks = ctx.instrs(0, "device_kernel") + ctx.instrs(0, "host_task")
    assert len(ks) == 4
    for k in ks:
        assert [a.allocation for a in k.accesses] == [-1]
    assert all_concurrent(ctx, ks)
    validate(ctx)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_overlapping_accessors_allocate_their_bounding_box(dims):
    """instruction_graph_memory_tests.cc "multiple overlapping accessors trigger allocation of
    their bounding box" (1-3 dims): two shifted discard_write accessors of one kernel share one
    allocation of their bounding box on the device, allocated before and freed after the
    kernel, with matching sizes."""
    n, a, o1, o2 = 64, 32, 8, 24
    ctx = GraphContext(1)
    b = ctx.buffer((n,) * dims, dtype="int32")

    def shifted(off):
        def m(chunk, shape):
            return Subrange(tuple(x + off for x in chunk.offset), chunk.range)
        return m

    ctx.task((a,) * dims, [(b, shifted(o1), DW), (b, shifted(o2), DW)])
    ctx.finish()
    k = one(ctx.instrs(0, "device_kernel"))
    alloc = one(ctx.instrs(0, "alloc"))
    expected = Box((o1,) * dims, (o2 + a,) * dims)
    assert alloc.memory == 2 and alloc.buffer == b and alloc.box == expected
    assert alloc.size_bytes == expected.area * 4
    assert ctx.depends_on(k, alloc)
    free = one(ctx.instrs(0, "free"))
    assert free.allocation == alloc.allocation and ctx.depends_on(free, k)
    validate(ctx)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_disjoint_region_mapper_allocates_its_bounding_box(dims):
    """instruction_graph_memory_tests.cc "accessors with disjoint-region range mappers trigger
    allocation of their bounding box": a mapper returning two disjoint boxes gets one
    allocation of their bounding box; the kernel's access records that allocation, the exact
    region and its bounding box."""
    region = Region([Box((0,) * dims, (16,) * dims), Box((32,) * dims, (48,) * dims)])
    bbox = Box((0,) * dims, (48,) * dims)
    ctx = GraphContext(1)
    b = ctx.buffer((64,) * dims, dtype="int32")
    ctx.task((1,), [(b, lambda chunk, shape: region, DW)])
    ctx.finish()
    alloc = one(ctx.instrs(0, "alloc"))
    k = one(ctx.instrs(0, "device_kernel"))
    assert alloc.box == bbox and alloc.size_bytes == bbox.area * 4 and ctx.depends_on(k, alloc)
    (acc,) = k.accesses
    assert acc.allocation == alloc.allocation and acc.allocation_box == bbox and acc.box == bbox
    assert acc.region == region
    validate(ctx)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_allocations_and_kernels_split_between_devices(dims):
    """instruction_graph_memory_tests.cc "allocations and kernels are split between devices":
    two devices get one kernel each on halves along dimension 0, each with its own allocation
    (of exactly its accessed box, on its own memory) that depends only on the init epoch and
    is freed after the kernel, right before the shutdown epoch."""
    shape = (16,) * dims
    ctx = GraphContext(1, devices=2)
    b = ctx.buffer(shape)
    ctx.task(shape, [(b, rm.one_to_one(), DW)], name="writer")
    ctx.finish()
    m = by_id(ctx)
    writers = kernels(ctx, "writer")
    assert sorted(w.device for w in writers) == [0, 1]
    assert Region([w.box for w in writers]) == Region.from_box(Box((0,) * dims, shape))
    for w in writers:
        assert w.box.range == (8,) + shape[1:] and w.box.min[0] in (0, 8)
        alloc = one(preds(ctx, w, kind="alloc"))
        assert alloc.memory == 2 + w.device and alloc.box == w.accesses[0].box
        assert all(m[d].kind == "epoch" for d in alloc.dep_ids)
        free = one([f for f in ctx.instrs(0, "free") if f.allocation == alloc.allocation])
        assert w.id in free.dep_ids
    shutdown = ctx.instrs(0, "epoch")[-1]
    assert {f.id for f in ctx.instrs(0, "free")} <= set(shutdown.dep_ids)
    validate(ctx)


def test_kernel_dependencies_on_one_memory():
    """instruction_graph_memory_tests.cc "data-dependencies are generated between kernels on
    the same memory": write all of B1; overwrite its right half (output dependency on the
    first); read B1 and write B2 (true dependency on the overwrite); read_write the centre of
    B1 (anti dependency on that reader); read B2 (true dependency on its writer, nothing else
    among the kernels); read B1 and B2 (true dependency on the centre read_write) concurrently
    with the other reader of B2."""
    ctx = GraphContext(1)
    b1, b2 = ctx.buffer((256,)), ctx.buffer((256,))
    names = ["write buf1", "overwrite buf1 right", "read buf1 write buf2", "rw buf1 center", "read buf2",
             "read buf1+2"]
    ctx.task((1,), [(b1, rm.all(), DW)], name=names[0])
    ctx.task((1,), [(b1, fixed(128, 256), DW)], name=names[1])
    ctx.task((1,), [(b1, rm.all(), R), (b2, rm.all(), DW)], name=names[2])
    ctx.task((1,), [(b1, fixed(64, 192), RW)], name=names[3])
    ctx.task((1,), [(b2, rm.all(), R)], name=names[4])
    ctx.task((1,), [(b1, rm.all(), R), (b2, rm.all(), R)], name=names[5])
    ctx.finish()
    k = {n: one(kernels(ctx, n)) for n in names}

    def kpreds(name):
        return {p.name for p in preds(ctx, k[name], kind="device_kernel")}

    assert kpreds(names[0]) == set()
    assert kpreds(names[1]) == {names[0]}
    assert names[1] in kpreds(names[2])
    assert names[2] in kpreds(names[3])
    assert kpreds(names[4]) == {names[2]}
    assert names[3] in kpreds(names[5]) and names[4] not in kpreds(names[5])
    assert ctx.concurrent(k[names[4]], k[names[5]])
    validate(ctx)


def test_coherence_copies_between_devices_move_the_other_half_concurrently():
    """instruction_graph_memory_tests.cc "data dependencies across memories introduce coherence
    copies": two devices write a half each and then both read everything: each reader is fed
    by exactly one copy, from the other device's memory into its own, of exactly what the
    other device wrote; the two copies are concurrent."""
    ctx = GraphContext(1, devices=2)
    b = ctx.buffer((256,))
    ctx.task((256,), [(b, rm.one_to_one(), DW)], name="writer")
    ctx.task((256,), [(b, rm.all(), R)], name="reader")
    ctx.finish()
    writers = {w.device: w for w in kernels(ctx, "writer")}
    # (celeritas, lookahead none, also grows each device's allocation for the read of
    # everything: copies inside one memory are resizes, not coherence copies)
    copies = [c for c in ctx.instrs(0, "copy") if c.source_memory != c.dest_memory]
    assert len(copies) == 2 and all_concurrent(ctx, copies)
    for r in kernels(ctx, "reader"):
        other = writers[1 - r.device]
        c = one([c for c in copies if ctx.depends_on(r, c)])
        assert c.source_memory == 2 + other.device and c.dest_memory == 2 + r.device
        assert c.box == other.accesses[0].box
        assert ctx.depends_on(c, other)
    validate(ctx)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_coherence_copy_of_the_same_data_happens_once(dims):
    """instruction_graph_memory_tests.cc "coherence copies of the same data are performed only
    once": a host task initializes the buffer, a kernel overwrites the first half, two host
    readers read the first half, a kernel overwrites the second half, two host readers read
    everything: exactly one device-to-host copy per half, each after its writer and before
    all the host readers that need it.  (Celerity's device allocations of the two halves are
    separate; celeritas may merge them, so copies between device allocations - resizes - are
    not counted here.)"""
    shape = (16,) * dims
    half = (8,) + shape[1:]
    first, second = Box((0,) * dims, half), Box((8,) + (0,) * (dims - 1), shape)
    ctx = GraphContext(1, horizon_step=999)
    b = ctx.buffer(shape)
    ctx.task(shape, [(b, rm.one_to_one(), DW)], kind=tg.HOST_COMPUTE, name="init")
    ctx.task((1,), [(b, fixedn(first.min, first.range), DW)], name="write 1st half")
    for _ in range(2):
        ctx.task((1,), [(b, fixedn(first.min, first.range), R)], kind=tg.MASTER_NODE, name="read 1st half")
    ctx.task((1,), [(b, fixedn(second.min, second.range), DW)], name="write 2nd half")
    for _ in range(2):
        ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE, name="read all")
    ctx.finish()
    to_host = [c for c in ctx.instrs(0, "copy") if c.source_memory == 2 and c.dest_memory == HOST_MEMORY]
    assert sorted((c.box.min, c.box.max) for c in to_host) == sorted([(first.min, first.max), (second.min, second.max)])
    c1 = one([c for c in to_host if c.box == first])
    c2 = one([c for c in to_host if c.box == second])
    assert ctx.depends_on(c1, one(kernels(ctx, "write 1st half")))
    assert ctx.depends_on(c2, one(kernels(ctx, "write 2nd half")))
    for h in ctx.instrs(0, "host_task", name="read 1st half") + ctx.instrs(0, "host_task", name="read all"):
        assert ctx.depends_on(h, c1)
    for h in ctx.instrs(0, "host_task", name="read all"):
        assert ctx.depends_on(h, c2)
    assert [c for c in ctx.instrs(0, "copy") if c.dest_memory == 2 and c.source_memory == HOST_MEMORY] == []
    validate(ctx)


def test_device_to_host_copies_are_split_per_writer():
    """instruction_graph_memory_tests.cc "local copies are split on writers to facilitate
    compute-copy overlap": two kernels each overwrite one half; a host reader of everything
    gets one copy per writer, each depending on its own writer and concurrent with the other
    writer, so the first copy can overlap the second kernel.  (It was one copy depending on
    both writers.)"""
    ctx = GraphContext(1, horizon_step=999)
    b = ctx.buffer((256,))
    ctx.task((1,), [(b, rm.all(), DW)], name="init")
    ctx.task((1,), [(b, fixed(0, 128), DW)], name="writer")
    ctx.task((1,), [(b, fixed(128, 256), DW)], name="writer")
    ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE, name="reader")
    ctx.finish()
    writers = kernels(ctx, "writer")
    reader = one(ctx.instrs(0, "host_task", name="reader"))
    copies = ctx.instrs(0, "copy")
    assert len(writers) == 2 and len(copies) == 2
    for c in copies:
        (w,) = [w for w in writers if c.box == w.accesses[0].box]
        assert ctx.depends_on(c, w) and ctx.depends_on(reader, c)
        (other,) = [x for x in copies if x is not c]
        assert ctx.concurrent(w, other)
    validate(ctx)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_oversubscribed_neighbourhood_reads_copy_each_element_once(dims):
    """instruction_graph_memory_tests.cc "overlapping requirements between chunks of an
    oversubscribed kernel generate one copy per reader-set": a master-node task writes
    everything on the host, an oversubscribed (x4) kernel reads a neighbourhood.  The
    host-to-device copies are concurrent, disjoint and together cover the buffer; each reader
    chunk depends on copies that make up exactly what it reads.  As in Celerity the copies
    are cut per set of readers: 7, one per chunk and one per overlap between neighbours, so
    every chunk depends on several.  (Until 2026-11-28 celeritas copied what each chunk lacked
    in chunk order: 4 copies, a later chunk waiting for its neighbour's whole copy.)"""
    shape = (16,) * dims
    ctx = GraphContext(1)
    b = ctx.buffer(shape, dtype="int32")
    ctx.task((1,), [(b, rm.all(), DW)], kind=tg.MASTER_NODE, name="writer")
    ctx.task(shape, [(b, rm.neighborhood(*([1] * dims)), R)], oversubscribe=4, name="reader")
    ctx.finish()
    copies = [c for c in ctx.instrs(0, "copy") if c.dest_memory == 2]
    assert all_concurrent(ctx, copies)
    covered = Region.empty_region(dims)
    for c in copies:
        assert not covered.intersects(Region.from_box(c.box))
        covered = covered | Region.from_box(c.box)
    assert covered == Region.from_box(Box((0,) * dims, shape))
    assert len(copies) == 7
    readers = kernels(ctx, "reader")
    assert len(readers) == 4
    for r in readers:
        mine = [c for c in copies if ctx.depends_on(r, c)]
        assert len(mine) > 1
        got = Region([c.box for c in mine])
        read = r.accesses[0].region if r.accesses[0].region is not None else Region.from_box(r.accesses[0].box)
        assert got == read
    validate(ctx)


def test_read_plus_discard_write_is_a_read_write():
    """instruction_graph_memory_tests.cc "overlapping accessors with read + discard_write modes
    are equivalent to a read_write access": after two kernels write a half each, a kernel that
    reads and discard-writes everything depends on both (its read keeps their data, through a
    resize copy where the allocation grows), and a later reader depends on it alone among
    the kernels."""
    ctx = GraphContext(1)
    b = ctx.buffer((32,))
    ctx.task((1,), [(b, fixed(0, 16), DW)], name="alloc")
    ctx.task((1,), [(b, fixed(16, 32), DW)], name="alloc")
    ctx.task((1,), [(b, rm.all(), R), (b, rm.all(), DW)], name="read + discard_write")
    ctx.task((1,), [(b, rm.all(), R)], name="consume")
    ctx.finish()
    rdw = one(kernels(ctx, "read + discard_write"))
    for k in kernels(ctx, "alloc"):
        assert ctx.depends_on(rdw, k)
    consume = one(kernels(ctx, "consume"))
    assert [p.id for p in preds(ctx, consume, kind="device_kernel")] == [rdw.id]
    validate(ctx)


def test_fully_overwritten_resize_copies_nothing():
    """instruction_graph_memory_tests.cc "fully overwriting an allocated region which requires
    a resize does not generate copy instructions": a write of the first half then a discard
    write of everything: no copy (the old data is dead), and - Celerity - the two kernels are
    concurrent.  celeritas orders the second after the first (it frees the allocation the
    first wrote), which the validator requires; the copy-free property holds."""
    ctx = GraphContext(1)
    b = ctx.buffer((32,))
    ctx.task((1,), [(b, fixed(0, 16), DW)], name="write 1st half")
    ctx.task((1,), [(b, fixed(0, 32), DW)], name="write 2nd half")
    ctx.finish()
    assert ctx.instrs(0, "copy") == []
    validate(ctx)


def test_resize_copies_only_from_allocations_still_read():
    """instruction_graph_memory_tests.cc "resize-copy instructions are only generated from
    allocations that are not fully overwritten in the same task": two allocations (0..16,
    16..32), then a task reading 0..8 and discard-writing 8..32: only 0..8 is copied, from
    the first allocation (nothing is copied out of the second, all of whose data is
    overwritten)."""
    ctx = GraphContext(1)
    b = ctx.buffer((32,))
    ctx.task((1,), [(b, fixed(0, 16), DW)], name="alloc 1st")
    ctx.task((1,), [(b, fixed(16, 32), DW)], name="alloc 2nd")
    ctx.task((1,), [(b, fixed(0, 8), R), (b, fixed(8, 32), DW)], name="resize")
    ctx.finish()
    allocs = {a.allocation: a for a in ctx.instrs(0, "alloc")}
    copies = ctx.instrs(0, "copy")
    assert copies, "the data of 0..8 must survive the resize"
    assert Region([c.box for c in copies]) == Region.from_box(Box((0,), (8,)))
    first = [a for a in allocs.values() if a.box == Box((0,), (16,))]
    assert all(allocs[c.source].box.contains(c.box) and allocs[c.source].box != Box((16,), (32,)) for c in copies)
    assert first
    validate(ctx)


def test_oddly_shaped_coherence_copy_moves_exactly_the_border():
    """instruction_graph_memory_tests.cc "oddly-shaped coherence copies generate a single
    region-copy instruction": D0 writes everything, D1 overwrites everything, D0 overwrites the
    centre box, D0 reads everything: what is copied from D1 to D0 is exactly the border (the
    buffer minus the centre), once.  (Celerity issues one region copy; celeritas one copy per
    box of the region - the moved region is the property.)"""
    ctx = GraphContext(1, devices=2)
    b = ctx.buffer((64, 64))
    ctx.task((1,), [(b, rm.all(), DW)])

    def second_item_writes_all(chunk, shape):
        return Subrange((0, 0), (64, 64) if chunk.offset[0] + chunk.range[0] > 1 else (0, 0))

    ctx.task((2,), [(b, second_item_writes_all, DW)])
    ctx.task((1,), [(b, fixedn((16, 16), (32, 32)), DW)])
    ctx.task((1,), [(b, rm.all(), R)], name="reader")
    ctx.finish()
    d1_to_d0 = [c for c in ctx.instrs(0, "copy") if c.source_memory == 3 and c.dest_memory == 2]
    border = Region.from_box(Box((0, 0), (64, 64))) - Region.from_box(Box((16, 16), (48, 48)))
    assert disjoint_union(d1_to_d0) == border
    validate(ctx)


def test_oddly_shaped_resize_copy_keeps_exactly_the_live_part():
    """instruction_graph_memory_tests.cc "oddly-shaped resize copies generate a single
    region-copy instruction": on one device, write the upper half of a 2-D buffer, then a box
    that overlaps it and extends beyond: two allocations, and the resize copies exactly the
    upper half minus the overwritten box."""
    ctx = GraphContext(1)
    b = ctx.buffer((64, 64))
    ctx.task((1,), [(b, fixedn((0, 0), (32, 64)), DW)])
    ctx.task((1,), [(b, fixedn((16, 16), (32, 32)), DW)])
    ctx.finish()
    assert len(ctx.instrs(0, "alloc")) == 2
    copies = ctx.instrs(0, "copy")
    live = Region.from_box(Box((0, 0), (32, 64))) - Region.from_box(Box((16, 16), (48, 48)))
    assert disjoint_union(copies) == live
    validate(ctx)


def test_host_staged_copies_without_peer_access():
    """instruction_graph_memory_tests.cc "copies are staged through host memory for devices
    that are not peer-copy capable": without peer access, a reversed read on two devices makes
    per device one device-to-host copy after the writer and one host-to-device copy before
    the reader, chained.  (Celerity stages into a dedicated host allocation with linearized
    layout; celeritas stages through the buffer's own host allocation.)"""
    ctx = GraphContext(1, devices=2, peers=False)
    b = ctx.buffer((256,))
    ctx.task((256,), [(b, rm.one_to_one(), DW)], name="writer")

    def reverse(chunk, shape):
        return Subrange((256 - chunk.offset[0] - chunk.range[0],), chunk.range)

    ctx.task((256,), [(b, reverse, R)], name="reader")
    ctx.finish()
    copies = ctx.instrs(0, "copy")
    assert all(HOST_MEMORY in (c.source_memory, c.dest_memory) for c in copies)
    for w in kernels(ctx, "writer"):
        out = one([c for c in copies if c.source_memory == 2 + w.device])
        assert out.dest_memory == HOST_MEMORY and ctx.depends_on(out, w)
        back = one([c for c in copies if c.source_memory == HOST_MEMORY and c.box == out.box])
        assert back.dest_memory == 2 + (1 - w.device) and ctx.depends_on(back, out)
        reader = one([r for r in kernels(ctx, "reader") if r.device == 1 - w.device])
        assert ctx.depends_on(reader, back)
    validate(ctx)


def test_host_staged_copies_keep_oversubscribed_chunks_concurrent():
    """instruction_graph_memory_tests.cc "host-staged copies preserve concurrency between
    multiple readers and writers": 2 devices, oversubscribed x2, reversed read without peer
    access: 4 writers, 4 concurrent device-to-host copies (one per writer chunk), 4 concurrent
    host-to-device copies, 4 readers."""
    ctx = GraphContext(1, devices=2, peers=False)
    b = ctx.buffer((256,))
    ctx.task((256,), [(b, rm.one_to_one(), DW)], oversubscribe=2, name="writer")

    def reverse(chunk, shape):
        return Subrange((256 - chunk.offset[0] - chunk.range[0],), chunk.range)

    ctx.task((256,), [(b, reverse, R)], oversubscribe=2, name="reader")
    ctx.finish()
    assert len(kernels(ctx, "writer")) == 4 and len(kernels(ctx, "reader")) == 4
    d2h = [c for c in ctx.instrs(0, "copy") if c.dest_memory == HOST_MEMORY]
    h2d = [c for c in ctx.instrs(0, "copy") if c.source_memory == HOST_MEMORY]
    assert len(d2h) == 4 and all_concurrent(ctx, d2h)
    assert len(h2d) == 4 and all_concurrent(ctx, h2d)
    assert sorted(c.box.min[0] for c in d2h) == [0, 64, 128, 192]
    validate(ctx)


def test_broadcast_without_peer_access_stages_once_and_fans_out_concurrently():
    """instruction_graph_memory_tests.cc "staging copies to host are deduplicated in case of a
    broadcast pattern": 4 devices without peer access, device 0 writes everything, all read
    everything: one device-to-host copy, then 3 concurrent host-to-device copies, one to each
    other device, each after the staging copy."""
    ctx = GraphContext(1, devices=4, peers=False)
    b = ctx.buffer((256,))
    ctx.task((1,), [(b, rm.all(), DW)], name="writer")
    ctx.task((256,), [(b, rm.all(), R)], name="reader")
    ctx.finish()
    stage = one([c for c in ctx.instrs(0, "copy") if c.dest_memory == HOST_MEMORY])
    fan = [c for c in ctx.instrs(0, "copy") if c.source_memory == HOST_MEMORY]
    assert sorted(c.dest_memory for c in fan) == [3, 4, 5]
    assert all_concurrent(ctx, fan) and all(ctx.depends_on(c, stage) for c in fan)
    assert len(kernels(ctx, "reader")) == 4
    validate(ctx)


def test_host_staging_only_updates_devices_that_are_stale():
    """instruction_graph_memory_tests.cc "host staging only writes to device allocations that
    are not yet up to date": device 0 writes everything; a reader on 2 devices makes one
    host-to-device copy (to device 1); a reader on 4 devices then two more (devices 2 and 3):
    device 1's second read depends on the copy made for its first."""
    ctx = GraphContext(1, devices=4, peers=False)
    b = ctx.buffer((256,))
    ctx.task((1,), [(b, rm.all(), DW)], name="write")
    ctx.task((2,), [(b, rm.all(), R)], name="read 1")
    first = [c for c in ctx.instrs(0, "copy") if c.source_memory == HOST_MEMORY]
    ctx.task((4,), [(b, rm.all(), R)], name="read 2")
    ctx.finish()
    unstage = [c for c in ctx.instrs(0, "copy") if c.source_memory == HOST_MEMORY]
    assert [c.dest_memory for c in first] == [3]
    later = [c for c in unstage if c not in first]
    assert sorted(c.dest_memory for c in later) == [4, 5]
    r2_on_d1 = one([k for k in kernels(ctx, "read 2") if k.device == 1])
    assert ctx.depends_on(r2_on_d1, first[0])
    validate(ctx)


def test_distinct_subranges_in_subsequent_kernels_use_distinct_allocations():
    """instruction_graph_memory_tests.cc "accessing non-overlapping buffer subranges in
    subsequent kernels triggers distinct allocations": two kernels writing disjoint quarters
    (lookahead none) get an allocation each, exactly their box, no copy, and are concurrent."""
    ctx = GraphContext(1)
    b = ctx.buffer((64, 64))
    ctx.task((32, 32), [(b, rm.one_to_one(), DW)], name="1st")
    ctx.task((32, 32), [(b, rm.one_to_one(), DW)], offset=(32, 32), name="2nd")
    ctx.finish()
    first, second = one(kernels(ctx, "1st")), one(kernels(ctx, "2nd"))
    assert len(ctx.instrs(0, "alloc")) == 2 and ctx.instrs(0, "copy") == []
    assert first.accesses[0].allocation != second.accesses[0].allocation
    assert first.accesses[0].allocation_box == first.accesses[0].box
    assert second.accesses[0].allocation_box == second.accesses[0].box
    assert ctx.concurrent(first, second)
    validate(ctx)


# =================================================================================================
# instruction_graph_p2p_tests.cc
# =================================================================================================
@pytest.mark.parametrize("rank", [0, 1])
def test_sends_and_receives_are_split_per_device(rank):
    """instruction_graph_p2p_tests.cc "send and receive instructions are split on multi-device
    systems to allow computation-communication overlap": 2 ranks x 2 devices, a reversed
    read.  Per rank: two concurrent writers and two concurrent sends, one per writer, each
    sending exactly what its writer wrote and announced by one pilot; one split-receive
    whose region is the disjoint union of two concurrent await-receives, one per reader,
    each awaiting exactly what its reader reads, which follows it."""
    ctx = GraphContext(2, devices=2, compile_ranks=[rank])
    b = ctx.buffer((256,), dtype="int32")
    ctx.task((256,), [(b, rm.one_to_one(), DW)], name="writer")

    def reverse(chunk, shape):
        return Subrange((256 - chunk.offset[0] - chunk.range[0],), chunk.range)

    reader_task = ctx.task((256,), [(b, reverse, R)], name="reader")
    ctx.finish()
    transfer = (reader_task.id, b, 0)
    writers = kernels(ctx, "writer", rank)
    assert len(writers) == 2 and all_concurrent(ctx, writers, rank)
    sends = ctx.instrs(rank, "send")
    assert len(sends) == 2 and all_concurrent(ctx, sends, rank)
    assert len(ctx.pilots[rank]) == 2
    for s in sends:
        (w,) = [w for w in writers if ctx.depends_on(s, w, rank)]
        assert s.box == w.accesses[0].box and s.transfer == transfer
        assert one([p for p in ctx.pilots[rank] if p.msg_id == s.msg_id]).box == s.box
    split = one(ctx.instrs(rank, "split_receive"))
    awaits = ctx.instrs(rank, "await_receive")
    assert len(awaits) == 2 and all_concurrent(ctx, awaits, rank)
    assert not awaits[0].region.intersects(awaits[1].region)
    assert awaits[0].region | awaits[1].region == split.region
    readers = kernels(ctx, "reader", rank)
    for a in awaits:
        assert a.transfer == transfer and ctx.depends_on(a, split, rank)
        (r,) = [r for r in readers if ctx.depends_on(r, a, rank)]
        assert a.region == Region.from_box(r.accesses[0].box)
    validate(ctx, rank)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_overlapping_remote_reads_are_awaited_once_per_element(dims):
    """instruction_graph_p2p_tests.cc "overlapping requirements generate split-receives with
    one await per reader-set": rank 1 with 4 devices reads a neighbourhood of data written on
    rank 0: one split-receive of everything; its await-receives are disjoint and cover it;
    every reader depends on several await-receives, which make up exactly what it reads: as
    in Celerity they are cut per set of readers (one per chunk, one per overlap), so no chunk
    waits for data only its neighbour reads."""
    shape = (16,) * dims
    ctx = GraphContext(2, devices=4, compile_ranks=[1])
    b = ctx.buffer(shape, dtype="int32")
    ctx.task((1,), [(b, rm.all(), DW)], name="writer")
    ctx.task(shape, [(b, rm.neighborhood(*([1] * dims)), R)], name="reader")
    ctx.finish()
    split = one(ctx.instrs(1, "split_receive"))
    awaits = ctx.instrs(1, "await_receive")
    covered = Region.empty_region(dims)
    for a in awaits:
        assert not covered.intersects(a.region) and ctx.depends_on(a, split, 1)
        covered = covered | a.region
    assert covered == split.region
    for r in kernels(ctx, "reader", 1):
        got = Region.empty_region(dims)
        mine = [a for a in awaits if ctx.depends_on(r, a, 1)]
        assert len(mine) > 1
        for a in mine:
            got = got | a.region
        read = r.accesses[0].region if r.accesses[0].region is not None else Region.from_box(r.accesses[0].box)
        assert got == read & Region.from_box(Box((0,) * dims, shape))
    validate(ctx, 1)


def test_disconnected_remote_reads_do_not_allocate_their_bounding_box():
    """instruction_graph_p2p_tests.cc "an await-push of disconnected subregions does not
    allocate their bounding-box": rank 1 reads the first and the last element of a 1024 buffer
    written on rank 0, through two accessors: celeritas receives what the reader lacks, and
    must not allocate all 1024 elements for two of them.  Celerity: two 1-element allocations
    with one concurrent receive each, the reader depending on both receives."""
    ctx = GraphContext(2, compile_ranks=[1])
    b = ctx.buffer((1024,))
    ctx.task((1,), [(b, rm.all(), DW)], kind=tg.HOST_COMPUTE, name="writer")
    ctx.task((2,), [(b, fixed(0, 1), R), (b, fixed(1023, 1024), R)], kind=tg.HOST_COMPUTE, name="reader")
    ctx.finish()
    allocs = [a for a in ctx.instrs(1, "alloc") if a.buffer == b]
    assert sum(a.box.area for a in allocs) <= 2, [a.box for a in allocs]
    recvs = ctx.instrs(1, "receive")
    received = Region.empty_region(1)
    for rv in recvs:
        received = received | rv.region
    assert received == Region([Box((0,), (1,)), Box((1023,), (1024,))])
    reader = one(ctx.instrs(1, "host_task", name="reader"))
    assert all(ctx.depends_on(reader, rv, 1) for rv in recvs)
    validate(ctx, 1)
