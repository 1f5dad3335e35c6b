"""Work enqueued on an asynchronous device queue (a CUDA stream, an OpenCL command queue)
and waited for by a waiter thread per lane: shared by the CUDA and OpenCL backends.

A lane's work is *enqueued* on its queue, by the lane's worker thread or, when the lane
is idle, by the executor itself (``enqueue_now``), and what the device must finish
before the work counts as done is recorded as the completion's ``event``.  The lane's
waiter thread takes the completions in enqueue order (a queue completes in order),
blocks until the device finished each one with the GIL released, and notifies the
executor, so the executor never waits for the device.  What the executor enqueued
itself it may keep instead (``keep_waits``, CUDA with the driver): while it is busy it
asks the device about the oldest item of each lane at each look (an event query that
keeps the GIL), and it passes what is left to the waiters before it sleeps.
"""
from __future__ import annotations

import logging
import threading
from queue import SimpleQueue
from typing import Any, Callable, Protocol

from .backend import Completion, Lane
from .host import HostBackend, HostCompletion, _LaneWorker, _perf_ns

log = logging.getLogger("celeritas.executor")


class DeviceEvent(Protocol):
    """What a completion waits for on the device (a CUDA event, OpenCL events)."""

    @property
    def done(self) -> bool: ...

    def synchronize(self) -> None: ...


class QueueCompletion(Completion):
    """Done once the work was enqueued (by the lane's worker, or by the caller: ``enqueue_now``)
    and its ``event`` completed.  The lane's waiter notifies it.

    ``cpu_ns`` is the enqueueing thread's CPU time, the cost the executor plans with (wall
    time would count waits for the GIL), plus, for a backend whose inline runs of the same
    work wait for the device (OpenCL), the time from the end of the enqueue until the waiter
    saw the device finish: the executor compares one estimate per kind of work with its
    inline threshold, whichever way the work ran."""

    __slots__ = ("_host", "_event", "_device_error", "_device_ns", "_seen_done_ns")
    notifying = True

    def __init__(self, host: HostCompletion):
        self._host = host
        self._event: DeviceEvent | None = None
        self._device_error: BaseException | None = None
        self._device_ns = 0
        self._seen_done_ns: int | None = None     # when the waiter saw the device finish

    def is_done(self) -> bool:
        if not self._host._done:
            return False
        if self._host._error is not None or self._event is None:
            return True
        return self._event.done

    def error(self) -> BaseException | None:
        return self._host._error or self._device_error

    def wait(self, timeout: float | None = None) -> bool:
        if not self._host.wait(timeout):
            return False
        if self._event is not None:
            self._event.synchronize()
        return True

    @property
    def start_ns(self):
        return self._host.start_ns

    @property
    def end_ns(self):
        """When the waiter saw the device finish (the enqueue's end until then): a trace shows
        the work from its enqueue to the device's end, not the enqueue alone."""
        seen = self._seen_done_ns
        return self._host.end_ns if seen is None else seen

    @property
    def cpu_ns(self):
        cpu = self._host.cpu_ns
        return cpu if cpu is None else cpu + self._device_ns


class QuietCompletion(HostCompletion):
    """The host part of a ``QueueCompletion``: the lane worker does not notify it (the waiter
    notifies the queue completion once the device is done)."""

    __slots__ = ()
    notifying = False


