"""Celerity's executor, backend, MPI and device-selection tests, restated for celeritas.

Sources (Celerity runtime repository):

* ``test/executor_tests.cc``          ->  ``executor.executor.Executor`` (and ``executor.dry_run.DryRunExecutor``)
* ``test/backend_tests.cc``           ->  ``executor.backends`` (``HostBackend``, ``OpenCLBackend``)
* ``test/system/mpi_tests.cc``        ->  ``executor.communicator`` (in-process cluster) and ``executor.mpi``
* ``test/device_selection_tests.cc``  ->  ``CELERITAS_DEVICES`` (``celeritas.config.DeviceSpec``,
  ``celeritas.runtime.make_backend``, ``executor.backends.opencl.opencl_devices``)

How Celerity's fixtures map to ours:

* ``executor_test_context`` (a live or dry-run executor over a mock backend and a mock
  send-only communicator that append every call to an operations log; instructions are
  submitted one by one, each depending on the one before) becomes ``Executor`` over
  ``RecordingBackend`` (a ``HostBackend`` whose allocate / free / hand_over / launch / copy
  calls are logged; overriding ``launch`` and ``copy`` also turns inline execution off, so
  every kernel, copy and host task reaches the backend) and ``RecordingComm`` (rank 0 of
  2, logs pilots, sends, clones, barriers), with hand-built instructions chained by
  ``Chain`` (``tests/instruction_builder.py``).  Celerity's pointers become the very numpy
  arrays the backend allocated (compared by identity); its ``accessor_info`` becomes the
  ``LaunchContext`` the executor hands a launcher.  The delegate's horizon / epoch
  notifications are the ``on_horizon`` / ``on_epoch`` callbacks.
* The SYCL backends of ``backend_tests.cc`` become ``HostBackend`` (simulated devices) and
  ``OpenCLBackend`` (PoCL on the CPU; one device listed twice gives two logical devices).
* ``mpi_fixture`` under ``mpiexec`` becomes each rank program below run twice: on the
  in-process cluster of ``celeritas.testing.run_cluster`` (``context.cluster.communicator``)
  and in one ``mpiexec -n 2`` job (``MpiCommunicator``, one per strided-payload policy where
  it matters) that imports this module and writes each rank's results as JSON.  Celerity's
  ``communicator::stride`` (allocation range, transfer subrange, element size) becomes the
  numpy view of that subrange of an allocation-shaped array, which is what celeritas passes
  its communicators.  Celerity's ``mpi_communicator_testspy`` becomes two private counters
  of ``MpiCommunicator`` (its committed datatypes, its pilot sends still held).
* ``device_selection_tests.cc``'s mock platforms become real PoCL platforms in a subprocess
  with ``POCL_DEVICES="pthread pthread"`` (two platforms of two devices each here); a device
  without the required aspects becomes one whose kernel-build probe fails (the probe
  ``opencl._device_ok`` is patched); a stub CuPy device count (and a stub CUDA backend
  constructor that records the chosen ids) stands for the GPUs of the CUDA default.
* executor_tests.cc "live_executor tracks active time" becomes lane busy time from the
  executor's trace, and backend_tests.cc's profiling switch becomes the trace itself.

Already pinned elsewhere (not repeated here):

* executor_tests.cc "dry_run_executor warns when encountering a fence instruction": by
  ``test_celerity_restated_runtime.py::test_a_dry_run_resolves_fences_without_running_tasks``
  (celeritas's warning comes from ``q.fence()`` in a dry run; the fence resolves).
* executor_tests.cc "live_executor emits progress warning when a task appears stuck": by
  ``test_wait_warning.py::test_fence_result_names_the_fence_and_the_running_host_task``
  (celeritas warns from the waiting application thread, naming the running host task and
  its lane through ``Executor.describe_waits``).
* executor_tests.cc "live_executor tracks starvation time" (both sections): celeritas keeps
  no executor-side starvation counter; the summary computes starvation as the executor's
  idle time that overlaps the scheduler's busy intervals (none: zero), pinned by
  ``test_summary.py::test_starvation_from_scheduler_intervals`` and
  ``test_single_rank_summary_matches_records``.
* backend_tests.cc "host tasks in a single lane execute in-order": by
  ``test_host_backend.py::test_lane_runs_in_order`` (order, completion) and
  ``test_lane_threads_are_reused`` (one thread per lane).
* backend_tests.cc "backend allocations are properly aligned", for device memory of the
  OpenCL backend (page-aligned) and large host allocations (huge-page aligned): by
  ``test_opencl.py::test_device_arrays_are_page_aligned_and_large_ones_huge_page_aligned``
  and ``test_host_backend.py::test_large_allocations_are_huge_page_aligned_and_pooled_once_no_view_is_left``;
  the element-type alignment of every other allocation is restated below.

Cases that do not apply:

* executor_tests.cc "executors free all reducers that appear in garbage lists": the
  executor keeps no reducer objects; fill-identity and reduce instructions carry their
  identity and operator.
* backend_tests.cc "backend allocations are pattern-filled in debug builds": celeritas has
  no debug build and no fill pattern.
* backend_tests.cc "SYCL backend enumerator classifies backends correctly" and
  device_selection_tests.cc's three "select_backend ..." cases: SYCL backend
  specializations (CUDA/generic) have no counterpart; ``CELERITAS_DEVICES`` names the
  backend.
* device_selection_tests.cc "select_devices throws if a user-specified devices does not
  support required aspects": devices listed in ``opencl:P:D,...`` are used as given (no
  probe); a kernel that fails to build there is reported per kernel
  (``test_opencl.py::test_build_error_names_the_kernel``).
* device_selection_tests.cc "select_devices supports passing a device selector function",
  "... largest cumulative selector score ...", "... does not consider devices with a
  negative selector score": celeritas has no device-selector API.
* device_selection_tests.cc "select_devices attempts to evenly distributed devices if there
  is more than one local node" and "... round-robin fashion if there are fewer than local
  nodes": every rank uses the devices ``CELERITAS_DEVICES`` names (``celeritas run
  --devices`` passes the same list to every rank, docs/api.md); there is no per-host split.
* mpi_tests.cc "collectives are concurrent between distinct mpi_communicators", the part
  that clones from concurrent threads and destroys communicators (a collective in
  Celerity): celeritas clones only on the executor thread and never frees a clone during a
  run, so the clones are made on one thread; the concurrent part (restated) is collectives
  on distinct clones' handles from concurrent threads, as collective host tasks on several
  host lanes run them.
* Anything CUDA (CuPy streams, CUDA-aware MPI, peer access between real GPUs): only a GPU
  could show it, and ``tests/test_cuda.py`` runs where there is one.

Differences by design that the assertions follow (see each docstring): celeritas
allocations have a shape and dtype, not a byte size and alignment; payloads travel as
``MPI.BYTE``, so there is no scalar-datatype cache, and contiguous boxes need no derived
datatype at all (``executor/mpi/wire.py``).

Defect found, now fixed: the dry-run executor never dropped a host object whose destroy
instruction it received (``test_a_host_object_lives_until_its_destroy_instruction[dry_run]``).
"""
from __future__ import annotations

import gc
import json
import logging
import os
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from instruction_builder import Graph  # tests/ is on sys.path (conftest)

from celeritas import context
from celeritas.testing import run_cluster
from executor.backends import HostBackend, Lane
from executor.backends.backend import copy_box
from executor.communicator import Communicator, Request, SingleRankCommunicator
from executor.dry_run import DryRunExecutor
from executor.executor import Executor
from scheduler.geometry import Box
from scheduler.instruction_graph import (
    HOST_MEMORY,
    USER_MEMORY,
    AccessAllocation,
    AccessorArg,
    AllocInstruction,
    CloneCollectiveGroupInstruction,
    CopyInstruction,
    DestroyHostObjectInstruction,
    DeviceKernelInstruction,
    EpochInstruction,
    FenceInstruction,
    FillIdentityInstruction,
    FreeInstruction,
    HorizonInstruction,
    HostTaskInstruction,
    InstructionBatch,
    LaunchContext,
    Pilot,
    ReduceInstruction,
    ReductionAllocation,
    SendInstruction,
    device_memory,
)

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 60          # every run_cluster, join and subprocess: a hang is a failure
ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = Path(sys.executable).with_name("mpiexec")


# =================================================================================================
# executor fixtures: a logging backend and communicator, chained instructions, callbacks
# =================================================================================================
class RecordingBackend(HostBackend):
    """A ``HostBackend`` that logs every allocate / free / hand_over / launch / copy call (the
    mock backend's operations log).  Overriding ``launch`` and ``copy`` makes its lanes
    non-plain, so the executor runs nothing inline: all work reaches these methods."""

    def __init__(self, num_devices: int = 4, log: list | None = None):
        super().__init__(num_devices, huge_pages=None)
        self.log = [] if log is None else log

    def allocate(self, memory, shape, dtype):
        arr = super().allocate(memory, shape, dtype)
        self.log.append(("alloc", memory, tuple(shape), np.dtype(dtype), arr))
        return arr

    def free(self, memory, array):
        self.log.append(("free", memory, array))
        super().free(memory, array)

    def hand_over(self, memory, array):
        self.log.append(("hand_over", memory, array))
        return super().hand_over(memory, array)

    def launch(self, lane, fn, *, dependent=False):
        self.log.append(("launch", lane))
        return HostBackend.launch(self, lane, fn, dependent=dependent)

    def copy(self, src, src_box, dst, dst_box, box, lane, *, dependent=False):
        self.log.append(("copy", src, src_box, dst, dst_box, box, lane))
        return HostBackend.launch(self, lane, lambda: copy_box(src, src_box, dst, dst_box, box),
                                  dependent=dependent)

    def ops(self, *kinds):
        return [e for e in self.log if e[0] in kinds]


class _DoneRequest(Request):
    def test(self) -> bool:
        return True

    def wait(self, timeout=None) -> bool:
        return True


class Handle:
    """What ``RecordingComm.collective_handle`` hands a collective host task."""

    def __init__(self, comm):
        self.comm = comm


class RecordingComm(Communicator):
    """Rank 0 of 2 that only sends (the mock communicator): pilots, payload sends, clones and
    barriers go to ``log``; a send completes at once."""

    notifies = True

    def __init__(self, log: list, accepts_strided: bool = True):
        self.log = log
        self.accepts_strided = accepts_strided

    @property
    def rank(self) -> int:
        return 0

    @property
    def num_ranks(self) -> int:
        return 2

    def send_pilot(self, to, pilot):
        self.log.append(("pilot", to, pilot))

    def poll_pilots(self):
        return []

    def send_payload(self, to, msg_id, array):
        self.log.append(("send", to, msg_id, array, np.array(array, copy=True)))
        return _DoneRequest()

    def receive_payload(self, from_rank, msg_id, out_array):
        raise AssertionError("this communicator only sends")

    def clone(self, key=None):
        child = RecordingComm(self.log, self.accepts_strided)
        self.log.append(("clone", self, child, key))
        return child

    def barrier(self):
        self.log.append(("barrier", self))

    def collective_handle(self):
        self.log.append(("handle", self))
        return Handle(self)


