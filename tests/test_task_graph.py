import logging

import pytest

from celeritas import range_mappers as rm
from scheduler import task_graph as tg
from scheduler.errors import DiagnosticError
from scheduler.geometry import Subrange

from graph_context import GraphContext

R, W, RW, DW, DRW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE, tg.DISCARD_READ_WRITE


def deps(ctx, t):
    return {d: k for d, (k, _o) in ctx.tasks()[t.id].deps.items()}


def test_behaviour_1_true_and_anti_dependencies():
    ctx = GraphContext(1)
    b = ctx.buffer((128,))
    ta = ctx.task((128,), [(b, rm.fixed(Subrange((0,), (128,))), DW)], name="a")
    tb = ctx.task((128,), [(b, rm.fixed(Subrange((0,), (64,))), R)], name="b")
    tc = ctx.task((128,), [(b, rm.fixed(Subrange((64,), (64,))), DW)], name="c")
    td = ctx.task((128,), [(b, rm.fixed(Subrange((0,), (64,))), DW)], name="d")
    assert deps(ctx, tb)[ta.id] == "true"
    assert deps(ctx, tc)[ta.id] == "anti"
    assert tb.id not in deps(ctx, tc)
    assert deps(ctx, td)[tb.id] == "anti"
    assert ta.id not in deps(ctx, td)


@pytest.mark.parametrize("c_mode", [R, RW, W])
@pytest.mark.parametrize("p2_mode", [W, RW, DW, DRW])
def test_behaviour_2_producer_consumer_producer(c_mode, p2_mode):
    ctx = GraphContext(1)
    b = ctx.buffer((64,), host_init=True)
    p = ctx.task((64,), [(b, rm.all(), W)], name="P")
    c = ctx.task((64,), [(b, rm.all(), c_mode)], name="C")
    p2 = ctx.task((64,), [(b, rm.all(), p2_mode)], name="P2")
    assert deps(ctx, c)[p.id] == "true"
    expected = "anti" if (c_mode == R or p2_mode in (DW, DRW)) else "true"
    assert deps(ctx, p2)[c.id] == expected


def test_behaviour_3_host_initialized_and_uninitialized_reads(caplog):
    ctx = GraphContext(1)
    init_epoch = next(t for t in ctx.tasks().values() if t.kind == tg.EPOCH)
    hb = ctx.buffer((32,), host_init=True)
    t1 = ctx.task((32,), [(hb, rm.one_to_one(), R)])
    assert deps(ctx, t1) == {init_epoch.id: "true"}
    assert ctx.tasks()[t1.id].deps[init_epoch.id][1] == tg.ORIGIN_LAST_EPOCH or \
        ctx.tasks()[t1.id].deps[init_epoch.id][1] == tg.ORIGIN_DATAFLOW
    ub = ctx.buffer((32,), name="never_written")
    with caplog.at_level(logging.WARNING, logger="celeritas"):
        t2 = ctx.task((32,), [(ub, rm.one_to_one(), R)])
    # no dataflow dependency, only the epoch
    assert {o for _k, o in ctx.tasks()[t2.id].deps.values()} == {tg.ORIGIN_LAST_EPOCH}
    assert any("uninitialized read" in r.message and "never_written" in r.message for r in caplog.records)


def test_uninitialized_read_under_error_policy_raises():
    ctx = GraphContext(1, diagnostics="error")
    ub = ctx.buffer((8,), name="ub")
    with pytest.raises(DiagnosticError, match="ub"):
        ctx.task((8,), [(ub, rm.all(), R)], name="reader")


def test_behaviour_4_task_after_wait_depends_only_on_epoch():
    ctx = GraphContext(1)
    b = ctx.buffer((16,))
    ctx.task((16,), [(b, rm.one_to_one(), DW)])
    ep = ctx.epoch()
    t = ctx.task((16,), [])
    assert deps(ctx, t) == {ep.id: "true"}
    assert ctx.tasks()[t.id].deps[ep.id][1] == tg.ORIGIN_LAST_EPOCH
    # a reader of data written before the epoch depends on the epoch (the writer is behind it)
    r = ctx.task((16,), [(b, rm.all(), R)])
    assert deps(ctx, r) == {ep.id: "true"}


