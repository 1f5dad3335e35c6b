"""Adversarial probes of host objects, side effects, host tasks, collective groups, fences
and waits: what a hostile or confused user does with them.

Host objects of odd things (None, a lock, a generator, a numpy array, objects whose
``__deepcopy__`` raises, replaces itself or calls the queue), side effects ordered across
many tasks, ranks and placements, fences of host objects (a snapshot, per docs/api.md),
collective groups interleaved, made in loops, used once, passed between, failing on one
rank; ranged host tasks over ranges that do not divide, zero-size ranges; host tasks that
block on an event the application sets later; exceptions of every kind.  Results are
checked against a plain-Python model; every error must be a ``cl.*Error`` naming what was
wrong, never a hang, an "internal error" or silently wrong data.

The first group are the defects probing found (each was a strict xfail, fixed since; the
docstring gives Input / Happened / Expected).  The others pin probes that already behaved
well and are not pinned elsewhere (tests/test_errors.py covers queue calls inside tasks and
destroyed host objects, tests/test_fence_snapshot.py the basic snapshot,
tests/test_api_probing.py a lock in a host object and custom BaseExceptions).
"""
from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import celeritas as cl
from celeritas.testing import run_cluster

pytestmark = pytest.mark.timeout(120)

T = 30     # seconds a fence result may take before the test calls it a hang


def _append(h, value, *, name=None, **where):
    """A command group whose host task appends ``value`` (or ``value(partition)``) to the
    list in host object ``h``."""
    def cgf(cgh):
        lst = cl.side_effect(h, cgh)
        cgh.host_task(lambda p: lst.append(value(p) if callable(value) else value), name=name, **where)
    return cgf


class _Halt(BaseException):
    """A BaseException of the user's own."""


# =====================================================================================
# Defects found by probing (fixed): each asserts what the rule requires
# =====================================================================================

@pytest.mark.parametrize("exc", [_Halt, KeyboardInterrupt, SystemExit])
def test_a_deepcopy_raising_a_base_exception_fails_the_fence_naming_the_host_object(queue, exc):
    """Input: q.fence(HostObject(obj)) where obj.__deepcopy__ raises a BaseException
    (_Halt, KeyboardInterrupt, SystemExit).
    Happened: cl.CeleritasError "rank 0: internal error: Halt: no copy" (only Exception was
    caught around the snapshot; the rest escaped the executor's fence handler).
    Expected: the fence's documented error: 'fence of host object H.. cannot be copied ...
    __deepcopy__', the original as __cause__."""
    class NoCopy:
        def __deepcopy__(self, memo):
            raise exc("no copy")

    with pytest.raises(cl.CeleritasError, match=r"fence of host object H\d+ .*NoCopy cannot be copied.*"
                                                rf"{exc.__name__}.*__deepcopy__") as ei:
        queue.fence(cl.HostObject(NoCopy())).result(timeout=T)
    assert "internal error" not in str(ei.value)
    assert isinstance(ei.value.__cause__, exc)


@pytest.mark.parametrize("lookahead", ["none", "infinite"])
def test_a_host_task_replacing_the_object_is_what_later_fences_show(queue, lookahead):
    """Input: HostObject(0) (an int cannot change in place); five host tasks with a side
    effect on it do ``h.obj += 1``; fences after the second and the last.
    Happened: both fences returned 0 (the executor copied the object the host object was
    made with, while h.obj was 5): silently wrong data.
    Expected: the fences show 2 and 5, as a plain-Python model does."""
    queue.set_lookahead(lookahead)
    h = cl.HostObject(0)

    def bump(cgh):
        cl.side_effect(h, cgh)

        def task(p):
            h.obj += 1
        cgh.host_task(task, name="bump")

    fences = []
    for i in range(5):
        queue.submit(bump)
        if i in (1, 4):
            fences.append(queue.fence(h))
    assert [f.result(timeout=T) for f in fences] == [2, 5]
    assert h.obj == 5


def test_replacing_the_object_before_the_first_task_is_what_tasks_and_fences_use(queue):
    """Input: h = HostObject([]); h.obj = [42] on the application thread before any task;
    a host task appends 1 through cl.side_effect; q.fence(h).
    Happened: the fence returned [] (the replaced list) while h.obj was [42, 1].
    Expected: [42, 1]."""
    h = cl.HostObject([])
    h.obj = [42]
    queue.submit(_append(h, 1))
    assert queue.fence(h).result(timeout=T) == [42, 1]


