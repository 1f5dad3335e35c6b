"""Collective groups' mpi4py communicators, whose pickled reductions never block holding the GIL."""
from __future__ import annotations

from typing import Any


def _make_collective_comm_class(mpi: Any) -> type:
    class CollectiveComm(mpi.Intracomm):
        """The mpi4py communicator of a collective group, with pickled reductions that
        never block while holding the GIL.

        mpi4py's pickled ``reduce``/``allreduce``/``scan``/``exscan`` duplicate the
        communicator on first use (``MPI_Comm_dup``, a blocking collective) *while
        holding the GIL* (measured: another thread got 2 of ~900 time slices in 1 s).
        While one rank sits there, none of its other threads run.  Two groups whose
        first reductions run at once on different lanes, in different orders on
        different ranks, then deadlock: rank 0 holds its GIL in group A's duplicate,
        waiting for rank 1, which holds its GIL in group B's (the fuzzer found it on
        4 ranks; an ``Ibarrier`` before the first call does not help, since seeing it
        complete needs the GIL too).  A lane that copies data a peer needs before it
        can reach the call deadlocks the same way.  So these four are mpi4py's
        "naive" reductions instead (what ``mpi4py.rc.fast_reduce = False`` selects):
        the pickled ``gather``/``allgather``/``scatter``, which release the GIL
        while they wait, then the operator applied in rank order.  Everything else
        is the plain ``MPI.Intracomm``.
        """

        def reduce(self, sendobj: Any, op: Any = mpi.SUM, root: int = 0) -> Any:
            items = self.gather(sendobj, root)
            return None if items is None else _in_rank_order(items, op)[-1]

        def allreduce(self, sendobj: Any, op: Any = mpi.SUM) -> Any:
            return _in_rank_order(self.allgather(sendobj), op)[-1]

        def scan(self, sendobj: Any, op: Any = mpi.SUM) -> Any:
            items = self.gather(sendobj, 0)
            return self.scatter(None if items is None else _in_rank_order(items, op), 0)

        def exscan(self, sendobj: Any, op: Any = mpi.SUM) -> Any:
            items = self.gather(sendobj, 0)
            return self.scatter(None if items is None else [None] + _in_rank_order(items, op)[:-1], 0)

    for name in ("reduce", "allreduce", "scan", "exscan"):
        getattr(CollectiveComm, name).__doc__ = getattr(mpi.Intracomm, name).__doc__
    return CollectiveComm


def _in_rank_order(items: list, op: Any) -> list:
    """The prefix reductions of ``items`` (one per rank), ``op`` applied left to right."""
    out = [items[0]]
    for x in items[1:]:
        out.append(op(out[-1], x))
    return out


_collective_comm_class: list = [None]


def collective_comm(mpi: Any, comm: Any) -> Any:
    """``comm`` (same handle) as a ``CollectiveComm``."""
    cls = _collective_comm_class[0]
    if cls is None:
        cls = _collective_comm_class[0] = _make_collective_comm_class(mpi)
    return cls(comm)
