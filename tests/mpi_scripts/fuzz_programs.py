"""A batch of random ``main`` programs under mpiexec, with a choice of feature groups.

usage: fuzz_programs.py FIRST_SEED COUNT [GROUPS]
GROUPS: ``all`` (default), ``none``, or a comma-separated list of differential.GROUPS.
``FUZZ_PILOT_WINDOW=K`` in the environment narrows the MPI communicator's pilot window
(``wire.PILOT_WINDOW``) to K, so that pilots wait for room and payloads take theirs along
out of turn in nearly every transfer.  ``FUZZ_COMPILE_AFTER=K`` compiles a replay template's
builder at its K-th replay (``scheduler.replay.COMPILE_AFTER``, instruction and command templates; 1: at once), and
``FUZZ_REPEAT=N`` makes the programs' loops N times longer (``generate``'s ``repeat``), so that
steps replay and the compiled builders run.  ``FUZZ_CUDA_STAND_IN=US`` runs the batch on the
CUDA backend over the CuPy stand-in (``fake_cupy.stand_in``, items of US µs; with
``CELERITAS_DEVICES=cuda`` or ``cuda:0,0``): the CUDA control flow (kept completions,
waiters, staged transfers, a bounded device memory) under a real MPI.
Prints every failing seed with its tag and features; exit status 1 on a rank where
some program differed (after every rank finished the batch).
"""
import contextlib
import os
import sys

import _setup  # noqa: F401

import celeritas as cl
from differential import GROUPS
from mpi_programs import run_batch


def main(first: int, count: int, groups: str) -> int:
    sel = GROUPS if groups == "all" else () if groups in ("", "none") else tuple(groups.split(","))
    if os.environ.get("FUZZ_PILOT_WINDOW"):
        import executor.mpi.communicator as mpi_communicator
        mpi_communicator.PILOT_WINDOW = int(os.environ["FUZZ_PILOT_WINDOW"])
    if os.environ.get("FUZZ_COMPILE_AFTER"):
        import scheduler.replay as replay
        replay.COMPILE_AFTER = int(os.environ["FUZZ_COMPILE_AFTER"])
    stand_in = contextlib.nullcontext()
    if os.environ.get("FUZZ_CUDA_STAND_IN"):
        import fake_cupy
        stand_in = fake_cupy.stand_in(int(os.environ["FUZZ_CUDA_STAND_IN"]))
    with stand_in:
        q = cl.Queue()
        rank = q.rank
        failures = run_batch(q, range(first, first + count), rank=rank, groups=sel,
                             repeat=int(os.environ.get("FUZZ_REPEAT", "1")))
        igg_replay = q.runtime.scheduler.igg.replay     # (what replay reached on this rank)
        backend = q.runtime.backend_name
        q.shutdown()
    for f in failures:
        print(f"rank {rank}: FAIL {f}", flush=True)
    reached = "" if igg_replay is None else (f" (instruction replay: {igg_replay.hits} replays, "
                                             f"{igg_replay.grouped} of a task's commands together, "
                                             f"{igg_replay.grouped_reductions} with the task's reductions, "
                                             f"{igg_replay.grouped_gathers} gathering partial results, "
                                             f"{igg_replay.chained} found along a chain, "
                                             f"{igg_replay.chained_groups} of them groups)")
    print(f"rank {rank}: {count - len(failures)}/{count} programs match numpy{reached} on {backend}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "all"))