@pytest.mark.parametrize("call", ["wait", "fence", "submit", "HostObject"])
def test_a_deepcopy_calling_the_queue_fails_the_fence_instead_of_hanging(queue, call):
    """Input: a host object whose __deepcopy__ calls q.wait() / q.fence(b) / q.submit(...) /
    cl.HostObject() (it runs on the executor thread, for the fence's snapshot).
    Happened: q.wait() there waited for the executor thread itself: the fence, every later
    wait and shutdown hung forever (only 'has waited 10 s' warnings).
    Expected: the fence fails with a cl.CeleritasError naming the host object and the call,
    as the same call from a host task does."""
    b = cl.Buffer(np.zeros(2), name="b")
    calls = {"wait": lambda: queue.wait(), "fence": lambda: queue.fence(b),
             "submit": lambda: queue.submit(lambda cgh: cgh.host_task(lambda p: None)),
             "HostObject": lambda: cl.HostObject(1)}

    class Sneaky:
        def __deepcopy__(self, memo):
            calls[call]()
            return Sneaky()

    label = {"wait": r"q\.wait\(\)", "fence": r"q\.fence\(\)", "submit": r"q\.submit\(\)",
             "HostObject": r"cl\.HostObject\(\)"}[call]
    with pytest.raises(cl.CeleritasError, match=rf"fence of host object H\d+ .*{label} inside the Sneaky's "
                                                r"__deepcopy__.*would wait for itself"):
        queue.fence(cl.HostObject(Sneaky())).result(timeout=T)


def test_a_collective_group_made_inside_a_host_task_is_refused(queue):
    """Input: cl.CollectiveGroup() inside a host task.
    Happened: accepted; its id was drawn on a lane thread, racing the application thread's
    groups, so ranks could number their groups differently.
    Expected: cl.KernelError at wait() saying cl.CollectiveGroup() is refused inside host
    task 'makes_group', as cl.HostObject() is."""
    queue.submit(lambda cgh: cgh.host_task(lambda p: cl.CollectiveGroup(), name="makes_group"))
    with pytest.raises(cl.CeleritasError, match=r"cl\.CollectiveGroup\(\) inside host task 'makes_group'"):
        queue.wait()


def test_a_collective_group_of_a_shut_down_runtime_is_refused():
    """Input: g = cl.CollectiveGroup() with one queue; q.shutdown(); a new queue and its
    own group; a collective host task on=cl.collective(g).
    Happened: accepted: g's id (2) was the new group's id too, so the two groups silently
    shared one order and communicator.
    Expected: a cl.CeleritasError at submit saying g belongs to a runtime that was shut
    down (as a host object of a shut-down runtime is refused)."""
    q = cl.Queue(devices="host:1")
    old = cl.CollectiveGroup()
    q.shutdown()
    q2 = cl.Queue(devices="host:1")
    try:
        new = cl.CollectiveGroup()
        assert new.id == old.id     # (why it mattered)
        with pytest.raises(cl.CeleritasError, match=r"cl.collective\(<cl.CollectiveGroup 2>\).*shut down"):
            q2.submit(lambda cgh: cgh.host_task(lambda p: None, on=cl.collective(old)))
        done = []
        q2.submit(lambda cgh: cgh.host_task(lambda p: done.append(p.comm.size), on=cl.collective(new)))
        q2.wait()
        assert done == [1]
    finally:
        q2.shutdown()


def test_a_host_object_holding_the_queue_and_handles_can_be_fenced(queue):
    """Input: HostObject({"q": queue, "b": buffer, "g": CollectiveGroup(), "h": HostObject(5)}),
    fenced.
    Happened: cl.CeleritasError "its dict cannot be copied ... cannot pickle '_thread.RLock'"
    (the Queue was deep-copied with its runtime; Buffer and HostObject are handles that copy
    as themselves).
    Expected: the snapshot is a new dict holding the same queue, buffer, group and host object."""
    b = cl.Buffer(np.zeros(3), name="b")
    g = cl.CollectiveGroup()
    inner = cl.HostObject(5)
    state = {"q": queue, "b": b, "g": g, "h": inner, "n": [1]}
    got = queue.fence(cl.HostObject(state)).result(timeout=T)
    assert got is not state and got["n"] == [1] and got["n"] is not state["n"]
    assert got["q"] is queue and got["b"] is b and got["g"] is g and got["h"] is inner


