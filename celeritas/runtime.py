"""The runtime object: wires the task manager, scheduler thread and executor thread.

One runtime per process (per simulated rank under ``run_cluster``).  It owns all
mutable state; the only process-level state is which runtime is current.
"""
from __future__ import annotations

import concurrent.futures
import copy
import gc
import logging
import os
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from typing import Any

import numpy as np

from scheduler import task_graph as tg
from scheduler.errors import CeleritasError, ConfigError, GeometryError, OutOfMemoryError
from scheduler.geometry import Box, Region, Subrange
from scheduler.instruction_graph_generator import SystemInfo
from scheduler.recorders import Recorders
from scheduler.replay import Replay
from scheduler.scheduler import Scheduler

from . import config as cfg
from . import context
from .buffer import Buffer
from .handler import CommandGroupHandler
from .host_object import HostObject
from .range_mappers import MapperWrappers

log = logging.getLogger("celeritas.runtime")


class _InterruptSafeCondition(threading.Condition):
    """The application thread's condition: a ``wait`` interrupted (SIGINT's KeyboardInterrupt)
    just as it gave the lock up takes the lock back before the exception leaves, so the
    caller's ``with`` exit does not fail with "cannot release un-acquired lock" and hide the
    interrupt (seen under mpiexec: the rank then reported a RuntimeError)."""

    def wait(self, timeout: float | None = None) -> bool:
        try:
            return super().wait(timeout)
        except BaseException:
            if not self._is_owned():
                self.acquire()
            raise


def make_backend(spec: cfg.DeviceSpec, host_device_memory: int | None = None,
                 huge_pages: int | None = cfg.HUGE_PAGES_DEFAULT, setting_name: str = "CELERITAS_DEVICES",
                 rank: int | None = None):
    """The backend for a device spec; ``default`` means every CUDA GPU, else one host device.
    ``huge_pages``: the smallest host allocation put on huge pages (``CELERITAS_HUGE_PAGES``);
    ``setting_name``: where the spec came from (the variable, or a Queue's ``devices``);
    ``rank``: the rank it serves (its lane threads carry it in their names)."""
    setting = f"{setting_name}={str(spec)!r}"    # (what every configuration error starts with)
    if spec.backend in ("default", "cuda"):
        try:
            from executor.backends.cuda import CudaBackend, cuda_device_count
            n = cuda_device_count()
        except ImportError as exc:
            if spec.backend == "cuda":
                raise ConfigError(f"{setting}: the CUDA backend needs CuPy "
                                  f"(pip install 'celeritas[cuda]'): {exc}") from None
        else:
            if spec.backend == "cuda":
                if n == 0:
                    raise ConfigError(f"{setting}: no CUDA GPU is visible")
                missing = [d for d in spec.ids if not 0 <= d < n]
                if missing:   # (as for OpenCL: a ConfigError listing what exists, not the backend's error)
                    raise ConfigError(f"{setting}: CUDA device {missing[0]} does not exist; this "
                                      f"machine has {n} visible: {', '.join(f'cuda:{d}' for d in range(n))}")
                from executor.backends.backend import BackendError
                try:
                    return CudaBackend(list(spec.ids) or list(range(n)), rank=rank)
                except BackendError as exc:
                    raise ConfigError(f"{setting}: {exc}") from None
            if n > 0:
                return CudaBackend(list(range(n)), rank=rank)
        from executor.backends.host import HostBackend
        # (the default without a GPU is host:1, and CELERITAS_HOST_DEVICE_MEMORY bounds it as it
        # bounds an explicit host:N: it was ignored here, so the limit held only with devices set)
        return HostBackend(1, memory_capacity=host_device_memory, huge_pages=huge_pages, rank=rank)
    if spec.backend == "host":
        from executor.backends.host import HostBackend
        return HostBackend(spec.count, memory_capacity=host_device_memory, huge_pages=huge_pages, rank=rank)
    if spec.backend == "opencl":
        from executor.backends.backend import BackendError
        from executor.backends.opencl import OpenCLBackend
        try:
            return OpenCLBackend(list(spec.ids), huge_pages=huge_pages, rank=rank)
        except BackendError as exc:
            raise ConfigError(f"{setting}: {exc}") from None
    raise ConfigError(f"unknown backend {spec.backend!r}")


def memory_capacities(backend, limit: int | float | None) -> dict[int, int]:
    """Bytes each device memory may hold: what the backend reports (CUDA: free at start-up,
    OpenCL: global memory, ``host:N``: ``CELERITAS_HOST_DEVICE_MEMORY``), capped by
    ``CELERITAS_DEVICE_MEMORY_LIMIT`` (bytes, or a fraction of the reported size)."""
    info = backend.backend_info()
    caps = dict(info.capacities)
    if limit is None:
        return caps
    if isinstance(limit, float):
        if not caps:
            raise ConfigError(f"CELERITAS_DEVICE_MEMORY_LIMIT={limit}: a fraction needs a device size, and the "
                              f"{type(backend).__name__} reports none (for host:N set "
                              f"CELERITAS_HOST_DEVICE_MEMORY, or give the limit in bytes)")
        return {m: max(1, int(c * limit)) for m, c in caps.items()}
    devices = [m for m in info.memories if m >= 2]
    return {m: min(caps.get(m, limit), limit) for m in devices}


def scheduler_system(backend, mode: str = "staged", communicator=None,
                     capacities: dict[int, int] | None = None) -> SystemInfo:
    """The scheduler's view of the rank: devices, peer copies, and what MPI may touch.

    ``mode`` is ``CELERITAS_MPI_DEVICE_MEMORY``: ``direct`` lets sends and receives
    use device allocations (no staging copy through host memory; needs CUDA-aware
    MPI for CUDA memory), ``staged`` keeps them in host memory, ``auto`` is direct
    wherever the communicator can touch the device memory: always for the host
    backend (its device memories are ordinary host memory, so staging would only add
    two copies of every message), and for CUDA memory where MPI is CUDA-aware.
    OpenCL memory is never direct.
    """
    info = backend.backend_info()
    peers = frozenset((s, d) for s, d in info.copy_pairs if s >= 2 and d >= 2 and s != d)
    comm_memories = frozenset(info.communicator_memories)
    name = type(backend).__name__.replace("Backend", "").lower()
    aware = getattr(communicator, "cuda_aware", None)
    if mode == "direct":
        if not info.direct_memories:
            raise ConfigError(f"CELERITAS_MPI_DEVICE_MEMORY=direct: the {name} backend's device memory cannot "
                              f"be handed to the communicator; use staged or auto")
        if info.direct_needs == "cuda" and aware is not True:
            raise ConfigError("CELERITAS_MPI_DEVICE_MEMORY=direct: the MPI library does not report CUDA support "
                              f"(MPIX_Query_cuda_support: {aware}); set CELERITAS_MPI_CUDA_AWARE=1 if it has it, "
                              "or use staged")
        comm_memories |= info.direct_memories
    elif mode == "auto" and (info.direct_needs is None or (info.direct_needs == "cuda" and aware is True)):
        comm_memories |= info.direct_memories
    return SystemInfo(num_devices=backend.num_devices, peers=peers, comm_memories=comm_memories,
                      capacities=capacities or None)


