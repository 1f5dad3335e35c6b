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