class Calls:
    """The executor's callbacks (Celerity's delegate): reached epochs, horizons, errors."""

    def __init__(self):
        self.epochs: list[int] = []
        self.horizons: list[int] = []
        self.errors: list = []
        self._cond = threading.Condition()

    def on_epoch(self, task):
        with self._cond:
            self.epochs.append(task)
            self._cond.notify_all()

    def on_horizon(self, task):
        with self._cond:
            self.horizons.append(task)
            self._cond.notify_all()

    def on_error(self, exc, instr):
        self.errors.append((exc, instr))

    def reached(self, kind: str, task: int, timeout: float = TIMEOUT) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: task in getattr(self, kind), timeout)


class Chain:
    """Instructions that each depend on the one submitted before (Celerity's test context
    serializes its instructions the same way)."""

    def __init__(self):
        self.graph = Graph()
        self.last = None

    def add(self, cls, **fields):
        instr = self.graph.add(cls, *([self.last] if self.last is not None else []), **fields)
        self.last = instr
        return instr

    def batch(self, pilots=(), user_allocations=()):
        b = self.graph.batch(pilots)
        b.user_allocations = list(user_allocations)
        return b


def live_executor(backend, comm=None, **kw) -> tuple[Executor, Calls]:
    calls = Calls()
    ex = Executor(backend, comm if comm is not None else SingleRankCommunicator(), on_horizon=calls.on_horizon,
                  on_epoch=calls.on_epoch, on_error=calls.on_error, **kw)
    ex.start()
    return ex, calls


def either_executor(kind: str, backend) -> tuple:
    """A started live executor (``kind`` "live") or a dry-run executor, with its Calls."""
    if kind == "live":
        return live_executor(backend)
    calls = Calls()
    return DryRunExecutor(calls.on_horizon, calls.on_epoch), calls


def finish(ex, chain: Chain, task: int) -> None:
    """Submit the shutdown epoch and wait for the executor thread to end (Celerity's finish())."""
    chain.add(EpochInstruction, task=task, action="shutdown")
    ex.submit(chain.batch())
    assert ex.join(TIMEOUT), "the executor did not reach its shutdown epoch"


def acc(allocation, allocation_box, box=None, buffer=0):
    return AccessAllocation(buffer=buffer, allocation=allocation, allocation_box=allocation_box,
                            box=box if box is not None else allocation_box)


def host_lane(lane) -> bool:
    return lane.kind == "host" and lane.device is None


# =================================================================================================
# executor_tests.cc
# =================================================================================================
@pytest.mark.parametrize("reached", ["epoch", "horizon"])
@pytest.mark.parametrize("kind", ["live", "dry_run"])
def test_executors_report_every_epoch_and_horizon_they_reach(kind, reached):
    """executor_tests.cc "executors notify their delegate when encountering a horizon /
    epoch" (both executors, both sections): after the init epoch (task 0) only epoch 0 was
    reported and no horizon; an epoch without action (task 1), or a horizon (task 1), is
    then reported with its task id while the executor keeps running."""
    backend = HostBackend(1)
    ex, calls = either_executor(kind, backend)
    try:
        chain = Chain()
        chain.add(EpochInstruction, task=0, action="init")
        ex.submit(chain.batch())
        assert calls.reached("epochs", 0)
        assert (calls.epochs, calls.horizons) == ([0], [])
        if reached == "epoch":
            chain.add(EpochInstruction, task=1, action="none")
        else:
            chain.add(HorizonInstruction, task=1)
        ex.submit(chain.batch())
        assert calls.reached(reached + "s", 1)
        if reached == "epoch":
            assert (calls.epochs, calls.horizons) == ([0, 1], [])
        else:
            assert (calls.epochs, calls.horizons) == ([0], [1])
        if kind == "live":
            assert ex.is_running           # reaching them did not stop it
            finish(ex, chain, 2)
            assert calls.epochs[-1] == 2 and calls.errors == []
    finally:
        backend.close()


@pytest.mark.parametrize("collector", ["horizon", "epoch"])
def test_user_allocations_in_garbage_lists_are_let_go_without_a_free(collector):
    """executor_tests.cc "executors accept user allocations in garbage lists" (live, both
    sections): a horizon or an epoch whose garbage names a user allocation (a buffer's
    host array, bound through ``user_allocations``) and a user-memory allocation the backend
    made completes without error.  The backend never frees either (the data may live on
    with the user), the backend-made one is handed over (it stops counting towards user
    memory) with its contents intact, the user's array is untouched, and the executor keeps
    no reference to it (it can be collected)."""
    backend = RecordingBackend(1)
    ex, calls = live_executor(backend)
    box = Box((0,), (4,))
    user = np.arange(4, dtype=np.int32)
    user_ref = weakref.ref(user)
    try:
        ex.track_user_buffer(5, user)
        chain = Chain()
        chain.add(EpochInstruction, task=0, action="init")
        chain.add(AllocInstruction, allocation=7, memory=USER_MEMORY, box=box, shape=(4,), dtype=np.int32)
        chain.add(HostTaskInstruction, task=1, box=box, accesses=[acc(7, box)],
                  launcher=lambda ctx: ctx.arrays[0].__setitem__(Ellipsis, 7))
        if collector == "horizon":
            chain.add(HorizonInstruction, task=2, garbage=[7, 123])
        else:
            chain.add(EpochInstruction, task=2, action="none", garbage=[7, 123])
        ex.submit(chain.batch(user_allocations=[(123, 5)]))
        assert calls.reached(collector + "s", 2)
        (alloc,) = backend.ops("alloc")
        made = alloc[4]
        assert [(e[0], e[1]) for e in backend.ops("hand_over", "free")] == [("hand_over", USER_MEMORY)]
        assert backend.ops("hand_over")[0][2] is made
        assert backend.live_bytes(USER_MEMORY) == 0
        assert made.tolist() == [7, 7, 7, 7]
        assert user.tolist() == [0, 1, 2, 3]
        del user
        gc.collect()
        assert user_ref() is None, "the executor still holds the collected user allocation"
        finish(ex, chain, 3)
        assert calls.errors == []
    finally:
        backend.close()


@pytest.mark.parametrize("collector", ["horizon", "epoch"])
def test_the_dry_run_executor_accepts_garbage_lists(collector):
    """executor_tests.cc "executors accept user allocations in garbage lists" (dry run): a
    horizon or epoch whose garbage names a user allocation is reached as any other."""
    calls = Calls()
    ex = DryRunExecutor(calls.on_horizon, calls.on_epoch)
    ex.track_user_buffer(5, np.zeros(4))
    chain = Chain()
    chain.add(EpochInstruction, task=0, action="init")
    if collector == "horizon":
        chain.add(HorizonInstruction, task=1, garbage=[123])
    else:
        chain.add(EpochInstruction, task=1, action="none", garbage=[123])
    ex.submit(chain.batch(user_allocations=[(123, 5)]))
    assert calls.reached(collector + "s", 1, timeout=0)
    assert ex.error is None


class _Instance:
    """A host object instance whose lifetime the test watches through a weak reference."""


@pytest.mark.parametrize("kind", ["live", "dry_run"])
def test_a_host_object_lives_until_its_destroy_instruction(kind):
    """executor_tests.cc "host object lifetime is controlled by destroy_host_object_instruction"
    (both executors): a tracked host object instance, no longer referenced by the test,
    stays alive through a horizon; after a destroy instruction and the next horizon the
    executor no longer keeps it alive."""
    backend = HostBackend(1)
    ex, calls = either_executor(kind, backend)
    try:
        instance = _Instance()
        ref = weakref.ref(instance)
        ex.track_host_object(42, instance)
        del instance
        chain = Chain()
        chain.add(EpochInstruction, task=0, action="init")
        chain.add(HorizonInstruction, task=1)
        ex.submit(chain.batch())
        assert calls.reached("horizons", 1)
        gc.collect()
        assert ref() is not None
        chain.add(DestroyHostObjectInstruction, host_object=42)
        chain.add(HorizonInstruction, task=2)
        ex.submit(chain.batch())
        assert calls.reached("horizons", 2)
        gc.collect()
        assert ref() is None, "the host object instance outlived its destroy instruction"
    finally:
        if kind == "live":
            finish(ex, chain, 3)
        backend.close()


def test_a_host_task_gets_its_allocations_boxes_and_ranges():
    """executor_tests.cc "live_executor passes correct allocations to host tasks" and
    backend_tests.cc "host task lambdas are hydrated and invoked with the correct
    parameters": two host allocations (a 32x32 float64 and a 64x16 int32) are made in host
    memory with those shapes; a host task over the box [0,3)x[1,4)x[2,5) of a global range
    (7, 8, 9) is launched on a host lane and its launcher gets the two arrays the backend
    allocated (by identity), each access's allocation extent and accessed box as given, the
    box, the global range, no device and no communicator (not collective), and runs on
    the lane's thread; the frees get the same arrays, in order."""
    backend = RecordingBackend(4)
    ex, calls = live_executor(backend)
    seen = {}

    def host_task(ctx):
        seen["ctx"] = ctx
        seen["thread"] = threading.current_thread().name

    box1, box2 = Box((0, 0), (32, 32)), Box((0, 0), (64, 16))
    accesses = [acc(1, box1, Box((8, 8), (24, 24)), buffer=1), acc(2, box2, Box((0, 0), (16, 16)), buffer=2)]
    try:
        chain = Chain()
        chain.add(EpochInstruction, task=0, action="init")
        chain.add(AllocInstruction, allocation=1, memory=HOST_MEMORY, box=box1, shape=(32, 32), dtype=np.float64)
        chain.add(AllocInstruction, allocation=2, memory=HOST_MEMORY, box=box2, shape=(64, 16), dtype=np.int32)
        chain.add(HostTaskInstruction, task=1, box=Box((0, 1, 2), (3, 4, 5)), global_range=(7, 8, 9),
                  accesses=accesses, launcher=host_task, name="task_name")
        chain.add(FreeInstruction, allocation=1, memory=HOST_MEMORY)
        chain.add(FreeInstruction, allocation=2, memory=HOST_MEMORY)
        ex.submit(chain.batch())
        finish(ex, chain, 2)
    finally:
        backend.close()
    assert calls.errors == []
    log = backend.log
    assert [e[0] for e in log] == ["alloc", "alloc", "launch", "free", "free"]
    a1, a2 = log[0], log[1]
    assert a1[1:4] == (HOST_MEMORY, (32, 32), np.dtype(np.float64))
    assert a2[1:4] == (HOST_MEMORY, (64, 16), np.dtype(np.int32))
    assert host_lane(log[2][1])
    ctx = seen["ctx"]
    assert ctx.arrays[0] is a1[4] and ctx.arrays[1] is a2[4]
    assert [(a.allocation_box, a.box) for a in ctx.accesses] == [(box1, Box((8, 8), (24, 24))),
                                                                  (box2, Box((0, 0), (16, 16)))]
    assert ctx.box == Box((0, 1, 2), (3, 4, 5)) and ctx.global_range == (7, 8, 9)
    assert ctx.communicator is None and ctx.device is None and ctx.task == 1
    assert seen["thread"] == f"celeritas-{log[2][1].name}"
    assert log[3][1:] == (HOST_MEMORY, a1[4]) and log[3][2] is a1[4]
    assert log[4][1:] == (HOST_MEMORY, a2[4]) and log[4][2] is a2[4]


