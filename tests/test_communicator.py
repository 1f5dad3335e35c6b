"""Single-rank and in-process communicators."""
from __future__ import annotations

import operator
import threading

import numpy as np
import pytest

from executor.communicator import (CommunicatorError, InProcessCluster, SingleRankCommunicator,
                                   copy_payload)
from scheduler.geometry import Box
from scheduler.instruction_graph import Pilot


def run_ranks(n, fn, timeout=30):
    """Run fn(rank) on n threads; re-raise the first failure; return results by rank."""
    results = [None] * n
    errors = []

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "rank thread hung"
    if errors:
        raise errors[0]
    return results


def pilot(msg_id, to, box=Box((0,), (4,)), transfer=(1, 2, 0)):
    return Pilot(msg_id=msg_id, to=to, transfer=transfer, box=box)


def test_single_rank():
    c = SingleRankCommunicator()
    assert (c.rank, c.num_ranks) == (0, 1)
    assert c.poll_pilots() == []
    c.barrier()
    with pytest.raises(CommunicatorError):
        c.send_pilot(1, pilot(0, 1))
    with pytest.raises(CommunicatorError):
        c.send_payload(1, 0, np.zeros(2))
    h = c.clone().collective_handle()
    assert (h.Get_rank(), h.Get_size()) == (0, 1)
    assert h.bcast([1, 2]) == [1, 2]
    assert h.allreduce(5) == 5
    assert h.allgather("x") == ["x"]
    assert h.gather(3) == [3]
    h.barrier()


@pytest.mark.timeout(60)
def test_pilots_are_delivered_in_order_per_sender():
    cluster = InProcessCluster(3)
    comms = [cluster.communicator(r) for r in range(3)]
    for i in range(5):
        comms[0].send_pilot(2, pilot(i, 2))
        comms[1].send_pilot(2, pilot(100 + i, 2))
    got = comms[2].poll_pilots()
    assert comms[2].poll_pilots() == []
    assert comms[0].poll_pilots() == [] and comms[1].poll_pilots() == []
    assert [p.msg_id for fr, p in got if fr == 0] == list(range(5))
    assert [p.msg_id for fr, p in got if fr == 1] == list(range(100, 105))
    with pytest.raises(CommunicatorError):
        comms[0].send_pilot(0, pilot(9, 0))     # not to itself
    with pytest.raises(CommunicatorError):
        comms[0].send_pilot(3, pilot(9, 3))     # out of range


@pytest.mark.timeout(60)
@pytest.mark.parametrize("send_first", [True, False])
def test_payload_rendezvous_either_order(send_first):
    cluster = InProcessCluster(2)
    a, b = cluster.communicator(0), cluster.communicator(1)
    data = np.arange(12, dtype=np.float64).reshape(3, 4)
    out = np.zeros((3, 4))
    if send_first:
        s = a.send_payload(1, 7, data)
        assert not s.test()
        r = b.receive_payload(0, 7, out)
    else:
        r = b.receive_payload(0, 7, out)
        assert not r.test()
        s = a.send_payload(1, 7, data)
    assert s.test() and r.test()
    np.testing.assert_array_equal(out, data)
    # same msg id from another sender / to another receiver does not match
    other = np.zeros(2)
    r2 = b.receive_payload(0, 8, other)
    assert not r2.test()


@pytest.mark.timeout(60)
def test_payload_into_strided_view_and_bytes():
    cluster = InProcessCluster(2)
    a, b = cluster.communicator(0), cluster.communicator(1)
    dest = np.zeros((4, 6), dtype=np.int32)
    r = b.receive_payload(0, 1, dest[1:3, 2:5])          # non-contiguous view
    a.send_payload(1, 1, np.arange(6, dtype=np.int32).reshape(2, 3))
    assert r.wait(5)
    np.testing.assert_array_equal(dest[1:3, 2:5], np.arange(6).reshape(2, 3))
    assert dest.sum() == 15
    slots = np.zeros(16, dtype=np.uint8)                 # gather slots are raw bytes
    r = b.receive_payload(0, 2, slots[8:16])
    a.send_payload(1, 2, np.array([3.5]))
    assert r.wait(5)
    assert slots[8:16].view(np.float64)[0] == 3.5 and slots[:8].sum() == 0


@pytest.mark.timeout(60)
def test_payload_size_mismatch_fails_both_requests():
    cluster = InProcessCluster(2)
    a, b = cluster.communicator(0), cluster.communicator(1)
    r = b.receive_payload(0, 1, np.zeros(3, dtype=np.uint8))
    s = a.send_payload(1, 1, np.zeros(4, dtype=np.uint8))
    with pytest.raises(CommunicatorError, match="does not fit"):
        r.test()
    with pytest.raises(CommunicatorError):
        s.test()


def test_copy_payload_same_dtype_reshapes():
    out = np.zeros((2, 2))
    copy_payload(np.arange(4.0), out)
    np.testing.assert_array_equal(out, [[0, 1], [2, 3]])