def test_on_a_collective_group_says_to_write_cl_collective(queue):
    """Input: host_task(fn, on=group) with a cl.CollectiveGroup.
    Happened: 'takes cl.on_master_node, cl.collective or cl.once, got <celeritas.handler.
    CollectiveGroup object at 0x7f..>'.
    Expected: a cl.CeleritasError saying to write on=cl.collective(group)."""
    g = cl.CollectiveGroup()
    with pytest.raises(cl.CeleritasError, match=r"on=cl\.collective\(<cl\.CollectiveGroup \d+>\)"):
        queue.submit(lambda cgh: cgh.host_task(lambda p: None, on=g))


def test_a_dry_run_fence_of_an_uncopyable_host_object_fails_the_fence(monkeypatch):
    """Input: CELERITAS_DRY_RUN_NODES=2, q.fence(HostObject(threading.Lock())).
    Happened: "rank 0: internal error: TypeError: cannot pickle '_thread.lock' object" (the
    dry run's stand-in executor copied it on the scheduler thread, unguarded), and the
    runtime stopped.
    Expected: the fence's cl.CeleritasError naming the host object, as without a dry run,
    and the queue keeps working."""
    monkeypatch.setenv("CELERITAS_DRY_RUN_NODES", "2")
    q = cl.Queue(devices="host:1")
    try:
        with pytest.raises(cl.CeleritasError, match=r"fence of host object H\d+ .*lock cannot be copied"):
            q.fence(cl.HostObject(threading.Lock())).result(timeout=T)
        assert q.fence(cl.HostObject([3])).result(timeout=T) == [3]
    finally:
        q.shutdown()


# =====================================================================================
# Probes that already behave well
# =====================================================================================

@pytest.mark.parametrize("make, expected", [
    (lambda: cl.HostObject(), None),
    (lambda: cl.HostObject(None), None),
    (lambda: cl.HostObject((1, [2])), (1, [2])),
    (lambda: cl.HostObject(np.arange(3)), [0, 1, 2]),
], ids=["default", "none", "tuple", "ndarray"])
def test_fence_of_odd_but_copyable_host_objects(queue, make, expected):
    """Input: HostObject() / (None) / a tuple / a numpy array, fenced untouched.
    Expected: an equal value."""
    got = queue.fence(make()).result(timeout=T)
    assert (got.tolist() if isinstance(got, np.ndarray) else got) == expected


def test_fence_of_a_generator_host_object_names_it(queue):
    """Input: HostObject(a generator), fenced.  Expected: cl.CeleritasError naming the host
    object and the generator type."""
    with pytest.raises(cl.CeleritasError, match=r"fence of host object H\d+ .*generator cannot be copied"):
        queue.fence(cl.HostObject(x for x in range(3))).result(timeout=T)


def test_a_numpy_host_object_mutated_in_order_matches_the_model(queue):
    """Input: HostObject(np.zeros(6)); task i sets a[i] = a[i-1] + i (each reads what the
    previous task wrote).  Expected: the running sums, as sequential Python computes them."""
    h = cl.HostObject(np.zeros(6))
    for i in range(6):
        def cgf(cgh, i=i):
            a = cl.side_effect(h, cgh)
            cgh.host_task(lambda p: a.__setitem__(i, (a[i - 1] if i else 0) + i))
        queue.submit(cgf)
    model = np.cumsum(np.arange(6.0))
    np.testing.assert_array_equal(queue.fence(h).result(timeout=T), model)


def test_a_custom_deepcopy_decides_what_the_fence_shows(queue):
    """Input: an object whose __copy__ raises and whose __deepcopy__ returns a summary.
    Expected: the fence returns the summary (deepcopy never calls __copy__)."""
    class Log:
        def __init__(self):
            self.lines = []

        def __copy__(self):
            raise RuntimeError("shallow copies are not allowed")

        def __deepcopy__(self, memo):
            return ("summary", len(self.lines))

    h = cl.HostObject(Log())

    def add_line(cgh):
        log = cl.side_effect(h, cgh)
        cgh.host_task(lambda p: log.lines.append(1))

    for _ in range(3):
        queue.submit(add_line)
    assert queue.fence(h).result(timeout=T) == ("summary", 3)


