import json
import logging

from celeritas import range_mappers as rm
from scheduler import task_graph as tg
from scheduler.geometry import Box, Region, Subrange

from graph_context import GraphContext
from ig_validator import validate

R, W, RW, DW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE


def fixed(lo, hi):
    return rm.fixed(Subrange((lo,), (hi - lo,)))


def kinds(ctx, rank=0):
    return [i.kind for i in ctx.instructions[rank]]


def test_behaviour_7_empty_kernel():
    ctx = GraphContext(1)
    ctx.task((16,), [])
    ctx.finish()
    ins = ctx.instructions[0]
    assert kinds(ctx) == ["epoch", "device_kernel", "epoch"]
    assert ins[1].deps == [(ins[0].id, "last_epoch")]
    assert [d for d, _ in ins[2].deps] == [ins[1].id]
    validate(ctx)


def test_behaviour_8_one_alloc_for_two_accessors():
    ctx = GraphContext(1)
    b = ctx.buffer((256,))
    ctx.task((1,), [(b, fixed(32, 160), DW), (b, fixed(96, 224), DW)])
    ctx.finish()
    (alloc,) = ctx.instrs(0, "alloc")
    assert alloc.memory == 2 and alloc.box == Box((32,), (224,)) and alloc.size_bytes == 192 * 4
    (free,) = ctx.instrs(0, "free")
    assert free.allocation == alloc.allocation
    validate(ctx)


def test_behaviour_9_two_devices():
    ctx = GraphContext(1, devices=2)
    b = ctx.buffer((256,))
    ctx.task((256,), [(b, rm.one_to_one(), DW)])
    ctx.finish()
    ks = ctx.instrs(0, "device_kernel")
    assert [(k.device, k.box) for k in ks] == [(0, Box((0,), (128,))), (1, Box((128,), (256,)))]
    allocs = ctx.instrs(0, "alloc")
    assert sorted((a.memory, a.box.min, a.box.max) for a in allocs) == [(2, (0,), (128,)), (3, (128,), (256,))]
    assert len(ctx.instrs(0, "free")) == 2
    assert ctx.concurrent(ks[0], ks[1])
    validate(ctx)


def test_behaviour_10_resize_copies_only_live_data():
    ctx = GraphContext(1, lookahead="none")
    b = ctx.buffer((256,))
    ctx.task((128,), [(b, rm.one_to_one(), DW)])
    ctx.task((192,), [(b, rm.one_to_one(), DW)], offset=(64,))
    ctx.finish()
    allocs = ctx.instrs(0, "alloc")
    assert [(a.box.min, a.box.max) for a in allocs] == [((0,), (128,)), ((0,), (256,))]
    (copy,) = ctx.instrs(0, "copy")
    assert copy.box == Box((0,), (64,)) and copy.source == allocs[0].allocation and copy.dest == allocs[1].allocation
    validate(ctx)


def test_behaviour_10_with_lookahead_auto_allocates_once():
    ctx = GraphContext(1, lookahead="auto")
    b = ctx.buffer((256,))
    ctx.task((128,), [(b, rm.one_to_one(), DW)])
    ctx.task((192,), [(b, rm.one_to_one(), DW)], offset=(64,))
    ctx.finish()
    (alloc,) = ctx.instrs(0, "alloc")
    assert alloc.box == Box((0,), (256,))
    assert ctx.instrs(0, "copy") == []
    validate(ctx)


def test_behaviour_11_send_and_receive_are_concurrent():
    ctx = GraphContext(2)
    b = ctx.buffer((256,))
    ctx.task((256,), [(b, rm.one_to_one(), DW)])
    ctx.task((256,), [(b, rm.all(), R)])
    ctx.finish()
    for r in range(2):
        (send,) = ctx.instrs(r, "send")
        (recv,) = ctx.instrs(r, "receive")
        assert send.box == Box((128 * r,), (128 * (r + 1),)) and send.to == 1 - r
        assert recv.region == Region.from_box(Box((128 * (1 - r),), (128 * (2 - r),)))
        (pilot,) = ctx.pilots[r]
        assert pilot.msg_id == send.msg_id and pilot.to == 1 - r and pilot.box == send.box
        assert ctx.concurrent(send, recv, r)
        validate(ctx, r)


