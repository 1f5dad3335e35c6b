"""The executor's wait policy with a communicator that cannot notify (MPI).

The executor polls such a communicator itself, on its own thread, only while
sends or receives are outstanding: without pause for ``poll_spin`` once nothing
else is in flight, else sleeping between polls from ``poll_min`` growing by a
quarter up to ``poll_max``; with nothing outstanding it sleeps until woken.
A scripted communicator delivers its pilot after a given number of polls, so
every assertion is about counts and the timeouts the loop asked for, never
about measured times.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from executor.backends import HostBackend
from executor.communicator import Communicator, CommunicatorError, FlagRequest, InProcessCollective, Request
from executor.communicator import _CollectiveGroup
from executor.executor import Executor, _Inbox
from scheduler.geometry import Box, Region
from scheduler.instruction_graph import (HOST_MEMORY, AccessAllocation, AllocInstruction,
                                         DeviceKernelInstruction, EpochInstruction, FenceInstruction,
                                         FreeInstruction, Pilot, ReceiveInstruction, SendInstruction,
                                         device_memory)

from instruction_builder import Graph  # tests/ is on sys.path (conftest)

pytestmark = pytest.mark.timeout(60)
TIMEOUT = 20
BOX = Box((0,), (4,))
IDLE = 7.0          # the executor's idle timeout: a wait with it is not a poll


class RecordingInbox(_Inbox):
    """The executor's inbox, recording the timeout of every wait."""

    __slots__ = ("waits",)

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float) -> None:
        self.waits.append(timeout)
        super().wait(timeout)


class _Done(FlagRequest):
    def __init__(self) -> None:
        self._done = True
        self._error = None


class ScriptedComm(Communicator):
    """Rank 0 of two; rank 1's pilot for transfer (1, 0, 0) arrives at poll ``arrive_after``
    (counting ``poll_pilots`` calls), its payload at once after that."""

    notifies = False
    accepts_strided = True

    def __init__(self, *, spin: float, pmin: float, pmax: float, arrive_after: int,
                 on_arrival: threading.Event | None = None):
        self.poll_spin, self.poll_min, self.poll_max = spin, pmin, pmax
        self.arrive_after = arrive_after
        self.on_arrival = on_arrival
        self.polls = 0
        self.payload = np.arange(4.0) + 10

    @property
    def rank(self) -> int:
        return 0

    @property
    def num_ranks(self) -> int:
        return 2

    def send_pilot(self, to: int, pilot: Pilot) -> None:
        raise CommunicatorError("not scripted")

    def poll_pilots(self) -> list[tuple[int, Pilot]]:
        self.polls += 1
        if self.polls != self.arrive_after:
            return []
        if self.on_arrival is not None:
            self.on_arrival.set()
        return [(1, Pilot(msg_id=7, to=0, transfer=(1, 0, 0), box=BOX))]

    def send_payload(self, to: int, msg_id: int, array: Any) -> FlagRequest:
        raise CommunicatorError("not scripted")

    def receive_payload(self, from_rank: int, msg_id: int, out_array: Any) -> FlagRequest:
        assert (from_rank, msg_id) == (1, 7)
        out_array[...] = self.payload
        return _Done()

    def clone(self, key=None) -> "ScriptedComm":
        return self

    def barrier(self) -> None:
        pass

    def collective_handle(self) -> InProcessCollective:
        return InProcessCollective(_CollectiveGroup(1), 0, 1, None)


