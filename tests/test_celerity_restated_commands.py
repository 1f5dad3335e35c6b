"""Command-graph behaviours restated from the C++ Celerity runtime's tests
(test/command_graph_reduction_tests.cc, command_graph_transfer_tests.cc,
graph_compaction_tests.cc, command_graph_general_tests.cc) that celeritas had no test for.

Each docstring names the Celerity TEST_CASE it restates and the property pinned; where
celeritas legitimately differs, the docstring says how and the test pins celeritas'
behaviour.  Celerity's test-only "chunk multiplier" (several execution commands per rank)
has no celeritas counterpart: celeritas makes one execution command per rank and splits it
further at the instruction level, so those sections use one chunk per rank.
"""
import pytest

from celeritas import range_mappers as rm
from scheduler import command_graph as cg
from scheduler import task_graph as tg
from scheduler.errors import DiagnosticError
from scheduler.geometry import Box, Region, Subrange

from graph_context import GraphContext

R, W, RW, DW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE


def ctx_n(n, **kw) -> GraphContext:
    return GraphContext(n, compile_ranks=[], **kw)


def fixed(lo, hi):
    return rm.fixed(Subrange((lo,), (hi - lo,)))


def reg1(*boxes) -> Region:
    return Region([Box((lo,), (hi,)) for lo, hi in boxes])


def box_region(lo, hi) -> Region:
    return Region.from_box(Box(tuple(lo), tuple(hi)))


def one(cmds):
    assert len(cmds) == 1, cmds
    return cmds[0]


def exe(ctx, r, t):
    """The execution command of task ``t`` on rank ``r``."""
    return one(ctx.cmds(r, cg.EXECUTION, task=t.id))


def depends(c, on, kind=None) -> bool:
    d = c.deps.get(on.id)
    return d is not None and (kind is None or d[0] == kind)


def targets(push) -> dict[int, Region]:
    return dict(push.targets)


def reduction_task(ctx, buf, n, include_current=False, **kw):
    red = ctx.reduction(buf, include_current=include_current)
    return ctx.task((n,), [], reductions=[red], **kw), red


# =================================================================================================
# command_graph_reduction_tests.cc
# =================================================================================================
def test_reduction_command_tree():
    """command_graph_reduction_tests.cc "command_graph_generator generates reduction command
    trees": 2 ranks; a reduction that folds in the current value of a buffer written by an
    earlier task, then a reader of the result on every rank.  Task level: the reduction
    depends on the initializer and the producer of its input, the reader on the reduction.
    Command level, per rank: the producer's execution precedes the reduction task's; the
    reduction command depends on the reduction task's execution and on its await-push, the
    reader's execution on the reduction command, and the await-push (which has no other true
    dependency) on the init epoch.  On rank 0, which holds the initial value, the
    initializer's execution precedes the reduction task's."""
    ctx = ctx_n(2)
    data = ctx.buffer((64,))
    acc = ctx.buffer((1,))
    init = ctx.task((1,), [(acc, rm.all(), DW)])
    produce = ctx.task((64,), [(data, rm.one_to_one(), DW)])
    red = ctx.reduction(acc, include_current=True)
    reduce_ = ctx.task((64,), [(data, rm.one_to_one(), R)], reductions=[red])
    consume = ctx.task((64,), [(acc, rm.all(), R)])
    tdeps = ctx.tasks()[reduce_.id].deps
    assert tdeps[init.id][0] == "true" and tdeps[produce.id][0] == "true"
    assert ctx.tasks()[consume.id].deps[reduce_.id][0] == "true"
    assert depends(exe(ctx, 0, reduce_), exe(ctx, 0, init))
    epoch = {r: one(ctx.cmds(r, cg.EPOCH)) for r in range(2)}
    for r in range(2):
        assert depends(exe(ctx, r, reduce_), exe(ctx, r, produce), "true")
        rc = one(ctx.cmds(r, cg.REDUCTION))
        aw = one(ctx.cmds(r, cg.AWAIT_PUSH, task=consume.id))
        assert aw.transfer == (consume.id, acc, red.id)
        assert depends(rc, exe(ctx, r, reduce_), "true") and depends(rc, aw, "true")
        assert depends(exe(ctx, r, consume), rc, "true")
        assert depends(aw, epoch[r], "true")


def test_single_rank_makes_no_reduction_commands():
    """command_graph_reduction_tests.cc "single-node configurations do not generate reduction
    commands": on one rank the reduction is complete after its task (the instruction level
    reduces the devices' partials), so a reader needs no reduction command, push or await."""
    ctx = ctx_n(1)
    b = ctx.buffer((1,))
    reduction_task(ctx, b, 64)
    ctx.task((64,), [(b, rm.all(), R)])
    assert ctx.cmds(0, cg.REDUCTION) == [] and ctx.cmds(0, cg.PUSH) == [] and ctx.cmds(0, cg.AWAIT_PUSH) == []