def test_fill_identity_and_reduce_use_their_allocations_and_counts():
    """executor_tests.cc "live_executor passes correct allocations to reducers": a fill-identity
    instruction sets the first ``count`` values of its allocation to the identity and nothing
    else, and a reduce instruction combines the first ``count`` values of its source
    allocation into its destination allocation's value.  Here a 6-value source holding
    5, 7, 11, 13, 17, 19 gets the identity 1 in its first 2 values; the destination is filled
    with the identity too; the product of the first 4 source values, combined with the
    destination's, is 1 * 1 * 11 * 13 = 143.  Both run on a host lane."""
    backend = RecordingBackend(1)
    ex, calls = live_executor(backend)
    src_box, dst_box = Box((0,), (6,)), Box((0,), (1,))
    try:
        chain = Chain()
        chain.add(EpochInstruction, task=0, action="init")
        chain.add(AllocInstruction, allocation=1, memory=HOST_MEMORY, box=src_box, shape=(6,), dtype=np.int64)
        chain.add(AllocInstruction, allocation=2, memory=HOST_MEMORY, box=dst_box, shape=(1,), dtype=np.int64)
        chain.add(HostTaskInstruction, task=1, box=src_box, accesses=[acc(1, src_box), acc(2, dst_box)],
                  launcher=lambda ctx: (ctx.arrays[0].__setitem__(Ellipsis, [5, 7, 11, 13, 17, 19]),
                                        ctx.arrays[1].__setitem__(Ellipsis, -1)))
        chain.add(FillIdentityInstruction, reduction=42, allocation=1, count=2, identity=1)
        chain.add(FillIdentityInstruction, reduction=42, allocation=2, count=1, identity=1)
        chain.add(ReduceInstruction, reduction=42, source=1, dest=2, count=4, op=np.multiply, include_dest=True)
        chain.add(FreeInstruction, allocation=1, memory=HOST_MEMORY)
        chain.add(FreeInstruction, allocation=2, memory=HOST_MEMORY)
        ex.submit(chain.batch())
        finish(ex, chain, 2)
    finally:
        backend.close()
    assert calls.errors == []
    source, dest = backend.ops("alloc")[0][4], backend.ops("alloc")[1][4]
    assert source.tolist() == [1, 1, 11, 13, 17, 19]
    assert dest.tolist() == [143]
    launches = backend.ops("launch")
    assert len(launches) == 4 and all(host_lane(e[1]) for e in launches)   # host task, 2 fills, reduce


@pytest.mark.parametrize("op,want", [(np.add, [0]), (np.fmax, None)])
def test_a_reduction_of_no_values_writes_the_identity_or_fails_clearly(op, want):
    """executor_tests.cc, reducer error path: a reduce instruction over zero source values
    that does not include the destination's value writes the operator's identity (np.add:
    0); an operator without an identity (np.fmax) is reported through ``on_error`` with that
    instruction and a message naming the operator, and a fence behind it fails with it."""
    backend = HostBackend(1)
    ex, calls = live_executor(backend)
    out = np.full(1, -5, dtype=np.float64 if want is None else np.int64)
    try:
        ex.track_user_buffer(3, out)
        chain = Chain()
        chain.add(AllocInstruction, allocation=1, memory=HOST_MEMORY, shape=(2,), dtype=out.dtype)
        red = chain.add(ReduceInstruction, reduction=1, source=1, dest=9, count=0, op=op, include_dest=False)
        fut = Future()
        chain.add(FenceInstruction, task=1, promise=fut, allocation=9)
        chain.add(FreeInstruction, allocation=1, memory=HOST_MEMORY)
        ex.submit(chain.batch(user_allocations=[(9, 3)]))
        if want is not None:
            assert fut.result(TIMEOUT).tolist() == want
            assert calls.errors == []
        else:
            with pytest.raises(ValueError, match="reduction of zero values with .*fmax.* which has no identity"):
                fut.result(TIMEOUT)
            assert [(type(e), i) for e, i in calls.errors] == [(ValueError, red)]
            assert out.tolist() == [-5.0]
        finish(ex, chain, 2)
    finally:
        backend.close()


@pytest.mark.parametrize("did", [0, 1])
def test_a_device_kernel_gets_its_device_allocations_and_reduction_arrays(did):
    """executor_tests.cc "live_executor passes correct allocations to device kernels" and
    backend_tests.cc "device kernel command groups are hydrated and invoked with the correct
    parameters" (devices 0 and 1 of 4): four allocations in the device's memory (two
    accessed buffers, two one-element reduction targets), a kernel over [1,4)x[2,5)x[3,6)
    launched on that device's lane gets the device id, the box, the two accessed arrays by
    identity with their extents and accessed boxes, and the two reduction arrays in order;
    the frees name the device memory and the same arrays."""
    backend = RecordingBackend(4)
    ex, calls = live_executor(backend)
    mem = device_memory(did)
    seen = {}
    box1, box2, unit = Box((0, 0), (32, 32)), Box((0, 0), (64, 16)), Box((0,), (1,))
    accesses = [acc(1, box1, Box((8, 8), (24, 24)), buffer=1), acc(2, box2, Box((0, 0), (16, 16)), buffer=2)]
    reductions = [ReductionAllocation(reduction=1, buffer=3, allocation=3, include_current=False),
                  ReductionAllocation(reduction=2, buffer=4, allocation=4, include_current=False)]
    try:
        chain = Chain()
        chain.add(EpochInstruction, task=0, action="init")
        chain.add(AllocInstruction, allocation=1, memory=mem, box=box1, shape=(32, 32), dtype=np.float64)
        chain.add(AllocInstruction, allocation=2, memory=mem, box=box2, shape=(64, 16), dtype=np.float32)
        chain.add(AllocInstruction, allocation=3, memory=mem, box=unit, shape=(1,), dtype=np.int32)
        chain.add(AllocInstruction, allocation=4, memory=mem, box=unit, shape=(1,), dtype=np.int32)
        chain.add(DeviceKernelInstruction, device=did, task=1, box=Box((1, 2, 3), (4, 5, 6)), accesses=accesses,
                  reductions=reductions, launcher=lambda ctx: seen.setdefault("ctx", ctx), name="task_name")
        for a in (1, 2, 3, 4):
            chain.add(FreeInstruction, allocation=a, memory=mem)
        ex.submit(chain.batch())
        finish(ex, chain, 2)
    finally:
        backend.close()
    assert calls.errors == []
    log = backend.log
    assert [e[0] for e in log] == ["alloc"] * 4 + ["launch"] + ["free"] * 4
    allocs = [e[4] for e in log[:4]]
    assert [e[1:4] for e in log[:4]] == [(mem, (32, 32), np.dtype(np.float64)), (mem, (64, 16), np.dtype(np.float32)),
                                         (mem, (1,), np.dtype(np.int32)), (mem, (1,), np.dtype(np.int32))]
    lane = log[4][1]
    assert (lane.kind, lane.device) == ("device", did)
    ctx = seen["ctx"]
    assert ctx.device == did and ctx.box == Box((1, 2, 3), (4, 5, 6))
    assert ctx.arrays[0] is allocs[0] and ctx.arrays[1] is allocs[1]
    assert [(a.allocation_box, a.box) for a in ctx.accesses] == [(box1, Box((8, 8), (24, 24))),
                                                                  (box2, Box((0, 0), (16, 16)))]
    assert len(ctx.reduction_arrays) == 2
    assert ctx.reduction_arrays[0] is allocs[2] and ctx.reduction_arrays[1] is allocs[3]
    assert [e[1] for e in log[5:]] == [mem] * 4
    assert all(e[2] is a for e, a in zip(log[5:], allocs))


@pytest.mark.parametrize("source_mem", [HOST_MEMORY, device_memory(1)], ids=["from_host", "from_D1"])
@pytest.mark.parametrize("dest_mem", [HOST_MEMORY, device_memory(1)], ids=["to_host", "to_D1"])
def test_copies_get_their_allocations_extents_and_boxes(source_mem, dest_mem):
    """executor_tests.cc "live_executor passes correct allocation pointers to copy
    instructions" (host memory and device 1's memory in every combination): a source
    allocation holding [4,16)x[0,16) and a destination holding [8,16)x[0,16), and a copy of
    the region {[8,12)x[0,8), [12,16)x[0,4)} (two copy instructions, one per box: a celeritas
    copy moves one box).  Each backend copy gets the two allocated arrays, their extents
    and its box; it runs on a host lane between host memories, else on device 1's lane.
    The destination then holds the source's values in that region and its old contents
    elsewhere."""
    backend = RecordingBackend(4)
    ex, calls = live_executor(backend)
    src_box, dst_box = Box((4, 0), (16, 16)), Box((8, 0), (16, 16))
    region = [Box((8, 0), (12, 8)), Box((12, 0), (16, 4))]

    def fill(ctx):
        i, j = np.meshgrid(np.arange(4, 16), np.arange(16), indexing="ij")
        ctx.arrays[0][...] = 100 * i + j
        ctx.arrays[1][...] = -1

    try:
        chain = Chain()
        chain.add(EpochInstruction, task=0, action="init")
        chain.add(AllocInstruction, allocation=1, memory=source_mem, box=src_box, shape=(12, 16), dtype=np.int32)
        chain.add(AllocInstruction, allocation=2, memory=dest_mem, box=dst_box, shape=(8, 16), dtype=np.int32)
        chain.add(HostTaskInstruction, task=1, box=src_box, accesses=[acc(1, src_box), acc(2, dst_box)], launcher=fill)
        for box in region:
            chain.add(CopyInstruction, source=1, dest=2, source_memory=source_mem, dest_memory=dest_mem, box=box,
                      source_box=src_box, dest_box=dst_box, size_bytes=box.area * 4)
        chain.add(FreeInstruction, allocation=1, memory=source_mem)
        chain.add(FreeInstruction, allocation=2, memory=dest_mem)
        ex.submit(chain.batch())
        finish(ex, chain, 2)
    finally:
        backend.close()
    assert calls.errors == []
    (s_alloc, d_alloc) = backend.ops("alloc")
    assert s_alloc[1:4] == (source_mem, (12, 16), np.dtype(np.int32))
    assert d_alloc[1:4] == (dest_mem, (8, 16), np.dtype(np.int32))
    src, dst = s_alloc[4], d_alloc[4]
    copies = backend.ops("copy")
    assert len(copies) == 2
    for (_, c_src, c_src_box, c_dst, c_dst_box, c_box, lane), box in zip(copies, region):
        assert c_src is src and c_dst is dst
        assert (c_src_box, c_dst_box, c_box) == (src_box, dst_box, box)
        if source_mem == dest_mem == HOST_MEMORY:
            assert host_lane(lane)
        else:
            assert (lane.kind, lane.device) == ("device", 1)
    want = np.full((8, 16), -1, dtype=np.int32)
    for box in region:
        i, j = np.meshgrid(np.arange(box.min[0], box.max[0]), np.arange(box.min[1], box.max[1]), indexing="ij")
        want[box.min[0] - 8:box.max[0] - 8, box.min[1]:box.max[1]] = 100 * i + j
    np.testing.assert_array_equal(dst, want)
    assert [e[2] for e in backend.ops("free")] == [src, dst]


