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

Polling without giving the GIL away: mpi4py releases the GIL around every MPI
call, and a lane thread running a kernel's Python takes it at once, so each
unsuccessful test cost the executor a GIL hand-off and back (15 us of wall time
per test of the pilot ring, measured during wave_sim's 1 ms kernels on 2 ranks).
Where the MPI library can be reached through ctypes, a request is first looked
at with ``MPI_Request_get_status`` called through ``ctypes.PyDLL`` (which keeps
the GIL; 0.5 us) and handed to mpi4py's ``Test`` only once it completed.
"""
from __future__ import annotations

import ctypes
import logging
import sys
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from ..communicator import CommunicatorError, FlagRequest
from .wire import PILOT_BATCH, PILOT_RING, PILOT_TAG, PILOT_WORDS, decode_pilot

log = logging.getLogger("celeritas.mpi")

_MPI_BYTE: list = [None]     # MPI.BYTE, set once MPI is imported (set_mpi_byte)


def set_mpi_byte(byte: Any) -> None:
    _MPI_BYTE[0] = byte


class _FlagCall:
    """An MPI function called through ``ctypes.PyDLL`` (``_gil_keeping``) that answers through
    an int flag and fills a status nobody reads.

    Called without ``argtypes``, with its arguments made once as ctypes values (the
    request's or communicator's handle, the flag's pointer, the status as a ``void *``):
    ctypes converting each argument through ``argtypes`` on every call made a look cost
    1.1-1.85 us of CPU against 0.63-0.77 now (mpi4py's own ``Test`` 0.2, but it releases
    the GIL)."""

    def __init__(self, fn: Any):
        self._fn = fn
        self._flag = ctypes.c_int(0)
        self._flag_ref = ctypes.byref(self._flag)
        self._status_buffer = ctypes.create_string_buffer(256)     # larger than any MPI_Status
        self._status = ctypes.cast(self._status_buffer, ctypes.c_void_p)


class QuickTest(_FlagCall):
    """``MPI_Request_get_status`` through ``ctypes.PyDLL``: tests a request without freeing it
    and without releasing the GIL.  ``done(handle)`` is True once the request completed (or
    the call failed: mpi4py's ``Test`` then reports the error)."""

    def done(self, handle: Any) -> bool:
        """``handle``: the request's C handle as ``handle_of`` made it (a ctypes value)."""
        if self._fn(handle, self._flag_ref, self._status) != 0:
            return True
        return self._flag.value != 0


_QUICK: list = [None, False, None]    # the QuickTest, whether finding it was tried, the handles' ctypes type


def quick_test(mpi: Any) -> QuickTest | None:
    """The process's ``QuickTest``, or None where the MPI library cannot be found (not Linux,
    a static build, an unusual handle type): requests are then tested through mpi4py alone."""
    if _QUICK[1]:
        return _QUICK[0]
    _QUICK[1] = True
    try:
        handle_type = _handle_type(mpi, mpi.Request)
        fn = _gil_keeping(handle_type and "MPI_Request_get_status")
        if fn is not None:
            _QUICK[0] = QuickTest(fn)
            _QUICK[2] = handle_type
    except Exception:  # noqa: BLE001 - an optimization only
        log.debug("MPI requests are tested through mpi4py only", exc_info=True)
    return _QUICK[0]


class QuickProbe(_FlagCall):
    """``MPI_Iprobe`` on one communicator through ``ctypes.PyDLL``: whether a message from
    ``source`` with ``tag`` waits, without releasing the GIL.  For channels that are looked
    at often and rarely carry anything (the divergence check's, once a millisecond): an
    mpi4py probe releases the GIL, and taking it back can cost the executor a turn behind
    the busy application or scheduler thread.  (Measured only on a loaded machine: 0.3 ms
    per look on 2 ranks of wave_sim 256²; the sends and receives made GIL-keeping the same
    way gained nothing on a quiet one, see docs/benchmarks.md, so this is a cheap look,
    not a measured speed-up.)"""

    def __init__(self, fn: Any, comm_handle: Any):
        super().__init__(fn)
        self._comm = comm_handle

    def __call__(self, source: int, tag: int) -> bool:
        if self._fn(source, tag, self._comm, self._flag_ref, self._status) != 0:
            return True      # (an error: the mpi4py probe that follows reports it)
        return self._flag.value != 0


def quick_probe(mpi: Any, comm: Any) -> QuickProbe | None:
    """A ``QuickProbe`` of ``comm`` (an mpi4py communicator), or None where the MPI library
    cannot be reached that way (probes then go through mpi4py alone)."""
    try:
        handle_type = _handle_type(mpi, mpi.Comm)
        fn = _gil_keeping(handle_type and "MPI_Iprobe")      # (source and tag: Python ints pass as C ints)
        if fn is not None:
            return QuickProbe(fn, handle_type(mpi._handleof(comm)))
    except Exception:  # noqa: BLE001 - an optimization only
        log.debug("MPI probes go through mpi4py only", exc_info=True)
    return None


def _handle_type(mpi: Any, cls: Any) -> Any:
    """The ctypes type of an MPI handle class's C handles (None: an unusual size)."""
    return {4: ctypes.c_int, 8: ctypes.c_uint64}.get(mpi._sizeof(cls))


def _gil_keeping(name: str | None) -> Any:
    """The MPI library's function ``name`` called through ``ctypes.PyDLL`` (which keeps the
    GIL), or None (not Linux, a static build, no such symbol).  It has no ``argtypes``:
    callers pass ctypes values of the C types (see ``_FlagCall``)."""
    if not name or not sys.platform.startswith("linux"):
        return None
    for path in _mapped_mpi_libraries():
        try:
            fn = getattr(ctypes.PyDLL(path), name)
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        log.debug("calling %s through %s without releasing the GIL", name, path)
        return fn
    return None


def _mapped_mpi_libraries() -> list[str]:
    """Shared libraries of this process whose name says MPI (``libmpi.so.12``, ``libmpi.so.40``)."""
    out: list[str] = []
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.rsplit(None, 1)[-1]
            name = path.rsplit("/", 1)[-1]
            if path.startswith("/") and name.startswith("libmpi") and ".so" in name and path not in out:
                out.append(path)
    return out


def handle_of(mpi: Any, req: Any) -> Any:
    """The C handle of an mpi4py request as a ctypes value, for ``QuickTest`` (None without
    one): made once per request, not converted at every test."""
    if _QUICK[0] is None:
        return None
    try:
        return _QUICK[2](mpi._handleof(req))
    except Exception:  # noqa: BLE001
        return None


class MpiRequest(FlagRequest):
    """A payload (or pilot) send or receive.

    ``test`` calls ``MPI_Test`` until the request completed, then only reads
    flags; one thread tests a request (MPI forbids completing one request from
    two threads at once): the executor thread for the executor's requests.
    ``keep`` holds whatever MPI reads or writes (the array, a staging copy, the
    raw buffer object) until completion; ``finish`` runs on completion, before
    ``test`` reports it (the staging copy-back).
    """

    __slots__ = ("_req", "_keep", "_status", "_expect", "_expect_type", "_finish", "_what", "_handle")

    def __init__(self, req: Any, keep: Any, *, status: Any = None, expect: int = -1,
                 finish: Callable[[], None] | None = None, what: str | tuple = "", handle: int | None = None,
                 expect_type: Any = None):
        self._req = req
        self._handle = handle           # for QuickTest
        self._keep = keep
        self._done = False
        self._error: BaseException | None = None
        self._status = status
        self._expect = expect
        # (past MAX_COUNT bytes: the receive's datatype, whose elements are counted, since an
        # MPI-3 library's byte count of such a message is MPI_UNDEFINED)
        self._expect_type = expect_type
        self._finish = finish
        self._what = what

    def test(self) -> bool:
        if not self._done and not self._progress():
            return False
        if self._error is not None:
            raise self._error
        return True

    def tested_done(self) -> bool:
        """Test once (``MPI_Test``, after a ``QuickTest``); True once complete or failed (a
        failure then surfaces through ``test``)."""
        return self._done or self._progress()

    def _progress(self) -> bool:
        """One MPI_Test (preceded by a QuickTest where there is one); True once complete (or failed)."""
        handle = self._handle
        if handle is not None and not _QUICK[0].done(handle):
            return False
        try:
            flag = self._req.Test(self._status) if self._status is not None else self._req.Test()
        except Exception as exc:  # noqa: BLE001 - mpi4py raises MPI.Exception
            self._error = CommunicatorError(f"{self.what} failed: {exc}")
            flag = True
        else:
            if flag:
                try:
                    if self._status is not None and self._expect >= 0:
                        t = self._expect_type
                        got = self._status.Get_count(_MPI_BYTE[0]) if t is None else self._status.Get_elements(t)
                        if got != self._expect:
                            raise CommunicatorError(f"{self.what}: received {got} bytes, expected {self._expect}")
                    if self._finish is not None:
                        self._finish()
                except BaseException as exc:  # noqa: BLE001 - surfaces through test()
                    self._error = exc if isinstance(exc, CommunicatorError) else CommunicatorError(
                        f"{self.what}: {type(exc).__name__}: {exc}")
        if flag:
            self._keep = None
            self._finish = None
            self._done = True
        return flag

    @property
    def what(self) -> str:
        """What the request moves, for errors: ``what`` as given, or a ``(format, *values)``
        tuple formatted only now (a message's f-string cost every send and receive ~0.3 us)."""
        w = self._what
        return w if type(w) is str else w[0] % w[1:]

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
    Each slot takes a message of up to ``PILOT_BATCH`` pilots (its length says how many).
    """

    def __init__(self, mpi: Any, comm: Any, inbox: deque):
        self._mpi = mpi
        self._comm = comm
        self.inbox = inbox
        self._status = mpi.Status()
        self._quick = quick_test(mpi)
        self._int64 = mpi.INT64_T
        self.messages = 0           # received so far (diagnostics, tests)
        self.slots: deque = deque()
        for _ in range(PILOT_RING):
            self.slots.append(self._post(np.zeros(PILOT_BATCH * PILOT_WORDS, dtype=np.int64)))

    def _post(self, buf: np.ndarray) -> tuple:
        mpi = self._mpi
        req = self._comm.Irecv([buf, mpi.INT64_T], mpi.ANY_SOURCE, PILOT_TAG)
        return req, buf, handle_of(mpi, req)

    def poll(self) -> bool:
        got = False
        slots, status, quick = self.slots, self._status, self._quick
        while slots:
            req, buf, handle = slots[0]
            if handle is not None and not quick.done(handle):
                break
            if not req.Test(status):
                break
            source = status.Get_source()
            count = status.Get_count(self._int64) // PILOT_WORDS
            self.messages += 1
            if count == 1:
                self.inbox.append((source, decode_pilot(buf)))
            else:
                self.inbox.extend([(source, decode_pilot(buf, k)) for k in range(count)])
            slots.popleft()
            slots.append(self._post(buf))
            got = True
        return got

    def cancel(self, timeout: float = 2.0) -> None:
        slots, self.slots = self.slots, deque()
        for req, _buf, _handle in slots:
            try:
                req.Cancel()
            except Exception:  # noqa: BLE001
                pass
        deadline = time.monotonic() + timeout
        for req, _buf, _handle in slots:
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