def test_discarded_reduction_result_is_never_reduced():
    """command_graph_reduction_tests.cc "discarding the reduction result from a
    execution_command will not generate a reduction command": a discard_write after a
    reduction drops the pending partials (a later reader must not resolve them); on rank 0,
    which overwrites the element, the overwrite anti-depends on the reduction task."""
    ctx = ctx_n(2)
    b = ctx.buffer((1,))
    reduce_, _ = reduction_task(ctx, b, 64)
    discard = ctx.task((64,), [(b, rm.one_to_one(), DW)])
    ctx.task((64,), [(b, rm.one_to_one(), R)])
    for r in range(2):
        assert ctx.cmds(r, cg.REDUCTION) == []
        assert ctx.cmds(r, cg.PUSH) == [] and ctx.cmds(r, cg.AWAIT_PUSH) == []
    assert depends(exe(ctx, 0, discard), exe(ctx, 0, reduce_), "anti")


def test_empty_read_does_not_resolve_a_pending_reduction():
    """command_graph_reduction_tests.cc "empty accesses do not cause pending reductions to be
    resolved": a read through an empty fixed range leaves the reduction pending (no reduction
    command anywhere); a later read of all of it makes one reduction command per rank."""
    ctx = ctx_n(4)
    b = ctx.buffer((1,))
    reduction_task(ctx, b, 64)
    ctx.task((64,), [(b, rm.fixed(Subrange((0,), (0,))), R)], name="faux consume")
    assert all(ctx.cmds(r, cg.REDUCTION) == [] for r in range(4))
    ctx.task((64,), [(b, rm.all(), R)], name="actual consume")
    assert all(len(ctx.cmds(r, cg.REDUCTION)) == 1 for r in range(4))


@pytest.mark.parametrize("across_tasks", [False, True])
def test_redundant_requirements_make_one_reduction_command(across_tasks):
    """command_graph_reduction_tests.cc "command_graph_generator does not generate multiple
    reduction commands for redundant requirements": a master-node task reading the result with
    read, read_write and write accessors (in one task, or in three consecutive tasks) makes a
    single reduction command in the whole cluster."""
    ctx = ctx_n(4)
    b = ctx.buffer((1,))
    reduction_task(ctx, b, 64)
    modes = [R, RW, W]
    if across_tasks:
        for m in modes:
            ctx.task((1,), [(b, rm.all(), m)], kind=tg.MASTER_NODE)
    else:
        ctx.task((1,), [(b, rm.all(), m) for m in modes], kind=tg.MASTER_NODE)
    assert sum(len(ctx.cmds(r, cg.REDUCTION)) for r in range(4)) == 1


def test_overwriting_reduction_anti_depends_on_the_partial_result_push():
    """command_graph_reduction_tests.cc "commands overwriting a buffer generate
    anti-dependencies on preceding reduction pushes": a second reduction that folds in the
    first's result resolves it (rank 1 pushes its partial to rank 0, whose chunk folds in the
    current value); rank 1's execution of the second reduction then overwrites the element and
    must wait for that push to have read it."""
    ctx = ctx_n(2)
    b = ctx.buffer((1,))
    reduction_task(ctx, b, 2, name="reduce a")
    second, _ = reduction_task(ctx, b, 2, include_current=True, name="reduce b")
    push = one(ctx.cmds(1, cg.PUSH))
    assert depends(exe(ctx, 1, second), push, "anti")


def test_final_result_is_forwarded_from_the_reducing_rank():
    """command_graph_reduction_tests.cc "command_graph_generator forwards final reduction
    result if required by another node in a later task": read on the master node, the
    reduction happens once, on rank 0; a later collective reader on every rank gets the result
    pushed from rank 0 (after its reduction command) to ranks 1..3, the whole element each."""
    ctx = ctx_n(4)
    b = ctx.buffer((1,))
    reduction_task(ctx, b, 64)
    ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
    coll = ctx.task((4,), [(b, rm.all(), R)], kind=tg.COLLECTIVE, collective_group=0)
    assert [len(ctx.cmds(r, cg.REDUCTION)) for r in range(4)] == [1, 0, 0, 0]
    rc = one(ctx.cmds(0, cg.REDUCTION))
    push = one(ctx.cmds(0, cg.PUSH, task=coll.id))
    assert targets(push) == {r: box_region((0,), (1,)) for r in (1, 2, 3)}
    assert depends(push, rc, "true")


def test_chained_reductions_transfer_partials_to_the_reducing_rank():
    """command_graph_reduction_tests.cc "multiple chained reductions produce appropriate data
    transfers": 2 ranks; reduction A, then reduction B folding in A's result (which resolves A
    on rank 0, where the current value is folded in), then a master-node reader (which resolves
    B on rank 0).  One reduction command each, each preceded by an await-push; rank 1 pushes
    its two partials, rank 0 pushes nothing."""
    ctx = ctx_n(2)
    b = ctx.buffer((1,))
    reduction_task(ctx, b, 2)
    reduction_task(ctx, b, 2, include_current=True)
    assert sum(len(ctx.cmds(r, cg.REDUCTION)) for r in range(2)) == 1
    ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
    rcs = ctx.cmds(0, cg.REDUCTION)
    assert len(rcs) == 2 and ctx.cmds(1, cg.REDUCTION) == []
    awaits = {a.id: a for a in ctx.cmds(0, cg.AWAIT_PUSH)}
    for rc in rcs:
        assert sum(1 for d in rc.deps if d in awaits) == 1
    assert ctx.cmds(0, cg.PUSH) == []
    assert len(ctx.cmds(1, cg.PUSH)) == 2


