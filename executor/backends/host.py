"""Host backend: N simulated devices, each with its own numpy memory.

Copies between memories are real copies between separate arrays and every lane
is a real worker thread, so the executor's ordering and concurrency logic is
exercised exactly as on GPUs (numpy releases the GIL in large copies and ufuncs,
so lanes do overlap).  This is the default backend when no GPU is present.
"""
from __future__ import annotations

import logging
import mmap
import threading
import time
import weakref
from queue import SimpleQueue
from typing import Any, Callable

import numpy as np

from scheduler.geometry import Box
from scheduler.instruction_graph import HOST_MEMORY, USER_MEMORY, device_memory

from .backend import (AllocationError, Backend, BackendError, Completion, Lane, LaneSkipped, BackendInfo,
                      blocked_ns, copy_box, default_copy_pairs)

log = logging.getLogger("celeritas.executor")

_perf_ns = time.perf_counter_ns
_thread_ns = time.thread_time_ns


HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


class HostMemoryPool:
    """Huge-page mappings whose arrays are gone, kept for the next allocation of the same size
    class (2 MiB steps), up to ``limit`` bytes: a caching allocator, as CuPy's memory pool is
    for device memory.

    A fresh mapping faults every page in on first touch, where malloc would have handed
    back memory it already had; out-of-core runs allocate and free a batch's arrays over
    and over.  A mapping comes back only once the last view of its array is gone (a
    ``weakref.finalize`` on the base array every view refers to), so reuse never aliases
    live data.
    """

    def __init__(self, limit: int = 256 << 20):
        self._free: dict[int, list[mmap.mmap]] = {}
        self._bytes = 0
        self._limit = limit
        # reentrant: ``give`` runs as a finalizer, which a garbage collection started by an
        # allocation inside the pool's own critical section may run on the same thread
        self._lock = threading.RLock()
        self._closed = False
        self.reused = 0

    def take(self, length: int) -> mmap.mmap | None:
        with self._lock:
            free = self._free.get(length)
            if not free:
                return None
            self._bytes -= length
            self.reused += 1
            return free.pop()

    def give(self, m: mmap.mmap) -> None:
        """The finalizer of an array's base: keep its mapping if there is room."""
        length = len(m)
        with self._lock:
            if self._closed or self._bytes + length > self._limit:
                return          # dropped: unmapped once nothing refers to it
            self._free.setdefault(length, []).append(m)
            self._bytes += length

    @property
    def pooled_bytes(self) -> int:
        return self._bytes

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._free.clear()
            self._bytes = 0


