"""Cases restated from the smaller files of the C++ Celerity runtime's test suite:
``test/utils_tests.cc``, ``test/print_utils_tests.cc``, ``test/intrusive_graph_tests.cc``,
``test/named_threads_tests.cc``, ``test/thread_queue_tests.cc``,
``test/double_buffered_queue_tests.cc``, ``test/affinity_tests.cc``,
``test/runtime_deprecation_tests.cc``, ``test/test_utils_tests.cc``, and the one case of
``test/system/distr_tests.cc`` that test_celerity_restated_system.py had not restated.

Each test names the Celerity TEST_CASE it restates and pins the celeritas concept that case
is about:

* utils: the name a kernel gets from the Python object it is (Celerity's simplified type
  name), and the escaping of names in Graphviz labels;
* print_utils: how device lists, byte sizes and durations read in messages and summaries;
* intrusive_graph: ``Task.add_dep`` / ``Command.add_dep`` (a true dependency wins over an
  anti-dependency, never the other way), forgetting tasks behind an epoch (Celerity's node
  destruction), and the critical path length that triggers horizons;
* named_threads: the names of the runtime's threads (scheduler, executor, lane workers,
  simulated ranks) as ``threading.enumerate()`` and py-spy show them;
* thread_queue: the host backend's lane workers (celeritas's thread queues): order, results
  (a job's exception), execution times, skipping dependent work after a failure;
* double_buffered_queue: the hand-off queues between the threads (the executor's inbox, the
  scheduler's event queue);
* the rest as each test says.

Fixtures map as in the other restated files: a ``runtime_fixture`` becomes ``run_cluster``
(each program gets its own runtime, shut down when it returns), ``log_contains_*`` becomes
pytest's ``caplog``, ``scoped_test_environment`` becomes ``run_cluster``'s keywords or
``config.from_env`` with an explicit mapping.

Cases with no celeritas equivalent (no test written):

* utils_tests.cc "replace_all replaces all occurrences of a pattern in string": a C++ string
  helper; Python's ``str.replace`` is the language's own.
* print_utils_tests.cc "throughputs are correctly stringified as_decimal_throughput()":
  celeritas prints no throughput anywhere (its summary and trace report bytes and times).
* intrusive_graph_tests.cc, the ``remove_dependency`` and ``has_dependent`` halves of "correctly
  handles adding and removing of": celeritas nodes hold their dependencies' ids only (no
  dependents list, no removal of one edge); what a node's removal must guarantee is restated
  as the pruning case below.
* named_threads_tests.cc, the application thread's name in "thread names are set": celeritas
  never renames the user's own thread (it is the program's, not the runtime's); the simulated
  ranks' application threads are named, and that is tested.
* affinity_tests.cc, all 19 cases (pinning environment parsing, warnings about too few
  cores, pinning the application / scheduler / executor / submission threads, restoring
  masks, Windows processor groups): celeritas pins no thread.  Its threads take turns on the
  GIL, so pinning each to its own core would buy nothing Celerity's pinning buys; placement
  is left to the OS and to ``mpiexec --bind-to``.  The one behaviour a user who carries
  ``CELERITY_THREAD_PINNING`` habits over can meet is restated: the variable is reported as
  no celeritas setting instead of being silently ignored.
* runtime_deprecation_tests.cc "any number of distr_queues can be created", "new distr_queues
  can be created after the last one has been destroyed", "distr_queue implicitly initializes
  the runtime": celeritas has one queue type and no deprecated spelling of it; the same cases
  for ``cl.Queue`` are restated in test_celerity_restated_runtime.py
  (test_any_number_of_queues_share_one_runtime, test_dropping_every_queue_keeps_the_runtime_*,
  test_the_first_queue_buffer_or_host_object_starts_the_runtime).
* runtime_deprecation_tests.cc "get_access can still be called on a const buffer": Python has
  no const; the non-const case is test_celerity_restated_runtime.py::
  test_an_accessor_records_one_buffer_access_in_its_task.
* test_utils_tests.cc "tests that log messages in excess of level::info from a secondary
  thread abort" (a manual, aborting case): what it relies on, that a warning logged on a runtime
  thread reaches the program's logging with that thread's name, is restated instead.
"""
from __future__ import annotations

import functools
import logging
import re
import threading
import time

import numpy as np
import pydot
import pytest

import celeritas as cl
from celeritas import config as cfg
from celeritas.config import ConfigError, DeviceSpec
from celeritas.graphs import fmt_bytes
from celeritas.handler import kernel_name
from celeritas.testing import run_cluster
from executor.backends.backend import BackendError, Lane, LaneSkipped
from executor.backends.host import HostBackend
from executor.executor import _Inbox
from scheduler import command_graph as cg
from scheduler import task_graph as tg
from scheduler.geometry import Subrange
from scheduler.instruction_graph_generator import SystemInfo
from scheduler.scheduler import Scheduler

from graph_context import GraphContext

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 60   # every run_cluster: a hang is a failure, not a stuck suite
R, W, RW, DW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE


def _task_names(program_body, **env) -> list[str]:
    """Names of the compute tasks ``program_body(q)`` submits, from the task graph record."""
    def program(rank):
        q = cl.Queue(record=True)
        program_body(q)
        q.wait()
        return [t["name"] for t in q.graphs()["tasks"] if t["kind"] not in ("epoch", "horizon")]

    return run_cluster(program, nodes=1, timeout=TIMEOUT, **env)[0]


# =================================================================================================
# utils_tests.cc
# =================================================================================================
def stencil_kernel(chunk):
    """A module-level kernel function (Celerity: a plain kernel name class)."""


class Smooth:
    """A kernel given as a callable object (Celerity: a kernel functor type)."""

    def __call__(self, chunk):
        pass


class Space:
    class NestedKernel:
        """A callable class nested in another (Celerity: ``space<...>::nested_kernel<...>``)."""

        def __call__(self, chunk):
            pass


def _scaled(chunk, factor):
    pass