def _execute(comm: Communicator, build, costs=None, quiet: float = 2e-3,
             network_waits_ns: int = 0) -> tuple[Executor, list[float], np.ndarray]:
    """Run ``build(g, init, alloc)``'s instructions (a host allocation of ``BOX`` made
    first), then fence the allocation after what it returned; ``costs``: kernel cost
    estimates to start from (name -> ns, for a 1-element chunk); ``quiet``: the executor's
    ``inline_quiet_threshold`` (by default the alone threshold: the kernels these tests
    estimate at a few ms, to keep lane work in flight, run on their lanes);
    ``network_waits_ns``: how long the executor's recent waits for the network took, as if learned.

    Returns the executor (joined; ``in_flight``: the kinds it tracked as in flight), the
    timeouts of every inbox wait, the fence result."""
    backend = HostBackend(1)
    errors = []
    ex = Executor(backend, comm, idle_timeout=IDLE, on_error=lambda e, i: errors.append(e),
                  inline_quiet_threshold=quiet)
    for name, ns in (costs or {}).items():
        ex._costs[(name, 1)] = ns
    ex._idle_estimate = network_waits_ns
    inbox = ex._inbox = RecordingInbox()
    ex.in_flight = []
    start = ex._start_async

    def started(instr, lane, completion):
        ex.in_flight.append(instr.kind)
        return start(instr, lane, completion)

    ex._start_async = started
    g = Graph()
    init = g.add(EpochInstruction, task=0, action="init")
    a = g.add(AllocInstruction, init, allocation=1, memory=HOST_MEMORY, box=BOX, shape=(4,), dtype=np.float64)
    last = build(g, init, a)
    fut = Future()
    fence = g.add(FenceInstruction, *last, task=3, promise=fut, allocation=1)
    g.add(EpochInstruction, fence, task=4, action="shutdown")
    try:
        ex.start()
        ex.submit(g.batch())
        result = fut.result(TIMEOUT)
        assert ex.join(TIMEOUT)
    finally:
        backend.close()
    assert errors == []
    return ex, inbox.waits, result


def run(comm: ScriptedComm, extra=None, costs=None, **kw) -> tuple[Executor, list[float], np.ndarray]:
    """Receive rank 1's box into host memory and fence it; ``extra(g, init)`` adds work
    (see ``_execute``)."""
    def build(g, init, a):
        last = [g.add(ReceiveInstruction, a, transfer=(1, 0, 0), region=Region.from_box(BOX), dest=1,
                      dest_box=BOX, dtype=np.float64)]
        if extra is not None:
            last.append(extra(g, init))
        return last

    return _execute(comm, build, costs, **kw)


def polling_waits(waits: list[float]) -> list[float]:
    return [w for w in waits if w != IDLE]


def assert_sleeps_within_part_of_the_wait(got: list[float], poll_max: float, parts: int) -> None:
    """Each sleep is at most ``poll_max`` or the ``parts``-th part of the wait so far (plus
    50 ms of slack for the time the loop spent between waits)."""
    elapsed = 0.0
    for w in got:
        assert w <= max(poll_max, (elapsed + 0.05) / parts) + 1e-9
        elapsed += w


def test_idle_rank_polls_without_pause_while_it_spins():
    comm = ScriptedComm(spin=60.0, pmin=1e-3, pmax=4e-3, arrive_after=300)
    _ex, waits, result = run(comm)
    np.testing.assert_array_equal(result, comm.payload)
    assert comm.polls >= 300
    assert polling_waits(waits) == []           # 300 polls, not one sleep between them


def test_without_spin_the_sleeps_between_polls_grow_by_a_quarter_up_to_the_cap():
    comm = ScriptedComm(spin=0.0, pmin=1e-3, pmax=4e-3, arrive_after=20)
    _ex, waits, result = run(comm)
    np.testing.assert_array_equal(result, comm.payload)
    got = polling_waits(waits)
    assert len(got) >= 10
    expected = [min(1e-3 * 1.25 ** i, 4e-3) for i in range(len(got))]
    np.testing.assert_allclose(got, expected)
    assert max(got) == 4e-3


def test_spin_gives_way_to_sleeps_once_its_time_is_up():
    comm = ScriptedComm(spin=1e-9, pmin=1e-3, pmax=2e-3, arrive_after=40)
    _ex, waits, result = run(comm)
    np.testing.assert_array_equal(result, comm.payload)
    got = polling_waits(waits)
    np.testing.assert_allclose(got[:5], [1e-3, 1.25e-3, 1.5625e-3, 1.953125e-3, 2e-3])


