"""The executor thread: runs one rank's instruction graph on a backend.

Everything the scheduler hands over arrives through one inbox (an ``_Inbox``:
a deque plus a wake-up event); lane workers and notifying communicators report
completions and arrivals into the same inbox, so the loop blocks in exactly one place
and no notification can be lost between a poll and the wait.  What cannot notify is
polled by this thread itself: CUDA/OpenCL events on a short timeout, and MPI (sends
and receives are issued, tested and acted on here, with no progress thread between
the network and the work that waits for it; see "waiting" below for when and how
often it polls).

Error policy: once an instruction fails (launcher, copy, allocation, receive…),
nothing that depends on it may run, since it would read what the failed
instruction should have written.  The failure is reported through
``on_error(exc, instruction)`` and the executor winds down: from then on every
instruction the engine assigns is retired without being executed, except the
bookkeeping that lets the rank wind down without hanging (frees, horizons,
epochs without their barrier or divergence wait, destroying host objects) and
fences, whose promises are failed with the error (the exception ``on_error``
returned, if it returned one, else the original).  No pilots are sent any more.
Work already handed to a lane finishes, except work queued on a lane right
behind the instructions it depends on (eager assignment, ``dependent=True``)
before they ran: a lane skips that once work of its own failed (``LaneSkipped``).  An internal failure of the loop
itself is reported with ``instruction=None`` and stops the executor; pending
fences are failed.
"""
from __future__ import annotations

import copy
import functools
import logging
import sys
import threading
import time
from dataclasses import dataclass
from collections import deque
from typing import Any, Callable
from _thread import allocate_lock as _allocate_lock

from scheduler.instruction_graph import (HOST_MEMORY, AllocInstruction, AwaitReceiveInstruction,
                                         CloneCollectiveGroupInstruction, CopyInstruction,
                                         DestroyHostObjectInstruction, DeviceKernelInstruction,
                                         EpochInstruction, FenceInstruction,
                                         FillIdentityInstruction, FreeInstruction,
                                         GatherReceiveInstruction, HorizonInstruction,
                                         HostTaskInstruction, Instruction, InstructionBatch,
                                         ReceiveInstruction, ReduceInstruction,
                                         SendInstruction, SplitReceiveInstruction, device_memory)
from scheduler.errors import CeleritasError

from .backends.backend import Backend, Completion, Lane, LaneSkipped
from .communicator import Communicator
from .instruction_handlers import InstructionHandlers, _set_promise, cost_key
from .tracing import TraceEvent, _trace_event
from .out_of_order_engine import Assignment, OutOfOrderEngine, Target
from .receive_arbiter import ReceiveArbiter

log = logging.getLogger("celeritas.executor")

_perf_ns = time.perf_counter_ns
_thread_ns = time.thread_time_ns


class _Signal:
    """Inbox control messages (identity-compared sentinels)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


_WAKE = _Signal("wake")
_DRAIN = _Signal("drain")
_ABORT = _Signal("abort")

_KERNEL, _COPY, _HORIZON = 1, 2, 3      # what direct issue may do with a batch position (Executor._batch_plan)


class _Inbox:
    """Multi-producer, single-consumer queue the executor thread sleeps on.

    Not ``queue.SimpleQueue``: on CPython 3.11 its ``get(timeout)`` recomputes
    the remaining time after a wake-up that found the queue empty (which our
    non-blocking drains provoke) and, once the deadline has passed, waits with a
    negative timeout, i.e. forever.  Not ``queue.Queue`` either: its lock and
    condition cost microseconds per ``put`` on the completion path.  Producers
    append to a deque (atomic under the GIL) and signal only while the consumer is
    about to sleep; the consumer announces that before its last emptiness check,
    so a put either is seen by that check or signals.

    The signal is a bare lock used as a binary semaphore (locked: no signal
    pending; any thread may release it), not a ``threading.Event``: an Event's
    wait and set run a Condition in Python (a new waiter lock per wait), which
    cost the executor several microseconds per batch it woke up for.

    Two queues: completions and wake-ups (``put_urgent``) are taken before batches and
    control signals (``put``, kept in order).  A completion is what lets work already
    accepted run; behind a backlog of batches (the scheduler runs ahead while a first
    kernel of unknown cost is on its lane) it would hold the whole backlog back, and
    the engine would grow by thousands of nodes that all wait for it.
    """

    __slots__ = ("_items", "_urgent", "_signal", "_sleeping")

    def __init__(self) -> None:
        self._items: deque = deque()
        self._urgent: deque = deque()
        self._signal = _allocate_lock()
        self._signal.acquire()
        self._sleeping = False

    def put(self, item: Any) -> None:
        self._items.append(item)
        if self._sleeping:
            self._wake()

    def put_urgent(self, item: Any) -> None:
        self._urgent.append(item)
        if self._sleeping:
            self._wake()

    def _wake(self) -> None:
        self._sleeping = False          # (one signal per sleep is enough)
        try:
            self._signal.release()
        except RuntimeError:            # a signal is pending already
            pass

    def empty(self) -> bool:
        return not self._urgent and not self._items

    def get_nowait(self) -> Any:
        urgent = self._urgent
        return urgent.popleft() if urgent else self._items.popleft()

    def wait(self, timeout: float) -> None:
        """Sleep until an item arrives or ``timeout`` seconds pass."""
        self._sleeping = True
        if not self._urgent and not self._items:
            self._signal.acquire(True, max(timeout, 0.0))
        self._sleeping = False
        self._signal.acquire(False)         # a signal left pending is consumed: locked again


class ExecutorStopped(CeleritasError, RuntimeError):
    """The executor stopped before an instruction (e.g. a fence) was reached: a
    ``cl.CeleritasError`` for whoever holds the fence's future."""


@dataclass(slots=True, eq=False)
class _Active:
    """An issued instruction whose completion is asynchronous."""

    instr: Instruction
    lane: str
    start_ns: int
    completion: Any = None
    cost_key: Any = None    # run-time estimate to update from the completion's timing


class _LaneInfo:
    """What issuing on one engine lane needs, looked up once per lane (cached in the
    engine lane's ``handle``): the backend lane, whether its work may run inline, and
    for device lanes the array module and native queue kernels get."""

    __slots__ = ("lane", "name", "inline", "xp", "stream")

    def __init__(self, lane: Lane, inline: bool, xp: Any, stream: Any):
        self.lane = lane
        self.name = lane.name
        self.inline = inline
        self.xp = xp
        self.stream = stream


