"""Differential random programs for real ``mpiexec`` runs.

The program generator and the sequential numpy interpreter are the shared ones
in ``differential.py`` (the in-process cluster tests use the same), so the MPI
path is held to exactly the same semantics.  What is MPI-specific lives here:
running a batch of programs on one runtime per rank (every rank must run the
same programs in the same order, so a failed comparison is recorded instead of
ending the rank early, which would leave its peers waiting), varying the
lookahead and the oversubscription per program, and gathering every rank's
observations through a collective host task so that each rank can compare the
host-task records of the whole job (partitions of a host task are spread over
the ranks).

Only ``main`` programs run here: the error kinds end a multi-rank MPI job by
design (a failure on one rank aborts every rank), so they run on simulated
clusters only.
"""
from __future__ import annotations

import random

from differential import GROUPS, Mismatch, compare_observations, generate, run_celeritas, run_model

LOOKAHEADS = ("none", "auto", "infinite")
OVERSUBSCRIBE = (1, 3)


def settings_of(seed: int) -> tuple[str, int]:
    return LOOKAHEADS[seed % len(LOOKAHEADS)], OVERSUBSCRIBE[(seed // len(LOOKAHEADS)) % len(OVERSUBSCRIBE)]


def run_program(q, seed: int, *, rank: int, groups=GROUPS, repeat: int = 1) -> str | None:
    """Run program ``seed`` (its loops ``repeat`` times longer) on ``q``; None if it matched
    numpy, else a description."""
    prog = generate(random.Random(seed), kind="main", groups=groups, repeat=repeat)
    want = run_model(prog)
    lookahead, oversubscribe = settings_of(seed)
    q.set_lookahead(lookahead)
    got = run_celeritas(prog, q, oversubscribe=oversubscribe, gather=True)
    try:
        compare_observations(prog, want, got["ranks"], oversubscribe)
    except Mismatch as exc:
        first = str(exc).splitlines()[0]
        return (f"seed {seed} [{exc.tag}] (lookahead {lookahead}, oversubscribe {oversubscribe}, "
                + (f"repeat {repeat}, " if repeat != 1 else "") +
                f"features {', '.join(sorted(prog.features))}): {first}")
    return None


def run_batch(q, seeds, *, rank: int, groups=GROUPS, repeat: int = 1) -> list[str]:
    failures = []
    for seed in seeds:
        f = run_program(q, seed, rank=rank, groups=groups, repeat=repeat)
        if f is not None:
            failures.append(f)
    return failures
