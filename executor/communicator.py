"""Communicators: how a rank's executor talks to the other ranks.

Two message classes travel between ranks: *pilots* (small, announce a send so the
receiver can match it to a receive instruction before the data arrives) and
*payloads* (the data of one send, identified by ``(sender, msg_id)``).  The MPI
implementation (mpi4py) comes later; this module pins the interface and provides
a single-rank communicator and an in-process cluster that connects one
communicator per rank through thread-safe mailboxes, so a whole cluster can run
in one interpreter (one thread per rank).
"""
from __future__ import annotations

import abc
import functools
import logging
import operator
import pickle
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import numpy as np

from scheduler.instruction_graph import Pilot

# how long (s) a shutdown or barrier epoch waits for every peer's matching epoch before the
# divergence check gives up (the MPI and the in-memory channels alike; CELERITAS_DIVERGENCE_TIMEOUT)
DEFAULT_DIVERGENCE_TIMEOUT = 300.0

log = logging.getLogger("celeritas.executor")


class CommunicatorError(RuntimeError):
    """A message could not be delivered, or the cluster was aborted."""


class Request(abc.ABC):
    """A non-blocking payload send or receive."""

    @abc.abstractmethod
    def test(self) -> bool:
        """True once complete; raises CommunicatorError if it failed."""

    def wait(self, timeout: float | None = None) -> bool:
        """Block until complete (tests/teardown only); False on timeout."""
        raise NotImplementedError


class Communicator(abc.ABC):
    """One rank's endpoint.

    ``notifies``: the communicator calls the notifier registered with
    ``set_notifier`` whenever a pilot arrives for this rank or one of its
    requests completes, so the executor may block instead of polling.
    ``accepts_strided``: ``send_payload``/``receive_payload`` accept
    non-contiguous numpy views (saves a staging copy); otherwise callers pass
    contiguous arrays.
    ``cuda_aware``: payloads may live in CUDA device memory (True), may not
    (False), or nobody can tell (None); decides ``CELERITAS_MPI_DEVICE_MEMORY=auto``.
    ``settings_may_differ``: each rank is a process of its own that reads its own
    environment (MPI), so the runtime checks at start-up that the ranks agree on the
    settings that must be alike; the ranks of an in-process cluster share theirs.

    A communicator that does not notify is polled by the executor, on its own
    thread, through ``poll_pilots`` and its requests' ``test``, while sends or
    receives are outstanding: ``poll_spin`` (s) is how long the executor keeps
    polling without pause once nothing else is left to do (the other ranks'
    answer is then the critical path), after which it sleeps between polls,
    from ``poll_min`` growing to ``poll_max`` (s) while nothing arrives.
    """

    notifies: bool = False
    accepts_strided: bool = False
    settings_may_differ: bool = False
    cuda_aware: bool | None = False
    poll_spin: float = 0.0
    poll_min: float = 20e-6
    poll_max: float = 1e-3

    @property
    @abc.abstractmethod
    def rank(self) -> int: ...

    @property
    @abc.abstractmethod
    def num_ranks(self) -> int: ...

    @abc.abstractmethod
    def send_pilot(self, to: int, pilot: Pilot) -> None:
        """Non-blocking; pilots from one sender to one receiver arrive in order."""

    def send_pilots(self, pilots: list[Pilot]) -> None:
        """``send_pilot`` for each, to its ``to``, in order (a batch's pilots: an
        implementation may send those to one rank together)."""
        for p in pilots:
            self.send_pilot(p.to, p)

    @abc.abstractmethod
    def poll_pilots(self) -> list[tuple[int, Pilot]]:
        """Every pilot that arrived since the last call, as (from_rank, pilot).

        Raises CommunicatorError once communication has failed for good (a peer
        died, the cluster was aborted): the executor stops with that error.
        """

    @abc.abstractmethod
    def send_payload(self, to: int, msg_id: int, array: Any) -> Request:
        """Start sending ``array``; it must stay untouched until the request completes."""

    @abc.abstractmethod
    def receive_payload(self, from_rank: int, msg_id: int, out_array: Any) -> Request:
        """Start receiving the payload ``msg_id`` of ``from_rank`` into ``out_array``."""

    @abc.abstractmethod
    def clone(self, key: Hashable | None = None) -> "Communicator":
        """A new communicator over the same ranks (one per collective group).

        Like ``MPI_Comm_dup`` every rank must clone in the same order;
        implementations that can, use ``key`` (the collective group id) to match
        clones across ranks regardless of order.
        """

    @abc.abstractmethod
    def barrier(self) -> None:
        """Blocks until every rank called it."""

    @abc.abstractmethod
    def collective_handle(self) -> Any:
        """An mpi4py-like communicator object for collective host tasks (a clone's, once
        ``clone_completed``: before that, it waits for the other ranks to clone)."""

    def clone_completed(self) -> bool:
        """Whether this clone is usable without waiting for the other ranks: never blocks.
        The executor asks before it issues a collective host task and otherwise leaves the
        wait (``wait_cloned``) to the host task's lane: a rank whose executor thread waits
        for a clone stops issuing what the other ranks may need first to reach their own
        clone (a collective of another group they are in).  Clones that are ready at once
        answer True."""
        return True

    def wait_cloned(self) -> None:
        """Block until ``clone_completed`` (a host lane, which may block; no divergence
        check meanwhile: the executor keeps doing that)."""
        while not self.clone_completed():
            time.sleep(1e-3)

    def set_notifier(self, notifier: Callable[[], None] | None) -> None:
        """See ``notifies``; ignored by polling-only communicators."""

    def close(self) -> None:
        """Release resources (standing receives, …)."""