def test_reversed_reader_on_two_devices_uses_split_receive():
    ctx = GraphContext(2, devices=2)
    b = ctx.buffer((256,))
    ctx.task((256,), [(b, rm.one_to_one(), DW)])

    def reversed_mapper(chunk, shape):
        lo = 256 - (chunk.offset[0] + chunk.range[0])
        return Subrange((lo,), chunk.range)

    ctx.task((256,), [(b, reversed_mapper, R)])
    ctx.finish()
    # rank 1 (128..256) reads 0..128, i.e. all from rank 0, split across its two devices
    (split,) = ctx.instrs(1, "split_receive")
    awaits = ctx.instrs(1, "await_receive")
    assert len(awaits) == 2
    assert not awaits[0].region.intersects(awaits[1].region)
    assert awaits[0].region | awaits[1].region == split.region == Region.from_box(Box((0,), (128,)))
    assert ctx.concurrent(awaits[0], awaits[1], 1)
    for a in awaits:
        assert ctx.depends_on(a, split, 1)
    validate(ctx, 1)


def test_local_reduction_over_devices():
    ctx = GraphContext(1, devices=3)
    b = ctx.buffer((1,))
    red = ctx.reduction(b)
    ctx.task((30,), [], reductions=[red])
    ctx.task((1,), [(b, rm.all(), R)], kind=tg.HOST_COMPUTE)
    ctx.finish()
    ks = ctx.instrs(0, "device_kernel")
    assert len(ks) == 3
    gathers = [c for c in ctx.instrs(0, "copy") if c.buffer is None]
    assert len(gathers) == 3
    assert len(ctx.instrs(0, "reduce")) == 1
    assert ctx.instrs(0, "fill_identity") == []
    validate(ctx)


def test_global_reduction_over_ranks():
    n = 3
    ctx = GraphContext(n)
    b = ctx.buffer((1,))
    red = ctx.reduction(b)
    ctx.task((30,), [], reductions=[red])
    ctx.task((n,), [(b, rm.all(), R)], kind=tg.HOST_COMPUTE)   # read on every rank
    ctx.finish()
    for r in range(n):
        (fill,) = ctx.instrs(r, "fill_identity")
        assert fill.count == n
        (gr,) = ctx.instrs(r, "gather_receive")
        assert gr.chunk_bytes == 4
        assert len(ctx.instrs(r, "send")) == n - 1
        assert len(ctx.instrs(r, "reduce")) == 2   # local over devices, then global
        validate(ctx, r)


def test_reduction_read_on_one_rank_is_gathered_there_only():
    n = 3
    ctx = GraphContext(n)
    b = ctx.buffer((1,))
    red = ctx.reduction(b)
    ctx.task((30,), [], reductions=[red])
    ctx.task((1,), [(b, rm.all(), R)], kind=tg.HOST_COMPUTE)   # only rank 0 has a chunk
    ctx.finish()
    (gr,) = ctx.instrs(0, "gather_receive")
    assert len(ctx.instrs(0, "reduce")) == 2 and ctx.instrs(0, "send") == []
    for r in (1, 2):
        assert ctx.instrs(r, "gather_receive") == [] and ctx.instrs(r, "fill_identity") == []
        (send,) = ctx.instrs(r, "send")
        assert send.to == 0 and send.transfer[2] == red.id
        assert len(ctx.instrs(r, "reduce")) == 1   # the local one only
    for r in range(n):
        validate(ctx, r)


def test_copies_are_staged_through_host_without_peer_access():
    ctx = GraphContext(1, devices=2, peers=False)
    b = ctx.buffer((64,))
    ctx.task((64,), [(b, rm.one_to_one(), DW)])
    ctx.task((64,), [(b, rm.all(), R)])
    ctx.finish()
    copies = [c for c in ctx.instrs(0, "copy") if c.source_memory != c.dest_memory]
    pairs = sorted((c.source_memory, c.dest_memory) for c in copies)
    assert (2, 3) not in pairs and (3, 2) not in pairs
    assert pairs == [(1, 2), (1, 3), (2, 1), (3, 1)]
    validate(ctx)


