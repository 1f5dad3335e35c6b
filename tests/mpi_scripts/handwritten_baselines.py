"""The hand-written mpi4py baselines of cluster/workloads.py against the apps' references;
prints ``rank R: ok`` (run on 2 or 3 ranks)."""
import _setup  # noqa: F401
import numpy as np
from mpi4py import MPI

from apps import jacobi3d, nbody, wave_sim
from cluster import workloads

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
problems = []

n, steps = 37, 9
rows, y0, y1 = workloads.wave_mpi4py(comm, wave_sim.initial_condition(n), n, steps)
if not np.array_equal(rows, wave_sim.reference(n, steps)[y0:y1]):
    problems.append("wave_sim rows differ from the reference")

pos = workloads.nbody_mpi4py(comm, None, 50, 3)
ref_pos, _ = nbody.reference(50, 3)
if not np.allclose(pos, ref_pos, rtol=1e-9, atol=1e-12):
    problems.append(f"nbody positions differ: {np.abs(pos - ref_pos).max()}")

m, js = 13, 6
res, planes, first = workloads.jacobi_mpi4py(comm, None, m, js)
ref = jacobi3d.reference(m, js, tol=0.0, check_every=js)
if not np.array_equal(planes[1:-1], ref.u[first + 1:first + planes.shape[0] - 1]):
    problems.append("jacobi3d planes differ from the reference")
if res != ref.residual:
    problems.append(f"jacobi3d residual {res} != {ref.residual}")

print(f"rank {rank}: " + ("ok" if not problems else "; ".join(problems)), flush=True)