def test_side_effect_twice_on_one_object_in_one_command_group(queue):
    """Input: cl.side_effect(h, cgh) twice in one command group.  Expected: both return the
    same object, the task runs once, in order with the others."""
    h = cl.HostObject([])

    def twice(cgh):
        a, b = cl.side_effect(h, cgh), cl.side_effect(h, cgh)
        assert a is b
        cgh.host_task(lambda p: (a.append("x"), b.append("y")))

    queue.submit(_append(h, 0))
    queue.submit(twice)
    queue.submit(_append(h, 1))
    assert queue.fence(h).result(timeout=T) == [0, "x", "y", 1]


def test_two_host_tasks_in_one_command_group_are_refused(queue):
    """Input: one command group declaring two host tasks on one host object.
    Expected: cl.CeleritasError from submit; the host object is untouched."""
    h = cl.HostObject([])

    def two(cgh):
        lst = cl.side_effect(h, cgh)
        cgh.host_task(lambda p: lst.append(1))
        cgh.host_task(lambda p: lst.append(2))

    with pytest.raises(cl.CeleritasError):
        queue.submit(two)
    assert queue.fence(h).result(timeout=T) == []


def test_side_effects_on_two_host_objects_in_one_command_group(queue):
    """Input: a host task with side effects on h1 and h2, between tasks on each alone.
    Expected: each object sees its own tasks in submission order."""
    h1, h2 = cl.HostObject([]), cl.HostObject([])

    def both(cgh):
        a, b = cl.side_effect(h1, cgh), cl.side_effect(h2, cgh)
        cgh.host_task(lambda p: (a.append("both"), b.append("both")))

    queue.submit(_append(h1, 1))
    queue.submit(_append(h2, 2))
    queue.submit(both)
    queue.submit(_append(h1, 3))
    assert queue.fence(h1).result(timeout=T) == [1, "both", 3]
    assert queue.fence(h2).result(timeout=T) == [2, "both"]


@pytest.mark.parametrize("lookahead", ["none", "auto", "infinite"])
def test_fences_in_a_loop_are_snapshots_of_the_model(queue, lookahead):
    """Input: 40 host tasks appending i, a fence after every 7th, then a mutation of a fence
    result.  Expected: each fence holds exactly the prefix submitted before it; mutating a
    result changes neither later fences nor the object."""
    queue.set_lookahead(lookahead)
    h = cl.HostObject([])
    fences = []
    for i in range(40):
        queue.submit(_append(h, i))
        if i % 7 == 6:
            fences.append((i, queue.fence(h)))
    first = fences[0][1].result(timeout=T)
    first.append("mutated")
    for i, f in fences[1:]:
        assert f.result(timeout=T) == list(range(i + 1))
    queue.wait()
    assert h.obj == list(range(40))


def test_destroying_a_host_object_with_tasks_pending_keeps_their_order(queue):
    """Input: a host task blocked on an event, a fence, h.destroy(), then the event set.
    Expected: the task still runs, the fence taken before destroy() shows its append."""
    h = cl.HostObject([])
    ev = threading.Event()

    def slow(cgh):
        lst = cl.side_effect(h, cgh)
        cgh.host_task(lambda p: (ev.wait(T), lst.append("ran")))

    queue.submit(slow)
    fut = queue.fence(h)
    h.destroy()
    ev.set()
    assert fut.result(timeout=T) == ["ran"]
    with pytest.raises(cl.AccessError, match=r"host object H\d+ was destroyed"):
        queue.submit(_append(h, 1))