def test_peer_copies_are_direct():
    ctx = GraphContext(1, devices=2, peers=True)
    b = ctx.buffer((64,))
    ctx.task((64,), [(b, rm.one_to_one(), DW)])
    ctx.task((64,), [(b, rm.all(), R)])
    ctx.finish()
    pairs = sorted((c.source_memory, c.dest_memory) for c in ctx.instrs(0, "copy")
                   if c.source_memory != c.dest_memory)
    assert pairs == [(2, 3), (3, 2)]
    validate(ctx)


def test_broadcast_is_staged_once():
    ctx = GraphContext(1, devices=3, peers=False)
    b = ctx.buffer((30,))
    ctx.task((1,), [(b, rm.all(), DW)])   # device 0 writes everything
    ctx.task((30,), [(b, rm.all(), R)])    # every device reads everything
    ctx.finish()
    to_host = [c for c in ctx.instrs(0, "copy") if c.dest_memory == 1]
    assert len(to_host) == 1
    validate(ctx)


def test_host_initialized_buffer_copied_from_user_memory_and_fenced_back():
    ctx = GraphContext(1)
    b = ctx.buffer((16,), host_init=True)
    ctx.task((16,), [(b, rm.one_to_one(), RW)])
    ctx.fence(b)
    ctx.finish()
    copies = ctx.instrs(0, "copy")
    assert [(c.source_memory, c.dest_memory) for c in copies] == [(0, 2), (2, 0)]
    (fence,) = ctx.instrs(0, "fence")
    assert fence.allocation == copies[1].dest
    validate(ctx)


def test_wave_sim_on_four_devices_with_auto_lookahead():
    ctx = GraphContext(1, devices=4, lookahead="auto")
    n = 64
    u = ctx.buffer((n, n), host_init=True)
    up = ctx.buffer((n, n), host_init=True)
    a, c = up, u
    for _ in range(12):
        ctx.task((n, n), [(a, rm.one_to_one(), RW), (c, rm.neighborhood(1, 1, shape="along_axes"), R)])
        a, c = c, a
    ctx.finish()
    allocs = ctx.instrs(0, "alloc")
    per_dev = {}
    for al in allocs:
        per_dev.setdefault(al.memory, []).append(al)
    assert sorted(per_dev) == [2, 3, 4, 5]
    assert all(len(v) == 2 for v in per_dev.values())
    resize = [c for c in ctx.instrs(0, "copy") if c.source_memory == c.dest_memory]
    assert resize == []
    validate(ctx)


def test_growing_writes_without_lookahead_allocate_every_time(caplog):
    ctx = GraphContext(1, lookahead="none")
    b = ctx.buffer((20,))
    with caplog.at_level(logging.WARNING, logger="celeritas"):
        for i in range(20):
            ctx.task((1,), [(b, fixed(i, i + 1), DW)])
        ctx.finish()
    assert len(ctx.instrs(0, "alloc")) == 20
    assert any("allocated" in r.message and "lookahead" in r.message for r in caplog.records)
    validate(ctx)


def test_growing_writes_with_auto_lookahead_allocate_once():
    ctx = GraphContext(1, lookahead="auto")
    b = ctx.buffer((20,))
    for i in range(20):
        ctx.task((1,), [(b, fixed(i, i + 1), DW)])
    ctx.finish()
    assert len(ctx.instrs(0, "alloc")) == 1
    validate(ctx)


def test_records_are_json():
    ctx = GraphContext(2, devices=2)
    b = ctx.buffer((64,))
    ctx.task((64,), [(b, rm.one_to_one(), DW)])
    ctx.task((64,), [(b, rm.all(), R)])
    ctx.finish()
    recs = ctx.iggs[0].recorder.instructions
    json.dumps(recs)
    json.dumps(ctx.iggs[0].recorder.pilots)
    assert {r["kind"] for r in recs} >= {"alloc", "free", "device_kernel", "send", "receive", "epoch", "copy"}
    send = next(r for r in recs if r["kind"] == "send")
    assert set(send) >= {"id", "kind", "deps", "priority", "to", "msg_id", "transfer", "box"}
    kern = next(r for r in recs if r["kind"] == "device_kernel")
    assert set(kern) >= {"device", "task", "box", "accesses"}


