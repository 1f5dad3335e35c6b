"""A batch of random programs; each rank compares its fence results with numpy.

usage: random_programs.py FIRST_SEED COUNT
Exit status 1 on a rank where some program differed (after every rank finished
the whole batch, so no rank is left waiting).
"""
import sys

import _setup  # noqa: F401

import celeritas as cl
from mpi_programs import run_batch


def main(first: int, count: int) -> int:
    q = cl.Queue()
    rank = q.rank
    failures = run_batch(q, range(first, first + count), rank=rank)
    q.shutdown()
    for f in failures:
        print(f"rank {rank}: FAIL {f}", flush=True)
    print(f"rank {rank}: {count - len(failures)}/{count} programs match numpy", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
