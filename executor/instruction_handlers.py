"""How the executor runs each kind of instruction (a mixin of ``Executor``).

One ``_issue_<kind>`` per instruction class: allocations and frees go to the
backend; copies and kernels run inline on the executor thread when they are cheap
and nothing else waits (see "inline execution" in ``executor.py``), else on their
lane; sends and receives go to the communicator and the receive arbiter; reductions,
fences, host objects, collective groups, horizons and epochs are bookkeeping that
completes at once (epochs may wait for the divergence check or a barrier).  The
engine, lanes, inbox and error policy live in ``executor.py``.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import time
from typing import Any

import numpy as np

from scheduler.errors import CeleritasError, exception_text
from scheduler.instruction_graph import (AllocInstruction, AwaitReceiveInstruction, CloneCollectiveGroupInstruction,
                                         CopyInstruction, DestroyHostObjectInstruction, DeviceKernelInstruction,
                                         EpochInstruction, FenceInstruction, FillIdentityInstruction,
                                         FreeInstruction, GatherReceiveInstruction, HorizonInstruction,
                                         HostTaskInstruction, LaunchContext, ReceiveInstruction, ReduceInstruction,
                                         SendInstruction)

from .backends.backend import box_view
from .out_of_order_engine import Assignment

log = logging.getLogger("celeritas.executor")

_perf_ns = time.perf_counter_ns
_VIEWS_CACHED = 4096
_new_object = object.__new__

# LaunchContext's fields, in order: _kernel_context fills them in without the dataclass's
# generated __init__ (which type.__call__ reaches with an argument tuple), 0.55 -> 0.3 us per
# kernel.  Should the class gain or lose a field, it falls back to the constructor.
_CONTEXT_FIELDS = ("box", "device", "arrays", "reduction_arrays", "xp", "global_range", "communicator", "rank",
                   "stream", "accesses", "task", "reductions")
_FAST_CONTEXT = (tuple(f.name for f in dataclasses.fields(LaunchContext)) == _CONTEXT_FIELDS
                 and not hasattr(LaunchContext, "__post_init__"))


def _noop() -> None:
    pass


def _once_cloned(clone: Any, ctx: LaunchContext, launcher: Any) -> None:
    """A collective host task whose group's clone had not completed when it was issued: its
    lane waits for the other ranks to clone, then runs it."""
    clone.wait_cloned()
    ctx.communicator = clone.collective_handle()
    launcher(ctx)


def cost_key(instr: DeviceKernelInstruction) -> tuple:
    """What a kernel's run-time estimate is kept under: its name and its chunk's size class."""
    box = instr.box
    return instr.name, box.area.bit_length() if box is not None else 0


class InstructionHandlers:
    """The ``_issue_*`` methods of ``Executor`` (they use its state: allocations, lanes,
    engine, communicator)."""

    def _issue_alloc(self, a: Assignment) -> None:
        instr: AllocInstruction = a.instruction
        t0 = _perf_ns()
        shape, dtype = _alloc_layout(instr)
        self._allocs[instr.allocation] = self._backend.allocate(instr.memory, shape, dtype)
        self._forget_views()
        self._backend_allocs[instr.allocation] = instr.memory
        self._complete_sync(instr, "alloc", t0)

    def _issue_free(self, a: Assignment) -> None:
        instr: FreeInstruction = a.instruction
        t0 = _perf_ns()
        arr = self._allocs.pop(instr.allocation, None)
        self._forget_views()
        memory = self._backend_allocs.pop(instr.allocation, None)
        if arr is None:
            log.warning("free of unknown allocation A%d (I%d)", instr.allocation, instr.id)
        elif memory is not None:
            self._backend.free(memory, arr)
        self._complete_sync(instr, "alloc", t0)

    def _issue_copy(self, a: Assignment) -> None:
        instr: CopyInstruction = a.instruction
        lane = a.lane_ref.handle or self._lane_info(a)
        if lane.inline:   # a plain host lane: the backend would run copy_box
            pair = self._copy_views(instr)
            if pair is None:
                self._dispatch(a, lane, _noop, 0)
                return
            if not a.eager and self._trace is None and instr.size_bytes <= self._inline_bytes:
                # the common case, _dispatch's inline path without its generality
                mems = (instr.source_memory, instr.dest_memory)
                if mems not in self._direct_copies:
                    self._direct_copies.add(mems)
                    self._plans.clear()     # (they say which copies would not run directly)
                self._copy_inline(instr, pair)
                self._engine.complete(instr.id)
                return
            self._dispatch(a, lane, _assign, instr.size_bytes, *pair)
            return
        allocs = self._allocs
        c = self._backend.copy(allocs[instr.source], instr.source_box, allocs[instr.dest],
                               instr.dest_box, instr.box, lane.lane, dependent=a.eager)
        self._track_backend(instr, lane.lane, c)

    def _copy_views(self, instr: CopyInstruction) -> tuple[Any, Any] | None:
        """(destination, source) views of a host copy, cached until an allocation comes or
        goes; None for an empty box."""
        box = instr.box
        views = self._views
        key = (instr.source, instr.dest, box.lo, box.hi)
        pair = views.get(key)
        if pair is None:
            if box.empty:
                return None
            allocs = self._allocs
            dst = box_view(allocs[instr.dest], instr.dest_box, box)
            src = box_view(allocs[instr.source], instr.source_box, box)
            if src.shape != dst.shape:
                src = src.reshape(dst.shape)
            if len(views) >= _VIEWS_CACHED:
                views.clear()
            pair = views[key] = (dst, src)
        return pair

    def _copy_inline(self, instr: CopyInstruction, pair: tuple[Any, Any]) -> None:
        try:
            pair[0][...] = pair[1]
        except BaseException as exc:  # noqa: BLE001 - same policy as a lane worker
            self._report(exc, instr)

    def _forget_views(self) -> None:
        if self._views:
            self._views.clear()
        if self._contexts:     # (their arrays)
            self._contexts.clear()

    def _view(self, aid: int, extent: Any, box: Any) -> Any:
        """``box_view`` of allocation ``aid``, cached until an allocation comes or goes."""
        key = (aid, box.lo, box.hi)
        views = self._views
        v = views.get(key)
        if v is None:
            if len(views) >= _VIEWS_CACHED:       # growing boxes (lookahead off): start over
                views.clear()
            v = views[key] = box_view(self._allocs[aid], extent, box)
        return v

    def _cost_key(self, instr: DeviceKernelInstruction) -> tuple:
        """``cost_key(instr)``, remembered per chunk box (kept alive with its entry, so its id is
        not reused meanwhile): the scheduler's replay hands a repeating step's kernels the same
        box objects every time.  Measured 0.36 -> 0.17 us per kernel."""
        box = instr.box
        cache = self._cost_keys
        hit = cache.get(id(box))
        name = instr.name
        # (names compared by value: one made at every submit, f"hop{src}{dst}", is a new string)
        if hit is not None and hit[0] is box and hit[1] == name:
            return hit[2]
        key = cost_key(instr)
        if len(cache) >= _VIEWS_CACHED:       # new boxes every step (no replay): start over
            cache.clear()
        cache[id(box)] = (box, name, key)
        return key

    def _issue_kernel(self, a: Assignment) -> None:
        instr: DeviceKernelInstruction = a.instruction
        lane = a.lane_ref.handle or self._lane_info(a)
        launcher = instr.launcher
        key = self._cost_key(instr)
        if lane.inline and not a.eager and self._trace is None:
            est = self._costs.get(key)
            # the common case, _dispatch's inline path without its generality (a cheap kernel,
            # or one of a few ms with nothing else to run: see _dispatch, whose first runs of a
            # kind and probes still decide); run here, like a direct run, so it may take the
            # context kept for its accesses (wave_sim 256² on 2 ranks built one a step)
            if est is not None and (est <= self._inline_ns or self._inline_alone(est)):
                if self._direct_kernel_lanes.get(instr.device) is not lane:
                    self._direct_kernel_lanes[instr.device] = lane
                    self._contexts.clear()      # (made for the device's other lane)
                self._kernel_inline(instr, launcher, self._inline_context(instr, lane, key), key, est)
                self._engine.complete(instr.id)
                return
        if launcher is None:
            self._dispatch(a, lane, _noop, key)
        else:
            self._dispatch(a, lane, launcher, key, self._kernel_context(instr, lane))

    def _inline_context(self, instr: DeviceKernelInstruction, lane: Any, key: Any) -> LaunchContext:
        """The launch context for a kernel run on this thread with ``lane``, the device's
        direct lane: the one kept for its accesses list where there is one (see
        ``Executor._direct_kernel``, which writes the hit test out: change both), else a new
        one, kept.  Only runs on this thread share a context: they are done one at a time."""
        accesses = instr.accesses
        c = self._contexts.get(id(accesses))
        if (c is not None and c[0] is accesses and c[1] is instr.box and c[2] == instr.name
                and c[3] == instr.device and not instr.reductions):
            ctx = c[4]
            ctx.task = instr.task
            return ctx
        ctx = self._kernel_context(instr, lane)
        if not instr.reductions:
            contexts = self._contexts
            if len(contexts) >= _VIEWS_CACHED:
                contexts.clear()
            contexts[id(accesses)] = (accesses, instr.box, instr.name, instr.device, ctx, key)
        return ctx

    def _kernel_context(self, instr: DeviceKernelInstruction, lane: Any) -> LaunchContext:
        allocs = self._allocs
        accesses = instr.accesses
        reductions = instr.reductions
        cls = type(instr)
        has_range = self._has_global_range.get(cls)
        if has_range is None:
            has_range = self._has_global_range[cls] = hasattr(cls, "global_range")
        arrays = [allocs[acc.allocation] if acc.allocation >= 0 else None for acc in accesses] if accesses else []
        reduction_arrays = [allocs[r.allocation] for r in reductions] if reductions else []
        global_range = tuple(instr.global_range) if has_range else ()
        if not _FAST_CONTEXT:
            return LaunchContext(instr.box, instr.device, arrays, reduction_arrays, lane.xp, global_range, None,
                                 self._rank, lane.stream, accesses, instr.task, reductions)
        ctx = _new_object(LaunchContext)    # (see _CONTEXT_FIELDS)
        ctx.box = instr.box
        ctx.device = instr.device
        ctx.arrays = arrays
        ctx.reduction_arrays = reduction_arrays
        ctx.xp = lane.xp
        ctx.global_range = global_range
        ctx.communicator = None
        ctx.rank = self._rank
        ctx.stream = lane.stream
        ctx.accesses = accesses
        ctx.task = instr.task
        ctx.reductions = reductions
        return ctx

    def _kernel_inline(self, instr: DeviceKernelInstruction, launcher: Any, ctx: LaunchContext, key: tuple,
                       est: int) -> None:
        """Run a kernel estimated cheap on this thread; its run time updates the estimate
        (wall time, or CPU time for a suspect kind: see ``_note_cost``)."""
        cpu0 = self._cpu_clock(key) if self._suspect else -1
        t0 = _perf_ns()
        try:
            if launcher is not None:
                launcher(ctx)
        except BaseException as exc:  # noqa: BLE001 - same policy as a lane worker
            self._report(exc, instr)
        ns = _perf_ns() - t0
        if cpu0 >= 0:
            self._note_run(key, cpu0, ns)
        elif ns <= est:
            self._costs[key] = ns       # (the common case of _note_run)
        else:
            # a slower wall-time run (most runs: a faster one sets the estimate outright):
            # _note_cost's step towards it, written out while it stays inline (est is at
            # most the threshold here, so only a step past it makes the kind suspect)
            new = est + (ns - est) // 4
            if new <= self._inline_ns:
                self._costs[key] = new
            else:
                self._note_cost(key, ns, True)

    def _issue_host_task(self, a: Assignment) -> None:
        instr: HostTaskInstruction = a.instruction
        lane = self._lane(a)
        allocs = self._allocs
        comm = None
        cloning = None      # the group's clone, where the other ranks have yet to clone it too
        group = instr.collective_group
        if group is not None:
            comm = self._group_handles.get(group)
            if comm is None:
                clone = self._group_communicator(group)
                if clone.clone_completed():
                    comm = self._group_handles[group] = clone.collective_handle()
                else:
                    cloning = clone
        ctx = LaunchContext(
            box=instr.box, device=None,
            arrays=[allocs[acc.allocation] if acc.allocation >= 0 else None for acc in instr.accesses],
            reduction_arrays=[],
            xp=lane.xp,
            global_range=tuple(instr.global_range), communicator=comm,
            rank=self._comm.rank, stream=lane.stream,
            accesses=instr.accesses, task=instr.task)
        launcher = instr.launcher
        if launcher is None:
            fn = _noop
        elif cloning is not None:    # (the lane waits for the clone: see Communicator.clone_completed)
            fn = functools.partial(_once_cloned, cloning, ctx, launcher)
        else:
            fn = functools.partial(launcher, ctx)
        self._track_backend(instr, lane.lane, self._backend.launch(lane.lane, fn, dependent=a.eager))

    def _group_communicator(self, group: int) -> Any:
        comm = self._groups.get(group)
        if comm is None:
            # no clone instruction seen for this group: clone from the root, keyed by
            # the group id so ranks agree regardless of the order they get here
            log.debug("collective group %d used before being cloned; cloning now", group)
            comm = self._clone(self._comm, group)
        return comm

    def _clone(self, original: Any, group: int) -> Any:
        """Group ``group``'s clone of ``original``, kept; one the other ranks have yet to
        complete is tested by ``_poll_comm`` until it is."""
        clone = self._groups[group] = original.clone(key=group)
        self._group_handles.pop(group, None)
        if not clone.clone_completed():
            self._cloning.append(clone)
        return clone

    def _issue_send(self, a: Assignment) -> None:
        instr: SendInstruction = a.instruction
        view = self._view(instr.source, instr.source_box, instr.box)
        comm = self._comm
        if not comm.accepts_strided and not view.flags.c_contiguous:
            view = np.ascontiguousarray(view)
        t0 = _perf_ns() if self._trace is not None else 0     # (for _complete_sync's trace event)
        req = comm.send_payload(instr.to, instr.msg_id, view)
        if req.test():
            # done at once (a small message leaves in the library's eager buffer): retired
            # here, so whatever waits for it (the next receive into the same rows, in a
            # halo exchange or a ping-pong) is issued in this pass, not after a later poll
            self._complete_sync(instr, "comm", t0)
        else:
            self._sends.append(self._start_async(instr, "comm", req))

    def _issue_receive(self, a: Assignment) -> None:
        instr: ReceiveInstruction = a.instruction
        handle = self._arbiter.begin_receive(instr, self._allocs[instr.dest])
        self._receives[instr.id] = self._start_async(instr, "comm", handle)

    def _issue_await_receive(self, a: Assignment) -> None:
        instr: AwaitReceiveInstruction = a.instruction
        handle = self._arbiter.await_receive(instr)
        self._receives[instr.id] = self._start_async(instr, "comm", handle)

    def _issue_gather_receive(self, a: Assignment) -> None:
        instr: GatherReceiveInstruction = a.instruction
        handle = self._arbiter.begin_gather(instr, self._allocs[instr.dest])
        self._receives[instr.id] = self._start_async(instr, "comm", handle)

    def _issue_fill_identity(self, a: Assignment) -> None:
        instr: FillIdentityInstruction = a.instruction
        arr = self._allocs[instr.allocation]
        count, identity = instr.count, instr.identity

        def fill() -> None:
            arr.reshape(-1)[:count] = identity

        self._dispatch(a, self._lane(a), fill, count * 8)

    def _issue_reduce(self, a: Assignment) -> None:
        instr: ReduceInstruction = a.instruction
        src = self._allocs[instr.source]
        dst = self._allocs[instr.dest]
        self._dispatch(a, self._lane(a), _reduce, instr.count * 8, src, dst, instr.count, instr.op,
                       instr.include_dest)

    def _issue_fence(self, a: Assignment) -> None:
        instr: FenceInstruction = a.instruction
        t0 = _perf_ns()
        result = None
        try:
            if instr.allocation is not None:
                arr = self._allocs.pop(instr.allocation)
                self._forget_views()
                memory = self._backend_allocs.pop(instr.allocation, None)
                result = self._backend.hand_over(memory, arr) if memory is not None else arr
            elif instr.host_object is not None:
                result = snapshot_host_object(self._host_objects[instr.host_object], instr.host_object,
                                              instr.task, self._copy_host_object)
        except BaseException as exc:
            if instr.promise is not None:   # never leave the user waiting on it
                _set_promise(instr.promise, error=exc)
            raise
        if instr.promise is not None:
            if self._fence_error is not None:
                _set_promise(instr.promise, error=self._fence_error)
            else:
                _set_promise(instr.promise, result=result)
        self._complete_sync(instr, "immediate", t0)

    def _issue_destroy_host_object(self, a: Assignment) -> None:
        instr: DestroyHostObjectInstruction = a.instruction
        t0 = _perf_ns()
        self._host_objects.pop(instr.host_object, None)
        self._complete_sync(instr, "immediate", t0)

    def _issue_clone_collective_group(self, a: Assignment) -> None:
        instr: CloneCollectiveGroupInstruction = a.instruction
        t0 = _perf_ns()
        self._clone(self._groups.get(instr.original, self._comm), instr.new)
        self._complete_sync(instr, "immediate", t0)

    def _collect_garbage(self, garbage: list[int]) -> None:
        for aid in garbage:
            arr = self._allocs.pop(aid, None)
            self._forget_views()
            memory = self._backend_allocs.pop(aid, None)
            if arr is not None and memory is not None:
                self._backend.hand_over(memory, arr)

    def _issue_horizon(self, a: Assignment) -> None:
        instr: HorizonInstruction = a.instruction
        t0 = _perf_ns()
        self._horizon_work(instr)
        self._complete_sync(instr, "immediate", t0)
        if self._on_horizon is not None:
            self._callback(self._on_horizon, instr)

    def _horizon_work(self, instr: HorizonInstruction) -> None:
        """What a horizon does, through the engine (``_issue_horizon``) or straight from its
        batch (``Executor._direct_horizon``): drop the user allocations it names, prune the
        arbiter's record of tasks before it."""
        if instr.garbage:
            self._collect_garbage(instr.garbage)
        self._arbiter.prune(instr.task)

    def _issue_epoch(self, a: Assignment) -> None:
        instr: EpochInstruction = a.instruction
        t0 = _perf_ns()
        if self._epoch_check is not None and not self._epoch_verified(instr):
            self._unverified_epoch = (instr, t0)   # completes once the peers' streams matched
            return
        self._run_epoch(instr, t0)

    def _run_epoch(self, instr: EpochInstruction, t0: int) -> None:
        if instr.action == "barrier" and self._inflight > 0 and not self._failed:
            # everything the epoch depends on is complete, but unrelated sends/receives
            # may still be in flight: block in the barrier only once they are done
            self._deferred_barrier = (instr, t0)
            return
        self._finish_epoch(instr, t0)

    def _finish_epoch(self, instr: EpochInstruction, t0: int) -> None:
        self._collect_garbage(instr.garbage)
        self._arbiter.prune(instr.task)
        if instr.action == "barrier" and not self._failed:   # peers may never come: no barrier
            self._blocked_in = f"in the barrier of epoch T{instr.task}, until every rank reaches it"
            try:
                self._comm.barrier()
            except Exception as exc:  # noqa: BLE001 - e.g. the cluster was aborted
                self._report(exc, instr)
            finally:
                self._blocked_in = None
        self._complete_sync(instr, "immediate", t0)
        if self._on_epoch is not None:
            self._callback(self._on_epoch, instr)
        if instr.action == "shutdown":
            self._stop = True


