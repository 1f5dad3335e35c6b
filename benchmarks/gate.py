"""The "compiled ahead" figures: work submitted behind a gate, compiled, then released.

A host task waits for a ``threading.Event`` while the measured work is submitted behind
it and the scheduler compiles all of it; the clock starts when the gate opens, so what
is timed is the executor (and communicator) alone.  One helper for every benchmark that
reports such a figure, because the work behind the gate must fit in how far the
application may run ahead of the executor (``CELERITAS_MAX_TASKS_AHEAD``): past it
``submit`` waits for the executor, which waits for the gate, which the submitting thread
has not opened yet.  So ``hold`` raises the runtime's bound for the gated stretch and
``release`` restores it: the figures measured without a gate keep the default.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import celeritas as cl

GATE_TIMEOUT_S = 120.0


class Gate(threading.Event):
    """The event the gated host task waits for, with the submit bound to restore at release."""

    def __init__(self, restore_ahead: int | None):
        super().__init__()
        self.restore_ahead = restore_ahead


def hold(q: cl.Queue, tasks: int, access: Callable, **host_task: object) -> Gate:
    """Submit a host task that runs ``access(cgh)`` and waits for the returned gate;
    ``tasks`` is how many tasks the caller submits behind it (host_task's keywords as
    ``cgh.host_task`` takes them)."""
    rt = q.runtime
    needed = 2 * tasks + 2         # (horizons come between the tasks: at most one per task)
    gate = Gate(rt.max_tasks_ahead if needed > rt.max_tasks_ahead else None)
    if gate.restore_ahead is not None:
        rt.max_tasks_ahead = needed

    def gated(cgh):
        access(cgh)
        cgh.host_task(lambda part: gate.wait(GATE_TIMEOUT_S), name="gate", **host_task)

    q.submit(gated)
    return gate


def release(q: cl.Queue, gate: Gate, comm=None) -> float:
    """Compile everything submitted, synchronize the ranks (``comm``), open the gate;
    returns the ``perf_counter`` time the gate opened."""
    q.flush()
    rt = q.runtime
    rt.scheduler.sync()
    if gate.restore_ahead is not None:
        rt.max_tasks_ahead, gate.restore_ahead = gate.restore_ahead, None
    if comm is not None:
        comm.Barrier()
    t0 = time.perf_counter()
    gate.set()
    return t0


def source_launches(q: cl.Queue, kernel: cl.Kernel, count: int, compiled: bool = False) -> float:
    """µs per launch of ``kernel``, a one-work-item source kernel that adds 1 to its one
    accessor's element, through celeritas: one task per launch, timed until the last has
    run (not the fence's copy home), after ten untimed ones (allocation, build, cost
    estimate); ``compiled``: all of them compiled behind a gate first.  The device-path
    benchmarks (``bench_opencl``, ``bench_cuda``) set it beside a bare launch loop."""
    import numpy as np
    x = cl.Buffer(np.zeros(1, np.float32), name="x")

    def cgf(cgh):
        w = x.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((1,), kernel, args=(w,), name=kernel.name)

    for _ in range(10):
        q.submit(cgf)
    q.wait()
    if compiled:
        gate = hold(q, count, lambda cgh: x.access(cgh, cl.all(), cl.read_write))
    t0 = time.perf_counter()
    for _ in range(count):
        q.submit(cgf)
    if compiled:
        t0 = release(q, gate)
    q.wait()
    t = time.perf_counter() - t0
    got = q.fence(x).result()
    assert got[0] == count + 10, got
    return t / count * 1e6


def launch_costs(q: cl.Queue, kernel: cl.Kernel, count: int, reps: int,
                 bare: Callable[[int], float]) -> tuple[float, float, float]:
    """The best of ``reps`` alternating rounds of ``source_launches`` end to end, compiled
    ahead, and the backend's ``bare`` launch loop: (celeritas, compiled, bare) µs per launch."""
    lc = lg = lb = float("inf")
    for _ in range(reps):
        lc = min(lc, source_launches(q, kernel, count))
        lg = min(lg, source_launches(q, kernel, count, compiled=True))
        lb = min(lb, bare(count))
    return lc, lg, lb
