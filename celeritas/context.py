"""Which runtime is current: the process's, or under ``run_cluster`` the calling rank's.

Buffers, host objects and collective groups attach to the current runtime when
they are made; the runtime module registers how to create one.  Keeping this here
lets those modules depend on it instead of on the runtime module, which depends on
them (no import cycle), and it is the only process-level state: which runtime is
current, never what it holds.
"""
from __future__ import annotations

import atexit
import threading
from typing import Any, Callable

from scheduler.errors import CeleritasError


class ClusterContext(threading.local):
    """Set by ``run_cluster`` on each rank's thread: its communicator, environment and runtime
    (and by a launcher on the executor and lane threads that run the rank's tasks)."""

    def __init__(self):
        self.communicator = None
        self.env: dict | None = None
        self.runtime: Any = None


cluster = ClusterContext()
_process: dict[str, Any] = {"runtime": None}
_process_lock = threading.Lock()
# interpreter settings a runtime of this process changed (restored by the runtime that did)
# (and the host allocator, which stays tuned: runtime.tune_host_allocator)
process_tuning: dict[str, Any] = {"switch_interval": None, "host_allocator": None}
# (env overrides or None, Queue overrides, communicator or None) -> a new runtime
_factory: Callable[..., Any] | None = None


def set_runtime_factory(factory: Callable[..., Any]) -> None:
    global _factory
    _factory = factory


def current_runtime(create: bool = False, **overrides) -> Any:
    """The current runtime; ``create`` makes one (with ``overrides`` from a Queue) if none."""
    if cluster.communicator is not None:
        rt = cluster.runtime
        if rt is None or rt.is_shut_down:
            if not create:
                raise CeleritasError("no celeritas runtime on this rank; create a cl.Queue first")
            rt = cluster.runtime = _factory(cluster.env, overrides, cluster.communicator)
        else:
            rt.check_overrides(overrides)
        return rt
    with _process_lock:
        rt = _process["runtime"]
        if rt is None or rt.is_shut_down:
            if not create:
                raise CeleritasError("no celeritas runtime; create a cl.Queue first")
            rt = _process["runtime"] = _factory(None, overrides, None)
            atexit.register(rt.shutdown_at_exit)
        else:
            rt.check_overrides(overrides)
        return rt


class CopiesAsItself:
    """A handle, as Celerity's are (``cl.Buffer``, ``cl.HostObject``, ``cl.Queue``,
    ``cl.CollectiveGroup``): a copy, deep or not, names the same object.  A second handle
    to a buffer would destroy it when collected; and a host object holding a queue or a
    group can be fenced (its snapshot keeps the same queue or group)."""

    __slots__ = ()

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class Handle(CopiesAsItself):
    """What ``cl.Buffer`` and ``cl.HostObject`` share: a handle to an object the runtime owns
    (``_runtime``, ``id``, ``_alive``), destroyed by the runtime as ``_handle_kind``."""

    _handle_kind = ""

    def __del__(self) -> None:
        # (not ``destroy()``: the garbage collector may run this on any thread, inside any
        # loop of the runtime's; the application thread destroys it at its next call)
        try:
            if getattr(self, "_alive", False):
                self._alive = False
                self._runtime.destroy_later(self._handle_kind, self.id)
        except Exception:   # interpreter shutdown: the runtime may be gone already
            pass


def release(rt: Any) -> None:
    """``rt`` is no longer current (it shut down)."""
    if cluster.runtime is rt:
        cluster.runtime = None
    with _process_lock:
        if _process["runtime"] is rt:
            _process["runtime"] = None