def test_reduction_without_current_value_needs_no_transfer_of_the_old_value():
    """command_graph_reduction_tests.cc "reductions that overwrite the previous buffer contents
    do not generate data transfers": rank 1 writes the element, then both ranks reduce into it
    without folding in the current value: nothing is pushed or awaited."""
    ctx = ctx_n(2)
    b = ctx.buffer((1,))

    def only_second_half(chunk, shape):
        return Subrange((0,), (1 if chunk.offset[0] == 32 else 0,))

    ctx.task((64,), [(b, only_second_half, DW)])
    reduction_task(ctx, b, 64)
    for r in range(2):
        assert ctx.cmds(r, cg.PUSH) == [] and ctx.cmds(r, cg.AWAIT_PUSH) == []


def test_rank_without_a_chunk_contributes_no_partial():
    """command_graph_reduction_tests.cc "nodes that do not own pending reduction don't include
    it in final reduction result": 3 ranks, a reduction over 64 items in work groups of 32 runs
    on ranks 0 and 1 only; a master-node reader makes one push on each of ranks 1 and 2, and
    rank 2's push carries no partial result (Celerity: an empty box; celeritas: a push marked
    ``contributes=False``, which becomes an empty pilot) and depends only on the init epoch."""
    ctx = ctx_n(3)
    b = ctx.buffer((1,))
    t, _ = reduction_task(ctx, b, 64, granularity=(32,))
    assert [len(ctx.cmds(r, cg.EXECUTION, task=t.id)) for r in range(3)] == [1, 1, 0]
    ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
    assert ctx.cmds(0, cg.PUSH) == []
    p1, p2 = one(ctx.cmds(1, cg.PUSH)), one(ctx.cmds(2, cg.PUSH))
    assert list(targets(p1)) == [0] and list(targets(p2)) == [0]
    assert p1.contributes and not p2.contributes
    assert one(ctx.cmds(0, cg.REDUCTION)).contributes
    assert set(p2.deps) == {one(ctx.cmds(2, cg.EPOCH)).id}


def test_reduction_without_current_value_anti_depends_on_the_previous_writer():
    """command_graph_reduction_tests.cc "reductions that do not include the current value
    generate anti-dependencies onto previous writer": on one rank, the reduction's execution
    command is ordered after the task that last wrote the buffer."""
    ctx = ctx_n(1)
    b = ctx.buffer((1,))
    w = ctx.task((1,), [(b, rm.all(), DW)], kind=tg.MASTER_NODE)
    t, _ = reduction_task(ctx, b, 1)
    assert depends(exe(ctx, 0, t), exe(ctx, 0, w), "anti")


def test_reduction_command_anti_depends_on_the_partial_result_push():
    """command_graph_reduction_tests.cc "reduction commands anti-depend on their
    partial-result push commands": per rank, producer execution -> push of its partial ->
    reduction command (which overwrites the partial the push reads)."""
    ctx = ctx_n(2)
    b = ctx.buffer((1,))
    producer, _ = reduction_task(ctx, b, 2)
    ctx.task((2,), [(b, rm.all(), R)])
    for r in range(2):
        push = one(ctx.cmds(r, cg.PUSH))
        rc = one(ctx.cmds(r, cg.REDUCTION))
        assert depends(push, exe(ctx, r, producer), "true")
        assert depends(rc, push, "anti")


def test_reduction_by_a_single_chunk_is_forwarded_to_readers():
    """command_graph_reduction_tests.cc "reduction in a single-node task does not generate a
    reduction command, but the result is await-pushed on other nodes": 3 ranks, a reduction
    over one item (so only rank 0 computes it), read on every rank.  Rank 0 holds the whole
    result, as if it had written the buffer: its push follows the producer and goes to ranks
    1 and 2, whose readers each await it; rank 0 awaits nothing.  (celeritas used to resolve
    it like any reduction, with empty notifications from ranks 1 and 2 and a reduction
    command on every reader.)"""
    ctx = ctx_n(3)
    b = ctx.buffer((1,))
    producer, _ = reduction_task(ctx, b, 1, name="producer")
    consumer = ctx.task((3,), [(b, rm.all(), R)], name="consumer")
    p0 = one(ctx.cmds(0, cg.PUSH))
    assert depends(p0, exe(ctx, 0, producer), "true")
    assert sorted(targets(p0)) == [1, 2]
    assert ctx.cmds(0, cg.AWAIT_PUSH) == []
    for r in (1, 2):
        assert ctx.cmds(r, cg.PUSH) == []
        aw = one(ctx.cmds(r, cg.AWAIT_PUSH))
        assert aw.id in ctx_closure(ctx, r, exe(ctx, r, consumer))


def test_reduction_by_a_single_chunk_makes_no_reduction_command():
    """command_graph_reduction_tests.cc "reduction in a single-node task does not generate a
    reduction command, but the result is await-pushed on other nodes" (shape): with only rank
    0 contributing, no reduction command is needed anywhere; rank 0 pushes the element to ranks
    1 and 2, which each await it before the consumer, and ranks 1 and 2 push nothing."""
    ctx = ctx_n(3)
    b = ctx.buffer((1,))
    reduction_task(ctx, b, 1, name="producer")
    consumer = ctx.task((3,), [(b, rm.all(), R)], name="consumer")
    assert all(ctx.cmds(r, cg.REDUCTION) == [] for r in range(3))
    assert ctx.cmds(1, cg.PUSH) == [] and ctx.cmds(2, cg.PUSH) == []
    assert targets(one(ctx.cmds(0, cg.PUSH))) == {1: box_region((0,), (1,)), 2: box_region((0,), (1,))}
    for r in (1, 2):
        assert depends(exe(ctx, r, consumer), one(ctx.cmds(r, cg.AWAIT_PUSH)), "true")


