"""Replay of repeating steps through the public API: process CPU µs per task, on and off.

A wave_sim-shaped loop (two buffers swapping roles, a ``neighborhood`` stencil
reading one and read-writing the other) is submitted through ``cl.Queue`` in a dry
run (``CELERITAS_DRY_RUN_NODES``: every graph is built as rank 0 of the cluster, no
kernel runs), so the figure is the runtime's whole cost per task: the application
thread (command group, task graph) plus the scheduler thread (command and
instruction graphs).  Each configuration runs in a fresh process, replay on and off
alternated, and the best of ``--repeat`` runs is kept.

* ``steady``: process CPU per task over ``--steps`` steps after a warm-up.
* ``first``: the same, but every step uses buffers never seen before, so replay never
  hits: the cost of recording templates against lowering without replay.
* ``--memory``: process RSS after 10 000 and after ``--memory-tasks`` tasks (replay on).
* ``--device-memory LIMIT``: every device memory bounded (``CELERITAS_DEVICE_MEMORY_LIMIT``,
  what a CUDA device has by default): the memories' state enters replay's keys.
* ``--residual [read]``: every step also reduces into a residual buffer (``cl.maximum``, as
  jacobi3d's convergence check): the task's own reduction in every template; ``read``:
  and a host task on the master node reads it after every step (the partial results
  gathered there: pushes, await-pushes and a reduction command).  A "task" is then a step.

    python -m benchmarks.bench_replay [--steps 400] [--repeat 3] [--configs 1x1,2x1,2x4,128x4] [--memory]
                                      [--device-memory 1G] [--residual [read]]
"""
from __future__ import annotations

import argparse
import json

from benchmarks.child import run_child

_CHILD = r"""
import json, os, resource, sys, time
import numpy as np
import celeritas as cl
from apps.wave_sim import submit_step

mode, n, steps, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
residual = "" if sys.argv[5] == "none" else sys.argv[5]     # "", "step" or "read"
q = cl.Queue()
if residual:
    # every step also reduces into a residual buffer, as jacobi3d's check does
    res = cl.Buffer(np.zeros((1,), np.float32), name="residual")

    def submit_step(q, up, u, a, b, c, n):
        def cgf(cgh):
            up.access(cgh, cl.one_to_one(), cl.read_write)
            u.access(cgh, cl.neighborhood(1, 1, shape="along_axes"), cl.read)
            red = cl.reduction(res, cgh, cl.maximum, initialize_to_identity=True)
            cgh.parallel_for((n, n), lambda chunk, r: None, name="step", reductions=[red])
        q.submit(cgf)
        if residual == "read":      # (a host task on the master node reads it: partial results gathered)
            def read(cgh):
                res.access(cgh, cl.all(), cl.read)
                cgh.host_task(lambda: None, on=cl.on_master_node)
            q.submit(read)

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

if mode == "steady":
    init = np.zeros((n, n), np.float32)
    u = cl.Buffer(init, name="u"); up = cl.Buffer(init, name="up")
    for _ in range(warm):
        submit_step(q, up, u, 1.0, 1.0, 0.1, n); up, u = u, up
    q.wait()
    t0 = time.process_time()
    for _ in range(steps):
        submit_step(q, up, u, 1.0, 1.0, 0.1, n); up, u = u, up
    q.wait()
    t1 = time.process_time()
    out = {"us_per_task": (t1 - t0) / steps * 1e6}
elif mode == "first":
    bufs = [(cl.Buffer(shape=(n, n), dtype=np.float32), cl.Buffer(np.zeros((n, n), np.float32)))
            for _ in range(steps)]
    for up, u in bufs[:2]:   # (imports and first-use costs out of the way)
        submit_step(q, up, u, 1.0, 1.0, 0.1, n)
    q.wait()
    t0 = time.process_time()
    for up, u in bufs[2:]:
        submit_step(q, up, u, 1.0, 1.0, 0.1, n)
    q.wait()
    t1 = time.process_time()
    out = {"us_per_task": (t1 - t0) / (steps - 2) * 1e6}
else:   # memory
    init = np.zeros((n, n), np.float32)
    u = cl.Buffer(init, name="u"); up = cl.Buffer(init, name="up")
    marks = {}
    for i in range(steps):
        submit_step(q, up, u, 1.0, 1.0, 0.1, n); up, u = u, up
        if i + 1 in (10_000, steps):
            q.wait()
            marks[i + 1] = rss_mb()
    out = {"rss_mb": marks}
rt = q.runtime
stats = {}
for level, gen in (("task", rt.task_manager), ("command", rt.scheduler.cdag), ("instruction", rt.scheduler.igg)):
    rp = getattr(gen, "replay", None)
    if rp is not None:
        stats[level] = rp.stats()
out["replay"] = stats
q.shutdown()
print("RESULT " + json.dumps(out))
"""