def test_host_objects_dropped_after_submit_still_run_their_tasks(queue):
    """Input: 20 host objects made in a loop, each given two tasks and then dropped (the
    garbage collector destroys them).  Expected: all 40 tasks ran, each object's in order."""
    seen, lock = [], threading.Lock()
    for i in range(20):
        h = cl.HostObject([])

        def cgf(cgh, i=i, h=h, step=0):
            lst = cl.side_effect(h, cgh)

            def task(p):
                lst.append(len(lst))
                with lock:
                    seen.append((i, list(lst)))
            cgh.host_task(task)
        queue.submit(cgf)
        queue.submit(cgf)
        del h, cgf
        gc.collect()
    queue.wait()
    assert sorted(seen) == sorted([(i, [0]) for i in range(20)] + [(i, [0, 1]) for i in range(20)])


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, GeneratorExit, StopIteration])
def test_a_host_task_raising_any_base_exception_is_a_kernel_error(queue, exc):
    """Input: a host task on a host object raising KeyboardInterrupt / SystemExit /
    GeneratorExit / StopIteration, then a fence of the object.  Expected: cl.KernelError
    naming host task 'raises' and rank 0 at the fence, the original as __cause__; the
    runtime then gives the same error at wait()."""
    h = cl.HostObject([])

    def cgf(cgh):
        cl.side_effect(h, cgh)

        def task(p):
            raise exc("from the host task")
        cgh.host_task(task, name="raises")

    queue.submit(cgf)
    with pytest.raises(cl.KernelError, match=rf"host task 'raises' of task T\d+ failed on rank 0.*{exc.__name__}") as ei:
        queue.fence(h).result(timeout=T)
    assert isinstance(ei.value.__cause__, exc)
    with pytest.raises(cl.KernelError, match="'raises'"):
        queue.wait()


def test_a_host_task_exception_that_does_not_format_is_a_kernel_error(queue):
    """Input: a master-node host task raising an exception whose __str__ raises.
    Expected: cl.KernelError naming the host task, no internal error."""
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("cannot print me")

    def task(p):
        raise Unprintable()

    queue.submit(lambda cgh: cgh.host_task(task, on=cl.on_master_node, name="mute"))
    with pytest.raises(cl.KernelError, match=r"host task 'mute'.*Unprintable whose str\(\) raised") as ei:
        queue.wait()
    assert "internal error" not in str(ei.value)


def test_partitions_on_one_rank(queue):
    """Input (1 rank, 2 devices): collective, default, on_master_node, ranged and 2-D ranged
    host tasks recording their partition.  Expected: the documented boxes and global ranges;
    comm only for the collective (size 1, allreduce of one value is that value)."""
    h = cl.HostObject([])
    queue.submit(_append(h, lambda p: ("coll", p.box, p.global_range, p.comm.size, p.comm.rank, p.comm.allreduce(5)),
                         on=cl.collective))
    queue.submit(_append(h, lambda p: ("plain", p.box, p.global_range, p.comm)))
    queue.submit(_append(h, lambda p: ("once", p.box, p.comm), on=cl.once))
    queue.submit(_append(h, lambda p: ("master", p.box, p.global_range, p.comm), on=cl.on_master_node))
    queue.submit(_append(h, lambda p: ("ranged", p.box), range=(5,)))
    queue.submit(_append(h, lambda p: ("2d", p.box, p.rank), range=(3, 5)))
    got = queue.fence(h).result(timeout=T)
    assert got == [("coll", cl.Box((0,), (1,)), (1,), 1, 0, 5), ("plain", cl.Box((0,), (1,)), (1,), None),
                   ("once", cl.Box((0,), (1,)), None), ("master", cl.Box((), ()), (), None),
                   ("ranged", cl.Box((0,), (5,))), ("2d", cl.Box((0, 0), (3, 5)), 0)]


@pytest.mark.parametrize("rng, on", [((0,), None), ((3, 0), None), ((0,), cl.on_master_node)],
                         ids=["empty_1d", "empty_2d", "empty_master"])
def test_host_tasks_over_an_empty_range_run_nowhere(queue, rng, on):
    """Input: a host task over an empty range (plain or on_master_node) between two others.
    Expected: it runs no partition (as a kernel over an empty range) and the order holds."""
    h = cl.HostObject([])
    queue.submit(_append(h, "before"))
    queue.submit(_append(h, "empty", range=rng, on=on))
    queue.submit(_append(h, "after"))
    assert queue.fence(h).result(timeout=T) == ["before", "after"]