def test_collective_groups_clone_the_right_communicators_and_barriers_use_the_root():
    """executor_tests.cc "live_executor clones communicators and issues barriers correctly":
    clone instructions build the tree root -> group 1, root -> group 2, group 1 -> group 3
    (group 0 is the root communicator): each clone is made from its original, every clone
    is a new communicator (never the root, never its parent) and gets its group id as key;
    a barrier epoch blocks on the root communicator.  (The host-task half of backend_tests.cc
    "host task lambdas are hydrated ...": a collective host task of group 3 gets group 3's
    collective handle as its communicator.)"""
    log: list = []
    root = RecordingComm(log)
    backend = HostBackend(1)
    ex, calls = live_executor(backend, root)
    seen = {}
    try:
        chain = Chain()
        chain.add(EpochInstruction, task=0, action="init")
        chain.add(CloneCollectiveGroupInstruction, original=0, new=1)
        chain.add(CloneCollectiveGroupInstruction, original=0, new=2)
        chain.add(CloneCollectiveGroupInstruction, original=1, new=3)
        chain.add(EpochInstruction, task=1, action="barrier")
        chain.add(HostTaskInstruction, task=2, box=Box((0,), (1,)), collective_group=3,
                  launcher=lambda ctx: seen.setdefault("comm", ctx.communicator))
        ex.submit(chain.batch())
        finish(ex, chain, 3)
    finally:
        backend.close()
    assert calls.errors == []
    assert [e[0] for e in log] == ["clone", "clone", "clone", "barrier", "handle"]
    (_, p1, c1, k1), (_, p2, c2, k2), (_, p3, c3, k3) = log[:3]
    assert (p1, p2, p3) == (root, root, c1) and (k1, k2, k3) == (1, 2, 3)
    assert len({id(root), id(c1), id(c2), id(c3)}) == 4
    assert log[3][1] is root
    assert log[4][1] is c3 and isinstance(seen["comm"], Handle) and seen["comm"].comm is c3


@pytest.mark.parametrize("strided", [True, False], ids=["strided_comm", "contiguous_comm"])
def test_a_send_passes_its_peer_message_id_and_the_box_of_its_allocation(strided):
    """executor_tests.cc "live_executor passes the correct metadata and pointers for
    peer-to-peer send": a pilot submitted before the instructions is sent at once and
    unchanged (peer 1, message 123, transfer (1, 2, 0), box [0,4)x[1,5)x[2,6)); then a
    7x8x9 int32 host allocation is made, and the send passes peer 1, message 123 and the
    box [0,4)x[1,5)x[2,6) of that allocation: a strided view into the allocation itself when
    the communicator takes strided arrays, a contiguous copy of it otherwise; the free gets
    the allocation."""
    log: list = []
    comm = RecordingComm(log, accepts_strided=strided)
    backend = RecordingBackend(1, log=log)
    ex, calls = live_executor(backend, comm)
    alloc_box = Box((0, 0, 0), (7, 8, 9))
    send_box = Box((0, 1, 2), (4, 5, 6))
    pattern = np.arange(7 * 8 * 9, dtype=np.int32).reshape(7, 8, 9)
    try:
        pilot = Pilot(msg_id=123, to=1, transfer=(1, 2, 0), box=send_box)
        ex.submit(InstructionBatch([], [pilot]))
        chain = Chain()
        chain.add(EpochInstruction, task=0, action="init")
        chain.add(AllocInstruction, allocation=1, memory=HOST_MEMORY, box=alloc_box, shape=(7, 8, 9), dtype=np.int32)
        chain.add(HostTaskInstruction, task=1, box=alloc_box, accesses=[acc(1, alloc_box)],
                  launcher=lambda ctx: ctx.arrays[0].__setitem__(Ellipsis, pattern))
        chain.add(SendInstruction, to=1, msg_id=123, transfer=(1, 2, 0), box=send_box, source=1,
                  source_box=alloc_box, dtype=np.int32, size_bytes=send_box.area * 4)
        chain.add(FreeInstruction, allocation=1, memory=HOST_MEMORY)
        ex.submit(chain.batch())
        finish(ex, chain, 2)
    finally:
        backend.close()
    assert calls.errors == []
    assert [e[0] for e in log] == ["pilot", "alloc", "launch", "send", "free"]
    _, to, sent_pilot = log[0]
    assert to == 1 and sent_pilot is pilot
    assert (sent_pilot.msg_id, sent_pilot.to, sent_pilot.transfer, sent_pilot.box) == (123, 1, (1, 2, 0), send_box)
    alloc = log[1][4]
    assert log[1][1:4] == (HOST_MEMORY, (7, 8, 9), np.dtype(np.int32))
    _, peer, msg_id, array, contents = log[3]
    assert (peer, msg_id) == (1, 123)
    np.testing.assert_array_equal(contents, pattern[0:4, 1:5, 2:6])
    if strided:
        assert np.shares_memory(array, alloc) and not array.flags.c_contiguous
        assert array.strides == alloc.strides
        assert array.ctypes.data == alloc[0:4, 1:5, 2:6].ctypes.data
    else:
        assert array.flags.c_contiguous and not np.shares_memory(array, alloc)
    assert log[4][1] == HOST_MEMORY and log[4][2] is alloc


def test_lane_busy_time_counts_running_work_and_not_idle_waits():
    """executor_tests.cc "live_executor tracks active time": a host task that sleeps 100 ms
    is active time; a 150 ms wait afterwards with nothing submitted is not.  celeritas
    measures activity in its trace (each instruction's start and end on its lane, which
    the summary turns into lane busy times): the host lane was busy for at least the 100 ms
    sleep, and for at most the whole span minus the idle wait."""
    backend = HostBackend(1)
    ex, calls = live_executor(backend, trace=True)
    try:
        chain = Chain()
        chain.add(EpochInstruction, task=0, action="init")
        chain.add(HostTaskInstruction, task=1, box=Box((0,), (1,)), launcher=lambda ctx: time.sleep(0.1),
                  name="delay")
        chain.add(HorizonInstruction, task=2)
        ex.submit(chain.batch())
        assert calls.reached("horizons", 2)
        time.sleep(0.15)
        chain.add(HostTaskInstruction, task=3, box=Box((0,), (1,)), launcher=lambda ctx: None, name="after")
        ex.submit(chain.batch())
        finish(ex, chain, 4)
    finally:
        backend.close()
    events = [e for e in ex.trace if e.lane.startswith("host.lane")]
    assert [e.name for e in events] == ["delay", "after"]
    busy = sum(e.end_ns - e.start_ns for e in events)
    span = events[-1].end_ns - events[0].start_ns
    assert busy >= 95_000_000
    assert busy <= span - 140_000_000


# =================================================================================================
# backend_tests.cc
# =================================================================================================
@pytest.mark.parametrize("traced", [False, True], ids=["trace_off", "trace_on"])
def test_execution_times_are_reported_iff_tracing_is_on(traced):
    """backend_tests.cc "backends report execution time iff profiling is enabled" (device
    kernel, host task, host copy, device copy): celeritas's profiling switch is the executor's
    trace.  Without it no execution time is kept; with it each of the four has an event on
    its lane (the kernel and the device copy on device 0's, the host task and the host copy
    on a host lane) that took a positive time, the 1 ms host task at least 1 ms."""
    backend = HostBackend(1)
    ex, calls = live_executor(backend, trace=traced)
    box = Box((0,), (4096,))
    try:
        chain = Chain()
        chain.add(EpochInstruction, task=0, action="init")
        chain.add(AllocInstruction, allocation=1, memory=HOST_MEMORY, box=box, shape=(4096,), dtype=np.uint8)
        chain.add(AllocInstruction, allocation=2, memory=HOST_MEMORY, box=box, shape=(4096,), dtype=np.uint8)
        chain.add(AllocInstruction, allocation=3, memory=device_memory(0), box=box, shape=(4096,), dtype=np.uint8)
        k = chain.add(DeviceKernelInstruction, device=0, task=1, box=box, accesses=[acc(3, box)],
                      launcher=lambda ctx: ctx.arrays[0].__setitem__(Ellipsis, 3), name="busy")
        h = chain.add(HostTaskInstruction, task=2, box=box, launcher=lambda ctx: time.sleep(0.001), name="sleep")
        hc = chain.add(CopyInstruction, source=1, dest=2, source_memory=HOST_MEMORY, dest_memory=HOST_MEMORY,
                       box=box, source_box=box, dest_box=box, size_bytes=4096)
        dc = chain.add(CopyInstruction, source=2, dest=3, source_memory=HOST_MEMORY, dest_memory=device_memory(0),
                       box=box, source_box=box, dest_box=box, size_bytes=4096)
        for a, m in ((1, HOST_MEMORY), (2, HOST_MEMORY), (3, device_memory(0))):
            chain.add(FreeInstruction, allocation=a, memory=m)
        ex.submit(chain.batch())
        finish(ex, chain, 3)
    finally:
        backend.close()
    assert calls.errors == []
    if not traced:
        assert ex.trace == []
        return
    by_id = {e.instruction_id: e for e in ex.trace}
    assert set(by_id) >= {k.id, h.id, hc.id, dc.id}
    assert by_id[k.id].lane.startswith("D0.lane") and by_id[dc.id].lane.startswith("D0.lane")
    assert by_id[h.id].lane.startswith("host.lane") and by_id[hc.id].lane.startswith("host.lane")
    assert all(by_id[i.id].end_ns > by_id[i.id].start_ns for i in (k, h, hc, dc))
    assert by_id[h.id].end_ns - by_id[h.id].start_ns >= 1_000_000


