"""Celerity's executor-side unit tests, restated for celeritas.

Sources (Celerity runtime repository):

* ``test/out_of_order_engine_tests.cc``  ->  ``executor.out_of_order_engine.OutOfOrderEngine``
* ``test/receive_arbiter_tests.cc``      ->  ``executor.receive_arbiter.ReceiveArbiter``

Each test names the Celerity case it restates and the property it pins.  Cases whose
behaviour ``tests/test_engine.py`` / ``tests/test_receive_arbiter.py`` already pin are
not repeated here.  The tests are written independently of the C++ sources: they drive
the celeritas engine / arbiter directly, without an executor or threads.

Model differences that the docstrings refer to:

* Celerity's engine exposes ``get_execution_front()``; celeritas does not.  The tests
  derive it from the engine's public state: an instruction is in the front when it was
  assigned, has not been completed, and none of its predecessors is still known to the
  engine (``instr_id in engine``).
* Celerity's targets are immediate / alloc_queue / host_queue / device_queue; celeritas
  has IMMEDIATE / ALLOC_QUEUE / HOST_LANE / DEVICE_LANE with the same meaning.  The
  celeritas alloc queue is a single, device-less target.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from executor.communicator import Communicator, Request, copy_payload
from executor.out_of_order_engine import Assignment, OutOfOrderEngine, Target
from executor.receive_arbiter import ReceiveArbiter
from scheduler.geometry import Box, Region
from scheduler.instruction_graph import (HOST_MEMORY, AllocInstruction, AwaitReceiveInstruction,
                                         CopyInstruction, DeviceKernelInstruction, EpochInstruction,
                                         FreeInstruction, HostTaskInstruction, Instruction, Pilot,
                                         ReceiveInstruction, SplitReceiveInstruction, device_memory)


# ====================================================================== engine helpers


class EngineRig:
    """Builds instructions with fresh ids, submits them, and records every assignment."""

    def __init__(self, **engine_kwargs):
        self.engine = OutOfOrderEngine(**engine_kwargs)
        self._next_id = 1
        self.assignments: dict[int, Assignment] = {}

    def _submit(self, instr: Instruction) -> Instruction:
        self.engine.submit(instr)
        return instr

    def _common(self, preds, priority):
        iid = self._next_id
        self._next_id += 1
        return {"id": iid, "deps": [(p.id, "true") for p in preds], "priority": priority}

    def kernel(self, *preds, device, priority=0):
        return self._submit(DeviceKernelInstruction(**self._common(preds, priority), device=device))

    def host_task(self, *preds, priority=0):
        return self._submit(HostTaskInstruction(**self._common(preds, priority)))

    def copy(self, *preds, source, dest, priority=0):
        return self._submit(CopyInstruction(**self._common(preds, priority),
                                            source_memory=source, dest_memory=dest))

    def alloc(self, *preds, memory):
        return self._submit(AllocInstruction(**self._common(preds, 0), memory=memory))

    def free(self, *preds, memory):
        return self._submit(FreeInstruction(**self._common(preds, 0), memory=memory))

    def epoch(self, *preds):
        return self._submit(EpochInstruction(**self._common(preds, 0)))

    def assign_one(self) -> Assignment | None:
        a = self.engine.assign_one()
        if a is not None:
            iid = a.instruction.id
            assert iid not in self.assignments, f"I{iid} assigned twice"
            if a.target in (Target.IMMEDIATE, Target.ALLOC_QUEUE):
                assert a.lane is None
            else:
                assert a.lane is not None
            if a.target == Target.DEVICE_LANE:
                assert a.device is not None
            else:
                assert a.device is None
            self.assignments[iid] = a
        return a

    def assign_all(self) -> list[Assignment]:
        out = []
        while (a := self.assign_one()) is not None:
            out.append(a)
        return out

    def complete(self, *instrs):
        for i in instrs:
            self.engine.complete(i.id)

    def front(self) -> set[int]:
        """Assigned, incomplete instructions with no incomplete predecessor (Celerity's
        execution front), derived from the engine's membership queries."""
        e = self.engine
        return {iid for iid, a in self.assignments.items()
                if iid in e and not any(d in e for d in a.instruction.dep_ids)}


def ids(*instrs) -> set[int]:
    return {i.id for i in instrs}


def assigned_ids(assignments) -> set[int]:
    return {a.instruction.id for a in assignments}


def lane_of(a: Assignment):
    return (a.target, a.device, a.lane)