class Executor(InstructionHandlers):
    """Executes instruction batches on ``backend``; owns one thread.

    Drive it with ``start()``, any number of ``submit(batch)`` from the scheduler
    thread, and either a batch ending in an epoch with action ``"shutdown"``
    (the thread ends after it) or ``shutdown()``.  The callbacks run on the
    executor thread and must be quick.
    """

    def __init__(self, backend: Backend, communicator: Communicator, *,
                 on_horizon: Callable[[int], Any] | None = None,
                 on_epoch: Callable[[int], Any] | None = None,
                 on_error: Callable[[BaseException, Instruction | None], Any] | None = None,
                 max_host_lanes: int = 4, max_device_lanes: int = 4,
                 trace: bool = False, idle_timeout: float = 0.1,
                 poll_interval: float = 20e-6, inline_threshold: float = 100e-6,
                 inline_copy_bytes: int = 128 * 1024, inline_alone_threshold: float = 2e-3,
                 inline_quiet_threshold: float = 10e-3,
                 inline_alone_copy_bytes: int = 8 << 20, name: str = "celeritas-executor",
                 host_object_copy: Callable[[Any], Any] | None = None):
        self._backend = backend
        self._comm = communicator
        self._on_horizon = on_horizon
        self._on_epoch = on_epoch
        self._on_error = on_error
        self._engine = OutOfOrderEngine(max_host_lanes=max_host_lanes,
                                        max_device_lanes=max_device_lanes, eager_filter=self._eager_ok)
        self._arbiter = ReceiveArbiter(communicator, self._view)
        self._inbox = _Inbox()
        self._idle_timeout = idle_timeout
        self._poll_interval = poll_interval
        # polling a communicator that cannot notify (see _wait)
        self._spin_ns = int(getattr(communicator, "poll_spin", 0.0) * 1e9)
        self._poll_min = getattr(communicator, "poll_min", poll_interval)
        self._poll_max = max(getattr(communicator, "poll_max", poll_interval), self._poll_min)
        self._poll_delay = 0.0
        self._idle_start = 0            # when the current wait with nothing but MPI outstanding began
        self._idle_estimate = 0         # how long such waits took lately (ns): spin only if short
        self._spun = False              # the spin's last poll made progress: _step need not poll again
        self._next_epoch_poll = 0
        self._stalled_since = 0         # when the loop last started waiting after progress (0: progressing)
        self._name = name

        self._allocs: dict[int, Any] = {}           # allocation id -> backend array
        # box views of allocations: copies and sends of a repeating step take the same boxes
        # of the same allocations every time.  (source, dest, box.lo, box.hi) -> the two
        # views of a copy, (allocation, box.lo, box.hi) -> a send's view; emptied whenever
        # an allocation comes or goes, which lookahead makes rare (see _forget_views)
        self._views: dict[tuple, Any] = {}
        self._user_buffers: dict[int, Any] = {}     # buffer id -> host array, until its allocation id is known
        self._backend_allocs: dict[int, int] = {}   # allocation id -> memory (made by backend.allocate)
        self._host_objects: dict[int, Any] = {}
        # what a fence of a host object returns: a deep copy (the runtime's copier also
        # refuses queue calls from a __deepcopy__, which would wait for this thread)
        self._copy_host_object = host_object_copy or copy.deepcopy
        self._groups: dict[int, Communicator] = {}
        self._group_handles: dict[int, Any] = {}
        # clones whose duplicate has yet to complete, tested with the network's requests: a
        # communicator posts the Idup of its next clone only once a test found the one before
        # complete (see MpiCommunicator.clone), and the other ranks may wait for it
        self._cloning: list[Communicator] = []
        # Inline execution (see _dispatch): whether lanes' work may run on this thread
        # (per lane, in _LaneInfo), and per kind of work (kernel name / copy size class)
        # an estimate of its run time
        self._inline_ns = round(inline_threshold * 1e9) if inline_threshold and inline_threshold > 0 else 0
        self._inline_bytes = inline_copy_bytes if self._inline_ns else -1
        self._alone_ns = max(int(inline_alone_threshold * 1e9), self._inline_ns) if self._inline_ns else 0
        self._alone_bytes = max(inline_alone_copy_bytes, self._inline_bytes) if self._inline_ns else -1
        self._quiet_ns = max(int(inline_quiet_threshold * 1e9), self._alone_ns) if self._inline_ns else 0
        # asynchronous device lanes (CUDA streams): a kernel whose enqueue took at most the
        # alone threshold is enqueued from this thread when its lane is idle (Backend.enqueue_now).
        # Not the inline threshold: the work is only an enqueue, the device runs it, and a
        # hand-off to the lane's worker costs a wake-up and GIL switches between the two
        # threads (measured on an H100, wave_sim 2048² with CuPy array kernels of ~500 us of
        # enqueueing: 814 -> 500 us per step, against 348 for the same CuPy operations in a loop)
        self._enqueues = bool(self._inline_ns) and type(backend).enqueue_now is not Backend.enqueue_now
        self._enqueues_python = backend.enqueues_python_kernels
        self._has_global_range: dict[type, bool] = {}
        self._rank = communicator.rank
        self._costs: dict[Any, int] = {}
        self._suspect: set = set()      # kinds whose next inline run is timed in CPU time (_note_cost)
        self._probes: dict[Any, int] = {}   # kind -> its inline re-measurements so far (_probe)
        # direct issue (see _accept): device -> an inline lane's info; (source, dest) memories
        self._direct_kernel_lanes: dict[int, _LaneInfo] = {}
        self._direct_copies: set[tuple[int, int]] = set()
        # InstructionBatch.shape -> _batch_plan of such a batch; cleared when _direct_copies grows
        self._plans: dict[tuple, tuple] = {}
        self.direct_horizons = 0        # horizons run straight from their batch (_direct_horizon)
        self._cost_keys: dict[int, tuple] = {}      # id(box) -> (box, name, cost key): see _cost_key
        self._contexts: dict[int, tuple] = {}       # id(accesses) -> (accesses, box, name, device, context, cost key)

        self._by_completion: dict[Completion, _Active] = {}   # notifying backend completions
        self._polled: list[_Active] = []                      # backend completions to poll
        # what enqueue_now enqueued from this thread and the backend keeps for it to look at
        # (see DeviceQueueBackend.keep_waits; None: the lanes' waiters notify all)
        self._kept: list | None = None
        self._sends: list[_Active] = []
        self._receives: dict[int, _Active] = {}
        self._inflight = 0
        self._deferred_barrier: tuple[EpochInstruction, int] | None = None
        # the divergence check: an optional communicator hook, see _announce_epoch
        self._epoch_check = getattr(communicator, "epoch_check", None)
        self._unverified_epoch: tuple[EpochInstruction, int] | None = None

        self._trace: list[TraceEvent] | None = [] if trace else None
        self._first_error: BaseException | None = None
        self._fence_error: BaseException | None = None
        self._failed = False          # winding down after a failure (see the error policy)
        self._blocked_in: str | None = None    # a blocking call the loop is in (describe_waits)
        self._stop = False
        self._drain = False
        self._thread: threading.Thread | None = None

        self._issuers: dict[type, Callable[[Assignment], None]] = {
            AllocInstruction: self._issue_alloc,
            FreeInstruction: self._issue_free,
            CopyInstruction: self._issue_copy,
            DeviceKernelInstruction: self._issue_kernel,
            HostTaskInstruction: self._issue_host_task,
            SendInstruction: self._issue_send,
            ReceiveInstruction: self._issue_receive,
            SplitReceiveInstruction: self._issue_receive,
            AwaitReceiveInstruction: self._issue_await_receive,
            GatherReceiveInstruction: self._issue_gather_receive,
            FillIdentityInstruction: self._issue_fill_identity,
            ReduceInstruction: self._issue_reduce,
            FenceInstruction: self._issue_fence,
            DestroyHostObjectInstruction: self._issue_destroy_host_object,
            CloneCollectiveGroupInstruction: self._issue_clone_collective_group,
            HorizonInstruction: self._issue_horizon,
            EpochInstruction: self._issue_epoch,
        }

    # ------------------------------------------------------------------ public API

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("executor already started")
        put = self._inbox.put_urgent
        self._backend.set_notifier(put)
        keep = getattr(self._backend, "keep_waits", None) if self._enqueues else None
        if keep is not None:
            self._kept = keep()
        self._comm.set_notifier(functools.partial(put, _WAKE))
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def submit(self, batch: InstructionBatch) -> None:
        """Thread-safe hand-off from the scheduler thread (never blocks)."""
        self._inbox.put(batch)

    def track_user_allocation(self, aid: int, array: Any) -> None:
        """Register a user-memory (M0) array as allocation ``aid``; call before any
        instruction uses ``aid``."""
        self._allocs[aid] = array
        self._forget_views()

    def track_user_buffer(self, bid: int, array: Any) -> None:
        """Register a host-initialized buffer's array (from the application thread, before
        the buffer is announced to the scheduler); the batch that introduces the buffer
        names its allocation id (``InstructionBatch.user_allocations``)."""
        self._user_buffers[bid] = array

    def track_host_object(self, hoid: int, obj: Any) -> None:
        """Register (or, once a host task replaced it, re-register) host object ``hoid``'s
        object, which later fences of it copy."""
        self._host_objects[hoid] = obj

    def shutdown(self, timeout: float | None = None, *, drain: bool = True) -> bool:
        """Stop the thread: after everything submitted completed (``drain``), or now.

        Returns False if the thread is still alive after ``timeout``.  A thread
        that already ended through a shutdown epoch is just joined.
        """
        if self._thread is None:
            return True
        if self._thread.is_alive():
            self._inbox.put(_DRAIN if drain else _ABORT)
        return self.join(timeout)

    def join(self, timeout: float | None = None) -> bool:
        t = self._thread
        if t is None:
            return True
        t.join(timeout)
        return not t.is_alive()

    def describe_waits(self, buffer_label: Callable[[int], str] | None = None, limit: int = 8) -> list[str]:
        """What this rank's executor still waits for, one line each (at most ``limit``):
        receives and from which ranks, sends, work on lanes, epochs waiting for peers.

        Called from another thread while the loop runs, so it reads snapshots and
        settles for a best effort; ``buffer_label`` names a buffer id.
        """
        label = buffer_label or (lambda b: f"B{b}")
        for _attempt in range(3):
            try:
                lines = self._describe_waits(label)
                break
            except (RuntimeError, KeyError, AttributeError):   # changed under our feet: look again
                continue
        else:
            return ["(the executor's state changed too quickly to describe)"]
        if len(lines) > limit:
            lines = lines[:limit] + [f"… and {len(lines) - limit} more"]
        return lines

    def _describe_waits(self, label: Callable[[int], str]) -> list[str]:
        out: list[str] = []
        blocked = self._blocked_in
        if blocked is not None:
            out.append(blocked)
        unverified = self._unverified_epoch
        if unverified is not None and self._epoch_check is not None:
            d = self._epoch_check.describe_wait(unverified[0])
            if d:
                out.append(d)
        deferred = self._deferred_barrier
        if deferred is not None:
            out.append(f"barrier epoch T{deferred[0].task} waits for {self._inflight} transfer(s) in flight")
        for iid, active in list(self._receives.items()):
            d = self._arbiter.describe(iid, label)
            out.append(d or f"{active.instr.kind} I{iid}")
        for active in list(self._sends):
            i = active.instr
            out.append(f"send of {label(i.transfer[1])} for task T{i.transfer[0]} to rank {i.to} "
                       f"(until rank {i.to} receives it)")
        cloning = len(self._cloning)
        if cloning:
            out.append(f"{cloning} collective group communicator clone(s) that the other ranks have yet to make "
                       f"(their host tasks wait on their lanes)")
        now = _perf_ns()
        for active in list(self._by_completion.values()) + list(self._polled):
            i = active.instr
            start = getattr(active.completion, "start_ns", None)
            state = f"running for {_seconds((now - start) / 1e9)}" if isinstance(start, int) else "queued"
            task = getattr(i, "task", None)
            name = getattr(i, "name", "")
            buffer = getattr(i, "buffer", None)
            what = i.kind + (f" of {label(buffer)}" if buffer is not None else "") + \
                (f" of task T{task}" if task is not None else "") + (f" {name!r}" if name else "")
            out.append(f"{what} on {active.lane}, {state}")
        if not out:
            n = len(self._engine)
            out.append(f"nothing in flight; {n} instruction(s) wait for their predecessors" if n else
                       "nothing: the work has not reached the executor yet")
        return out

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def waits_for_network(self) -> bool:
        """Sends or receives in flight: this rank's progress depends on its peers."""
        return bool(self._receives) or bool(self._sends)

    @property
    def error(self) -> BaseException | None:
        """The first error reported, if any."""
        return self._first_error

    @property
    def tracing(self) -> bool:
        return self._trace is not None

    @property
    def trace(self) -> list[TraceEvent]:
        """Executed instructions (empty unless constructed with ``trace=True``)."""
        return list(self._trace) if self._trace is not None else []

    # ------------------------------------------------------------------ loop

    def _run(self) -> None:
        clean = False
        try:
            self._loop()
            clean = self._engine.is_idle()
        except BaseException as exc:  # noqa: BLE001 - must never die silently: reported through on_error
            log.debug("executor loop failed", exc_info=True)
            self._report(exc, None)
        finally:
            self._backend.set_notifier(None)
            self._comm.set_notifier(None)
            if not clean:
                self._fail_pending_fences()

    def _loop(self) -> None:
        inbox = self._inbox
        handle = self._handle_item
        step = self._step
        _reduce_timer_slack()
        engine = self._engine
        while True:
            progress = False
            if not inbox.empty():       # one item, then issue what it made ready
                handle(inbox.get_nowait())
                progress = True
                # Batches queued behind it are taken at once while everything so far ran
                # directly (the engine holds nothing: no work is ready to issue or in
                # flight to poll for), which is when a step between them would find
                # nothing to do; a scheduler running ahead of tiny tasks or a stencil of
                # inline kernels queues them one per task.  (Bounded: the loop's other
                # duties, a fence's or the divergence check's, wait at most that long.)
                n = _BATCHES_AT_ONCE
                while n and not inbox.empty() and engine.is_idle() and not self._stop:
                    handle(inbox.get_nowait())
                    n -= 1
            if step():
                progress = True
            if self._stop:
                return
            if progress:
                self._stalled_since = 0
                if self._poll_delay:
                    self._end_idle_wait()
                continue
            if not self._stalled_since:
                self._stalled_since = _perf_ns()
            self._wait()

    # ------------------------------------------------------------------ waiting
    # With nothing to issue, the loop sleeps on its inbox, which the scheduler (batches),
    # lane workers (completions) and notifying communicators fill.  A polling
    # communicator (MPI) cannot notify: while sends or receives are outstanding the
    # loop polls it itself, and what that costs is CPU and GIL hand-offs (every MPI
    # call releases the GIL; a lane thread that wants it takes it) taken from the
    # work of this rank and, on a small machine, of the others.
    #   * Nothing but the network left to wait for (no lane work in flight): the
    #     peers' answer is the critical path.  If this rank's recent waits of that
    #     kind ended within ``poll_spin`` (a ping-pong, a tight halo exchange), the
    #     loop polls without pause for up to ``poll_spin``, since a sleep costs
    #     30-70 us before the thread runs again on this kind of machine; when they
    #     last longer (the peer is computing), spinning would only burn a core.
    #     Then it sleeps between polls, from ``poll_min`` (or a 32nd of how long such
    #     waits took lately, if more) growing by a quarter per empty poll up to
    #     ``poll_max`` and, once it has waited 32 times that, up to a 32nd of the wait
    #     so far (an arrival is seen at most ~3 % late), so a rank that waits long
    #     costs little CPU.
    #   * Lane work in flight: the lane's completion wakes the loop, and what an
    #     arrival lets it issue could rarely run much sooner than that (the next
    #     step needs the running kernel too): it polls rarely, from a quarter of
    #     ``poll_max`` up to ``poll_max``, and once it has waited longer, up to an
    #     eighth of how long it has waited (so an arrival is seen at most an eighth
    #     late); where the kernels running are of kinds seen before, from the start
    #     every eighth of the shortest one's expected time (``_running_kernels_ns``).
    #     Every poll wakes a thread whose caches the kernel has cleared: measured
    #     on wave_sim 4096² on 2 ranks (130 ms kernels), 54 polls per step cost the
    #     executor 13 ms of CPU per step (~245 us each: a timed sleep's wake-up
    #     alone is ~27 us of CPU on this VM), 10 % of a core the kernels of two
    #     ranks on two cores needed.
    #   * Nothing outstanding: it sleeps until woken.
    # (Measured, wave_sim 1024² on 2 ranks on 2 cores: polling from 20 us during
    # every 1 ms kernel cost each executor 0.2-0.35 ms of CPU per step.)

    def _wait(self) -> None:
        if self._kept:      # (the lanes' waiters notify what is still on the device: see keep_waits)
            self._backend.pass_kept_on()
        inbox = self._inbox
        if self._polled:                # backend completions that cannot notify
            inbox.wait(self._poll_interval)
            return
        comm = self._comm
        if (not comm.notifies and (self._sends or self._receives)) or self._cloning:
            delay = self._poll_delay
            if self._by_completion:     # lane work in flight
                # (beyond poll_max once the loop has waited long: an eighth of that wait, or
                # from the start an eighth of the shortest running kernel's expected time)
                eighth = self._running_kernels_ns() * 1.25e-10
                cap = self._long_wait_cap(8)
                if eighth > cap:
                    cap = eighth
                delay = min(max(delay * 1.25, self._poll_max / 4, eighth), cap)
                self._idle_start = 0
            elif delay == 0.0 or self._idle_start == 0:   # the first idle wait since something happened
                self._idle_start = _perf_ns()
                if self._spin_ns and self._idle_estimate <= self._spin_ns and self._spin():
                    self._end_idle_wait()
                    return
                # (from a 32nd of how long such waits took lately: a rank waiting ~40 ms a step
                # for a computing peer polled ~20 times in the first 5 ms ramping up from poll_min)
                delay = min(max(self._poll_min, self._idle_estimate * 3.125e-11), self._poll_max)
            else:
                delay = min(delay * 1.25, self._long_wait_cap(32))
            self._poll_delay = delay
            inbox.wait(delay)
            return
        if self._unverified_epoch is not None:     # waiting for a peer's epoch (divergence check)
            # polled as the network is: from poll_min, a quarter longer per empty poll, up to
            # poll_max and in a long wait a 32nd of it (a fixed 1 ms saw a peer that came at once
            # up to 1 ms late, and cost a rank waiting at a barrier behind a slow peer ~930
            # wake-ups a second, 4.7 % of a core)
            delay = self._poll_delay
            delay = self._poll_min if delay == 0.0 else min(delay * 1.25, self._long_wait_cap(32))
            self._poll_delay = delay
            inbox.wait(min(self._idle_timeout, delay))
            return
        inbox.wait(self._idle_timeout)

    def _long_wait_cap(self, parts: int) -> float:
        """The longest sleep between polls: ``poll_max``, and once the loop has waited
        ``parts`` times that long, the ``parts``-th part of the wait so far (an arrival is seen
        at most that share of the wait late).  8 while lane work runs (its completion wakes the
        loop anyway), 32 while only the network (or a peer's epoch) is waited for: a rank
        waiting for a peer that computes for seconds woke every ``poll_max`` (2 ms: ~480
        wake-ups and 4-5 % of a core a second, taken from the peer where ranks share cores)."""
        since = self._stalled_since
        cap = self._poll_max
        if since:
            cap = max(cap, (_perf_ns() - since) * 1e-9 / parts)
        return cap

    def _running_kernels_ns(self) -> int:
        """The shortest expected run time (ns) of the kernels in flight on lanes: 0 where
        none runs or one is of a kind not seen before (it might end any moment).  Other lane
        work (copies, host tasks) does not count: its completion wakes the loop, which then
        looks again.  Polling more often than an eighth of it would see an arrival sooner
        than anything it enables could run (the next step needs the running kernel too),
        and on a machine whose ranks share cores each wake-up takes the CPU from a kernel:
        measured on wave_sim 4096² on 2 ranks (~90 ms kernels), ramping from
        ``poll_max / 4`` woke the executor ~27 times a kernel, ~200 us of CPU each with the
        caches the kernel emptied."""
        costs = self._costs
        shortest = 0
        for active in self._by_completion.values():
            key = active.cost_key
            if key is None:
                continue
            est = costs.get(key)
            if est is None:
                return 0
            if shortest == 0 or est < shortest:
                shortest = est
        return shortest

    def _end_idle_wait(self) -> None:
        """Something happened after the loop waited: learn how long idle waits last."""
        start = self._idle_start
        if start:
            self._idle_estimate = (self._idle_estimate + (_perf_ns() - start)) // 2
            self._idle_start = 0
        self._poll_delay = 0.0

    def _spin(self) -> bool:
        """Poll the communicator without pause for up to ``poll_spin``; True once anything
        arrived (in the inbox too)."""
        deadline = _perf_ns() + self._spin_ns
        inbox = self._inbox
        poll = self._poll_comm
        while inbox.empty():
            if poll():
                self._spun = True
                return True
            if _perf_ns() >= deadline:
                return False
        return True

    def _handle_item(self, item: Any) -> None:
        if type(item) is InstructionBatch:
            self._accept(item)
        elif item is _WAKE:
            pass
        elif item is _DRAIN:
            self._drain = True
        elif item is _ABORT:
            self._stop = True
        else:  # a notifying backend completion
            active = self._by_completion.pop(item, None)
            if active is not None:
                self._retire(active, item.error())

    def _accept(self, batch: InstructionBatch) -> None:
        for aid, bid in batch.user_allocations:
            self._allocs[aid] = self._user_buffers.pop(bid)
            self._forget_views()
        if batch.pilots and not self._failed:
            try:
                self._comm.send_pilots(batch.pilots)
            except Exception as exc:  # noqa: BLE001
                self._report(exc, None)
        engine = self._engine
        instrs = batch.instructions
        if self._inline_ns and self._trace is None and not self._failed:
            # which positions may run directly (the same for every batch of one shape, as
            # long as the set of memory pairs copied directly stays: _batch_plan)
            shape = batch.shape
            plan = self._plans.get(shape) if shape is not None else None
            if plan is None or len(plan) != len(instrs):   # (zip below must not drop one)
                plan = self._batch_plan(instrs)
                if shape is not None:
                    if len(self._plans) >= 4096:
                        self._plans.clear()
                    self._plans[shape] = plan
            # whether every instruction accepted so far ran directly, so the engine is still idle
            # (then would_assign_at_once holds: direct issue neither submits nor completes engine work)
            idle = engine.is_idle()
            at_once = engine.would_assign_at_once
            direct_kernel = self._direct_kernel
            direct_copy = self._direct_copy
            for instr, code in zip(instrs, plan):
                if code and not self._failed and (idle or at_once(instr)):
                    if code is _KERNEL:
                        if direct_kernel(instr):
                            continue
                    elif code is _COPY:
                        direct_copy(instr)
                        continue
                    else:
                        self._direct_horizon(instr)
                        continue
                self._to_engine(instr)
                idle = False
            return
        for instr in instrs:
            self._to_engine(instr)

    def _to_engine(self, instr: Instruction) -> None:
        """Submit ``instr`` to the engine, as ``_accept`` does with what does not run directly."""
        t = type(instr)
        if t is AwaitReceiveInstruction:
            self._engine.submit(instr, self._await_deps(instr))
        else:
            if t is EpochInstruction and self._epoch_check is not None:
                self._announce_epoch(instr)
            self._engine.submit(instr, None)

    def _batch_plan(self, instrs: list[Instruction]) -> tuple:
        """Per position of a batch, whether direct issue (see ``_accept``) may run it: 0 for
        no, ``_KERNEL`` for a kernel, ``_COPY`` for a copy that would run inline,
        ``_HORIZON`` for a horizon (bookkeeping only, like a kernel's position).  Direct
        issue must not run work ahead of a later, more urgent instruction of the batch that
        would not run directly itself: none after the last such instruction with a priority
        above 0 (copies, comm) for a kernel, above 1 (comm) for a copy."""
        above0 = above1 = -1
        slow: set = set()       # positions of copies that would not run directly
        inline_bytes = self._inline_bytes
        pairs = self._direct_copies
        for i, instr in enumerate(instrs):
            p = instr.priority
            if type(instr) is CopyInstruction and (instr.size_bytes > inline_bytes or (
                    instr.source_memory, instr.dest_memory) not in pairs):
                slow.add(i)
                if p:
                    above0 = i
                    if p > 1:
                        above1 = i
            elif p:
                if p > 1:
                    above0 = above1 = i
                elif type(instr) is not CopyInstruction:
                    above0 = i
        plan = []
        for i, instr in enumerate(instrs):
            t = type(instr)
            if t is DeviceKernelInstruction and i > above0:
                plan.append(_KERNEL)
            elif t is HorizonInstruction and i > above0:
                plan.append(_HORIZON)
            elif t is CopyInstruction and i > above1 and i not in slow:
                plan.append(_COPY)
            else:
                plan.append(0)
        return tuple(plan)

    # Direct issue.  An instruction that arrives with every predecessor complete, while
    # nothing else is ready, would be assigned at once, and if it is cheap work on an
    # inline lane, run on this thread and completed: the engine's node, heap entry,
    # lane pick and completion bookkeeping would all be spent on an instruction that
    # never waits.  So such kernels and copies run straight from the batch, the kernels
    # only on a device whose inline runs showed its lanes run inline (and with that
    # lane's array module and stream), the copies only between memories whose copies
    # ran inline before.  Not when something else is ready (it may be more urgent), nor
    # ahead of a later instruction of the batch that has a higher priority and would go
    # through the engine (a send, a receive, a large copy: work that could start
    # elsewhere sooner), nor while tracing (every instruction keeps its trace event).
    # Among directly run work the batch's (topological) order replaces the engine's
    # priority order: it all runs on this thread, one piece after the other, so the
    # order decides only which of them finishes first, not when the last one does.
    # Measured (bench_executor, steady replay): 2.7-3.0 -> 1.8 us of executor CPU per
    # instruction on the no-op stencil and on tiny tasks.

    def _direct_kernel(self, instr: DeviceKernelInstruction) -> bool:
        # The launch context of this chunk's last direct run, while it would be built the
        # same: a replayed kernel has the same box and name and, while its allocations stay,
        # the same accesses list (the scheduler's builder keeps it: _remember_accesses); only
        # the task differs.  Direct runs are done one at a time on this thread, so one
        # context serves them all (_inline_context makes and keeps it).  The entry holds the
        # cost key as well, so a hit looks up neither the device's direct lane nor the key;
        # entries go with the views when an allocation comes or goes (_forget_views: the
        # arrays), and when a device's direct lane changes.
        accesses = instr.accesses
        # (_inline_context's hit test, written out: this path needs the entry's cost key
        # before it decides to run the kernel here; keyed by accesses, not by box, since a
        # stencil's two phases share their boxes)
        c = self._contexts.get(id(accesses))
        if (c is not None and c[0] is accesses and c[1] is instr.box and c[2] == instr.name
                and c[3] == instr.device and not instr.reductions):
            key = c[5]
            est = self._costs.get(key)
            if est is None or est > self._inline_ns:
                return False
            ctx = c[4]
            ctx.task = instr.task
            self._kernel_inline(instr, instr.launcher, ctx, key, est)
            return True
        lane = self._direct_kernel_lanes.get(instr.device)
        if lane is None:
            return False
        key = self._cost_key(instr)
        est = self._costs.get(key)
        if est is None or est > self._inline_ns:
            return False
        self._kernel_inline(instr, instr.launcher, self._inline_context(instr, lane, key), key, est)
        return True

    def _direct_horizon(self, instr: HorizonInstruction) -> None:
        """``_issue_horizon`` without the engine: a horizon whose predecessors all completed
        (the whole previous step ran directly) only drops garbage, prunes the arbiter and
        tells the runtime.  Through the engine its node depended on the whole execution
        front and cost a submit, an assignment, a completion and a pass of the loop: ~640
        executor opcodes a horizon of the no-op stencil, a quarter of them per step."""
        self.direct_horizons += 1
        self._horizon_work(instr)
        if self._on_horizon is not None:
            self._callback(self._on_horizon, instr)

    def _direct_copy(self, instr: CopyInstruction) -> None:
        """Run a copy that ``_accept`` found to copy directly."""
        box = instr.box
        pair = self._views.get((instr.source, instr.dest, box.lo, box.hi))   # (_copy_views' cache hit, inline)
        if pair is None:
            pair = self._copy_views(instr)
            if pair is None:
                return
        self._copy_inline(instr, pair)

    def _await_deps(self, instr: AwaitReceiveInstruction) -> list[int]:
        """Drop an await's edge to its split_receive: the arbiter buffers awaits that
        come first, so the await may complete (its sub-region arrived) before the
        whole split receive has."""
        engine = self._engine
        out = []
        for d in instr.dep_ids:
            p = engine.instruction(d)
            if isinstance(p, SplitReceiveInstruction) and tuple(p.transfer) == tuple(instr.transfer):
                continue
            out.append(d)
        return out

    def _poll_comm(self) -> bool:
        """Take in arrived pilots and retire completed receives and sends; True if any."""
        progress = False
        # pilots matter only to active receives that lack one (one that is issued later
        # finds the pilots taken in by then, and the next poll takes in the rest)
        pilots = self._comm.poll_pilots() if self._arbiter.wants_pilots or self._comm.notifies else None
        if pilots:
            progress = True
            on_pilot = self._arbiter.on_pilot
            for fr, p in pilots:
                on_pilot(fr, p)
        if self._receives:
            for iid in self._arbiter.poll():
                active = self._receives.pop(iid, None)
                if active is not None:
                    progress = True
                    self._retire(active, active.completion.error())
        if self._cloning:
            self._cloning = [c for c in self._cloning if not c.clone_completed()]
        if self._sends:
            still = []
            for a in self._sends:
                try:
                    done = a.completion.test()
                except Exception as exc:  # noqa: BLE001
                    progress = True
                    self._retire(a, exc)
                    continue
                if done:
                    progress = True
                    self._retire(a, None)
                else:
                    still.append(a)
            self._sends = still
        return progress

    def _step(self) -> bool:
        """Poll everything once and issue what is ready; True if anything happened."""
        if self._epoch_check is not None and (self._unverified_epoch is not None
                                              or _perf_ns() >= self._next_epoch_poll):
            self._next_epoch_poll = _perf_ns() + _EPOCH_POLL_NS
            self._poll_epoch_check()
        if self._spun:
            # the spin's poll just now found what it waited for: issuing what that made ready
            # comes first (polling again would find nothing new in those microseconds, on the
            # hop's critical path)
            self._spun = False
            progress = True
        else:
            progress = self._poll_comm()
        if self._polled:
            # A lane is in order, so work on it completes in order: behind the first running
            # item of a lane nothing is done yet, and polling it would cost a device query
            # each (~1-2 us for a CUDA event; a burst of eagerly queued kernels put a hundred
            # of them behind one another).
            still = []
            running = None
            for a in self._polled:
                if running is not None and a.lane in running:
                    still.append(a)
                elif a.completion.is_done():
                    progress = True
                    self._retire(a, a.completion.error())
                else:
                    still.append(a)
                    if running is None:
                        running = {a.lane}
                    else:
                        running.add(a.lane)
            self._polled = still
        if self._kept:
            by_completion = self._by_completion
            for c in self._backend.take_finished():
                active = by_completion.pop(c, None)
                if active is not None:
                    progress = True
                    self._retire(active, c.error())
        if self._issue_ready():
            progress = True
        if self._unverified_epoch is not None and (self._failed or self._epoch_verified(self._unverified_epoch[0])):
            instr, t0 = self._unverified_epoch
            self._unverified_epoch = None
            self._run_epoch(instr, t0)
            progress = True
        if self._deferred_barrier is not None and (self._inflight == 0 or self._failed):
            instr, t0 = self._deferred_barrier
            self._deferred_barrier = None
            self._finish_epoch(instr, t0)
            progress = True
        if self._drain and self._engine.is_idle() and self._inbox.empty():
            self._stop = True
        return progress

    # ------------------------------------------------------------------ issue / retire

    def _issue_ready(self) -> bool:
        """Issue every instruction the engine has ready (inline work completes right here
        and may make more ready); True if there was any."""
        assign = self._engine.assign_one
        issuers = self._issuers
        issued = False
        while not self._stop:
            a = assign()
            if a is None:
                return issued
            issued = True
            instr = a.instruction
            if self._failed:
                self._wind_down(instr)
                continue
            try:
                issuer = issuers.get(type(instr)) or self._issuer_for_subclass(instr)
                issuer(a)
            except Exception as exc:  # noqa: BLE001 - policy: report, retire, keep going
                self._report(exc, instr)
                self._engine.complete(instr.id)
        return issued

    def _issue(self, a: Assignment) -> None:
        """Issue one assignment (the loop issues through ``_issue_ready``)."""
        instr = a.instruction
        if self._failed:
            self._wind_down(instr)
            return
        try:
            issuer = self._issuers.get(type(instr)) or self._issuer_for_subclass(instr)
            issuer(a)
        except Exception as exc:  # noqa: BLE001 - policy: report, retire, keep going
            self._report(exc, instr)
            self._engine.complete(instr.id)

    def _issuer_for_subclass(self, instr: Instruction) -> Callable[[Assignment], None]:
        for cls in type(instr).__mro__:
            f = self._issuers.get(cls)
            if f is not None:
                self._issuers[type(instr)] = f
                return f
        raise TypeError(f"executor cannot execute instruction kind {instr.kind!r}")

    def _complete_sync(self, instr: Instruction, lane: str, t0: int) -> None:
        """Retire an instruction that ran synchronously on the executor thread."""
        if self._trace is not None:
            self._trace.append(_trace_event(instr, lane, t0, _perf_ns()))
        self._engine.complete(instr.id)

    def _start_async(self, instr: Instruction, lane: str, completion: Any) -> _Active:
        self._inflight += 1
        return _Active(instr, lane, _perf_ns() if self._trace is not None else 0, completion)

    def _track_backend(self, instr: Instruction, lane: Lane, completion: Completion) -> _Active:
        active = self._start_async(instr, lane.name, completion)
        if completion.notifying:
            # registered before the notification can be handled: it goes through the inbox
            self._by_completion[completion] = active
        else:
            self._polled.append(active)
        return active

    def _retire(self, active: _Active, error: BaseException | None) -> None:
        self._inflight -= 1
        instr = active.instr
        key = active.cost_key
        if key is not None:
            c = active.completion
            ns = getattr(c, "cpu_ns", None)
            if ns is None and c.start_ns is not None and c.end_ns is not None:
                ns = c.end_ns - c.start_ns
            if ns is not None:
                self._note_cost(key, ns)
        if error is not None and type(error) is LaneSkipped:
            self._failed = True       # (the failure that made the lane skip it is reported on its own)
        elif self._trace is not None:
            c = active.completion
            start = getattr(c, "start_ns", None)
            end = getattr(c, "end_ns", None)
            if not isinstance(start, int) or not isinstance(end, int):
                start, end = active.start_ns, _perf_ns()
            self._trace.append(_trace_event(instr, active.lane, start, end))
        if error is not None and type(error) is not LaneSkipped:
            self._report(error, instr)
        self._engine.complete(instr.id)

    def _lane(self, a: Assignment) -> _LaneInfo:
        info = a.lane_ref.handle if a.lane_ref is not None else None
        if info is None:
            info = self._lane_info(a)
        return info

    def _lane_info(self, a: Assignment) -> _LaneInfo:
        if a.target is Target.DEVICE_LANE:
            lane = Lane("device", a.device, a.lane)
        elif a.target is Target.HOST_LANE:
            lane = Lane("host", None, a.lane)
        else:
            raise ValueError(f"instruction I{a.instruction.id} on {a.target} has no lane")
        backend = self._backend
        device = lane.kind == "device"
        info = _LaneInfo(lane, bool(self._inline_ns) and backend.runs_inline(lane),
                         backend.xp_for_memory(device_memory(lane.device) if device else HOST_MEMORY),
                         backend.lane_handle(lane))
        a.lane_ref.handle = info
        return info

    # ------------------------------------------------------------------ inline execution
    # Handing an instruction to a host lane costs a queue put, a worker wake-up, a GIL
    # hand-over and a completion notification back through the inbox: tens of µs of
    # Python on a machine with few cores, far more than a small kernel or copy takes.
    # So cheap work whose lane is idle (not an eager assignment: every predecessor has
    # completed, nothing queued on the lane) runs right here on the executor thread,
    # recorded under its lane in the trace.  Cheap means:
    #   * copies, identity fills and reductions of at most ``inline_copy_bytes``
    #     (their cost is the size);
    #   * device kernels whose kind (name and chunk-size class) was measured to run in
    #     under ``inline_threshold``, and the first kernel of a kind, whose cost is
    #     unknown: it runs here once, timed in this thread's CPU time, and a long one goes
    #     to its lane from then on.  (It used to go to its lane, so that a long kernel
    #     never blocked the executor even once; but at start-up the lane thread starves
    #     for the GIL behind the application and scheduler threads, every later
    #     instruction waits for it, and a lane run's CPU time counts its GIL hand-overs:
    #     the 128² no-op stencil's first 500 steps took 85-90 us each that way, 77 now.)
    #     Estimates come from inline runs (wall time; CPU time for a suspect kind) and
    #     lane runs (the worker's CPU time, which unlike its wall time does not count
    #     waiting for the GIL); an estimate drops at once to a faster run and rises by a
    #     quarter of the difference to a slower one.
    # When the executor has nothing else to do (no lane work in flight, no other
    # instruction ready), running the work itself costs no concurrency, only
    # responsiveness to whatever arrives meanwhile: then kernels estimated under
    # ``inline_alone_threshold`` and copies up to ``inline_alone_copy_bytes`` run inline
    # too.  That is the common case of one device per rank, where every step waits for
    # the previous one: measured on wave_sim 256² (110 us kernels), the two hand-offs
    # cost 30-40 us per step.  Kernels up to ``inline_quiet_threshold`` (10 ms) run inline
    # when, besides, no send is in flight (a large one may need this rank's progress for
    # the peer to get its data; a small one completes as it is issued).  An arrival
    # meanwhile is seen up to that late (and a peer's large send into a receive posted
    # here may complete that late on its side), but it can only enable work that was not
    # ready when the kernel started, and the hand-offs cost more than at 256²: on wave_sim
    # 1024² on 2 ranks (2.5 ms kernels) the kernel's lane thread, the wake-ups that
    # issue and retire it and the executor's polls while it ran took 3.9-4.1 ms of the
    # rank's CPU per step, 2.7-2.8 ms run inline.
    # Host tasks always go to their lane: they may block (collectives, I/O, user waits).

    def _eager_ok(self, instr: Instruction, lane: Any) -> bool:
        """Queue ``instr`` on ``lane`` behind its running predecessors?  Not on a lane whose work
        may run inline when ``instr`` is cheap enough to run inline once they completed: the
        completion wakes this thread anyway, and a second thread running a few microseconds
        of Python beside the lane's next kernel only fights it for the GIL (measured, wave_sim
        1024² on 2 ranks: a 4 KiB halo copy queued behind the kernel took 250-850 us).
        Where only source kernels are enqueued on a device lane's queue (OpenCL:
        ``enqueues_python_kernels``), nothing else goes behind them: the lane's worker would
        run it at once, while the kernel before it still runs on the device."""
        if (not self._enqueues_python and self._enqueues and lane.key[0] is Target.DEVICE_LANE
                and not (type(instr) is DeviceKernelInstruction and getattr(instr.launcher, "source", False))):
            return False
        info = lane.handle
        if info is None or not info.inline:
            return True
        t = type(instr)
        if t is CopyInstruction:
            return instr.size_bytes > self._inline_bytes
        if t is DeviceKernelInstruction:     # (one of unknown cost runs inline: see _dispatch)
            est = self._costs.get(cost_key(instr))
            return est is not None and est > self._inline_ns
        if t is FillIdentityInstruction or t is ReduceInstruction:
            return instr.count * 8 > self._inline_bytes
        return True

    def _alone(self) -> bool:
        """Nothing but the instruction being issued could run now (see inline execution)."""
        return not self._by_completion and not self._polled and not self._engine.has_ready()

    def _inline_alone(self, est: int) -> bool:
        """Whether a kernel estimated at ``est`` ns, over the inline threshold, runs inline
        anyway: up to ``inline_alone_threshold`` while nothing else could run, up to
        ``inline_quiet_threshold`` while no send is in flight either."""
        return (est <= self._alone_ns or (est <= self._quiet_ns and not self._sends)) and self._alone()

    def _note_cost(self, key: Any, ns: int, wall: bool = False) -> None:
        """``wall``: ``ns`` is an inline run's wall time, which counts whatever held this
        thread off the CPU or the GIL meanwhile (a preemption, another thread's switch
        interval: 5-10 ms with a busy application thread).  Such a run must not move a
        kernel known to be cheap off the executor thread on its own: it leaves the
        estimate alone and marks the kind suspect, and the next inline run of the kind
        is timed in this thread's CPU time, which decides.  (CPU time costs a system
        call, ~0.4 us, so it is read only then.)  Measured before: an outlier of a few
        ms made a 20 us stencil kernel "cost" 2.3 ms and sent it to its lane, whose
        numpy calls each waited for the GIL behind the application thread; the 128²
        stencil's executor fell 5000 instructions behind, 175 -> 215 us per step."""
        costs = self._costs
        old = costs.get(key)
        if old is None or ns <= old:
            costs[key] = ns
            return
        new = old + (ns - old) // 4
        if old <= self._inline_ns < new:
            if wall:
                self._suspect.add(key)
                return
            # A measured run took an inline kind over the threshold: inline runs timed in
            # CPU time may settle it again (``_probe``).  A lane run's CPU time counts its
            # GIL hand-overs, and one slow inline run moves the estimate a quarter of the
            # way: measured on the 128² stencil on host:4, a 25-40 us kernel rose from 86 to
            # 102 us on one 147 us run, and its lane runs kept it there (see _probe).
            self._probes.pop(key, None)
        costs[key] = new

    def _probe(self, key: Any) -> bool:
        """Run a kernel kind whose estimate lies between the inline threshold and
        ``inline_alone_threshold`` inline again, timed in CPU time?  Up to ``PROBES``
        times (again after a measured run takes it over the threshold: ``_note_cost``).
        Such estimates come from a kind's first runs, cold (fresh allocations touched
        for the first time, empty caches: 100-230 us of CPU for a 25-40 us stencil
        kernel), and from lane runs, whose CPU time counts the GIL hand-overs their
        numpy calls make (each call lets the GIL go and takes it back: a contended futex
        wait while the application and scheduler threads run Python).  On the lanes such
        a kernel stays: its run time is its numpy calls' waits for the GIL, a switch
        interval each, and each late completion holds the next steps' work in the
        engine.  Measured on the 128² stencil on host:4: a 17 us kernel cost 70-220 us on
        its lane and stayed there for the first 25 ms with no probe; with one probe per
        kind, a probe that was itself cold (102 us) left it there in 1 run of 15, and
        those runs took 230-300 against 160-210 us an iteration, every batch issued
        through the engine behind a backlog of thousands of instructions.  The runs are
        bounded by the alone threshold, and run inline they cost what they would cost on a
        lane, less the hand-off."""
        n = self._probes.get(key, 0)
        if n >= PROBES:
            return False
        self._probes[key] = n + 1
        self._suspect.add(key)
        return True

    def _cpu_clock(self, key: Any) -> int:
        """Before an inline run of kind ``key``: this thread's CPU clock if the kind is
        suspect (``_note_cost``), else -1 (its wall time will do)."""
        suspect = self._suspect
        if key in suspect:
            suspect.discard(key)
            return _thread_ns()
        return -1

    def _note_run(self, key: Any, cpu0: int, wall_ns: int) -> None:
        """After an inline run: its cost, in CPU time when ``_cpu_clock`` started one."""
        if cpu0 >= 0:
            self._note_cost(key, _thread_ns() - cpu0)
        else:
            self._note_cost(key, wall_ns, True)

    def _dispatch(self, a: Assignment, lane: _LaneInfo, fn: Callable[..., Any], key: Any, *args: Any) -> None:
        """Run ``fn(*args)`` for ``a`` inline when that is allowed and cheap, else launch it
        on ``lane``.  ``key`` is a kernel's cost key (a tuple) or a size in bytes."""
        instr = a.instruction
        if lane.inline and not a.eager:
            if type(key) is tuple:
                est = self._costs.get(key)
                if est is None:         # the first of its kind, timed in CPU time (see inline execution)
                    self._suspect.add(key)
                    cheap = True
                elif est <= self._inline_ns:
                    cheap = True
                else:   # (an estimate up to the alone threshold is re-measured inline: _probe)
                    cheap = self._inline_alone(est) or (est <= self._alone_ns and self._probe(key))
            else:
                cheap = key <= self._inline_bytes or (key <= self._alone_bytes and self._alone())
            if cheap:
                kernel = type(key) is tuple
                timed = kernel or self._trace is not None
                cpu0 = self._cpu_clock(key) if kernel and self._suspect else -1
                t0 = _perf_ns() if timed else 0
                error = None
                try:
                    fn(*args)
                except BaseException as exc:  # noqa: BLE001 - same policy as a lane worker
                    error = exc
                if timed:
                    t1 = _perf_ns()
                    if kernel:
                        self._note_run(key, cpu0, t1 - t0)
                    if self._trace is not None:
                        self._trace.append(_trace_event(instr, lane.name, t0, t1))
                if error is not None:
                    self._report(error, instr)
                self._engine.complete(instr.id)
                return
        if args:
            fn = functools.partial(fn, *args)
        c = None
        if self._enqueues and type(key) is tuple:
            if getattr(instr.launcher, "source", False):    # (only enqueues, however long the device takes)
                c = self._backend.enqueue_now(lane.lane, fn, dependent=a.eager, direct=True)
            elif self._enqueues_python:
                est = self._costs.get(key)
                if est is None or est <= self._alone_ns:    # (the first of a kind is measured so)
                    c = self._backend.enqueue_now(lane.lane, fn, dependent=a.eager)
        if c is None:
            c = self._backend.launch(lane.lane, fn, dependent=a.eager)
        active = self._track_backend(instr, lane.lane, c)
        if type(key) is tuple:   # (completions are handled on this thread, so in time)
            active.cost_key = key

    # ------------------------------------------------------------------ errors

    def _report(self, exc: BaseException, instr: Instruction | None) -> None:
        if instr is not None:   # the user sees the error once, where it surfaces (wait, fence, shutdown)
            log.debug("instruction I%d (%s) failed: %r", instr.id, instr.kind, exc)
        self._failed = True
        if self._first_error is None:
            self._first_error = exc
        returned = None
        if self._on_error is not None:
            try:
                returned = self._on_error(exc, instr)
            except Exception:  # noqa: BLE001
                log.exception("on_error callback failed")
        if self._fence_error is None:
            self._fence_error = returned if isinstance(returned, BaseException) else exc

    def _fail_pending_fences(self) -> None:
        pending = self._engine.pending_instructions()
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if type(item) is InstructionBatch:
                pending.extend(item.instructions)
        for instr in pending:
            if isinstance(instr, FenceInstruction) and instr.promise is not None:
                _set_promise(instr.promise, error=self._fence_error or ExecutorStopped(
                    f"rank {self._rank}: the executor stopped before fence T{instr.task} was reached"))

    def _wind_down(self, instr: Instruction) -> None:
        """After a failure: retire ``instr`` without executing it, doing only the
        bookkeeping that keeps the rank from hanging or leaking (see the error policy)."""
        callback = None
        try:
            if isinstance(instr, FenceInstruction):
                if instr.promise is not None:
                    _set_promise(instr.promise, error=self._fence_error or ExecutorStopped(
                        f"rank {self._rank}: an earlier instruction failed before fence T{instr.task}"))
            elif isinstance(instr, FreeInstruction):
                arr = self._allocs.pop(instr.allocation, None)    # absent if its alloc was skipped
                self._forget_views()
                memory = self._backend_allocs.pop(instr.allocation, None)
                if arr is not None and memory is not None:
                    self._backend.free(memory, arr)
            elif isinstance(instr, (HorizonInstruction, EpochInstruction)):
                self._collect_garbage(instr.garbage)
                self._arbiter.prune(instr.task)
                callback = self._on_epoch if isinstance(instr, EpochInstruction) else self._on_horizon
                if isinstance(instr, EpochInstruction) and instr.action == "shutdown":
                    self._stop = True
            elif isinstance(instr, DestroyHostObjectInstruction):
                self._host_objects.pop(instr.host_object, None)
        except Exception:  # noqa: BLE001 - winding down after the error that counts
            log.debug("winding down I%d (%s) failed", instr.id, instr.kind, exc_info=True)
        self._engine.complete(instr.id)
        if callback is not None:
            self._callback(callback, instr)

    # ------------------------------------------------------------------ divergence check
    # (issue 5) A communicator that compares task streams across ranks exposes
    # ``epoch_check`` with ``announce(epoch)``, ``poll(stalled)`` and ``verified(epoch) ->
    # bool``: every epoch is announced when it arrives (long before it runs, so a
    # rank stuck on data a diverged peer never sends still learns of the
    # divergence), peers' announcements are polled every step (with how long the
    # loop has been stalled: see _poll_epoch_check), and an epoch the
    # check wants confirmed (shutdown, barrier) completes only once verified.
    # Mismatches and timeouts raise DivergenceError, reported like any failure.

    def _announce_epoch(self, instr: EpochInstruction) -> None:
        try:
            self._epoch_check.announce(instr)
        except Exception as exc:  # noqa: BLE001
            self._report(exc, instr)

    def _poll_epoch_check(self) -> None:
        # stalled: work outstanding and nothing progressing (waiting for a peer's data, a
        # fence, a long kernel); a long stall makes the check show the neighbour this
        # rank's pending tasks, since ranks that diverged before a fence wait here forever
        since = self._stalled_since
        stalled = (_perf_ns() - since) / 1e9 if since and not self._engine.is_idle() else 0.0
        try:
            self._epoch_check.poll(stalled)
        except Exception as exc:  # noqa: BLE001
            self._report(exc, None)

    def _epoch_verified(self, instr: EpochInstruction) -> bool:
        try:
            return self._epoch_check.verified(instr)
        except Exception as exc:  # noqa: BLE001 - reported; the epoch then completes
            self._report(exc, instr)
            return True

    def _callback(self, fn: Callable[[int], Any], instr: Instruction) -> None:
        try:
            fn(instr.task)
        except Exception as exc:  # noqa: BLE001
            log.exception("callback for I%d failed", instr.id)
            self._report(exc, instr)


# ---------------------------------------------------------------------- helpers


_BATCHES_AT_ONCE = 16         # batches the loop takes without a step between them (see _loop)
PROBES = 3                    # inline runs, timed in CPU time, that may settle a kind's estimate (_probe)
_EPOCH_POLL_NS = 1_000_000      # the divergence check's messages are looked for once a millisecond


def _reduce_timer_slack() -> None:
    """Let this thread's timed sleeps end close to when they should (Linux).

    The kernel may extend a sleep by the thread's timer slack, 50 us by default,
    to batch wake-ups: measured on a 2-core VM, a 20 us ``Event.wait`` took 85 us
    with the default slack and 43 us with 1 us.  The executor's short sleeps
    while it polls a communicator are on the critical path of a message hop.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)      # ns
    except Exception:  # noqa: BLE001 - an optimization only
        log.debug("could not reduce the executor's timer slack", exc_info=True)


_PR_SET_TIMERSLACK = 29


def _seconds(t: float) -> str:
    return f"{t:.1f} s" if t < 10 else f"{t:.0f} s"

