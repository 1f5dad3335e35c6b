"""CPU instructions per task of the application and scheduler threads, counted, not timed.

    python -m benchmarks.bench_instructions [--base REV] [--programs noop,tiny,hop,wave]

Wall and CPU time on a shared 2-core VM move by ±30 % from one hour to the next, which
hides any change to the per-task path smaller than that.  Counting instructions does
not: each program runs as a dry run (``CELERITAS_DRY_RUN_NODES``: every graph is built,
no kernel runs, no executor thread) under valgrind's callgrind, which counts the
instructions every thread executes; two runs of N1 and N2 steps give the count per step
free of start-up, ``(count(N2) - count(N1)) / (N2 - N1)``.  Repeated runs of one tree
agree to within about 1 % (the application thread's waits for the scheduler vary a
little), where timed runs here differ by tens of percent.

``--base REV`` counts the same programs on another revision (checked out into a
temporary git worktree) beside the working tree and prints ``this / base``: a
deterministic A/B of a change to the application or scheduler path.  The executor is
not counted (it does not run in a dry run, and its inline decisions follow measured
wall times): ``bench_executor`` measures it.

Programs (per step):

* ``noop``: the 128² stencil step with a no-op kernel on ``host:4`` (one task: its
  command, 4 kernels and 6 halo copies; a horizon every few steps);
* ``tiny``: a ``parallel_for((4,))`` task with no accesses on ``host:4``;
* ``hop``: a push/await_push round trip (two tasks with user-function range mappers)
  as rank 0 of two ranks, ``host:1``: ``bench_mpi``'s ping-pong;
* ``wave``: ``apps.wave_sim``'s step on a 256² grid as rank 0 of two ranks, ``host:1``
  (an execution, a push and an await-push per step on that rank): ``bench_mpi``'s wave_sim.

Needs valgrind (``apt-get install valgrind``); each program takes about half a minute.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]

# program -> (environment, steps of the short run, steps of the long run)
PROGRAMS = {
    "noop": ({"CELERITAS_DRY_RUN_NODES": "1", "CELERITAS_DEVICES": "host:4"}, 200, 600),
    "tiny": ({"CELERITAS_DRY_RUN_NODES": "1", "CELERITAS_DEVICES": "host:4"}, 500, 1500),
    "hop": ({"CELERITAS_DRY_RUN_NODES": "2", "CELERITAS_DEVICES": "host:1"}, 200, 600),
    "wave": ({"CELERITAS_DRY_RUN_NODES": "2", "CELERITAS_DEVICES": "host:1"}, 200, 600),
}

_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[3])
what, n = sys.argv[1], int(sys.argv[2])
from benchmarks import bench_runtime as br
if what == "tiny":
    br.tiny_tasks(n)
elif what == "hop":
    import numpy as np
    import celeritas as cl
    from benchmarks.bench_mpi import _hop, _round_trips
    q = cl.Queue()
    x = cl.Buffer(np.zeros((1, 8), np.uint8), name="pingpong")
    _round_trips(q, _hop(x), n)
    q.wait()
    q.shutdown()
elif what == "wave":
    import numpy as np
    import celeritas as cl
    from apps.wave_sim import submit_step
    q = cl.Queue()
    u = cl.Buffer(np.zeros((256, 256), np.float32), name="u")
    up = cl.Buffer(np.zeros((256, 256), np.float32), name="up")
    for _ in range(n):
        submit_step(q, up, u, 1.0, 1.0, 0.1, 256)
        up, u = u, up
    q.wait()
    q.shutdown()
else:
    br.stencil(128, n, noop=True)
"""


def count(tree: Path, program: str, steps: int) -> tuple[int, int]:
    """(application thread, scheduler thread) instructions of one dry run of ``steps`` steps.
    The application thread is callgrind's first; the scheduler is the busiest other one."""
    env = {**os.environ, **PROGRAMS[program][0], "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                        sys.executable, "-c", _CHILD, program, str(steps), str(tree)],
                       env=env, cwd=tree, capture_output=True, check=True, timeout=1800)
        totals = {}
        for f in Path(tmp).glob("cg.out-*"):
            for line in f.read_text().splitlines():
                if line.startswith("summary:"):
                    totals[int(f.name.rsplit("-", 1)[1])] = int(line.split()[1])
                    break
    if len(totals) < 2:
        raise RuntimeError(f"callgrind counted {len(totals)} thread(s) of {program!r}, expected the application "
                           f"and the scheduler's")
    first = min(totals)
    app = totals.pop(first)
    return app, max(totals.values())


def per_step(tree: Path, program: str) -> tuple[float, float]:
    """Instructions per step (application, scheduler), start-up subtracted."""
    _env, n1, n2 = PROGRAMS[program]
    with ThreadPoolExecutor(2) as pool:      # (two valgrind processes side by side)
        short, long = pool.map(lambda n: count(tree, program, n), (n1, n2))
    (a1, s1), (a2, s2) = short, long
    return (a2 - a1) / (n2 - n1), (s2 - s1) / (n2 - n1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default=None, help="a git revision to count beside the working tree")
    p.add_argument("--programs", default=",".join(PROGRAMS), help="comma-separated subset of " + ",".join(PROGRAMS))
    args = p.parse_args(argv)
    console = Console()
    if shutil.which("valgrind") is None:
        console.print("[red]bench_instructions needs valgrind[/red] (apt-get install valgrind)")
        return 2
    programs = [x for x in args.programs.split(",") if x]
    unknown = [x for x in programs if x not in PROGRAMS]
    if unknown:
        console.print(f"[red]unknown program(s) {unknown}[/red]; choose from {list(PROGRAMS)}")
        return 2
    base_tree = None
    try:
        if args.base:
            base_tree = Path(tempfile.mkdtemp(prefix="celeritas-base-"))
            subprocess.run(["git", "worktree", "add", "--detach", "-f", str(base_tree), args.base], cwd=ROOT,
                           check=True, capture_output=True)
        title = "thousands of instructions per step (callgrind, dry run)"
        if base_tree is not None:
            title += f": this tree / {args.base} = ratio"
        table = Table(title=title)
        table.add_column("program")
        for col in ("application", "scheduler", "both"):
            table.add_column(col, justify="right")
        for prog in programs:
            app, sched = per_step(ROOT, prog)
            if base_tree is None:
                table.add_row(prog, f"{app / 1e3:.1f}", f"{sched / 1e3:.1f}", f"{(app + sched) / 1e3:.1f}")
            else:
                b_app, b_sched = per_step(base_tree, prog)
                table.add_row(prog, *[f"{new / 1e3:.1f} / {old / 1e3:.1f} = {new / old:.3f}"
                                      for new, old in ((app, b_app), (sched, b_sched), (app + sched, b_app + b_sched))])
        console.print(table)
    finally:
        if base_tree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
