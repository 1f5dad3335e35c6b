"""MPI requests and standing pilot receives, tested by the thread that waits for them.

There is no progress thread: the executor thread tests its own requests (every
``MpiRequest.test`` is one ``MPI_Test``) and the pilot ring (``PilotRing.poll``)
whenever it looks for work, and while it waits for the network it polls them
itself (see the executor's wait policy), so a completed payload is acted on
by the very thread that issues what depends on it, without a hand-off between
threads.  A ring of standing ``Irecv(ANY_SOURCE)`` pilot receives is always
posted, so a pilot never waits for the receiver to ask for it.

Measured (2 ranks, 2 cores, MPICH 5 shared memory): a receive completes
without the sender making any further MPI call once it posted its send (up to
4 MiB), so only the receiving side has to poll for a transfer to finish.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from ..communicator import CommunicatorError, FlagRequest
from .wire import PILOT_RING, PILOT_TAG, PILOT_WORDS, decode_pilot

log = logging.getLogger("celeritas.mpi")

_MPI_BYTE: list = [None]     # MPI.BYTE, set once MPI is imported (set_mpi_byte)


def set_mpi_byte(byte: Any) -> None:
    _MPI_BYTE[0] = byte


class MpiRequest(FlagRequest):
    """A payload (or pilot) send or receive.

    ``test`` calls ``MPI_Test`` until the request completed, then only reads
    flags; one thread tests a request (MPI forbids completing one request from
    two threads at once): the executor thread for the executor's requests.
    ``keep`` holds whatever MPI reads or writes (the array, a staging copy, the
    raw buffer object) until completion; ``finish`` runs on completion, before
    ``test`` reports it (the staging copy-back).
    """

    __slots__ = ("_req", "_keep", "_status", "_expect", "_finish", "_what")

    def __init__(self, req: Any, keep: Any, *, status: Any = None, expect: int = -1,
                 finish: Callable[[], None] | None = None, what: str = ""):
        self._req = req
        self._keep = keep
        self._done = False
        self._error: BaseException | None = None
        self._status = status
        self._expect = expect
        self._finish = finish
        self._what = what

    def test(self) -> bool:
        if not self._done and not self._progress():
            return False
        if self._error is not None:
            raise self._error
        return True

    def _progress(self) -> bool:
        """One MPI_Test; True once complete (or failed)."""
        try:
            flag = self._req.Test(self._status) if self._status is not None else self._req.Test()
        except Exception as exc:  # noqa: BLE001 - mpi4py raises MPI.Exception
            self._error = CommunicatorError(f"{self._what} failed: {exc}")
            flag = True
        else:
            if flag:
                try:
                    if self._status is not None and self._expect >= 0:
                        got = self._status.Get_count(_MPI_BYTE[0])
                        if got != self._expect:
                            raise CommunicatorError(f"{self._what}: received {got} bytes, expected {self._expect}")
                    if self._finish is not None:
                        self._finish()
                except BaseException as exc:  # noqa: BLE001 - surfaces through test()
                    self._error = exc if isinstance(exc, CommunicatorError) else CommunicatorError(
                        f"{self._what}: {type(exc).__name__}: {exc}")
        if flag:
            self._keep = None
            self._finish = None
            self._done = True
        return flag

    @property
    def done(self) -> bool:
        """Completed (successfully or not) as of the last test; tests nothing."""
        return self._done

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 1e-5
        while not self.test():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)
        return True


class PilotRing:
    """The standing ``Irecv(ANY_SOURCE)`` pilot receives of one communicator.

    Tested head first, which keeps MPI's per-sender order (receives match in
    posting order); decoded pilots go to ``inbox``, which ``poll_pilots`` drains.
    """

    def __init__(self, mpi: Any, comm: Any, inbox: deque):
        self._mpi = mpi
        self._comm = comm
        self.inbox = inbox
        self._status = mpi.Status()
        self.slots: deque = deque()
        for _ in range(PILOT_RING):
            buf = np.zeros(PILOT_WORDS, dtype=np.int64)
            self.slots.append((comm.Irecv([buf, mpi.INT64_T], mpi.ANY_SOURCE, PILOT_TAG), buf))

    def poll(self) -> bool:
        got = False
        slots, status, mpi = self.slots, self._status, self._mpi
        while slots:
            req, buf = slots[0]
            if not req.Test(status):
                break
            self.inbox.append((status.Get_source(), decode_pilot(buf)))
            slots.popleft()
            slots.append((self._comm.Irecv([buf, mpi.INT64_T], mpi.ANY_SOURCE, PILOT_TAG), buf))
            got = True
        return got

    def cancel(self, timeout: float = 2.0) -> None:
        slots, self.slots = self.slots, deque()
        for req, _buf in slots:
            try:
                req.Cancel()
            except Exception:  # noqa: BLE001
                pass
        deadline = time.monotonic() + timeout
        for req, _buf in slots:
            while time.monotonic() < deadline and not req.Test():
                time.sleep(1e-4)


class SendList:
    """Outstanding sends whose completion nobody else waits for (pilots), or that
    teardown must let finish: tested head first whenever one is added, so the
    list stays as short as the sends actually in flight."""

    __slots__ = ("_reqs",)

    def __init__(self) -> None:
        self._reqs: deque[MpiRequest] = deque()

    def add(self, req: MpiRequest) -> None:
        reqs = self._reqs
        while reqs and _finished(reqs[0]):
            reqs.popleft()
        reqs.append(req)

    def pending(self) -> list[MpiRequest]:
        self._reqs = deque(r for r in self._reqs if not _finished(r))
        return list(self._reqs)

    def __len__(self) -> int:
        return len(self._reqs)


def _finished(req: MpiRequest) -> bool:
    try:
        return req.test()
    except CommunicatorError:       # failed: reported through whoever holds the request
        return True