@pytest.mark.parametrize("memory", [USER_MEMORY, HOST_MEMORY, device_memory(0), device_memory(1)])
def test_every_allocation_is_aligned_for_its_element_type(memory):
    """backend_tests.cc "backend allocations are properly aligned" (host memory and every
    device's): celeritas allocations have an element type instead of an alignment argument;
    every allocation, of any size below the huge-page threshold, starts at an address
    aligned for its element type (numpy's ``aligned`` flag and the address itself)."""
    backend = HostBackend(2)
    try:
        for dtype in (np.int8, np.int16, np.float32, np.float64, np.complex128):
            for n in (1, 3, 1024, 4099):
                arr = backend.allocate(memory, (n,), dtype)
                align = np.dtype(dtype).alignment
                assert arr.flags.aligned and arr.ctypes.data % align == 0, (dtype, n, arr.ctypes.data)
                backend.free(memory, arr)
        assert backend.live_bytes(memory) == 0
    finally:
        backend.close()


def _copy_layouts():
    """Celerity's copy-test layouts: a copy box [3,7)x[4,8) cut to 0, 1 and 2 dimensions, and
    source and destination extents that pad it by 2 on no side, the left, the right or both,
    independently per dimension (1 + 16 + 256 layouts)."""
    paddings = ((0, 0), (2, 0), (0, 2), (2, 2))
    out = []
    for dims in range(3):
        lo, hi = (3, 4)[:dims], (7, 8)[:dims]
        per_dim = [[(s, d) for s in paddings for d in paddings] for _ in range(dims)]
        combos = [()]
        for choices in per_dim:
            combos = [c + (x,) for c in combos for x in choices]
        for combo in combos:
            s_lo = tuple(l - s[0] for l, (s, _d) in zip(lo, combo))
            s_hi = tuple(h + s[1] for h, (s, _d) in zip(hi, combo))
            d_lo = tuple(l - d[0] for l, (_s, d) in zip(lo, combo))
            d_hi = tuple(h + d[1] for h, (_s, d) in zip(hi, combo))
            out.append((Box(s_lo, s_hi), Box(d_lo, d_hi), Box(lo, hi)))
    return out


def _local(outer: Box, box: Box) -> tuple:
    return tuple(slice(b - o, c - o) for b, c, o in zip(box.lo[:box.dims], box.hi[:box.dims], outer.lo))


_OPENCL: dict = {}


def opencl_backend():
    """An ``OpenCLBackend`` over the first usable device listed twice (two logical devices with
    memories of their own), or a skip where PyOpenCL or an OpenCL device is missing."""
    pytest.importorskip("pyopencl")
    from executor.backends.opencl import OpenCLBackend, opencl_devices
    if "devices" not in _OPENCL:
        try:
            _OPENCL["devices"] = opencl_devices()
        except Exception as exc:  # noqa: BLE001 - no platform / no device that builds kernels
            _OPENCL["devices"] = exc
    devices = _OPENCL["devices"]
    if isinstance(devices, Exception):
        pytest.skip(f"no OpenCL device: {devices}")
    return OpenCLBackend(devices=[devices[0], devices[0]], huge_pages=None)


@pytest.fixture
def pocl_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "pocl"))


DIRECTIONS = {"host_to_host": (HOST_MEMORY, HOST_MEMORY, Lane("host", None, 0)),
              "host_to_device": (HOST_MEMORY, device_memory(0), Lane("device", 0, 0)),
              "device_to_host": (device_memory(0), HOST_MEMORY, Lane("device", 0, 0)),
              "device_to_peer": (device_memory(0), device_memory(1), Lane("device", 1, 0)),
              "device_to_itself": (device_memory(0), device_memory(0), Lane("device", 0, 0))}


@pytest.mark.parametrize("kind", ["host", "opencl"])
@pytest.mark.parametrize("direction", sorted(DIRECTIONS))
def test_copies_are_correct_on_every_source_and_destination_layout(kind, direction, pocl_cache):
    """backend_tests.cc "backend copies work correctly on all source- and destination
    layouts" (host to host, host to device, device to host, device to peer, device to
    itself; every layout of ``_copy_layouts``): the source allocation holds 1, 2, 3, ... in
    its extent's row-major order, the destination zeros; after the copy the destination
    holds the source's values inside the copy box and zeros elsewhere (numpy's slicing is
    the reference), on the host backend and on the OpenCL backend (whose device memories
    are page-aligned host-visible buffers)."""
    backend = HostBackend(2, huge_pages=None) if kind == "host" else opencl_backend()
    source_mem, dest_mem, lane = DIRECTIONS[direction]
    assert backend.backend_info().can_copy(source_mem, dest_mem)
    layouts = _copy_layouts()
    assert len(layouts) == 1 + 16 + 256
    try:
        for src_box, dst_box, box in layouts:
            src = backend.allocate(source_mem, src_box.shape, np.int32)
            dst = backend.allocate(dest_mem, dst_box.shape, np.int32)
            src[...] = np.arange(1, src.size + 1, dtype=np.int32).reshape(src.shape)
            dst[...] = 0
            want = np.zeros(dst_box.shape, np.int32)
            want[_local(dst_box, box)] = src[_local(src_box, box)]
            c = backend.copy(src, src_box, dst, dst_box, box, lane)
            assert c.wait(TIMEOUT) and c.error() is None, (src_box, dst_box, box)
            np.testing.assert_array_equal(dst, want, err_msg=f"{src_box} -> {dst_box}, box {box}")
            backend.free(source_mem, src)
            backend.free(dest_mem, dst)
    finally:
        backend.close()


BUMP = """
__kernel void bump(CHUNK_PARAMS, ACCESSOR(int, a)) {
    long i = GID(0);
    AT1(a, i) += 1;
}"""

SPIN = """
__kernel void spin(CHUNK_PARAMS, ACCESSOR(volatile int, a), long n) {
    for (long k = 0; k < n; ++k) AT1(a, 0) += 1;
}"""

COPY_FIRST = """
__kernel void copy_first(CHUNK_PARAMS, ACCESSOR(int, a)) {
    AT1(a, 1) = AT1(a, 0);
}"""


def _source_launch(backend, device, kernel, arr, box, *scalars):
    """What a lane runs for a source kernel over ``box`` with ``arr`` (extent ``box``) as its
    first argument: the backend enqueues it on the lane's own OpenCL queue."""
    from celeritas import Kernel
    lane = Lane("device", device, 0)
    ctx = LaunchContext(box, device, [arr], [], np, (), None, 0, backend.lane_handle(lane), [acc(1, box)])
    k = Kernel(source={"opencl": kernel}, name=kernel.split("void ")[1].split("(")[0])
    return backend.launch(lane, lambda: backend.launch_source_kernel(k, ctx, (AccessorArg(0), *scalars), None))


@pytest.mark.parametrize("device", [0, 1])
def test_device_allocations_are_seen_by_host_code_and_device_kernels_alike(device, pocl_cache):
    """backend_tests.cc "debug allocations are host- and device-accessible": celeritas has no
    separate debug allocations; OpenCL device allocations are host-visible.  Values the host
    writes into a device allocation are what a device (source) kernel on that device's lane
    reads: it adds 1 to each, and the host sees 2, 3, 4, 5 without any copy."""
    backend = opencl_backend()
    try:
        arr = backend.allocate(device_memory(device), (4,), np.int32)
        arr[...] = [1, 2, 3, 4]
        c = _source_launch(backend, device, BUMP, arr, Box((0,), (4,)))
        assert c.wait(TIMEOUT) and c.error() is None, c.error()
        assert arr.tolist() == [2, 3, 4, 5]
        backend.free(device_memory(device), arr)
    finally:
        backend.close()


def test_device_kernels_on_one_lane_run_in_order(pocl_cache):
    """backend_tests.cc "device kernels in a single lane execute in-order" (OpenCL): a first
    kernel counts to 200000 in a[0], one step at a time; a second one, queued right behind
    it on the same lane, copies a[0] into a[1].  When the second completed, the first had
    completed before it started, and the second saw the first's final count."""
    backend = opencl_backend()
    try:
        arr = backend.allocate(device_memory(0), (2,), np.int32)
        arr[...] = 0
        first = _source_launch(backend, 0, SPIN, arr, Box((0,), (1,)), np.int32(200_000))
        second = _source_launch(backend, 0, COPY_FIRST, arr, Box((0,), (1,)))
        assert second.wait(TIMEOUT) and second.error() is None, second.error()
        assert first.is_done() and first.error() is None
        assert first.end_ns <= second.start_ns
        assert arr.tolist() == [200_000, 200_000]
        backend.free(device_memory(0), arr)
    finally:
        backend.close()


def test_a_kernel_on_an_opencl_device_gets_that_devices_queue(pocl_cache):
    """backend_tests.cc "device kernel command groups are hydrated and invoked with the correct
    parameters", the part only a device backend shows: the executor hands a kernel on each
    OpenCL device the command queue of that device's lane (``ctx.stream``, in the device's
    context), which is where its source kernel runs; here it adds 1 to a device allocation
    filled by a host task, and a fence of the copy back to user memory shows 2, 3, 4, 5."""
    pyopencl = pytest.importorskip("pyopencl")
    backend = opencl_backend()
    from celeritas import Kernel
    k = Kernel(source={"opencl": BUMP}, name="bump")
    ex, calls = live_executor(backend)
    box = Box((0,), (4,))
    seen = {}
    futs = []

    def kernel(ctx):
        seen[ctx.device] = ctx.stream
        backend.launch_source_kernel(k, ctx, (AccessorArg(0),), None)

    try:
        chain = Chain()
        chain.add(EpochInstruction, task=0, action="init")
        for d in (0, 1):
            mem = device_memory(d)
            chain.add(AllocInstruction, allocation=10 + d, memory=mem, box=box, shape=(4,), dtype=np.int32)
            chain.add(HostTaskInstruction, task=1, box=box, accesses=[acc(10 + d, box)],
                      launcher=lambda ctx: ctx.arrays[0].__setitem__(Ellipsis, [1, 2, 3, 4]))
            chain.add(DeviceKernelInstruction, device=d, task=2, box=box, accesses=[acc(10 + d, box)],
                      launcher=kernel, name="bump")
            chain.add(AllocInstruction, allocation=20 + d, memory=USER_MEMORY, box=box, shape=(4,), dtype=np.int32)
            chain.add(CopyInstruction, source=10 + d, dest=20 + d, source_memory=mem, dest_memory=USER_MEMORY,
                      box=box, source_box=box, dest_box=box, size_bytes=16)
            futs.append(Future())
            chain.add(FenceInstruction, task=3, promise=futs[-1], allocation=20 + d)
            chain.add(FreeInstruction, allocation=10 + d, memory=mem)
        ex.submit(chain.batch())
        assert [f.result(TIMEOUT).tolist() for f in futs] == [[2, 3, 4, 5]] * 2
        finish(ex, chain, 4)
    finally:
        backend.close()
    assert calls.errors == []
    for d in (0, 1):
        q = seen[d]
        assert isinstance(q, pyopencl.CommandQueue)
        assert q.device.int_ptr == backend.devices[d].int_ptr
        assert q.context.int_ptr == backend.context_of(d).int_ptr
    assert seen[0] is not seen[1]        # one queue per lane: the devices' lanes are distinct