def run(mode: str, ranks: int, devices: int, replay: bool, *, n: int, steps: int, warm: int = 40,
        device_memory: str | None = None, residual: str = "") -> dict:
    env = {"CELERITAS_DRY_RUN_NODES": str(ranks), "CELERITAS_DEVICES": f"host:{devices}",
           "CELERITAS_REPLAY": "on" if replay else "off"}
    if device_memory is not None:
        env["CELERITAS_DEVICE_MEMORY_LIMIT"] = device_memory
    return run_child(_CHILD, [mode, n, steps, warm, residual or "none"], env, f"{mode} {ranks}x{devices} replay={replay}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="1x1,2x1,2x4,128x4", help="ranks x devices, comma separated")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs per cell")
    ap.add_argument("-N", "--size", type=int, default=4096)
    ap.add_argument("--memory", action="store_true", help="also the RSS of a long run")
    ap.add_argument("--memory-tasks", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    ap.add_argument("--device-memory", default=None, help="bound every device memory (CELERITAS_DEVICE_MEMORY_LIMIT)")
    ap.add_argument("--residual", nargs="?", const="step", default="", choices=("step", "read"),
                    help="every step also reduces into a residual buffer (jacobi3d's convergence check); "
                         "'read': and a host task on the master node reads it after every step")
    args = ap.parse_args(argv)
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    rows = []
    for ranks, devices in configs:
        best = {}
        for _ in range(args.repeat):
            for mode in ("steady", "first"):
                for replay in (True, False):   # alternated within each repetition
                    steps = args.steps if mode == "steady" else max(12, args.steps // 8)
                    # (fresh buffers every step: a smaller grid keeps their host copies cheap)
                    r = run(mode, ranks, devices, replay, n=args.size if mode == "steady" else 1024, steps=steps,
                            device_memory=args.device_memory, residual=args.residual)
                    k = (mode, replay)
                    if k not in best or r["us_per_task"] < best[k]["us_per_task"]:
                        best[k] = r
        rows.append({"config": f"{ranks}x{devices}",
                     "steady_on": best[("steady", True)]["us_per_task"],
                     "steady_off": best[("steady", False)]["us_per_task"],
                     "first_on": best[("first", True)]["us_per_task"],
                     "first_off": best[("first", False)]["us_per_task"],
                     "replay": best[("steady", True)]["replay"]})
    memory = None
    if args.memory:
        memory = run("memory", 1, 1, True, n=64, steps=args.memory_tasks)["rss_mb"]
    if args.json:
        print(json.dumps({"rows": rows, "memory": memory}))
        return
    from rich.console import Console
    from rich.table import Table
    bounded = f", device memories bounded at {args.device_memory}" if args.device_memory else ""
    if args.residual:
        bounded += ", every step reducing into a residual" + (" that the master node reads" if args.residual == "read"
                                                              else "")
    t = Table(title=f"replay through the public API (dry run, process CPU µs per task{bounded})")
    for col in ("ranks × devices", "replay on", "replay off", "on / off", "first step on", "first step off",
                "first on / off", "hits / misses (of them a task's commands together), instruction graph"):
        t.add_column(col, justify="right")
    for r in rows:
        ig = r["replay"].get("instruction", {})
        t.add_row(r["config"], f"{r['steady_on']:.1f}", f"{r['steady_off']:.1f}",
                  f"{r['steady_on'] / r['steady_off']:.2f}", f"{r['first_on']:.1f}", f"{r['first_off']:.1f}",
                  f"{r['first_on'] / r['first_off']:.2f}",
                  f"{ig.get('hits', 0)} / {ig.get('misses', 0)} ({ig.get('grouped', 0)})")
    Console().print(t)
    if memory is not None:
        marks = sorted((int(k), v) for k, v in memory.items())
        Console().print(f"RSS after {marks[0][0]:,} tasks: {marks[0][1]:.1f} MB; after {marks[-1][0]:,}: "
                        f"{marks[-1][1]:.1f} MB (+{marks[-1][1] - marks[0][1]:.1f} MB)")


if __name__ == "__main__":
    main()
