"""Receive arbiter: every arrival order of instructions, pilots and payloads."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from executor.communicator import Communicator, Request, copy_payload
from executor.receive_arbiter import ReceiveArbiter
from scheduler.geometry import Box, Region
from scheduler.instruction_graph import (AwaitReceiveInstruction, GatherReceiveInstruction, Pilot,
                                         ReceiveInstruction, SplitReceiveInstruction)


class FakeRequest(Request):
    def __init__(self):
        self.done = False

    def test(self) -> bool:
        return self.done


class FakeComm(Communicator):
    """Payloads are 'delivered' by the test; a receive completes once both sides exist."""

    def __init__(self, rank=0, num_ranks=3, accepts_strided=False):
        self._rank, self._n = rank, num_ranks
        self.accepts_strided = accepts_strided
        self.delivered: dict[tuple, np.ndarray] = {}
        self.posted: dict[tuple, tuple] = {}
        self.receive_calls = 0

    rank = property(lambda self: self._rank)
    num_ranks = property(lambda self: self._n)

    def deliver(self, from_rank, msg_id, array):
        k = (from_rank, msg_id)
        if k in self.posted:
            out, req = self.posted.pop(k)
            copy_payload(array, out)
            req.done = True
        else:
            self.delivered[k] = array

    def receive_payload(self, from_rank, msg_id, out_array):
        self.receive_calls += 1
        if not self.accepts_strided:
            assert out_array.flags.c_contiguous, "communicator was handed a strided buffer"
        req = FakeRequest()
        k = (from_rank, msg_id)
        if k in self.delivered:
            copy_payload(self.delivered.pop(k), out_array)
            req.done = True
        else:
            self.posted[k] = (out_array, req)
        return req

    def send_pilot(self, to, pilot):
        raise AssertionError("not used")

    def poll_pilots(self):
        return []

    def send_payload(self, to, msg_id, array):
        raise AssertionError("not used")

    def clone(self, key=None):
        raise AssertionError("not used")

    def barrier(self):
        pass

    def collective_handle(self):
        return None


# a 3-D receive: destination allocation [0,6)x[0,4)x[0,5), three fragments from two ranks
DEST_BOX = Box((0, 0, 0), (6, 4, 5))
FRAGMENTS = [  # (from_rank, msg_id, box)
    (1, 10, Box((1, 0, 0), (3, 4, 5))),   # contiguous inside the destination
    (2, 20, Box((3, 0, 0), (5, 2, 5))),   # strided inside the destination
    (2, 21, Box((3, 2, 1), (5, 4, 5))),   # strided
]
REGION = Region([b for _, _, b in FRAGMENTS])
TRANSFER = (7, 3, 0)
TRUTH = np.arange(6 * 4 * 5, dtype=np.float32).reshape(6, 4, 5) + 0.5


def payload(i):
    return np.ascontiguousarray(TRUTH[FRAGMENTS[i][2].slices])


def pilot(i):
    fr, msg, box = FRAGMENTS[i]
    return fr, Pilot(msg_id=msg, to=0, transfer=TRANSFER, box=box)


def expected_dest():
    want = np.full(DEST_BOX.shape, -1, dtype=np.float32)
    for b in REGION:
        want[b.slices] = TRUTH[b.slices]
    return want


def test_fragments_cover_the_region_exactly():
    assert REGION.area == sum(b.area for _, _, b in FRAGMENTS)
    assert not REGION.contains(Box((3, 2, 0), (5, 4, 1)))   # a hole the receive must not wait for


@pytest.mark.parametrize("strided", [False, True])
def test_receive_every_order(strided):
    events = ["instr"] + [("pilot", i) for i in range(3)] + [("payload", i) for i in range(3)]
    want = expected_dest()
    count = 0
    for order in itertools.permutations(events):
        comm = FakeComm(accepts_strided=strided)
        arb = ReceiveArbiter(comm)
        dest = np.full(DEST_BOX.shape, -1, dtype=np.float32)
        instr = ReceiveInstruction(id=5, transfer=TRANSFER, region=REGION, dest=1, dest_box=DEST_BOX)
        seen = set()
        handle = None
        done_ids = []
        for ev in order:
            seen.add(ev)
            if ev == "instr":
                handle = arb.begin_receive(instr, dest)
            elif ev[0] == "pilot":
                arb.on_pilot(*pilot(ev[1]))
            else:
                fr, msg, _ = FRAGMENTS[ev[1]]
                comm.deliver(fr, msg, payload(ev[1]))
            done_ids += arb.poll()
            should = len(seen) == len(events)
            assert (handle is not None and handle.is_done()) == should, order
            assert done_ids == ([5] if should else []), order
            # pilots are worth taking in only while the issued receive lacks one
            assert arb.wants_pilots == ("instr" in seen and not all(("pilot", i) in seen for i in range(3))), order
        assert handle.error() is None
        np.testing.assert_array_equal(dest, want)
        assert comm.receive_calls == 3
        assert not arb.has_active and not arb.has_inflight
        count += 1
    assert count == 5040


SPLIT_AWAITS = {31: Region.from_box(FRAGMENTS[0][2]),
                32: Region([FRAGMENTS[1][2], FRAGMENTS[2][2]])}
AWAIT_NEEDS = {31: {0}, 32: {1, 2}}


def test_split_receive_with_awaits_every_order():
    # 9! = 362880 orders; the loop body is kept lean so this stays around half a minute
    events = (["split", ("await", 31), ("await", 32)] + [("pilot", i) for i in range(3)]
              + [("payload", i) for i in range(3)])
    want = expected_dest()
    payloads = [payload(i) for i in range(3)]
    pilots = [pilot(i) for i in range(3)]
    split = SplitReceiveInstruction(id=30, transfer=TRANSFER, region=REGION, dest=1, dest_box=DEST_BOX)
    awaits = {aid: AwaitReceiveInstruction(id=aid, transfer=TRANSFER, region=r)
              for aid, r in SPLIT_AWAITS.items()}
    needs = [(aid, frozenset(n)) for aid, n in AWAIT_NEEDS.items()]
    everything = frozenset({0, 1, 2})
    count = 0
    for order in itertools.permutations(events):
        comm = FakeComm(accepts_strided=True)
        arb = ReceiveArbiter(comm)
        dest = np.full(DEST_BOX.shape, -1, dtype=np.float32)
        handles = {}
        seen_pilot, seen_payload = set(), set()
        for ev in order:
            if ev == "split":
                handles[30] = arb.begin_receive(split, dest)
            else:
                what, i = ev
                if what == "await":
                    handles[i] = arb.await_receive(awaits[i])
                elif what == "pilot":
                    seen_pilot.add(i)
                    arb.on_pilot(*pilots[i])
                else:
                    seen_payload.add(i)
                    fr, msg, _ = FRAGMENTS[i]
                    comm.deliver(fr, msg, payloads[i])
            arb.poll()
            arrived = seen_pilot & seen_payload if 30 in handles else set()
            for aid, n in needs:
                if aid in handles:
                    assert handles[aid].done == (n <= arrived), order
            if 30 in handles:
                assert handles[30].done == (arrived == everything), order
            # (the awaits take no pilots themselves: only the split receive's unannounced boxes count)
            assert arb.wants_pilots == (30 in handles and seen_pilot != everything), order
        assert np.array_equal(dest, want), order
        assert all(h.done and h.error_ is None for h in handles.values())
        assert not arb.has_active
        count += 1
    assert count == 362880


def test_gather_every_order():
    n, me, cb = 4, 1, 8
    values = {0: 1.25, 3: -4.5}
    pilots = {0: Box((0,), (1,)), 2: Box((0,), (0,)), 3: Box((0,), (1,))}   # rank 2: nothing
    msg = {0: 100, 2: 200, 3: 300}
    transfer = (9, 4, 2)
    events = ["instr"] + [("pilot", r) for r in pilots] + [("payload", r) for r in values]
    count = 0
    for order in itertools.permutations(events):
        comm = FakeComm(rank=me, num_ranks=n)
        arb = ReceiveArbiter(comm)
        dest = np.zeros(n, dtype=np.float64)          # identity of plus
        dest[me] = 7.0                                # the local partial result
        instr = GatherReceiveInstruction(id=50, transfer=transfer, dest=3, chunk_bytes=cb, num_ranks=n)
        seen = set()
        handle = None
        for ev in order:
            seen.add(ev)
            if ev == "instr":
                handle = arb.begin_gather(instr, dest)
            elif ev[0] == "pilot":
                r = ev[1]
                arb.on_pilot(r, Pilot(msg_id=msg[r], to=me, transfer=transfer, box=pilots[r]))
            else:
                r = ev[1]
                comm.deliver(r, msg[r], np.array([values[r]]))
            arb.poll()
            should = len(seen) == len(events)
            assert (handle is not None and handle.is_done()) == should, order
            assert arb.wants_pilots == (handle is not None and not should), order
        np.testing.assert_array_equal(dest, [1.25, 7.0, 0.0, -4.5])
        assert handle.error() is None
        assert comm.receive_calls == 2
        count += 1
    assert count == 720


def test_two_receives_of_one_transfer_and_buffered_pilots():
    comm = FakeComm(accepts_strided=False)
    arb = ReceiveArbiter(comm)
    lo, hi = Box((0,), (4,)), Box((4,), (8,))
    # pilots for both halves arrive before any receive
    arb.on_pilot(1, Pilot(msg_id=1, to=0, transfer=TRANSFER, box=lo))
    arb.on_pilot(2, Pilot(msg_id=2, to=0, transfer=TRANSFER, box=hi))
    assert len(arb.unmatched_pilots()) == 2
    d_hi = np.zeros(4)
    h_hi = arb.begin_receive(ReceiveInstruction(id=2, transfer=TRANSFER, region=Region.from_box(hi),
                                                dest=2, dest_box=hi), d_hi)
    assert len(arb.unmatched_pilots()) == 1       # only the matching pilot was claimed
    comm.deliver(2, 2, np.arange(4.0, 8.0))
    assert arb.poll() == [2] and h_hi.is_done()
    np.testing.assert_array_equal(d_hi, [4, 5, 6, 7])
    d_lo = np.zeros(10)
    h_lo = arb.begin_receive(ReceiveInstruction(id=1, transfer=TRANSFER, region=Region.from_box(lo),
                                                dest=1, dest_box=Box((-2,), (8,))), d_lo)
    assert arb.poll() == [] and not h_lo.is_done()
    comm.deliver(1, 1, np.arange(4.0))
    assert arb.poll() == [1]
    np.testing.assert_array_equal(d_lo, [0, 0, 0, 1, 2, 3, 0, 0, 0, 0])
    assert arb.unmatched_pilots() == []


def test_empty_receive_and_late_await():
    comm = FakeComm()
    arb = ReceiveArbiter(comm)
    h = arb.begin_receive(ReceiveInstruction(id=1, transfer=TRANSFER, region=Region.empty_region(1),
                                             dest=1, dest_box=Box((0,), (4,))), np.zeros(4))
    assert h.is_done() and arb.poll() == [1]
    # a split receive that completes entirely before its awaits are registered
    box = Box((0,), (4,))
    dest = np.zeros(4)
    arb.begin_receive(SplitReceiveInstruction(id=2, transfer=(8, 1, 0), region=Region.from_box(box),
                                              dest=1, dest_box=box), dest)
    arb.on_pilot(1, Pilot(msg_id=5, to=0, transfer=(8, 1, 0), box=box))
    comm.deliver(1, 5, np.ones(4))
    assert arb.poll() == [2]
    late = arb.await_receive(AwaitReceiveInstruction(id=3, transfer=(8, 1, 0),
                                                     region=Region.from_box(Box((1,), (3,)))))
    assert late.is_done() and arb.poll() == [3]
    arb.prune(before_task=9)
    assert arb._transfers == {} and arb._split_history == {}


def test_payload_error_fails_the_receive():
    class Broken(FakeComm):
        def receive_payload(self, from_rank, msg_id, out_array):
            raise RuntimeError("link down")

    arb = ReceiveArbiter(Broken())
    h = arb.begin_receive(ReceiveInstruction(id=1, transfer=TRANSFER, region=REGION, dest=1,
                                             dest_box=DEST_BOX), np.zeros(DEST_BOX.shape, np.float32))
    assert arb.wants_pilots
    arb.on_pilot(*pilot(0))
    assert arb.poll() == [1]
    assert h.is_done() and isinstance(h.error(), RuntimeError)
    assert not arb.wants_pilots         # (a failed receive takes no more pilots)


@pytest.mark.parametrize("pilot_first", [False, True])
def test_a_receive_of_exactly_one_pilots_box_completes_with_its_one_payload(pilot_first):
    """A stencil's halo from one neighbour: the receive's region is the one box a pilot
    announces (matched, and then emptied, without region arithmetic), in either order."""
    fr, msg, box = FRAGMENTS[1]
    comm = FakeComm()
    arb = ReceiveArbiter(comm)
    dest = np.full(DEST_BOX.shape, -1, dtype=np.float32)
    instr = ReceiveInstruction(id=9, transfer=TRANSFER, region=Region.from_box(box), dest=1, dest_box=DEST_BOX)
    if pilot_first:
        arb.on_pilot(*pilot(1))
        handle = arb.begin_receive(instr, dest)
    else:
        handle = arb.begin_receive(instr, dest)
        arb.on_pilot(*pilot(1))
    assert arb.poll() == [] and not handle.is_done() and comm.receive_calls == 1
    comm.deliver(fr, msg, payload(1))
    assert arb.poll() == [9] and handle.is_done() and handle.error() is None
    want = np.full(DEST_BOX.shape, -1, dtype=np.float32)
    want[box.slices] = TRUTH[box.slices]
    np.testing.assert_array_equal(dest, want)
    assert not arb.has_active and not arb.has_inflight


@pytest.mark.parametrize("pilot_first", [False, True])
def test_a_one_box_receive_announced_in_two_parts_waits_for_both(pilot_first):
    """A one-box region whose pilots split it (two senders): neither part is the whole, so
    the receive stays active (and wants pilots) until both parts are announced and landed."""
    box = Box((0,), (8,))
    halves = [(1, 41, Box((0,), (3,))), (2, 42, Box((3,), (8,)))]
    comm = FakeComm(accepts_strided=True)
    arb = ReceiveArbiter(comm)
    dest = np.zeros(8)
    instr = ReceiveInstruction(id=4, transfer=(3, 1, 0), region=Region.from_box(box), dest=1, dest_box=box)
    if pilot_first:
        arb.on_pilot(halves[0][0], Pilot(msg_id=41, to=0, transfer=(3, 1, 0), box=halves[0][2]))
        handle = arb.begin_receive(instr, dest)
    else:
        handle = arb.begin_receive(instr, dest)
        arb.on_pilot(halves[0][0], Pilot(msg_id=41, to=0, transfer=(3, 1, 0), box=halves[0][2]))
    comm.deliver(1, 41, np.arange(3.0))
    assert arb.poll() == [] and not handle.is_done() and arb.wants_pilots
    arb.on_pilot(2, Pilot(msg_id=42, to=0, transfer=(3, 1, 0), box=halves[1][2]))
    assert not arb.wants_pilots and arb.poll() == []
    comm.deliver(2, 42, np.arange(3.0, 8.0))
    assert arb.poll() == [4] and handle.is_done() and handle.error() is None
    np.testing.assert_array_equal(dest, np.arange(8.0))


def test_payloads_land_in_the_views_the_executor_keeps():
    """Given ``view(allocation, extent, box)`` (the executor's cached views), the arbiter
    receives into what it returns, asked with the receive's allocation id."""
    fr, msg, box = FRAGMENTS[0]
    comm = FakeComm()
    dest = np.full(DEST_BOX.shape, -1, dtype=np.float32)
    asked = []

    def view(aid, extent, b):
        asked.append((aid, extent, b))
        return dest[tuple(slice(lo, hi) for lo, hi in zip(b.min, b.max))]

    arb = ReceiveArbiter(comm, view)
    handle = arb.begin_receive(ReceiveInstruction(id=6, transfer=TRANSFER, region=Region.from_box(box), dest=3,
                                                  dest_box=DEST_BOX), dest)
    arb.on_pilot(*pilot(0))
    comm.deliver(fr, msg, payload(0))
    assert arb.poll() == [6] and handle.error() is None
    assert asked == [(3, DEST_BOX, box)]
    np.testing.assert_array_equal(dest[box.slices], TRUTH[box.slices])
