"""Scheduler cost: µs per task for task + command (+ instruction) graph generation.

Topologies: wave_sim (2-D stencil over two buffers, ``neighborhood`` along axes)
and Jacobi (read one buffer with a neighborhood, write the other, swap).
Generators run synchronously on this thread, as on the scheduler thread, with
no executor; the instruction graph is compiled for rank 0 only (the others only
matter for their commands).  Columns: the task graph alone, plus rank 0's command
graph, plus rank 0's instruction graph.

    python -m benchmarks.bench_graphs [--steps 200] [--quick] [--repeat 3] [--cpu]

``--repeat`` reports the best of several runs; ``--cpu`` measures this thread's CPU
time instead of wall time, which keeps numbers comparable on a loaded machine.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from celeritas import range_mappers as rm
from scheduler import command_graph as cg
from scheduler import task_graph as tg
from scheduler.instruction_graph_generator import InstructionGraphGenerator, SystemInfo
from scheduler.replay import Replay
from scheduler.scheduler import Lookahead


def _wave_sim(submit, buffer, n: int, steps: int) -> None:
    up, u = buffer((n, n)), buffer((n, n))
    for _ in range(steps):
        submit((n, n), [(up, rm.one_to_one(), tg.READ_WRITE),
                        (u, rm.neighborhood(1, 1, shape="along_axes"), tg.READ)], "2d")
        up, u = u, up


def _jacobi(submit, buffer, n: int, steps: int) -> None:
    a, b = buffer((n, n)), buffer((n, n))
    for _ in range(steps):
        submit((n, n), [(a, rm.neighborhood(1, 1, shape="along_axes"), tg.READ),
                        (b, rm.one_to_one(), tg.DISCARD_WRITE)], "1d")
        a, b = b, a


TOPOLOGIES = {"wave_sim": _wave_sim, "jacobi": _jacobi}


STAGES = ("task", "command", "instruction")


def measure(topology: str, ranks: int, devices: int, *, steps: int, n: int = 512,
            instructions: bool = True, lookahead: str = "auto", stage: str | None = None,
            clock=time.perf_counter, replay: bool = False) -> float:
    """µs per task for generating the task graph, rank 0's commands and (``instructions``)
    rank 0's instructions; ``stage`` ("task", "command", "instruction") overrides
    ``instructions`` and stops the pipeline after that stage."""
    if stage is None:
        stage = "instruction" if instructions else "command"
    commands = stage != "task"
    instructions = stage == "instruction"
    cdags: list[cg.CommandGraphGenerator] = []
    igg = InstructionGraphGenerator(SystemInfo(devices, None, frozenset((1,))), rank=0, num_ranks=ranks,
                                    replay=Replay() if replay else None)
    la = Lookahead(igg, lookahead)
    out: list = []
    n_tasks = [0]
    # in a real run every rank builds only its own commands: rank 0's cost is what counts,
    # so only rank 0's command graph is generated (the others would run in parallel).
    cdag = cg.CommandGraphGenerator(ranks, 0, diagnostics="off", replay=Replay() if replay else None)
    cdags.append(cdag)

    def on_task(t: tg.Task) -> None:
        n_tasks[0] += 1
        if not commands:
            return
        cmds = cdag.build(t)
        if instructions:
            la.push_task(cmds, out)     # (as Scheduler._process does)
        out.clear()

    tm = tg.TaskManager(on_task=on_task, diagnostics="off", replay=Replay() if replay else None)
    next_bid = [0]
    wrappers = rm.MapperWrappers()

    def buffer(shape):
        bid = next_bid[0]
        next_bid[0] += 1
        info = tm.create_buffer(bid, shape, np.float32, "", True)
        cdag.create_buffer(info)
        igg.create_buffer(info)
        return bid

    def submit(rng, accesses, split):
        geom = tg.TaskGeometry(len(rng), rng, (0,) * len(rng), (1,) * len(rng))
        accs = [tg.BufferAccess(b, mode, *wrappers.wrap(m, buffer_label=f"B{b}", buffer_dims=2, global_box=geom.box))
                for b, m, mode in accesses]
        tm.submit(tg.DEVICE_COMPUTE, geometry=geom, accesses=accs, split=split)

    t0 = clock()
    TOPOLOGIES[topology](submit, buffer, n, steps)
    tm.epoch(tg.EPOCH_SHUTDOWN)
    la.flush(out)
    return (clock() - t0) / max(1, n_tasks[0]) * 1e6


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="fewer steps (CI smoke run)")
    p.add_argument("--repeat", type=int, default=1, help="best of this many runs per cell")
    p.add_argument("--cpu", action="store_true", help="thread CPU time instead of wall time")
    args = p.parse_args(argv)
    steps = 20 if args.quick else args.steps
    clock = time.thread_time if args.cpu else time.perf_counter
    console = Console()
    t = Table(title=f"scheduler µs per task ({steps} steps, best of {args.repeat}"
                    f"{', CPU time' if args.cpu else ''}; lower is better)")
    t.add_column("topology")
    t.add_column("ranks × devices")
    t.add_column("task", justify="right")
    t.add_column("task + command", justify="right")
    t.add_column("task + command + instruction", justify="right")
    rows = [("wave_sim", 1, 1), ("wave_sim", 4, 1), ("wave_sim", 16, 1), ("jacobi", 1, 1), ("jacobi", 4, 1),
            ("jacobi", 16, 1), ("wave_sim", 2, 1), ("wave_sim", 1, 4), ("wave_sim", 128, 4)]
    for topo, ranks, devices in rows:
        cells = [min(measure(topo, ranks, devices, steps=steps, stage=stage, clock=clock)
                     for _ in range(max(1, args.repeat))) for stage in STAGES]
        t.add_row(topo, f"{ranks} × {devices}", *(f"{c:.1f}" for c in cells))
    console.print(t)
    console.print("Reference: the C++ Celerity runtime needs about 26 µs per task on the wave_sim topology.")


if __name__ == "__main__":
    main()
