"""The executor alone: instruction batches recorded from real programs, replayed without a scheduler.

    python -m benchmarks.bench_executor [--repeat N] [--iterations N] [--tasks N]

A program runs once under the real runtime while every ``InstructionBatch`` the
scheduler hands to the executor is recorded; the batches are then replayed into a
fresh ``Executor`` on a fresh ``HostBackend`` (the recording ends in the shutdown
epoch).  This isolates what happens after the scheduler hands work over: the
engine, issuing, inline execution and lane hand-offs, retiring.  (The steady
replay drives the body of the executor's loop itself, through its private
methods: a benchmark of the executor's internals.)

Reported per instruction: the executor's CPU time driven batch by batch on the
calling thread ("steady", as batches arrive from a scheduler that keeps up; no
thread wake-ups), and the executor thread's CPU time with every batch submitted at
once ("burst").  With no-op kernels that is the executor's Python per instruction.
Programs:

* ``stencil``: the 128² wave_sim step on ``host:4`` (wave_sim's kernel, or a
  no-op kernel with the same accessors);
* ``tiny``: independent ``parallel_for((4,))`` no-op tasks on ``host:4``.

Each also with every launcher replaced by a function that does nothing ("trivial
launchers"): without celeritas' kernel wrapper (chunk and accessor set-up) what is
left is the executor's own work.
"""
from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import celeritas as cl
from apps import wave_sim
from executor import executor as executor_module
from executor.backends.host import HostBackend
from benchmarks.bench_runtime import noop_step
from celeritas.runtime import GC_THRESHOLDS
from executor.communicator import SingleRankCommunicator


@dataclass
class Recording:
    batches: list
    user_buffers: dict[int, np.ndarray]
    host_objects: dict[int, Any]
    devices: int

    @property
    def num_instructions(self) -> int:
        return sum(len(b.instructions) for b in self.batches)


def record(program: Callable[[cl.Queue], None], devices: int) -> Recording:
    """Run ``program`` on a fresh runtime with ``host:devices`` and keep what reached the executor."""
    cls = executor_module.Executor
    batches: list = []
    buffers: dict[int, np.ndarray] = {}
    objects: dict[int, Any] = {}
    saved = cls.submit, cls.track_user_buffer, cls.track_host_object

    def submit(self, batch):
        batches.append(batch)
        saved[0](self, batch)

    def track_user_buffer(self, bid, array):
        buffers[bid] = np.array(array, copy=True)
        saved[1](self, bid, array)

    def track_host_object(self, hoid, obj):
        objects[hoid] = obj
        saved[2](self, hoid, obj)

    cls.submit, cls.track_user_buffer, cls.track_host_object = submit, track_user_buffer, track_host_object
    try:
        q = cl.Queue(devices=f"host:{devices}")
        program(q)
        q.shutdown()
    finally:
        cls.submit, cls.track_user_buffer, cls.track_host_object = saved
    return Recording(batches, buffers, objects, devices)


def replay(rec: Recording, steady: bool = True) -> tuple[float, float]:
    """(wall seconds, executor CPU seconds) to run every recorded batch.

    ``steady``: the executor's loop is driven on this thread, one batch at a time and
    until the batch's work is done before the next, as the scheduler hands batches over
    in a steady state (no executor thread, so no wake-ups: the executor's own CPU).
    Otherwise every batch is submitted at once to a started executor ("burst": one
    engine holding the whole program).  The garbage collector is tuned as a running
    runtime tunes it (``CELERITAS_GC``)."""
    saved_gc = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        return _replay_steady(rec) if steady else _replay(rec)
    finally:
        gc.set_threshold(*saved_gc)


def _executor(rec: Recording, backend: HostBackend, errors: list) -> executor_module.Executor:
    ex = executor_module.Executor(backend, SingleRankCommunicator(), on_error=lambda e, i: errors.append(e),
                                  name="celeritas-executor-replay")
    for bid, arr in rec.user_buffers.items():
        ex.track_user_buffer(bid, arr.copy())
    for hoid, obj in rec.host_objects.items():
        ex.track_host_object(hoid, obj)
    return ex