def ctx_closure(ctx, rank, cmd) -> set[int]:
    """Transitive predecessors (ids) of ``cmd`` on ``rank``."""
    by_id = {c.id: c for c in ctx.commands[rank]}
    seen: set[int] = set()
    stack = list(cmd.deps)
    while stack:
        d = stack.pop()
        if d in seen:
            continue
        seen.add(d)
        if d in by_id:
            stack.extend(by_id[d].deps)
    return seen


def test_non_participants_push_only_to_the_reducing_rank():
    """command_graph_reduction_tests.cc "nodes that do not participate in reduction only push
    data to those that do" (single-node section): 4 ranks reduce, one rank (0) reads: ranks
    1..3 push the element to rank 0, rank 0 pushes nothing."""
    ctx = ctx_n(4)
    b = ctx.buffer((1,))
    reduction_task(ctx, b, 4)
    ctx.task((1,), [(b, rm.all(), R)])
    assert ctx.cmds(0, cg.PUSH) == []
    for r in (1, 2, 3):
        assert targets(one(ctx.cmds(r, cg.PUSH))) == {0: box_region((0,), (1,))}


def test_reduction_read_on_a_subset_of_ranks_is_supported():
    """command_graph_reduction_tests.cc "nodes that do not participate in reduction only push
    data to those that do" and "... generate await-pushes when reading the result afterwards"
    (subset sections).  Difference: Celerity rejects a reader on a subset of the ranks
    ("requires a reduction ... that is not performed on all nodes"); celeritas supports it:
    each reading rank (0 and 1) gathers every partial and reduces, the others (2, 3) push
    their partial to both readers and make no reduction command."""
    ctx = ctx_n(4)
    b = ctx.buffer((1,))
    _, red = reduction_task(ctx, b, 4)
    reader = ctx.task((2,), [(b, rm.all(), R)], name="mytask")
    for r in (0, 1):
        rc = one(ctx.cmds(r, cg.REDUCTION))
        assert rc.transfer == (reader.id, b, red.id)
        assert targets(one(ctx.cmds(r, cg.PUSH))) == {1 - r: box_region((0,), (1,))}
        assert depends(exe(ctx, r, reader), rc, "true")
    for r in (2, 3):
        assert ctx.cmds(r, cg.REDUCTION) == [] and ctx.cmds(r, cg.AWAIT_PUSH) == []
        assert sorted(targets(one(ctx.cmds(r, cg.PUSH)))) == [0, 1]


def test_non_participants_await_the_result_for_a_later_reader():
    """command_graph_reduction_tests.cc "nodes that do not participate in reduction generate
    await-pushes when reading the result afterwards" (single-node section): after rank 0
    alone reduced (one reduction command, before its reader), a reader on every rank gets the
    result pushed from rank 0 (after the reduction command) to ranks 1..3, each of which
    awaits it before its execution and pushes nothing new."""
    ctx = ctx_n(4)
    b = ctx.buffer((1,))
    reduction_task(ctx, b, 4)
    reducer = ctx.task((1,), [(b, rm.all(), R)])
    consumer = ctx.task((4,), [(b, rm.all(), R)])
    rc = one(ctx.cmds(0, cg.REDUCTION))
    assert sum(len(ctx.cmds(r, cg.REDUCTION)) for r in range(4)) == 1
    assert depends(exe(ctx, 0, reducer), rc, "true")
    push = one(ctx.cmds(0, cg.PUSH, task=consumer.id))
    assert depends(push, rc, "true")
    assert targets(push) == {r: box_region((0,), (1,)) for r in (1, 2, 3)}
    for r in (1, 2, 3):
        aw = one(ctx.cmds(r, cg.AWAIT_PUSH))
        assert aw.task.id == consumer.id
        assert depends(exe(ctx, r, consumer), aw, "true")
        assert len(ctx.cmds(r, cg.PUSH)) == 1


# =================================================================================================
# command_graph_transfer_tests.cc
# =================================================================================================
def test_reversed_reads_transfer_exact_regions_1d():
    """command_graph_transfer_tests.cc "command_graph_generator generates required data transfer
    commands" (1-D section): 4 ranks write a 256 buffer through a reversing mapper, then read
    it one_to_one: each rank pushes exactly its reversed quarter to its mirror rank and awaits
    its own quarter."""
    ctx = ctx_n(4)
    b = ctx.buffer((256,))

    def reverse(chunk, shape):
        return Subrange((256 - chunk.offset[0] - chunk.range[0],), chunk.range)

    ctx.task((256,), [(b, reverse, DW)], name="init")
    ctx.task((256,), [(b, rm.one_to_one(), R)])
    for r in range(4):
        q = 64 * (3 - r)
        assert targets(one(ctx.cmds(r, cg.PUSH))) == {3 - r: reg1((q, q + 64))}
        assert one(ctx.cmds(r, cg.AWAIT_PUSH)).region == reg1((64 * r, 64 * r + 64))