def test_horizons_every_step_of_critical_path():
    ctx = GraphContext(1, horizon_step=2)
    b = ctx.buffer((16,), host_init=True)
    for _ in range(8):
        ctx.task((16,), [(b, rm.one_to_one(), RW)])
    kinds = [t.kind for t in sorted(ctx.tasks().values(), key=lambda t: t.id)]
    # init epoch, then after every 2 steps of critical path a horizon
    assert kinds == ["epoch"] + ["device_compute", "device_compute", "horizon"] * 4
    horizons = [t for t in ctx.tasks().values() if t.kind == tg.HORIZON]
    # each horizon depends on the execution front (the last compute task)
    for h in horizons:
        assert all(o == tg.ORIGIN_EXECUTION_FRONT for _k, o in h.deps.values())
    # horizons chain: each depends on the previous one, which was still in the front
    for prev, h in zip(horizons, horizons[1:]):
        assert prev.id in h.deps
    # the previous horizon became the epoch for new tasks
    assert ctx.tm.epoch_for_new_tasks is horizons[-2]


def test_horizon_on_wide_execution_front():
    ctx = GraphContext(1, horizon_step=100, horizon_max_parallelism=3)
    for _ in range(4):
        ctx.task((4,), [])
    hs = [t for t in ctx.tasks().values() if t.kind == tg.HORIZON]
    assert len(hs) == 1
    assert len(hs[0].deps) == 4


def test_side_effects_and_collective_groups_serialize():
    ctx = GraphContext(1)
    t1 = ctx.task((1,), [], kind=tg.HOST_COMPUTE, side_effects=[7])
    t2 = ctx.task((1,), [], kind=tg.HOST_COMPUTE, side_effects=[7])
    t3 = ctx.task((1,), [], kind=tg.HOST_COMPUTE, side_effects=[8])
    assert ctx.tasks()[t2.id].deps[t1.id] == ("true", tg.ORIGIN_SIDE_EFFECT)
    assert t1.id not in ctx.tasks()[t3.id].deps
    c1 = ctx.task((1,), [], kind=tg.COLLECTIVE, collective_group=1)
    c2 = ctx.task((1,), [], kind=tg.COLLECTIVE, collective_group=1)
    assert ctx.tasks()[c2.id].deps[c1.id] == ("true", tg.ORIGIN_COLLECTIVE)


def test_pruning_forgets_tasks_behind_the_epoch():
    ctx = GraphContext(1, horizon_step=1)
    b = ctx.buffer((16,), host_init=True)
    for _ in range(20):
        ctx.task((16,), [(b, rm.one_to_one(), RW)])
    before = ctx.tm.num_live_tasks
    last_h = max(t.id for t in ctx.tasks().values() if t.kind == tg.HORIZON)
    ctx.tm.prune_before(last_h)
    assert ctx.tm.num_live_tasks < before
    assert ctx.tm.num_live_tasks <= 6
    # new tasks still get correct dependencies after pruning
    t = ctx.task((16,), [(b, rm.one_to_one(), R)])
    (dep_id, (kind, _)), = ctx.tasks()[t.id].deps.items()
    assert kind == "true" and dep_id in ctx.tasks()


def test_task_records_are_plain_dicts():
    import json
    ctx = GraphContext(1)
    b = ctx.buffer((8,))
    t = ctx.task((8,), [(b, rm.one_to_one(), DW)], name="w")
    rec = ctx.task_record(t.id)
    json.dumps(rec)
    assert rec["kind"] == "device_compute" and rec["name"] == "w" and rec["range"] == [8]
    assert rec["accesses"] == [{"buffer": b, "mode": "discard_write", "region": [[[0], [8]]]}]
    assert rec["deps"][0]["kind"] == "true" and rec["deps"][0]["origin"] == "last_epoch"