# =================================================================================================
# mpi_tests.cc: rank programs, run on the in-process cluster and under mpiexec
# =================================================================================================
WAIT = 20.0


def _await(requests, what: str) -> None:
    """Test ``requests`` until all completed (a busy wait with short sleeps, as the executor
    polls); a TimeoutError after ``WAIT`` seconds instead of a hang."""
    deadline = time.monotonic() + WAIT
    pending = list(requests)
    while pending:
        pending = [r for r in pending if not r.test()]
        if pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {len(pending)} request(s) incomplete after {WAIT} s")
            time.sleep(1e-4)


def _poll_pilots(comm, count: int, what: str) -> list:
    got: list = []
    deadline = time.monotonic() + WAIT
    while len(got) < count:
        got += comm.poll_pilots()
        if len(got) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {len(got)} of {count} pilots after {WAIT} s")
            time.sleep(1e-4)
    return got


def _slices(offset, rng) -> tuple:
    return tuple(slice(o, o + r) for o, r in zip(offset, rng))


def pilot_between(sender: int, receiver: int, n: int) -> Pilot:
    """A pilot whose every field derives from the (sender, receiver) pair."""
    p = 1 + sender * n + receiver
    return Pilot(msg_id=13 * p, to=receiver, transfer=(17 * p, 11 * p, 19 * p),
                 box=Box((p, 2 * p, 3 * p), (4 * p, 5 * p, 6 * p)))


def pilot_row(sender: int, p: Pilot) -> list:
    return [sender, p.msg_id, p.to, list(p.transfer), list(p.box.lo), list(p.box.hi), p.box.dims]


def rank_pilots(comm) -> list:
    n, me = comm.num_ranks, comm.rank
    for other in range(n):
        if other != me:
            comm.send_pilot(other, pilot_between(me, other, n))
    got = _poll_pilots(comm, n - 1, "pilots")
    return sorted(pilot_row(fr, p) for fr, p in got)


PAYLOAD_ALLOCATION = (12, 11, 11)
PAYLOAD_OFFSET, PAYLOAD_RANGE = (1, 0, 3), (5, 4, 6)


def payload_message(sender: int, receiver: int, n: int) -> int:
    return 1 + sender * n + receiver


def payload_pattern(sender: int, receiver: int, n: int) -> np.ndarray:
    start = payload_message(sender, receiver, n)
    return np.arange(start, start + int(np.prod(PAYLOAD_ALLOCATION)), dtype=np.int32).reshape(PAYLOAD_ALLOCATION)


def rank_payloads(comm) -> list:
    n, me = comm.num_ranks, comm.rank
    box = _slices(PAYLOAD_OFFSET, PAYLOAD_RANGE)
    keep, received, requests = [], [], []
    for other in range(n):
        if other == me:
            continue
        send = payload_pattern(me, other, n)
        recv = np.zeros(PAYLOAD_ALLOCATION, np.int32)      # zero is never part of a payload
        requests.append(comm.send_payload(other, payload_message(me, other, n), send[box]))
        requests.append(comm.receive_payload(other, payload_message(other, me, n), recv[box]))
        keep.append(send)
        received.append((other, recv))
    _await(requests, "payloads")
    return [[other, recv.ravel().tolist()] for other, recv in received]


SCALAR_LAYOUTS = [((), ()), ((2,), (1,)), ((2, 3), (1, 2)), ((2, 3, 5), (1, 2, 3))]   # (allocation, offset)


def _unit_view(buf: np.ndarray, offset: tuple) -> np.ndarray:
    return buf[...] if not offset else buf[_slices(offset, (1,) * len(offset))]


def rank_scalars(comm) -> list | None:
    if comm.rank > 1:
        return None            # exactly two ranks take part
    out, msg = [], 200
    for send_dims in range(4):
        for recv_dims in range(4):
            msg += 1
            if comm.rank == 1:
                shape, offset = SCALAR_LAYOUTS[send_dims]
                buf = np.zeros(shape, np.int32)
                view = _unit_view(buf, offset)
                view[...] = 42
                req = comm.send_payload(0, msg, view)
            else:
                shape, offset = SCALAR_LAYOUTS[recv_dims]
                buf = np.zeros(shape, np.int32)
                req = comm.receive_payload(1, msg, _unit_view(buf, offset))
            _await([req], f"scalar {send_dims}-d -> {recv_dims}-d")
            if comm.rank == 0:
                out.append([send_dims, recv_dims, buf.ravel().tolist()])
    return out if comm.rank == 0 else None


SUBRANGE_CASE = {"box_range": (3, 4, 5), "sender_allocation": (10, 7, 11), "sender_offset": (1, 2, 3),
                 "receiver_allocation": (8, 10, 13), "receiver_offset": (2, 0, 4)}


def rank_subranges(comm) -> list | None:
    if comm.rank > 1:
        return None
    c = SUBRANGE_CASE
    out = []
    for dims in (1, 2, 3):
        rng = c["box_range"][:dims]
        if comm.rank == 1:
            shape = c["sender_allocation"][:dims]
            send = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
            req = comm.send_payload(0, 300 + dims, send[_slices(c["sender_offset"][:dims], rng)])
        else:
            recv = np.zeros(c["receiver_allocation"][:dims], np.int32)
            req = comm.receive_payload(1, 300 + dims, recv[_slices(c["receiver_offset"][:dims], rng)])
        _await([req], f"{dims}-d box")
        if comm.rank == 0:
            out.append([dims, recv.ravel().tolist()])
    return out if comm.rank == 0 else None


# Celerity's sets of strides that are equal up to the allocation's extent and the offset in
# dimension 0: (allocation, offset, range)
EQUIVALENT_STRIDES = [
    [((13, 12, 11), (1, 0, 3), (5, 4, 6)), ((5, 12, 11), (0, 0, 3), (5, 4, 6)), ((20, 12, 11), (4, 0, 3), (5, 4, 6))],
    [((13, 1, 1), (1, 0, 0), (5, 1, 1)), ((1, 13, 1), (0, 1, 0), (1, 5, 1)), ((1, 1, 13), (0, 0, 1), (1, 1, 5))],
]


def _cached_datatypes(comm) -> int | None:
    """How many derived datatypes the MPI communicator has committed (Celerity's testspy);
    None for a communicator without a datatype cache."""
    types = getattr(comm, "_types", None)
    return None if types is None else len(types._types)


def rank_equivalent_strides(comm) -> dict | None:
    if comm.rank > 1:
        return None
    peer = 1 - comm.rank
    msg = 400
    received, types = [], []
    for set_index, strides in enumerate(EQUIVALENT_STRIDES):
        for _repeat in range(2):
            for allocation, offset, rng in strides:
                send = np.arange(1, int(np.prod(allocation)) + 1, dtype=np.int32).reshape(allocation)
                recv = np.zeros(allocation, np.int32)
                box = _slices(offset, rng)
                _await([comm.send_payload(peer, msg, send[box]), comm.receive_payload(peer, msg, recv[box])],
                       f"stride set {set_index}")
                received.append([set_index, list(allocation), list(offset), list(rng), recv.ravel().tolist()])
                msg += 1
        types.append(_cached_datatypes(comm))
    return {"received": received, "types": types}


def rank_pilot_gc(comm) -> list | None:
    participate = comm.rank < 2
    out = None
    if participate:
        peer = 1 - comm.rank
        pilot = Pilot(msg_id=0, to=peer, transfer=(0, 0, 0), box=Box((0, 0, 0), (1, 1, 1)))
        for _ in range(3):
            comm.send_pilot(peer, pilot)
        after_three = len(comm._pilot_sends)
        received = len(_poll_pilots(comm, 3, "three pilots"))
    comm.barrier()
    if participate:
        comm.send_pilot(peer, pilot)
        after_fourth = len(comm._pilot_sends)
        received += len(_poll_pilots(comm, 1, "the fourth pilot"))
        out = [after_three, received, after_fourth]
    comm.barrier()
    return out


CONCURRENCY = 4


def rank_concurrent_collectives(comm) -> dict:
    """CONCURRENCY roots cloned from the rank's communicator, each cloned CONCURRENCY times (on
    this thread, as the executor clones); then CONCURRENCY threads each run, with 10 ms
    pauses, a barrier and a broadcast from rank 0 on the clones of one column, the threads
    iterating in the flipped order."""
    roots = [comm.clone(key=("root", i)) for i in range(CONCURRENCY)]
    clones = [[roots[i].clone(key=j) for j in range(CONCURRENCY)] for i in range(CONCURRENCY)]
    handles = [[c.collective_handle() for c in row] for row in clones]
    got: list[list] = [[] for _ in range(CONCURRENCY)]
    errors: list[str] = []

    def column(i: int) -> None:
        try:
            for j in range(CONCURRENCY):
                h = handles[j][i]
                h.barrier()
                got[i].append(h.bcast([j, i] if comm.rank == 0 else None, root=0))
                time.sleep(0.01)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=column, args=(i,), daemon=True) for i in range(CONCURRENCY)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + WAIT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return {"got": got, "stuck": [i for i, t in enumerate(threads) if t.is_alive()], "errors": errors,
            "sizes": sorted({h.Get_size() for row in handles for h in row})}