def host_empty(shape: tuple[int, ...], dtype: Any, min_bytes: int | None = HUGE_PAGE,
               pool: HostMemoryPool | None = None) -> np.ndarray:
    """An uninitialised array; from ``min_bytes`` up (None: never), on its own 2 MiB-aligned
    mapping advised for huge pages (``CELERITAS_HUGE_PAGES``).

    With transparent huge pages in ``madvise`` mode (the usual default), a plain
    ``np.empty`` of 4 MiB gets at most one huge page, and how many it gets
    depends on where malloc happens to place it.  Every copy into, out of and
    between such arrays walks 4 KiB pages: a 4 MiB MPI message between two
    ranks took 280 us on 4 KiB pages, 140-180 us on a plain ``np.empty`` and
    80 us fully on huge pages on this machine.  The mapping is private and
    anonymous (no malloc arena); when the last view of the array goes it is
    unmapped, or kept in ``pool`` for the next array of its size class.  Only
    touched pages take memory, and only the whole huge pages inside the array are
    advised: a tail shorter than 2 MiB stays on 4 KiB pages, so a fresh array takes
    no more memory than its bytes (a 2.1 MiB array rounded up to two huge pages
    would take 4 MiB; a pooled mapping may bring up to one huge page more).
    """
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if min_bytes is None or n < min_bytes or n == 0 or _MADV_HUGEPAGE is None:
        return np.empty(shape, dtype=dt)
    # the mapping's length: n rounded up to a whole huge page (a pool's size class), plus one
    # huge page of room to align the start; only touched pages take memory
    length = -(-n // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE
    m = pool.take(length) if pool is not None else None
    fresh = m is None
    if fresh:
        try:
            m = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError as exc:      # ENOMEM, a mapping limit: out of memory, like np.empty's MemoryError
            raise MemoryError(f"cannot map {n} bytes of host memory: {exc}") from exc
    raw = np.frombuffer(m, dtype=np.uint8)
    off = (-raw.ctypes.data) % HUGE_PAGE
    whole = n // HUGE_PAGE * HUGE_PAGE
    if fresh and whole:
        try:
            m.madvise(_MADV_HUGEPAGE, off, whole)
        except OSError:   # kernels without transparent huge pages: 4 KiB pages, still aligned
            pass
    if pool is not None:
        weakref.finalize(raw, pool.give, m).atexit = False
    return raw[off:off + n].view(dt).reshape(shape)


THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def transparent_huge_pages(path: str = THP_ENABLED) -> str | None:
    """The kernel's transparent-huge-page mode (``always``, ``madvise``, ``never``), or None
    where there is no such setting (not Linux, no THP support)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


class HostCompletion(Completion):
    """Set by a lane worker; ``is_done`` is a plain attribute read (no lock)."""

    __slots__ = ("_done", "_error", "_start_ns", "_end_ns", "_cpu_ns", "_worker")
    notifying = True

    def __init__(self, worker: "_LaneWorker"):
        self._done = False
        self._error: BaseException | None = None
        self._start_ns: int | None = None
        self._end_ns: int | None = None
        self._cpu_ns: int | None = None
        self._worker = worker

    def is_done(self) -> bool:
        return self._done

    def error(self) -> BaseException | None:
        return self._error

    def wait(self, timeout: float | None = None) -> bool:
        if self._done:
            return True
        return self._worker.wait_for(lambda: self._done, timeout)

    @property
    def start_ns(self) -> int | None:
        return self._start_ns

    @property
    def end_ns(self) -> int | None:
        return self._end_ns

    @property
    def cpu_ns(self) -> int | None:
        """CPU time the worker thread spent in the work, plus the time it recorded as blocked
        on a device (``note_blocked``); unlike wall time it excludes waiting for the GIL."""
        return self._cpu_ns


class _LaneWorker:
    """One thread with a FIFO: created once per lane and reused for its lifetime.

    Once a function failed, the worker skips functions queued as ``dependent``
    (their completions carry ``LaneSkipped``): they may read what it should have
    written.  Independent work still runs, so the lane survives a failure.
    """

    __slots__ = ("queue", "cond", "waiters", "thread", "backend", "failed", "lane", "queued", "finished")

    def __init__(self, backend: "HostBackend", lane: Lane):
        self.lane = lane
        self.failed: BaseException | None = None
        self.queue: SimpleQueue = SimpleQueue()
        self.cond = threading.Condition(threading.Lock())
        self.waiters = 0     # threads blocked in HostCompletion.wait (rare: tests, teardown)
        # items put / items run to the end: equal when nothing is queued or running (each is
        # written by one thread only, the launching thread and this worker, so no lock)
        self.queued = 0
        self.finished = 0
        self.backend = backend
        suffix = "" if backend.rank is None else f"-{backend.rank}"
        self.thread = threading.Thread(target=self._run, name=f"celeritas-{lane.name}{suffix}", daemon=True)
        self.thread.start()

    def put(self, fn: Callable[[], Any], c: "HostCompletion", dependent: bool) -> None:
        """Queue ``fn`` for this worker, its completion ``c``."""
        self.queued += 1
        self.queue.put((fn, c, dependent))

    def run(self, fn: Callable[[], Any], c: "HostCompletion", dependent: bool) -> None:
        """Run one item of this lane on the calling thread (this worker's, or a caller that
        found the lane idle: ``DeviceQueueBackend.enqueue_now``): the lane's failure policy, then
        ``c`` timed and done."""
        c._start_ns = _perf_ns()
        cpu0 = _thread_ns() + blocked_ns()
        if not dependent or self.failed is None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported through the completion
                c._error = self.failed = exc
        else:
            c._error = LaneSkipped(f"not run: earlier work on {self.lane.name} failed "
                                   f"({type(self.failed).__name__})")
        c._cpu_ns = _thread_ns() + blocked_ns() - cpu0
        c._end_ns = _perf_ns()
        c._done = True

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Block (GIL released) until ``predicate()``, which this worker's progress makes
        true, or ``timeout``; whether it holds."""
        with self.cond:
            self.waiters += 1      # before testing: the worker reads it after each item
            try:
                return self.cond.wait_for(predicate, timeout)
            finally:
                self.waiters -= 1

    def _run(self) -> None:
        get = self.queue.get
        cond = self.cond
        run = self.run
        while True:
            item = get()
            if item is None:
                return
            c = item[1]
            run(*item)
            # (the finished work's closure holds its arrays: kept in ``item`` while this
            # thread waits for the next, a freed allocation's memory stayed alive, and its
            # mapping out of the pool, until the lane ran something else)
            item = None
            self.finished += 1
            if self.waiters:
                with cond:
                    cond.notify_all()
            notifier = self.backend._notifier
            if notifier is not None and c.notifying:
                try:
                    notifier(c)
                except Exception:  # noqa: BLE001 - a broken notifier must not kill the lane
                    log.exception("completion notifier failed")


class HostBackend(Backend):
    """``num_devices`` simulated devices; memory 0 user, 1 host, 2 + d device d.

    ``memory_capacity`` (bytes per device memory, None = unlimited; host memory is
    never bounded) simulates device memory limits, so that out-of-core execution and
    out-of-memory handling run without a GPU.

    ``rank``: the rank these lanes serve, appended to their worker threads' names
    (``celeritas-D0.lane0-1``) as it is to the scheduler's and executor's, so that the
    threads of simulated ranks sharing a process can be told apart (py-spy, a debugger).
    """

    def __init__(self, num_devices: int = 1, *, peer_to_peer: bool = True,
                 memory_capacity: int | None = None, huge_pages: int | None = HUGE_PAGE,
                 rank: int | None = None):
        if num_devices < 1:
            raise ValueError(f"HostBackend needs at least one device, got {num_devices}")
        self._num_devices = num_devices
        self.rank = rank
        self._peer_to_peer = peer_to_peer
        self._capacity = memory_capacity
        self.huge_pages = huge_pages        # smallest allocation put on huge pages (None: none)
        self.memory_pool = HostMemoryPool()
        self._memories = (USER_MEMORY, HOST_MEMORY) + tuple(device_memory(d) for d in range(num_devices))
        # live allocations per memory: id(array) -> nbytes (for capacity and OOM messages)
        self._live: dict[int, dict[int, int]] = {m: {} for m in self._memories}
        self._used: dict[int, int] = {m: 0 for m in self._memories}
        self._alloc_lock = threading.Lock()
        self._workers: dict[Lane, _LaneWorker] = {}
        self._workers_lock = threading.Lock()
        self._notifier: Callable[[Completion], None] | None = None
        self._closed = False
        # lanes are plain worker threads unless a subclass (CUDA, OpenCL) wraps launch/copy
        cls = type(self)
        self._plain_lanes = cls.launch is HostBackend.launch and cls.copy is HostBackend.copy

    @property
    def num_devices(self) -> int:
        return self._num_devices

    def xp_for_memory(self, memory: int) -> Any:
        return np

    def backend_info(self) -> BackendInfo:
        return BackendInfo(
            num_devices=self._num_devices,
            memories=self._memories,
            copy_pairs=default_copy_pairs(self._num_devices, self._peer_to_peer),
            communicator_memories=frozenset({USER_MEMORY, HOST_MEMORY}),
            device_memories={d: device_memory(d) for d in range(self._num_devices)},
            # simulated device memories are numpy arrays: any communicator can use them
            direct_memories=frozenset(device_memory(d) for d in range(self._num_devices)),
            capacities=({} if self._capacity is None else
                        {device_memory(d): self._capacity for d in range(self._num_devices)}),
        )

    def allocate(self, memory: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        if memory not in self._live:
            raise AllocationError(f"memory M{memory} does not exist on this host backend "
                                  f"({self._num_devices} devices)")
        try:
            dt = np.dtype(dtype)
            shape = tuple(int(s) for s in shape)
            if any(s < 0 for s in shape):
                raise ValueError("negative dimensions are not allowed")
            nbytes = dt.itemsize * int(np.prod(shape, dtype=np.int64))
        except (TypeError, ValueError) as exc:
            raise AllocationError(f"invalid allocation in M{memory}: shape {shape}, dtype {dtype!r}: {exc}") from exc
        with self._alloc_lock:
            if self._capacity is not None and memory >= 2 and self._used[memory] + nbytes > self._capacity:
                raise AllocationError(self._oom_message(memory, nbytes))
            self._used[memory] += nbytes  # reserve before allocating outside the lock
        try:
            array = self._new_array(memory, shape, dt)
        except (MemoryError, ValueError) as exc:
            with self._alloc_lock:
                self._used[memory] -= nbytes
            raise AllocationError(self._oom_message(memory, nbytes) + f" ({exc})") from exc
        with self._alloc_lock:
            self._live[memory][id(array)] = nbytes
        return array

    def _new_array(self, memory: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The array behind an allocation (backends with special memories override this)."""
        return host_empty(shape, dtype, self.huge_pages, self.memory_pool)

    def _oom_message(self, memory: int, nbytes: int) -> str:
        lines = [f"cannot allocate {nbytes} bytes in M{memory}"
                 + (f" (capacity {self._capacity} bytes, {self._used[memory]} in use)"
                    if self._capacity is not None else "")]
        for m in self._memories:
            live = self._live[m]
            if live:
                lines.append(f"  M{m}: {len(live)} live allocations, {sum(live.values())} bytes")
        return "\n".join(lines)

    def free(self, memory: int, array: Any) -> None:
        with self._alloc_lock:
            nbytes = self._live.get(memory, {}).pop(id(array), None)
            if nbytes is None:
                raise BackendError(f"free of an array that is not a live allocation of M{memory}")
            self._used[memory] -= nbytes

    def hand_over(self, memory: int, array: Any) -> np.ndarray:
        with self._alloc_lock:
            nbytes = self._live.get(memory, {}).pop(id(array), None)
            if nbytes is not None:
                self._used[memory] -= nbytes
        return array

    def live_bytes(self, memory: int) -> int:
        return self._used[memory]

    def _worker(self, lane: Lane) -> _LaneWorker:
        w = self._workers.get(lane)
        if w is None:
            with self._workers_lock:
                if self._closed:
                    raise BackendError("backend is closed")
                w = self._workers.get(lane)
                if w is None:
                    w = self._workers[lane] = _LaneWorker(self, lane)
        return w

    def runs_inline(self, lane: Lane) -> bool:
        return self._plain_lanes

    def launch(self, lane: Lane, fn: Callable[[], Any], *, dependent: bool = False) -> HostCompletion:
        w = self._worker(lane)
        c = HostCompletion(w)
        w.put(fn, c, dependent)
        return c

    def copy(self, src: Any, src_box: Box | None, dst: Any, dst_box: Box | None, box: Box,
             lane: Lane, *, dependent: bool = False) -> HostCompletion:
        return self.launch(lane, lambda: copy_box(src, src_box, dst, dst_box, box), dependent=dependent)

    def set_notifier(self, notifier: Callable[[Completion], None] | None) -> None:
        self._notifier = notifier

    @property
    def lanes(self) -> list[Lane]:
        """Lanes that have a worker thread (each created once, on first use)."""
        return list(self._workers)

    def close(self) -> None:
        self.memory_pool.close()
        with self._workers_lock:
            self._closed = True
            workers = list(self._workers.values())
            self._workers.clear()
        for w in workers:
            w.queue.put(None)
        for w in workers:
            w.thread.join(timeout=5)