def set_identity():
    """Returns a kernel defined inside a function (Celerity's ``set_identity_kernel``, a class
    local to a lambda inside a function template)."""
    def set_identity_kernel(chunk):
        pass
    return set_identity_kernel


@pytest.mark.parametrize("kernel,want", [
    (stencil_kernel, "stencil_kernel"),
    (set_identity(), "set_identity_kernel"),
    (Smooth(), "Smooth"),
    (Space.NestedKernel(), "NestedKernel"),
    (functools.partial(_scaled, factor=2), "_scaled"),
    (functools.partial(functools.partial(_scaled), factor=2), "_scaled"),
    (lambda chunk: None, "<lambda>"),
], ids=["function", "nested_function", "callable_object", "nested_class", "partial", "partial_of_partial",
        "lambda"])
def test_a_kernel_without_a_name_is_named_after_what_it_is(kernel, want):
    """utils_tests.cc "name strings are correctly extracted from types": Celerity names an
    unnamed kernel after its type, stripped of namespaces, enclosing classes and template
    arguments ("name3<...>", "nested_kernel<...>").  A celeritas kernel is a Python object: a
    function or a lambda is named by its ``__name__`` (without the enclosing function's
    qualification), a callable object by its class's own name (without enclosing classes), a
    ``functools.partial`` by the function it wraps.  The name is the task's in the graph
    records (and so in graph dumps, traces and error messages).

    Before: a callable object and a ``functools.partial`` have no ``__name__``, and their tasks
    had the empty name, so graphs, traces and a failing kernel's error message could not say
    which kernel it was."""
    def body(q):
        q.submit(lambda cgh: cgh.parallel_for((4,), kernel))

    assert _task_names(body) == [want]


class Failing:
    """A callable-object kernel that raises."""

    def __call__(self, chunk):
        raise ValueError("bad chunk")


def test_a_failing_callable_object_kernel_is_named_in_the_error():
    """utils_tests.cc "name strings are correctly extracted from types", where the name
    matters most: the ``cl.KernelError`` of a failing kernel given as a callable object names
    the kernel by its class (before: ``kernel 'kernel'``, a placeholder)."""
    def program(rank):
        q = cl.Queue()
        q.submit(lambda cgh: cgh.parallel_for((4,), Failing()))
        try:
            q.wait()
        except cl.KernelError as exc:
            return str(exc)
        return None

    msg = run_cluster(program, nodes=1, timeout=TIMEOUT)[0]
    assert msg is not None and "'Failing'" in msg and "bad chunk" in msg


def test_a_name_given_to_parallel_for_wins_over_the_kernels_own():
    """utils_tests.cc "name strings are correctly extracted from types", the other half of
    Celerity's rule: a kernel name given explicitly (Celerity's ``parallel_for<KernelName>``)
    is used as given, whatever the kernel object is; ``cl.Kernel`` source kernels are named
    after their entry point."""
    src = cl.Kernel(source={"cuda": "__global__ void entry() {}"}, name="entry")

    def body(q):
        q.submit(lambda cgh: cgh.parallel_for((4,), Smooth(), name="given"))
        q.submit(lambda cgh: cgh.host_task(functools.partial(_scaled, factor=1), name="host_given"))

    assert _task_names(body) == ["given", "host_given"]
    assert kernel_name(src) == "entry"      # (a source kernel runs on GPU backends only)


def test_names_are_escaped_in_every_graph_dump():
    """utils_tests.cc "escaping of invalid characters for dot labels": ``hello<bla&>`` must
    appear as ``hello&lt;bla&amp;&gt;`` in a Graphviz label.  A kernel and a buffer named with
    ``<``, ``>``, ``&`` and ``"`` appear escaped in the task, command and instruction graphs,
    and each graph still parses as DOT."""
    def program(rank):
        q = cl.Queue(record=True)
        b = cl.Buffer(np.zeros(8, np.float32), name='hello<bla&>"')

        def cgf(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.write)
            cgh.parallel_for((8,), lambda c: w.__setitem__(c, 1), name='k<"1">&')

        q.submit(cgf)
        q.wait()
        g = q.graphs()
        names = {0: b.name}
        return [g.to_dot_tasks(names), g.to_dot_commands(names), g.to_dot_instructions(names)]

    dots = run_cluster(program, nodes=1, timeout=TIMEOUT)[0]
    for dot in dots:
        parsed = pydot.graph_from_dot_data(dot)
        assert parsed is not None and len(parsed) == 1
        assert "hello&lt;bla&amp;&gt;&quot;" in dot
        assert "hello<bla" not in dot
    assert "k&lt;&quot;1&quot;&gt;&amp;" in dots[0]


# =================================================================================================
# print_utils_tests.cc
# =================================================================================================
@pytest.mark.parametrize("text,canonical,backend", [
    ("host:3", "host:3", "host"),
    ("HOST", "host:1", "host"),
    (" cuda ", "cuda", "cuda"),
    ("cuda:0,2", "cuda:0,2", "cuda"),
    ("opencl", "opencl", "opencl"),
    ("opencl:0:1,1:0", "opencl:0:1,1:0", "opencl"),
])
def test_a_device_list_prints_as_the_setting_that_gives_it(text, canonical, backend):
    """print_utils_tests.cc "sycl_backend_type is correctly stringified": a backend prints by
    its name.  A celeritas device list (``CELERITAS_DEVICES``, ``Queue(devices=)``) prints as
    the canonical setting that parses back to the same list, so a message that shows it can be
    pasted into the environment."""
    spec = DeviceSpec.parse(text)
    assert spec.backend == backend
    assert str(spec) == canonical
    assert DeviceSpec.parse(str(spec)) == spec


