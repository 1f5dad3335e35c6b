"""The applications as timed workloads: one place that knows how to run each app for a given size.

The scaling harness (through ``cluster.run_app`` under ``mpiexec``/``srun``) and the
dry-run study share this table.  A workload is split into ``prepare`` (host-side
inputs, not timed: every rank would build them anyway and numpy set-up is not
what a scaling study measures) and ``run`` (submits the steps; ends without
gathering results, because fencing a whole buffer to every rank is an all-gather
whose cost grows with the rank count and would hide the scaling of the steps).
"""
from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

import celeritas as cl


@dataclass(frozen=True)
class Workload:
    name: str
    prepare: Callable[[int], Any]                       # size -> host inputs
    run: Callable[[cl.Queue, Any, int, int], None]      # (queue, inputs, size, steps)
    size: int                                           # default problem size (strong scaling base)
    steps: int                                          # default step count
    dims: int                                           # work per step grows like size ** dims
    unit: str = "edge length"
    dry_size: int | None = None                         # dry-run default: big enough for 1024 ranks, host data small

    def dry_run_size(self) -> int:
        return self.dry_size if self.dry_size is not None else self.size

    def weak_size(self, base: int, ranks: float) -> int:
        """The size whose work per step is ``ranks`` times that of ``base``."""
        return max(1, int(round(base * ranks ** (1.0 / self.dims))))


def _none(size: int) -> None:
    return None


# ---- apps owned by others: drive their public step functions ---------------------------
def _wave_prepare(n: int) -> np.ndarray:
    from apps import wave_sim
    return wave_sim.initial_condition(n)


def _wave_run(q: cl.Queue, init: np.ndarray, n: int, steps: int) -> None:
    from apps import wave_sim
    u = cl.Buffer(init, name="u")
    up = cl.Buffer(init, name="up")
    for s in range(steps):
        a, b, c = wave_sim.coefficients(s, 0.25, 1.0)
        wave_sim.submit_step(q, up, u, a, b, c, n)
        up, u = u, up
    q.wait()


def _matmul_prepare(n: int):
    from apps import matmul
    return matmul.inputs(n)


def _matmul_run(q: cl.Queue, ab, n: int, steps: int) -> None:
    from apps import matmul
    a = cl.Buffer(ab[0], name="A")
    b = cl.Buffer(ab[1], name="B")
    c = cl.Buffer(shape=(n, n), dtype=np.float32, name="C")
    for _ in range(steps):
        matmul.submit_matmul(q, a, b, c)
    q.wait()


# ---- the apps of this directory's issue: their run() with fetch=False ------------------
def _conv_prepare(n: int) -> np.ndarray:
    from apps import convolution
    return convolution.synthetic_image(n, n)


def _conv_run(q, image, n, steps):
    from apps import convolution
    convolution.run(q, image, iterations=steps, fetch=False)
    q.wait()


def _reduction_prepare(n: int) -> np.ndarray:
    from apps import reduction
    return reduction.low_contrast_image(n, n)


def _reduction_run(q, image, n, steps):
    from apps import reduction
    reduction.run(q, image, repeat=steps, fetch=False)
    q.wait()


def _nbody_run(q, _, n, steps):
    from apps import nbody
    nbody.run(q, n, steps, fetch=False)
    q.wait()


def _jacobi_run(q, _, n, steps):
    from apps import jacobi3d
    jacobi3d.run(q, n, steps, tol=0.0, check_every=max(1, steps), fetch=False)   # fixed step count
    q.wait()


def _rsim_run(q, _, n, steps):
    from apps import rsim
    rsim.run(q, n, steps, fetch=False)
    q.wait()


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("wave_sim", _wave_prepare, _wave_run, size=2048, steps=50, dims=2, dry_size=1024),
    Workload("matmul", _matmul_prepare, _matmul_run, size=1024, steps=4, dims=3, dry_size=1024),
    Workload("convolution", _conv_prepare, _conv_run, size=2048, steps=2, dims=2, dry_size=1024),
    Workload("reduction", _reduction_prepare, _reduction_run, size=4096, steps=4, dims=2, dry_size=1024),
    Workload("nbody", _none, _nbody_run, size=2048, steps=5, dims=2, unit="bodies", dry_size=1024),
    Workload("jacobi3d", _none, _jacobi_run, size=128, steps=50, dims=3, dry_size=128),
    Workload("rsim", _none, _rsim_run, size=1024, steps=100, dims=2, unit="patches", dry_size=1024),
)}


def get(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise SystemExit(f"unknown app {name!r}; choose one of {', '.join(WORKLOADS)}") from None


def write_csv(rows: Sequence[dict], path: Path, fields: Sequence[str]) -> Path:
    """One row per measurement, floats to 6 significant digits (what the studies plot from)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        wr.writeheader()
        for row in rows:
            wr.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return path


def count_list(option: str, what: str) -> Callable[[str], list[int]]:
    """An argparse ``type`` for ``--ranks 1,2,4``-style options: sorted distinct positive ints."""
    def parse(text: str) -> list[int]:
        try:
            counts = sorted({int(x) for x in text.split(",") if x.strip()})
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{option} takes a comma-separated list of integers, got {text!r}") from None
        if not counts or counts[0] < 1:
            raise argparse.ArgumentTypeError(f"{option} needs positive {what} counts, got {text!r}")
        return counts
    return parse