# ---------------------------------------------------------------------- helpers

def _alloc_layout(instr: AllocInstruction) -> tuple[tuple[int, ...], Any]:
    """Shape and dtype of an allocation: explicit shape, else the box, else raw bytes."""
    dtype = instr.dtype if instr.dtype is not None else np.uint8
    shape = tuple(instr.shape)
    if not shape:
        if instr.box is not None and instr.box.dims > 0:
            shape = instr.box.range
        elif instr.box is None and instr.size_bytes:
            shape = (instr.size_bytes // np.dtype(dtype).itemsize,)
    return shape, dtype


def _assign(dst: Any, src: Any) -> None:
    dst[...] = src


def _reduce(src: Any, dst: Any, count: int, op: Any, include_dest: bool) -> None:
    s = src.reshape(-1)[:count]
    d = dst.reshape(-1)
    if count:
        # in the buffer's dtype: numpy reduces small integers in a wider accumulator, whose
        # result then did not fit back (integer reductions wrap, as the partials did)
        dt = d.dtype if d.dtype.isnative else d.dtype.newbyteorder("=")   # (ufuncs take no byte order)
        try:
            r = op.reduce(s, dtype=dt)
            if include_dest:
                r = op(d[0], r, dtype=dt)
        except TypeError:
            # an op whose loop returns another type (logical_and of int64: bool) has no loop
            # in the buffer's dtype: reduced as numpy does, then cast back (as Reducer.combine)
            r = op.reduce(s)
            if include_dest:
                r = op(d[0], r)
            r = np.asarray(r).astype(dt)[()]
    elif include_dest:
        return
    else:
        r = getattr(op, "identity", None)
        if r is None:
            raise ValueError(f"reduction of zero values with {op!r}, which has no identity")
    d[0] = r


def snapshot_host_object(obj: Any, hoid: int, task: int, copier: Any = copy.deepcopy) -> Any:
    """A fence's view of host object ``hoid``: a deep copy taken now (``copier(obj)``), so
    host tasks that run after the fence do not change what the fence's result shows.
    Whatever the copy raises, BaseExceptions too (a ``__deepcopy__`` is user code), becomes
    the fence's CeleritasError naming the host object."""
    try:
        return copier(obj)
    except CeleritasError as exc:   # (the runtime's copier refuses queue calls: its message says why)
        raise CeleritasError(f"fence of host object H{hoid} (task T{task}): {exc}") from exc
    except BaseException as exc:  # noqa: BLE001 - e.g. an object holding a lock or an open file
        raise CeleritasError(f"fence of host object H{hoid} (task T{task}): its "
                             f"{type(obj).__name__} cannot be copied for the fence's snapshot "
                             f"(copy.deepcopy: {type(exc).__name__}: {exception_text(exc)}); give the class a "
                             f"__deepcopy__ that copies what the fence should show") from exc


def _set_promise(promise: Any, *, result: Any = None, error: BaseException | None = None) -> None:
    try:
        if promise.done():
            return
        if error is not None:
            promise.set_exception(error)
        else:
            promise.set_result(result)
    except Exception:  # noqa: BLE001 - cancelled / already resolved by someone else
        log.debug("fence promise could not be resolved", exc_info=True)