def test_ranged_host_tasks_that_do_not_divide_cover_the_range_once():
    """Input (3 ranks, 2 devices each): a host task over range 7 writes 10*i + rank into a
    buffer, then one over (5, 3).  Expected: partitions 3, 2, 2 (one per rank, not per
    device), the buffer as a model of that split, every index covered once."""
    def program(rank):
        q = cl.Queue()
        h = cl.HostObject([])
        b = cl.Buffer(np.zeros(7, dtype=np.int64), name="b")

        def cgf(cgh):
            lst = cl.side_effect(h, cgh)
            w = b.access(cgh, cl.one_to_one(), cl.write)

            def task(p):
                lst.append((p.offset, p.range))
                w[p.slices] = np.arange(p.offset[0], p.offset[0] + p.range[0]) * 10 + p.rank
            cgh.host_task(task, range=(7,))

        q.submit(cgf)
        q.submit(_append(h, lambda p: p.box, range=(5, 3)))
        return q.fence(h).result(timeout=T), q.fence(b).result(timeout=T).tolist()

    got = run_cluster(program, nodes=3, devices=2, timeout=90)
    parts = [g[0][0] for g in got]
    assert parts == [((0,), (3,)), ((3,), (2,)), ((5,), (2,))]
    owner = [0, 0, 0, 1, 1, 2, 2]
    assert all(g[1] == [10 * i + owner[i] for i in range(7)] for g in got)
    boxes = [g[0][1] for g in got]
    assert sum(bx.area for bx in boxes) == 15 and all(bx.range[1] == 3 for bx in boxes)


