"""Two collective groups' first pickled reductions, at once, in opposite orders on the ranks.

Each rank runs one thread per group (as two collective host tasks on two host lanes
would); rank 0 starts group A's reductions first, rank 1 group B's, and the other
group's thread follows 0.3 s later.  With mpi4py's own pickled reductions, each rank's
first one duplicates the communicator holding the GIL: rank 0 waits in A's duplicate
for rank 1, which waits in B's for rank 0, and neither's other thread can run.  The
``CollectiveComm`` reductions must all finish, with mpi4py's results (rank order).
Prints ``rank R: ok``.
"""
import threading
import time

import _setup  # noqa: F401
from mpi4py import MPI

from executor.mpi.collective import collective_comm

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
assert size == 2, "run on 2 ranks"
groups = {"A": collective_comm(MPI, world.Dup()), "B": collective_comm(MPI, world.Dup())}
first = "A" if rank == 0 else "B"
results: dict = {}
problems = []


def part(name: str) -> None:
    if name != first:
        time.sleep(0.3)
    c = groups[name]
    v = [rank + 1, name]
    results[name] = (c.allreduce(v), c.reduce(rank + 2, op=MPI.PROD, root=1), c.scan(rank + 1),
                     c.exscan(rank + 1), c.allreduce(rank, op=MPI.MAX), c.reduce(v, root=0))


threads = [threading.Thread(target=part, args=(n,), daemon=True) for n in ("A", "B")]
for t in threads:
    t.start()
for t in threads:
    t.join(30)
    if t.is_alive():
        problems.append("a group's reductions did not finish within 30 s")
for name in ("A", "B") if not problems else ():
    allred, prod, scan, exscan, mx, red = results[name]
    if allred != [1, name, 2, name]:
        problems.append(f"{name}: allreduce gave {allred!r}")
    if prod != (6 if rank == 1 else None):
        problems.append(f"{name}: reduce(PROD, root=1) gave {prod!r}")
    if scan != (1 if rank == 0 else 3):
        problems.append(f"{name}: scan gave {scan!r}")
    if exscan != (None if rank == 0 else 1):
        problems.append(f"{name}: exscan gave {exscan!r}")
    if mx != 1:
        problems.append(f"{name}: allreduce(MAX) gave {mx!r}")
    if red != ([1, name, 2, name] if rank == 0 else None):
        problems.append(f"{name}: reduce(root=0) gave {red!r}")
if problems:
    print(f"rank {rank}: " + "; ".join(problems), flush=True)
    MPI.COMM_WORLD.Abort(1)
print(f"rank {rank}: ok", flush=True)
