"""``q.fence(host_object).result()`` is a snapshot taken when the fence ran, not the live object."""
from __future__ import annotations

import threading

import pytest

import celeritas as cl
from celeritas.testing import run_cluster

pytestmark = pytest.mark.timeout(120)


def _append(ho: cl.HostObject, value: int):
    def cgf(cgh):
        lst = cl.side_effect(ho, cgh)
        cgh.host_task(lambda part: lst.append(value), on=cl.on_master_node, name=f"append_{value}")
    return cgf


def test_host_object_fence_result_does_not_change_when_later_host_tasks_run():
    q = cl.Queue()
    live: list = []
    ho = cl.HostObject(live)
    q.submit(_append(ho, 1))
    first = q.fence(ho)
    q.submit(_append(ho, 2))
    second = q.fence(ho)
    q.submit(_append(ho, 3))
    q.wait()
    assert first.result(timeout=30) == [1]
    assert second.result(timeout=30) == [1, 2]
    assert live == [1, 2, 3]
    assert first.result() is not live and second.result() is not live
    q.shutdown()


def test_host_object_fence_snapshot_on_every_simulated_rank():
    def program(rank):
        q = cl.Queue()
        ho = cl.HostObject({"steps": []})
        q.submit(_append_to_steps(ho, "a"))
        snap = q.fence(ho)
        q.submit(_append_to_steps(ho, "b"))
        q.wait()
        return snap.result(timeout=30), ho.obj

    results = run_cluster(program, nodes=2)
    for snap, live in results:
        assert snap == {"steps": ["a"]} and live == {"steps": ["a", "b"]}


def _append_to_steps(ho, value):
    def cgf(cgh):
        d = cl.side_effect(ho, cgh)
        cgh.host_task(lambda part: d["steps"].append(value), on=cl.collective, name=f"step_{value}")
    return cgf


def test_dry_run_fence_returns_a_copy(monkeypatch):
    monkeypatch.setenv("CELERITAS_DRY_RUN_NODES", "2")
    q = cl.Queue()
    live = [0]
    ho = cl.HostObject(live)
    snap = q.fence(ho).result(timeout=30)
    assert snap == [0] and snap is not live
    q.shutdown()


def test_a_host_object_that_cannot_be_copied_fails_its_fence_clearly():
    q = cl.Queue()
    ho = cl.HostObject(threading.Lock())
    with pytest.raises(cl.CeleritasError, match=r"fence of host object H\d+ .*lock cannot be copied"):
        q.fence(ho).result(timeout=30)
    q.shutdown()    # (quiet: the fence raised the failure; a later call raises it again)
    with pytest.raises(cl.CeleritasError, match="lock cannot be copied"):
        q.wait()


def test_a_fence_result_the_user_dropped_is_freed():
    """The runtime kept every fence's future until the next fence (to fail it if the runtime
    failed), and with it the fetched array: a large result the user had dropped stayed
    in memory.  A resolved future leaves that list."""
    import gc
    import weakref

    import numpy as np
    q = cl.Queue(devices="host:1")
    try:
        b = cl.Buffer(np.arange(1 << 20, dtype=np.float32), name="big")
        for _ in range(3):      # (a fence, then one with a fence before it)
            r = q.fence(b).result()
            assert r[-1] == (1 << 20) - 1 and r.dtype == np.float32
            gone = weakref.ref(r)
            del r
            gc.collect()
            assert gone() is None
        q.wait()
    finally:
        q.shutdown()