# --------------------------------------------------------------------------------------
# requests and payload copying shared by the in-process implementations


class FlagRequest(Request):
    """A request completed by someone else (a peer thread, a progress thread), which sets
    ``_done`` and, on failure, ``_error``; ``test`` only reads the two flags."""

    __slots__ = ("_done", "_error")

    def test(self) -> bool:
        if not self._done:
            return False
        if self._error is not None:
            raise self._error
        return True


class _LocalRequest(FlagRequest):
    """Completed by whichever side of a rendezvous arrives second."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._done = False
        self._error: BaseException | None = None
        self._event: threading.Event | None = None

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done = True
        ev = self._event
        if ev is not None:
            ev.set()

    def wait(self, timeout: float | None = None) -> bool:
        if not self._done:
            if self._event is None:
                self._event = threading.Event()
                if self._done:   # raced with _finish
                    self._event.set()
            if not self._event.wait(timeout):
                return False
        return self.test()


def copy_payload(src: Any, out: Any) -> None:
    """Copy a payload into the receive buffer.

    Same dtype and element count: an element-wise copy (``out`` may be a strided
    view).  Otherwise a byte copy, which is how gather slots (raw bytes) receive
    typed partial results.
    """
    if src.dtype == out.dtype and src.size == out.size:
        out[...] = src.reshape(out.shape)
        return
    if not out.flags.c_contiguous:
        raise CommunicatorError(f"payload of dtype {src.dtype} cannot be received into a "
                                f"non-contiguous {out.dtype} view")
    ob = out.reshape(-1).view(np.uint8)
    sb = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
    if ob.size != sb.size:
        raise CommunicatorError(f"payload of {sb.size} bytes does not fit a receive buffer of {ob.size} bytes")
    ob[...] = sb


# --------------------------------------------------------------------------------------
# collective handles (mpi4py-like lowercase API)


class _CollectiveGroup:
    """Shared state of one communicator key: a reusable barrier and exchange slots."""

    __slots__ = ("barrier", "slots")

    def __init__(self, num_ranks: int):
        self.barrier = threading.Barrier(num_ranks)
        self.slots: list[Any] = [None] * num_ranks


def _copy_obj(obj: Any) -> Any:
    """What mpi4py's pickling gives: the receiver never aliases the sender's object."""
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


class InProcessCollective:
    """mpi4py-like collectives among the rank threads of an in-process cluster.

    ``op`` arguments are binary callables (default ``operator.add``), standing
    in for ``MPI.SUM`` and friends.
    """

    def __init__(self, group: _CollectiveGroup, rank: int, size: int, timeout: float | None):
        self._group = group
        self._rank = rank
        self._size = size
        self._timeout = timeout

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py spelling
        return self._rank

    def Get_size(self) -> int:  # noqa: N802 - mpi4py spelling
        return self._size

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def _exchange(self, obj: Any) -> list[Any]:
        g = self._group
        g.slots[self._rank] = obj
        try:
            g.barrier.wait(self._timeout)       # everyone has written
            values = list(g.slots)
            g.barrier.wait(self._timeout)       # everyone has read: slots may be reused
        except threading.BrokenBarrierError as exc:
            raise CommunicatorError("collective aborted (another rank failed or timed out)") from exc
        return values

    def barrier(self) -> None:
        self._exchange(None)

    Barrier = barrier

    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        v = self._exchange(obj if self._rank == root else None)[root]
        return v if self._rank == root else _copy_obj(v)

    def allgather(self, obj: Any) -> list[Any]:
        vals = self._exchange(obj)
        return [v if i == self._rank else _copy_obj(v) for i, v in enumerate(vals)]

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        vals = self._exchange(obj)
        if self._rank != root:
            return None
        return [v if i == self._rank else _copy_obj(v) for i, v in enumerate(vals)]

    def allreduce(self, obj: Any, op: Callable[[Any, Any], Any] | None = None) -> Any:
        return _reduced(self._exchange(obj), op)

    def reduce(self, obj: Any, op: Callable[[Any, Any], Any] | None = None, root: int = 0) -> Any:
        r = self.allreduce(obj, op)
        return r if self._rank == root else None

    def scan(self, obj: Any, op: Callable[[Any, Any], Any] | None = None) -> Any:
        """The reduction of the objects of ranks 0 to this one, in rank order."""
        return _reduced(self._exchange(obj)[:self._rank + 1], op)

    def exscan(self, obj: Any, op: Callable[[Any, Any], Any] | None = None) -> Any:
        """The reduction of the objects of the ranks before this one (None on rank 0)."""
        vals = self._exchange(obj)[:self._rank]
        return _reduced(vals, op) if vals else None


def _reduced(vals: list, op: Callable[[Any, Any], Any] | None) -> Any:
    """``vals`` (copies, as received) reduced by ``op`` (default ``+``) in rank order."""
    return functools.reduce(op or operator.add, [_copy_obj(v) for v in vals])


# --------------------------------------------------------------------------------------
# single rank


class SingleRankCommunicator(Communicator):
    """The communicator of a one-rank run: there is nobody to talk to."""

    notifies = True          # nothing ever arrives, so waiting never needs polling
    accepts_strided = True
    cuda_aware = True        # nothing is ever sent, from any memory

    def __init__(self) -> None:
        self._collective = InProcessCollective(_CollectiveGroup(1), 0, 1, None)

    @property
    def rank(self) -> int:
        return 0

    @property
    def num_ranks(self) -> int:
        return 1

    def send_pilot(self, to: int, pilot: Pilot) -> None:
        raise CommunicatorError(f"single-rank communicator cannot send a pilot to rank {to}")

    def poll_pilots(self) -> list[tuple[int, Pilot]]:
        return []

    def send_payload(self, to: int, msg_id: int, array: Any) -> Request:
        raise CommunicatorError(f"single-rank communicator cannot send a payload to rank {to}")

    def receive_payload(self, from_rank: int, msg_id: int, out_array: Any) -> Request:
        raise CommunicatorError(f"single-rank communicator cannot receive from rank {from_rank}")

    def clone(self, key: Hashable | None = None) -> "SingleRankCommunicator":
        return SingleRankCommunicator()

    def barrier(self) -> None:
        pass

    def collective_handle(self) -> InProcessCollective:
        return self._collective


# --------------------------------------------------------------------------------------
# in-process cluster


@dataclass(slots=True)
class _Posted:
    array: Any
    request: _LocalRequest
    rank: int          # whose request it is (for the notifier)


@dataclass(slots=True)
class _ClusterState:
    num_ranks: int
    timeout: float | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    pilots: dict[tuple, deque] = field(default_factory=dict)             # (key, to) -> deque
    sends: dict[tuple, _Posted] = field(default_factory=dict)            # (key, from, to, msg)
    recvs: dict[tuple, _Posted] = field(default_factory=dict)
    notifiers: dict[tuple, Callable[[], None]] = field(default_factory=dict)  # (key, rank)
    groups: dict[tuple, _CollectiveGroup] = field(default_factory=dict)
    epochs: dict[tuple, deque] = field(default_factory=dict)             # (from, to) -> epoch announcements
    divergence_timeout: float | None = None
    divergence_timeout_hint: str | None = None    # where users set it, named in the timeout error
    aborted: bool = False


class InProcessCluster:
    """``num_ranks`` communicators connected in memory; one thread per rank uses each.

    ``timeout`` bounds barriers and collectives (None: wait forever); ``abort()``
    breaks every waiting barrier so a failed rank cannot hang the others.
    """

    def __init__(self, num_ranks: int, *, timeout: float | None = None,
                 divergence_timeout: float | None = DEFAULT_DIVERGENCE_TIMEOUT,
                 divergence_timeout_hint: str | None = None):
        if num_ranks < 1:
            raise ValueError(f"a cluster needs at least one rank, got {num_ranks}")
        self._state = _ClusterState(num_ranks, timeout, divergence_timeout=divergence_timeout,
                                    divergence_timeout_hint=divergence_timeout_hint)

    @property
    def num_ranks(self) -> int:
        return self._state.num_ranks

    def communicator(self, rank: int) -> "InProcessCommunicator":
        if not 0 <= rank < self._state.num_ranks:
            raise ValueError(f"rank {rank} out of range for {self._state.num_ranks} ranks")
        comm = InProcessCommunicator(self._state, rank, ())
        if self._state.num_ranks > 1:
            # the same divergence check as under MPI, its announcements carried in memory: ranks
            # of a simulated cluster that submit different task streams get the DivergenceError
            # an MPI job gets, instead of hanging on data that never comes or finishing silently
            from .mpi.divergence import EpochCheck
            comm.epoch_check = EpochCheck(_EpochChannel(comm), rank, self._state.num_ranks,
                                          self._state.divergence_timeout,
                                          timeout_hint=self._state.divergence_timeout_hint)
        return comm

    def abort(self) -> None:
        """Fail everything in flight: barriers break, posted payload requests fail, and
        every communicator's next ``poll_pilots`` raises, so executors waiting for data
        that will never come stop with an error instead of hanging."""
        st = self._state
        with st.lock:
            st.aborted = True
            groups = list(st.groups.values())
            posted = list(st.sends.values()) + list(st.recvs.values())
            st.sends.clear()
            st.recvs.clear()
            notifiers = list(st.notifiers.values())
        for g in groups:
            g.barrier.abort()
        for p in posted:
            p.request._finish(CommunicatorError("cluster aborted"))
        for n in notifiers:
            try:
                n()
            except Exception:  # noqa: BLE001
                log.exception("notifier failed during abort")


class _Delivered:
    """An in-memory epoch message: sent at once, received whole (the mpi4py request and
    message calls ``EpochCheck`` makes)."""

    __slots__ = ("payload",)

    def __init__(self, payload: Any = None):
        self.payload = payload

    def Test(self) -> bool:  # noqa: N802 - mpi4py spelling
        return True

    def irecv(self) -> "_Delivered":
        return self

    def test(self) -> tuple[bool, Any]:
        return True, self.payload


class _EpochChannel:
    """``isend`` and ``improbe`` of the divergence check between the ranks of an in-process
    cluster: one queue per (sender, receiver)."""

    def __init__(self, comm: "InProcessCommunicator"):
        self._comm = comm
        self._st = comm._st
        self._rank = comm.rank

    def isend(self, payload: Any, dest: int, tag: int = 0) -> _Delivered:
        with self._st.lock:
            dq = self._st.epochs.setdefault((self._rank, dest), deque())
        dq.append(_copy_obj(payload))
        self._comm._notify(dest)      # (the peer's executor polls its check when woken)
        return _Delivered()

    def improbe(self, source: int, tag: int = 0) -> _Delivered | None:
        dq = self._st.epochs.get((source, self._rank))
        if not dq:
            return None
        return _Delivered(dq.popleft())


class InProcessCommunicator(Communicator):
    """Payloads use rendezvous: the side that arrives second copies the data
    straight from the send array into the receive array (no intermediate copy)
    and completes both requests."""

    notifies = True
    accepts_strided = True

    def __init__(self, state: _ClusterState, rank: int, key: tuple):
        self._st = state
        self._rank = rank
        self._key = key
        self._clones = 0
        self._inbox = state.pilots.setdefault((key, rank), deque())
        self.epoch_check = None     # (the cluster's communicator of a rank gets one: see InProcessCluster)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def num_ranks(self) -> int:
        return self._st.num_ranks

    def _check_rank(self, r: int) -> None:
        if not 0 <= r < self._st.num_ranks or r == self._rank:
            raise CommunicatorError(f"rank {self._rank} cannot talk to rank {r} "
                                    f"({self._st.num_ranks} ranks)")

    def _notify(self, rank: int) -> None:
        n = self._st.notifiers.get((self._key, rank))
        if n is not None:
            n()

    def set_notifier(self, notifier: Callable[[], None] | None) -> None:
        k = (self._key, self._rank)
        if notifier is None:
            self._st.notifiers.pop(k, None)
        else:
            self._st.notifiers[k] = notifier

    def send_pilot(self, to: int, pilot: Pilot) -> None:
        self._check_rank(to)
        if self._st.aborted:
            raise CommunicatorError("cluster aborted")
        with self._st.lock:
            dq = self._st.pilots.setdefault((self._key, to), deque())
        dq.append((self._rank, pilot))
        self._notify(to)

    def poll_pilots(self) -> list[tuple[int, Pilot]]:
        dq = self._inbox
        if not dq:
            if self._st.aborted:
                raise CommunicatorError(f"rank {self._rank}: cluster aborted")
            return []
        out = []
        pop = dq.popleft
        while dq:
            out.append(pop())
        return out

    def _rendezvous(self, table_mine: str, k: tuple, array: Any, peer: int) -> _LocalRequest:
        st = self._st
        req = _LocalRequest()
        other_table = st.recvs if table_mine == "sends" else st.sends
        with st.lock:
            if st.aborted:
                req._finish(CommunicatorError("cluster aborted"))
                return req
            other = other_table.pop(k, None)
            if other is None:
                mine = st.sends if table_mine == "sends" else st.recvs
                if k in mine:
                    raise CommunicatorError(f"duplicate {table_mine[:-1]} of message {k[1:]}")
                mine[k] = _Posted(array, req, self._rank)
                return req
        src, out = (array, other.array) if table_mine == "sends" else (other.array, array)
        err: BaseException | None = None
        try:
            copy_payload(src, out)
        except BaseException as exc:  # noqa: BLE001 - surfaces through both requests
            err = exc if isinstance(exc, CommunicatorError) else CommunicatorError(str(exc))
        other.request._finish(err)
        req._finish(err)
        self._notify(peer)
        return req

    def send_payload(self, to: int, msg_id: int, array: Any) -> Request:
        self._check_rank(to)
        return self._rendezvous("sends", (self._key, self._rank, to, msg_id), array, to)

    def receive_payload(self, from_rank: int, msg_id: int, out_array: Any) -> Request:
        self._check_rank(from_rank)
        return self._rendezvous("recvs", (self._key, from_rank, self._rank, msg_id), out_array, from_rank)

    def clone(self, key: Hashable | None = None) -> "InProcessCommunicator":
        if key is None:
            key = ("dup", self._clones)
            self._clones += 1
        return InProcessCommunicator(self._st, self._rank, self._key + (key,))

    def _group(self) -> _CollectiveGroup:
        st = self._st
        with st.lock:
            g = st.groups.get(self._key)
            if g is None:
                g = st.groups[self._key] = _CollectiveGroup(st.num_ranks)
                if st.aborted:
                    g.barrier.abort()
        return g

    def collective_handle(self) -> InProcessCollective:
        return InProcessCollective(self._group(), self._rank, self._st.num_ranks, self._st.timeout)

    def barrier(self) -> None:
        self.collective_handle().barrier()