def in_order_on_one_lane(assignments, *instrs) -> bool:
    """``instrs`` were all assigned, in this order, to one (target, device, lane)."""
    position = {a.instruction.id: k for k, a in enumerate(assignments)}
    by_id = {a.instruction.id: a for a in assignments}
    if any(i.id not in position for i in instrs):
        return False
    order = [position[i.id] for i in instrs]
    return order == sorted(order) and len({lane_of(by_id[i.id]) for i in instrs}) == 1


# ====================================================================== out_of_order_engine_tests.cc


def test_independent_chains_run_concurrently_and_a_host_chain_follows_in_order():
    """out_of_order_engine_tests.cc "out_of_order_engine schedules independent chains concurrently".

    Two kernel chains on devices 0 and 1 are assigned at once (the second kernel of each
    eagerly, in order behind the first, on its device's lane); a host chain depending on both
    chains is held back until the last kernel completed, then the whole host chain (including
    a task depending on two host predecessors on the same lane) goes to one host lane in order.
    The execution front moves accordingly."""
    r = EngineRig()
    d0_k0 = r.kernel(device=0)
    d1_k0 = r.kernel(device=1)
    d0_k1 = r.kernel(d0_k0, device=0)
    d1_k1 = r.kernel(d1_k0, device=1)
    h0 = r.host_task(d0_k1, d1_k1)
    h1 = r.host_task(h0)
    h2 = r.host_task(h0, h1)
    assert r.front() == set()

    got = r.assign_all()
    assert assigned_ids(got) == ids(d0_k0, d0_k1, d1_k0, d1_k1)
    for k, dev in [(d0_k0, 0), (d0_k1, 0), (d1_k0, 1), (d1_k1, 1)]:
        a = r.assignments[k.id]
        assert (a.target, a.device) == (Target.DEVICE_LANE, dev)
    assert in_order_on_one_lane(got, d0_k0, d0_k1)
    assert in_order_on_one_lane(got, d1_k0, d1_k1)
    assert lane_of(r.assignments[d0_k0.id]) != lane_of(r.assignments[d1_k0.id])
    assert r.assignments[d0_k1.id].eager and r.assignments[d1_k1.id].eager
    assert r.front() == ids(d0_k0, d1_k0)

    r.complete(d0_k0, d0_k1, d1_k0)
    assert r.assign_all() == []                   # h0 still waits for d1_k1
    assert r.front() == ids(d1_k1)

    r.complete(d1_k1)
    assert r.front() == set()
    got = r.assign_all()
    assert assigned_ids(got) == ids(h0, h1, h2)
    assert all(a.target == Target.HOST_LANE for a in got)
    assert in_order_on_one_lane(got, h0, h1, h2)
    assert [a.eager for a in got] == [False, True, True]
    assert r.front() == ids(h0)


def test_copies_are_eagerly_queued_behind_their_producer_and_host_copies_wait():
    """out_of_order_engine_tests.cc "out_of_order_engine eagerly assigns copy-instructions to the
    lanes of their dependencies".

    A copy touching a device memory goes eagerly onto the lane of the kernel it depends on
    (device-to-device copies on either the source's or the destination's device, whichever
    the producer sits on; host<->device copies on the device side); a host-to-host copy cannot
    sit on a device lane, so it waits for its device-side predecessor and then goes to a host
    lane.  Ready device-to-device copies go to one of their two devices.  The engine is idle
    exactly when everything completed (completion order arbitrary)."""
    r = EngineRig()
    k = [r.kernel(device=d) for d in range(4)]
    dm = device_memory
    copy_dep0 = r.copy(k[0], source=dm(0), dest=dm(1))
    copy_dep1 = r.copy(k[1], source=dm(0), dest=dm(1))
    copy_dep2 = r.copy(k[2], source=HOST_MEMORY, dest=dm(2))
    copy_dep3 = r.copy(k[3], source=dm(3), dest=HOST_MEMORY)
    copy_host = r.copy(copy_dep3, source=HOST_MEMORY, dest=HOST_MEMORY)
    assert not r.engine.is_idle()
    assert r.front() == set()

    got = r.assign_all()
    assert assigned_ids(got) == ids(*k, copy_dep0, copy_dep1, copy_dep2, copy_dep3)
    for d in range(4):
        assert (r.assignments[k[d].id].target, r.assignments[k[d].id].device) == (Target.DEVICE_LANE, d)
    for d, c in enumerate([copy_dep0, copy_dep1, copy_dep2, copy_dep3]):
        assert in_order_on_one_lane(got, k[d], c)
        assert r.assignments[c.id].eager
    assert r.front() == ids(*k)

    r.complete(k[0], k[1])
    assert r.front() == ids(k[2], k[3], copy_dep0, copy_dep1)
    r.complete(k[2], k[3])
    assert not r.engine.is_idle()
    assert r.front() == ids(copy_dep0, copy_dep1, copy_dep2, copy_dep3)

    # copies whose predecessors completed already
    copy_indep0 = r.copy(k[0], source=dm(1), dest=dm(0))
    copy_indep1 = r.copy(k[1], source=dm(0), dest=dm(1))
    copy_indep2 = r.copy(k[2], source=dm(1), dest=dm(2))
    copy_indep3 = r.copy(k[3], source=dm(0), dest=dm(3))
    got = r.assign_all()
    assert assigned_ids(got) == ids(copy_indep0, copy_indep1, copy_indep2, copy_indep3)
    for c, devices in [(copy_indep0, {0, 1}), (copy_indep1, {0, 1}), (copy_indep2, {1, 2}),
                       (copy_indep3, {0, 3})]:
        a = r.assignments[c.id]
        assert a.target == Target.DEVICE_LANE and a.device in devices and not a.eager

    r.complete(copy_dep2, copy_dep1, copy_dep0, copy_dep3)
    assert not r.engine.is_idle()
    got = r.assign_all()
    assert assigned_ids(got) == ids(copy_host)
    assert r.assignments[copy_host.id].target == Target.HOST_LANE
    assert not r.assignments[copy_host.id].eager

    r.complete(copy_indep2, copy_indep1, copy_indep0, copy_indep3)
    assert not r.engine.is_idle()
    r.complete(copy_host)
    assert r.engine.is_idle()


