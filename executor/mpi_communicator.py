"""The MPI communicator (mpi4py): how ranks of a real cluster talk to each other.

Wire protocol, on a private duplicate of ``COMM_WORLD`` so nothing a user does on
``COMM_WORLD`` can match celeritas' messages:

* **pilots** travel as fixed 12 x int64 messages on ``PILOT_TAG``; a ring of
  standing ``Irecv(ANY_SOURCE)`` receives is always posted, so a pilot never
  waits for the receiver to ask for it.  The ring is tested head first, which
  keeps MPI's per-sender order (receives match in posting order).
* **payloads** use ``Isend``/``Irecv`` on a per-message tag derived from the
  sender's ``msg_id`` (unique per sender), straight from / into the allocation:
  contiguous boxes as raw bytes, strided boxes through a cached ``hvector``
  datatype over the view's memory or through a contiguous staging copy,
  whichever the size says is faster (see ``STRIDED_POLICY``).  Everything is
  sent as ``MPI.BYTE`` so a gather slot (raw bytes) may receive a typed partial
  result without a type-signature mismatch; the received byte count is checked.
* completion is polled with ``Test`` by one progress thread with adaptive
  back-off, which wakes the executor (a notifying communicator), so neither
  thread spins; the only blocking waits (``barrier``, a clone's ``Idup``) are
  ``Test`` loops with short sleeps on the executor thread, so the GIL is never
  held while waiting and divergence messages keep being checked meanwhile.
* collective groups are ``Idup`` clones: cloning never blocks, the first use of
  the clone's handle waits for the duplicate to complete.
* **divergence check** (``EpochCheck``): every rank sends ``(epoch number,
  task-stream hash, digest)`` to its right neighbour in a ring as soon as the
  executor receives an epoch, and compares what its left neighbour sent.  Any
  difference between any two ranks shows up between some pair of neighbours, so
  one message per rank and epoch suffices.  Shutdown and barrier epochs wait
  (with a timeout) until the neighbour's matching epoch arrived.

``MPI_THREAD_MULTIPLE`` is required: the executor thread, host-task lane threads
(collective groups hand out mpi4py communicators) and the application thread
may all call MPI.  A library that provides less is rejected with a
``ConfigError`` up front rather than crashing later.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import numpy as np

from scheduler.errors import ConfigError, DivergenceError
from scheduler.geometry import Box
from scheduler.instruction_graph import EpochInstruction, Pilot

from .communicator import Communicator, CommunicatorError, FlagRequest, Request

log = logging.getLogger("celeritas.mpi")

PILOT_TAG = 1
EPOCH_TAG = 2
PAYLOAD_TAG_BASE = 16
PILOT_RING = 16                  # standing pilot receives
_PILOT_WORDS = 12                # msg_id, to, t0, t1, t2, dims, lo0..2, hi0..2

# Strided boxes: "datatype" (hvector over the allocation), "staging" (contiguous
# copy), or "auto".  Measured with MPICH 5 (shared memory, 2 ranks, ping-pong,
# benchmarks/bench_mpi.py --strided): a derived datatype loses to a staging copy
# for small messages and short runs (1024 runs of 64 B: 420 us vs 60 us), and
# collapses beyond ~1024 blocks (4096 x 8 KiB rows: 400 ms vs 10 ms); it wins only
# for large messages made of few long runs (1024 x 16 KiB: 1.8 ms vs 2.8 ms,
# 32 x 512 KiB: 0.8 ms vs 2.4 ms).  "auto" picks the datatype exactly there.
STRIDED_POLICY = os.environ.get("CELERITAS_MPI_STRIDED", "auto")
_AUTO_DATATYPE_MIN_BYTES = 1 << 20
_AUTO_DATATYPE_MIN_RUN = 8 << 10
_AUTO_DATATYPE_MAX_BLOCKS = 1024

# world size as announced by Hydra/MPICH/Intel MPI/Slurm PMI, OpenMPI, MVAPICH
ENV_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
DIVERGENCE_TIMEOUT_VAR = "CELERITAS_DIVERGENCE_TIMEOUT"
DEFAULT_DIVERGENCE_TIMEOUT = 300.0


# --------------------------------------------------------------------------------------
# launch detection and MPI import


def launched_world_size() -> int | None:
    """The world size the launcher announced in the environment, if any.

    Read from the environment rather than from MPI, so that deciding whether
    to use MPI never initializes MPI in a plain ``python script.py`` run.
    """
    for var in ENV_SIZE_VARS:
        raw = os.environ.get(var)
        if raw:
            try:
                return int(raw)
            except ValueError:
                continue
    if os.environ.get("SLURM_STEP_ID") not in (None, "", "batch", "4294967294") and \
            os.environ.get("SLURM_STEP_NUM_TASKS"):
        try:
            return int(os.environ["SLURM_STEP_NUM_TASKS"])
        except ValueError:
            return None
    return None


def launched_under_mpi() -> bool:
    """True when started by ``mpiexec``/``srun`` with more than one rank.

    One-rank launches use the single-rank communicator: there is nobody to
    talk to, and it spares the MPI start-up.
    """
    n = launched_world_size()
    return n is not None and n > 1


_THREAD_LEVELS = {0: "MPI_THREAD_SINGLE", 1: "MPI_THREAD_FUNNELED", 2: "MPI_THREAD_SERIALIZED",
                  3: "MPI_THREAD_MULTIPLE"}


def import_mpi() -> Any:
    """``mpi4py.MPI``, initialized with ``MPI_THREAD_MULTIPLE``; ConfigError otherwise."""
    try:
        import mpi4py
    except ImportError as exc:
        raise ConfigError(f"this job was launched under MPI with {launched_world_size()} ranks, but mpi4py "
                          f"is not installed: pip install 'celeritas[mpi]' ({exc})") from None
    if "mpi4py.MPI" not in sys.modules:
        if mpi4py.rc.thread_level != "multiple":
            log.warning("mpi4py.rc.thread_level=%r overridden: celeritas needs MPI_THREAD_MULTIPLE",
                        mpi4py.rc.thread_level)
        mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    provided = MPI.Query_thread()
    if provided < MPI.THREAD_MULTIPLE:
        lib = library_version(MPI)
        raise ConfigError(
            f"the MPI library ({lib}) provides {_THREAD_LEVELS.get(provided, provided)}, but celeritas needs "
            f"MPI_THREAD_MULTIPLE: its executor thread and collective host tasks call MPI concurrently. "
            f"Use an MPI built with thread support, and do not set mpi4py.rc.thread_level to a lower "
            f"level before celeritas starts.")
    return MPI


def library_version(mpi: Any) -> str:
    """First line of ``MPI_Get_library_version``, whitespace collapsed."""
    text = mpi.Get_library_version().strip()
    return " ".join(text.splitlines()[0].split()) if text else "?"


def thread_level_name(level: int) -> str:
    return _THREAD_LEVELS.get(level, str(level))


# --------------------------------------------------------------------------------------
# aborting the whole job


_abort_lock = threading.Lock()
_hook_installed = False


ABORT_FORWARD_DELAY = 0.25   # seconds between the last words on stderr and MPI_Abort


def abort_world(message: str, code: int = 1) -> None:
    """Report ``message`` on stderr, then end every rank of the job (never returns)."""
    with _abort_lock:   # a second failing thread waits here until the process dies
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - stdout may be closed
            pass
        try:
            sys.stderr.write(message.rstrip() + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        # MPI_Abort makes the launcher tear the job down at once, and Hydra (MPICH)
        # then drops what it has not yet forwarded from this rank's stderr pipe:
        # about one abort in ten lost the traceback and this message.  A short pause
        # lets the launcher forward them; the job still ends within a second.
        time.sleep(ABORT_FORWARD_DELAY)
        try:
            from mpi4py import MPI
            MPI.COMM_WORLD.Abort(code)
        finally:
            os._exit(code)


def install_excepthook(rank: int) -> None:
    """An uncaught exception in the user's script must end the whole job.

    Without this, the failing rank would run its atexit shutdown and wait for
    peers that wait for it: report the traceback, then abort every rank.
    """
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    previous = sys.excepthook

    def hook(tp, value, tb):
        try:
            previous(tp, value, tb)
        finally:
            abort_world(f"celeritas rank {rank}: uncaught {tp.__name__}; aborting all ranks")

    sys.excepthook = hook


# --------------------------------------------------------------------------------------
# requests and the progress thread


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


_MPI_BYTE: list = [None]     # MPI.BYTE, set once MPI is imported


class _PilotRing:
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
            buf = np.zeros(_PILOT_WORDS, dtype=np.int64)
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


class _Progress:
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
    POLL_BUSY_MAX = 2e-3       # CELERITAS_MPI_POLL_MAX_US overrides it per communicator
    POLL_IDLE_MAX = 1e-3
    KEEPALIVE = 0.05

    def __init__(self, rank: int, poll_max: float | None = None):
        self._lock = threading.Lock()
        self._new: list[MpiRequest] = []
        self._new_rings: list[_PilotRing] = []
        self._requests: list[MpiRequest] = []
        self._rings: list[_PilotRing] = []
        self._kick = threading.Event()
        self._drop: _PilotRing | None = None
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

    def add_ring(self, ring: _PilotRing) -> None:
        with self._lock:
            self._new_rings.append(ring)
        self._kick.set()

    def remove_ring(self, ring: _PilotRing) -> None:
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
                log.error("MPI progress failed: %s", exc)
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


# --------------------------------------------------------------------------------------
# pilots on the wire


def encode_pilot(p: Pilot, out: np.ndarray) -> None:
    b = p.box
    t = p.transfer
    out[0] = p.msg_id
    out[1] = p.to
    out[2], out[3], out[4] = t[0], t[1], t[2]
    out[5] = b.dims
    out[6:9] = b.lo
    out[9:12] = b.hi


def decode_pilot(w: np.ndarray) -> Pilot:
    v = w.tolist()
    dims = v[5]
    lo, hi = tuple(v[6:9]), tuple(v[9:12])
    if hi[0] <= lo[0] or hi[1] <= lo[1] or hi[2] <= lo[2]:
        box = Box.empty_box(dims)
    else:
        box = Box._make(lo, hi, dims)
    return Pilot(msg_id=v[0], to=v[1], transfer=(v[2], v[3], v[4]), box=box)


# --------------------------------------------------------------------------------------
# strided layouts


def strided_layout(shape: tuple[int, ...], strides: tuple[int, ...],
                   itemsize: int) -> tuple[int, list[tuple[int, int]]] | None:
    """(innermost contiguous run in bytes, [(count, byte stride), …] outermost first).

    Unit dimensions are dropped and dimensions that continue the same stride
    pattern are merged, so a box of whole rows is one run and a column of a
    3-D block is a single hvector.  None for strides MPI datatypes cannot
    express here (negative or zero).
    """
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if any(s <= 0 for _n, s in dims):
        return None
    run = itemsize
    while dims and dims[-1][1] == run:
        run *= dims.pop()[0]
    outer: list[tuple[int, int]] = []
    for n, s in reversed(dims):            # innermost remaining first
        if outer and s == outer[-1][0] * outer[-1][1]:
            outer[-1] = (outer[-1][0] * n, outer[-1][1])
        else:
            outer.append((n, s))
    outer.reverse()
    return run, outer


class _DatatypeCache:
    """Committed hvector datatypes per (shape, strides, itemsize); freed on close."""

    def __init__(self, mpi: Any):
        self._mpi = mpi
        self._types: dict[tuple, tuple[Any, int]] = {}
        self._lock = threading.Lock()

    def get(self, shape: tuple, strides: tuple, itemsize: int) -> tuple[Any, int] | None:
        """(committed datatype, byte span from the first element) or None."""
        key = (shape, strides, itemsize)
        hit = self._types.get(key)
        if hit is not None:
            return hit
        layout = strided_layout(shape, strides, itemsize)
        if layout is None:
            return None
        run, outer = layout
        t = self._mpi.BYTE.Create_contiguous(run)
        span = run
        created = [t]
        for n, s in reversed(outer):            # innermost first
            t = t.Create_hvector(n, 1, s)
            created.append(t)
            span += (n - 1) * s
        t.Commit()
        for old in created[:-1]:
            old.Free()
        with self._lock:
            self._types[key] = (t, span)
        return t, span

    def free(self) -> None:
        with self._lock:
            types, self._types = list(self._types.values()), {}
        for t, _span in types:
            try:
                t.Free()
            except Exception:  # noqa: BLE001 - after finalize
                pass


# --------------------------------------------------------------------------------------
# divergence check


@dataclass(slots=True)
class _EpochInfo:
    seq: int
    task: int
    action: str
    stream_hash: int
    digest: list


def _norm_entry(e: Any) -> tuple:
    tid, kind, name, rng = e
    return int(tid), str(kind), str(name), tuple(int(x) for x in rng)


def _describe(e: tuple | None) -> str:
    if e is None:
        return "nothing more"
    tid, kind, name, rng = e
    return f"T{tid} ({kind} {name!r}, range {list(rng)})"


class EpochCheck:
    """Compares this rank's task stream with its left neighbour's at every epoch.

    Driven from the executor thread only: ``announce`` when an epoch
    instruction arrives, ``poll`` from the executor loop (and from the
    communicator's own wait loops), ``verified`` before an epoch completes.
    Errors are raised once as ``DivergenceError``; after that the check is quiet
    (the runtime aborts the job).
    """

    WAIT_ACTIONS = ("shutdown", "barrier")

    def __init__(self, comm: Any, rank: int, size: int, timeout: float | None):
        self._comm = comm
        self.rank = rank
        self.size = size
        self._left = (rank - 1) % size
        self._right = (rank + 1) % size
        self._timeout = timeout
        self._seq = 0
        self._seq_of_task: dict[int, int] = {}
        self._mine: dict[int, _EpochInfo] = {}
        self._theirs: dict[int, _EpochInfo] = {}
        self._verified = -1               # every epoch up to here matched
        self._last_verified_task: int | None = None
        self._sends: deque = deque()
        self._recv: Any = None            # irecv of a matched (probed) message
        self._failed = False
        self._wait_started: dict[int, float] = {}
        self._warned: dict[int, float] = {}

    @property
    def enabled(self) -> bool:
        return self.size > 1

    # ---- executor hooks
    def announce(self, instr: EpochInstruction) -> None:
        if not self.enabled or instr.task in self._seq_of_task:
            return
        seq = self._seq
        self._seq += 1
        self._seq_of_task[instr.task] = seq
        digest = [_norm_entry(e) for e in instr.digest]
        info = _EpochInfo(seq, instr.task, instr.action, int(instr.stream_hash), digest)
        self._mine[seq] = info
        payload = (seq, instr.task, instr.action, int(instr.stream_hash), digest)
        self._sends.append(self._comm.isend(payload, dest=self._right, tag=EPOCH_TAG))
        self._compare()

    def poll(self) -> None:
        if not self.enabled or self._failed:
            return
        while self._sends and self._sends[0].Test():
            self._sends.popleft()
        got = False
        while True:
            if self._recv is None:
                msg = self._comm.improbe(source=self._left, tag=EPOCH_TAG)
                if msg is None:
                    break
                self._recv = msg.irecv()
            flag, payload = self._recv.test()
            if not flag:
                break
            self._recv = None
            seq, task, action, h, digest = payload
            self._theirs[seq] = _EpochInfo(seq, task, action, h, [_norm_entry(e) for e in digest])
            got = True
        if got:
            self._compare()

    def verified(self, instr: EpochInstruction) -> bool:
        """True once this epoch may complete: always for plain epochs (checked in the
        background), for shutdown/barrier epochs once the neighbour's matching epoch
        arrived and matched.  Raises DivergenceError on a mismatch or a timeout."""
        if not self.enabled or self._failed or instr.action not in self.WAIT_ACTIONS:
            return True
        seq = self._seq_of_task.get(instr.task)
        if seq is None:
            self.announce(instr)
            seq = self._seq_of_task[instr.task]
        self.poll()
        if seq <= self._verified:
            self._wait_started.pop(seq, None)
            return True
        now = time.monotonic()
        t0 = self._wait_started.setdefault(seq, now)
        waited = now - t0
        if waited >= 10.0 and now - self._warned.get(seq, 0.0) >= 30.0:
            self._warned[seq] = now
            log.warning("rank %d has waited %.0f s for rank %d to submit epoch #%d (T%d, %s)", self.rank,
                        waited, self._left, seq, instr.task, instr.action)
        if self._timeout is not None and waited >= self._timeout:
            self._failed = True
            mine = self._mine.get(seq)
            last = (f"the last epoch both reached is T{self._last_verified_task}"
                    if self._last_verified_task is not None else "no epoch has been compared yet")
            raise DivergenceError(
                f"rank {self.rank} reached epoch #{seq} (T{instr.task}, {instr.action}) but rank {self._left} "
                f"did not submit a matching epoch within {self._timeout:g} s: the ranks submitted different "
                f"work (a different number of epochs, or rank {self._left} is blocked waiting for data "
                f"that this rank's task stream never produces); {last}. This rank's tasks since then: "
                f"{self._digest_summary(mine)} ({DIVERGENCE_TIMEOUT_VAR} sets the timeout)")
        return False

    def pending_wait(self) -> bool:
        return bool(self._wait_started)

    # ---- comparison
    def _compare(self) -> None:
        while not self._failed:
            seq = self._verified + 1
            mine = self._mine.get(seq)
            theirs = self._theirs.get(seq)
            if mine is None or theirs is None:
                return
            if mine.stream_hash != theirs.stream_hash or mine.action != theirs.action:
                self._failed = True
                raise DivergenceError(self._mismatch_message(mine, theirs))
            self._verified = seq
            self._last_verified_task = mine.task
            del self._mine[seq]
            del self._theirs[seq]

    def _mismatch_message(self, mine: _EpochInfo, theirs: _EpochInfo) -> str:
        a = mine.digest + [(mine.task, "epoch", mine.action, ())]
        b = theirs.digest + [(theirs.task, "epoch", theirs.action, ())]
        since = (f"after epoch T{self._last_verified_task}" if self._last_verified_task is not None
                 else "from the start")
        for i in range(max(len(a), len(b))):
            ea = a[i] if i < len(a) else None
            eb = b[i] if i < len(b) else None
            if ea != eb:
                return (f"ranks {self._left} and {self.rank} submitted different task streams; the first "
                        f"differing task ({since}, epoch #{mine.seq}): rank {self._left} submitted "
                        f"{_describe(eb)}, rank {self.rank} submitted {_describe(ea)}")
        first = _describe(a[0]) if a else "?"
        return (f"ranks {self._left} and {self.rank} submitted different task streams {since} (epoch #{mine.seq}, "
                f"T{mine.task}): the same task names and ranges, but different buffer accesses; the first task "
                f"of that stretch is {first}")

    @staticmethod
    def _digest_summary(info: _EpochInfo | None) -> str:
        if info is None:
            return "unknown"
        d = info.digest
        if not d:
            return "none"
        shown = ", ".join(_describe(e) for e in d[:3])
        return shown + (f", … ({len(d)} tasks)" if len(d) > 3 else "")

    def close(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self._sends and time.monotonic() < deadline:
            if self._sends[0].Test():
                self._sends.popleft()
            else:
                time.sleep(1e-4)
        if self._recv is not None:
            # a matched message is already ours: complete it rather than leaving it posted
            while time.monotonic() < deadline and not self._recv.test()[0]:
                time.sleep(1e-4)
            self._recv = None


def poll_max_from_env() -> float:
    """``CELERITAS_MPI_POLL_MAX_US``: the longest the progress thread sleeps while payloads are in flight."""
    raw = os.environ.get("CELERITAS_MPI_POLL_MAX_US", "").strip()
    if raw == "":
        return _Progress.POLL_BUSY_MAX
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"CELERITAS_MPI_POLL_MAX_US={raw!r} is not a number of microseconds") from None
    if not v > 0:
        raise ConfigError(f"CELERITAS_MPI_POLL_MAX_US={raw!r} must be > 0")
    return v * 1e-6


def divergence_timeout_from_env() -> float | None:
    raw = os.environ.get(DIVERGENCE_TIMEOUT_VAR, "").strip().lower()
    if raw == "":
        return DEFAULT_DIVERGENCE_TIMEOUT
    if raw in ("0", "none", "off", "inf"):
        return None
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"{DIVERGENCE_TIMEOUT_VAR}={raw!r} is not a number of seconds (or 'none')") from None
    if v <= 0:
        raise ConfigError(f"{DIVERGENCE_TIMEOUT_VAR}={raw!r} must be > 0 (or 'none')")
    return v


# --------------------------------------------------------------------------------------
# collective handles


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


# --------------------------------------------------------------------------------------
# the communicator


_UNKNOWN = object()    # MpiCommunicator.cuda_aware not asked yet


def _device_spec(MPI: Any, arr: Any, receive: bool) -> tuple[Any, Any, Callable[[], None] | None, int]:
    """Buffer spec for a device (CUDA) array, for a CUDA-aware MPI library.

    A box inside a larger allocation is strided; rather than trusting every MPI
    build with derived datatypes on device pointers, such boxes go through a
    contiguous device-side staging array (a device-to-device copy is far cheaper
    than the host round trip that direct sends avoid).  The copies run on the
    current stream and are synchronized before MPI touches the memory, since MPI
    knows nothing of streams.
    """
    nbytes = int(arr.nbytes)
    if arr.flags.c_contiguous or nbytes == 0:
        return [arr, nbytes, MPI.BYTE], arr, None, nbytes
    import cupy  # only device arrays get here, and only the CUDA backend makes them
    if receive:
        staging = cupy.empty(arr.shape, dtype=arr.dtype)

        def land(view=arr, tmp=staging) -> None:
            view[...] = tmp
            cupy.cuda.get_current_stream().synchronize()

        return [staging, nbytes, MPI.BYTE], staging, land, nbytes
    staging = cupy.ascontiguousarray(arr)
    cupy.cuda.get_current_stream().synchronize()
    return [staging, nbytes, MPI.BYTE], staging, None, nbytes


def mpi_cuda_support() -> bool | None:
    """Whether the loaded MPI library can take CUDA device pointers (None: cannot tell).

    mpi4py does not expose it; MPICH (>= 4) and Open MPI export
    ``MPIX_Query_cuda_support`` from the library itself, so it is looked up in
    the MPI shared objects this process has mapped.  ``CELERITAS_MPI_CUDA_AWARE=1/0``
    overrides the answer for libraries that support CUDA without the query
    (Cray MPICH with ``MPICH_GPU_SUPPORT_ENABLED=1`` counts as yes).
    """
    forced = os.environ.get("CELERITAS_MPI_CUDA_AWARE")
    if forced is not None:
        if forced not in ("0", "1"):
            raise ConfigError(f"CELERITAS_MPI_CUDA_AWARE={forced!r}; use 1 or 0")
        return forced == "1"
    if os.environ.get("MPICH_GPU_SUPPORT_ENABLED") == "1":
        return True
    import ctypes
    import re
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return None
    libs = sorted({m for m in re.findall(r"(/\S+\.so[.\d]*)", maps) if "libmpi" in os.path.basename(m)})
    for lib in libs:
        try:
            fn = getattr(ctypes.CDLL(lib), "MPIX_Query_cuda_support", None)
        except OSError:
            continue
        if fn is not None:
            fn.restype = ctypes.c_int
            fn.argtypes = []
            return bool(fn())
    return None


class MpiCommunicator(Communicator):
    """One rank's endpoint over MPI (see the module docstring for the protocol).

    ``MpiCommunicator()`` duplicates ``COMM_WORLD``; ``comm=`` duplicates another
    mpi4py intracommunicator.  Notifying: a progress thread tests the requests
    and wakes the executor, which therefore never polls MPI itself.
    """

    notifies = True
    accepts_strided = True

    @property
    def cuda_aware(self) -> bool | None:    # type: ignore[override]
        if self._cuda_aware is _UNKNOWN:
            self._cuda_aware = mpi_cuda_support()
        return self._cuda_aware

    def __init__(self, comm: Any = None, *, strided: str | None = None,
                 divergence_timeout: float | None | str = "env", install_hooks: bool | None = None):
        poll_max = poll_max_from_env()          # bad settings fail before any MPI call
        policy = (strided or STRIDED_POLICY).lower()
        if policy not in ("auto", "datatype", "staging"):
            raise ConfigError(f"CELERITAS_MPI_STRIDED={policy!r}; use auto, datatype or staging")
        MPI = import_mpi()
        _MPI_BYTE[0] = MPI.BYTE
        base = MPI.COMM_WORLD if comm is None else comm
        self._setup(MPI, base.Dup(), None, None, _DatatypeCache(MPI), policy)
        timeout = divergence_timeout_from_env() if divergence_timeout == "env" else divergence_timeout
        self.epoch_check = EpochCheck(self._comm.Dup(), self._rank, self._size, timeout) if self._size > 1 else None
        self._progress = _Progress(self._rank, poll_max)
        self._start_ring()
        if install_hooks is None:
            install_hooks = comm is None and self._size > 1
        if install_hooks:
            install_excepthook(self._rank)
        atexit.register(self.close)
        log.info("MPI communicator: rank %d of %d, %s, %s", self._rank, self._size,
                 library_version(MPI), thread_level_name(MPI.Query_thread()))

    def _setup(self, mpi: Any, comm: Any, root: "MpiCommunicator | None", pending: Any,
               types: _DatatypeCache, strided: str) -> None:
        self._mpi = mpi
        self._comm = comm
        self._root = root
        self._pending_dup = pending               # Idup request of a clone
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
            self._progress = root._progress
        self._ring: _PilotRing | None = None
        self._pilot_inbox: deque = deque()
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

    def _check_progress(self) -> None:
        err = self._progress.error
        if err is not None:
            raise CommunicatorError(f"rank {self._rank}: MPI progress failed: {err}")

    # ---- waiting (never holds the GIL)
    def _divergence_poll(self) -> None:
        root = self._root if self._root is not None else self
        chk = root.epoch_check
        if chk is not None:
            chk.poll()

    def _wait(self, test: Callable[[], bool], what: str) -> None:
        """Poll ``test`` with short sleeps; keep checking for divergence meanwhile."""
        delay = 2e-5
        t0 = time.monotonic()
        next_warn = t0 + 30.0
        while not test():
            self._divergence_poll()
            time.sleep(delay)
            delay = min(delay * 1.5, 1e-3)
            now = time.monotonic()
            if now >= next_warn:
                next_warn = now + 60.0
                log.warning("rank %d has been waiting %.0f s for %s", self._rank, now - t0, what)

    def _ensure_ready(self) -> None:
        req = self._pending_dup
        if req is None:
            return
        self._wait(req.Test, "the other ranks to clone a collective group communicator")
        self._pending_dup = None

    # ---- pilots
    def _start_ring(self) -> None:
        self._ring = _PilotRing(self._mpi, self._comm, self._pilot_inbox)
        self._progress.add_ring(self._ring)

    def send_pilot(self, to: int, pilot: Pilot) -> None:
        self._check_rank(to)
        if self._closed:
            raise CommunicatorError(f"rank {self._rank}: communicator closed")
        self._ensure_ready()
        buf = np.empty(_PILOT_WORDS, dtype=np.int64)
        encode_pilot(pilot, buf)
        try:
            req = self._comm.Isend([buf, self._mpi.INT64_T], to, PILOT_TAG)
        except Exception as exc:  # noqa: BLE001
            raise CommunicatorError(f"rank {self._rank}: pilot to rank {to} failed: {exc}") from exc
        self._progress.add(MpiRequest(req, buf, what=f"pilot to rank {to}", notify=False))

    def poll_pilots(self) -> list[tuple[int, Pilot]]:
        if self._closed:
            return []
        self._check_progress()
        if self._ring is None:
            self._ensure_ready()
            self._start_ring()
        inbox = self._pilot_inbox
        if not inbox:
            return []
        out = []
        pop = inbox.popleft
        while inbox:
            out.append(pop())
        return out

    # ---- payloads
    def _use_datatype(self, arr: np.ndarray) -> bool:
        mode = self._strided
        if mode == "datatype":
            return True
        if mode == "staging":
            return False
        if arr.nbytes < _AUTO_DATATYPE_MIN_BYTES:
            return False
        layout = strided_layout(arr.shape, arr.strides, arr.itemsize)
        if layout is None or layout[0] < _AUTO_DATATYPE_MIN_RUN:
            return False
        blocks = 1
        for n, _s in layout[1]:
            blocks *= n
        return blocks <= _AUTO_DATATYPE_MAX_BLOCKS

    def _spec(self, arr: Any, receive: bool) -> tuple[Any, Any, Callable[[], None] | None, int]:
        """(buffer spec, keep-alive, completion hook, byte count) for ``arr``."""
        MPI = self._mpi
        if not isinstance(arr, np.ndarray):
            if hasattr(arr, "__cuda_array_interface__"):
                return _device_spec(MPI, arr, receive)
            arr = np.asarray(arr)
        nbytes = arr.nbytes
        if arr.flags.c_contiguous or nbytes == 0:
            if receive and not arr.flags.writeable:
                raise CommunicatorError("receive buffer is read-only")
            return [arr, nbytes, MPI.BYTE], arr, None, nbytes
        if self._use_datatype(arr):
            hit = self._types.get(arr.shape, arr.strides, arr.itemsize)
            if hit is not None:
                dtype, span = hit
                mem = MPI.buffer.fromaddress(arr.ctypes.data, span, readonly=False)
                return [mem, 1, dtype], (arr, mem), None, nbytes
        if receive:
            staging = np.empty(arr.shape, dtype=arr.dtype)

            def land(view=arr, tmp=staging) -> None:
                view[...] = tmp

            return [staging, nbytes, MPI.BYTE], staging, land, nbytes
        staging = np.ascontiguousarray(arr)
        return [staging, nbytes, MPI.BYTE], staging, None, nbytes

    def send_payload(self, to: int, msg_id: int, array: Any) -> Request:
        self._check_rank(to)
        self._check_progress()
        self._ensure_ready()
        spec, keep, _finish, _n = self._spec(array, receive=False)
        try:
            req = self._comm.Isend(spec, to, self._payload_tag(msg_id))
        except Exception as exc:  # noqa: BLE001
            raise CommunicatorError(f"rank {self._rank}: send of message {msg_id} to rank {to} failed: {exc}") \
                from exc
        r = MpiRequest(req, keep, what=f"send of message {msg_id} to rank {to}")
        self._progress.add(r)
        return r

    def receive_payload(self, from_rank: int, msg_id: int, out_array: Any) -> Request:
        self._check_rank(from_rank)
        self._check_progress()
        self._ensure_ready()
        spec, keep, finish, nbytes = self._spec(out_array, receive=True)
        try:
            req = self._comm.Irecv(spec, from_rank, self._payload_tag(msg_id))
        except Exception as exc:  # noqa: BLE001
            raise CommunicatorError(f"rank {self._rank}: receive of message {msg_id} from rank {from_rank} "
                                    f"failed: {exc}") from exc
        r = MpiRequest(req, keep, status=self._mpi.Status(), expect=nbytes, finish=finish,
                       what=f"receive of message {msg_id} from rank {from_rank}")
        self._progress.add(r)
        return r

    # ---- groups, barrier, collectives
    def clone(self, key: Hashable | None = None) -> "MpiCommunicator":
        """An ``Idup`` of this communicator: returns at once; the duplicate completes
        in the background and is waited for on first use (every rank clones in the
        same order, which the deterministic instruction stream guarantees).  A clone
        posts pilot receives only once it is asked for pilots."""
        self._ensure_ready()
        try:
            newcomm, req = self._comm.Idup()
        except Exception as exc:  # noqa: BLE001
            raise CommunicatorError(f"rank {self._rank}: cloning the communicator failed: {exc}") from exc
        root = self._root if self._root is not None else self
        log.debug("rank %d: clone %s of the communicator", self._rank, key)
        return MpiCommunicator._clone_of(root, newcomm, req)

    def barrier(self) -> None:
        self._ensure_ready()
        req = self._comm.Ibarrier()
        self._wait(req.Test, "the other ranks to reach the barrier")

    def collective_handle(self) -> Any:
        """The mpi4py communicator of this clone (same handle), as a ``CollectiveComm``
        (see there why: mpi4py's first pickled reduction must not block holding the GIL)."""
        h = self._handle
        if h is None:
            self._ensure_ready()
            h = self._handle = collective_comm(self._mpi, self._comm)
        return h

    def set_notifier(self, notifier: Callable[[], None] | None) -> None:
        """Called by the progress thread whenever a payload completes or a pilot
        arrives, and every ``_Progress.KEEPALIVE`` s (see ``_Progress``)."""
        if self._root is None:
            self._progress.notifier = notifier

    # ---- failure and teardown
    def fatal_abort(self, message: str) -> None:
        """Report ``message`` on stderr, then abort every rank (``MPI_Abort``)."""
        abort_world(message, 1)

    def close(self) -> None:
        """Stop the progress thread, cancel the standing pilot receives and finish
        outstanding small sends, so ``MPI_Finalize`` finds nothing posted."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._mpi.Is_initialized() or self._mpi.Is_finalized():
                return
            if self._root is not None:       # a clone: only its own ring
                if self._ring is not None:
                    self._progress.remove_ring(self._ring)
                    self._ring.cancel()
                return
            self._progress.notifier = None
            if self.epoch_check is not None:
                self.epoch_check.close()
            deadline = time.monotonic() + 2.0
            while self._progress.pending_sends() and time.monotonic() < deadline:
                time.sleep(1e-4)
            self._progress.stop()
            if self._ring is not None:
                self._ring.cancel()
            self._types.free()
        except Exception:  # noqa: BLE001 - teardown must not raise
            log.debug("closing the MPI communicator failed", exc_info=True)


def mpi_info() -> dict:
    """What ``python -m celeritas info`` shows about MPI (initializes MPI)."""
    import mpi4py
    MPI = import_mpi()
    return {"mpi4py": mpi4py.__version__, "library": library_version(MPI),
            "standard": "%d.%d" % MPI.Get_version(), "thread_level": thread_level_name(MPI.Query_thread()),
            "world_size": MPI.COMM_WORLD.Get_size(), "tag_ub": MPI.COMM_WORLD.Get_attr(MPI.TAG_UB),
            "cuda_aware": mpi_cuda_support()}


__all__ = ["MpiCommunicator", "MpiRequest", "EpochCheck", "launched_under_mpi", "launched_world_size",
           "import_mpi", "abort_world", "install_excepthook", "encode_pilot", "decode_pilot", "mpi_info",
           "mpi_cuda_support", "strided_layout"]