@pytest.mark.parametrize("dims", [2, 3])
def test_split_2d_writer_then_all_reader_transfers(dims):
    """command_graph_transfer_tests.cc "command_graph_generator generates required data
    transfer commands" (2-D and 3-D sections): a split_2d writer on 4 ranks, then a reader of
    everything: each rank pushes its quadrant (full extent in the third dimension) to the
    three others in one push, and awaits the rest of the buffer in one await-push."""
    shape = (256, 256, 256)[:dims] if dims == 2 else (32, 32, 32)
    n = shape[0]
    h = n // 2
    ctx = ctx_n(4)
    b = ctx.buffer(shape)
    ctx.task(shape, [(b, rm.one_to_one(), DW)], split="2d", name="init")
    assert all(len(ctx.cmds(r, cg.EXECUTION)) == 1 for r in range(4))
    ctx.task(shape, [(b, rm.all(), R)])
    full = box_region((0,) * dims, shape)
    rest = tuple(shape[2:])
    quads = [((0, 0), (h, h)), ((0, h), (h, n)), ((h, 0), (n, h)), ((h, h), (n, n))]
    for r, (lo, hi) in enumerate(quads):
        mine = box_region(lo + (0,) * len(rest), hi + rest)
        push = one(ctx.cmds(r, cg.PUSH))
        assert targets(push) == {o: mine for o in range(4) if o != r}
        assert one(ctx.cmds(r, cg.AWAIT_PUSH)).region == full - mine


def test_one_push_for_many_recipients():
    """command_graph_transfer_tests.cc "command_graph_generator generates a single push
    command for multiple recipients": data written on rank 0 and read everywhere is pushed by
    one command with three targets."""
    ctx = ctx_n(4)
    b = ctx.buffer((256,))
    ctx.task((1,), [(b, rm.all(), DW)], kind=tg.MASTER_NODE)
    ctx.task((256,), [(b, rm.all(), R)])
    assert sum(len(ctx.cmds(r, cg.PUSH)) for r in range(4)) == 1
    assert targets(one(ctx.cmds(0, cg.PUSH))) == {r: reg1((0, 256)) for r in (1, 2, 3)}


def test_one_push_per_buffer_and_task_across_several_last_writers():
    """command_graph_transfer_tests.cc "command_graph_generator generates a single push command
    per buffer and task": two tasks each write a half of two buffers (so each rank holds two
    pieces written by different tasks); a reader of all of buffer 0 and the first half of
    buffer 1 makes one push per buffer per rank, whose region joins both pieces; a second
    reader of the other half of buffer 1 one more push per rank.  (Celerity's second reader
    also splits into 4 chunks per rank; celeritas has one chunk per rank.)"""
    ctx = ctx_n(2)
    b0, b1 = ctx.buffer((128,)), ctx.buffer((128,))
    ctx.task((64,), [(b0, rm.one_to_one(), DW), (b1, rm.one_to_one(), DW)])
    ctx.task((64,), [(b0, rm.one_to_one(), DW), (b1, rm.one_to_one(), DW)], offset=(64,))
    t1 = ctx.task((128,), [(b0, rm.all(), R), (b1, fixed(0, 64), R)])
    t2 = ctx.task((128,), [(b1, fixed(64, 128), R)])
    assert sum(len(ctx.cmds(r, cg.PUSH)) for r in range(2)) == 6

    def push(r, t, b):
        return one([p for p in ctx.cmds(r, cg.PUSH, task=t.id) if p.transfer[1] == b])

    assert targets(push(0, t1, b0)) == {1: reg1((0, 32), (64, 96))}
    assert targets(push(0, t1, b1)) == {1: reg1((0, 32))}
    assert targets(push(1, t1, b0)) == {0: reg1((32, 64), (96, 128))}
    assert targets(push(1, t1, b1)) == {0: reg1((32, 64))}
    assert targets(push(0, t2, b1)) == {1: reg1((64, 96))}
    assert targets(push(1, t2, b1)) == {0: reg1((96, 128))}


def test_one_await_push_per_buffer_and_task():
    """command_graph_transfer_tests.cc "command_graph_generator generates a single await_push
    command per buffer and task": reading two buffers reversed makes, per rank, exactly one
    push and one await-push per buffer, each awaiting the other rank's half."""
    ctx = ctx_n(2)
    b0, b1 = ctx.buffer((128,)), ctx.buffer((128,))
    ctx.task((128,), [(b0, rm.one_to_one(), DW), (b1, rm.one_to_one(), DW)], name="init")

    def reverse(chunk, shape):
        return Subrange((128 - chunk.offset[0] - chunk.range[0],), chunk.range)

    ctx.task((128,), [(b0, reverse, R), (b1, reverse, R)])
    for r in range(2):
        assert len(ctx.cmds(r, cg.PUSH)) == 2
        aws = ctx.cmds(r, cg.AWAIT_PUSH)
        assert sorted(a.transfer[1] for a in aws) == [b0, b1]
        other = (64, 128) if r == 0 else (0, 64)
        assert all(a.region == reg1(other) for a in aws)