def test_alloc_and_free_go_to_the_alloc_queue_not_to_host_lanes():
    """out_of_order_engine_tests.cc "alloc / free instructions are scheduled on alloc_queue
    instead of host_queue".

    Behind an epoch (issued immediately), host and device allocations are issued on the alloc
    queue (no lane), never eagerly behind anything; the tasks using them follow once they
    completed (host task on a host lane, kernel on device 0), then the frees, again on the alloc
    queue.  celeritas difference: its alloc queue is one device-less target, so the assignment
    of a device allocation reports ``device=None`` where Celerity reports device 0."""
    r = EngineRig()
    init = r.epoch()
    alloc_host = r.alloc(init, memory=HOST_MEMORY)
    alloc_dev = r.alloc(init, memory=device_memory(0))
    task = r.host_task(alloc_host)
    kern = r.kernel(alloc_dev, device=0)
    free_host = r.free(task, memory=HOST_MEMORY)
    free_dev = r.free(kern, memory=device_memory(0))
    assert not r.engine.is_idle()

    got = r.assign_all()
    assert assigned_ids(got) == ids(init)
    assert lane_of(got[0]) == (Target.IMMEDIATE, None, None)
    r.complete(init)
    assert not r.engine.is_idle()

    got = r.assign_all()
    assert assigned_ids(got) == ids(alloc_host, alloc_dev)
    assert all(lane_of(a) == (Target.ALLOC_QUEUE, None, None) for a in got)
    r.complete(alloc_host, alloc_dev)
    assert not r.engine.is_idle()

    got = r.assign_all()
    assert assigned_ids(got) == ids(task, kern)
    assert r.assignments[task.id].target == Target.HOST_LANE
    assert (r.assignments[kern.id].target, r.assignments[kern.id].device) == (Target.DEVICE_LANE, 0)
    assert r.assign_all() == []               # frees wait: nothing runs on the alloc queue eagerly
    r.complete(task, kern)

    got = r.assign_all()
    assert assigned_ids(got) == ids(free_host, free_dev)
    assert all(lane_of(a) == (Target.ALLOC_QUEUE, None, None) for a in got)
    r.complete(free_host, free_dev)
    assert r.engine.is_idle()


def test_an_eager_candidate_whose_predecessor_completes_is_assigned_exactly_once():
    """out_of_order_engine_tests.cc "out_of_order_engine does not attempt to assign instructions
    more than once in the presence of eager assignment".

    k2 becomes an eager candidate when k1 is assigned; k1 completes before anyone asks for the
    next assignment.  k2 is then handed out exactly once (as a normal, non-eager assignment,
    since its predecessor is done) and nothing is handed out after it."""
    r = EngineRig()
    k1 = r.kernel(device=0)
    k2 = r.kernel(k1, device=0)
    assert r.front() == set()

    a = r.assign_one()
    assert a is not None and a.instruction is k1
    assert r.front() == ids(k1)
    r.complete(k1)
    assert r.front() == set()

    got = r.assign_all()                     # (EngineRig.assign_one fails on a double assignment)
    assert [x.instruction for x in got] == [k2]
    assert not got[0].eager
    assert r.front() == ids(k2)
    assert r.engine.assign_one() is None
    r.complete(k2)
    assert r.front() == set()
    assert r.engine.is_idle()


