"""wave_sim and matmul; rank 0 saves the results to OUT (.npz) for an exact comparison.

Run plainly (one rank, the reference) and under mpiexec with 2 and 4 ranks.
"""
import sys

import _setup  # noqa: F401
import numpy as np

import celeritas as cl
from apps import matmul, wave_sim


def main(out: str) -> int:
    q = cl.Queue()
    results = {
        "wave": wave_sim.run(q, 48, 12),
        "wave_odd": wave_sim.run(q, 37, 5),
        "matmul": matmul.run(q, 40),
        "matmul_2d": matmul.run(q, 36, split_2d=True, repeat=2),
    }
    q.wait(barrier=True)
    rank, nranks = q.rank, q.num_ranks
    comm = type(q.runtime.communicator).__name__
    q.shutdown()
    if rank == 0:
        np.savez(out, **results)
    print(f"rank {rank}/{nranks} {comm} ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