def _mpi_main(out_dir: str) -> None:
    """The ``mpiexec -n 2`` job: every rank program on ``MpiCommunicator``s; each rank writes
    its results to ``<out_dir>/rank<R>.json`` (a program's exception becomes its result)."""
    from executor.mpi import STRIDED_POLICIES, MpiCommunicator
    comm = MpiCommunicator(install_hooks=False)
    comms = [comm]
    results: dict[str, Any] = {}

    def run(name, program, c):
        try:
            results[name] = ["ok", program(c)]
        except Exception as exc:  # noqa: BLE001 - reported to the test
            results[name] = ["error", f"{type(exc).__name__}: {exc}"]

    run("pilots", rank_pilots, comm)
    for policy in STRIDED_POLICIES:
        c = comm if policy == "auto" else MpiCommunicator(strided=policy, install_hooks=False)
        comms.append(c)
        run(f"payloads/{policy}", rank_payloads, c)
        run(f"subranges/{policy}", rank_subranges, c)
    run("scalars", rank_scalars, comm)
    comms.append(MpiCommunicator(strided="datatype", install_hooks=False))
    run("equivalent_strides", rank_equivalent_strides, comms[-1])
    comms.append(MpiCommunicator(install_hooks=False))
    run("pilot_gc", rank_pilot_gc, comms[-1])
    run("collectives", rank_concurrent_collectives, comm)
    Path(out_dir, f"rank{comm.rank}.json").write_text(json.dumps(results))
    comm.barrier()
    for c in comms:
        c.close()


@pytest.fixture(scope="module")
def mpi_results(tmp_path_factory) -> list[dict]:
    """Each rank's results of ``_mpi_main`` under ``mpiexec -n 2`` (run once for the module)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("needs mpi4py")
    if not MPIEXEC.exists():
        pytest.skip(f"needs {MPIEXEC}")
    import jobs
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERITAS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    out_dir = tmp_path_factory.mktemp("mpi")
    argv = [str(MPIEXEC), "-n", "2", sys.executable, "-c",
            f"import test_celerity_restated_backend as t; t._mpi_main({str(out_dir)!r})"]
    r = jobs.run_job(argv, env, 100, cwd=ROOT)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-6000:]}"
    files = [out_dir / f"rank{k}.json" for k in (0, 1)]
    assert all(f.exists() for f in files), r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads(f.read_text()) for f in files]


def rank_results(transport: str, name: str, program, nodes: int, request) -> list:
    """Each rank's result of ``program``: on ``nodes`` in-process ranks (run_cluster), or, for
    ``mpi`` / ``mpi/<policy>``, from the mpiexec job's 2 ranks."""
    if transport == "in-process":
        return run_cluster(lambda rank: program(context.cluster.communicator), nodes=nodes, timeout=TIMEOUT)
    results = request.getfixturevalue("mpi_results")
    key = name + transport[3:]       # "mpi/auto" -> name + "/auto"
    out = []
    for rank, res in enumerate(results):
        status, value = res[key]
        assert status == "ok", f"rank {rank}: {value}"
        out.append(value)
    return out


# =================================================================================================
# mpi_tests.cc
# =================================================================================================
@pytest.mark.parametrize("transport,nodes", [("in-process", 3), ("mpi", 2)])
def test_every_rank_receives_the_pilot_each_other_rank_sent_it(transport, nodes, request):
    """mpi_tests.cc "mpi_communicator sends and receives pilot messages": every rank sends
    each other rank a pilot whose message id, transfer id (task, buffer, reduction) and 3-D
    box derive from the (sender, receiver) pair; every rank receives exactly one pilot from
    each other rank, uncorrupted, with its sender."""
    results = rank_results(transport, "pilots", rank_pilots, nodes, request)
    for me, got in enumerate(results):
        want = [pilot_row(s, pilot_between(s, me, nodes)) for s in range(nodes) if s != me]
        assert got == json.loads(json.dumps(want)), f"rank {me}"


@pytest.mark.parametrize("transport,nodes", [("in-process", 3), ("mpi/auto", 2), ("mpi/staging", 2),
                                             ("mpi/datatype", 2)])
def test_strided_payloads_between_every_pair_of_ranks_land_in_their_box(transport, nodes, request):
    """mpi_tests.cc "mpi_communicator sends and receives payloads": every rank sends each other
    rank the box [1,6)x[0,4)x[3,9) of a 12x11x11 int32 allocation filled with a pattern that
    starts at the pair's message id, and receives the same box from each into a zeroed
    allocation, all requests posted before any is awaited.  Each received allocation holds
    the sender's values in the box and zeros elsewhere (under MPI with every strided-payload
    policy: derived datatype, staging copy, auto)."""
    results = rank_results(transport, "payloads", rank_payloads, nodes, request)
    box = _slices(PAYLOAD_OFFSET, PAYLOAD_RANGE)
    for me, got in enumerate(results):
        assert [other for other, _ in got] == [o for o in range(nodes) if o != me]
        for other, flat in got:
            want = np.zeros(PAYLOAD_ALLOCATION, np.int32)
            want[box] = payload_pattern(other, me, nodes)[box]
            np.testing.assert_array_equal(np.array(flat, np.int32).reshape(PAYLOAD_ALLOCATION), want,
                                          err_msg=f"rank {me} from {other}")


@pytest.mark.parametrize("transport", ["in-process", "mpi"])
def test_a_scalar_travels_between_boxes_of_any_dimensionality(transport, request):
    """mpi_tests.cc "mpi_communicator correctly transfers scalars between strides of
    different dimensionality": rank 1 sends the one element at (1), (1, 2) or (1, 2, 3) of a
    1-, 2- or 3-d allocation (or a 0-d allocation's only element), holding 42; rank 0 receives
    it into a unit box of another dimensionality, for all 16 pairs.  The receiving
    allocation holds 42 at that element and zeros elsewhere."""
    results = rank_results(transport, "scalars", rank_scalars, 2, request)
    assert results[1] is None
    got = results[0]
    assert [(s, r) for s, r, _ in got] == [(s, r) for s in range(4) for r in range(4)]
    for send_dims, recv_dims, flat in got:
        shape, offset = SCALAR_LAYOUTS[recv_dims]
        want = np.zeros(shape, np.int32)
        _unit_view(want, offset)[...] = 42
        assert flat == want.ravel().tolist(), (send_dims, recv_dims)


@pytest.mark.parametrize("transport", ["in-process", "mpi/auto", "mpi/staging", "mpi/datatype"])
def test_a_box_lands_at_another_offset_of_another_allocation_shape(transport, request):
    """mpi_tests.cc "mpi_communicator correctly transfers boxes that map to different
    subranges on sender and receiver" (1, 2 and 3 dimensions): rank 1 sends a 3x4x5 box at
    offset (1, 2, 3) of a 10x7x11 allocation holding 0, 1, 2, ...; rank 0 receives it at
    offset (2, 0, 4) of an 8x10x13 allocation (both cut to the dimensionality).  Each element
    of the box lands at the receiver's offset plus its position in the box; the rest of
    the receiving allocation stays zero."""
    results = rank_results(transport, "subranges", rank_subranges, 2, request)
    assert results[1] is None
    c = SUBRANGE_CASE
    assert [d for d, _ in results[0]] == [1, 2, 3]
    for dims, flat in results[0]:
        rng = c["box_range"][:dims]
        shape = c["sender_allocation"][:dims]
        sent = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
        want = np.zeros(c["receiver_allocation"][:dims], np.int32)
        want[_slices(c["receiver_offset"][:dims], rng)] = sent[_slices(c["sender_offset"][:dims], rng)]
        assert flat == want.ravel().tolist(), f"{dims}-d"


@pytest.mark.parametrize("transport", ["in-process", "mpi"])
def test_collectives_on_distinct_clones_run_concurrently(transport, request):
    """mpi_tests.cc "collectives are concurrent between distinct mpi_communicators" (4 x 4
    clones of 4 clones of the rank's communicator; see the module docstring for what is
    adapted): 4 threads per rank, each working through one column of clones in the flipped
    order, run a barrier and a broadcast from rank 0 on each.  Nothing deadlocks, every
    broadcast delivers rank 0's value for that clone, and every clone spans both ranks."""
    results = rank_results(transport, "collectives", rank_concurrent_collectives, 2, request)
    for rank, res in enumerate(results):
        assert res["errors"] == [] and res["stuck"] == [], f"rank {rank}: {res}"
        assert res["got"] == [[[j, i] for j in range(CONCURRENCY)] for i in range(CONCURRENCY)], f"rank {rank}"
        assert res["sizes"] == [2]


@pytest.mark.parametrize("transport", ["in-process", "mpi"])
def test_equivalent_strides_transfer_correctly_and_share_one_datatype(transport, request):
    """mpi_tests.cc "mpi_communicator normalizes strides to cache and re-uses MPI data types":
    two sets of boxes whose layouts differ only in the allocation's extent and the offset
    in dimension 0 (a 5x4x6 box of 13-, 5- and 20-row allocations; a 5-element line along
    each dimension), each sent twice both ways between ranks 0 and 1, arrive intact.  Under
    MPI with derived datatypes forced, the first set's boxes share a single committed
    datatype (its views have one shape and one set of strides); the second set's lines are
    contiguous, which celeritas sends as raw bytes without any derived datatype (by design,
    ``executor/mpi/wire.py``; Celerity caches one array type for them), so the count stays 1.
    (Celerity's scalar-type cache has no counterpart: payloads travel as MPI.BYTE.)"""
    results = rank_results(transport, "equivalent_strides", rank_equivalent_strides, 2, request)
    for rank in (0, 1):
        res = results[rank]
        assert len(res["received"]) == 2 * 2 * 3
        for _set, allocation, offset, rng, flat in res["received"]:
            sent = np.arange(1, int(np.prod(allocation)) + 1, dtype=np.int32).reshape(allocation)
            want = np.zeros(allocation, np.int32)
            box = _slices(offset, rng)
            want[box] = sent[box]
            assert flat == want.ravel().tolist(), (rank, allocation, offset)
        assert res["types"] == ([1, 1] if transport == "mpi" else [None, None])


def test_sent_pilots_are_released_once_delivered(request):
    """mpi_tests.cc "successfully sent pilots are garbage-collected by communicator" (MPI):
    ranks 0 and 1 each send the other 3 pilots (at most 3 sends outstanding after that) and
    receive the peer's 3; after a barrier, sending a 4th pilot releases the delivered ones,
    so at most that one send is still held."""
    results = rank_results("mpi", "pilot_gc", rank_pilot_gc, 2, request)
    for rank, (after_three, received, after_fourth) in enumerate(results):
        assert after_three <= 3 and received == 4, f"rank {rank}"
        assert after_fourth <= 1, f"rank {rank}: {after_fourth} pilot sends still held"


# =================================================================================================
# device_selection_tests.cc
# =================================================================================================
@pytest.mark.parametrize("value", ["cuda:0,opencl:0:0", "opencl:0:0,cuda:1", "host:1,opencl:0:0", "opencl:",
                                   "cuda:"])