def test_master_node_writes_then_kernels_read_on_three_ranks():
    """Input (3 ranks): an on_master_node host task discard-writes a buffer, a kernel maps it
    one_to_one into another, a ranged master-node task overwrites the first 3 elements.
    Expected: every rank's fence equals the numpy model."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(shape=(10,), dtype=np.int64, name="mb")
        c = cl.Buffer(shape=(10,), dtype=np.int64, name="c")

        def write(cgh):
            a = b.access(cgh, cl.all(), cl.discard_write)
            cgh.host_task(lambda p: a.__setitem__(slice(None), np.arange(10) * (p.rank + 7)), on=cl.on_master_node)

        def double(cgh):
            r = b.access(cgh, cl.one_to_one(), cl.read)
            o = c.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((10,), lambda ch: o.__setitem__(ch, r[ch] * 2 + 1))

        def patch(cgh):
            a = c.access(cgh, cl.all(), cl.read_write)
            cgh.host_task(lambda p: a.__setitem__(slice(0, 3), a[0:3] - 100), on=cl.on_master_node, range=(10,))

        for cgf in (write, double, patch):
            q.submit(cgf)
        return q.fence(c).result(timeout=T).tolist()

    model = np.arange(10) * 7 * 2 + 1
    model[:3] -= 100
    assert run_cluster(program, nodes=3, devices=2, timeout=90) == [model.tolist()] * 3


def test_side_effect_order_across_ranks_and_placements():
    """Input (2 ranks): 12 tasks on one host object cycling on_master_node, range=(5,) and
    collective.  Expected: each rank's object lists exactly its own partitions' appends in
    submission order (master-node tasks on rank 0 only; each rank has its own object)."""
    def program(rank):
        q = cl.Queue()
        h = cl.HostObject([])
        for i in range(12):
            where = [{"on": cl.on_master_node}, {"range": (5,)}, {"on": cl.collective}][i % 3]
            q.submit(_append(h, lambda p, i=i: (i, p.rank, p.offset), **where))
        return q.fence(h).result(timeout=T)

    got = run_cluster(program, nodes=2, devices=2, timeout=90)
    model = [[], []]
    for i in range(12):
        if i % 3 == 0:
            model[0].append((i, 0, ()))
        elif i % 3 == 1:
            model[0].append((i, 0, (0,)))
            model[1].append((i, 1, (3,)))
        else:
            model[0].append((i, 0, (0,)))
            model[1].append((i, 1, (1,)))
    assert got == model


def test_interleaved_collective_groups_keep_their_own_order():
    """Input (3 ranks): groups a and b and the default group, 8 rounds each of a collective
    host task doing allreduce(round * (rank + 1)) and allgather(rank), no side effects.
    Expected: every rank sees 6 * round in each group, in submission order, and the
    gathers [0, 1, 2]."""
    def program(rank):
        q = cl.Queue()
        ga, gb = cl.CollectiveGroup(), cl.CollectiveGroup()
        got = {"a": [], "b": [], "default": []}
        lock = threading.Lock()
        for i in range(8):
            for key, place in (("a", cl.collective(ga)), ("default", cl.collective), ("b", cl.collective(gb))):
                def task(p, key=key, i=i):
                    v = (p.comm.allreduce(i * (p.rank + 1)), p.comm.allgather(p.rank), p.comm.size)
                    with lock:
                        got[key].append(v)
                q.submit(lambda cgh, task=task, place=place: cgh.host_task(task, on=place))
        q.wait()
        return got

    want = [(6 * i, [0, 1, 2], 3) for i in range(8)]
    for got in run_cluster(program, nodes=3, devices=1, timeout=90):
        assert got == {"a": want, "b": want, "default": want}


def test_collective_groups_made_in_a_loop_and_used_once_in_reverse():
    """Input (2 ranks): six groups made in a loop, used once each in reverse order with a side
    effect, then three throwaway groups with a barrier each, then wait(barrier=True).
    Expected: the host object lists (i, allreduce) in submission order on both ranks."""
    def program(rank):
        q = cl.Queue()
        h = cl.HostObject([])
        groups = [cl.CollectiveGroup() for _ in range(6)]
        for i, g in enumerate(reversed(groups)):
            q.submit(_append(h, lambda p, i=i: (i, p.comm.allreduce(i * (p.rank + 1))), on=cl.collective(g)))
        for _ in range(3):
            g = cl.CollectiveGroup()
            q.submit(lambda cgh, g=g: cgh.host_task(lambda p: p.comm.barrier(), on=cl.collective(g)))
        q.wait(barrier=True)
        return q.fence(h).result(timeout=T)

    want = [(i, 3 * i) for i in range(6)]
    assert run_cluster(program, nodes=2, devices=1, timeout=90) == [want, want]


def test_a_host_object_shared_by_two_collective_groups():
    """Input (2 ranks): one host object, collective tasks alternating between groups a and b,
    each appending (i, allreduce(len(list))).  Expected: the side effect orders them across
    groups: lengths 0..5, so allreduce gives 2 * i."""
    def program(rank):
        q = cl.Queue()
        ga, gb = cl.CollectiveGroup(), cl.CollectiveGroup()
        h = cl.HostObject([])
        for i in range(6):
            def cgf(cgh, i=i, g=(ga if i % 2 else gb)):
                lst = cl.side_effect(h, cgh)
                cgh.host_task(lambda p: lst.append((i, p.comm.allreduce(len(lst)))), on=cl.collective(g))
            q.submit(cgf)
        return q.fence(h).result(timeout=T)

    want = [(i, 2 * i) for i in range(6)]
    assert run_cluster(program, nodes=2, devices=1, timeout=90) == [want, want]


@pytest.mark.parametrize("peers", ["barrier", "return"])
def test_a_collective_host_task_failing_on_one_rank_names_it_and_nobody_hangs(peers):
    """Input (3 ranks): a collective host task that raises on rank 1 while the others enter
    comm.barrier() (or return).  Expected: run_cluster raises cl.KernelError naming the host
    task and rank 1, within the timeout (the peers are released, not left in the barrier)."""
    def program(rank):
        q = cl.Queue()

        def task(p):
            if p.rank == 1:
                raise ValueError("rank one fails")
            if peers == "barrier":
                p.comm.barrier()
        q.submit(lambda cgh: cgh.host_task(task, on=cl.collective, name="coll"))
        q.wait()

    with pytest.raises(cl.KernelError, match=r"host task 'coll' of task T\d+ failed on rank 1.*rank one fails"):
        run_cluster(program, nodes=3, devices=1, timeout=60)


@pytest.mark.parametrize("mode", ["wait", "barrier", "fence"])
def test_waits_barriers_and_fences_in_a_loop_with_host_tasks(mode):
    """Input (2 ranks): 6 rounds of a kernel incrementing a buffer, a ranged host task adding
    its partition's sum of the buffer to a host object, then q.wait() / q.wait(barrier=True)
    / a fence of the host object each round.  Expected: the host object equals the model on
    every rank (each rank sums its own half)."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(8, dtype=np.int64), name="b")
        h = cl.HostObject([])
        seen = []
        for step in range(6):
            def inc(cgh):
                w = b.access(cgh, cl.one_to_one(), cl.read_write)
                cgh.parallel_for((8,), lambda c: w.__setitem__(c, w[c] + 1))

            def total(cgh, step=step):
                r = b.access(cgh, cl.one_to_one(), cl.read)
                lst = cl.side_effect(h, cgh)
                cgh.host_task(lambda p: lst.append((step, int(r[p.slices].sum()))), range=(8,))
            q.submit(inc)
            q.submit(total)
            if mode == "fence":
                seen.append(q.fence(h).result(timeout=T)[-1])
            else:
                q.wait(barrier=(mode == "barrier"))
        return q.fence(h).result(timeout=T), seen

    got = run_cluster(program, nodes=2, devices=2, timeout=90)
    for rank, (lst, seen) in enumerate(got):
        lo = 4 * rank
        model = [(s, sum(range(lo, lo + 4)) + 4 * (s + 1)) for s in range(6)]
        assert lst == model
        assert seen == (model if seen else [])