@pytest.mark.parametrize("case", ["same task", "consecutive tasks", "parallel tasks"])
def test_data_is_transferred_once(case):
    """command_graph_transfer_tests.cc "command_graph_generator doesn't generate data transfer
    commands for the same buffer and range more than once": two consuming accessors in one
    task, a later reader after a first one (with or without a write of another buffer in
    between): rank 1 pushes its half to rank 0 once, rank 0 awaits it once."""
    ctx = ctx_n(2)
    b = ctx.buffer((128,))
    ctx.task((128,), [(b, rm.one_to_one(), DW)])
    if case == "same task":
        ctx.task((1,), [(b, rm.all(), R), (b, rm.all(), W)], kind=tg.MASTER_NODE)
    elif case == "consecutive tasks":
        other = ctx.buffer((128,))
        ctx.task((1,), [(b, rm.all(), R), (other, rm.all(), DW)], kind=tg.MASTER_NODE)
        ctx.task((1,), [(b, rm.all(), R), (other, rm.all(), R)], kind=tg.MASTER_NODE)
    else:
        ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
        ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
    assert targets(one(ctx.cmds(1, cg.PUSH))) == {0: reg1((64, 128))}
    assert len(ctx.cmds(0, cg.AWAIT_PUSH)) == 1
    assert ctx.cmds(0, cg.PUSH) == [] and ctx.cmds(1, cg.AWAIT_PUSH) == []


@pytest.mark.parametrize("case", ["read", "read_write", "one direction", "other direction"])
def test_only_the_producer_pushes(case):
    """command_graph_transfer_tests.cc "only the original producer (owner) of data generates
    pushes": data written on rank 0 and then read (or read-written) one_to_one on 3 ranks is
    pushed by rank 0 alone; two tasks each reading everything on one other rank (1 then 2, or
    2 then 1) make two pushes, both from rank 0 (not from the rank that got a copy first).
    Ranks 1 and 2 each await once."""
    ctx = ctx_n(3)
    b = ctx.buffer((300,))
    ctx.task((1,), [(b, rm.all(), DW)], kind=tg.MASTER_NODE)

    def whole_on(rank):
        def mapper(chunk, shape):
            return Subrange((0,), (300 if chunk.offset[0] == 100 * rank else 0,))
        return mapper

    if case == "read":
        ctx.task((300,), [(b, rm.one_to_one(), R)])
        pushes = 1
    elif case == "read_write":
        ctx.task((300,), [(b, rm.one_to_one(), RW)])
        pushes = 1
    else:
        order = (1, 2) if case == "one direction" else (2, 1)
        for rank in order:
            ctx.task((300,), [(b, whole_on(rank), R)])
        pushes = 2
    assert len(ctx.cmds(0, cg.PUSH)) == pushes
    assert ctx.cmds(1, cg.PUSH) == [] and ctx.cmds(2, cg.PUSH) == []
    assert len(ctx.cmds(1, cg.AWAIT_PUSH)) == 1 and len(ctx.cmds(2, cg.AWAIT_PUSH)) == 1


def test_partial_replication_does_not_divide_pushes():
    """command_graph_transfer_tests.cc "command_graph_generator does not unnecessarily divide
    push commands due to partial replication": 3 ranks write 32 each; rank 0 reads 48..80
    (two pushes: ranks 1 and 2); then ranks 1 and 2 both read 32..96, though rank 0 already
    holds part of each of their pieces: one push each, of the whole missing piece."""
    ctx = ctx_n(3)
    b = ctx.buffer((96,))
    a = ctx.task((96,), [(b, rm.one_to_one(), DW)], name="task a")
    assert [exe(ctx, r, a).box for r in range(3)] == [Box((32 * r,), (32 * r + 32,)) for r in range(3)]
    t1 = ctx.task((1,), [(b, fixed(48, 80), R)], kind=tg.MASTER_NODE)
    assert targets(one(ctx.cmds(1, cg.PUSH, task=t1.id))) == {0: reg1((48, 64))}
    assert targets(one(ctx.cmds(2, cg.PUSH, task=t1.id))) == {0: reg1((64, 80))}

    def upper(chunk, shape):
        return Subrange((32,), (64,)) if chunk.offset[0] + chunk.range[0] >= 64 else Subrange((0,), (0,))

    t2 = ctx.task((96,), [(b, upper, R)])
    p1 = ctx.cmds(1, cg.PUSH, task=t2.id)
    p2 = ctx.cmds(2, cg.PUSH, task=t2.id)
    assert ctx.cmds(0, cg.PUSH, task=t2.id) == []
    assert [targets(p) for p in p1] == [{2: reg1((32, 64))}]
    assert [targets(p) for p in p2] == [{1: reg1((64, 96))}]


def test_push_depends_on_every_writer_of_what_it_sends():
    """command_graph_transfer_tests.cc "command_graph_generator generates dependencies for push
    commands": rank 1's data was written by two tasks (a quarter each); its single push to the
    master-node reader depends on both execution commands."""
    ctx = ctx_n(2)
    b = ctx.buffer((128,))
    first = ctx.task((64,), [(b, rm.one_to_one(), DW)], name="init first half")
    second = ctx.task((64,), [(b, rm.one_to_one(), DW)], offset=(64,), name="init second half")
    ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
    push = one(ctx.cmds(1, cg.PUSH))
    assert depends(push, exe(ctx, 1, first), "true") and depends(push, exe(ctx, 1, second), "true")