def test_a_lane_can_be_completed_tail_first():
    """out_of_order_engine_tests.cc "assigned sets of instructions with internal dependencies can
    be completed out-of-order".

    k2 sits eagerly behind k1 on one lane; the executor may observe k2's completion first.  The
    engine accepts that: k1 stays in the front, the engine is idle only once both completed."""
    r = EngineRig()
    k1 = r.kernel(device=0)
    k2 = r.kernel(k1, device=0)
    assert r.front() == set()
    got = r.assign_all()
    assert in_order_on_one_lane(got, k1, k2)
    assert not r.engine.is_idle()
    assert r.front() == ids(k1)

    r.complete(k2)
    assert not r.engine.is_idle()
    assert r.front() == ids(k1)
    assert r.assign_all() == []
    r.complete(k1)
    assert r.engine.is_idle()
    assert r.front() == set()


def test_concurrent_kernels_are_assigned_by_decreasing_priority_to_separate_lanes():
    """out_of_order_engine_tests.cc "concurrent instructions are assigned in decreasing priority".

    Three independent kernels of one device, submitted with priorities 1, 3, 2, are assigned
    3, 2, 1.  (tests/test_engine.py::test_priorities_then_ids pins the order for immediate
    instructions; this pins it for lane instructions, which also land on distinct lanes.)"""
    r = EngineRig()
    k1 = r.kernel(device=0, priority=1)
    k3 = r.kernel(device=0, priority=3)
    k2 = r.kernel(device=0, priority=2)
    order = [r.assign_one().instruction for _ in range(3)]
    assert order == [k3, k2, k1]
    assert r.engine.assign_one() is None
    assert len({lane_of(r.assignments[k.id]) for k in (k1, k2, k3)}) == 3


def test_eager_candidate_becomes_ready_when_its_predecessor_completes_and_wins_by_priority():
    """out_of_order_engine_tests.cc "eagerly-assignable instructions become immediately
    assignable once their predecessors complete".

    k1 -> {k2 (prio 1), k3 (prio 0)}, k2 -> k4 (prio 2).  k1, then k2 (eagerly, higher priority
    than k3) are assigned.  Completing k2 while k1 still runs makes k4 fully ready; being the
    highest priority, it is the next assignment (not eager: its predecessor is done)."""
    r = EngineRig()
    k1 = r.kernel(device=0, priority=0)
    k2 = r.kernel(k1, device=0, priority=1)
    k3 = r.kernel(k1, device=0, priority=0)
    k4 = r.kernel(k2, device=0, priority=2)

    assert r.assign_one().instruction is k1
    second = r.assign_one()
    assert second.instruction is k2 and second.eager
    r.complete(k2)
    third = r.assign_one()
    assert third.instruction is k4
    assert not third.eager
    assert k3.id not in r.assignments        # k3 still waits for k1 (k2 was k1's lane tail)


@pytest.mark.parametrize("complete_first", ["k1", "k2"])
def test_eager_chain_continues_after_partial_completion(complete_first):
    """out_of_order_engine_tests.cc "eagerly-assignable instructions remain so as long as their
    predecessors are partially complete".

    Chain k1 -> k2 -> k3 -> k4; after k1 and k2 were assigned, one of them completes (in order,
    or k2 first).  k3 and k4 are still assigned before anything else completes, in order on
    one lane.  celeritas detail: when k2 (the tail) completed first, k3 is ready and takes a
    fresh lane (k1's lane is not idle) with k4 eagerly behind it; otherwise both go eagerly
    behind k2."""
    r = EngineRig()
    k1 = r.kernel(device=0)
    k2 = r.kernel(k1, device=0)
    k3 = r.kernel(k2, device=0)
    k4 = r.kernel(k3, device=0)
    assert r.assign_one().instruction is k1
    assert r.assign_one().instruction is k2
    r.complete(k1 if complete_first == "k1" else k2)

    rest = r.assign_all()
    assert assigned_ids(rest) == ids(k3, k4)
    assert in_order_on_one_lane(rest, k3, k4)
    assert r.assignments[k4.id].eager
    if complete_first == "k1":
        assert lane_of(r.assignments[k3.id]) == lane_of(r.assignments[k2.id])