def _lane_kernel(launcher, name: str):
    """``extra`` for ``run``: a kernel on a device lane (known to be long, so not run inline)."""
    def kernel(g, after):
        box = Box((0,), (1,))
        k_alloc = g.add(AllocInstruction, after, allocation=2, memory=device_memory(0), box=box, shape=(1,),
                        dtype=np.float64)
        k = g.add(DeviceKernelInstruction, k_alloc, device=0, task=2, box=box,
                  accesses=[AccessAllocation(buffer=1, allocation=2, allocation_box=box, box=box)],
                  launcher=launcher, name=name)
        return g.add(FreeInstruction, k, allocation=2, memory=device_memory(0))
    return kernel


def test_while_lane_work_is_in_flight_it_polls_rarely_and_never_spins():
    """A kernel on a device lane (known to be long, so not run inline) blocks until the
    pilot arrived: meanwhile the loop sleeps between polls from a
    quarter of ``poll_max`` up to ``poll_max``, and does not spin, even with an endless spin time."""
    arrived = threading.Event()
    comm = ScriptedComm(spin=60.0, pmin=1e-4, pmax=4e-3, arrive_after=12, on_arrival=arrived)
    ran = []
    kernel = _lane_kernel(lambda ctx: ran.append(arrived.wait(TIMEOUT)), "blocks")
    # (3 ms: past the inline thresholds, an eighth of it below poll_max / 4)
    _ex, waits, result = run(comm, kernel, costs={"blocks": 3 * 10 ** 6})
    np.testing.assert_array_equal(result, comm.payload)
    assert ran == [True]
    got = polling_waits(waits)
    assert len(got) >= 8
    np.testing.assert_allclose(got[:8], [min(1e-3 * 1.25 ** i, 4e-3) for i in range(8)])


def _long_kernel_run(estimate_ns: int, seconds: float = 0.4) -> list[float]:
    """The polling sleeps while a lane kernel of ``seconds`` (``estimate_ns``: its kind's estimate)
    runs with a receive outstanding that arrives only after it."""
    done = threading.Event()
    comm = ScriptedComm(spin=60.0, pmin=1e-4, pmax=2e-3, arrive_after=10 ** 9)
    real_poll = comm.poll_pilots

    def poll_pilots():
        real_poll()
        return [(1, Pilot(msg_id=7, to=0, transfer=(1, 0, 0), box=BOX))] if done.is_set() else []

    comm.poll_pilots = poll_pilots
    kernel = _lane_kernel(lambda ctx: (done.wait(seconds), done.set()), "long")
    _ex, waits, result = run(comm, kernel, costs={"long": estimate_ns})
    np.testing.assert_array_equal(result, comm.payload)
    return polling_waits(waits)


def test_during_a_long_kernel_the_sleeps_grow_past_poll_max_to_an_eighth_of_the_wait():
    """Lane work running for 0.6 s and a receive that arrives only after it: past ``poll_max``
    the sleeps grow with the wait (at most an eighth of it), so the loop polls a few dozen
    times instead of every ``poll_max`` (300 times here).  Each poll wakes a thread the
    kernel has pushed out of the caches: 54 polls per 130 ms step of wave_sim 4096² cost
    the executor 13 ms of CPU per step."""
    # (estimated at 3 ms: the sleeps grow with the wait, not with the estimate)
    got = _long_kernel_run(3 * 10 ** 6, 0.6)
    assert max(got) > 2e-3 * 4                  # well past poll_max
    assert len(got) < 80                        # (every poll_max: 300)
    assert_sleeps_within_part_of_the_wait(got, 2e-3, 8)


def test_a_kernel_known_to_be_long_is_polled_beside_an_eighth_of_its_estimate_apart():
    """A running kernel of a kind that took 0.4 s before: the loop sleeps an eighth of that
    (50 ms) between polls from the start, instead of ramping up from ``poll_max / 4`` (each
    wake-up costs the CPU a kernel on another rank of the same cores needed: wave_sim 4096²
    on 2 ranks polled ~27 times per 90 ms kernel).  A kind that ran shorter ramps up as
    before."""
    got = _long_kernel_run(4 * 10 ** 8)
    assert got[0] == pytest.approx(0.05)
    assert all(w == pytest.approx(0.05) or w > 0.05 for w in got[:-1])
    assert len(got) <= 10                       # (0.4 s / 50 ms, and the last one cut short)
    short = _long_kernel_run(3 * 10 ** 6)       # (a kind that took 3 ms: an eighth is below poll_max / 4)
    assert short[0] == pytest.approx(5e-4)      # poll_max / 4
    assert len(short) > 2 * len(got)


