import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celeritas import range_mappers as rm
from scheduler import command_graph as cg
from scheduler import task_graph as tg
from scheduler.errors import DiagnosticError
from scheduler.geometry import Box, Region, Subrange

from graph_context import GraphContext

R, W, RW, DW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE


def test_behaviour_5_one_push_one_await_push_per_rank():
    ctx = GraphContext(2, compile_ranks=[])
    b = ctx.buffer((256,))
    ctx.task((256,), [(b, rm.one_to_one(), DW)])
    reader = ctx.task((256,), [(b, rm.all(), R)])
    for r in range(2):
        pushes = ctx.cmds(r, cg.PUSH)
        awaits = ctx.cmds(r, cg.AWAIT_PUSH)
        assert len(pushes) == 1 and len(awaits) == 1
        mine = Box((128 * r,), (128 * (r + 1),))
        other = Box((128 * (1 - r),), (128 * (2 - r),))
        assert pushes[0].targets == [(1 - r, Region.from_box(mine))]
        assert awaits[0].region == Region.from_box(other)
        assert pushes[0].transfer == (reader.id, b, 0) == awaits[0].transfer
        # the execution command of the reader truly depends on the await push
        ex = ctx.cmds(r, cg.EXECUTION, task=reader.id)[0]
        assert ex.deps[awaits[0].id][0] == "true"


def test_behaviour_6_split_sizes():
    ctx = GraphContext(4, compile_ranks=[])
    t = ctx.task((255,), [])
    sizes = [ctx.cmds(r, cg.EXECUTION, task=t.id)[0].box.range[0] for r in range(4)]
    assert sizes == [64, 64, 64, 63]
    t2 = ctx.task((128, 128), [], split="2d")
    boxes = [ctx.cmds(r, cg.EXECUTION, task=t2.id)[0].box for r in range(4)]
    assert all(b.range == (64, 64) for b in boxes)
    assert Region(boxes) == Region.from_box(Box((0, 0), (128, 128)))
    ctx3 = GraphContext(3, compile_ranks=[])
    t3 = ctx3.task((2,), [])
    assert [len(ctx3.cmds(r, cg.EXECUTION, task=t3.id)) for r in range(3)] == [1, 1, 0]


def test_split_2d_stencil_has_no_diagonal_pushes():
    ctx = GraphContext(4, compile_ranks=[])
    u = ctx.buffer((64, 64), host_init=True)
    v = ctx.buffer((64, 64), host_init=True)
    for _ in range(3):
        ctx.task((64, 64), [(u, rm.neighborhood(1, 1, shape="along_axes"), R), (v, rm.one_to_one(), DW)], split="2d")
        ctx.task((64, 64), [(v, rm.neighborhood(1, 1, shape="along_axes"), R), (u, rm.one_to_one(), DW)], split="2d")
    # 2x2 grid: rank 0 (0,0), 1 (0,1), 2 (1,0), 3 (1,1); diagonals are 0<->3 and 1<->2
    diagonal = {(0, 3), (3, 0), (1, 2), (2, 1)}
    n_push = 0
    for r in range(4):
        for p in ctx.cmds(r, cg.PUSH):
            for tgt, reg in p.targets:
                n_push += 1
                assert (r, tgt) not in diagonal, f"rank {r} pushes {reg} to diagonal neighbour {tgt}"
                assert reg.area == 32   # one halo row/column of 32 elements
    assert n_push > 0


def test_no_push_of_replicated_data():
    ctx = GraphContext(2, compile_ranks=[])
    b = ctx.buffer((64,))
    ctx.task((64,), [(b, rm.one_to_one(), DW)])
    ctx.task((64,), [(b, rm.all(), R)])
    ctx.task((64,), [(b, rm.all(), R)])   # both ranks already hold everything
    for r in range(2):
        assert len(ctx.cmds(r, cg.PUSH)) == 1
        assert len(ctx.cmds(r, cg.AWAIT_PUSH)) == 1


def test_reduction_resolved_lazily_at_next_read():
    ctx = GraphContext(3, compile_ranks=[])
    b = ctx.buffer((1,))
    red = ctx.reduction(b)
    t = ctx.task((10,), [], reductions=[red])
    for r in range(3):
        assert ctx.cmds(r, cg.REDUCTION) == []
    # a 3-item reader: every rank consumes, so every rank gathers and reduces
    reader = ctx.task((3,), [(b, rm.all(), R)])
    for r in range(3):
        (rc,) = ctx.cmds(r, cg.REDUCTION)
        assert rc.reduction.id == red.id and rc.buffer == b
        (push,) = ctx.cmds(r, cg.PUSH)
        assert sorted(t for t, _ in push.targets) == [x for x in range(3) if x != r]
        assert push.transfer == (reader.id, b, red.id)
        (aw,) = ctx.cmds(r, cg.AWAIT_PUSH)
        assert rc.deps[aw.id][0] == "true"
    # a second reader does not reduce again, and nothing is transferred: every rank holds it
    ctx.task((3,), [(b, rm.all(), R)])
    assert all(len(ctx.cmds(r, cg.REDUCTION)) == 1 for r in range(3))
    assert all(len(ctx.cmds(r, cg.PUSH)) == 1 and len(ctx.cmds(r, cg.AWAIT_PUSH)) == 1 for r in range(3))