@pytest.mark.parametrize("complete_first", ["k1", "k2"])
def test_task_with_predecessors_on_two_host_lanes_waits_until_one_remains(complete_first):
    """out_of_order_engine_tests.cc "instructions are not eagerly assigned if their predecessors
    are assigned to a different lanes".

    k1 and k2 are independent host tasks on two host lanes; k3 depends on both.  k3 is not
    assigned while both run (no single lane orders it after both); once either completes, its
    one remaining predecessor is a lane tail and k3 is assigned (eagerly, behind it)."""
    r = EngineRig()
    k1 = r.host_task()
    k2 = r.host_task()
    k3 = r.host_task(k1, k2)
    got = r.assign_all()
    assert assigned_ids(got) == ids(k1, k2)
    assert all(a.target == Target.HOST_LANE for a in got)
    assert lane_of(r.assignments[k1.id]) != lane_of(r.assignments[k2.id])

    first, second = (k1, k2) if complete_first == "k1" else (k2, k1)
    r.complete(first)
    got = r.assign_all()
    assert assigned_ids(got) == ids(k3)
    assert got[0].eager
    assert lane_of(got[0]) == lane_of(r.assignments[second.id])
    r.complete(second, k3)
    assert r.engine.is_idle()


def test_kernel_is_not_eager_when_its_last_remaining_predecessor_is_on_another_device():
    """out_of_order_engine_tests.cc "instructions with predecessors on multiple devices are
    eagerly assigned only if the last remaining dependency is on the same device".

    k3 (device 0) depends on k1 (device 0) and k2 (device 1).  When k1 completes first, the
    remaining predecessor is on another device's lane, so k3 is not assigned until k2 also
    completes; it then goes to device 0 normally.  (The other branch, k2 completing first and
    k3 going eagerly behind k1, is tests/test_engine.py::
    test_eager_becomes_possible_when_other_predecessor_completes.)"""
    r = EngineRig()
    k1 = r.kernel(device=0)
    k2 = r.kernel(device=1)
    k3 = r.kernel(k1, k2, device=0)
    assert assigned_ids(r.assign_all()) == ids(k1, k2)
    r.complete(k1)
    assert r.assign_all() == []
    r.complete(k2)
    got = r.assign_all()
    assert [a.instruction for a in got] == [k3]
    assert (got[0].target, got[0].device, got[0].eager) == (Target.DEVICE_LANE, 0, False)
    r.complete(k3)
    assert r.engine.is_idle()


@pytest.mark.parametrize("higher", ["k2", "k3"])
def test_overtaken_sibling_loses_eager_eligibility_and_takes_another_lane(higher):
    """out_of_order_engine_tests.cc "eligibility for eager assignment is retracted when an
    instruction is overtaken by a higher-priority sibling".

    k2 and k3 both depend only on host task k1, so both are eager candidates behind it.  The
    higher-priority one is queued behind k1; the other must not be (it would be falsely
    serialized after its sibling).  It is assigned only after k1 completed, on a different host
    lane than k1's (which is still busy with the sibling)."""
    r = EngineRig()
    k1 = r.host_task()
    k2 = r.host_task(k1, priority=1 if higher == "k2" else 0)
    k3 = r.host_task(k1, priority=1 if higher == "k3" else 0)
    hi, lo = (k2, k3) if higher == "k2" else (k3, k2)

    got = r.assign_all()
    assert assigned_ids(got) == ids(k1, hi)
    assert in_order_on_one_lane(got, k1, hi)
    r.complete(k1)

    got = r.assign_all()
    assert assigned_ids(got) == ids(lo)
    assert not got[0].eager
    assert got[0].target == Target.HOST_LANE
    assert lane_of(got[0]) != lane_of(r.assignments[k1.id])
    r.complete(k2, k3)
    assert r.engine.is_idle()


def test_overtaken_eager_candidate_with_the_same_predecessor_is_assigned_exactly_once():
    """out_of_order_engine_tests.cc "multiple conditional-eagerly-assignable instructions with the
    same predecessor can be re-ordered on assignment" (a Celerity regression test).

    k1 runs; k2 and k3 (priority 100) both depend on k1 and are submitted afterwards.  k3
    overtakes k2 and goes eagerly behind k1; k3 then completes before k1.  The engine must not
    fail and must hand k2 out exactly once, never ahead of k1 on another lane.

    celeritas difference: Celerity withholds k2 until k1 completes.  celeritas, seeing k1 as
    the tail of its lane again (k3 retired), queues k2 eagerly behind k1 on k1's lane, which
    equally orders k2 after k1.  The test pins the celeritas choice and the shared property."""
    r = EngineRig()
    k1 = r.kernel(device=0)
    assert r.assign_one().instruction is k1
    k2 = r.kernel(k1, device=0)
    k3 = r.kernel(k1, device=0, priority=100)

    a3 = r.assign_one()
    assert a3.instruction is k3 and a3.eager
    assert lane_of(a3) == lane_of(r.assignments[k1.id])
    r.complete(k3)

    a2 = r.assign_one()
    assert a2 is not None and a2.instruction is k2
    assert a2.eager and lane_of(a2) == lane_of(r.assignments[k1.id])
    assert r.engine.assign_one() is None
    r.complete(k1)
    assert r.engine.assign_one() is None     # k2 is not handed out a second time
    r.complete(k2)
    assert r.engine.is_idle()