def test_overwriting_after_a_horizon_is_ordered_after_readers_since_the_last_write():
    """A read between a horizon's creation and its promotion to epoch still orders a later
    overwrite after it (the write-after-read edge), although the read depended on the real
    writer and not on the horizon that later represents it."""
    ctx = GraphContext(1, horizon_step=2)
    a = ctx.buffer((16,))
    c = ctx.buffer((16,), host_init=True)
    w = ctx.task((16,), [(a, rm.one_to_one(), DW)])
    for _ in range(2):
        ctx.task((16,), [(c, rm.one_to_one(), RW)])
    readers = [ctx.task((16,), [(a, rm.all(), R), (c, rm.one_to_one(), RW)]) for _ in range(3)]
    horizons = [r["id"] for r in ctx.tm.recorder.tasks if r["kind"] == "horizon"]
    assert len(horizons) >= 2 and readers[0].id > horizons[0]   # the readers' writer gets collapsed
    over = ctx.task((16,), [(a, rm.one_to_one(), DW)])
    deps = ctx.task_record(over.id)["deps"]
    assert {d["id"] for d in deps if d["kind"] == "anti"} >= {r.id for r in readers}
    assert w.id not in {d["id"] for d in deps}


def _stream(names):
    tm = tg.TaskManager()
    for i, name in enumerate(names):
        tm.submit(tg.HOST_COMPUTE, name=name, geometry=tg.TaskGeometry(1, (1,), (0,), (1,)))
    return tm


def test_divergence_digest_is_bounded_and_the_rest_still_hashed():
    """A program that never waits must not grow the epoch digest without bound (it is kept
    in memory and sent to the neighbour rank); tasks past the limit are still compared by
    the stream hash, and the digest says where its listing stops; the pending tasks are the
    newest DIGEST_LIMIT."""
    from executor.mpi.divergence import _describe, _first_difference
    n = tg.DIGEST_LIMIT + 50
    names = [f"k{i % 7}" for i in range(n)]
    a = _stream(names)
    changed = list(names)
    changed[tg.DIGEST_LIMIT + 20] = "other"
    b = _stream(changed)
    pend, pend_b = a.pending_digest(), b.pending_digest(after=0)
    horizons = sum(1 for t in a.tasks.values() if t.kind == tg.HORIZON)
    # the pending tasks past the limit: the newest DIGEST_LIMIT, without a gap, so the
    # difference past the first DIGEST_LIMIT is found at a fence too
    assert len(pend) == tg.DIGEST_LIMIT and [e[0] for e in pend] == list(range(pend[0][0], pend[0][0] + len(pend)))
    assert pend[-1][0] == a.next_task_id - 1
    ea_, eb_ = _first_difference([tuple(e) for e in pend], [tuple(e) for e in pend_b])
    assert (ea_[2], eb_[2]) == (names[tg.DIGEST_LIMIT + 20], "other")
    ea, eb = a.epoch(), b.epoch()
    more = ea.digest[-1]
    assert more[1] == tg.DIGEST_MORE and more[0] == ea.digest[-2][0] + 1
    assert "compared by hash only" in _describe(tuple(more))
    assert len(ea.digest) == tg.DIGEST_LIMIT + 1 and ea.digest[-1][1] == tg.DIGEST_MORE
    assert ea.digest == eb.digest            # the listed part agrees ...
    assert _first_difference([tuple(e) for e in ea.digest], [tuple(e) for e in eb.digest]) is None
    assert ea.stream_hash != eb.stream_hash  # ... and the difference past it is still found
    same = _stream(names).epoch()
    assert same.stream_hash == ea.stream_hash
    assert a.pending_digest() == [] and horizons > 0


def test_without_a_stream_the_graph_is_the_same_and_nothing_is_kept_to_compare():
    """A single rank has no neighbour to compare its task stream with: its task manager
    keeps neither the stream hash nor the digests (~90 opcodes of every commit), and
    builds the same tasks with the same dependencies."""
    def build(stream: bool):
        tm = tg.TaskManager(stream=stream, horizon_step=2)
        tm.create_buffer(0, (8,), "float32", "a", True)
        geom = tg.TaskGeometry(1, (8,), (0,), (8,))
        for i in range(6):
            tm.submit(tg.DEVICE_COMPUTE, name=f"k{i % 2}", geometry=geom,
                      accesses=[tg.BufferAccess(0, RW if i % 2 else R, rm.one_to_one())])
        ep = tm.epoch()
        return tm, ep, {t.id: (t.kind, dict(t.deps)) for t in tm.tasks.values()}

    kept, ep_kept, graph_kept = build(True)
    bare, ep_bare, graph_bare = build(False)
    assert graph_bare == graph_kept
    # (the buffer, then every task since the init epoch: the 6 and their horizons)
    assert ep_kept.stream_hash != 0 and len(ep_kept.digest) == 1 + sum(t.kind != tg.EPOCH for t in kept.tasks.values())
    assert ep_bare.stream_hash == 0 and ep_bare.digest == [] and bare.pending_digest() == []
    assert bare.stream_checkpoints()[2] == [] and kept.stream_checkpoints()[2] != []


