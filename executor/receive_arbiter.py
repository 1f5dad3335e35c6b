"""Matches inbound pilots and payloads to receive instructions, in any arrival order.

A sender announces every payload with a pilot ``{msg_id, transfer, box}``.  The
receiving rank may see that pilot before or after the receive instruction that
wants the data, and a payload may be ready before or after either.  The arbiter
buffers whichever side comes first; as soon as a pilot meets an active receive
whose region contains the pilot's box, it posts the payload receive straight into
the destination allocation at the box's offset.  Completion is decided with exact
region arithmetic: a receive is done when the union of its received boxes equals
its region, an await_receive when its sub-region is covered.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from scheduler.geometry import Box, Region
from scheduler.instruction_graph import (AwaitReceiveInstruction, GatherReceiveInstruction, Pilot,
                                         ReceiveInstruction, SplitReceiveInstruction, TransferId)

from .backends.backend import box_view
from .communicator import Communicator

log = logging.getLogger("celeritas.executor")


def _fmt(region: Region) -> str:
    """Boxes as index ranges, ``[32:64]`` / ``[0:4, 8:16]``."""
    return " ".join("[" + ", ".join(f"{lo}:{hi}" for lo, hi in zip(b.min, b.max)) + "]" for b in region)


@dataclass(slots=True, eq=False)
class ReceiveHandle:
    """The completion of one receive-like instruction (polled by the executor)."""

    instruction_id: int
    done: bool = False
    error_: BaseException | None = None

    def is_done(self) -> bool:
        return self.done

    def error(self) -> BaseException | None:
        return self.error_


@dataclass(slots=True, eq=False)
class _Request:
    """An active receive / split_receive."""

    handle: ReceiveHandle
    region: Region
    remaining: Region          # not yet received (in flight counts as not received)
    dest: Any
    dest_box: Box | None
    split: bool
    unannounced: Region        # no pilot for it taken in yet (see ReceiveArbiter.wants_pilots)
    whole: tuple | None        # (lo, hi) of the region's one box (Region.sole_bounds), else None
    allocation: int            # the destination's allocation id (ReceiveArbiter's ``view``)


@dataclass(slots=True, eq=False)
class _Gather:
    handle: ReceiveHandle
    dest_bytes: np.ndarray
    chunk_bytes: int
    # pilots still expected, plus payloads in flight: a non-empty pilot turns
    # into one in-flight payload (net 0), an empty pilot or a landed payload is -1
    outstanding: int
    num_ranks: int = 0
    landed: set = field(default_factory=set)     # ranks whose contribution is in (or that sent none)


@dataclass(slots=True, eq=False)
class _Await:
    handle: ReceiveHandle
    region: Region


@dataclass(slots=True, eq=False)
class _Fragment:
    """One payload in flight."""

    request: Any
    transfer: "_Transfer"
    box: Box | None            # None for gather fragments
    owner: Any                 # _Request or _Gather
    staging: Any = None        # contiguous buffer to copy into ``view`` on completion
    view: Any = None
    rank: int = -1             # the sender
    whole: bool = False        # ``box`` is the owner's whole region: it lands with no region arithmetic


@dataclass(slots=True, eq=False)
class _Transfer:
    tid: TransferId
    pilots: list[tuple[int, Pilot]] = field(default_factory=list)   # not yet matched
    requests: list[_Request] = field(default_factory=list)
    awaits: list[_Await] = field(default_factory=list)
    gather: _Gather | None = None
    # everything ever received for split receives of this transfer: awaits may be
    # registered after the data (or the whole split receive) completed
    split_received: Region | None = None

    def idle(self) -> bool:
        return not (self.pilots or self.requests or self.awaits or self.gather is not None)


_NOTHING = {d: Region.empty_region(d) for d in range(4)}


def _nothing(region: Region) -> Region:
    """The empty region of ``region``'s dimensionality (shared: regions are immutable)."""
    return _NOTHING[region.dims]