def test_a_long_wait_for_the_network_alone_polls_a_32nd_of_the_wait_apart():
    """Nothing in flight but a receive whose data comes only after 0.5 s (a peer computing):
    past 32 x ``poll_max`` of waiting the sleeps grow with the wait, at most a 32nd of it,
    so the loop polls about a hundred times instead of every ``poll_max`` (250 times here),
    and sees the arrival at most ~3 % of the wait late."""
    comm = ScriptedComm(spin=0.0, pmin=1e-4, pmax=2e-3, arrive_after=10 ** 9)
    real_poll = comm.poll_pilots
    t0 = time.perf_counter()

    def poll_pilots():
        real_poll()
        return [(1, Pilot(msg_id=7, to=0, transfer=(1, 0, 0), box=BOX))] if time.perf_counter() - t0 > 0.5 else []

    comm.poll_pilots = poll_pilots
    _ex, waits, result = run(comm)
    np.testing.assert_array_equal(result, comm.payload)
    got = polling_waits(waits)
    assert max(got) > 2e-3 * 4                  # well past poll_max
    assert len(got) < 150                       # (every poll_max: 250)
    assert_sleeps_within_part_of_the_wait(got, 2e-3, 32)


def test_a_wait_for_the_network_starts_from_a_32nd_of_how_long_such_waits_took_lately():
    """Nothing in flight but a receive, on an executor whose recent waits for the network
    lasted 64 ms: the first sleep is 2 ms (a 32nd), not ``poll_min`` (a rank waiting ~40 ms
    a step for a computing peer polled ~20 times in the first 5 ms), and never above
    ``poll_max``; without such a history it starts from ``poll_min``."""
    def first_sleeps(estimate_ns: int) -> list[float]:
        comm = ScriptedComm(spin=0.0, pmin=1e-4, pmax=4e-3, arrive_after=6)
        _ex, waits, result = run(comm, network_waits_ns=estimate_ns)
        np.testing.assert_array_equal(result, comm.payload)
        return polling_waits(waits)

    np.testing.assert_allclose(first_sleeps(64 * 10 ** 6)[:3], [2e-3, 2.5e-3, 3.125e-3])
    np.testing.assert_allclose(first_sleeps(10 ** 9)[:2], [4e-3, 4e-3])    # (at most poll_max)
    np.testing.assert_allclose(first_sleeps(0)[:2], [1e-4, 1.25e-4])


class _DoneAfter(Request):
    """A send's request that completes at its ``tests``-th test (1: at once)."""

    def __init__(self, tests: int):
        self.left = tests
        self.tested = 0

    def test(self) -> bool:
        self.tested += 1
        self.left -= 1
        return self.left <= 0

    def wait(self, timeout=None) -> bool:
        return True


class SendingComm(ScriptedComm):
    """Rank 0 of two, sending: each payload's request completes at its ``tests``-th test."""

    def __init__(self, tests: int):
        super().__init__(spin=60.0, pmin=1e-4, pmax=1e-3, arrive_after=10 ** 9)
        self.tests = tests
        self.sent: list[tuple[int, int, np.ndarray, _DoneAfter]] = []

    def send_payload(self, to: int, msg_id: int, array: Any) -> _DoneAfter:
        req = _DoneAfter(self.tests)
        self.sent.append((to, msg_id, np.array(array), req))
        return req


def _send_and_fence(comm: SendingComm) -> tuple[Executor, np.ndarray]:
    """Send host rows to rank 1 and fence the allocation after the send."""
    def build(g, _init, a):
        return [g.add(SendInstruction, a, to=1, msg_id=5, transfer=(2, 0, 0), box=BOX, source=1, source_box=BOX,
                      dtype=np.float64, size_bytes=32)]

    ex, _waits, result = _execute(comm, build)
    return ex, result