def test_only_a_runtime_with_neighbours_keeps_the_task_stream():
    import celeritas as cl
    from celeritas.testing import run_cluster
    q = cl.Queue(devices="host:1")
    try:
        assert q.runtime.task_manager.stream is False
    finally:
        q.shutdown()

    def program(rank):
        q = cl.Queue()
        return q.runtime.task_manager.stream

    assert run_cluster(program, nodes=2, devices=1, timeout=60) == [True, True]


def test_a_buffer_destroyed_while_horizons_collapse_the_access_maps(monkeypatch):
    """A cl.Buffer's finalizer can run on the application thread in the middle of any loop
    (the cyclic GC collects it there; the runtime's lock is re-entrant) and destroy its buffer.
    Applying a horizon iterated the task manager's access maps directly, so a buffer destroyed
    meanwhile raised 'dictionary changed size during iteration' (seen once, under mpiexec): it
    now iterates over a copy and skips what is gone."""
    ctx = GraphContext(1, horizon_step=1)
    bufs = [ctx.buffer((8,)) for _ in range(3)]
    for b in bufs:
        ctx.task((8,), [(b, rm.one_to_one(), DW)])
    tm = ctx.tm
    victim = bufs[2]
    original = tg._collapse_task_access

    def collapse_and_collect(value, eid):
        if victim in tm._access:
            tm.destroy_buffer(victim)     # (what Buffer.__del__ -> Runtime.destroy_buffer does)
        return original(value, eid)
    monkeypatch.setattr(tg, "_collapse_task_access", collapse_and_collect)
    for _ in range(3):
        ctx.task((8,), [(bufs[0], rm.one_to_one(), R), (bufs[1], rm.one_to_one(), R)])
    assert victim not in tm._access and bufs[0] in tm._access and bufs[1] in tm._access
    assert len([t for t in tm.tasks.values() if t.kind == tg.HORIZON]) >= 1


def test_pending_digest_after_the_epoch_before_the_latest_lists_the_latest_epoch_in_between():
    """The divergence check asks for the tasks after the last epoch its executor saw; an
    epoch submitted since (the application at q.wait(), the executor blocked before it) is
    listed in between, followed by what came after it; asked after any other epoch (or
    none), only what came after the latest."""
    tm = tg.TaskManager()
    k = tm.submit(tg.HOST_COMPUTE, name="k", geometry=tg.TaskGeometry(1, (4,), (0,), (1,)))
    e = tm.epoch()
    f = tm.fence()
    assert tm.pending_digest() == [(f.id, tg.FENCE, "fence", (), ())]
    assert tm.pending_digest(after=0) == [(k.id, tg.HOST_COMPUTE, "k", (4,), ()), (e.id, tg.EPOCH, tg.EPOCH_NONE, (), ()),
                                          (f.id, tg.FENCE, "fence", (), ())]
    assert tm.pending_digest(after=e.id) == tm.pending_digest()


def _digest_and_hash(**kw):
    """The digest entries and stream hash of: a buffer (``host_initialized`` from kw), a
    collective/host task over it with kw's collective group, side effects and reductions,
    and an epoch."""
    tm = tg.TaskManager()
    tm.create_buffer(0, (4,), "float64", "b", kw.pop("host_initialized", True))
    tm.create_buffer(1, (1,), "float64", "c", True)
    kind = tg.COLLECTIVE if kw.get("collective_group") is not None else tg.HOST_COMPUTE
    tm.submit(kind, name="t", geometry=tg.TaskGeometry(1, (2,), (0,), (1,)), **kw)
    e = tm.epoch()
    return [tuple(x) for x in e.digest], e.stream_hash


