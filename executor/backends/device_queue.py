"""Work enqueued on an asynchronous device queue (a CUDA stream, an OpenCL command queue)
and waited for by a waiter thread per lane: shared by the CUDA and OpenCL backends.

A lane's work is *enqueued* on its queue, by the lane's worker thread or, when the lane
is idle, by the executor itself (``enqueue_now``), and what the device must finish
before the work counts as done is recorded as the completion's ``event``.  The lane's
waiter thread takes the completions in enqueue order (a queue completes in order),
blocks until the device finished each one with the GIL released, and notifies the
executor, so nobody polls the device and the executor never waits for it.
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
                now = c._seen_done_ns = _perf_ns()
                if self.device_time and host._end_ns is not None:
                    c._device_ns = max(now - host._end_ns, 0)
            notifier = self.backend._notifier
            if notifier is not None:
                try:
                    notifier(c)
                except Exception:  # noqa: BLE001 - a broken notifier must not kill the waiter
                    log.exception("completion notifier failed")


class DeviceQueueBackend(HostBackend):
    """A ``HostBackend`` whose device lanes are device queues: the waiters of those lanes
    and the rule for enqueueing on the caller's thread.  ``DEVICE_TIME``: whether
    ``QueueCompletion.cpu_ns`` counts the device's time (see there)."""

    DEVICE_TIME = False
    DRAIN_WAIT_S = 1e-3

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._waiters: dict[Lane, Waiter] = {}

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
        self._waiter(lane).queue.put(c)
        return c

    def close(self) -> None:
        super().close()
        with self._workers_lock:
            waiters = list(self._waiters.values())
            self._waiters.clear()
        for w in waiters:
            w.queue.put(None)
        for w in waiters:
            w.thread.join(timeout=5)