def test_the_runtime_reports_its_backend_by_name(caplog):
    """print_utils_tests.cc "sycl_backend_type is correctly stringified", where a user sees
    it: the start-up message (log level info) names the backend and device count ("host
    backend with 2 device(s)"), and the runtime's ``backend_name`` is the name
    ``CELERITAS_DEVICES`` spells it with."""
    def program(rank):
        q = cl.Queue()
        return q.runtime.backend_name, q.num_devices

    with caplog.at_level(logging.INFO, logger="celeritas"):
        assert run_cluster(program, nodes=1, devices=2, timeout=TIMEOUT,
                           CELERITAS_LOG_LEVEL="info") == [("host", 2)]
    assert any("host backend with 2 device(s)" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("n,text", [
    (0, "0 bytes"),
    (512, "512 bytes"),
    (1023, "1023 bytes"),
    (1024, "1.0 KiB"),
    (123_456, "120.6 KiB"),
    (1 << 20, "1.0 MiB"),
    (3 << 30, "3.0 GiB"),
    (10 ** 15, "909.5 TiB"),
    ((1 << 20) - 1, "1.0 MiB"),
    (1 << 50, "1.0 PiB"),
    (1 << 60, "1024.0 PiB"),
])
def test_sizes_print_in_binary_units(n, text):
    """print_utils_tests.cc "sizes are correctly stringified as_decimal_size()": Celerity
    prints 123456 bytes as "123.46 kB".  celeritas prints sizes in binary units with one
    decimal (memory is allocated in powers of two), and under 1 KiB as a byte count.

    Before: graph labels and the summary printed "512 bytes" while the timeline's tooltips
    printed "512 B" from a second formatter of their own; 2**50 bytes printed as "1024.0 PiB"
    (a division short) and 2**20 - 1 bytes as "1024.0 KiB"."""
    assert fmt_bytes(n) == text


def test_the_timeline_prints_sizes_as_the_graphs_do():
    """print_utils_tests.cc "sizes are correctly stringified as_decimal_size()": one spelling
    of a size everywhere; the execution timeline's transfer tooltips use the graphs' formatter.

    Before: the timeline had its own formatter ("512 B", "1.0 KiB" for 1024) beside the
    graphs' ("512 bytes")."""
    from celeritas import timeline
    assert not hasattr(timeline, "_fmt_bytes")
    assert timeline.fmt_bytes is fmt_bytes


def test_the_summary_prints_durations_in_milliseconds_and_sizes_in_binary_units(capsys):
    """print_utils_tests.cc "durations are correctly stringified as_sub_second()" and "sizes
    are correctly stringified as_decimal_size()", where celeritas prints them: the shutdown
    summary (``CELERITAS_SUMMARY=1``) gives lane busy times and the executor's run and idle
    times in milliseconds with three decimals, and the bytes copied as a size."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(256, dtype=np.float32))

        def cgf(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for((256,), lambda c: w.__setitem__(c, w[c] + 1), name="inc")

        q.submit(cgf)
        return q.fence(b).result().sum()

    assert run_cluster(program, nodes=1, devices=2, timeout=TIMEOUT, CELERITAS_SUMMARY="1") == [
        float(np.arange(256).sum() + 256)]
    err = capsys.readouterr().err
    assert "busy time per lane" in err
    assert re.search(r"device D0 lane 0\s*│\s*\d+\s*│\s*\d+\.\d{3} ms", err), err
    assert re.search(r"R0\s*│\s*\d+\.\d{3} ms\s*│\s*\d+\.\d{3} ms\s*│\s*\d+\.\d{3} ms", err), err
    assert re.search(r"bytes copied\s*│?\s*\d+(\.\d)? (bytes|KiB)", err), err


# =================================================================================================
# intrusive_graph_tests.cc
# =================================================================================================
def _tasks(n: int) -> list[tg.Task]:
    return [tg.Task(i, tg.DEVICE_COMPUTE) for i in range(n)]


def test_a_true_dependency_is_recorded_with_its_kind_and_origin():
    """intrusive_graph_tests.cc "intrusive_graph_node correctly handles adding and removing
    of", true dependencies: after adding a true dataflow dependency n0 -> n1, n0 has exactly
    that dependency, of that kind and origin, and one more step on its critical path."""
    n0, n1 = _tasks(2)
    n0.add_dep(n1, tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)
    assert n0.deps == {1: (tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)}
    assert n0.has_true_dep()
    assert n1.deps == {}


@pytest.mark.parametrize("make", [lambda i: tg.Task(i, tg.DEVICE_COMPUTE),
                                  lambda i: cg.ExecutionCommand(i, tg.Task(100 + i, tg.DEVICE_COMPUTE))],
                         ids=["task", "command"])
def test_an_anti_dependency_is_upgraded_to_a_true_one(make):
    """intrusive_graph_tests.cc "... adding and removing of", true dependencies, second block:
    n0 anti-depends on n1 and truly depends on n2; then a true dependency on n1 and an anti one
    on n2 are added.  n0 now truly depends on both (the anti-dependency on n1 became true, and
    the true one on n2 was not downgraded), with the origin of the true edge.  Holds for tasks
    and for commands alike."""
    n0, n1, n2 = make(0), make(1), make(2)
    n0.add_dep(n1, tg.ANTI_DEP, tg.ORIGIN_DATAFLOW)
    n0.add_dep(n2, tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)
    assert n0.deps[1] == (tg.ANTI_DEP, tg.ORIGIN_DATAFLOW)
    n0.add_dep(n1, tg.TRUE_DEP, tg.ORIGIN_SIDE_EFFECT)
    n0.add_dep(n2, tg.ANTI_DEP, tg.ORIGIN_DATAFLOW)
    assert n0.deps == {1: (tg.TRUE_DEP, tg.ORIGIN_SIDE_EFFECT), 2: (tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)}


@pytest.mark.parametrize("make", [lambda i: tg.Task(i, tg.DEVICE_COMPUTE),
                                  lambda i: cg.ExecutionCommand(i, tg.Task(100 + i, tg.DEVICE_COMPUTE))],
                         ids=["task", "command"])
def test_a_true_dependency_is_never_downgraded(make):
    """intrusive_graph_tests.cc "... adding and removing of", anti-dependencies: a true
    dependency stays true when an anti-dependency on the same node is added, and adding the
    true one again changes nothing (no duplicate edge, the first origin kept)."""
    n0, n1 = make(0), make(1)
    n0.add_dep(n1, tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)
    n0.add_dep(n1, tg.ANTI_DEP, tg.ORIGIN_DATAFLOW)
    assert n0.deps == {1: (tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)}
    n0.add_dep(n1, tg.TRUE_DEP, tg.ORIGIN_COLLECTIVE)
    assert n0.deps == {1: (tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)}


def test_a_task_graph_dependency_upgrade_through_two_accesses():
    """intrusive_graph_tests.cc "... adding and removing of", as the task manager meets it: a
    task that discard-writes buffer A (anti-dependency on A's reader) and reads buffer B, which
    that same reader wrote (true dependency), has one dependency on the reader, a true one."""
    ctx = GraphContext(1, compile_ranks=[])
    a = ctx.buffer((16,), host_init=True)
    b = ctx.buffer((16,))
    reader = ctx.task((16,), [(a, cl.all(), R), (b, cl.one_to_one(), DW)])
    t = ctx.task((16,), [(a, cl.one_to_one(), DW), (b, cl.all(), R)])
    assert ctx.tasks()[t.id].deps == {reader.id: (tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)}


def test_forgotten_tasks_leave_no_dependency_behind():
    """intrusive_graph_tests.cc "intrusive_graph_node removes itself from all connected nodes
    upon destruction": Celerity destroys the nodes behind an epoch and each removes itself from
    its neighbours.  celeritas forgets the tasks behind the epoch for new tasks once the executor
    reached a later horizon (``prune_before``); what must hold is that nothing submitted later
    depends on a forgotten task: their dependencies are collapsed onto the epoch.  A chain of
    read_write tasks (horizon step 2) generates horizons; after pruning, the forgotten ids are
    gone, and new readers, writers and an unrelated task depend only on live tasks."""
    ctx = GraphContext(1, compile_ranks=[], horizon_step=2)
    buf = ctx.buffer((16,), host_init=True)
    other = ctx.buffer((16,), host_init=True)
    first = ctx.task((16,), [(other, cl.one_to_one(), RW)])
    for _ in range(8):
        ctx.task((16,), [(buf, cl.one_to_one(), RW)])
    horizons = sorted(t.id for t in ctx.tasks().values() if t.kind == tg.HORIZON)
    assert len(horizons) >= 3
    eft = ctx.tm.epoch_for_new_tasks
    assert eft is not None and eft.kind == tg.HORIZON
    ctx.tm.prune_before(horizons[-1])
    assert min(ctx.tasks()) == eft.id
    assert first.id not in ctx.tasks()
    new = [ctx.task((16,), [(buf, cl.all(), R)]),
           ctx.task((16,), [(other, cl.one_to_one(), RW)]),     # its last writer was forgotten
           ctx.task((16,), [(buf, cl.one_to_one(), DW)]),
           ctx.task((4,), [])]
    for t in new:
        assert t.deps, t
        assert all(d in ctx.tasks() for d in t.deps), (t.id, t.deps, sorted(ctx.tasks()))
    assert new[1].deps == {eft.id: (tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)}


def test_the_pseudo_critical_path_length_counts_the_longest_chain_of_dependencies():
    """intrusive_graph_tests.cc "intrusive_graph_node keeps track of the pseudo critical path
    length": a node without dependencies has length 0; depending on n2 makes n3's length 1;
    depending on n0 as well keeps 1; once n1 depends on n0 and n3 on n1, n3's length is 2.
    ("Pseudo": the length is computed when a dependency is added and never revised later.)"""
    n0, n1, n2, n3 = _tasks(4)
    assert n3.critical_path_length == 0
    n3.add_dep(n2, tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)
    assert n3.critical_path_length == 1
    n3.add_dep(n0, tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)
    assert n3.critical_path_length == 1
    n1.add_dep(n0, tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)
    n3.add_dep(n1, tg.TRUE_DEP, tg.ORIGIN_DATAFLOW)
    assert n3.critical_path_length == 2


def test_the_critical_path_length_of_submitted_tasks_drives_the_horizons():
    """intrusive_graph_tests.cc "... keeps track of the pseudo critical path length", where the
    length matters: in the task graph a chain of read_write tasks has lengths 1, 2, 3 (the init
    epoch is 0; the first task depends on it), a task beside the chain has length 1, the task
    records carry the length, and the first horizon comes when the chain is ``horizon_step``
    (3) longer than at the init epoch."""
    ctx = GraphContext(1, compile_ranks=[], horizon_step=3)
    buf = ctx.buffer((8,), host_init=True)
    chain = [ctx.task((8,), [(buf, cl.one_to_one(), RW)]) for _ in range(2)]
    beside = ctx.task((8,), [])
    assert [t.critical_path_length for t in chain] == [1, 2]
    assert beside.critical_path_length == 1
    assert not any(t.kind == tg.HORIZON for t in ctx.tasks().values())
    third = ctx.task((8,), [(buf, cl.one_to_one(), RW)])
    assert third.critical_path_length == 3
    assert ctx.task_record(third.id)["critical_path_length"] == 3
    horizons = [t for t in ctx.tasks().values() if t.kind == tg.HORIZON]
    assert len(horizons) == 1 and horizons[0].id == third.id + 1
    assert horizons[0].critical_path_length == 4
    assert set(horizons[0].deps) == {third.id, beside.id}


# =================================================================================================
# named_threads_tests.cc
# =================================================================================================
@pytest.mark.parametrize("lane,name", [
    (Lane("device", 0, 0), "D0.lane0"),
    (Lane("device", 13, 2), "D13.lane2"),
    (Lane("host", None, 0), "host.lane0"),
    (Lane("host", None, 42), "host.lane42"),
])
def test_lanes_have_names_that_say_which_device_and_queue(lane, name):
    """named_threads_tests.cc "semantic thread type enum entries can be constructed and turned
    into strings": Celerity's thread types print as "cy-dev-sub-13", "cy-host-42".  A celeritas
    lane (the in-order queue a thread, stream or command queue serves) is named after its
    device and index; the name labels its worker thread, its trace track and its summary row."""
    assert lane.name == name


def test_the_runtime_threads_are_named_after_their_role_and_rank():
    """named_threads_tests.cc "thread names are set": after a wait, the scheduler and executor
    threads of every rank run under the names ``celeritas-scheduler-<rank>`` and
    ``celeritas-executor-<rank>``; a simulated rank's own application thread is
    ``celeritas-rank-<rank>``; a collective host task ran on a host lane's worker (Celerity
    checks "cy-host-" there) and the kernel on
    device 0's, each named after its lane and rank (inline execution off, so no work runs on
    the executor thread itself).  With two simulated ranks in one process, every name is
    different, so a py-spy dump tells the ranks' threads apart.

    Before: the lane workers of both ranks were named alike (``celeritas-D0.lane0``)."""
    barrier = threading.Barrier(2)

    def program(rank):
        q = cl.Queue()
        seen = cl.HostObject([])
        b = cl.Buffer(shape=(8,), dtype=np.float32)
        kernel_threads = []

        def kernel(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.discard_write)

            @cgh.parallel_for((8,), name="k")
            def k(chunk):
                w[chunk] = 1
                kernel_threads.append(threading.current_thread().name)

        def host(cgh):
            s = cl.side_effect(seen, cgh)
            cgh.host_task(lambda part: s.append(threading.current_thread().name), on=cl.collective)

        q.submit(kernel)
        q.submit(host)
        q.wait()
        barrier.wait(TIMEOUT)     # both ranks' threads are alive now
        live = sorted(t.name for t in threading.enumerate() if t.name.startswith("celeritas-"))
        barrier.wait(TIMEOUT)
        return threading.current_thread().name, kernel_threads, q.fence(seen).result(), live

    results = run_cluster(program, nodes=2, devices=1, timeout=TIMEOUT, CELERITAS_INLINE_US="0")
    for rank, (me, kernel_threads, host_threads, live) in enumerate(results):
        assert me == f"celeritas-rank-{rank}"
        assert set(kernel_threads) == {f"celeritas-D0.lane0-{rank}"}
        assert len(host_threads) == 1 and re.fullmatch(rf"celeritas-host\.lane\d+-{rank}", host_threads[0])
        for role in ("scheduler", "executor", "rank"):
            assert f"celeritas-{role}-{rank}" in live
        assert f"celeritas-D0.lane0-{rank}" in live
    live = results[0][3]
    assert len(live) == len(set(live)), live


def test_a_lane_worker_runs_its_work_on_a_thread_named_after_the_lane():
    """named_threads_tests.cc "thread_queue sets its thread name": work launched on a lane of
    the host backend runs on a thread named after the lane (and the rank the backend serves);
    without a rank (a backend used on its own) the name is the lane's alone."""
    for rank, suffix in ((None, ""), (3, "-3")):
        be = HostBackend(2, rank=rank)
        try:
            names = []
            lanes = [Lane("device", 1, 0), Lane("host", None, 2)]
            for lane in lanes:
                c = be.launch(lane, lambda: names.append(threading.current_thread().name))
                assert c.wait(TIMEOUT) and c.error() is None
            assert names == [f"celeritas-D1.lane0{suffix}", f"celeritas-host.lane2{suffix}"]
        finally:
            be.close()