class Waiter:
    """One thread per lane: takes the lane's completions in enqueue order, waits for each with
    the GIL released, and notifies the executor.  (CUDA's events are blocking-sync ones, so a
    waiter sleeps in the driver rather than spinning a core, which a rank waiting at a fence,
    or several ranks per node, would pay for.)"""

    __slots__ = ("queue", "thread", "backend", "device_time")

    def __init__(self, backend: Any, lane: Lane, device_time: bool):
        self.backend = backend
        self.device_time = device_time
        self.queue: SimpleQueue = SimpleQueue()
        suffix = "" if backend.rank is None else f"-{backend.rank}"
        self.thread = threading.Thread(target=self._run, name=f"celeritas-{lane.name}-waiter{suffix}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        get = self.queue.get
        while True:
            c = get()
            if c is None:
                return
            host = c._host
            if not host._done:
                host.wait()
            ev = c._event
            if ev is not None:
                try:
                    ev.synchronize()        # (also after a failed enqueue: what it did enqueue finishes)
                except Exception as exc:  # noqa: BLE001 - a device fault: the work's error
                    c._device_error = exc
                _seen_done(c, self.device_time)
            notifier = self.backend._notifier
            if notifier is not None:
                try:
                    notifier(c)
                except Exception:  # noqa: BLE001 - a broken notifier must not kill the waiter
                    log.exception("completion notifier failed")


def _seen_done(c: QueueCompletion, device_time: bool) -> None:
    """Note when the device was seen to finish ``c`` (and, with ``device_time``, its time)."""
    now = c._seen_done_ns = _perf_ns()
    end = c._host._end_ns
    if device_time and end is not None:
        c._device_ns = max(now - end, 0)


def _finished(c: QueueCompletion, device_time: bool) -> bool:
    """Whether the device finished ``c`` (asked without waiting; a failed query is the work's
    error, and it counts as finished), noted as the waiter notes it."""
    ev = c._event
    if ev is not None:      # (after a failed enqueue too: what it did enqueue finishes)
        try:
            if not ev.done:
                return False
        except Exception as exc:  # noqa: BLE001 - a device fault: the work's error
            c._device_error = exc
        _seen_done(c, device_time)
    return True


class DeviceQueueBackend(HostBackend):
    """A ``HostBackend`` whose device lanes are device queues: the waiters of those lanes
    and the rule for enqueueing on the caller's thread.  ``DEVICE_TIME``: whether
    ``QueueCompletion.cpu_ns`` counts the device's time (see there)."""

    DEVICE_TIME = False
    DRAIN_WAIT_S = 1e-3

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._waiters: dict[Lane, Waiter] = {}
        # (lane, completion) of enqueue_now's work not handed to the lane's waiter yet, in
        # enqueue order, while the executor keeps them (None: it does not, see keep_waits)
        self.kept: list | None = None

    def _waiter(self, lane: Lane) -> Waiter:
        w = self._waiters.get(lane)
        if w is None:
            with self._workers_lock:
                w = self._waiters.get(lane)
                if w is None:
                    w = self._waiters[lane] = Waiter(self, lane, self.DEVICE_TIME)
        return w

    def _idle_for_enqueue(self, w: _LaneWorker) -> bool:
        """Whether the lane's worker has nothing queued or running, so that what the caller
        enqueues goes behind everything the worker enqueued (the queue keeps the lane's
        order).  It waits up to ``DRAIN_WAIT_S`` (GIL released) for a worker that holds a
        single item: work the executor issues eagerly behind a kernel still on the worker
        would otherwise go to the worker too, and the next behind that, so that one kernel
        sent there kept a whole loop on it.  (Not behind a longer backlog: each item of an
        eager burst would wait in turn.)"""
        backlog = w.queued - w.finished
        if not backlog:
            return True
        return (backlog == 1 and self.DRAIN_WAIT_S > 0
                and w.wait_for(lambda: w.queued == w.finished, self.DRAIN_WAIT_S))

    def _enqueuing(self, lane: Lane, worker: _LaneWorker, fn: Callable[[], Any],
                   direct: bool = False) -> tuple[QueueCompletion, Callable[[], None]]:
        """A completion for ``fn`` on ``lane`` and the function that runs ``fn`` with its
        device work enqueued on the lane's queue, setting the completion's ``event``
        (``direct``: as ``enqueue_now`` takes it)."""
        raise NotImplementedError

    def enqueue_now(self, lane: Lane, fn: Callable[[], Any], *, dependent: bool = False,
                    direct: bool = False) -> Completion | None:
        """Enqueue on the lane's queue from the calling thread once the lane's worker has
        nothing queued or running (what it enqueued is then ahead on the queue, so the
        queue keeps the lane's order): ``fn`` runs here under the lane's failure policy, as
        on its worker, and the lane's waiter waits for what it enqueued."""
        if lane.kind != "device":
            return None
        w = self._worker(lane)
        if not self._idle_for_enqueue(w):
            return None
        c, run = self._enqueuing(lane, w, fn, direct)
        w.run(run, c._host, dependent)
        kept = self.kept
        if kept is not None:
            kept.append((lane, c))
        else:
            self._waiter(lane).queue.put(c)
        return c

    # ---- completions the executor looks at itself ----------------------------------------
    # A waiter wakes for every item: it takes the completion from its queue, waits for the
    # device, takes the GIL back and notifies the executor, which wakes (or takes the item
    # from its inbox) and retires it; a thread hand-off each way, with the GIL, for every
    # kernel.  A busy executor (the host's work per step is longer than the device's, as in
    # a stencil of short kernels) would find the device done at its next look anyway: it
    # keeps what it enqueued itself, asks the device (an event query, the GIL kept), and
    # hands what is left to the waiters only when it is about to sleep.

    def keep_waits(self) -> list | None:
        """From now on ``enqueue_now`` keeps its completions in ``kept`` (returned) for the
        caller (the executor's thread, the only one that calls it), which must take them
        with ``take_finished`` and pass the rest on with ``pass_kept_on`` before it blocks.
        None here: an OpenCL completion with copies back to host is done only once its
        waiter made them (``CudaBackend`` keeps them where its driver is bound)."""
        return None

    def take_finished(self) -> list:
        """The kept completions the device finished (a failed event query counts, as the
        work's error), in enqueue order per lane; the others stay kept.  A lane's queue
        runs in order: behind its first unfinished item nothing is asked."""
        done = []
        still = []
        busy = set()
        device_time = self.DEVICE_TIME
        for item in self.kept:
            lane, c = item
            if lane in busy or not _finished(c, device_time):
                busy.add(lane)
                still.append(item)
            else:
                done.append(c)
        if done:
            self.kept[:] = still
        return done

    def pass_kept_on(self) -> None:
        """The kept completions go to their lanes' waiters, which notify as usual."""
        kept = self.kept
        for lane, c in kept:
            self._waiter(lane).queue.put(c)
        kept.clear()

    def close(self) -> None:
        super().close()
        with self._workers_lock:
            waiters = list(self._waiters.values())
            self._waiters.clear()
        for w in waiters:
            w.queue.put(None)
        for w in waiters:
            w.thread.join(timeout=5)
