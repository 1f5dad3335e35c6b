"""The one thread that tests MPI requests, so neither the executor nor a lane spins on MPI.

Completion is polled with ``Test`` by one progress thread with adaptive
back-off, which wakes the executor (a notifying communicator).  A ring of
standing ``Irecv(ANY_SOURCE)`` pilot receives is always posted, so a pilot never
waits for the receiver to ask for it.
"""
from __future__ import annotations

import logging
import threading
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
    """A payload (or pilot) send or receive, completed by the progress thread.

    ``test`` only reads flags: the progress thread is the single thread that
    calls ``MPI_Test`` on it (MPI forbids completing one request from two
    threads).  ``keep`` holds whatever MPI reads or writes (the array, a
    staging copy, the raw buffer object) until completion; ``finish`` runs on
    completion, before ``test`` reports it (the staging copy-back).
    """

    __slots__ = ("_req", "_keep", "_status", "_expect", "_finish", "_what", "notify")

    def __init__(self, req: Any, keep: Any, *, status: Any = None, expect: int = -1,
                 finish: Callable[[], None] | None = None, what: str = "", notify: bool = True):
        self._req = req
        self._keep = keep
        self._done = False
        self._error: BaseException | None = None
        self._status = status
        self._expect = expect
        self._finish = finish
        self._what = what
        self.notify = notify          # the executor waits for it: wake it on completion

    def _progress(self) -> bool:
        """Progress-thread side: one MPI_Test; True once complete (or failed)."""
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


class Progress:
    """The one thread that tests MPI requests, so the executor never spins.

    Polling backs off while nothing happens: from ``POLL_MIN`` after any event
    up to ``POLL_BUSY_MAX`` while payloads are in flight (bounds the latency a
    halo exchange adds to the critical path) and ``POLL_IDLE_MAX`` while only
    pilot receives are posted.  Measured on 2 cores with 2 ranks (wave_sim
    4096^2): the executor's own 20 us polling cost 20-30 % of the step time in
    CPU and GIL contention with the kernels.  A halo receive is posted a whole
    step before its data arrives, so the busy cap decides how often the thread
    polls during every kernel: a 200 us cap (400 polls in an 80 ms step) gave
    0.81-0.88 of the hand-written version, a 2 ms cap 0.84-1.18 (same runs,
    alternating), with no loss at 1024^2 or in ping-pong latency, since the
    back-off only reaches the cap after a wait ~10x longer.  Events (a completed payload, an arrived pilot) wake the
    executor through its notifier; a keep-alive wake every ``KEEPALIVE`` s lets
    it poll what it checks itself (divergence messages) and recovers it from a
    CPython 3.11 ``SimpleQueue.get(timeout)`` bug that can turn a passed
    deadline into an infinite wait (seen with gdb on an oversubscribed run).
    """

    POLL_MIN = 20e-6
    POLL_BUSY_MAX = 2e-3       # the communicator's poll_max overrides it (CELERITAS_MPI_POLL_MAX_US)
    POLL_IDLE_MAX = 1e-3
    KEEPALIVE = 0.05

    def __init__(self, rank: int, poll_max: float | None = None):
        self._lock = threading.Lock()
        self._new: list[MpiRequest] = []
        self._new_rings: list[PilotRing] = []
        self._requests: list[MpiRequest] = []
        self._rings: list[PilotRing] = []
        self._kick = threading.Event()
        self._drop: PilotRing | None = None
        self._stop = False
        self.error: BaseException | None = None
        self.notifier: Callable[[], None] | None = None
        if poll_max is not None:
            self.POLL_BUSY_MAX = poll_max
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"celeritas-mpi-progress-{rank}")
        self._thread.start()

    def add(self, req: MpiRequest) -> None:
        with self._lock:
            self._new.append(req)
        self._kick.set()

    def add_ring(self, ring: PilotRing) -> None:
        with self._lock:
            self._new_rings.append(ring)
        self._kick.set()

    def remove_ring(self, ring: PilotRing) -> None:
        """Stop testing ``ring`` (returns once the progress thread cannot touch it)."""
        with self._lock:
            if ring in self._new_rings:
                self._new_rings.remove(ring)
            self._drop = ring
        self._kick.set()
        deadline = time.monotonic() + 2.0
        while self._drop is ring and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(1e-4)

    def _notify(self) -> None:
        n = self.notifier
        if n is not None:
            try:
                n()
            except Exception:  # noqa: BLE001 - the executor is gone
                log.debug("notifier failed", exc_info=True)

    def _run(self) -> None:
        delay = self.POLL_MIN
        last_notify = time.monotonic()
        kick = self._kick
        while not self._stop:
            with self._lock:
                if self._new:
                    self._requests.extend(self._new)
                    self._new = []
                if self._new_rings:
                    self._rings.extend(self._new_rings)
                    self._new_rings = []
                drop = self._drop
                if drop is not None:
                    if drop in self._rings:
                        self._rings.remove(drop)
                    self._drop = None
            event = False
            try:
                for ring in self._rings:
                    if ring.poll():
                        event = True
                if self._requests:
                    still = []
                    for r in self._requests:
                        if r._progress():
                            event = event or r.notify
                        else:
                            still.append(r)
                    self._requests = still
            except Exception as exc:  # noqa: BLE001 - MPI failures are final
                log.debug("MPI progress failed: %s", exc)    # surfaces through the communicator
                self.error = exc
                self._notify()
                return
            now = time.monotonic()
            if event:
                delay = self.POLL_MIN
                last_notify = now
                self._notify()
            else:
                busy = any(r.notify for r in self._requests)
                delay = min(delay * 1.25, self.POLL_BUSY_MAX if busy else self.POLL_IDLE_MAX)
                if now - last_notify >= self.KEEPALIVE:
                    last_notify = now
                    self._notify()
            kick.wait(delay)
            kick.clear()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop = True
        self._kick.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def pending_sends(self) -> list[MpiRequest]:
        with self._lock:
            return [r for r in self._requests + self._new if not r._done]