def test_a_send_done_at_once_is_retired_as_it_is_issued():
    """A small message leaves in the MPI library's eager buffer, so its request is done right
    after the ``Isend``: the executor retires the send there, and what waits for it (the
    fence here; the next receive into the same rows in a halo exchange) goes in the same
    pass, with no poll of the network at all."""
    comm = SendingComm(tests=1)
    ex, _result = _send_and_fence(comm)
    ((to, msg_id, _data, req),) = comm.sent
    assert (to, msg_id, req.tested) == (1, 5, 1)
    assert "send" not in ex.in_flight and comm.polls == 0


def test_a_send_not_done_at_once_is_polled_until_it_is():
    comm = SendingComm(tests=25)
    ex, _result = _send_and_fence(comm)
    ((_to, _msg_id, _data, req),) = comm.sent
    assert req.tested == 25                     # once at issue, then at each poll until done
    assert "send" in ex.in_flight


def _kernel_beside_a_send(tests: int, estimate_ms: float) -> str:
    """The thread that ran a kernel of a kind estimated at ``estimate_ms``, issued right after
    a send (which goes first: it has the higher priority) whose request completes at its
    ``tests``-th test, on an executor with the default thresholds."""
    comm = SendingComm(tests=tests)
    ran = []
    kernel = _lane_kernel(lambda ctx: ran.append(threading.current_thread().name), "k")

    def build(g, _init, a):
        send = g.add(SendInstruction, a, to=1, msg_id=5, transfer=(2, 0, 0), box=BOX, source=1,
                     source_box=BOX, dtype=np.float64, size_bytes=32)
        return [send, kernel(g, a)]

    ex, _waits, _result = _execute(comm, build, costs={"k": int(estimate_ms * 1e6)},
                                   quiet=Executor.__init__.__kwdefaults__["inline_quiet_threshold"])
    assert len(ran) == 1
    return "executor" if ran[0] == ex._thread.name else "lane"


def test_a_kernel_of_a_few_ms_runs_inline_when_alone_and_no_send_is_in_flight():
    """Between ``inline_alone_threshold`` (2 ms) and ``inline_quiet_threshold`` (10 ms) a
    kernel runs on the executor thread when nothing else runs and no send is in flight
    (wave_sim 1024² on 2 ranks: 3.9-4.1 -> 2.7-2.8 ms of a rank's CPU per step), and on its
    lane beside a send still in flight (a large one may need this rank's progress for the
    peer to get its data); a longer one always goes to its lane."""
    assert _kernel_beside_a_send(tests=1, estimate_ms=5) == "executor"    # (the send done at once)
    assert _kernel_beside_a_send(tests=40, estimate_ms=5) == "lane"
    assert _kernel_beside_a_send(tests=1, estimate_ms=50) == "lane"
    assert _kernel_beside_a_send(tests=1, estimate_ms=1) == "executor"    # (under the alone threshold)


class CountingExecutor(Executor):
    spins = 0

    def _spin(self) -> bool:
        self.spins += 1
        return super()._spin()


def test_spin_only_while_recent_idle_waits_were_short():
    """Two receives in a row, each arriving after a few sleeps: the first idle wait spins
    (nothing is known yet), the second does not, since the first lasted longer than the
    (tiny) spin time."""
    comm = ScriptedComm(spin=1e-9, pmin=1e-4, pmax=1e-4, arrive_after=6)
    real_poll = comm.poll_pilots

    def poll_pilots():
        got = real_poll()
        if comm.polls == 40:                     # the second pilot, for transfer (2, 0, 0)
            return [(1, Pilot(msg_id=8, to=0, transfer=(2, 0, 0), box=BOX))]
        return got

    comm.poll_pilots = poll_pilots
    real_receive = comm.receive_payload

    def receive_payload(from_rank, msg_id, out_array):
        if msg_id == 8:
            out_array[...] = -comm.payload
            return _Done()
        return real_receive(from_rank, msg_id, out_array)

    comm.receive_payload = receive_payload
    backend = HostBackend(1)
    ex = CountingExecutor(backend, comm, idle_timeout=IDLE)
    g = Graph()
    init = g.add(EpochInstruction, task=0, action="init")
    a = g.add(AllocInstruction, init, allocation=1, memory=HOST_MEMORY, box=BOX, shape=(4,), dtype=np.float64)
    r1 = g.add(ReceiveInstruction, a, transfer=(1, 0, 0), region=Region.from_box(BOX), dest=1, dest_box=BOX,
               dtype=np.float64)
    f1 = Future()
    fence1 = g.add(FenceInstruction, r1, task=3, promise=f1, allocation=1)
    b = g.add(AllocInstruction, fence1, allocation=2, memory=HOST_MEMORY, box=BOX, shape=(4,), dtype=np.float64)
    r2 = g.add(ReceiveInstruction, b, transfer=(2, 0, 0), region=Region.from_box(BOX), dest=2, dest_box=BOX,
               dtype=np.float64)
    f2 = Future()
    fence2 = g.add(FenceInstruction, r2, task=5, promise=f2, allocation=2)
    g.add(EpochInstruction, fence2, task=6, action="shutdown")
    try:
        ex.start()
        ex.submit(g.batch())
        np.testing.assert_array_equal(f1.result(TIMEOUT), comm.payload)
        np.testing.assert_array_equal(f2.result(TIMEOUT), -comm.payload)
        assert ex.join(TIMEOUT)
    finally:
        backend.close()
    assert ex.spins == 1