def test_await_push_anti_depends_on_an_earlier_reader():
    """command_graph_transfer_tests.cc "command_graph_generator generates anti-dependencies for
    await_push commands" (execution command section): rank 0 reads the host-initialized
    buffer, both ranks overwrite it, rank 0 reads it again: the await-push that overwrites
    rank 0's copy waits for the first reader."""
    ctx = ctx_n(2)
    b = ctx.buffer((128,), host_init=True)
    a = ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
    ctx.task((128,), [(b, rm.one_to_one(), DW)])
    ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
    aw = one(ctx.cmds(0, cg.AWAIT_PUSH))
    assert exe(ctx, 0, a).id in ctx_closure(ctx, 0, aw)


def test_await_push_anti_depends_on_an_earlier_push_of_the_region():
    """command_graph_transfer_tests.cc "command_graph_generator generates anti-dependencies for
    await_push commands" (push command section): rank 1 pushes its half to rank 0's
    read_write master task; a later one_to_one reader makes rank 1 await the new data into
    the memory that push read: the await-push is ordered after the push."""
    ctx = ctx_n(2)
    b = ctx.buffer((128,), host_init=True)
    ctx.task((128,), [(b, rm.one_to_one(), DW)])
    ctx.task((1,), [(b, rm.all(), RW)], kind=tg.MASTER_NODE)
    ctx.task((128,), [(b, rm.one_to_one(), R)])
    push = one(ctx.cmds(1, cg.PUSH))
    aw = one(ctx.cmds(1, cg.AWAIT_PUSH))
    assert push.id in ctx_closure(ctx, 1, aw)


def test_await_push_anti_dependency_is_delegated_to_the_reader_of_the_previous_await():
    """command_graph_transfer_tests.cc "command_graph_generator generates anti-dependencies for
    await_push commands" (another await_push section): rank 0 receives rank 1's half for a
    reader, both ranks overwrite, rank 0 reads again: the second await-push depends on the
    first reader (which read what the first await-push wrote)."""
    ctx = ctx_n(2)
    b = ctx.buffer((128,), host_init=True)
    ctx.task((128,), [(b, rm.one_to_one(), DW)])
    tb = ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
    first = one(ctx.cmds(0, cg.AWAIT_PUSH))
    ctx.task((128,), [(b, rm.one_to_one(), DW)])
    ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
    second = one([a for a in ctx.cmds(0, cg.AWAIT_PUSH) if a is not first])
    assert depends(second, exe(ctx, 0, tb), "anti")


def test_anti_dependencies_have_subrange_precision_for_execution_commands():
    """command_graph_transfer_tests.cc "command_graph_generator generates anti-dependencies with
    subrange precision" (execution command section): a writer and a reader of the first half,
    then a writer of the second half: the last is concurrent with both (on every rank)."""
    ctx = ctx_n(2)
    b = ctx.buffer((128,), host_init=True)
    ta = ctx.task((64,), [(b, rm.one_to_one(), DW)])
    tb = ctx.task((64,), [(b, rm.one_to_one(), R)])
    tc = ctx.task((64,), [(b, rm.one_to_one(), DW)], offset=(64,))
    for r in range(2):
        cl = ctx_closure(ctx, r, exe(ctx, r, tc))
        assert exe(ctx, r, ta).id not in cl and exe(ctx, r, tb).id not in cl


def test_anti_dependencies_have_subrange_precision_for_await_pushes():
    """command_graph_transfer_tests.cc "command_graph_generator generates anti-dependencies with
    subrange precision" (await_push section): rank 0 reads the second half (awaiting it), the
    ranks overwrite the first half, rank 0 reads the first half: that await-push follows the
    original writer on rank 0 and is concurrent with the reader of the other half."""
    ctx = ctx_n(2)
    b = ctx.buffer((128,), host_init=True)
    ta = ctx.task((128,), [(b, rm.one_to_one(), DW)])
    tb = ctx.task((1,), [(b, fixed(64, 128), R)], kind=tg.MASTER_NODE)
    ctx.task((64,), [(b, rm.one_to_one(), DW)])
    td = ctx.task((1,), [(b, fixed(0, 64), R)], kind=tg.MASTER_NODE)
    aw = one(ctx.cmds(0, cg.AWAIT_PUSH, task=td.id))
    assert aw.region == reg1((32, 64))
    cl = ctx_closure(ctx, 0, aw)
    assert exe(ctx, 0, ta).id in cl
    eb = exe(ctx, 0, tb)
    assert eb.id not in cl and aw.id not in ctx_closure(ctx, 0, eb)


