"""A batch of random ``main`` programs under mpiexec, with a choice of feature groups.

usage: fuzz_programs.py FIRST_SEED COUNT [GROUPS]
GROUPS: ``all`` (default), ``none``, or a comma-separated list of differential.GROUPS.
Prints every failing seed with its tag and features; exit status 1 on a rank where
some program differed (after every rank finished the batch).
"""
import sys

import _setup  # noqa: F401

import celeritas as cl
from differential import GROUPS
from mpi_programs import run_batch


def main(first: int, count: int, groups: str) -> int:
    sel = GROUPS if groups == "all" else () if groups in ("", "none") else tuple(groups.split(","))
    q = cl.Queue()
    rank = q.rank
    failures = run_batch(q, range(first, first + count), rank=rank, groups=sel)
    q.shutdown()
    for f in failures:
        print(f"rank {rank}: FAIL {f}", flush=True)
    print(f"rank {rank}: {count - len(failures)}/{count} programs match numpy", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "all"))
