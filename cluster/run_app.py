"""Run one workload on every rank of an MPI job and print a machine-readable timing line.

Started by the scaling harness as ``mpiexec -n R python -m cluster.run_app --app wave_sim
--size 2048 --steps 50``; usable by hand under ``srun`` too.  Rank 0 prints one JSON
line on stdout:

    {"app": "wave_sim", "ranks": 4, "devices": 1, "size": 2048, "steps": 50, "seconds": 1.234, ...}

The time runs from a barrier after set-up to a barrier after the last step, so it
is the slowest rank's time for the steps (buffer creation included, input
generation and runtime start-up excluded).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import celeritas as cl
from apps._common import devices, positive

from . import workloads


def measure(app: str, size: int | None = None, steps: int | None = None, *, devices: str | None = None,
            lookahead: str | None = None) -> dict:
    """Time ``app`` on this process's runtime (one rank of a job, or the whole single-rank run)."""
    w = workloads.get(app)
    size = w.size if size is None else size
    steps = w.steps if steps is None else steps
    inputs = w.prepare(size)
    q = cl.Queue(devices=devices, lookahead=lookahead)
    q.wait(barrier=True)
    t0 = time.perf_counter()
    w.run(q, inputs, size, steps)
    q.wait(barrier=True)
    seconds = time.perf_counter() - t0
    info = {"app": app, "rank": q.rank, "ranks": q.num_ranks, "devices": q.num_devices,
            "backend": q.runtime.backend_name, "size": size, "steps": steps, "seconds": seconds}
    q.shutdown()
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--app", required=True, choices=sorted(workloads.WORKLOADS))
    p.add_argument("--size", type=positive, default=None)
    p.add_argument("--steps", type=positive, default=None)
    p.add_argument("--devices", type=devices, default=None, help="CELERITAS_DEVICES for every rank")
    p.add_argument("--lookahead", default=None, choices=["none", "auto", "infinite"])
    args = p.parse_args(argv)
    info = measure(args.app, args.size, args.steps, devices=args.devices, lookahead=args.lookahead)
    if info["rank"] == 0:
        print(json.dumps(info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
