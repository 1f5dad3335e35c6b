"""Dry-run scaling study: the scheduler's cost per task as the cluster grows to 1024 nodes.

    python -m cluster.dry_run [--nodes 1,2,4,...,1024] [--app wave_sim] [--size N] [--steps 32] [--out DIR]

``CELERITAS_DRY_RUN_NODES=N`` makes this process build the task, command and
instruction graphs of rank 0 of an N-rank cluster without running kernels or
moving data, so one machine can show how scheduling cost grows with the rank
count long before a 1024-node allocation is available.  Each point runs the
workload in-process with a fresh runtime and reports the scheduler thread's busy
time per task (``Scheduler.busy_ns / num_tasks``: command and instruction
generation and lookahead, horizons, epochs and buffer creation included) and the
application's wall time per task (submission to the final epoch).  Writes CSV and
a PNG (Agg backend).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.table import Table

import celeritas as cl
from apps._common import devices, positive

from . import workloads

console = Console(stderr=True)
DEFAULT_NODES = [2 ** k for k in range(11)]
CELERITY_CXX_US_PER_TASK = 26.0      # published figure of the C++ runtime on the wave_sim topology
CSV_FIELDS = ["app", "nodes", "devices", "size", "steps", "tasks", "instructions", "scheduler_us_per_task",
              "wall_us_per_task", "host"]


parse_nodes = workloads.count_list("--nodes", "node")


def _one(w: workloads.Workload, nodes: int, size: int, steps: int, devices: str, inputs) -> tuple[int, int, float, int]:
    """(scheduler busy ns, tasks, wall seconds, instructions) of one dry run of ``steps`` steps."""
    old = os.environ.get("CELERITAS_DRY_RUN_NODES")
    os.environ["CELERITAS_DRY_RUN_NODES"] = str(nodes)
    try:
        q = cl.Queue(devices=devices)     # the variable is read once, when the runtime starts
    finally:
        if old is None:
            del os.environ["CELERITAS_DRY_RUN_NODES"]
        else:
            os.environ["CELERITAS_DRY_RUN_NODES"] = old
    rt = q.runtime
    if not rt.dry_run or q.num_ranks != nodes:
        q.shutdown()
        raise RuntimeError(f"the runtime did not start as a dry run of {nodes} nodes (is a runtime already running?)")
    t0 = time.perf_counter()
    w.run(q, inputs, size, steps)
    q.wait()
    wall = time.perf_counter() - t0
    sched = rt.scheduler
    busy_ns = int(getattr(sched, "busy_ns", 0) or 0)
    tasks = int(getattr(sched, "num_tasks", 0) or 0)
    instructions = int(getattr(rt.executor, "num_instructions", 0) or 0)
    q.shutdown()
    return busy_ns, tasks, wall, instructions


def measure(app: str, nodes: int, *, size: int | None = None, steps: int | None = None,
            devices: str = "host:1", inputs=None, repeats: int = 3) -> dict:
    """One dry-run point, the best of up to ``repeats`` runs (fewer when one run takes over 2 s).

    The minimum is the figure least disturbed by other processes on the machine;
    the scheduler's busy time is wall time, so anything that delays its thread
    (other load, the application thread holding the GIL) counts in it.
    """
    w = workloads.get(app)
    size = w.dry_run_size() if size is None else size
    steps = w.steps if steps is None else steps
    if inputs is None:
        inputs = w.prepare(size)
    best = None
    for _ in range(max(1, repeats)):
        busy_ns, tasks, wall, instructions = _one(w, nodes, size, steps, devices, inputs)
        if best is None or busy_ns < best[0]:
            best = (busy_ns, tasks, wall, instructions)
        if wall > 2.0:
            break
    busy_ns, tasks, wall, instructions = best
    tasks = max(1, tasks)
    return {"app": app, "nodes": nodes, "devices": devices, "size": size, "steps": steps, "tasks": tasks,
            "instructions": instructions, "scheduler_us_per_task": busy_ns / 1e3 / tasks,
            "wall_us_per_task": wall * 1e6 / tasks, "host": platform.node()}


def study(apps: Sequence[str], nodes: Sequence[int], *, size: int | None = None, steps: int | None = None,
          devices: str = "host:1", repeats: int = 3, progress: bool = True) -> list[dict]:
    rows = []
    for app in apps:
        w = workloads.get(app)
        inputs = w.prepare(w.dry_run_size() if size is None else size)
        for n in nodes:
            row = measure(app, n, size=size, steps=steps, devices=devices, inputs=inputs, repeats=repeats)
            rows.append(row)
            if progress:
                console.print(f"  {app} dry run on {n} node(s): {row['scheduler_us_per_task']:.0f} µs/task "
                              f"(scheduler), {row['wall_us_per_task']:.0f} µs/task (wall)", soft_wrap=True)
    return rows


def write_csv(rows: Sequence[dict], path: Path) -> Path:
    return workloads.write_csv(rows, path, CSV_FIELDS)


def plot(rows: Sequence[dict], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    nodes = sorted({r["nodes"] for r in rows})
    for app in dict.fromkeys(r["app"] for r in rows):
        group = sorted((r for r in rows if r["app"] == app), key=lambda r: r["nodes"])
        ax.plot([r["nodes"] for r in group], [r["scheduler_us_per_task"] for r in group], "o-",
                label=f"{app}: scheduler busy")
        ax.plot([r["nodes"] for r in group], [r["wall_us_per_task"] for r in group], "s:", alpha=0.6,
                label=f"{app}: wall")
    ax.axhline(CELERITY_CXX_US_PER_TASK, color="k", ls="--", lw=1, label="C++ Celerity, wave_sim (26 µs)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(nodes)
    ax.set_xticklabels([str(n) for n in nodes])
    ax.minorticks_off()
    ax.set_xlabel("simulated nodes (CELERITAS_DRY_RUN_NODES)")
    ax.set_ylabel("µs per task (rank 0)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    r0 = rows[0] if rows else {}
    ax.set_title(f"dry-run scheduling cost, {r0.get('devices', '')} per node, size {r0.get('size', '')}, "
                 f"{r0.get('steps', '')} steps", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=parse_nodes, default=DEFAULT_NODES)
    p.add_argument("--app", default="wave_sim",
                   help=f"one or more (comma-separated) of {', '.join(workloads.WORKLOADS)}")
    p.add_argument("--size", type=positive, default=None, help="problem size (default per app: 1024, so every one of "
                                                           "1024 ranks gets work; 128 for jacobi3d)")
    p.add_argument("--steps", type=positive, default=32)
    p.add_argument("--repeats", type=positive, default=3, help="runs per point (the fastest is kept)")
    p.add_argument("--devices", type=devices, default="host:1",
                   help="devices per simulated node (shapes rank 0's instructions)")
    p.add_argument("--out", default="scaling-results")
    p.add_argument("--name", default=None, help="file name stem (default: dry_run_APP)")
    args = p.parse_args(argv)
    apps = workloads.app_list(p, args.app)
    rows = study(apps, args.nodes, size=args.size, steps=args.steps, devices=args.devices, repeats=args.repeats)
    stem = args.name or f"dry_run_{'_'.join(apps)}"
    csv_path = write_csv(rows, Path(args.out) / f"{stem}.csv")
    png_path = plot(rows, Path(args.out) / f"{stem}.png")
    t = Table(title="dry run: µs per task on rank 0")
    for col in ("app", "nodes", "tasks", "instructions", "scheduler µs/task", "wall µs/task"):
        t.add_column(col, justify="left" if col == "app" else "right")
    for r in rows:
        t.add_row(r["app"], str(r["nodes"]), str(r["tasks"]), str(r["instructions"]),
                  f"{r['scheduler_us_per_task']:.1f}", f"{r['wall_us_per_task']:.1f}")
    console.print(t)
    console.print(f"wrote {csv_path} and {png_path}", soft_wrap=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