# ---- random programs through the validator -------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from test_command_graph import _mapper, programs  # noqa: E402


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(1, 4), st.integers(1, 3), st.sampled_from(["none", "auto", "infinite"]),
       st.sampled_from([1, 3]), st.booleans(), st.booleans())
def test_random_programs_produce_race_free_instruction_graphs(program, ranks, devices, lookahead, oversub,
                                                              peers, with_reduction):
    sizes, tasks = program
    ctx = GraphContext(ranks, devices=devices, lookahead=lookahead, diagnostics="off", peers=peers,
                       horizon_step=2)
    bids = [ctx.buffer((s,), host_init=(i % 2 == 0)) for i, s in enumerate(sizes)]
    for k, (rng, accs) in enumerate(tasks):
        ctx.task((rng,), [(bids[b], _mapper(m, lohi), mode) for b, m, lohi, mode in accs], oversubscribe=oversub)
        if k == 1:
            ctx.fence(bids[0])
    if with_reduction:
        rb = ctx.buffer((1,), host_init=True)
        ctx.task((7,), [], reductions=[ctx.reduction(rb, include_current=True)], oversubscribe=oversub)
        ctx.task((1,), [(rb, rm.all(), R)], kind=tg.HOST_COMPUTE)
    ctx.finish()
    # every send is announced by exactly one pilot with the same message id
    for r in range(ranks):
        validate(ctx, r)
        sends = ctx.instrs(r, "send")
        assert sorted(s.msg_id for s in sends) == sorted(p.msg_id for p in ctx.pilots[r] if not p.box.empty)
        assert len({p.msg_id for p in ctx.pilots[r]}) == len(ctx.pilots[r])


# ---- a reduction by one kernel on one rank reduces in place ------------------------------------
def _reduction_chain(include_second: bool, host_write_between: bool):
    ctx = GraphContext(1)
    b = ctx.buffer((1,), host_init=True)
    ctx.task((64,), [], reductions=[ctx.reduction(b)], name="first")          # initialize_to_identity
    if host_write_between:
        ctx.task((1,), [(b, rm.one_to_one(), DW)], kind=tg.HOST_COMPUTE, name="host")
    ctx.task((64,), [], reductions=[ctx.reduction(b, include_current=include_second)], name="second")
    ctx.task((64,), [(b, rm.all(), R)], name="reader")
    ctx.finish()
    return ctx


def test_one_kernel_reduces_into_the_targets_device_allocation_and_its_reader_follows_it():
    """The second reduction folds in the first's result, which is already on the device: both
    kernels reduce in place (no scratch, gather copy or reduce), each depending on the one
    before it, and the device reader needs no copy."""
    ctx = _reduction_chain(include_second=True, host_write_between=False)
    first, second, reader = (ctx.instrs(0, "device_kernel", name=n)[0] for n in ("first", "second", "reader"))
    assert ctx.instrs(0, "reduce") == [] and ctx.instrs(0, "copy") == []
    assert [r.include_current for r in first.reductions] == [False]
    assert [r.include_current for r in second.reductions] == [True]
    assert first.reductions[0].allocation == second.reductions[0].allocation == reader.accesses[0].allocation
    assert ctx.depends_on(second, first) and ctx.depends_on(reader, second)
    validate(ctx)


def test_a_current_value_on_the_host_is_folded_in_after_the_kernel_not_copied_before_it():
    """Where the current value is on the host (a host task wrote it), reducing in place would
    make the kernel wait for a copy of it: the kernel computes its partial alongside the host
    task instead, and a reduce folds both in afterwards."""
    ctx = _reduction_chain(include_second=True, host_write_between=True)
    host, second = ctx.instrs(0, "host_task", name="host")[0], ctx.instrs(0, "device_kernel", name="second")[0]
    assert ctx.concurrent(host, second)
    rd = [r for r in ctx.instrs(0, "reduce") if r.include_dest]
    assert len(rd) == 1 and ctx.depends_on(rd[0], host) and ctx.depends_on(rd[0], second)
    validate(ctx)


# ---- allocation groups: accessors that do not touch get an allocation each -------------------
def _by_lo(boxes):
    return sorted(boxes, key=lambda x: (x.min, x.max))


def _allocs_of(ctx, bid, rank=0, memory=None):
    return [a for a in ctx.instrs(rank, "alloc") if a.buffer == bid and (memory is None or a.memory == memory)]