# ====================================================================== receive arbiter helpers


class MockRequest(Request):
    def __init__(self):
        self.done = False

    def test(self) -> bool:
        return self.done


class MockRecvComm(Communicator):
    """The arbiter posts payload receives here; the test lands each payload explicitly, which
    requires that the arbiter posted the matching receive before."""

    accepts_strided = True

    def __init__(self, rank=0, num_ranks=4):
        self._rank, self._n = rank, num_ranks
        self.posted: dict[tuple[int, int], tuple] = {}

    rank = property(lambda self: self._rank)
    num_ranks = property(lambda self: self._n)

    def receive_payload(self, from_rank, msg_id, out_array):
        key = (from_rank, msg_id)
        assert key not in self.posted, f"payload {key} posted twice"
        req = MockRequest()
        self.posted[key] = (out_array, req)
        return req

    def land(self, from_rank, msg_id, data):
        key = (from_rank, msg_id)
        assert key in self.posted, f"payload {key} arrived but no receive was posted for it"
        out, req = self.posted.pop(key)
        copy_payload(data, out)
        req.done = True

    def send_pilot(self, to, pilot):
        raise AssertionError("the arbiter never sends")

    def poll_pilots(self):
        return []

    def send_payload(self, to, msg_id, array):
        raise AssertionError("the arbiter never sends")

    def clone(self, key=None):
        raise AssertionError("not used")

    def barrier(self):
        raise AssertionError("not used")

    def collective_handle(self):
        return None


def legal_event_orders(regions, fragments):
    """Every order of ('call', i) / ('pilot', j) / ('data', j) events in which each payload
    arrives after its pilot and after every receive call whose region it intersects."""
    events = ([("call", i) for i in range(len(regions))] + [("pilot", j) for j in range(len(fragments))]
              + [("data", j) for j in range(len(fragments))])
    for order in itertools.permutations(events):
        pos = {ev: k for k, ev in enumerate(order)}
        ok = True
        for j, frag in enumerate(fragments):
            d = pos[("data", j)]
            if pos[("pilot", j)] > d:
                ok = False
                break
            if any(pos[("call", i)] > d for i, r in enumerate(regions) if r.intersects(frag)):
                ok = False
                break
        if ok:
            yield order


def fill_expected(shape, alloc_box, fragments, value_of):
    want = np.zeros(shape, dtype=np.int32)
    for j, b in enumerate(fragments):
        want[b.slices_in(alloc_box)] = value_of(j)
    return want


TRANSFER = (1, 420, 0)


# ====================================================================== receive_arbiter_tests.cc


def test_split_receive_awaited_whole_completes_on_the_last_fragment_in_every_order():
    """receive_arbiter_tests.cc "receive_arbiter aggregates receives from multiple incoming
    fragments" (its "split_await" variant; the "single" variant is
    tests/test_receive_arbiter.py::test_receive_every_order).

    A split receive of a 3-D region made of three fragments from three peers, into an
    allocation whose box does not start at the origin, awaited as a whole: in every legal
    order of receive call, pilots and payloads, the await (and the split receive) complete
    exactly with the last payload, every payload lands at its place in the allocation, and
    awaiting the whole region or one fragment afterwards completes at once."""
    alloc_box = Box((2, 1, 0), (39, 10, 10))
    fragments = [Box((4, 2, 1), (22, 9, 4)), Box((4, 2, 4), (22, 9, 8)), Box((22, 2, 1), (37, 9, 4))]
    region = Region(fragments)
    want = fill_expected(alloc_box.shape, alloc_box, fragments, lambda j: 1 + j)
    split = SplitReceiveInstruction(id=1, transfer=TRANSFER, region=region, dest=1, dest_box=alloc_box)
    whole = AwaitReceiveInstruction(id=2, transfer=TRANSFER, region=region)
    n_orders = 0
    for order in legal_event_orders([region], fragments):
        comm = MockRecvComm(rank=0, num_ranks=4)
        arb = ReceiveArbiter(comm)
        dest = np.zeros(alloc_box.shape, dtype=np.int32)
        handles = []
        completed = []
        for k, (what, j) in enumerate(order):
            for h in handles:
                assert not h.is_done(), order
            if what == "call":
                handles = [arb.begin_receive(split, dest), arb.await_receive(whole)]
            elif what == "pilot":
                arb.on_pilot(1 + j, Pilot(msg_id=10 + j, to=0, transfer=TRANSFER, box=fragments[j]))
            else:
                comm.land(1 + j, 10 + j, np.full(fragments[j].shape, 1 + j, dtype=np.int32))
            completed += arb.poll()
            last = k == len(order) - 1
            assert sorted(completed) == ([1, 2] if last else []), order
        assert all(h.is_done() and h.error() is None for h in handles)
        np.testing.assert_array_equal(dest, want)
        assert comm.posted == {}
        late = [arb.await_receive(AwaitReceiveInstruction(id=3, transfer=TRANSFER, region=region)),
                arb.await_receive(AwaitReceiveInstruction(id=4, transfer=TRANSFER,
                                                          region=Region.from_box(fragments[0])))]
        assert all(h.is_done() for h in late)
        assert sorted(arb.poll()) == [3, 4]
        n_orders += 1
    assert n_orders == 288   # 7 events; each payload after its pilot and after the call