def test_a_device_list_names_one_backend_and_at_least_one_device(value):
    """device_selection_tests.cc "select_devices requires user-specified devices to have the
    same backend" and the empty-list half of "select_devices prefers user-specified device
    list": a ``CELERITAS_DEVICES`` list that mixes backends, or names a backend with an empty
    list, is a ConfigError naming the variable and the accepted forms."""
    from celeritas.config import DeviceSpec
    from scheduler.errors import ConfigError
    with pytest.raises(ConfigError, match=rf"^CELERITAS_DEVICES={value!r} is not a device list; use host:N, "):
        DeviceSpec.parse(value)


class _FakeCuda:
    """Stands in for the CUDA backend's constructor: records which GPUs were chosen."""

    def __init__(self, ids, *, rank=None):
        self.ids = list(ids)


def _stub_gpus(monkeypatch, count: int) -> None:
    """A CuPy that sees ``count`` GPUs, and a CUDA backend constructor that records its ids
    (only the selection in ``make_backend`` is exercised)."""
    import types

    import executor.backends.cuda as cuda_backend
    runtime = types.SimpleNamespace(getDeviceCount=lambda: count)
    monkeypatch.setattr(cuda_backend, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)),
                        raising=False)
    monkeypatch.setattr(cuda_backend, "CudaBackend", _FakeCuda)


def test_without_gpus_the_default_falls_back_to_one_host_device_and_cuda_fails(monkeypatch):
    """device_selection_tests.cc "select_devices falls back to other device types if no GPUs
    are available" and "select_devices throws if no devices are available" (from the start):
    with no CUDA GPU visible, the default device choice is one simulated host device, and
    asking for ``cuda`` is a ConfigError saying no GPU is visible."""
    from celeritas.config import DeviceSpec
    from celeritas.runtime import make_backend
    from scheduler.errors import ConfigError
    _stub_gpus(monkeypatch, 0)
    b = make_backend(DeviceSpec.parse("default"))
    try:
        assert type(b) is HostBackend and b.num_devices == 1
    finally:
        b.close()
    with pytest.raises(ConfigError, match=r"^CELERITAS_DEVICES='cuda': no CUDA GPU is visible$"):
        make_backend(DeviceSpec.parse("cuda"))


def test_visible_gpus_take_precedence_and_a_user_list_is_used_as_given(monkeypatch):
    """device_selection_tests.cc "select_devices falls back to other device types ..." (second
    half: once there is a GPU it takes precedence) and "select_devices prefers
    user-specified device list": with two GPUs visible the default takes both, in order;
    ``cuda:1`` takes exactly GPU 1."""
    from celeritas.config import DeviceSpec
    from celeritas.runtime import make_backend
    _stub_gpus(monkeypatch, 2)
    assert make_backend(DeviceSpec.parse("default")).ids == [0, 1]
    assert make_backend(DeviceSpec.parse("cuda:1")).ids == [1]


SELECTION_PROBE = r"""
import json
import pyopencl as pcl
from executor.backends import opencl as ocl
from executor.backends.backend import BackendError
from celeritas.config import DeviceSpec
from celeritas.runtime import make_backend
from scheduler.errors import ConfigError

plats = pcl.get_platforms()
where = {d.int_ptr: [p, i] for p, plat in enumerate(plats) for i, d in enumerate(plat.get_devices())}
names = lambda devs: [where[d.int_ptr] for d in devs]
out = {"platforms": [len(p.get_devices()) for p in plats]}
out["auto"] = names(ocl.opencl_devices())
out["listed"] = names(ocl.opencl_devices([(0, 1), (0, 0)]))
b = make_backend(DeviceSpec.parse("opencl:0:1,0:0,0:1"))
out["backend"] = [b.num_devices, names(b.devices)]
b.close()
builds = ocl._device_ok
first = plats[0].get_devices()[0].int_ptr
ocl._device_ok = lambda ctx, d: d.int_ptr != first and builds(ctx, d)
out["without_first"] = names(ocl.opencl_devices())
ocl._device_ok = lambda ctx, d: False
try:
    make_backend(DeviceSpec.parse("opencl"))
    out["none"] = None
except ConfigError as exc:
    out["none"] = str(exc)
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def opencl_selection(tmp_path_factory) -> dict:
    """What ``SELECTION_PROBE`` sees with ``POCL_DEVICES="pthread pthread"`` (PoCL reads it when
    the platforms are first listed, hence a subprocess)."""
    pytest.importorskip("pyopencl")
    import subprocess
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERITAS_")}
    env.update(POCL_DEVICES="pthread pthread", POCL_CACHE_DIR=str(tmp_path_factory.mktemp("pocl")),
               PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", SELECTION_PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=100, check=False)
    if r.returncode != 0 and "get_platforms" in r.stderr and "RESULT" not in r.stdout:
        pytest.skip(f"no OpenCL platform: {r.stderr.strip()[-300:]}")
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.split(" ", 1)[1])
    if not out["platforms"] or out["platforms"][0] < 2:
        pytest.skip(f"PoCL did not make two devices of platform 0: {out['platforms']}")
    return out


def test_a_user_device_list_is_used_in_its_order_with_repeats(opencl_selection):
    """device_selection_tests.cc "select_devices prefers user-specified device list"
    (OpenCL): ``opencl:0:1,0:0`` selects platform 0's device 1, then device 0; the backend
    for ``opencl:0:1,0:0,0:1`` has three logical devices, exactly those, in that order."""
    assert opencl_selection["listed"] == [[0, 1], [0, 0]]
    assert opencl_selection["backend"] == [3, [[0, 1], [0, 0], [0, 1]]]


def test_automatic_opencl_selection_takes_the_first_platforms_usable_devices(opencl_selection):
    """device_selection_tests.cc "select_devices selects the largest subset of GPUs that share
    the same backend", "select_devices only considers devices that support required aspects"
    and "check_required_device_aspects throws if a device does not support required aspects"
    (celeritas's requirement is that a device builds a probe kernel), in celeritas's terms: ``opencl`` takes every device of the first platform whose
    devices build kernels (devices of one platform: one driver), here both of platform 0
    and none of the other platforms; a device that cannot build kernels is left out (the
    other one of platform 0 is kept)."""
    assert opencl_selection["auto"] == [[0, 0], [0, 1]]
    assert opencl_selection["without_first"] == [[0, 1]]


def test_no_usable_opencl_device_is_a_config_error(opencl_selection):
    """device_selection_tests.cc "select_devices throws if no devices are available" (if all
    are ignored due to missing aspects): when no device of any platform builds kernels,
    ``CELERITAS_DEVICES=opencl`` is a ConfigError that says so and lists the platforms'
    devices."""
    msg = opencl_selection["none"]
    assert msg is not None and msg.startswith("CELERITAS_DEVICES='opencl': no OpenCL device can build kernels (")
    for p, n in enumerate(opencl_selection["platforms"]):
        for d in range(n):
            assert f"opencl:{p}:{d} " in msg


def test_the_runtime_reports_its_backend_and_device_count(caplog):
    """device_selection_tests.cc "select_devices prints device and platform information":
    celeritas logs (info) which backend a rank uses and how many devices, not each device's
    name: ``host:3`` on rank 0 of 2 and of 1."""
    caplog.set_level(logging.INFO, logger="celeritas.runtime")

    def program(rank):
        from celeritas import Queue
        q = Queue()
        q.wait()
        return q.num_ranks

    assert run_cluster(program, nodes=2, devices=3, timeout=TIMEOUT) == [2, 2]
    assert run_cluster(program, nodes=1, devices=3, timeout=TIMEOUT) == [1]
    lines = [r.getMessage() for r in caplog.records if r.name == "celeritas.runtime" and r.levelno == logging.INFO]
    heads = [f"celeritas rank {rank}/{n}: host backend with 3 device(s)" for rank, n in ((0, 2), (1, 2), (0, 1))]
    for head in heads:
        assert sum(line.startswith(head) for line in lines) == 1, (head, lines)


@pytest.mark.parametrize("dims, rng, local_range, order, grid, block", [
    # the last (contiguous) index dimension along x, so that a warp reads one row segment
    (1, (1000, 1, 1), None, (0, 3, 4), (4, 1, 1), (256, 1, 1)),
    (2, (64, 100, 1), None, (1, 0, 3), (4, 8, 1), (32, 8, 1)),
    (3, (10, 20, 30), None, (2, 1, 0), (1, 5, 5), (32, 4, 2)),
    (3, (10, 20, 30), (2, 2, 4), (2, 1, 0), (8, 10, 5), (4, 2, 2)),    # local_range is in index order too
    # 10^6 rows in blocks of 8 are 125000 blocks, more than grid axis y holds: rows go along x
    (2, (10 ** 6, 4, 1), None, (0, 1, 3), (125000, 1, 1), (8, 32, 1)),
])
def test_cuda_launches_run_the_last_index_dimension_along_thread_axis_x(dims, rng, local_range, order, grid, block):
    """SYCL linearises an nd_range id with the last dimension fastest, and CUDA packs a warp
    along x: a 2-D stencil whose rows ran along x read 32 rows per warp load.  The prelude's
    GID(d) reads the axis the launch assigned to d (``order``; 3 and above name no dimension,
    whose GID is its offset)."""
    from executor.backends.cuda import thread_axes
    axes = thread_axes("k", dims, rng, local_range)
    assert (axes.order, axes.grid, axes.block) == (order, grid, block)


def test_a_cuda_launch_larger_than_any_grid_is_a_backend_error_naming_the_kernel():
    from executor.backends.backend import BackendError
    from executor.backends.cuda import thread_axes
    with pytest.raises(BackendError, match=r"^kernel 'wide': a chunk of \(30000000000, 10000000\) items in blocks "
                                           r"of \(8, 32\) needs \(3750000000, 312500\) blocks, more than a CUDA grid"):
        thread_axes("wide", 2, (3 * 10 ** 10, 10 ** 7, 1), None)


def test_a_source_kernels_box_parameters_are_made_once_per_box_object():
    """The prelude's offset and extents of a box (six int64) come from the backend's memo while
    the same box object comes back (replayed steps reuse their boxes); an equal but new box,
    or a reused id of a dead one, is computed afresh."""
    from executor.backends.backend import box_parameters
    cache: dict = {}
    box = Box((2, 3), (10, 7))
    first = box_parameters(box, cache)
    assert first == (2, 3, 0, 8, 4, 1) and all(type(v) is np.int64 for v in first)
    assert box_parameters(box, cache) is first
    other = Box((2, 3), (10, 7))
    assert box_parameters(other, cache) == first and box_parameters(other, cache) is not first
    cache[id(box)] = (object(), ("stale",))          # an id now naming another object: not a hit
    assert box_parameters(box, cache) == first
    for k in range(5000):                            # a new box every step: the memo starts over
        box_parameters(Box((k,), (k + 1,)), cache)
    assert len(cache) <= 4096
    assert box_parameters(Box((1,), (4,)), None) == (1, 0, 0, 3, 1, 1)