def test_disconnected_accessors_get_an_allocation_each():
    """Two accessors at both ends of a buffer: two device allocations of one element each, not
    the 1024 between them; each accessor's allocation holds its box, the copies in fill them."""
    ctx = GraphContext(1)
    b = ctx.buffer((1024,), host_init=True)
    ctx.task((1,), [(b, fixed(0, 1), R), (b, fixed(1023, 1024), R)], name="ends")
    ctx.finish()
    allocs = _allocs_of(ctx, b, memory=2)
    assert _by_lo(a.box for a in allocs) == [Box((0,), (1,)), Box((1023,), (1024,))]
    (k,) = ctx.instrs(0, "device_kernel", name="ends")
    by_id = {a.allocation: a for a in allocs}
    assert [(acc.allocation_box, acc.box) for acc in k.accesses] == \
        [(by_id[acc.allocation].box, by_id[acc.allocation].box) for acc in k.accesses]
    assert {acc.allocation for acc in k.accesses} == set(by_id)
    copies = [c for c in ctx.instrs(0, "copy") if c.dest_memory == 2]
    assert _by_lo(c.box for c in copies) == [Box((0,), (1,)), Box((1023,), (1024,))]
    assert all(ctx.depends_on(k, c) for c in copies)
    validate(ctx)


def test_touching_accessors_share_one_allocation():
    """Accessors whose boxes share a face (or overlap) are allocated together, as one box;
    boxes that meet only at a corner are not connected and get an allocation each."""
    ctx = GraphContext(1)
    b = ctx.buffer((64, 64), host_init=True)
    ctx.task((1,), [(b, rm.fixed(Subrange((0, 0), (8, 8))), R), (b, rm.fixed(Subrange((8, 4), (8, 8))), R),
                    (b, rm.fixed(Subrange((40, 40), (4, 4))), R), (b, rm.fixed(Subrange((44, 44), (4, 4))), R)],
             name="four")
    ctx.finish()
    assert _by_lo(a.box for a in _allocs_of(ctx, b, memory=2)) == \
        [Box((0, 0), (16, 12)), Box((40, 40), (44, 44)), Box((44, 44), (48, 48))]
    validate(ctx)


def test_one_accessor_is_one_allocation_even_over_a_disconnected_region():
    """An accessor is one contiguous view: its region's bounding box is allocated whole, even
    where the region itself is two boxes apart (a user mapper's)."""
    ctx = GraphContext(1)
    b = ctx.buffer((100,), host_init=True)

    def ends(chunk, shape):
        return Region([Box((0,), (2,)), Box((98,), (100,))])
    ctx.task((1,), [(b, ends, R)], name="one")
    ctx.finish()
    assert [a.box for a in _allocs_of(ctx, b, memory=2)] == [Box((0,), (100,))]
    # (only what the accessor reads is copied in)
    assert _by_lo(c.box for c in ctx.instrs(0, "copy") if c.dest_memory == 2) == \
        [Box((0,), (2,)), Box((98,), (100,))]
    validate(ctx)


def test_disconnected_writes_are_tracked_per_allocation():
    """A kernel writing both ends through two accessors, then a reader of everything: the reader
    depends on the writer through both allocations, and the resize into one allocation copies
    both written ends (the dependency tracking of each group's part)."""
    ctx = GraphContext(1)
    b = ctx.buffer((32,), host_init=True)
    ctx.task((1,), [(b, fixed(0, 4), DW), (b, fixed(28, 32), DW)], name="ends")
    ctx.task((32,), [(b, rm.one_to_one(), R)], name="all")
    ctx.finish()
    (w,) = ctx.instrs(0, "device_kernel", name="ends")
    (r,) = ctx.instrs(0, "device_kernel", name="all")
    resize = [c for c in ctx.instrs(0, "copy") if c.source_memory == 2 and c.dest_memory == 2]
    assert _by_lo(c.box for c in resize) == [Box((0,), (4,)), Box((28,), (32,))]
    assert all(ctx.depends_on(c, w) and ctx.depends_on(r, c) for c in resize)
    validate(ctx)