# (receive_arbiter_tests.cc uses one geometry for the next two cases: a 2-D split receive from
# one peer whose awaited sub-regions cut across the two incoming fragments)
SPLIT_ALLOC = Box((2, 1, 0), (19, 20, 1))
SPLIT_REGION = Region.from_box(Box((4, 1, 0), (19, 18, 1)))
SPLIT_FRAGMENTS = [Box((4, 1, 0), (14, 18, 1)), Box((14, 1, 0), (19, 18, 1))]
AWAIT_ACROSS = Region([Box((4, 1, 0), (14, 10, 1)), Box((14, 1, 0), (19, 18, 1))])  # needs both
AWAIT_INSIDE = Region.from_box(Box((4, 10, 0), (14, 18, 1)))                         # needs fragment 0


def test_awaits_cutting_across_fragments_complete_exactly_when_covered_in_every_order():
    """receive_arbiter_tests.cc "receive_arbiter can complete await-receives through
    differently-shaped overlapping fragments".

    Two awaits whose regions do not line up with the incoming fragments (one needs part of
    fragment 0 and all of fragment 1, the other lies inside fragment 0): in every legal order
    of the split receive (with both awaits), pilots and payloads, each await is complete
    exactly when the payloads landed so far cover its region, the split receive exactly when
    all landed, and the data lands in place.  Later awaits of landed data complete at once."""
    awaited = {11: AWAIT_ACROSS, 12: AWAIT_INSIDE}
    want = fill_expected(SPLIT_ALLOC.shape, SPLIT_ALLOC, SPLIT_FRAGMENTS, lambda j: 1 + j)
    split = SplitReceiveInstruction(id=10, transfer=TRANSFER, region=SPLIT_REGION, dest=1,
                                    dest_box=SPLIT_ALLOC)
    n_orders = 0
    for order in legal_event_orders([SPLIT_REGION], SPLIT_FRAGMENTS):
        comm = MockRecvComm(rank=0, num_ranks=2)
        arb = ReceiveArbiter(comm)
        dest = np.zeros(SPLIT_ALLOC.shape, dtype=np.int32)
        handles = {}
        received = Region.empty_region(3)
        for what, j in order:
            if what == "call":
                handles[10] = arb.begin_receive(split, dest)
                for aid, reg in awaited.items():
                    handles[aid] = arb.await_receive(
                        AwaitReceiveInstruction(id=aid, transfer=TRANSFER, region=reg))
            elif what == "pilot":
                arb.on_pilot(1, Pilot(msg_id=10 + j, to=0, transfer=TRANSFER, box=SPLIT_FRAGMENTS[j]))
            else:
                comm.land(1, 10 + j, np.full(SPLIT_FRAGMENTS[j].shape, 1 + j, dtype=np.int32))
                received = received.union(SPLIT_FRAGMENTS[j])
            arb.poll()
            for aid, reg in awaited.items():
                if aid in handles:
                    assert handles[aid].is_done() == received.contains(reg), (order, aid)
            if 10 in handles:
                assert handles[10].is_done() == (received == SPLIT_REGION), order
        assert all(h.is_done() and h.error() is None for h in handles.values())
        np.testing.assert_array_equal(dest, want)
        assert comm.posted == {}
        assert arb.await_receive(AwaitReceiveInstruction(id=13, transfer=TRANSFER,
                                                         region=SPLIT_REGION)).is_done()
        assert arb.await_receive(AwaitReceiveInstruction(
            id=14, transfer=TRANSFER, region=Region.from_box(SPLIT_FRAGMENTS[0]))).is_done()
        n_orders += 1
    assert n_orders == 16   # 5 events; each payload after its pilot and after the call