def test_the_runtime_threads_end_with_the_runtime():
    """named_threads_tests.cc "thread names are set", the other side of a named thread's life:
    once the queue is shut down no thread of that runtime's is left (a leftover named thread
    would show up in a later py-spy dump as a live runtime)."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.zeros(4, np.float32))

        def cgf(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.write)
            cgh.parallel_for((4,), lambda c: w.__setitem__(c, 1))

        q.submit(cgf)
        q.wait()
        before = [t for t in threading.enumerate() if t.name.startswith("celeritas-")
                  and not t.name.startswith("celeritas-rank")]
        q.shutdown()
        return len(before), [t.name for t in before if t.is_alive()]

    (count, alive), = run_cluster(program, nodes=1, timeout=TIMEOUT, CELERITAS_INLINE_US="0")
    assert count >= 3 and alive == []


# =================================================================================================
# thread_queue_tests.cc
# =================================================================================================
def test_a_lane_runs_its_jobs_in_order_and_forwards_their_outcome():
    """thread_queue_tests.cc "thread_queue forwards job results": four jobs on one lane (one
    returning nothing, three returning values) complete in the order submitted, each without
    an error.  A celeritas lane's jobs write their results into allocations, so what a
    completion forwards is the job's outcome: a job that raises forwards its exception, and
    the next independent job on the same lane still runs."""
    be = HostBackend(1)
    lane = Lane("device", 0, 0)
    order = []
    try:
        def job(i, value=None):
            def run():
                order.append(i)
                return value
            return run

        jobs = [be.launch(lane, job(0)), be.launch(lane, job(1, None)), be.launch(lane, job(2, 16)),
                be.launch(lane, job(3, "64"))]

        def fail():
            order.append(4)
            raise ValueError("job 4 failed")

        bad = be.launch(lane, fail)
        after = be.launch(lane, job(5))
        for c in jobs + [bad, after]:
            assert c.wait(TIMEOUT) and c.is_done()
        assert order == [0, 1, 2, 3, 4, 5]
        assert [c.error() for c in jobs] == [None] * 4
        assert isinstance(bad.error(), ValueError) and str(bad.error()) == "job 4 failed"
        assert after.error() is None
    finally:
        be.close()


def test_a_lane_reports_when_each_job_ran():
    """thread_queue_tests.cc "thread_queue reports execution times when profiling is enabled":
    every completion of a host lane has a start and end time (celeritas always records them:
    they feed the trace and the executor's cost estimates); the times bracket what the job
    itself observed of the clock, and consecutive jobs on a lane do not overlap."""
    be = HostBackend(1)
    lane = Lane("host", None, 0)
    inside = []
    try:
        def job():
            t0 = time.perf_counter_ns()
            time.sleep(0.001)
            inside.append((t0, time.perf_counter_ns()))

        cs = [be.launch(lane, job), be.launch(lane, job)]
        for c in cs:
            assert c.wait(TIMEOUT)
        for c, (t0, t1) in zip(cs, inside):
            assert c.start_ns is not None and c.end_ns is not None
            assert c.start_ns <= t0 <= t1 <= c.end_ns
        assert cs[0].end_ns <= cs[1].start_ns
    finally:
        be.close()


def test_a_lane_skips_dependent_jobs_after_a_failure():
    """thread_queue_tests.cc "thread_queue forwards job results", the celeritas addition that
    the executor relies on: once a job on a lane failed, a job queued as ``dependent`` on it
    (it may read what the failed job should have written) is not run and its completion
    carries ``LaneSkipped``; independent jobs still run."""
    be = HostBackend(1)
    lane = Lane("device", 0, 1)
    ran = []
    try:
        def fail():
            raise RuntimeError("boom")

        first = be.launch(lane, fail)
        dep = be.launch(lane, lambda: ran.append("dependent"), dependent=True)
        indep = be.launch(lane, lambda: ran.append("independent"))
        for c in (first, dep, indep):
            assert c.wait(TIMEOUT)
        assert isinstance(first.error(), RuntimeError)
        assert isinstance(dep.error(), LaneSkipped) and "D0.lane1" in str(dep.error())
        assert indep.error() is None and ran == ["independent"]
    finally:
        be.close()


def test_a_closed_backend_refuses_new_work_and_ends_its_lane_threads():
    """thread_queue_tests.cc (a thread queue's lifetime, implied by both cases): closing the
    backend ends every lane worker thread; launching on a closed backend is a ``BackendError``
    saying it is closed, not a job that never completes."""
    be = HostBackend(1, rank=7)
    lane = Lane("host", None, 0)
    assert be.launch(lane, lambda: None).wait(TIMEOUT)
    threads = [t for t in threading.enumerate() if t.name == "celeritas-host.lane0-7"]
    assert len(threads) == 1
    be.close()
    assert not threads[0].is_alive()
    with pytest.raises(BackendError, match="closed"):
        be.launch(lane, lambda: None)


# =================================================================================================
# double_buffered_queue_tests.cc
# =================================================================================================
def _drain(box: _Inbox) -> list:
    out = []
    while not box.empty():
        out.append(box.get_nowait())
    return out


def test_the_executor_inbox_on_one_thread():
    """double_buffered_queue_tests.cc "double_buffered_queue works in a single-thread setup":
    the executor's inbox (the scheduler-to-executor hand-off) is empty at first; items come
    out in the order they went in, whatever was taken before; waiting on a non-empty inbox
    returns at once without losing an item; drained, it is empty again."""
    box = _Inbox()
    assert box.empty() and _drain(box) == []
    box.put(0)
    assert _drain(box) == [0]
    box.put(1)
    box.put(2)
    assert _drain(box) == [1, 2]
    for i in (3, 4, 5):
        box.put(i)
    box.wait(TIMEOUT)             # items are there: returns at once
    assert _drain(box) == [3, 4, 5]
    assert box.empty() and _drain(box) == []


def test_the_executor_inbox_hands_items_over_in_order_between_threads():
    """double_buffered_queue_tests.cc "double_buffered_queue provides ordered communication
    between threads": a producer puts 1, 2, 3 and then, each after the consumer said it took
    everything before, 4, then 5, then (after the consumer saw the inbox empty) 6 and 7.  The
    consumer, sleeping on the inbox between steps, gets every item once, in order, in the
    groups the handshakes force ([4], [5], [6, 7]); nothing appears while the producer
    waits.  Each wait has a generous timeout: a lost wake-up shows as a missing item."""
    box = _Inbox()
    state = 0
    cond = threading.Condition()
    got: list[list[int]] = []
    empty_when_idle: list[bool] = []

    def post(s):
        nonlocal state
        with cond:
            state = s
            cond.notify_all()

    def await_state(s):
        with cond:
            assert cond.wait_for(lambda: state == s, TIMEOUT)

    def take_until(last):
        items = []
        deadline = time.monotonic() + TIMEOUT
        while (not items or items[-1] != last) and time.monotonic() < deadline:
            box.wait(TIMEOUT)
            items += _drain(box)
        return items

    def producer():
        for i in (1, 2, 3):
            box.put(i)
        await_state(1)
        box.put(4)
        await_state(2)
        box.put(5)
        await_state(3)
        post(4)
        await_state(5)
        box.put(6)
        box.put(7)
        post(6)

    def consumer():
        got.append(take_until(3))
        post(1)
        got.append(take_until(4))
        post(2)
        got.append(take_until(5))
        post(3)
        await_state(4)
        empty_when_idle.append(box.empty())
        post(5)
        await_state(6)
        got.append(_drain(box))

    threads = [threading.Thread(target=producer), threading.Thread(target=consumer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads)
    assert got == [[1, 2, 3], [4], [5], [6, 7]]
    assert empty_when_idle == [True]


class _Delegate:
    """Collects the instruction batches the scheduler thread hands to the executor."""

    def __init__(self):
        self.batches = []

    def submit(self, batch):
        self.batches.append(batch)


def test_the_scheduler_thread_processes_events_in_the_order_posted():
    """double_buffered_queue_tests.cc "double_buffered_queue provides ordered communication
    between threads", the application-to-scheduler hand-off: tasks posted from the application
    thread while the scheduler thread runs are compiled in submission order, and a sync
    returns only once everything posted before it was processed."""
    dlg = _Delegate()
    sched = Scheduler(num_ranks=1, rank=0, system=SystemInfo(1), delegate=dlg, lookahead="none")
    sched.start()
    try:
        tm = tg.TaskManager(on_task=sched.notify_task, horizon_step=1000)
        info = tm.create_buffer(0, (8,), np.dtype(np.float32), "", True)
        sched.notify_buffer_created(info)
        tasks = [tm.submit(tg.DEVICE_COMPUTE, name=f"k{i}", geometry=tg.TaskGeometry(1, (8,), (0,), (1,)))
                 for i in range(20)]
        assert sched.sync(TIMEOUT)
        kernels = [i.task for b in dlg.batches for i in b.instructions if i.kind == "device_kernel"]
        assert kernels == [t.id for t in tasks]
    finally:
        sched.stop(TIMEOUT)


# =================================================================================================
# affinity_tests.cc
# =================================================================================================
def test_a_thread_pinning_setting_is_reported_as_no_celeritas_setting(caplog):
    """affinity_tests.cc "thread pinning environment is correctly parsed" (and its error
    handling case): celeritas pins no threads (see the module docstring), so a
    ``CELERITAS_THREAD_PINNING`` carried over from Celerity habits is logged as a variable
    celeritas does not read, rather than silently ignored or half-honoured; as a
    ``run_cluster`` keyword it is a ``ConfigError`` naming it."""
    with caplog.at_level(logging.WARNING, logger="celeritas"):
        config = cfg.from_env({"CELERITAS_THREAD_PINNING": "from:3", "CELERITAS_LOOKAHEAD": "none"})
    assert config.lookahead == "none"
    assert any("CELERITAS_THREAD_PINNING is not a celeritas setting and is ignored" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(ConfigError, match="CELERITAS_THREAD_PINNING='auto' is not a celeritas setting"):
        run_cluster(lambda rank: None, nodes=1, CELERITAS_THREAD_PINNING="auto")


# =================================================================================================
# runtime_deprecation_tests.cc
# =================================================================================================
def test_devices_can_be_chosen_by_the_first_queue_but_not_once_the_runtime_runs():
    """runtime_deprecation_tests.cc "an explicit device can be provided to distr_queue": a
    device list passed to the queue that starts the runtime is used ("before the runtime is
    initialized"); once the runtime runs on other devices, a queue asking for different ones
    is refused with a ``ConfigError`` that says what the runtime runs on ("but not once the
    runtime has been initialized"); asking for the devices it runs on is fine."""
    def program(rank):
        q = cl.Queue(devices="host:2")
        n = q.num_devices
        same = cl.Queue(devices="host:2").num_devices
        try:
            cl.Queue(devices="host:3")
        except ConfigError as exc:
            return n, same, str(exc)
        return n, same, None

    n, same, msg = run_cluster(program, nodes=1, timeout=TIMEOUT)[0]
    assert (n, same) == (2, 2)
    assert msg is not None and "already runs on host:2" in msg and "host:3" in msg


def test_a_host_task_may_write_a_variable_of_the_submitting_function():
    """runtime_deprecation_tests.cc "distr_queue::submit(allow_by_ref_t, ...) and creation of
    accessors/side-effects/reductions from const buffers/host-objects continues to work": a
    master-node host task (with a write-only accessor and a side effect) assigns 42 to a
    variable of the function that submitted it (Celerity needs ``allow_by_ref``; a Python
    closure always captures by reference), and a kernel with a read accessor and a sum
    reduction runs beside it; after ``wait`` the variable holds 42 on the master rank only and
    the reduction is 0 (nothing combined)."""
    def program(rank):
        q = cl.Queue()
        buf = cl.Buffer(shape=(32,), dtype=np.uint64)
        total = cl.Buffer(np.full(1, 7, np.uint64))
        ho = cl.HostObject(0)
        my_int = 33

        def host(cgh):
            acc = buf.access(cgh, cl.all(), cl.discard_write)
            se = cl.side_effect(ho, cgh)

            def fn(part):
                nonlocal my_int
                acc[0:32] = 1
                my_int = 42
            cgh.host_task(fn, on=cl.on_master_node)

        def kernel(cgh):
            acc = buf.access(cgh, cl.one_to_one(), cl.read)
            red = cl.reduction(total, cgh, cl.plus, initialize_to_identity=True)
            cgh.parallel_for((32,), lambda chunk, r: None, reductions=[red])

        q.submit(host)
        q.submit(kernel)
        q.wait()
        return my_int, int(q.fence(total).result()[0])

    assert run_cluster(program, nodes=2, timeout=TIMEOUT) == [(42, 0), (33, 0)]


def test_fences_of_a_buffer_a_subrange_and_a_host_object():
    """runtime_deprecation_tests.cc "experimental::fence continues to work": on a buffer
    holding 0..15, a fence of the whole buffer gives 0..15 (shape (16,)), a fence of the
    subrange at 8 of extent 8 gives 8..15 (shape (8,)), and a fence of a host object holding
    42 gives 42.  (celeritas's one spelling is ``Queue.fence``; a subrange may be a
    ``cl.Subrange`` or an ``(offset, range)`` pair.)"""
    def program(rank):
        q = cl.Queue()
        init = np.arange(16, dtype=np.int32)
        buf = cl.Buffer(init)
        ho = cl.HostObject(42)
        full = q.fence(buf).result()
        part = q.fence(buf, cl.Subrange((8,), (8,))).result()
        pair = q.fence(buf, ((8,), (8,))).result()
        return full.tolist(), part.tolist(), pair.tolist(), q.fence(ho).result()

    full, part, pair, value = run_cluster(program, nodes=1, timeout=TIMEOUT)[0]
    assert full == list(range(16))
    assert part == pair == list(range(8, 16))
    assert value == 42


@pytest.mark.parametrize("spellings", [
    [(1,), [(1,)], [[1]]],
    [(1, 2), [(1, 2)], [[1, 2]], [np.int64(1), 2]],
    [(1, 2, 3), [(1, 2, 3)], [np.array([1, 2, 3])]],
])
def test_neighborhood_extents_as_arguments_or_as_one_sequence_are_the_same_mapper(spellings):
    """runtime_deprecation_tests.cc "neighborhood range mapper can still be constructed with
    coordinate-lists": ``neighborhood(1, 2)`` (Celerity's old spelling) and
    ``neighborhood({1, 2})``: the same mapper.  In celeritas ``cl.neighborhood(1, 2)``,
    ``cl.neighborhood((1, 2))``, a list and numpy integers give equal extents (plain ints),
    the same printed form, and grant the same region for a chunk.

    Before: a numpy array of extents (``cl.neighborhood(np.array([1, 2, 3]))``) was refused
    ("extent must be an integer, got array([1, 2, 3])") while a tuple or list was taken."""
    from celeritas.range_mappers import to_scheduler_mapper
    from scheduler.geometry import Box
    mappers = [cl.neighborhood(*args) for args in spellings]
    dims = len(mappers[0].extent)
    assert all(m.extent == mappers[0].extent and all(type(e) is int for e in m.extent) for m in mappers)
    assert len({repr(m) for m in mappers}) == 1
    shape = (16,) * dims
    chunk = Subrange((4,) * dims, (4,) * dims)
    regions = [to_scheduler_mapper(m, buffer_label="B0", buffer_dims=dims, kernel_dims=dims,
                                   global_box=Box.full(shape))(chunk.box, shape) for m in mappers]
    assert all(r == regions[0] for r in regions)
    assert regions[0].bounding_box.min == tuple(4 - e for e in mappers[0].extent)


# =================================================================================================
# test_utils_tests.cc
# =================================================================================================
def test_a_correct_program_logs_nothing_above_info(caplog):
    """test_utils_tests.cc "tests that log any message in excess of level::info fail by
    default": Celerity's tests fail on any warning, which holds the runtime to being silent
    on correct programs.  A correct program (host-initialized buffer, a stencil over two ranks
    with two devices each, a reduction, a fence) logs no warning or error on any thread."""
    def program(rank):
        q = cl.Queue()
        a = cl.Buffer(np.arange(64, dtype=np.float32))
        b = cl.Buffer(shape=(64,), dtype=np.float32)
        s = cl.Buffer(np.zeros(1, np.float32))

        def stencil(cgh):
            r = a.access(cgh, cl.neighborhood(1), cl.read)
            w = b.access(cgh, cl.one_to_one(), cl.discard_write)

            @cgh.parallel_for((64,), name="stencil")
            def k(chunk):
                w[chunk] = r[chunk]      # (reads inside its neighbourhood: the halo is transferred)

        def total(cgh):
            r = b.access(cgh, cl.one_to_one(), cl.read)
            red = cl.reduction(s, cgh, cl.plus, initialize_to_identity=True)
            cgh.parallel_for((64,), lambda chunk, red: red.combine(r[chunk]), reductions=[red], name="sum")

        q.submit(stencil)
        q.submit(total)
        return float(q.fence(s).result()[0])

    with caplog.at_level(logging.INFO):
        assert run_cluster(program, nodes=2, devices=2, timeout=TIMEOUT) == [float(np.arange(64).sum())] * 2
    loud = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.levelno > logging.INFO]
    assert loud == []


def test_a_warning_logged_on_a_runtime_thread_reaches_the_programs_logging(caplog):
    """test_utils_tests.cc "test_utils::set_max_expected_log_level() allows tests with warning
    / error messages to pass" (and what the manual secondary-thread case relies on): a program
    that expects a warning sees it through standard ``logging``, whichever thread logs it.
    Two ranks' kernels both write element 0 of a buffer with ``cl.all()``: the overlapping
    write warning comes from rank 0's scheduler thread, under that thread's name, and the
    program still completes."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(shape=(1,), dtype=np.int32)

        def cgf(cgh):
            w = b.access(cgh, cl.all(), cl.discard_write)
            cgh.parallel_for((2,), lambda chunk: None, name="overlap")

        q.submit(cgf)
        q.wait()
        return True

    with caplog.at_level(logging.WARNING):
        assert run_cluster(program, nodes=2, timeout=TIMEOUT, CELERITAS_DIAGNOSTICS="warn") == [True, True]
    hits = [r for r in caplog.records if "overlapping writes" in r.getMessage()]
    assert hits, [r.getMessage() for r in caplog.records]
    assert {r.threadName for r in hits} == {"celeritas-scheduler-0"}
    assert all(r.levelno == logging.WARNING for r in hits)


# =================================================================================================
# system/distr_tests.cc
# =================================================================================================
@pytest.mark.parametrize("nodes,devices", [(2, 1), (2, 2), (3, 1)])
def test_a_reduction_including_a_host_initialized_value_stages_it_for_the_local_reduce(nodes, devices):
    """distr_tests.cc "reduction commands perform host -> device transfers if necessary" (a
    regression test in Celerity, where that transfer deadlocked): a buffer host-initialized to
    42 gets a sum reduction that is not initialized to the identity, adding 1 per item of a
    range of 1000; a master-node host task reads 1042, on 2 or 3 ranks.  Where Celerity moves
    the initial value to a device, celeritas combines the devices' partial results in host
    memory: rank 0, which holds the value, copies it out of user memory (M0) into host memory
    (M1), and its local reduce depends on that copy; the other ranks include no such value."""
    n, init = 1000, 42

    def program(rank):
        q = cl.Queue(record=True)
        total = cl.Buffer(np.full(1, init, np.int32), name="sum")
        log = cl.HostObject([])

        def reduce(cgh):
            red = cl.reduction(total, cgh, cl.plus)
            cgh.parallel_for((n,), lambda chunk, red: red.combine(np.ones(chunk.range[0], np.int32)),
                             reductions=[red], name="count")

        def report(cgh):
            a = total.access(cgh, cl.all(), cl.read)
            out = cl.side_effect(log, cgh)
            cgh.host_task(lambda part: out.append(int(a[0])), on=cl.on_master_node)

        q.submit(reduce)
        q.submit(report)
        seen = q.fence(log).result()
        instrs = q.graphs()["instructions"]
        staged = [i["id"] for i in instrs if i["kind"] == "copy" and i["buffer"] == 0
                  and (i["source_memory"], i["dest_memory"]) == (0, 1)]
        local_reduce = next(i for i in instrs if i["kind"] == "reduce")
        return seen, staged, [d["id"] for d in local_reduce["deps"]]

    results = run_cluster(program, nodes=nodes, devices=devices, timeout=TIMEOUT)
    assert results[0][0] == [n + init]
    assert all(seen == [] for seen, _, _ in results[1:])
    (_, staged, deps), others = results[0], results[1:]
    assert len(staged) >= 1 and staged[0] in deps
    for _, staged, deps in others:
        assert not set(staged) & set(deps)