def test_a_host_task_waiting_for_the_application_within_the_throttle_bounds(queue):
    """Input: a host task blocks on a threading.Event; the application then submits 300
    kernels (past CELERITAS_PAUSE_AHEAD's bounded pauses, within CELERITAS_MAX_TASKS_AHEAD)
    and flushes, and only then sets the event.  Expected: no deadlock; the kernels' result
    and the host object equal the model.  (Fencing an unrelated buffer *before* setting the
    event may wait for the host task: horizons join the whole front, as in Celerity; the
    docs say so.)"""
    ev = threading.Event()
    h = cl.HostObject([])

    def blocks(cgh):
        lst = cl.side_effect(h, cgh)
        cgh.host_task(lambda p: lst.append(ev.wait(T)), name="blocks")

    queue.submit(blocks)
    b = cl.Buffer(np.zeros(4), name="b")
    for _ in range(300):
        def inc(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for((4,), lambda c: w.__setitem__(c, w[c] + 1))
        queue.submit(inc)
    queue.flush()
    ev.set()
    assert queue.fence(b).result(timeout=T).tolist() == [300.0] * 4
    assert queue.fence(h).result(timeout=T) == [True]


def test_lookahead_changes_and_flush_with_a_host_task_pending(queue):
    """Input: lookahead 'infinite', a host task that blocks on an event, flush(), then
    set_lookahead('none') and ('auto') while it is still blocked, then the event.
    Expected: the mode changes return, the task ran once, later tasks follow it in order."""
    queue.set_lookahead("infinite")
    ev = threading.Event()
    h = cl.HostObject([])

    def blocks(cgh):
        lst = cl.side_effect(h, cgh)
        cgh.host_task(lambda p: (lst.append("started"), lst.append(ev.wait(T))))

    queue.submit(blocks)
    queue.flush()
    queue.set_lookahead("none")
    queue.submit(_append(h, "next"))
    queue.set_lookahead("auto")
    ev.set()
    assert queue.fence(h).result(timeout=T) == ["started", True, "next"]


def test_collective_with_none_is_the_default_group_and_a_placement_is_not_a_group(queue):
    """Input: cl.collective(None); cl.collective(cl.collective).  Expected: the first runs in
    the default group; the second is a cl.CeleritasError naming what it got."""
    h = cl.HostObject([])
    queue.submit(_append(h, lambda p: p.comm.size, on=cl.collective(None)))
    assert queue.fence(h).result(timeout=T) == [1]
    with pytest.raises(cl.CeleritasError, match="cl.collective\\(group\\) takes a cl.CollectiveGroup\\(\\), got _Collective"):
        cl.collective(cl.collective)


def test_each_rank_fences_its_own_host_object():
    """Input (2 ranks): HostObject(rank-independent list); master-node task appends, a ranged
    task appends its offset.  Expected: rank 0's snapshot has both, rank 1's only its own
    ranged append; neither sees the other's object."""
    def program(rank):
        q = cl.Queue()
        h = cl.HostObject(["made"])
        q.submit(_append(h, "master", on=cl.on_master_node))
        q.submit(_append(h, lambda p: p.offset, range=(4,)))
        return q.fence(h).result(timeout=T)

    assert run_cluster(program, nodes=2, devices=1, timeout=60) == [["made", "master", (0,)], ["made", (2,)]]