def test_await_registered_after_its_fragment_landed_completes_immediately():
    """receive_arbiter_tests.cc "receive_arbiter immediately completes await-receives for which
    all corresponding fragments have already been received".

    While a split receive is still in progress (fragment 0 landed, fragment 1 not announced), an
    await whose region lies inside the landed data is complete on registration; one that also
    needs fragment 1 is not, and completes when fragment 1 lands."""
    comm = MockRecvComm(rank=0, num_ranks=2)
    arb = ReceiveArbiter(comm)
    dest = np.zeros(SPLIT_ALLOC.shape, dtype=np.int32)

    def receive_fragment(j):
        arb.on_pilot(1, Pilot(msg_id=10 + j, to=0, transfer=TRANSFER, box=SPLIT_FRAGMENTS[j]))
        arb.poll()
        comm.land(1, 10 + j, np.full(SPLIT_FRAGMENTS[j].shape, 1 + j, dtype=np.int32))
        return arb.poll()

    split = arb.begin_receive(SplitReceiveInstruction(id=10, transfer=TRANSFER, region=SPLIT_REGION,
                                                      dest=1, dest_box=SPLIT_ALLOC), dest)
    assert receive_fragment(0) == []
    assert not split.is_done()

    across = arb.await_receive(AwaitReceiveInstruction(id=11, transfer=TRANSFER, region=AWAIT_ACROSS))
    assert not across.is_done()
    inside = arb.await_receive(AwaitReceiveInstruction(id=12, transfer=TRANSFER, region=AWAIT_INSIDE))
    assert inside.is_done()
    assert arb.poll() == [12]

    assert sorted(receive_fragment(1)) == [10, 11]
    assert across.is_done() and split.is_done()
    np.testing.assert_array_equal(
        dest, fill_expected(SPLIT_ALLOC.shape, SPLIT_ALLOC, SPLIT_FRAGMENTS, lambda j: 1 + j))
    assert comm.posted == {} and not arb.has_active


def test_two_receives_of_one_transfer_complete_each_with_its_own_payload_in_every_order():
    """receive_arbiter_tests.cc "receive_arbiter handles multiple receive instructions for the same
    transfer id".

    Two receive instructions of one transfer, each for the fragment one peer sends: in every legal
    order of the two calls, two pilots and two payloads, each receive is complete exactly once
    its own payload landed (a pilot arriving before its receive waits for it, and is not claimed
    by the other receive), and both fragments land in the shared allocation.
    (tests/test_receive_arbiter.py::test_two_receives_of_one_transfer_and_buffered_pilots pins
    one such order.)"""
    alloc_box = Box((0, 0, 0), (20, 20, 1))
    fragments = [Box((2, 2, 0), (8, 18, 1)), Box((12, 2, 0), (18, 18, 1))]
    regions = [Region.from_box(b) for b in fragments]
    want = fill_expected(alloc_box.shape, alloc_box, fragments, lambda j: 1 + j)
    n_orders = 0
    for order in legal_event_orders(regions, fragments):
        comm = MockRecvComm(rank=0, num_ranks=3)
        arb = ReceiveArbiter(comm)
        dest = np.zeros(alloc_box.shape, dtype=np.int32)
        handles = {}
        landed = set()
        for what, j in order:
            peer, msg = 1 + j, 10 + j
            if what == "call":
                handles[j] = arb.begin_receive(ReceiveInstruction(
                    id=100 + j, transfer=TRANSFER, region=regions[j], dest=1, dest_box=alloc_box), dest)
            elif what == "pilot":
                arb.on_pilot(peer, Pilot(msg_id=msg, to=0, transfer=TRANSFER, box=fragments[j]))
            else:
                comm.land(peer, msg, np.full(fragments[j].shape, peer, dtype=np.int32))
                landed.add(j)
            done_now = arb.poll()
            assert done_now == ([100 + j] if what == "data" else []), order
            for r, h in handles.items():
                assert h.is_done() == (r in landed), order
        assert all(h.is_done() and h.error() is None for h in handles.values())
        np.testing.assert_array_equal(dest, want)
        assert comm.posted == {} and not arb.has_active
        n_orders += 1
    assert n_orders == 80    # each payload after its pilot and after its own receive call