def _replay_steady(rec: Recording) -> tuple[float, float]:
    """The body of the executor's loop (``Executor._loop``), one batch at a time."""
    backend = HostBackend(rec.devices)
    errors: list = []
    ex = _executor(rec, backend, errors)
    inbox = ex._inbox
    backend.set_notifier(inbox.put)          # lane completions, as start() registers them
    t0, c0 = time.perf_counter(), time.thread_time()
    for b in rec.batches:
        ex._handle_item(b)
        while not ex._stop:
            progress = ex._step()
            while not inbox.empty():
                ex._handle_item(inbox.get_nowait())
                progress = True
            if not progress:
                if not (ex._by_completion or ex._polled):
                    break
                inbox.wait(0.01)             # work on a lane (a kernel's first run)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    backend.set_notifier(None)
    backend.close()
    if errors:
        raise RuntimeError(f"replay failed: {errors[0]!r}")
    return wall, cpu


def _replay(rec: Recording) -> tuple[float, float]:
    backend = HostBackend(rec.devices)
    errors: list = []
    ex = _executor(rec, backend, errors)
    cpu: list[float] = []
    run = ex._run

    def timed_run() -> None:       # the thread's CPU clock ends with it: read it from inside
        c0 = time.thread_time()
        try:
            run()
        finally:
            cpu.append(time.thread_time() - c0)

    ex._run = timed_run
    t0 = time.perf_counter()
    ex.start()
    for b in rec.batches:
        ex.submit(b)
    ex.join()
    wall = time.perf_counter() - t0
    backend.close()
    if errors:
        raise RuntimeError(f"replay failed: {errors[0]!r}")
    return wall, cpu[0]


def stencil_program(n: int, iterations: int, noop: bool) -> Callable[[cl.Queue], None]:
    def program(q: cl.Queue) -> None:
        a = cl.Buffer(np.ones((n, n), np.float32))
        b = cl.Buffer(np.ones((n, n), np.float32))
        for _ in range(iterations):
            if noop:
                noop_step(q, a, b)
            else:
                wave_sim.submit_step(q, a, b, 1.0, 1.0, 0.1, n)
            a, b = b, a
        q.wait()
    return program


def _noop(chunk) -> None:
    return None


def tiny_program(n: int) -> Callable[[cl.Queue], None]:
    def cgf(cgh):
        cgh.parallel_for((4,), _noop, name="tiny")

    def program(q: cl.Queue) -> None:
        for _ in range(n):
            q.submit(cgf)
        q.wait()
    return program


def with_trivial_launchers(rec: Recording) -> Recording:
    """The recording with every kernel and host task launcher replaced by a function that
    does nothing: what is left is the executor's own work per instruction."""
    import copy
    batches = []
    for b in rec.batches:
        nb = copy.copy(b)
        nb.instructions = []
        for instr in b.instructions:
            if getattr(instr, "launcher", None) is not None:
                instr = copy.copy(instr)
                instr.launcher = _trivial_launcher
            nb.instructions.append(instr)
        batches.append(nb)
    return Recording(batches, rec.user_buffers, rec.host_objects, rec.devices)


def _trivial_launcher(ctx) -> None:
    return None


def measure(rec: Recording, repeat: int, steady: bool = True) -> tuple[float, float]:
    """Best (wall, cpu) µs per instruction over ``repeat`` replays."""
    n = rec.num_instructions
    runs = [replay(rec, steady) for _ in range(repeat)]
    return min(w for w, _ in runs) / n * 1e6, min(c for _, c in runs) / n * 1e6


def main(argv=None) -> None:
    from rich.console import Console
    from rich.table import Table
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--iterations", type=int, default=500)
    p.add_argument("--tasks", type=int, default=2500)
    args = p.parse_args(argv)
    cases = [("128² stencil, no-op kernels, host:4", stencil_program(128, args.iterations, True), args.iterations),
             ("128² stencil, wave_sim kernel, host:4", stencil_program(128, args.iterations, False),
              args.iterations),
             ("tiny no-op tasks, host:4", tiny_program(args.tasks), args.tasks)]
    t = Table(title=f"executor alone: recorded batches replayed (best of {args.repeat}); CPU µs per instruction")
    for col in ("program", "instructions", "steady: CPU", "steady: wall µs/step", "burst: executor thread CPU"):
        t.add_column(col, justify="right" if col != "program" else "left")
    for name, prog, steps in cases:
        rec = record(prog, 4)
        for label, r in ((name, rec), (name + ", trivial launchers", with_trivial_launchers(rec))):
            wall, cpu = measure(r, args.repeat)
            _, burst = measure(r, args.repeat, steady=False)
            n = r.num_instructions
            t.add_row(label, f"{n}", f"{cpu:.2f}", f"{wall * n / steps:.1f}", f"{burst:.2f}")
    Console().print(t)


if __name__ == "__main__":
    main()
