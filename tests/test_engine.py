"""Out-of-order engine on synthetic instruction graphs (no executor, no threads)."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from executor.out_of_order_engine import Assignment, OutOfOrderEngine, Target
from scheduler.instruction_graph import (AllocInstruction, CopyInstruction, DeviceKernelInstruction,
                                         EpochInstruction, FillIdentityInstruction,
                                         FreeInstruction, HorizonInstruction,
                                         HostTaskInstruction, ReceiveInstruction, SendInstruction,
                                         device_memory)


def deps(*ids):
    return [(i, "true") for i in ids]


def kernel(i, *pred, device=0, priority=0):
    return DeviceKernelInstruction(id=i, deps=deps(*pred), device=device, priority=priority)


def host(i, *pred, priority=0):
    return HostTaskInstruction(id=i, deps=deps(*pred), priority=priority)


def horizon(i, *pred, priority=0):
    return HorizonInstruction(id=i, deps=deps(*pred), priority=priority)


def where(a: Assignment):
    return (a.instruction.id, a.target, a.device, a.lane, a.eager)


def drain(engine):
    out = []
    while (a := engine.assign_one()) is not None:
        out.append(where(a))
    return out


def test_targets_of_each_kind():
    e = OutOfOrderEngine()
    for instr in [AllocInstruction(id=1, memory=2), FreeInstruction(id=2), SendInstruction(id=3),
                  ReceiveInstruction(id=4), EpochInstruction(id=5), FillIdentityInstruction(id=6),
                  CopyInstruction(id=7, source_memory=0, dest_memory=1),
                  CopyInstruction(id=8, source_memory=1, dest_memory=device_memory(1)),
                  kernel(9, device=1)]:
        e.submit(instr)
    got = {iid: (t, d) for iid, t, d, _, _ in drain(e)}
    assert got == {1: (Target.ALLOC_QUEUE, None), 2: (Target.ALLOC_QUEUE, None),
                   3: (Target.IMMEDIATE, None), 4: (Target.IMMEDIATE, None),
                   5: (Target.IMMEDIATE, None), 6: (Target.HOST_LANE, None),
                   7: (Target.HOST_LANE, None), 8: (Target.DEVICE_LANE, 1),
                   9: (Target.DEVICE_LANE, 1)}


def test_chain_on_one_device_is_eagerly_assigned_to_one_lane():
    e = OutOfOrderEngine()
    for i in (1, 2, 3):
        e.submit(kernel(i, *( [i - 1] if i > 1 else [])))
    assert drain(e) == [(1, Target.DEVICE_LANE, 0, 0, False),
                        (2, Target.DEVICE_LANE, 0, 0, True),
                        (3, Target.DEVICE_LANE, 0, 0, True)]
    e.complete(1)
    e.complete(2)
    assert not e.is_idle()
    e.complete(3)
    assert e.is_idle()


def test_chain_of_immediate_instructions_runs_one_at_a_time():
    e = OutOfOrderEngine()
    e.submit(horizon(1))
    e.submit(horizon(2, 1))
    e.submit(horizon(3, 2))
    assert [x[0] for x in drain(e)] == [1]
    e.complete(1)
    assert [x[0] for x in drain(e)] == [2]
    e.complete(2)
    assert drain(e) == [(3, Target.IMMEDIATE, None, None, False)]
    e.complete(3)
    assert e.is_idle()


@pytest.mark.parametrize("order", ["BC", "CB"])
def test_diamond(order):
    e = OutOfOrderEngine()
    e.submit(kernel(1, device=0))          # A
    e.submit(kernel(2, 1, device=0))       # B: behind A on the same lane
    e.submit(kernel(3, 1, device=1))       # C: another device, must wait for A
    e.submit(host(4, 2, 3))                # D
    assert drain(e) == [(1, Target.DEVICE_LANE, 0, 0, False), (2, Target.DEVICE_LANE, 0, 0, True)]
    e.complete(1)
    assert drain(e) == [(3, Target.DEVICE_LANE, 1, 0, False)]
    first, second = (2, 3) if order == "BC" else (3, 2)
    e.complete(first)
    assert drain(e) == []      # D's remaining predecessor sits on a device lane: incompatible
    e.complete(second)
    assert drain(e) == [(4, Target.HOST_LANE, None, 0, False)]
    e.complete(4)
    assert e.is_idle()


def test_eager_only_behind_the_tail_of_the_lane():
    e = OutOfOrderEngine()
    e.submit(kernel(1))
    e.submit(kernel(2, 1))     # eager behind 1
    assert drain(e) == [(1, Target.DEVICE_LANE, 0, 0, False), (2, Target.DEVICE_LANE, 0, 0, True)]
    e.submit(kernel(3, 1))     # depends on 1 only, but 2 is the tail now: no false serialization
    assert drain(e) == []
    e.complete(1)
    # ready now; lane 0 still busy with 2, so a new lane opens
    assert drain(e) == [(3, Target.DEVICE_LANE, 0, 1, False)]


def test_eager_with_several_predecessors_on_one_lane():
    e = OutOfOrderEngine()
    e.submit(kernel(1))
    e.submit(kernel(2, 1))
    e.submit(kernel(3, 1, 2))  # both predecessors on lane 0, 2 is the tail
    assert [x[4] for x in drain(e)] == [False, True, True]


def test_eager_becomes_possible_when_other_predecessor_completes():
    e = OutOfOrderEngine()
    e.submit(kernel(1, device=0))
    e.submit(kernel(2, device=1))
    e.submit(kernel(3, 1, 2, device=0))   # preds on two lanes: not eager
    assert [x[0] for x in drain(e)] == [1, 2]
    e.complete(2)                          # now only 1 (tail of D0 lane 0) remains
    assert drain(e) == [(3, Target.DEVICE_LANE, 0, 0, True)]


def test_eager_to_incompatible_target_is_refused():
    e = OutOfOrderEngine()
    e.submit(host(1))
    e.submit(kernel(2, 1))
    assert [x[0] for x in drain(e)] == [1]
    e.complete(1)
    assert drain(e) == [(2, Target.DEVICE_LANE, 0, 0, False)]


def test_device_to_device_copy_goes_eagerly_behind_the_source_kernel():
    e = OutOfOrderEngine()
    e.submit(kernel(1, device=1))
    e.submit(CopyInstruction(id=2, deps=deps(1), source_memory=device_memory(1),
                             dest_memory=device_memory(0)))
    e.submit(CopyInstruction(id=3, source_memory=device_memory(1), dest_memory=device_memory(0)))
    got = drain(e)
    assert (1, Target.DEVICE_LANE, 1, 0, False) in got
    assert (2, Target.DEVICE_LANE, 1, 0, True) in got
    assert (3, Target.DEVICE_LANE, 0, 0, False) in got   # ready copy: destination device


def test_priorities_then_ids():
    e = OutOfOrderEngine()
    for i, p in [(1, 0), (2, 5), (3, 5), (4, -1), (5, 7)]:
        e.submit(horizon(i, priority=p))
    assert [x[0] for x in drain(e)] == [5, 2, 3, 1, 4]


def test_priority_among_newly_ready_instructions():
    e = OutOfOrderEngine()
    e.submit(horizon(1))
    e.submit(horizon(2, 1, priority=0))
    e.submit(horizon(3, 1, priority=3))
    e.submit(horizon(4, priority=1))
    assert [x[0] for x in drain(e)] == [4, 1]
    e.complete(1)
    assert [x[0] for x in drain(e)] == [3, 2]


def test_lane_reuse_and_limit():
    e = OutOfOrderEngine(max_device_lanes=2)
    e.submit(kernel(1))
    assert drain(e) == [(1, Target.DEVICE_LANE, 0, 0, False)]
    e.complete(1)
    e.submit(kernel(2))
    assert drain(e) == [(2, Target.DEVICE_LANE, 0, 0, False)]     # idle lane 0 reused
    e.submit(kernel(3))
    e.submit(kernel(4))
    assert drain(e) == [(3, Target.DEVICE_LANE, 0, 1, False)]     # 4 waits: limit of 2 lanes
    assert e.lane_count(Target.DEVICE_LANE, 0) == 2
    e.submit(kernel(5, device=1))                                  # other devices unaffected
    assert drain(e) == [(5, Target.DEVICE_LANE, 1, 0, False)]
    e.complete(3)
    assert drain(e) == [(4, Target.DEVICE_LANE, 0, 1, False)]
    assert e.lane_count(Target.DEVICE_LANE, 0) == 2


def test_host_lanes_limit():
    e = OutOfOrderEngine(max_host_lanes=1)
    for i in (1, 2, 3):
        e.submit(host(i))
    assert [x[0] for x in drain(e)] == [1]
    e.complete(1)
    assert [x[0] for x in drain(e)] == [2]


def test_saturated_target_releases_waiters_by_priority():
    e = OutOfOrderEngine(max_host_lanes=1)
    for i, p in [(1, 0), (2, 1), (3, 9), (4, 5), (5, 5)]:
        e.submit(host(i, priority=p))
    order = []
    while not e.is_idle():
        got = drain(e)
        assert len(got) == 1            # one lane: one at a time
        order.append(got[0][0])
        e.complete(got[0][0])
    assert order == [3, 4, 5, 2, 1]


def test_unknown_and_retired_predecessors_are_complete():
    e = OutOfOrderEngine()
    e.submit(horizon(10, 3, 4))      # never seen
    assert [x[0] for x in drain(e)] == [10]
    e.complete(10)
    e.submit(horizon(11, 10))        # retired
    assert [x[0] for x in drain(e)] == [11]
    e.complete(11)
    e.complete(99)                   # unknown completion is ignored
    assert e.is_idle()


def test_duplicate_submit_rejected():
    e = OutOfOrderEngine()
    e.submit(horizon(1))
    with pytest.raises(ValueError):
        e.submit(horizon(1))


# ------------------------------------------------------------------ random graphs


def _random_graph(rng: random.Random, n: int):
    instrs = []
    for i in range(1, n + 1):
        preds = sorted(rng.sample(range(1, i), min(i - 1, rng.randint(0, 3)))) if i > 1 else []
        kind = rng.choice(["k0", "k1", "host", "imm", "copy"])
        prio = rng.choice([0, 0, 0, 1, 2])
        if kind == "k0":
            instrs.append(kernel(i, *preds, device=0, priority=prio))
        elif kind == "k1":
            instrs.append(kernel(i, *preds, device=1, priority=prio))
        elif kind == "host":
            instrs.append(host(i, *preds, priority=prio))
        elif kind == "copy":
            instrs.append(CopyInstruction(id=i, deps=deps(*preds), priority=prio,
                                          source_memory=device_memory(0), dest_memory=device_memory(1)))
        else:
            instrs.append(horizon(i, *preds, priority=prio))
    return instrs


def _simulate(instrs, rng: random.Random, submit_stride: int, lanes: int, eager_filter=None):
    """Feed ``instrs`` in chunks, complete assigned work in random (lane-respecting) order,
    and check the engine never lets an instruction run before its predecessors (and that
    ``has_ready`` is True exactly when a non-eager assignment is possible)."""
    e = OutOfOrderEngine(max_host_lanes=lanes, max_device_lanes=lanes, eager_filter=eager_filter)
    by_id = {x.id: x for x in instrs}
    completed: set[int] = set()
    assigned: dict[int, tuple] = {}
    lane_queues: dict[tuple, list[int]] = {}
    running: list[int] = []            # non-lane assignments
    pos = 0
    while len(completed) < len(instrs):
        if pos < len(instrs) and (rng.random() < 0.5 or not (running or any(lane_queues.values()))):
            for x in instrs[pos:pos + submit_stride]:
                e.submit(x)
            pos += submit_stride
        while (a := e.assign_one()) is not None:
            iid = a.instruction.id
            assert a.eager or e_had_ready(e, iid, by_id, completed)
            assert iid not in assigned, "assigned twice"
            incomplete = [p for p in by_id[iid].dep_ids if p not in completed]
            key = (a.target, a.device, a.lane)
            if a.eager:
                q = lane_queues[key]
                assert incomplete and all(p in q for p in incomplete)
                assert q[-1] in incomplete
            else:
                assert incomplete == [], f"I{iid} assigned before {incomplete} completed"
            assigned[iid] = key
            if a.lane is None:
                running.append(iid)
            else:
                lane_queues.setdefault(key, []).append(iid)
        ready_left = [x.id for x in instrs[:pos] if x.id not in assigned
                      and all(p in completed for p in x.dep_ids)]
        assert e.has_ready() == bool(ready_left)      # (left over only when every lane is busy)
        # complete one random piece of work: any non-lane one or the head of a lane
        choices = list(running) + [q[0] for q in lane_queues.values() if q]
        if not choices:
            assert pos < len(instrs), "engine stalled"
            continue
        iid = rng.choice(choices)
        assert all(p in completed for p in by_id[iid].dep_ids), f"I{iid} ran before a predecessor"
        if iid in running:
            running.remove(iid)
        else:
            lane_queues[assigned[iid]].pop(0)
        completed.add(iid)
        e.complete(iid)
    assert e.is_idle()
    assert set(assigned) == set(by_id)


def e_had_ready(e, iid, by_id, completed) -> bool:
    """A non-eager assignment is of an instruction whose predecessors all completed."""
    return all(p in completed for p in by_id[iid].dep_ids)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40), stride=st.integers(1, 8),
       lanes=st.integers(1, 3))
def test_random_graphs_complete_in_any_order(seed, n, stride, lanes):
    rng = random.Random(seed)
    _simulate(_random_graph(rng, n), rng, stride, lanes)


# ------------------------------------------------------------------ eager filter, ready count


def test_declined_eager_assignment_waits_until_its_predecessor_completed():
    seen = []

    def decline(instr, lane):
        seen.append((instr.id, lane.key, lane.index))
        return False

    e = OutOfOrderEngine(eager_filter=decline)
    e.submit(kernel(1))
    e.submit(kernel(2, 1))
    assert drain(e) == [(1, Target.DEVICE_LANE, 0, 0, False)]
    assert seen == [(2, (Target.DEVICE_LANE, 0), 0)]      # asked once, with the lane it would go to
    assert drain(e) == []
    e.complete(1)
    assert drain(e) == [(2, Target.DEVICE_LANE, 0, 0, False)]
    assert len(seen) == 1                                 # not asked again once ready
    e.complete(2)
    assert e.is_idle()


def test_eager_filter_sees_only_eager_candidates_and_may_accept():
    asked = []
    e = OutOfOrderEngine(eager_filter=lambda instr, lane: asked.append(instr.id) or instr.id == 3)
    e.submit(kernel(1))
    e.submit(kernel(2, 1))          # declined
    e.submit(kernel(3, 1))          # accepted: queued behind 1
    e.submit(kernel(4))             # ready: never asked
    got = drain(e)
    assert (3, Target.DEVICE_LANE, 0, 0, True) in got and (4, Target.DEVICE_LANE, 0, 1, False) in got
    assert sorted(asked) == [2, 3]


@pytest.mark.parametrize("order", ["complete first", "assign first"])
def test_has_ready_counts_instructions_whose_predecessors_completed(order):
    e = OutOfOrderEngine()
    assert not e.has_ready()
    e.submit(kernel(1))
    e.submit(kernel(2, 1))           # an eager candidate once 1 is assigned: not ready
    e.submit(horizon(3, 1))
    assert e.has_ready()             # 1
    a = e.assign_one()
    assert a.instruction.id == 1 and not e.has_ready()
    assert e.assign_one().instruction.id == 2          # eager, behind 1
    assert not e.has_ready()
    e.complete(1)
    assert e.has_ready()             # 3 (2 is assigned already)
    if order == "complete first":
        e.complete(2)
        assert e.has_ready()
    assert e.assign_one().instruction.id == 3 and not e.has_ready()
    e.complete(3)
    e.complete(2)
    assert e.is_idle() and not e.has_ready()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40), stride=st.integers(1, 8),
       lanes=st.integers(1, 3))
def test_random_graphs_complete_in_any_order_with_a_random_eager_filter(seed, n, stride, lanes):
    rng = random.Random(seed)
    _simulate(_random_graph(rng, n), rng, stride, lanes,
              eager_filter=lambda instr, lane: rng.random() < 0.5)


def test_would_assign_at_once_means_every_predecessor_complete_and_nothing_else_ready():
    e = OutOfOrderEngine()
    assert e.would_assign_at_once(kernel(5, 1, 2))          # predecessors unknown: complete long ago
    e.submit(kernel(1))
    assert not e.would_assign_at_once(kernel(6))            # kernel 1 is ready: it comes first
    assert drain(e) == [(1, Target.DEVICE_LANE, 0, 0, False)]
    assert e.would_assign_at_once(kernel(7))                # 1 runs; nothing else is ready
    assert not e.would_assign_at_once(kernel(8, 1))         # 1 has not completed
    e.complete(1)
    assert e.would_assign_at_once(kernel(9, 1))
    e.submit(kernel(2, 3))                                  # pending on an unknown (complete) id: ready
    assert not e.would_assign_at_once(kernel(10))