def test_reduction_consumed_on_one_rank_is_reduced_there_only():
    """Only the consumer gathers and reduces; the others send their partial once."""
    ctx = GraphContext(4, compile_ranks=[])
    b = ctx.buffer((1,))
    data = ctx.buffer((64,), host_init=True)
    red = ctx.reduction(b)
    ctx.task((64,), [(data, rm.one_to_one(), R)], reductions=[red])
    reader = ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
    assert len(ctx.cmds(0, cg.REDUCTION)) == 1 and len(ctx.cmds(0, cg.AWAIT_PUSH)) == 1
    assert ctx.cmds(0, cg.PUSH) == []
    for r in (1, 2, 3):
        assert ctx.cmds(r, cg.REDUCTION) == [] and ctx.cmds(r, cg.AWAIT_PUSH) == []
        (push,) = ctx.cmds(r, cg.PUSH)
        assert [t for t, _ in push.targets] == [0] and push.transfer == (reader.id, b, red.id)
    # a later reader on every rank gets the result from rank 0, with ordinary pushes
    later = ctx.task((4,), [(b, rm.all(), R)])
    pushes0 = [c for c in ctx.cmds(0, cg.PUSH) if c.task.id == later.id]
    assert len(pushes0) == 1 and sorted(t for t, _ in pushes0[0].targets) == [1, 2, 3]
    assert pushes0[0].transfer == (later.id, b, 0)
    for r in (1, 2, 3):
        (aw,) = [c for c in ctx.cmds(r, cg.AWAIT_PUSH) if c.task.id == later.id]
        assert aw.transfer == (later.id, b, 0)
        assert [c for c in ctx.cmds(r, cg.PUSH) if c.task.id == later.id] == []
        assert ctx.cmds(r, cg.REDUCTION) == []


def test_reduction_including_a_value_another_rank_wrote_receives_it_first():
    """The first chunk folds in the current value: it must be pushed there from its writer."""
    ctx = GraphContext(2, compile_ranks=[0, 1])
    b = ctx.buffer((1,))

    def to_second_chunk(chunk, shape):   # the element belongs to the chunk holding index 1
        holds = chunk.offset[0] <= 1 < chunk.offset[0] + chunk.range[0]
        return Subrange((0,), (1 if holds else 0,))

    writer = ctx.task((2,), [(b, to_second_chunk, DW)])
    assert [c.box for c in ctx.cmds(1, cg.EXECUTION)][0].contains((1,))
    red = ctx.reduction(b, include_current=True)
    t = ctx.task((1,), [], reductions=[red])
    (push,) = [c for c in ctx.cmds(1, cg.PUSH) if c.task.id == t.id]
    assert push.targets[0][0] == 0 and push.transfer == (t.id, b, 0)
    (aw,) = [c for c in ctx.cmds(0, cg.AWAIT_PUSH) if c.task.id == t.id]
    (ex,) = [c for c in ctx.cmds(0, cg.EXECUTION) if c.task.id == t.id]
    assert ex.deps[aw.id][0] == "true"
    # rank 0's reduce instruction reads what the receive wrote
    recv = ctx.instrs(0, "receive")
    (reduce_,) = ctx.instrs(0, "reduce")
    assert reduce_.include_dest
    assert ctx.depends_on(reduce_, recv[-1], rank=0)


def test_overlapping_writes_diagnostic():
    ctx = GraphContext(2, compile_ranks=[], diagnostics="error")
    b = ctx.buffer((16,))
    with pytest.raises(DiagnosticError, match="overlapping writes"):
        ctx.task((16,), [(b, rm.all(), DW)], name="everyone_writes_all")


