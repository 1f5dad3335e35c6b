"""The MPI communicator (mpi4py): how ranks of a real cluster talk to each other.

Wire protocol, on a private duplicate of ``COMM_WORLD`` so nothing a user does on
``COMM_WORLD`` can match celeritas' messages:

* **pilots** travel on ``PILOT_TAG``, up to ``PILOT_BATCH`` of 12 x int64 to a
  message; a ring of standing ``Irecv(ANY_SOURCE)`` receives is always posted,
  so a pilot never waits for the receiver to ask for it.  The ring is tested
  head first, which keeps MPI's per-sender order (receives match in posting
  order).  At most ``PILOT_WINDOW`` pilots to one rank are out ahead of their
  payloads; later ones wait here until there is room for a message of them,
  and a payload whose pilot still waits takes it along first (see
  ``send_pilots``).
* **payloads** use ``Isend``/``Irecv`` on a per-message tag derived from the
  sender's ``msg_id`` (unique per sender), straight from / into the allocation
  (see ``wire``).
* completion is tested (``MPI_Test``) by the executor thread itself, which
  issues what depends on a payload the moment it sees it arrive: no progress
  thread, no hand-off between threads on the critical path of a hop.  While
  the executor has nothing but the network left to wait for, it polls for
  ``poll_spin`` seconds, then sleeps between polls from ``poll_min`` up to
  ``poll_max`` (further while its lane work runs: see the executor's wait
  policy); with nothing outstanding it does not poll at all.  The only blocking
  waits (``barrier``, a clone's ``Idup``) are ``Test`` loops with short sleeps,
  so the GIL is never held while waiting and divergence messages keep being
  checked.
* collective groups are ``Idup`` clones: cloning never blocks, and a communicator
  has one ``Idup`` of itself in flight at a time, posted in the order the clones
  were made (the next once the one before completed).  The executor tests the
  pending clones with its other requests and never waits for one: a collective
  host task whose clone is incomplete is issued anyway, and its host lane waits.
* **divergence check** (``EpochCheck``): ranks compare their task streams at
  every epoch (see ``divergence``).
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import deque
from itertools import islice
from typing import Any, Callable, Hashable

from scheduler.errors import ConfigError
from scheduler.instruction_graph import Pilot

from ..communicator import Communicator, CommunicatorError, Request
from . import wire
from .abort import abort_world, failure_origin, install_excepthook
from .collective import collective_comm
from .cuda_aware import mpi_cuda_support
from .divergence import DEFAULT_DIVERGENCE_TIMEOUT, EpochCheck
from .launch import import_mpi, library_version, thread_level_name
from .progress import MpiRequest, PilotRing, SendList, handle_of, quick_probe, quick_test, set_mpi_byte
from .wire import (PAYLOAD_TAG_BASE, PILOT_BATCH, PILOT_TAG, PILOT_WINDOW, STRIDED_POLICIES, DatatypeCache,
                   Spec, buffer_spec, encode_pilots)

log = logging.getLogger("celeritas.mpi")

_UNSTARTED = object()   # a clone whose Idup its parent has yet to post (see MpiCommunicator.clone)
_CLONING = "the other ranks to clone a collective group communicator"   # (what a clone's wait is for)

_UNKNOWN = object()    # MpiCommunicator.cuda_aware not asked yet


class MpiCommunicator(Communicator):
    """One rank's endpoint over MPI (see the module docstring for the protocol).

    ``MpiCommunicator()`` duplicates ``COMM_WORLD``; ``comm=`` duplicates another
    mpi4py intracommunicator.  Not notifying: the executor polls it (pilots and
    its requests' ``test``) on its own thread.
    """

    notifies = False
    accepts_strided = True
    settings_may_differ = True
    POLL_SPIN = 500e-6          # defaults of the executor's polling (see Communicator)
    POLL_MIN = 20e-6
    POLL_MAX = 2e-3

    @property
    def cuda_aware(self) -> bool | None:    # type: ignore[override]
        if self._cuda_aware is _UNKNOWN:
            self._cuda_aware = mpi_cuda_support()
        return self._cuda_aware

    def __init__(self, comm: Any = None, *, strided: str = "auto", poll_max: float | None = None,
                 poll_spin: float | None = None,
                 divergence_timeout: float | None = DEFAULT_DIVERGENCE_TIMEOUT,
                 divergence_timeout_hint: str | None = None, cuda_aware: bool | None = None,
                 install_hooks: bool | None = None):
        """``strided``: how strided boxes travel (see ``wire.use_datatype``);
        ``poll_max``: the executor's longest sleep (s) between polls while sends or
        receives are outstanding and nothing else is in flight (with lane work in
        flight the sleeps grow past it, see the executor's wait policy);
        ``poll_spin``: how long (s) it polls without pause first, once nothing but
        the network is left to wait for (0: never);
        ``divergence_timeout``: how long (s, None: forever) a shutdown or
        barrier epoch waits for the neighbour's matching epoch, and
        ``divergence_timeout_hint`` where users set it (named in the error);
        ``cuda_aware``: the answer to "can MPI take CUDA pointers" when the user
        knows it (None: ask the library).  Bad values fail before any MPI call."""
        policy = strided.lower()
        if policy not in STRIDED_POLICIES:
            raise ConfigError(f"strided payload policy {strided!r}; use auto, datatype or staging")
        if poll_max is not None and not poll_max > 0:
            raise ConfigError(f"MPI poll interval {poll_max!r} s must be > 0")
        if poll_spin is not None and not poll_spin >= 0:
            raise ConfigError(f"MPI spin time {poll_spin!r} s must be >= 0")
        if divergence_timeout is not None and not divergence_timeout > 0:
            raise ConfigError(f"divergence timeout {divergence_timeout!r} s must be > 0 (or None)")
        MPI = import_mpi()
        set_mpi_byte(MPI.BYTE)
        quick_test(MPI)
        base = MPI.COMM_WORLD if comm is None else comm
        self._setup(MPI, base.Dup(), None, None, DatatypeCache(MPI), policy)
        if cuda_aware is not None:
            self._cuda_aware = bool(cuda_aware)
        if self._size > 1:
            channel = self._comm.Dup()
            self.epoch_check = EpochCheck(channel, self._rank, self._size, divergence_timeout,
                                          timeout_hint=divergence_timeout_hint, quick_probe=quick_probe(MPI, channel))
        self.poll_spin = self.POLL_SPIN if poll_spin is None else float(poll_spin)
        self.poll_min = self.POLL_MIN
        self.poll_max = self.POLL_MAX if poll_max is None else float(poll_max)
        self._start_ring()
        if install_hooks is None:
            install_hooks = comm is None and self._size > 1
        if install_hooks:
            install_excepthook(self._rank)
        atexit.register(self.close)
        log.info("MPI communicator: rank %d of %d, %s, %s", self._rank, self._size,
                 library_version(MPI), thread_level_name(MPI.Query_thread()))

    def _setup(self, mpi: Any, comm: Any, root: "MpiCommunicator | None", pending: Any,
               types: DatatypeCache, strided: str) -> None:
        self._mpi = mpi
        self._comm = comm
        self._root = root
        # a clone's Idup request (_UNSTARTED until its parent posts it; None once complete), its
        # parent and this communicator's clones whose Idup has yet to complete, oldest first: a
        # parent has one Idup in flight at a time (see clone)
        self._pending_dup = pending
        self._parent: MpiCommunicator | None = None
        self._clones: deque[MpiCommunicator] = deque()
        # (one lock for a process's tree of clones: the executor and a host lane may test one
        # clone at once, and an MPI request must not be tested from two threads at once)
        self._dup_lock = threading.Lock() if root is None else root._dup_lock
        self._types = types
        self._strided = strided
        self._cuda_aware: Any = root._cuda_aware if root is not None else _UNKNOWN
        self.epoch_check: EpochCheck | None = None
        if root is None:
            self._rank = comm.Get_rank()
            self._size = comm.Get_size()
            self._tag_span = int(comm.Get_attr(mpi.TAG_UB) or 32767) - PAYLOAD_TAG_BASE + 1
        else:
            # a duplicate has the original's rank and size; the new handle must not
            # be touched before its Idup completes
            self._rank, self._size, self._tag_span = root._rank, root._size, root._tag_span
        self._ring: PilotRing | None = None
        self._pilot_inbox: deque = deque()
        self._pilot_sends = SendList()
        # the pilot window (see send_pilots), per receiving rank: the messages whose pilot went
        # out before their payload, and the pilots held back, msg id -> pilot, oldest first
        self._ahead: dict[int, set[int]] = {}
        self._held: dict[int, dict[int, Pilot]] = {}
        self._payload_sends = SendList()       # for close(): let them finish before MPI_Finalize
        self._handle: Any = None
        self._closed = False

    @classmethod
    def _clone_of(cls, root: "MpiCommunicator", comm: Any, request: Any) -> "MpiCommunicator":
        self = cls.__new__(cls)
        self._setup(root._mpi, comm, root, request, root._types, root._strided)
        return self

    # ---- identity
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def num_ranks(self) -> int:
        return self._size

    @property
    def mpi_comm(self) -> Any:
        """The underlying mpi4py communicator (after a clone's duplicate completed)."""
        self._ensure_ready()
        return self._comm

    def _check_rank(self, r: int) -> None:
        if not 0 <= r < self._size or r == self._rank:
            raise CommunicatorError(f"rank {self._rank} cannot talk to rank {r} ({self._size} ranks)")

    def _payload_tag(self, msg_id: int) -> int:
        return PAYLOAD_TAG_BASE + msg_id % self._tag_span

    # ---- waiting (never holds the GIL)
    def _divergence_poll(self, stalled: float = 0.0) -> None:
        root = self._root if self._root is not None else self
        chk = root.epoch_check
        if chk is not None:
            chk.poll(stalled)

    def _wait(self, test: Callable[[], bool], what: str, divergence: bool = True) -> None:
        """Poll ``test`` with short sleeps; keep checking for divergence meanwhile (not on a
        host lane: ``divergence`` False; the executor checks).  (A long wait is reported by the
        runtime's application thread, which says what it waits for.)"""
        delay = 2e-5
        t0 = time.monotonic()
        next_note = t0 + 30.0
        now = t0
        while not test():
            # (stalled for as long as it waits here: a rank blocked in a barrier shows its
            # neighbour its pending tasks, as a rank waiting for data does)
            if divergence:
                self._divergence_poll(now - t0)
            time.sleep(delay)
            # (up to 1 ms, and in a long wait up to a 32nd of it: a rank blocked in a barrier
            # behind a peer that computes for seconds woke ~930 times a second, 5-7 % of a core)
            delay = min(delay * 1.5, max(1e-3, (now - t0) / 32))
            now = time.monotonic()
            if now >= next_note:
                next_note = now + 60.0
                log.debug("rank %d has been waiting %.0f s for %s", self._rank, now - t0, what)

    def _ensure_ready(self, divergence: bool = True) -> None:
        if self._pending_dup is not None:
            self._wait(self.clone_completed, _CLONING, divergence)

    def clone_completed(self) -> bool:
        with self._dup_lock:
            return self._dup_progress()

    def wait_cloned(self) -> None:
        self._ensure_ready(divergence=False)

    def _dup_progress(self) -> bool:
        """(``_dup_lock`` held) Whether this communicator is complete, after posting and
        testing what comes before it (its parent's own duplicate, then its parent's older
        clones, one at a time); once it is, its own clones are advanced too."""
        if self._pending_dup is not None:
            parent = self._parent
            if parent is None or not parent._dup_progress() or self._pending_dup is not None:
                return False
        self._advance_clones()
        return True

    def _advance_clones(self) -> None:
        """(``_dup_lock`` held; this communicator complete) Post the oldest pending clone's
        ``Idup`` where it has not been posted yet and test it; the next one only once it
        completed."""
        clones = self._clones
        while clones:
            c = clones[0]
            if c._pending_dup is _UNSTARTED:
                try:
                    c._comm, c._pending_dup = self._comm.Idup()
                except Exception as exc:  # noqa: BLE001
                    raise CommunicatorError(f"rank {self._rank}: cloning the communicator failed: {exc}") from exc
            if not c._pending_dup.Test():
                return
            c._pending_dup = None
            clones.popleft()

    # ---- pilots
    def _start_ring(self) -> None:
        self._ring = PilotRing(self._mpi, self._comm, self._pilot_inbox)

    def send_pilot(self, to: int, pilot: Pilot) -> None:
        """``send_pilots([pilot])`` (``pilot.to`` is ``to``)."""
        if pilot.to != to:
            raise CommunicatorError(f"rank {self._rank}: pilot of message {pilot.msg_id} is for rank "
                                    f"{pilot.to}, sent to rank {to}")
        self.send_pilots([pilot])

    def send_pilots(self, pilots: list[Pilot]) -> None:
        """Announce payloads (each to its ``to``), now or, while ``PILOT_WINDOW`` pilots to that
        rank are out ahead of their payloads, once enough of those payloads went (or with
        its own payload).  Pilots that go now go together, ``PILOT_BATCH`` to a message.

        The scheduler runs ahead, and its pilots go out when the executor accepts their
        batch: in a ping-pong with the application thread thousands of tasks ahead, each rank
        had hundreds of pilots in flight to its peer.  MPICH's shared-memory transport takes
        64 small messages to a rank and queues the rest on the sender, where they move only
        while the sender calls into MPI, and a payload queued behind them waits as long: the
        8 B hop took 290-370 us instead of 85 in one run of three, its sender asleep between
        polls (up to the poll interval's 2 ms) while the receiver got 3 pilots per wake-up.
        A window of pilots ahead keeps the library's queue short without making anyone
        wait: a receiver needs a pilot only to match the payload it announces, and that
        payload never travels before it.

        Batched because a rank ahead of its executor fills the window at once, and then
        each payload used to release one waiting pilot: every message cost a second send,
        and the receiver a second completion of its pilot ring and a re-posted receive,
        each a few microseconds of Python on the hop's path.  Held pilots now go when
        there is room for a whole message of them (``send_payload``)."""
        if self._closed:
            raise CommunicatorError(f"rank {self._rank}: communicator closed")
        self._ensure_ready()
        now: dict[int, list[Pilot]] = {}
        for pilot in pilots:
            to = pilot.to
            go = now.get(to)
            if go is None:
                self._check_rank(to)
                go = now[to] = []
            if pilot.box.empty:     # (announces that nothing is sent: no payload will release it)
                go.append(pilot)
                continue
            ahead = self._ahead.get(to)
            if ahead is None:
                ahead = self._ahead[to] = set()
            held = self._held.get(to)
            if held or len(ahead) >= PILOT_WINDOW:
                if held is None:
                    held = self._held[to] = {}
                held[pilot.msg_id] = pilot
                continue
            ahead.add(pilot.msg_id)
            go.append(pilot)
        for to, go in now.items():
            if go:
                self._isend_pilots(to, go)

    def _isend_pilots(self, to: int, pilots: list[Pilot]) -> None:
        for k in range(0, len(pilots), PILOT_BATCH):
            buf = encode_pilots(pilots[k:k + PILOT_BATCH])
            try:
                req = self._comm.Isend([buf, self._mpi.INT64_T], to, PILOT_TAG)
            except Exception as exc:  # noqa: BLE001
                raise CommunicatorError(f"rank {self._rank}: pilot to rank {to} failed: {exc}") from exc
            self._pilot_sends.add(MpiRequest(req, buf, what=("pilots to rank %d", to),
                                             handle=handle_of(self._mpi, req)))

    @property
    def pilot_messages(self) -> int:
        """Pilot messages received so far (each carries 1 to ``PILOT_BATCH`` pilots)."""
        return 0 if self._ring is None else self._ring.messages

    @property
    def held_pilots(self) -> int:
        """Pilots waiting for room in the window (see ``send_pilot``)."""
        return sum(len(h) for h in self._held.values())

    def poll_pilots(self) -> list[tuple[int, Pilot]]:
        if self._closed:
            return []
        ring = self._ring
        if ring is None:
            self._ensure_ready()
            self._start_ring()
            ring = self._ring
        try:
            ring.poll()
        except Exception as exc:  # noqa: BLE001 - MPI failures are final
            raise CommunicatorError(f"rank {self._rank}: receiving pilots failed: {exc}") from exc
        inbox = self._pilot_inbox
        if not inbox:
            return []
        out = []
        pop = inbox.popleft
        while inbox:
            out.append(pop())
        return out

    # ---- payloads
    def _spec(self, arr: Any, receive: bool) -> Spec:
        return buffer_spec(self._mpi, arr, receive, self._strided, self._types)

    def send_payload(self, to: int, msg_id: int, array: Any) -> Request:
        self._check_rank(to)
        self._ensure_ready()
        spec, keep, _finish, _n = self._spec(array, receive=False)
        ahead = self._ahead.get(to)
        held = self._held.get(to)
        if ahead is not None and msg_id in ahead:
            ahead.discard(msg_id)
        elif held:          # its pilot waits in the window: it goes first, out of turn
            pilot = held.pop(msg_id, None)
            if pilot is not None:
                self._isend_pilots(to, [pilot])
        try:
            req = self._comm.Isend(spec, to, self._payload_tag(msg_id))
        except Exception as exc:  # noqa: BLE001
            raise CommunicatorError(f"rank {self._rank}: send of message {msg_id} to rank {to} failed: {exc}") \
                from exc
        r = MpiRequest(req, keep, what=("send of message %d to rank %d", msg_id, to), handle=handle_of(self._mpi, req))
        # tested once here: a send that left at once (a small message goes into the library's
        # eager buffer) has nothing for close() to wait for, and the caller's first test only
        # reads its flags
        if not r.tested_done():
            if len(self._payload_sends) > 64:       # keep the teardown list short
                self._payload_sends.pending()
            self._payload_sends.add(r)
        if held and ahead is not None:
            # room in the window for a message of held pilots (or for all of them): the oldest go
            room = PILOT_WINDOW - len(ahead)
            if room >= min(PILOT_BATCH, PILOT_WINDOW, len(held)):
                go = list(islice(held, room))
                for m in go:
                    ahead.add(m)
                self._isend_pilots(to, [held.pop(m) for m in go])
        return r

    def receive_payload(self, from_rank: int, msg_id: int, out_array: Any) -> Request:
        self._check_rank(from_rank)
        self._ensure_ready()
        spec, keep, finish, nbytes = self._spec(out_array, receive=True)
        try:
            req = self._comm.Irecv(spec, from_rank, self._payload_tag(msg_id))
        except Exception as exc:  # noqa: BLE001
            raise CommunicatorError(f"rank {self._rank}: receive of message {msg_id} from rank {from_rank} "
                                    f"failed: {exc}") from exc
        return MpiRequest(req, keep, status=self._mpi.Status(), expect=nbytes, finish=finish,
                          what=("receive of message %d from rank %d", msg_id, from_rank),
                          handle=handle_of(self._mpi, req),
                          expect_type=spec[2] if nbytes > wire.MAX_COUNT else None)

    # ---- groups, barrier, collectives
    def clone(self, key: Hashable | None = None) -> "MpiCommunicator":
        """An ``Idup`` of this communicator: returns at once, never waiting; the duplicate
        completes in the background (``clone_completed`` tests it) and is waited for on first
        use.  Every rank clones in the same order, which the deterministic instruction stream
        guarantees, and each communicator has one ``Idup`` in flight at a time: the next is
        posted once the one before completed (Open MPI 4.1 left a rank's second of two
        outstanding ``Idup``s incomplete for ever while its peer had completed both: a
        collective of the new group then waited for a rank that never got there).  A clone
        posts pilot receives only once it is asked for pilots."""
        root = self._root if self._root is not None else self
        log.debug("rank %d: clone %s of the communicator", self._rank, key)
        c = MpiCommunicator._clone_of(root, None, _UNSTARTED)
        c._parent = self
        with self._dup_lock:
            self._clones.append(c)
            self._dup_progress()
        return c

    def _clones_completed(self) -> bool:
        with self._dup_lock:
            return self._dup_progress() and not self._clones

    def barrier(self) -> None:
        self._ensure_ready()
        # (the clones made before it first: no other collective on a communicator while an
        # Idup of it is in flight, which Open MPI does not always tell apart)
        if self._clones:
            self._wait(self._clones_completed, _CLONING)
        req = self._comm.Ibarrier()
        self._wait(req.Test, "the other ranks to reach the barrier")

    def collective_handle(self) -> Any:
        """The mpi4py communicator of this clone (same handle), as a ``CollectiveComm``
        (see there why: mpi4py's own pickled reductions block holding the GIL on first use)."""
        h = self._handle
        if h is None:
            self._ensure_ready()
            h = self._handle = collective_comm(self._mpi, self._comm)
        return h

    # ---- failure and teardown
    def fatal_abort(self, message: str, error: BaseException | None = None) -> None:
        """Report ``message`` on stderr (and where ``error`` came from in the user's code:
        file, line, source line, original exception), then abort every rank (``MPI_Abort``)."""
        if error is not None:
            try:
                origin = failure_origin(error)
            except Exception:  # noqa: BLE001 - the abort must happen regardless
                origin = []
            if origin:
                message = message.rstrip() + "\n" + "\n".join(origin)
        abort_world(message, 1)

    def close(self) -> None:
        """Cancel the standing pilot receives and let outstanding sends finish, so
        ``MPI_Finalize`` finds nothing posted (call it once the executor stopped:
        it tests the requests the executor tested)."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._mpi.Is_initialized() or self._mpi.Is_finalized():
                return
            if self._root is not None:       # a clone: only its own ring
                if self._ring is not None:
                    self._ring.cancel()
                return
            if self.epoch_check is not None:
                self.epoch_check.close()
            deadline = time.monotonic() + 2.0
            while (self._pilot_sends.pending() or self._payload_sends.pending()) and time.monotonic() < deadline:
                time.sleep(1e-4)
            if self._ring is not None:
                self._ring.cancel()
            self._types.free()
        except Exception:  # noqa: BLE001 - teardown must not raise
            log.debug("closing the MPI communicator failed", exc_info=True)


def mpi_info(cuda_aware: bool | None = None) -> dict:
    """What ``python -m celeritas info`` shows about MPI (initializes MPI); ``cuda_aware``
    as for ``MpiCommunicator``."""
    import mpi4py
    MPI = import_mpi()
    return {"mpi4py": mpi4py.__version__, "library": library_version(MPI),
            "standard": "%d.%d" % MPI.Get_version(), "thread_level": thread_level_name(MPI.Query_thread()),
            "world_size": MPI.COMM_WORLD.Get_size(), "tag_ub": MPI.COMM_WORLD.Get_attr(MPI.TAG_UB),
            "cuda_aware": mpi_cuda_support(cuda_aware)}