@pytest.mark.timeout(60)
def test_notifier_on_pilot_and_on_completion():
    cluster = InProcessCluster(2)
    a, b = cluster.communicator(0), cluster.communicator(1)
    hits = {0: 0, 1: 0}
    a.set_notifier(lambda: hits.__setitem__(0, hits[0] + 1))
    b.set_notifier(lambda: hits.__setitem__(1, hits[1] + 1))
    a.send_pilot(1, pilot(0, 1))
    assert hits == {0: 0, 1: 1}
    b.receive_payload(0, 0, np.zeros(4))
    a.send_payload(1, 0, np.ones(4))      # second side: completes and notifies the peer (rank 1)
    assert hits == {0: 0, 1: 2}
    b.set_notifier(None)
    a.send_pilot(1, pilot(1, 1))
    assert hits == {0: 0, 1: 2}


@pytest.mark.timeout(60)
def test_barrier_and_collectives_across_threads():
    n = 4
    cluster = InProcessCluster(n, timeout=20)

    def body(r):
        comm = cluster.communicator(r)
        comm.barrier()
        h = comm.clone(key=5).collective_handle()
        out = {
            "rank": (h.Get_rank(), h.Get_size()),
            "bcast": h.bcast({"v": 42} if r == 2 else None, root=2),
            "sum": h.allreduce(r + 1),
            "max": h.allreduce(r, op=max),
            "prod": h.allreduce(r + 1, op=operator.mul),
            "all": h.allgather(r * 10),
            "gather": h.gather(r, root=1),
        }
        for _ in range(20):      # reused barriers must not mix generations
            h.barrier()
        out["again"] = h.allgather(-r)
        return out

    res = run_ranks(n, body)
    for r, o in enumerate(res):
        assert o["rank"] == (r, n)
        assert o["bcast"] == {"v": 42}
        assert o["sum"] == 10 and o["max"] == 3 and o["prod"] == 24
        assert o["all"] == [0, 10, 20, 30]
        assert o["gather"] == ([0, 1, 2, 3] if r == 1 else None)
        assert o["again"] == [0, -1, -2, -3]


@pytest.mark.timeout(60)
def test_received_objects_are_copies():
    cluster = InProcessCluster(2, timeout=20)

    def body(r):
        h = cluster.communicator(r).collective_handle()
        obj = [r]
        got = h.allgather(obj)
        got[1 - r].append("mutated")
        h.barrier()
        return obj

    assert run_ranks(2, body) == [[0], [1]]


@pytest.mark.timeout(60)
def test_clones_are_isolated_and_matched_by_key():
    cluster = InProcessCluster(2, timeout=20)
    a, b = cluster.communicator(0), cluster.communicator(1)
    a1, b1 = a.clone(key="g1"), b.clone(key="g1")
    a.send_pilot(1, pilot(1, 1))
    a1.send_pilot(1, pilot(2, 1))
    assert [p.msg_id for _, p in b.poll_pilots()] == [1]
    assert [p.msg_id for _, p in b1.poll_pilots()] == [2]
    # payloads of the same msg id on different communicators do not match
    r_root = b.receive_payload(0, 3, np.zeros(1))
    a1.send_payload(1, 3, np.ones(1))
    assert not r_root.test()
    # unkeyed clones match by order, like MPI_Comm_dup
    a2, b2 = a.clone(), b.clone()
    out = np.zeros(1)
    r = b2.receive_payload(0, 0, out)
    a2.send_payload(1, 0, np.full(1, 9.0))
    assert r.test() and out[0] == 9.0


@pytest.mark.timeout(60)
def test_abort_breaks_a_waiting_barrier():
    cluster = InProcessCluster(2)
    errors = []

    def waiter():
        try:
            cluster.communicator(0).barrier()
        except CommunicatorError as exc:
            errors.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    # wait until rank 0 is inside the barrier, then abort instead of joining it
    for _ in range(1000):
        if cluster._state.groups and next(iter(cluster._state.groups.values())).barrier.n_waiting:
            break
        threading.Event().wait(0.005)
    cluster.abort()
    t.join(10)
    assert not t.is_alive()
    assert len(errors) == 1
    with pytest.raises(CommunicatorError):
        cluster.communicator(1).barrier()
    r = cluster.communicator(1).receive_payload(0, 0, np.zeros(1))
    with pytest.raises(CommunicatorError):
        r.test()


@pytest.mark.timeout(60)
def test_abort_fails_posted_requests_and_pilot_polls():
    cluster = InProcessCluster(2)
    a, b = cluster.communicator(0), cluster.communicator(1)
    woken = []
    b.set_notifier(lambda: woken.append(1))
    r = b.receive_payload(0, 1, np.zeros(2))
    a.send_pilot(1, pilot(5, 1))
    woken.clear()
    cluster.abort()
    assert woken                                   # the waiting executor is woken up
    with pytest.raises(CommunicatorError, match="aborted"):
        r.test()
    assert [p.msg_id for _, p in b.poll_pilots()] == [5]   # what arrived is still delivered
    with pytest.raises(CommunicatorError, match="aborted"):
        b.poll_pilots()