def _is_whole(req: _Request, box: Box) -> bool:
    """``box`` is ``req``'s whole region, a single box (a halo row's or a hop's one pilot):
    it is matched, announced and landed by comparing bounds, with no region arithmetic."""
    w = req.whole
    return w is not None and box.lo == w[0] and box.hi == w[1]


class ReceiveArbiter:
    """Per-rank matcher; driven from the executor thread only (not thread-safe).

    ``poll()`` advances in-flight payloads and returns the ids of receive-like
    instructions that completed since the last call (failed ones too: check
    ``handle.error()``).
    """

    def __init__(self, communicator: Communicator, view: Callable[[int, Box | None, Box], Any] | None = None):
        """``view(allocation, extent, box)``, where given, makes the view a payload lands in
        (the executor's, which keeps a repeating step's views; else ``box_view`` of the
        destination array each time)."""
        self._comm = communicator
        self._view = view
        self._strided_ok = communicator.accepts_strided
        self._transfers: dict[TransferId, _Transfer] = {}
        # transfers kept for their split-receive history once idle (prune() drops them);
        # every other transfer leaves ``_transfers`` as soon as it is idle (_cleanup)
        self._split_history: dict[TransferId, _Transfer] = {}
        self._inflight: list[_Fragment] = []
        self._completed: list[int] = []
        self._num_active = 0
        # handles of the receives and gathers that still wait for a pilot (wants_pilots)
        self._wanting: set[ReceiveHandle] = set()

    # ---- queries

    @property
    def has_inflight(self) -> bool:
        """True while payload receives are posted (the executor must keep polling)."""
        return bool(self._inflight)

    @property
    def has_active(self) -> bool:
        """True while any receive-like instruction waits for pilots or payloads."""
        return self._num_active > 0

    @property
    def wants_pilots(self) -> bool:
        """True while an active receive (or gather) lacks a pilot for part of its region:
        only then is it worth taking in pilots.  One whose every box is in flight waits
        for payloads alone, and a receive issued later takes in what arrived meanwhile.
        (The ping-pong's pilots travel ahead of their payloads, so most of its waits
        are for a payload: looking at the pilot ring as well cost a rank ~2 ring polls a
        hop.)"""
        return bool(self._wanting)

    def _transfer(self, tid: TransferId) -> _Transfer:
        t = self._transfers.get(tid)
        if t is None:
            t = self._transfers[tid] = _Transfer(tid)
        return t

    # ---- inbound pilots

    def on_pilot(self, from_rank: int, pilot: Pilot) -> None:
        t = self._transfer(tuple(pilot.transfer))
        if not self._match(t, from_rank, pilot):
            t.pilots.append((from_rank, pilot))

    def _match(self, t: _Transfer, from_rank: int, pilot: Pilot) -> bool:
        g = t.gather
        if g is not None:
            self._begin_gather_fragment(t, g, from_rank, pilot)
            return True
        box = pilot.box
        for req in t.requests:
            whole = _is_whole(req, box)
            if whole or req.region.contains(box):
                self._begin_fragment(t, req, from_rank, pilot, whole)
                return True
        return False

    def _begin_fragment(self, t: _Transfer, req: _Request, from_rank: int, pilot: Pilot, whole: bool) -> None:
        """``whole``: the pilot's box is the receive's whole region (``_is_whole``)."""
        box = pilot.box
        if whole:           # (a halo's one message: no region arithmetic here or when it lands)
            req.unannounced = _nothing(req.region)
            self._wanting.discard(req.handle)
        else:
            if box.empty:  # nothing will be sent for it
                return
            unannounced = req.unannounced = req.unannounced - box
            if not unannounced:
                self._wanting.discard(req.handle)
        try:
            view = (box_view(req.dest, req.dest_box, box) if self._view is None
                    else self._view(req.allocation, req.dest_box, box))
            if self._strided_ok or view.flags.c_contiguous:
                staging = None
                target = view
            else:
                staging = np.empty(view.shape, dtype=view.dtype)
                target = staging
            request = self._comm.receive_payload(from_rank, pilot.msg_id, target)
        except Exception as exc:  # noqa: BLE001 - reported through the instruction
            self._fail(req.handle, exc)
            return
        self._inflight.append(_Fragment(request, t, box, req, staging, view, from_rank, whole))

    def _begin_gather_fragment(self, t: _Transfer, g: _Gather, from_rank: int, pilot: Pilot) -> None:
        if pilot.box.empty:   # "no contribution": the slot keeps its identity value
            g.landed.add(from_rank)
            g.outstanding -= 1
            self._check_gather(t, g)
            return
        cb = g.chunk_bytes
        try:
            slot = g.dest_bytes[from_rank * cb:(from_rank + 1) * cb]
            if slot.size != cb:
                raise ValueError(f"gather slot of rank {from_rank} lies outside the destination "
                                 f"({g.dest_bytes.size} bytes, {cb} per rank)")
            request = self._comm.receive_payload(from_rank, pilot.msg_id, slot)
        except Exception as exc:  # noqa: BLE001
            self._fail(g.handle, exc)
            return
        self._inflight.append(_Fragment(request, t, None, g, rank=from_rank))

    # ---- receive instructions

    def begin_receive(self, instr: ReceiveInstruction, dest: Any) -> ReceiveHandle:
        """``instr`` is a ReceiveInstruction or SplitReceiveInstruction; ``dest`` its allocation."""
        split = isinstance(instr, SplitReceiveInstruction)
        handle = self._new_handle(instr.id)
        region = instr.region
        req = _Request(handle, region, region, dest, instr.dest_box, split, region, region.sole_bounds(), instr.dest)
        t = self._transfer(tuple(instr.transfer))
        if split and t.split_received is None:
            t.split_received = Region.empty_region(region.dims)
            self._split_history[t.tid] = t
        if region.empty:
            self._finish(handle)
        else:
            t.requests.append(req)
            self._wanting.add(handle)
            if t.pilots:
                pending, t.pilots = t.pilots, []
                for fr, p in pending:
                    whole = _is_whole(req, p.box)
                    if req.handle.done or not (whole or req.region.contains(p.box)):
                        t.pilots.append((fr, p))
                    else:
                        self._begin_fragment(t, req, fr, p, whole)
        if split:
            self._check_awaits(t)
        self._cleanup(t)
        return handle

    def await_receive(self, instr: AwaitReceiveInstruction) -> ReceiveHandle:
        handle = self._new_handle(instr.id)
        t = self._transfer(tuple(instr.transfer))
        t.awaits.append(_Await(handle, instr.region))
        self._check_awaits(t)
        self._cleanup(t)
        return handle

    def begin_gather(self, instr: GatherReceiveInstruction, dest: Any) -> ReceiveHandle:
        handle = self._new_handle(instr.id)
        t = self._transfer(tuple(instr.transfer))
        if t.gather is not None:
            self._fail(handle, RuntimeError(f"two gather receives for transfer {t.tid} at once"))
            return handle
        try:
            flat = dest.reshape(-1)
            dest_bytes = flat.view(np.uint8)
            if not np.shares_memory(dest_bytes, dest):
                raise ValueError("gather destination must be a contiguous allocation")
        except Exception as exc:  # noqa: BLE001
            self._fail(handle, exc)
            return handle
        g = _Gather(handle, dest_bytes, instr.chunk_bytes, instr.num_ranks - 1, instr.num_ranks)
        t.gather = g
        self._wanting.add(handle)        # (until it completes: a gather's pilots are few)
        pending, t.pilots = t.pilots, []
        for fr, p in pending:
            self._begin_gather_fragment(t, g, fr, p)
        self._check_gather(t, g)
        self._cleanup(t)
        return handle

    def _new_handle(self, instruction_id: int) -> ReceiveHandle:
        self._num_active += 1
        return ReceiveHandle(instruction_id)

    # ---- progress

    def poll(self) -> list[int]:
        """Test in-flight payloads; returns ids of receive-like instructions now complete."""
        if self._inflight:
            still = []
            for f in self._inflight:
                try:
                    done = f.request.test()
                except Exception as exc:  # noqa: BLE001
                    self._fail(f.owner.handle, exc)
                    continue
                if not done:
                    still.append(f)
                    continue
                self._land(f)
            self._inflight = still
        out = self._completed
        self._completed = []
        return out

    def _land(self, f: _Fragment) -> None:
        t = f.transfer
        owner = f.owner
        if owner.handle.done:                   # failed earlier
            return
        if f.box is None:                       # gather fragment
            owner.landed.add(f.rank)
            owner.outstanding -= 1
            self._check_gather(t, owner)
            return
        if f.staging is not None:
            try:
                f.view[...] = f.staging
            except Exception as exc:  # noqa: BLE001
                self._fail(owner.handle, exc)
                return
        owner.remaining = _nothing(owner.region) if f.whole else owner.remaining - f.box
        if owner.split:
            t.split_received = t.split_received | f.box
            self._check_awaits(t)
        if not owner.remaining and not owner.handle.done:
            self._finish(owner.handle)
            t.requests.remove(owner)
        self._cleanup(t)

    def _check_gather(self, t: _Transfer, g: _Gather) -> None:
        if g.outstanding > 0 or g.handle.done:
            return
        self._finish(g.handle)
        t.gather = None
        self._cleanup(t)

    def _check_awaits(self, t: _Transfer) -> None:
        if not t.awaits or t.split_received is None:
            return
        got = t.split_received
        keep = []
        for a in t.awaits:
            if a.region.difference(got):
                keep.append(a)
            else:
                self._finish(a.handle)
        t.awaits = keep

    def _finish(self, handle: ReceiveHandle) -> None:
        handle.done = True
        self._num_active -= 1
        self._completed.append(handle.instruction_id)
        if self._wanting:
            self._wanting.discard(handle)

    def _fail(self, handle: ReceiveHandle, exc: BaseException) -> None:
        log.debug("receive instruction I%d failed: %s", handle.instruction_id, exc)   # reported by the executor
        if handle.done:
            return
        handle.error_ = exc
        self._finish(handle)

    def _cleanup(self, t: _Transfer) -> None:
        # split history must outlive the split receive (late awaits); prune() drops it
        if t.idle() and t.split_received is None:
            self._transfers.pop(t.tid, None)

    def prune(self, before_task: int) -> None:
        """Forget finished split-receive history of transfers of tasks before ``before_task``.

        Called when a horizon/epoch for ``before_task`` completed: every await of
        an older transfer has completed by then.
        """
        history = self._split_history
        if not history:
            return
        transfers = self._transfers
        for tid in [tid for tid, t in history.items() if tid[0] < before_task and t.idle()]:
            del history[tid]
            transfers.pop(tid, None)

    def describe(self, instruction_id: int, label: Callable[[int], str]) -> str | None:
        """What receive-like instruction ``instruction_id`` still waits for, and from which
        ranks where that is known (diagnostics; ``label`` names a buffer id)."""
        me = self._comm.rank
        for t in list(self._transfers.values()):
            task, buf, red = t.tid
            what = f"{label(buf)} for task T{task}" + (f" (reduction {red})" if red else "")
            for req in list(t.requests):
                if req.handle.instruction_id == instruction_id:
                    senders = sorted({f.rank for f in list(self._inflight) if f.owner is req})
                    src = (f"arriving from rank(s) {senders}" if senders else
                           "no rank has announced it yet")
                    return f"receive of {what}: {_fmt(req.remaining)} still missing, {src}"
            for a in list(t.awaits):
                if a.handle.instruction_id == instruction_id:
                    return f"await of {what}: {_fmt(a.region)} not yet received"
            g = t.gather
            if g is not None and g.handle.instruction_id == instruction_id:
                missing = sorted(set(range(g.num_ranks)) - g.landed - {me})
                return f"partial results of {what} from rank(s) {missing}"
        return None

    def unmatched_pilots(self) -> list[tuple[int, Pilot]]:
        """Pilots that no receive has claimed yet (diagnostics)."""
        return [p for t in self._transfers.values() for p in t.pilots]
