"""Collective groups' mpi4py communicators, safe for mpi4py's first pickled reduction."""
from __future__ import annotations

import time
from typing import Any

_COMMCTX_METHODS = ("reduce", "allreduce", "scan", "exscan")


def _make_collective_comm_class(mpi: Any) -> type:
    class CollectiveComm(mpi.Intracomm):
        """The mpi4py communicator of a collective group, safe for its first pickled reduction.

        mpi4py's pickled ``reduce``/``allreduce``/``scan``/``exscan`` duplicate the
        communicator on first use (``MPI_Comm_dup``, a blocking collective) *while
        holding the GIL* (measured: another thread got 2 of ~900 time slices in 1 s).
        While one rank sits there, none of its other threads run, including the lane
        that copies data a peer still needs before it can reach the same call: a
        deadlock.  On first use this class therefore waits for every rank in a polled
        ``Ibarrier`` (GIL released) before making that call; then all ranks are
        already there and the duplicate completes at once.  Everything else is the
        plain ``MPI.Intracomm``.
        """

        _celeritas_ready = False

        def _celeritas_prepare(self) -> None:
            req = self.Ibarrier()
            delay = 2e-5
            while not req.Test():
                time.sleep(delay)
                delay = min(delay * 1.5, 1e-3)
            self._celeritas_ready = True

    def prepared_first(name: str):
        plain = getattr(mpi.Intracomm, name)

        def method(self, *args, **kwargs):
            if not self._celeritas_ready:
                self._celeritas_prepare()
            return plain(self, *args, **kwargs)

        method.__name__ = method.__qualname__ = name
        method.__doc__ = plain.__doc__
        return method

    for name in _COMMCTX_METHODS:
        setattr(CollectiveComm, name, prepared_first(name))

    return CollectiveComm


_collective_comm_class: list = [None]


def collective_comm(mpi: Any, comm: Any) -> Any:
    """``comm`` (same handle) as a ``CollectiveComm``."""
    cls = _collective_comm_class[0]
    if cls is None:
        cls = _collective_comm_class[0] = _make_collective_comm_class(mpi)
    return cls(comm)