@pytest.mark.parametrize("a, b", [
    ({"collective_group": 1}, {"collective_group": 2}),
    ({"side_effects": [0]}, {}),
    ({"side_effects": [0]}, {"side_effects": [1]}),
    ({"reductions": [tg.Reduction(1, 1, None, 0, True)]}, {}),
    ({"reductions": [tg.Reduction(1, 1, None, 0, True)]}, {"reductions": [tg.Reduction(1, 1, None, 0, False)]}),
    ({"host_initialized": True}, {"host_initialized": False}),
], ids=["group", "side_effect", "other_host_object", "reduction", "reduction_init", "host_data"])
def test_digest_entries_and_stream_hash_cover_groups_side_effects_reductions_and_host_data(a, b):
    """Tasks (or buffers) that differ only in their collective group, side effects on host
    objects, reductions or a buffer's initial host data change the graph; their digest
    entries differ (so a stalled fence finds them, naming the task), and so do the stream
    hashes (the epoch comparison).  Before, the entries left all of them out, and the hash
    side effects and reductions."""
    from executor.mpi.divergence import _describe_pair, _first_difference, _norm_entry
    da, ha = _digest_and_hash(**a)
    db, hb = _digest_and_hash(**b)
    assert ha != hb
    diff = _first_difference([_norm_entry(e) for e in da], [_norm_entry(e) for e in db])
    assert diff is not None
    wa, wb = _describe_pair(*diff)
    assert wa != wb
    assert _digest_and_hash(**dict(a)) == _digest_and_hash(**dict(a))


def test_digest_entries_name_groups_side_effects_reductions_and_host_data_in_words():
    """Where two entries differ only there, the divergence message names them."""
    from executor.mpi.divergence import _describe_pair, _first_difference, _norm_entry

    def words(a, b):
        da, _ = _digest_and_hash(**a)
        db, _ = _digest_and_hash(**b)
        return _describe_pair(*_first_difference([_norm_entry(e) for e in da], [_norm_entry(e) for e in db]))
    assert words({"collective_group": 1, "side_effects": [3]}, {"collective_group": 2}) == (
        "T1 (collective 't', range [2], no buffer accesses, in collective group 1, side effect on host object H3)",
        "T1 (collective 't', range [2], no buffer accesses, in collective group 2)")
    into, fresh = tg.Reduction(1, 1, None, 0, True), tg.Reduction(1, 1, None, 0, False)
    assert words({"reductions": [into]}, {"reductions": [fresh]}) == (
        "T1 (host_compute 't', range [2], no buffer accesses, reduction into B1 (its value included))",
        "T1 (host_compute 't', range [2], no buffer accesses, reduction into B1)")
    assert words({"host_initialized": True}, {"host_initialized": False}) == (
        "buffer B0 float64 of shape (4,), with data (made before T1)",
        "buffer B0 float64 of shape (4,), without data (made before T1)")


def test_stream_checkpoints_agree_where_streams_agree_and_stay_complete_when_trimmed():
    """Folds fall at every epoch and after every 1024 stream entries: two task managers fed
    the same tasks list the same (task id, hash) checkpoints; one fed a renamed first task
    lists other hashes at the same ids; with the oldest ones dropped (FOLDS_KEPT), the list
    says from which id on it is complete."""
    def fed(first: str, n: int = 5000, kept: int | None = None):
        tm = tg.TaskManager()
        if kept is not None:
            tm.FOLDS_KEPT = kept
        geom = tg.TaskGeometry(1, (4,), (0,), (1,))
        for i in range(n):
            tm.submit(tg.HOST_COMPUTE, name=first if i == 0 else "k", geometry=geom)
        return tm, tm.stream_checkpoints()
    tm, (lo, hi, folds) = fed("k")
    assert (lo, hi) == (0, tm.next_task_id - 2) and folds[0] == (0, folds[0][1]) and len(folds) >= 5
    assert fed("k")[1] == (lo, hi, folds)
    _tm, (_lo, _hi, other) = fed("renamed")
    assert [t for t, _h in other] == [t for t, _h in folds] and other[0] == folds[0]
    assert all(h != h2 for (_t, h), (_t2, h2) in zip(other[1:], folds[1:], strict=True))
    tm, (lo2, hi2, trimmed) = fed("k", kept=1)
    assert lo2 > 0 and hi2 == hi and trimmed and trimmed == [f for f in folds if f[0] >= lo2]
    assert [f for f in folds if lo2 <= f[0] < trimmed[0][0]] == []