def test_master_node_task_runs_on_rank_0_only():
    ctx = GraphContext(3, compile_ranks=[])
    b = ctx.buffer((8,), host_init=True)
    t = ctx.task((8,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
    assert [len(ctx.cmds(r, cg.EXECUTION, task=t.id)) for r in range(3)] == [1, 0, 0]


def test_horizon_commands_collapse_front():
    ctx = GraphContext(2, compile_ranks=[], horizon_step=1)
    b = ctx.buffer((8,), host_init=True)
    for _ in range(4):
        ctx.task((8,), [(b, rm.one_to_one(), RW)])
    for r in range(2):
        hs = ctx.cmds(r, cg.HORIZON)
        assert len(hs) >= 3
        for h in hs:
            assert all(o == tg.ORIGIN_EXECUTION_FRONT for _k, o in h.deps.values())


# ---- property test: push/await-push consistency on random programs -------------------

MAPPERS_1D = ["one_to_one", "all", "fixed", "neighborhood"]
MODES = [R, W, RW, DW]


@st.composite
def programs(draw):
    n_buffers = draw(st.integers(1, 3))
    sizes = [draw(st.integers(4, 40)) for _ in range(n_buffers)]
    tasks = []
    for _ in range(draw(st.integers(1, 10))):
        rng = draw(st.integers(1, 40))
        accs = []
        for _a in range(draw(st.integers(1, 3))):
            b = draw(st.integers(0, n_buffers - 1))
            m = draw(st.sampled_from(MAPPERS_1D))
            lo = draw(st.integers(0, sizes[b] - 1))
            hi = draw(st.integers(lo + 1, sizes[b]))
            mode = draw(st.sampled_from(MODES))
            if mode != R and m in ("all", "fixed", "neighborhood"):
                mode = R   # overlapping writes between chunks are a user error
            accs.append((b, m, (lo, hi), mode))
        tasks.append((rng, accs))
    return sizes, tasks


def _mapper(name, lohi):
    if name == "one_to_one":
        return rm.one_to_one()
    if name == "all":
        return rm.all()
    if name == "fixed":
        return rm.fixed(Subrange((lohi[0],), (lohi[1] - lohi[0],)))
    return rm.neighborhood(2)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(1, 4))
def test_pushes_match_await_pushes(program, num_ranks):
    sizes, tasks = program
    ctx = GraphContext(num_ranks, compile_ranks=[], diagnostics="off")
    bids = [ctx.buffer((s,), host_init=(i % 2 == 0)) for i, s in enumerate(sizes)]
    for rng, accs in tasks:
        ctx.task((rng,), [(bids[b], _mapper(m, lohi), mode) for b, m, lohi, mode in accs])
    # per (transfer, receiver): the union of pushes equals the await push, disjointly
    received: dict = {}
    for r in range(num_ranks):
        for p in ctx.cmds(r, cg.PUSH):
            assert len({t for t, _ in p.targets}) == len(p.targets)
            for tgt, reg in p.targets:
                assert tgt != r
                key = (p.transfer, tgt)
                prev = received.get(key, Region.empty_region(1))
                assert not prev.intersects(reg), "a region is pushed twice for one transfer"
                received[key] = prev | reg
    awaited = {}
    for r in range(num_ranks):
        per_buffer_task = set()
        for a in ctx.cmds(r, cg.AWAIT_PUSH):
            assert (a.transfer) not in per_buffer_task, "two await-pushes for one buffer and task"
            per_buffer_task.add(a.transfer)
            awaited[(a.transfer, r)] = a.region
    assert set(received) == set(awaited)
    for key, reg in awaited.items():
        assert received[key] == reg
    # no region is pushed twice to a rank without a write in between: simulate holders
    _check_no_redundant_pushes(ctx, num_ranks, bids, sizes)


def _check_no_redundant_pushes(ctx, num_ranks, bids, sizes):
    """Replay the commands: a rank never receives data it already holds in its newest version."""
    # holders[b] : per element, set of ranks holding the newest version
    holders = {b: [set(range(num_ranks)) for _ in range(s)] for b, s in zip(bids, sizes)}
    tasks = sorted(ctx.tasks().values(), key=lambda t: t.id)
    by_task: dict = {}
    for r in range(num_ranks):
        for c in ctx.commands[r]:
            by_task.setdefault(c.task.id, []).append((r, c))
    for t in tasks:
        cmds = by_task.get(t.id, [])
        for r, c in cmds:
            if c.kind == cg.PUSH:
                for tgt, reg in c.targets:
                    for box in reg:
                        for i in range(box.min[0], box.max[0]):
                            assert tgt not in holders[c.transfer[1]][i], \
                                f"element {i} of B{c.transfer[1]} pushed to rank {tgt}, which holds it"
        for r, c in cmds:
            if c.kind == cg.PUSH:
                for tgt, reg in c.targets:
                    for box in reg:
                        for i in range(box.min[0], box.max[0]):
                            holders[c.transfer[1]][i].add(tgt)
        for r, c in cmds:
            if c.kind == cg.EXECUTION:
                for a in t.accesses:
                    if a.mode in tg.PRODUCER_MODES:
                        reg = a.mapper(c.box, ctx.tm.buffers[a.buffer].shape)
                        for box in reg:
                            for i in range(box.min[0], box.max[0]):
                                holders[a.buffer][i] = {r}