def test_nothing_outstanding_means_no_polling_waits():
    comm = ScriptedComm(spin=60.0, pmin=1e-3, pmax=4e-3, arrive_after=1)   # the pilot is there at once
    _ex, waits, result = run(comm)
    np.testing.assert_array_equal(result, comm.payload)
    assert polling_waits(waits) == []



class _ScriptedEpochCheck:
    """The divergence check's hooks (``executor/mpi/divergence.py: EpochCheck``): the
    barrier epoch is confirmed (the neighbour's matching epoch arrived) at the
    ``confirm_after``-th ``verified`` call."""

    def __init__(self, confirm_after: int):
        self.confirm_after = confirm_after
        self.asked = 0

    def announce(self, instr) -> None:
        pass

    def poll(self, stalled: float = 0.0) -> None:
        pass

    def describe_wait(self, instr) -> str | None:
        return None

    def verified(self, instr) -> bool:
        if instr.action != "barrier":
            return True
        self.asked += 1
        return self.asked >= self.confirm_after


def test_a_barrier_epoch_waits_for_the_neighbours_epoch_as_for_the_network():
    """Waiting for the neighbour's matching epoch (divergence check) polls from poll_min,
    a quarter longer per empty poll, up to poll_max: a neighbour already there is seen
    within microseconds (the fixed 1 ms poll this replaced made every q.wait(barrier=True)
    of two ranks in step take ~1.4 ms instead of ~0.4), one that is late costs few wake-ups."""
    comm = ScriptedComm(spin=0.0, pmin=2e-5, pmax=2e-3, arrive_after=1)
    comm.epoch_check = check = _ScriptedEpochCheck(confirm_after=30)

    def build(g, init, a):
        return [g.add(EpochInstruction, a, task=2, action="barrier")]

    _ex, waits, _result = _execute(comm, build)
    got = polling_waits(waits)
    assert check.asked >= 30 and len(got) >= 25
    expected = [min(2e-5 * 1.25 ** i, 2e-3) for i in range(len(got))]
    np.testing.assert_allclose(got, expected)
    assert max(got) == 2e-3