# =================================================================================================
# graph_compaction_tests.cc (command level)
# =================================================================================================
@pytest.mark.parametrize("step", [1, 2, 3])
def test_horizons_bound_the_last_writer_state(step):
    """graph_compaction_tests.cc "horizons prevent tracking data structures from growing
    indefinitely": a task per time step reads all rows written so far and writes the next
    row.  However many steps, the rows written before the applied horizon are represented by
    it: a reader of everything depends on at most step + 2 commands (Celerity counts 1 +
    step + (t+1) % step last-writer entries in its region map; celeritas' map is private, so
    the bound is observed through the dependencies)."""
    ctx = ctx_n(1, horizon_step=step)
    n = 60
    b = ctx.buffer((n, 300))
    for t in range(n):
        def rows_before(chunk, shape, t=t):
            return Subrange((0, 0), (t, 300))

        def row(chunk, shape, t=t):
            return Subrange((t, 0), (1, 300))

        ctx.task((300,), [(b, rows_before, R), (b, row, DW)])
        if t > 2 * step:
            probe_ctx_deps = len({d for d in ctx.cmds(0)[-1].deps})
            assert probe_ctx_deps <= step + 2
    reader = ctx.task((1,), [(b, rm.all(), R)], kind=tg.MASTER_NODE)
    ex = exe(ctx, 0, reader)
    kinds = {c.id: c.kind for c in ctx.commands[0]}
    assert len(ex.deps) <= step + 2
    assert sum(1 for d in ex.deps if kinds[d] == cg.HORIZON) == 1


def test_horizon_carries_anti_dependencies_of_collapsed_readers():
    """graph_compaction_tests.cc "horizons correctly deal with antidependencies": a reader of
    buffer B is collapsed into the first horizon when the second horizon applies it; a later
    overwrite of B must then anti-depend on that horizon (and truly on the last writer of A,
    which it reads)."""
    ctx = ctx_n(1, horizon_step=2)
    a, b = ctx.buffer((100,)), ctx.buffer((100,))
    ctx.task((100,), [(a, rm.one_to_one(), DW), (b, rm.one_to_one(), DW)])
    ctx.task((100,), [(b, rm.one_to_one(), R)])
    first = one(ctx.cmds(0, cg.HORIZON))
    for _ in range(3):
        last_rw = ctx.task((100,), [(a, rm.one_to_one(), RW)])
    assert len(ctx.cmds(0, cg.HORIZON)) >= 2
    w = ctx.task((100,), [(a, rm.one_to_one(), R), (b, rm.one_to_one(), DW)])
    ex = exe(ctx, 0, w)
    assert depends(ex, exe(ctx, 0, last_rw), "true")
    assert depends(ex, first)


def test_host_initialized_buffer_after_horizons_depends_on_the_applied_horizon_commands():
    """graph_compaction_tests.cc "previous horizons are used as last writers for
    host-initialized buffers": on 2 ranks, after enough tasks to apply horizons, a
    read_write of a freshly made host-initialized buffer depends (besides epochs) only on a
    horizon command on each rank, not on the long-gone initial commands."""
    ctx = ctx_n(2, horizon_step=2)
    first = ctx.buffer((100,), host_init=True)
    t0 = ctx.task((100,), [(first, rm.one_to_one(), RW)], name="access_host_init_buf")
    initial = {r: exe(ctx, r, t0).id for r in range(2)}
    scratch = ctx.buffer((100,))
    for _ in range(8):
        ctx.task((100,), [(scratch, rm.one_to_one(), DW)])
    late = ctx.buffer((100,), host_init=True)
    t = ctx.task((100,), [(late, rm.one_to_one(), RW)], name="access_host_init_buf")
    total = 0
    for r in range(2):
        kinds = {c.id: c.kind for c in ctx.commands[r]}
        ex = exe(ctx, r, t)
        assert initial[r] not in ex.deps
        preds = [d for d in ex.deps if kinds[d] != cg.EPOCH]
        assert preds and all(kinds[d] == cg.HORIZON for d in preds)
        total += len(preds)
    assert total == 2


def test_collective_command_behind_a_horizon_orders_after_the_horizon():
    """graph_compaction_tests.cc "commands for collective host tasks do not order-depend on
    their predecessor if it is shadowed by a horizon": the second collective command depends
    on exactly two commands: the master-node writer it reads from and the horizon that stands
    in for the first collective command."""
    ctx = ctx_n(1, horizon_step=2)
    first = ctx.task((1,), kind=tg.COLLECTIVE, collective_group=0)
    b = ctx.buffer((1,))
    for _ in range(4):
        ctx.task((1,), [(b, rm.all(), DW)], kind=tg.MASTER_NODE)
    second = ctx.task((1,), [(b, rm.all(), R)], kind=tg.COLLECTIVE, collective_group=0)
    ex = exe(ctx, 0, second)
    kinds = {c.id: c.kind for c in ctx.commands[0]}
    assert exe(ctx, 0, first).id not in ex.deps
    assert len(ex.deps) == 2
    assert sorted(kinds[d] for d in ex.deps) == [cg.EXECUTION, cg.HORIZON]


def test_side_effect_command_behind_a_horizon_orders_after_the_horizon():
    """graph_compaction_tests.cc "side-effect dependencies are correctly subsumed by
    horizons": the second command affecting a host object depends on one horizon only."""
    ctx = ctx_n(1, horizon_step=2)
    ctx.task((1,), kind=tg.MASTER_NODE, side_effects=[0])
    b = ctx.buffer((1,))
    for _ in range(4):
        ctx.task((1,), [(b, rm.all(), DW)], kind=tg.MASTER_NODE)
    second = ctx.task((1,), kind=tg.MASTER_NODE, side_effects=[0])
    ex = exe(ctx, 0, second)
    kinds = {c.id: c.kind for c in ctx.commands[0]}
    assert [kinds[d] for d in ex.deps] == [cg.HORIZON]