def test_disconnected_halos_are_received_apart():
    """A middle rank's halo rows (above and below its chunk) arrive as two receives into two
    one-row host allocations, not one receive into the bounding box of both (which is the
    rank's whole chunk plus the halos) with a split receive and awaits."""
    n = 24
    ctx = GraphContext(3, compile_ranks=[1])
    a, c = ctx.buffer((n, n), host_init=True), ctx.buffer((n, n))
    ctx.task((n, n), [(a, rm.one_to_one(), DW)], name="init")
    ctx.task((n, n), [(a, rm.neighborhood(1, 1, shape="along_axes"), R), (c, rm.one_to_one(), DW)], name="stencil")
    ctx.finish()
    recvs = ctx.instrs(1, "receive")
    assert _by_lo(rv.region.bounding_box for rv in recvs) == [Box((7, 0), (8, n)), Box((16, 0), (17, n))]
    assert not ctx.instrs(1, "split_receive") and not ctx.instrs(1, "await_receive")
    into = {h.allocation: h for h in _allocs_of(ctx, a, rank=1, memory=1)}
    assert len({rv.dest for rv in recvs}) == 2
    assert _by_lo(into[rv.dest].box for rv in recvs) == [Box((7, 0), (8, n)), Box((16, 0), (17, n))]
    (k,) = ctx.instrs(1, "device_kernel", name="stencil")
    assert all(ctx.depends_on(k, rv, 1) for rv in recvs)
    validate(ctx, 1)


def test_receive_groups_are_allocated_before_any_is_received():
    """A fence on a middle rank receives both sides of a stale host allocation that reaches into
    each: the first side's allocation merges the stale one, the second side's merges that again.
    Both are allocated before either receive is written, so each receive lands in the allocation
    the fence then reads (a resize copies only data already there, so a receive written into the
    first, merged-away allocation would have been lost)."""
    n = 30
    ctx = GraphContext(3, compile_ranks=[1])
    b = ctx.buffer((n,), host_init=True)
    H = tg.HOST_COMPUTE
    ctx.task((n,), [(b, rm.one_to_one(), DW)], kind=H, name="first")
    ctx.task((n,), [(b, rm.neighborhood(4), R)], kind=H, name="halo")     # host [6, 24) on rank 1
    ctx.task((n,), [(b, rm.one_to_one(), DW)], kind=H, name="again")      # [6, 10) and [20, 24) stale
    ctx.fence(b)
    ctx.finish()
    (fence,) = ctx.instrs(1, "fence")
    copies = [c for c in ctx.instrs(1, "copy") if c.dest == fence.allocation]
    recvs = [rv for rv in ctx.instrs(1, "receive") if rv.transfer[0] == fence.task]
    assert _by_lo(rv.region.bounding_box for rv in recvs) == [Box((0,), (10,)), Box((20,), (30,))]
    sources = {c.source for c in copies if any(rv.region.intersects(Region.from_box(c.box)) for rv in recvs)}
    assert {rv.dest for rv in recvs} == sources and len(sources) == 1
    assert all(ctx.depends_on(c, rv, 1) for c in copies for rv in recvs if rv.region.intersects(Region.from_box(c.box)))
    validate(ctx, 1)


def test_validator_reports_lost_data():
    """The validator's lost-data check can fail: a kernel reading a device allocation whose copy
    in from the user's data is emptied reads elements nothing wrote there, which the rank had."""
    import pytest
    ctx = GraphContext(1)
    b = ctx.buffer((16,), host_init=True)
    ctx.task((16,), [(b, rm.one_to_one(), R)], name="reader")
    ctx.finish()
    validate(ctx)
    (cp,) = ctx.instrs(0, "copy")
    cp.box = Box((0,), (0,))
    with pytest.raises(AssertionError, match="lost data"):
        validate(ctx)


def test_validator_lets_chunks_read_what_their_task_writes_elsewhere():
    """A task whose chunks write their element and read the whole (never written) buffer: one
    device's chunk reads what the other's writes, which is the value before the task (none),
    not lost data (hypothesis found this shape for the lost-data check)."""
    ctx = GraphContext(1, devices=2)
    b = ctx.buffer((4,))
    ctx.task((2,), [(b, rm.one_to_one(), W), (b, rm.all(), R)])
    ctx.finish()
    validate(ctx)
