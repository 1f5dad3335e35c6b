"""Differential random programs for real ``mpiexec`` runs.

The program generator and the sequential numpy interpreter are the shared ones
in ``differential.py`` (the in-process cluster tests use the same), so the MPI
path is held to exactly the same semantics.  What is MPI-specific lives here:
running a batch of programs on one runtime per rank (every rank must run the
same programs in the same order, so a failed comparison is recorded instead of
ending the rank early, which would leave its peers waiting), and varying the
lookahead per program.
"""
from __future__ import annotations

import random
import traceback

from differential import compare, generate, run_celeritas, run_model

LOOKAHEADS = ("none", "auto", "infinite")


def run_program(q, seed: int, *, rank: int) -> str | None:
    """Run program ``seed`` on ``q``; None if it matched numpy, else a description.

    Host-task observations (``sums``) come from ``on_master_node`` tasks, so they
    are compared where the master node runs them (rank 0).
    """
    prog = generate(random.Random(seed))
    want = run_model(prog)
    q.set_lookahead(LOOKAHEADS[seed % len(LOOKAHEADS)])
    got = run_celeritas(prog, q)
    if rank != 0:
        got["sums"] = want["sums"]
    try:
        compare(got, want)
    except AssertionError as exc:
        return (f"seed {seed} (lookahead {LOOKAHEADS[seed % len(LOOKAHEADS)]}): "
                f"{''.join(traceback.format_exception_only(type(exc), exc)).strip()}")
    return None


def run_batch(q, seeds, *, rank: int) -> list[str]:
    failures = []
    for seed in seeds:
        f = run_program(q, seed, rank=rank)
        if f is not None:
            failures.append(f)
    return failures