GC_THRESHOLDS = (50_000, 50, 100)   # see Runtime._tune_gc
PAUSE_S = 0.002                      # the longest pause of the application thread (Runtime._pause)
# glibc malloc while a runtime has run (see tune_host_allocator): allocations up to 1 GiB come
# from the heap, freed memory stays with the process, one arena for every thread
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
MALLOC_MMAP_THRESHOLD = 1 << 30
MALLOC_TRIM_THRESHOLD = (1 << 31) - 1


def _glibc():
    """The process's C library through ctypes where it is glibc, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def host_allocator_status(policy: str) -> str:
    """What ``CELERITAS_HOST_ALLOCATOR=policy`` does on this machine, in words (``celeritas info``)."""
    libc = _glibc()
    if libc is None:
        return f"not glibc ({sys.platform}): malloc left alone"
    import ctypes
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    version = libc.gnu_get_libc_version().decode()
    if policy != "tuned":
        return f"glibc {version}: malloc left alone (CELERITAS_HOST_ALLOCATOR={policy})"
    return (f"glibc {version}: tuned by the first runtime of a process (arrays up to 1 GiB from the heap, "
            f"kept when freed, one arena)")


def tune_host_allocator() -> bool:
    """Keep glibc malloc from mapping and unmapping every large array; True where it is tuned.

    A kernel's numpy temporaries are as large as its chunk (32-64 MiB per expression for
    wave_sim at 4096²).  glibc serves an allocation above its mmap threshold (128 KiB,
    raised on the main thread up to 32 MiB as such blocks are freed) by a fresh ``mmap``
    and returns it by ``munmap``, so every temporary faults its pages in again: measured
    on this project's VM, half a 4096² step's time was system time.  Kernels run on the
    executor's and lanes' threads, whose per-thread arenas cannot hold a block over 64 MiB
    at all.  So: blocks up to 1 GiB come from the heap, freed memory is not trimmed (the
    next temporary reuses it without a fault), and every thread allocates from the main
    arena (one lock, which the GIL mostly serializes anyway: numpy allocates holding it).
    wave_sim 4096² on one host device: 3.07 -> 1.80 s for 10 steps.  The cost: a process
    keeps the memory its largest step freed, as a device memory pool does.

    Process-wide and not restored (malloc's settings cannot be read back, and the arena
    limit is fixed at the first allocation of a second thread): called once per process, by
    the first runtime, before it starts a thread; ``CELERITAS_HOST_ALLOCATOR=default``
    leaves malloc alone.  Only on glibc (elsewhere nothing changes).  The benchmarks call
    it for their baselines too, which then run with the same allocator."""
    done = context.process_tuning.get("host_allocator")
    if done is not None:
        return done
    ok = False
    libc = _glibc()
    if libc is None:
        log.debug("not glibc: malloc left alone")
    else:
        import ctypes
        mallopt = libc.mallopt
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        results = [mallopt(_M_ARENA_MAX, 1), mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD),
                   mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD)]
        ok = all(results)
    context.process_tuning["host_allocator"] = ok
    return ok


def baseline_allocator() -> bool:
    """For a hand-written baseline measured beside celeritas (the benchmarks,
    ``cluster.workloads``): malloc as a runtime started from this environment sets it
    (``CELERITAS_HOST_ALLOCATOR``), so that both allocate alike and a ratio measures the
    runtime, not the allocator.  True where it is tuned."""
    if cfg.from_env(warn=False).host_allocator != "tuned":
        return False
    return tune_host_allocator()


class _WaitWatch:
    """Says once (then at a slow repeat) what a blocked application-thread call waits for."""

    __slots__ = ("rt", "call", "target", "hint", "t0", "next", "slice")

    def __init__(self, rt: "Runtime", call: str, target: str, hint: str = ""):
        self.rt = rt
        self.call = call              # what the user called: "q.wait()", "the fence's result()" …
        self.target = target          # what it waits for: "T3 (epoch)"
        self.hint = hint              # what to do if the wait is the program's own (a line of its own)
        self.t0 = time.monotonic()
        self.next = rt.config.wait_warning
        self.slice = 0.5 if self.next is None else min(0.5, self.next / 2)

    def tick(self) -> None:
        first = self.next
        if first is None:
            return
        waited = time.monotonic() - self.t0
        if waited >= first:
            threshold = self.rt.config.wait_warning or first
            self.next = waited + max(60.0, 6 * threshold)
            self.rt._warn_waiting(self.call, self.target, waited, self.hint)


class _FencePromise:
    """What the fence's task and instruction hold of its future: a weak reference.  They live
    on until the task graph prunes the task (a horizon or two later), and holding the
    future itself kept the fetched array alive after the user had dropped it.  Until it is
    resolved the runtime's fence list holds the future (to fail it if the runtime fails);
    after that only the user does, and a future nobody holds has no one to tell."""

    __slots__ = ("_future",)

    def __init__(self, future: concurrent.futures.Future):
        self._future = weakref.ref(future)

    def done(self) -> bool:
        f = self._future()
        return f is None or f.done()

    def set_result(self, result: Any) -> None:
        f = self._future()
        if f is not None:
            f.set_result(result)

    def set_exception(self, exc: BaseException) -> None:
        f = self._future()
        if f is not None:
            f.set_exception(exc)


class _FenceFuture(concurrent.futures.Future):
    """A fence's future: a ``result()`` that blocks long says what the rank waits for, and
    an error it hands to the user counts as shown (not printed again at exit)."""

    def __init__(self, rt: "Runtime", what: str):
        super().__init__()
        self._rt = weakref.ref(rt)
        self.what = what
        self.task: int | None = None
        self.shape: tuple[int, ...] | None = None   # of an empty buffer or subrange (see set_result)

    def set_result(self, result: Any) -> None:
        # (an empty box is one box whatever its extents, so its allocation comes back as
        # (0, 0) for a (0, 4) buffer: the fence's array keeps the shape the user fenced)
        if self.shape is not None and isinstance(result, np.ndarray) and result.size == 0:
            result = result.reshape(self.shape)
        self._resolving()
        super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        self._resolving()
        super().set_exception(exception)

    def _resolving(self) -> None:
        rt = self._rt()
        if rt is not None:
            # (a resolved fence needs no failing: kept in the runtime's list until the next
            # fence, its result stayed alive after the user had dropped it.  It leaves the list
            # first, so that whoever its result wakes finds it gone; a failure in between
            # no longer reaches it, and needs not: it is being resolved)
            rt._fence_resolved(self)

    def _wait(self, timeout: float | None) -> float | None:
        """Block like ``result(timeout)`` would, with the wait warning; the time left."""
        rt = self._rt()
        if self.done() or rt is None:
            return timeout
        watch = _WaitWatch(rt, "the fence's result()", f"T{self.task} (fence of {self.what})")
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            step = watch.slice if deadline is None else min(watch.slice, deadline - time.monotonic())
            if step <= 0:
                return 0
            concurrent.futures.wait([self], timeout=step)
            watch.tick()
        return None

    def _shown(self) -> None:
        rt = self._rt()
        if rt is not None:
            rt._error_shown = True

    def result(self, timeout: float | None = None) -> Any:
        left = self._wait(timeout)
        try:
            return super().result(left)
        except concurrent.futures.TimeoutError:
            raise
        except BaseException:
            self._shown()
            raise

    def exception(self, timeout: float | None = None) -> BaseException | None:
        exc = super().exception(self._wait(timeout))
        if exc is not None:
            self._shown()
        return exc


class _InsideTask(threading.local):
    """Per thread: the kernel or host task running on it (``where``: its launcher, or a
    description; ``str()`` names it), None outside one."""

    where: object | None = None


class Runtime:
    """Everything one rank runs: task manager, scheduler thread, executor thread."""

    # ---- which runtime is current ---------------------------------------------------
    @classmethod
    def current(cls, create: bool = False, **overrides) -> "Runtime":
        """The current runtime (see ``context``); ``create`` starts one if there is none."""
        return context.current_runtime(create, **overrides)

    # ---- construction ----------------------------------------------------------------
    def __init__(self, config: cfg.Config, communicator=None):
        cfg.check_output_paths(config)
        self.config = config
        logging.getLogger("celeritas").setLevel(cfg.LOG_LEVELS[config.log_level])
        if config.host_allocator == "tuned":
            tune_host_allocator()       # (first: before the communicator, backend or executor start threads)
        self._lock = threading.RLock()
        self.inside_task = _InsideTask()   # set by a launcher while its kernel or host task runs
        self._cond = _InterruptSafeCondition()
        self._error: BaseException | None = None
        self._error_shown = False     # raised to the user once already: not printed again at exit
        self._epoch_reached = -1
        self._horizon_reached = -1
        self._throttled = False       # the application thread waits in _throttle or _pause...
        self._wake_at = 0             # ...for the executor to reach this horizon (or epoch)
        self.throttled_count = 0      # how often it did (the summary reports it)
        self._next_pause = 0          # the next task id that may pause the application thread (_pause)
        self.paused_count = 0
        self._max_ahead = config.max_tasks_ahead
        self._pause_ahead = config.pause_ahead
        self._pruned_before = -1
        self._fences: list[concurrent.futures.Future] = []
        self._buffers: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        self._host_objects: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        # buffers and host objects released by their finalizers, destroyed by the application
        # thread at its next call into the runtime (``_reap``)
        self._doomed: deque[tuple[str, int]] = deque()
        self._next_buffer = 0
        self.buffer_names: dict[int, str] = {}   # kept past buffer destruction for shutdown dumps
        self._gather_handle = None               # collective handle for the shutdown outputs
        self._next_host_object = 0
        self._next_group = 2          # group 1 is the default collective group
        self.is_shut_down = False
        self._shutting_down = False
        self.start_time = time.perf_counter()
        if communicator is None:
            communicator = _default_communicator(config)
        self.communicator = communicator
        dry = config.dry_run_nodes
        cfg.check_dry_run(config, communicator.num_ranks)
        self.dry_run = dry is not None
        self.rank = 0 if self.dry_run else communicator.rank
        self.num_ranks = dry if self.dry_run else communicator.num_ranks
        from .summary import enabled as summary_enabled
        self._summary = summary_enabled(config)
        if not self.dry_run and communicator.num_ranks > 1 and communicator.settings_may_differ:
            # (before anything runs: every rank raises the same ConfigError, nobody hangs)
            self._summary = cfg.agree_across_ranks(
                self._collective().allgather(cfg.collective_settings(config, self._summary)))
        self.backend = make_backend(config.devices, config.host_device_memory, config.huge_pages,
                                    config.devices_setting, rank=self.rank)
        self.backend_name = type(self.backend).__name__.replace("Backend", "").lower()
        self.num_devices = self.backend.num_devices
        system = scheduler_system(self.backend, config.mpi_device_memory, None if dry else communicator,
                                  memory_capacities(self.backend, config.device_memory_limit))
        if self.dry_run:
            from executor.dry_run import DryRunExecutor
            self.executor = DryRunExecutor(self._on_horizon, self._on_epoch, host_object_copy=self._copy_host_object)
        else:
            from executor.executor import Executor
            self.executor = Executor(self.backend, communicator, on_horizon=self._on_horizon,
                                     on_epoch=self._on_epoch, on_error=self._on_executor_error,
                                     inline_threshold=config.inline_us * 1e-6,
                                     trace=bool(config.trace) or self._summary,
                                     name=f"celeritas-executor-{self.rank}",
                                     host_object_copy=self._copy_host_object)
        # graph records (Queue.graphs(), dumps): recorders injected into the generators
        self.recorders: Recorders | None = (Recorders(self.rank) if config.record or config.print_graphs
                                            else None)
        rec = self.recorders
        self.scheduler = Scheduler(num_ranks=self.num_ranks, rank=self.rank, system=system,
                                   delegate=self.executor, lookahead=config.lookahead,
                                   diagnostics=config.diagnostics,
                                   command_recorder=rec.commands if rec else None,
                                   instruction_recorder=rec.instructions if rec else None,
                                   replay=config.replay, overlap_batches=config.out_of_core_overlap,
                                   on_error=self._on_scheduler_error)
        if getattr(self.executor, "tracing", False):     # exact starvation in the summary (not in dry runs)
            self.scheduler.busy_intervals = []
        self._saved_gc_threshold = self._tune_gc(config.gc)
        self._saved_switch_interval = self._tune_switch_interval(config.switch_interval_us)
        self.executor.start()
        self.scheduler.start()
        self.mappers = MapperWrappers()   # built-in mappers' wrappers, shared by this runtime's tasks
        self.geometries: dict = {}        # (global range, offset) as submitted -> TaskGeometry
        check = getattr(self.communicator, "epoch_check", None)
        if check is not None and not check.enabled:
            check = None
        self.task_manager = tg.TaskManager(horizon_step=config.horizon_step,
                                           horizon_max_parallelism=config.horizon_max_parallelism,
                                           on_task=self.scheduler.notify_task,
                                           diagnostics=config.diagnostics if self.rank == 0 else
                                           ("error" if config.diagnostics == "error" else "off"),
                                           recorder=rec.tasks if rec else None,
                                           replay=Replay() if config.replay else None,
                                           stream=check is not None)    # (what the check compares)
        if check is not None:       # lets the divergence check name a task before this rank's next epoch
            check.pending_tasks = self._pending_tasks
            check.stream_checkpoints = self.task_manager.stream_checkpoints
        log.info("celeritas rank %d/%d: %s backend with %d device(s), lookahead %s%s", self.rank,
                 self.num_ranks, self.backend_name, self.num_devices, config.lookahead,
                 " (dry run)" if self.dry_run else "")

    def _pending_tasks(self, after: int | None = None) -> list:
        """The digest entries (id, kind, name, range, accesses) of the tasks submitted since
        the epoch ``after`` where the latest epoch follows it, else since the latest epoch
        (executor thread; see TaskManager.pending_digest)."""
        return self.task_manager.pending_digest(after)

    def check_overrides(self, overrides: dict) -> None:
        dev = overrides.get("devices")
        if dev is not None:
            spec = cfg.DeviceSpec.parse(dev, "devices") if isinstance(dev, str) else dev
            running = self.config.devices
            if running.backend == "default":   # (what the default turned out to be: host:1, or every GPU)
                running = (cfg.DeviceSpec("host", self.num_devices) if self.backend_name == "host"
                           else cfg.DeviceSpec(self.backend_name))
            if spec != running and spec != self.config.devices:
                raise ConfigError(f"the runtime already runs on {running}; create the Queue with "
                                  f"devices={dev!r} before any Buffer")
        if overrides.get("lookahead") is not None:
            self.set_lookahead(overrides["lookahead"])
        if overrides.get("record"):
            self.enable_record()

    # ---- callbacks (executor / scheduler threads) -----------------------------------------
    def _on_horizon(self, tid: int) -> None:
        if tid > self._horizon_reached:
            self._horizon_reached = tid
            if self._throttled and tid >= self._wake_at:   # (not at every horizon: each wake-up
                with self._cond:                             # takes the GIL from the executor)
                    self._cond.notify_all()

    def _on_epoch(self, tid: int) -> None:
        with self._cond:
            if tid > self._epoch_reached:
                self._epoch_reached = tid
            self._cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            first = self._error is None
            if first:
                self._error = exc
            fences = list(self._fences)    # under _cond: see _register_fence
            self._cond.notify_all()
        if first and self.num_ranks > 1 and hasattr(self.communicator, "fatal_abort"):
            # a real multi-rank job: report, then end every rank instead of letting peers hang
            err = self._surface(exc)
            self.communicator.fatal_abort(f"celeritas rank {self.rank}: {type(err).__name__}: {err}", exc)
        for f in fences:
            self._fail_fence(f, exc)

    def _fail_fence(self, fut: concurrent.futures.Future, exc: BaseException) -> None:
        if not fut.done():
            try:
                fut.set_exception(self._surface(exc))
            except concurrent.futures.InvalidStateError:    # resolved meanwhile
                pass

    def _fence_resolved(self, fut: concurrent.futures.Future) -> None:
        with self._cond:
            try:
                self._fences.remove(fut)
            except ValueError:      # (resolved before registering, never registered, or taken by shutdown)
                pass

    def _register_fence(self, fut: concurrent.futures.Future) -> None:
        """Track a fence's future so that a failure resolves it.

        The scheduler or executor thread may fail between ``fence``'s liveness check
        and this call; the fence's task is then never lowered, and a future that
        ``_fail`` did not see would block its ``result()`` forever (found by the
        differential fuzzer: one rank of an overlapping-write program waited out its
        120 s timeout).  Registering and failing both hold ``_cond``: either ``_fail``
        sees the future, or the future sees ``_error``."""
        with self._cond:
            err = self._error
            if err is None and not fut.done():     # (one resolved already has left the list)
                self._fences.append(fut)
        if err is not None:
            self._fail_fence(fut, err)

    def _on_executor_error(self, exc: BaseException, instr=None) -> BaseException:
        from executor.backends.backend import AllocationError
        if isinstance(exc, AllocationError):
            what = f" for {instr.kind} I{instr.id}" if instr is not None else ""
            bid = getattr(instr, "buffer", None)
            if bid is not None:   # (an allocation for a buffer: name it and the part allocated)
                what += f" of buffer {self._buffer_label(bid)} {instr.box}"
            err = OutOfMemoryError(f"rank {self.rank}: out of memory{what}: {exc}")
            err.__cause__ = exc
            exc = err
        self._fail(exc)
        return exc

    def _on_scheduler_error(self, exc: BaseException) -> None:
        self._fail(exc)

    def _surface(self, exc: BaseException) -> BaseException:
        if isinstance(exc, CeleritasError):
            return exc
        err = CeleritasError(f"rank {self.rank}: internal error: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        return err

    # ---- application-thread API ------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._error is not None:
            err = self._surface(self._error)
            self._abort()
            self._error_shown = True
            raise err
        if self.is_shut_down:
            raise CeleritasError("the celeritas runtime has been shut down")

    def _prune(self) -> None:
        h = self._horizon_reached
        if h > self._pruned_before:
            self._pruned_before = h
            self.task_manager.prune_before(h)

    def create_buffer(self, buffer, data: np.ndarray | None) -> int:
        self._refuse_inside_task("cl.Buffer()")
        with self._lock:
            self._check_alive()
            self._reap()
            bid = self._next_buffer
            self._next_buffer += 1
            info = self.task_manager.create_buffer(bid, buffer.shape, buffer.dtype, buffer.name,
                                                   data is not None)
            self._buffers[bid] = buffer
            self.buffer_names[bid] = buffer.name or ""
            if data is not None:
                self.executor.track_user_buffer(bid, data)
            self.scheduler.notify_buffer_created(info)
            return bid

    def rename_buffer(self, bid: int, name: str) -> None:
        self.buffer_names[bid] = name
        info = self.task_manager.buffers.get(bid)
        if info is not None:
            info.name = name

    def destroy_buffer(self, bid: int) -> None:
        if self.is_shut_down or self._shutting_down:
            return
        with self._lock:
            self.task_manager.destroy_buffer(bid)
            self.scheduler.notify_buffer_destroyed(bid)

    def destroy_later(self, what: str, ident: int) -> None:
        """Destroy a buffer (``what`` = "buffer") or host object ("host_object") at the
        application thread's next call into the runtime: for finalizers.

        A finalizer runs wherever the garbage collector happens to run: on a lane or the
        executor thread, or on the application thread in the middle of any loop of the
        runtime's (its lock is re-entrant), where destroying the buffer changed the task
        manager's maps under that loop ('dictionary changed size during iteration').  Only
        a deque append happens here; ``_reap`` does the destruction between calls, in the
        order the finalizers ran."""
        if not (self.is_shut_down or self._shutting_down):
            self._doomed.append((what, ident))

    def _reap(self) -> None:
        """Destroy what finalizers released since the last call (``destroy_later``)."""
        doomed = self._doomed
        while doomed:
            what, ident = doomed.popleft()
            if what == "buffer":
                self.destroy_buffer(ident)
            else:
                self.destroy_host_object(ident)

    def create_host_object(self, ho) -> int:
        self._refuse_inside_task("cl.HostObject()")
        with self._lock:
            self._check_alive()
            self._reap()
            hid = self._next_host_object
            self._next_host_object += 1
            self._host_objects[hid] = ho
            self.executor.track_host_object(hid, ho.obj)
            self.scheduler.notify_host_object_created(hid)
            return hid

    def retrack_host_object(self, hid: int, obj: Any) -> None:
        """``HostObject.obj`` was replaced (by a host task, in order): fences copy the new one."""
        if not self.is_shut_down:
            self.executor.track_host_object(hid, obj)

    def _copy_host_object(self, obj: Any) -> Any:
        """A fence's snapshot of a host object, on the executor thread: a ``__deepcopy__`` is
        user code, and a queue call from it would wait for this thread (a hang): refused as
        from a host task."""
        inside = self.inside_task
        outer = inside.where
        inside.where = f"the {type(obj).__name__}'s __deepcopy__ (a fence's snapshot of a host object)"
        try:
            return copy.deepcopy(obj)
        finally:
            inside.where = outer

    def new_collective_group_id(self) -> int:
        self._refuse_inside_task("cl.CollectiveGroup()")
        with self._lock:
            g = self._next_group
            self._next_group += 1
            return g

    def destroy_host_object(self, hid: int) -> None:
        if self.is_shut_down or self._shutting_down:
            return
        with self._lock:
            self.scheduler.notify_host_object_destroyed(hid)

    def _refuse_inside_task(self, call: str) -> None:
        """A kernel or host task that submits, waits or fences would wait for itself (a
        hang) or, on several ranks, make the task stream depend on timing: refused."""
        where = self.inside_task.where
        if where is not None:
            raise CeleritasError(f"{call} inside {where}: a kernel or host task cannot submit, wait, fence or "
                                 f"create buffers (it would wait for itself); do it from the application thread")

    def submit(self, cgf) -> None:
        if self.inside_task.where is not None:
            self._refuse_inside_task("q.submit()")
        if self._error is not None or self.is_shut_down:   # (_check_alive's tests, without its call)
            self._check_alive()
        if not callable(cgf):
            raise CeleritasError(f"q.submit takes a command group function cgf(cgh), got {type(cgf).__name__}")
        cgh = CommandGroupHandler(self)
        try:
            cgf(cgh)
            name, geometry, accesses, side_effects, group, reductions, split, oversubscribe, launcher = cgh._build()
        finally:
            cgh._closed = True
        with self._lock:
            if self._error is not None or self.is_shut_down:
                self._check_alive()
            if self._doomed:
                self._reap()
            if self._horizon_reached > self._pruned_before:   # (_prune's test)
                self._prune()
            tid = self.task_manager.submit(cgh._kind, name=name, geometry=geometry, accesses=accesses,
                                           side_effects=side_effects, collective_group=group, reductions=reductions,
                                           split=split, oversubscribe=oversubscribe, launcher=launcher).id
        ahead = tid - max(self._horizon_reached, self._epoch_reached)
        if ahead > self._max_ahead:
            self._throttle(tid)
        elif (self._pause_ahead and ahead > self._pause_ahead and tid >= self._next_pause
              and not getattr(self.executor, "waits_for_network", False)):
            self._pause(tid)

    def _pause(self, tid: int) -> None:
        """Give the executor's side of this process the GIL for a moment (at most
        ``PAUSE_S``), once per ``CELERITAS_PAUSE_AHEAD // 2`` tasks while the application
        runs more than ``CELERITAS_PAUSE_AHEAD`` (128) tasks ahead of the executor.

        Under one GIL a thread that submits in a tight loop hands the GIL over only when
        another thread has waited a switch interval (5 ms) for it, so the scheduler, the
        executor and above all the lane threads (each measuring a kernel of unknown cost
        at the start) advance in 5 ms turns while the application thread queues hundreds
        of tasks, and the executor then works through them in its slower, backlogged mode.
        Unlike ``_throttle`` the pause is bounded: it never waits for work that this thread
        has yet to enable (a host task waiting for an event set after later submits).  Not
        while the executor waits for the network: there the pauses only spread this thread's
        submits and the scheduler's lowering over a latency-bound pipeline (measured: the
        8 B ping-pong went from 74-81 to 95-102 us one way with them)."""
        half = self._pause_ahead // 2
        self._next_pause = tid + max(half, 1)
        self.paused_count += 1
        target = tid - half
        with self._cond:
            self._wake_at = target
            self._throttled = True
            try:
                self._cond.wait_for(lambda: max(self._horizon_reached, self._epoch_reached) >= target
                                    or self._error is not None, PAUSE_S)
            finally:
                self._throttled = False

    @property
    def max_tasks_ahead(self) -> int:
        """How many tasks ``submit`` lets the application run ahead of the executor
        (``CELERITAS_MAX_TASKS_AHEAD`` at start-up)."""
        return self._max_ahead

    @max_tasks_ahead.setter
    def max_tasks_ahead(self, tasks: int) -> None:
        # (for work that must be submitted whole before any of it may run: benchmarks.gate)
        if type(tasks) is not int or tasks < 2:
            raise ConfigError(f"max_tasks_ahead must be an integer >= 2, got {tasks!r}")
        self._max_ahead = tasks

    @property
    def tasks_ahead(self) -> int:
        """Tasks submitted past the newest horizon or epoch the executor has reached."""
        return self.task_manager.next_task_id - 1 - max(self._horizon_reached, self._epoch_reached)

    def _throttle(self, tid: int) -> None:
        """Hold the application thread until the executor has caught up to about half of
        ``CELERITAS_MAX_TASKS_AHEAD`` behind ``tid``.

        Without it a loop that submits faster than the scheduler and executor work queues
        tasks, commands and instructions without bound (a million-task dry run grew by
        73 MB).  Commands held for lookahead are flushed first: they would otherwise keep
        the horizons the wait counts on from executing.  Waiting cannot deadlock across
        ranks (the oldest unfinished task has been submitted on every rank); it does wait
        for a host task that itself waits for something this thread does only later.
        """
        tasks = self.task_manager.tasks
        reached = max(self._horizon_reached, self._epoch_reached)
        half = tid - self._max_ahead // 2
        target = None   # the newest horizon or epoch at or before ``half``, else the newest one
        for t in range(tid, reached, -1):
            task = tasks.get(t)
            if task is not None and task.kind in (tg.HORIZON, tg.EPOCH):
                if target is None or t <= half:
                    target = t
                if t <= half:
                    break
        if target is None:
            return
        self.scheduler.flush()
        self.throttled_count += 1
        watch = _WaitWatch(self, f"q.submit (more than {self._max_ahead} tasks ahead of the executor)",
                           f"T{target} (horizon)",
                           f"(a host task that waits for something this thread does only after more submits "
                           f"keeps it waiting: set CELERITAS_MAX_TASKS_AHEAD above the tasks submitted in "
                           f"between, now {self._max_ahead})")
        with self._cond:
            self._wake_at = target
            self._throttled = True
            try:
                while max(self._horizon_reached, self._epoch_reached) < target and self._error is None:
                    self._cond.wait(min(0.05, watch.slice))
                    watch.tick()
                    if not self.dry_run and not self.executor.is_running and self._error is None \
                            and max(self._horizon_reached, self._epoch_reached) < target:
                        self._error = CeleritasError(f"rank {self.rank}: the executor stopped before horizon "
                                                     f"T{target}")
            finally:
                self._throttled = False
        self._check_alive()

    def fence(self, obj, subrange=None) -> concurrent.futures.Future:
        self._refuse_inside_task("q.fence()")
        if self.dry_run:   # (as Celerity warns: a program that prints or checks fenced data misleads)
            log.warning("q.fence() in a dry run (CELERITAS_DRY_RUN_NODES): no task runs, so the fence returns "
                        "zeros of the fenced shape for a buffer and the host object as it was made")
        fut = _FenceFuture(self, obj.label if isinstance(obj, Buffer) else
                           f"host object H{obj.id}" if isinstance(obj, HostObject) else "?")
        with self._lock:
            self._check_alive()
            self._reap()
            if isinstance(obj, Buffer):
                obj._require_alive()
                box = Box.full(obj.shape)
                extents = obj.shape     # (what the fence's array shows: an empty box keeps none)
                if subrange is not None:
                    if isinstance(subrange, Region):   # (one array: a region of one box is that box)
                        boxes = list(subrange)
                        if len(boxes) != 1:
                            raise CeleritasError(
                                f"fence of buffer {obj.label}: a fence returns one array, so it takes a "
                                f"cl.Subrange or cl.Box, not a region of {len(boxes)} boxes (fence its bounding "
                                f"box {subrange.bounding_box}, or one fence per box)")
                        subrange = boxes[0]
                    if isinstance(subrange, Box):
                        sbox, extents = subrange, subrange.range
                    else:
                        try:
                            sub = subrange if isinstance(subrange, Subrange) else Subrange(*subrange)
                        except GeometryError:
                            raise
                        except TypeError as exc:
                            raise CeleritasError(f"fence of buffer {obj.label}: the subrange is a cl.Subrange, a "
                                                 f"cl.Box or an (offset, range) pair, got {subrange!r}") from exc
                        sbox, extents = sub.box, sub.range
                    if sbox.dims != len(obj.shape) or not box.contains(sbox):
                        raise CeleritasError(f"fence subrange {subrange} is not inside buffer {obj.label} of "
                                             f"shape {obj.shape}")
                    box = sbox
                if box.empty:
                    fut.shape = tuple(extents)
                fut.task = self.task_manager.fence(buffer=obj.id, box=box, promise=_FencePromise(fut)).id
            elif isinstance(obj, HostObject):
                obj._require_alive()
                if subrange is not None:
                    raise CeleritasError(f"fence of host object H{obj.id}: a subrange {subrange!r} applies to "
                                         f"buffers only")
                fut.task = self.task_manager.fence(host_object=obj.id, promise=_FencePromise(fut)).id
            else:
                raise CeleritasError(f"fence takes a cl.Buffer or cl.HostObject, got {type(obj).__name__}")
            self._register_fence(fut)
        return fut

    def epoch(self, action: str = tg.EPOCH_NONE) -> None:
        self._refuse_inside_task("q.wait()")
        with self._lock:
            self._check_alive()
            self._reap()
            t = self.task_manager.epoch(action)
        self._await_epoch(t.id, "q.wait(barrier=True)" if action == tg.EPOCH_BARRIER else "q.wait()",
                          "barrier epoch" if action == tg.EPOCH_BARRIER else "epoch")

    def _await_epoch(self, tid: int, call: str, kind: str) -> None:
        watch = _WaitWatch(self, call, f"T{tid} ({kind})")
        with self._cond:
            while self._epoch_reached < tid and self._error is None:
                self._cond.wait(watch.slice)
                if not self.dry_run and not self.executor.is_running and self._epoch_reached < tid \
                        and self._error is None:
                    self._error = CeleritasError(f"rank {self.rank}: the executor stopped before epoch T{tid}")
                if self._epoch_reached < tid and self._error is None:
                    watch.tick()
        self._check_alive()
        self._prune()

    def _buffer_label(self, bid: int) -> str:
        name = self.buffer_names.get(bid)
        return f"B{bid}" + (f' "{name}"' if name else "")

    def _warn_waiting(self, call: str, target: str, waited: float, hint: str = "") -> None:
        """A call of the application thread has blocked for a while: say what for."""
        if self.dry_run:
            pending: list[str] = []
        else:
            pending = self.executor.describe_waits(self._buffer_label)
        shown = f"{waited:.1f}" if waited < 10 else f"{waited:.0f}"
        text = f"celeritas rank {self.rank}: {call} has waited {shown} s for {target}"
        if pending:
            text += "; this rank still waits for:\n" + "\n".join(f"  - {line}" for line in pending)
        if hint:
            text += "\n" + hint
        log.warning(text)

    def flush(self) -> None:
        self._check_alive()
        with self._lock:
            self._reap()
        self.scheduler.flush()

    def set_lookahead(self, mode: str) -> None:
        self._check_alive()
        if mode not in cfg.LOOKAHEAD_MODES:
            raise ConfigError(f"lookahead {mode!r}; use one of {', '.join(cfg.LOOKAHEAD_MODES)}")
        self.scheduler.set_lookahead(mode)

    def enable_record(self) -> None:
        """Record from now on (a ``Queue(record=True)`` made after the runtime started)."""
        with self._lock:
            if self.recorders is None:
                rec = self.recorders = Recorders(self.rank)
                self.task_manager.recorder = rec.tasks
                self.scheduler.start_recording(rec.commands, rec.instructions)

    def graphs(self) -> dict:
        """The records so far.  After a failure (once it has surfaced) and after shutdown
        the records are final and still returned: the graphs of a run that failed are what
        its author needs to look at."""
        from .graphs import GraphRecord
        if self.recorders is None:
            raise CeleritasError("graph records are off; create the Queue with record=True or set CELERITAS_RECORD=1")
        if self._error is not None:
            if not self._error_shown:
                self._check_alive()     # the failure surfaces once, here as at any other call
            self._abort()               # (stops the threads, if a fence's result surfaced it)
        if not self.is_shut_down:
            self.scheduler.flush()
            self.scheduler.sync()
        return GraphRecord.from_recorders(self.recorders, self.rank)

    # ---- shutdown --------------------------------------------------------------------------
    def shutdown(self) -> None:
        if self.is_shut_down or self._shutting_down:
            return
        if self._error is not None:
            err = self._surface(self._error)
            self._abort()
            if self._error_shown:
                return    # (a fence's result() raised it already: shutdown then returns quietly)
            self._error_shown = True
            raise err
        self._shutting_down = True
        try:
            with self._lock:
                self._doomed.clear()     # (every buffer and host object left is destroyed below)
                for bid in sorted(self.task_manager.buffers):
                    b = self._buffers.get(bid)
                    if b is not None:
                        b._alive = False
                    self.task_manager.destroy_buffer(bid)
                    self.scheduler.notify_buffer_destroyed(bid)
                self.task_manager.buffers.clear()
                for hid in list(self._host_objects.keys()):
                    h = self._host_objects.get(hid)
                    if h is not None:
                        h._alive = False
                    self.scheduler.notify_host_object_destroyed(hid)
                t = self.task_manager.epoch(tg.EPOCH_SHUTDOWN)
            self._await_epoch(t.id, "q.shutdown()", "shutdown epoch")
        except BaseException:
            self._abort()
            raise
        self.scheduler.stop()
        self.executor.join(30)
        self._close_backend()
        self._finish_outputs()
        self.is_shut_down = True
        self._release_current()

    def _finish_outputs(self) -> None:
        """Graph dumps, trace and summary; collective across ranks, so every rank calls it."""
        from . import outputs
        try:
            view = self.outputs()
        except Exception:  # noqa: BLE001 - still take part in the gathers, with nothing to show
            log.exception("rank %d: could not collect its outputs", self.rank)
            view = outputs.RankOutputs(self.rank, self.num_ranks, print_graphs=self.config.print_graphs,
                                       trace_file=self.config.trace, summary=self._summary_enabled(),
                                       gather=self.gather_to_root)
        outputs.write_at_shutdown(view)

    def outputs(self):
        """This rank's view for graph dumps, trace and summary (``celeritas.outputs``)."""
        from .graphs import GraphRecord
        from .outputs import RankOutputs
        sched = self.scheduler
        igg = sched.igg
        replay = {}
        for level, gen in (("task", self.task_manager), ("command", sched.cdag), ("instruction", igg)):
            if gen.replay is not None:
                replay[level] = gen.replay.stats()
        return RankOutputs(
            rank=self.rank, num_ranks=self.num_ranks, dry_run=self.dry_run, print_graphs=self.config.print_graphs,
            trace_file=self.config.trace, summary=self._summary_enabled(),
            records=GraphRecord.from_recorders(self.recorders, self.rank) if self.recorders is not None else None,
            buffer_names={bid: n for bid, n in self.buffer_names.items() if n}, trace=list(self.executor.trace),
            instruction_counts=dict(igg.counts), scheduler_busy_ns=sched.busy_ns,
            scheduler_busy_intervals=sched.busy_intervals, num_tasks=sched.num_tasks,
            backend=self.backend_name, num_devices=self.num_devices, replay=replay,
            memory=dict(igg.memory_stats), throttled=self.throttled_count, gather=self.gather_to_root)

    def _summary_enabled(self) -> bool:
        """Whether this job prints the summary (asked for on any rank: see cfg.agree_across_ranks)."""
        return self._summary

    def _collective(self):
        """The collective handle of a communicator cloned once per runtime for the start-up
        agreement and the shutdown outputs, so these messages never mix with the executor's."""
        if self._gather_handle is None:
            self._gather_handle = self.communicator.clone(key="celeritas-outputs").collective_handle()
        return self._gather_handle

    def gather_to_root(self, obj: Any, root: int = 0) -> list | None:
        """``obj`` of every rank, in rank order, on ``root``; None elsewhere.  Collective:
        every rank calls it in the same order.  Uses a communicator cloned once per runtime,
        so these messages never mix with the executor's."""
        if self.dry_run or self.communicator.num_ranks == 1:
            return [obj]
        return self._collective().gather(obj, root=root)

    def _abort(self) -> None:
        """Stop both threads without waiting for outstanding work (after an error)."""
        if self.is_shut_down:
            return
        self.is_shut_down = True
        try:
            self.executor.shutdown(10, drain=False)
        except Exception:  # noqa: BLE001 - best effort while failing
            log.debug("executor shutdown failed", exc_info=True)
        self.scheduler.stop(timeout=10)
        with self._cond:                # nothing resolves a fence from here on: its result() must not block
            fences, self._fences = self._fences, []
            err = self._error
        for f in fences:
            self._fail_fence(f, err if err is not None else CeleritasError(
                f"rank {self.rank}: the runtime was stopped before fence T{getattr(f, 'task', '?')} completed"))
        self._close_backend()
        self._finish_outputs_after_failure()
        self._release_current()

    def _finish_outputs_after_failure(self) -> None:
        """Graph dumps and trace of a run that failed, as far as it got: a failed program is
        the one its author most needs to look at.  Other ranks may be gone or stuck, so
        nothing is gathered: every rank writes its own instruction graph (rank 0 also the
        task graph and its own commands) and, beside the trace file, ``NAME.rankR.json``
        (rank 0: the file itself) -- the fallbacks of ``graphs`` and ``trace`` for a gather
        that failed.  No summary: it would bury the error."""
        if not (self.config.print_graphs or self.config.trace):
            return
        try:
            view = self.outputs()
            view.summary = False
            if self.num_ranks > 1 and not self.dry_run:
                def no_gather(obj: Any) -> list | None:
                    raise CeleritasError(f"rank {self.rank} failed, so its outputs are not gathered")
                view.gather = no_gather
            else:
                view.gather = lambda obj: [obj]
            from . import outputs
            outputs.write_at_shutdown(view)
        except Exception:  # noqa: BLE001 - never mask the failure being reported
            log.exception("rank %d: could not write the outputs of the failed run", self.rank)

    def _close_backend(self) -> None:
        close = getattr(self.backend, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - teardown must not mask the real error
                log.debug("backend close failed", exc_info=True)

    @staticmethod
    def _tune_gc(policy: str) -> tuple[int, int, int] | None:
        """Raise CPython's cyclic-GC thresholds while the runtime runs; the old ones, to restore.

        Every task leaves a few dozen long-lived graph objects (tasks, commands,
        instructions, region maps) that live until their horizon is pruned.  With
        the default thresholds (700, 10, 10) young collections run every few tasks
        and full collections repeatedly scan ~10^5 live graph objects: measured at
        about a quarter of the wall time of tiny-task and small-stencil runs, on
        every thread, since a collection holds the GIL.  Reference counting still
        frees everything acyclic at once; only the cycle detector runs less often.
        ``CELERITAS_GC=default`` leaves the interpreter's settings alone.
        """
        if policy != "tuned":
            return None
        current = gc.get_threshold()
        if current == GC_THRESHOLDS:          # another runtime of this process already did it
            return None
        gc.set_threshold(*GC_THRESHOLDS)
        return current

    @staticmethod
    def _tune_switch_interval(us: float | None) -> float | None:
        """Shorten CPython's GIL switch interval while the runtime runs; the old one, to restore.

        A rank runs several Python threads under one GIL: application, scheduler,
        executor (and lane workers).  A thread that wakes up (the executor when a
        payload or a lane's completion arrives) waits for a thread busy in Python to
        give the GIL up, which it does only once the switch interval (5 ms by default)
        has passed: a hop or a completion then waits milliseconds behind the
        scheduler compiling later tasks.  ``CELERITAS_SWITCH_INTERVAL_US`` sets it
        (``off`` leaves the interpreter's setting alone); like the GC thresholds it is
        process-wide, so only the first runtime of a process changes and restores it.
        """
        if us is None:
            return None
        current = sys.getswitchinterval()
        wanted = us * 1e-6
        if context.process_tuning["switch_interval"] is not None:   # another runtime of this process already did it
            return None
        sys.setswitchinterval(wanted)
        context.process_tuning["switch_interval"] = sys.getswitchinterval()    # as the interpreter rounded it
        return current

    def _release_current(self) -> None:
        saved, self._saved_gc_threshold = getattr(self, "_saved_gc_threshold", None), None
        if saved is not None and gc.get_threshold() == GC_THRESHOLDS:
            gc.set_threshold(*saved)
        saved_si, self._saved_switch_interval = getattr(self, "_saved_switch_interval", None), None
        if saved_si is not None:
            if sys.getswitchinterval() == context.process_tuning["switch_interval"]:
                sys.setswitchinterval(saved_si)
            context.process_tuning["switch_interval"] = None
        context.release(self)

    def shutdown_at_exit(self) -> None:
        if not self.is_shut_down:
            shown = self._error_shown
            try:
                self.shutdown()
            except Exception as exc:  # noqa: BLE001 - report, never hang the interpreter exit
                if not shown:         # nobody synchronized after the failure: this is where it surfaces
                    sys.stderr.write("celeritas: work this program submitted failed; the error surfaced at "
                                     "the shutdown at exit:\n")
                    traceback.print_exception(exc)
                    # an atexit handler cannot change the exit status, and a failed program
                    # must not exit 0 (a job script or mpiexec would take it for success)
                    logging.shutdown()
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(1)


def _config(env: dict | None, overrides: dict) -> cfg.Config:
    base = cfg.from_env({**os.environ, **env} if env else None)
    return base.with_overrides(**{k: v for k, v in overrides.items() if k in ("devices", "lookahead", "record")})


def _default_communicator(config: cfg.Config):
    from executor.communicator import SingleRankCommunicator
    if config.dry_run_nodes is None:
        try:
            from executor.mpi import launched_under_mpi, MpiCommunicator
        except ImportError:
            pass
        else:
            if launched_under_mpi():
                return MpiCommunicator(strided=config.mpi_strided, poll_max=config.mpi_poll_max_us * 1e-6,
                                       poll_spin=config.mpi_spin_us * 1e-6,
                                       divergence_timeout=config.divergence_timeout,
                                       divergence_timeout_hint="CELERITAS_DIVERGENCE_TIMEOUT",
                                       cuda_aware=config.mpi_cuda_aware)
    return SingleRankCommunicator()


def _new_runtime(env: dict | None, overrides: dict, communicator) -> "Runtime":
    try:
        config = _config(env, overrides)
        if communicator is None:         # (a dry run in an MPI job of several ranks: refused)
            cfg.check_dry_run(config, 1)
    except ConfigError:
        if communicator is None:
            _join_mpi_job()
        raise
    return Runtime(config, communicator)


def _join_mpi_job() -> None:
    """A rank whose settings are wrong still starts MPI before its ConfigError goes up: the
    other ranks wait in MPI's start-up for every rank (a job that never ended), and an
    uncaught error must end them all, as one found after the start does (``abort``)."""
    try:
        from executor.mpi import import_mpi, install_excepthook, launched_under_mpi
        if not launched_under_mpi():
            return
        mpi = import_mpi()
        install_excepthook(mpi.COMM_WORLD.Get_rank())
    except Exception:  # noqa: BLE001 - the ConfigError being raised is what the user must see
        log.debug("could not start MPI for a rank with a configuration error", exc_info=True)


context.set_runtime_factory(_new_runtime)