def test_polled_backend_completions_are_asked_only_up_to_the_first_unfinished_one_per_lane(monkeypatch):
    """A lane runs in order, so behind its first unfinished item nothing is done yet: each poll
    asks that one and none behind it (a CUDA event query costs 1-2 us, and a burst of eagerly
    queued kernels put a hundred behind one another, all asked at every poll)."""
    import time

    import celeritas as cl
    import celeritas.runtime as runtime_module
    from executor.backends.backend import Completion
    delay_ns = 300_000
    asked = [0]
    created: list = []

    class InOrder(Completion):
        """Done ``delay_ns`` after the one before it on its lane finished (or after its own host
        part, if later), as a device queue runs its work."""
        notifying = False

        def __init__(self, host, before):
            self.host, self.before, self.at = host, before, None

        def done_at(self):
            if self.at is None:
                prev = self.before.done_at() if self.before is not None else 0
                self.at = max(prev, self.host.end_ns) + delay_ns
            return self.at

        def is_done(self):
            asked[0] += 1
            return self.host.is_done() and time.perf_counter_ns() >= self.done_at()

        def error(self):
            return self.host.error()

        def wait(self, timeout=None):
            return self.host.wait(timeout)

        start_ns = property(lambda self: self.host.start_ns)
        end_ns = property(lambda self: self.host.end_ns)

    class DeviceQueues(HostBackend):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.last: dict = {}

        def launch(self, lane, fn, *, dependent=False):
            c = super().launch(lane, fn, dependent=dependent)
            if lane.kind != "device":
                return c
            c = self.last[lane] = InOrder(c, self.last.get(lane))
            created.append(c)
            return c

    steps = [0]
    original_step = Executor._step

    def counting_step(self):
        steps[0] += 1
        return original_step(self)

    monkeypatch.setattr(Executor, "_step", counting_step)
    monkeypatch.setattr(runtime_module, "make_backend", lambda spec, *a, **k: DeviceQueues(1, rank=k.get("rank")))
    q = cl.Queue(devices="host:1")
    x = cl.Buffer(np.zeros(16, np.int64), name="x")

    def bump(cgh):
        w = x.access(cgh, cl.one_to_one(), cl.read_write)

        @cgh.parallel_for((16,), name="bump")
        def k(chunk):
            w[chunk.box] += 1

    for _ in range(120):
        q.submit(bump)
    assert (q.fence(x).result() == 120).all()
    q.shutdown()
    assert len(created) >= 120
    # each poll asks at most one unfinished item per lane (a handful of lanes), and each item is
    # asked once more when it is done; asking every item in flight at every poll was ~steps x 100
    assert asked[0] <= 4 * steps[0] + 2 * len(created), (asked[0], steps[0], len(created))


def test_a_long_blocking_mpi_wait_sleeps_up_to_a_32nd_of_the_wait(monkeypatch):
    """``MpiCommunicator._wait`` (a barrier, a communicator clone) sleeps between tests from
    20 us growing by half up to 1 ms and, once it has waited 32 ms, up to a 32nd of the wait:
    a rank in a barrier behind a peer that computes for 2 s tests ~250 times, not ~2000
    (each wake-up costs CPU a peer sharing the cores could use).  Clock and sleep are faked."""
    from executor.mpi import communicator as mc
    clock = [0.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        clock[0] += s

    monkeypatch.setattr(mc.time, "sleep", sleep)
    monkeypatch.setattr(mc.time, "monotonic", lambda: clock[0])

    class Waiter:
        _rank = 0

        def _divergence_poll(self, stalled):
            pass

    mc.MpiCommunicator._wait(Waiter(), lambda: clock[0] >= 2.0, "the barrier")
    np.testing.assert_allclose(sleeps[:3], [2e-5, 3e-5, 4.5e-5])
    assert max(sleeps) > 0.01
    assert len(sleeps) < 300
    waited = 0.0
    for s in sleeps:                # never past 1 ms or a 32nd of the wait so far
        assert s <= max(1e-3, waited / 32) * 1.5 + 1e-12
        waited += s


class LatePayloadComm(ScriptedComm):
    """The pilot arrives at the 3rd poll, its payload's request completes at its 40th test."""

    def __init__(self) -> None:
        super().__init__(spin=60.0, pmin=1e-4, pmax=1e-3, arrive_after=3)
        self.payload_tests = 0

    def receive_payload(self, from_rank: int, msg_id: int, out_array: Any) -> Request:
        out_array[...] = self.payload
        comm = self

        class Late(Request):
            def test(self) -> bool:
                comm.payload_tests += 1
                return comm.payload_tests >= 40

            def wait(self, timeout=None) -> bool:
                return True

        return Late()


def test_once_every_box_of_a_receive_is_announced_only_its_payload_is_polled():
    """The pilot ring is looked at only while an issued receive lacks a pilot: in a
    ping-pong the pilots travel ahead, and a wait for the payload polled both."""
    comm = LatePayloadComm()
    ex, _waits, result = run(comm)
    np.testing.assert_array_equal(result, comm.payload)
    assert comm.payload_tests == 40
    assert comm.polls == 3          # none after the pilot came: 37 polls of the payload alone
