"""The application thread never runs more than ``CELERITAS_MAX_TASKS_AHEAD`` tasks ahead of the executor.

Without the bound a loop that submits faster than kernels run queues tasks, commands and
instructions without limit.  The bound is made small here so that a short program hits it.
"""
import time

import numpy as np
import pytest

import celeritas as cl
from celeritas.testing import run_cluster

pytestmark = pytest.mark.timeout(120)

AHEAD = 16


@pytest.mark.parametrize("nodes,devices", [(1, 1), (2, 2)])
def test_slow_kernels_hold_the_application_thread_within_the_bound(capfd, nodes, devices):
    def program(rank):
        q = cl.Queue()
        rt = q.runtime
        buf = cl.Buffer(np.zeros(8, np.int64))
        lags = []

        def cgf(cgh):
            a = buf.access(cgh, cl.one_to_one(), "read_write")

            @cgh.parallel_for((8,))
            def step(chunk):
                time.sleep(0.002)
                a[chunk] += 1

        for _ in range(120):
            q.submit(cgf)
            lags.append(rt.tasks_ahead)
        values = q.fence(buf).result()
        return values.tolist(), max(lags), rt.throttled_count

    results = run_cluster(program, nodes=nodes, devices=devices, CELERITAS_SUMMARY="1",
                          CELERITAS_MAX_TASKS_AHEAD=str(AHEAD))
    for values, max_lag, throttled in results:
        assert values == [120] * 8
        assert throttled > 0
        assert max_lag <= AHEAD
    most = max(r[2] for r in results)
    assert f"waited {most}× for the executor to catch up" in capfd.readouterr().err


def test_held_lookahead_is_flushed_before_waiting():
    """With lookahead ``infinite`` and a growing access, commands are held until an epoch;
    the throttle must flush them, or the horizons it waits for never execute."""
    n = 100

    def program(rank):
        q = cl.Queue(lookahead="infinite")
        buf = cl.Buffer(np.zeros(n, np.int64))
        for i in range(1, n + 1):
            def cgf(cgh, i=i):
                a = buf.access(cgh, cl.one_to_one(), "read_write")

                @cgh.parallel_for((i,))
                def grow(chunk):
                    a[chunk] += 1
            q.submit(cgf)
        return q.fence(buf).result().tolist(), q.runtime.throttled_count

    for values, throttled in run_cluster(program, nodes=2, devices=2, CELERITAS_MAX_TASKS_AHEAD=str(AHEAD)):
        assert values == [n - k for k in range(n)]
        assert throttled > 0


def test_no_throttle_below_the_bound():
    def program(rank):
        q = cl.Queue()
        buf = cl.Buffer(np.zeros(4, np.int64))
        for _ in range(50):
            def cgf(cgh):
                a = buf.access(cgh, cl.one_to_one(), "read_write")

                @cgh.parallel_for((4,))
                def inc(chunk):
                    a[chunk] += 1
            q.submit(cgf)
        return q.fence(buf).result().tolist(), q.runtime.throttled_count

    assert run_cluster(program, nodes=1, devices=1) == [([50] * 4, 0)]


def test_the_bound_is_configured_and_checked():
    from celeritas import config as cfg
    from scheduler.errors import ConfigError
    assert cfg.from_env({}).max_tasks_ahead == 512
    assert cfg.from_env({"CELERITAS_MAX_TASKS_AHEAD": "64"}).max_tasks_ahead == 64
    with pytest.raises(ConfigError, match="CELERITAS_MAX_TASKS_AHEAD"):
        cfg.from_env({"CELERITAS_MAX_TASKS_AHEAD": "1"})


def _submit_behind_a_gate(devices: str, items: int, tasks: int):
    """A host task that waits for a gate, then ``tasks`` increments submitted behind it by
    this thread, which opens the gate only after them (also on failure).  Returns the
    queue, the buffer's final value, the seconds the submits took and ``paused_count``
    right after them."""
    import threading
    q = cl.Queue(devices=devices)
    q.runtime.max_tasks_ahead = max(q.runtime.max_tasks_ahead, 2 * tasks + 2)   # (the pauses, not the bound)
    buf = cl.Buffer(np.zeros(items, np.int64))
    gate = threading.Event()

    def blocked(cgh):
        a = buf.access(cgh, cl.one_to_one(), "read_write")
        cgh.host_task(lambda part: (gate.wait(30), a.__setitem__(part, a[part] + 1)), range=(items,))

    def inc(cgh):
        a = buf.access(cgh, cl.one_to_one(), "read_write")
        cgh.parallel_for((items,), lambda chunk: a.__setitem__(chunk, a[chunk] + 1), name="inc")

    q.submit(blocked)                 # nothing after it can run until the gate opens...
    t0 = time.perf_counter()
    try:
        for _ in range(tasks):        # ...which this thread does only after these submits
            q.submit(inc)
        paused = q.runtime.paused_count
    finally:
        gate.set()
    waited = time.perf_counter() - t0
    return q, q.fence(buf).result(30), waited, paused


def test_running_far_ahead_pauses_the_application_thread_briefly():
    """Beyond PAUSE_AHEAD tasks ahead of the executor the application thread gives the GIL
    up for a moment every PAUSE_AHEAD // 2 tasks (below the hard bound, so never for long)."""
    PAUSE_AHEAD = 128                 # the default CELERITAS_PAUSE_AHEAD
    n = 4 * PAUSE_AHEAD
    q, values, waited, paused = _submit_behind_a_gate("host:2", 8, n)
    np.testing.assert_array_equal(values, np.full(8, n + 1))
    # each pause timed out (the executor could not advance): bounded, not a deadlock
    assert paused >= (n - PAUSE_AHEAD) // (PAUSE_AHEAD // 2) - 1
    assert waited < 5.0
    q.shutdown()


def test_pause_setting():
    from celeritas import config as cfg
    assert cfg.from_env({}).pause_ahead == 128
    assert cfg.from_env({"CELERITAS_PAUSE_AHEAD": "0"}).pause_ahead == 0
    with pytest.raises(cl.ConfigError, match="CELERITAS_PAUSE_AHEAD"):
        cfg.from_env({"CELERITAS_PAUSE_AHEAD": "-1"})

    def program(rank):
        q = cl.Queue()
        for _ in range(40):
            q.submit(lambda cgh: cgh.parallel_for((2,), lambda chunk: None, name="n"))
        q.wait()
        return q.runtime.paused_count

    assert run_cluster(program, nodes=1, CELERITAS_PAUSE_AHEAD="0") == [0]


def test_no_pause_while_the_executor_waits_for_the_network(monkeypatch):
    """A latency-bound pipeline (the executor waits for its peers) is better served by an
    application thread that submits everything at once: no pauses then."""
    from executor.executor import Executor
    monkeypatch.setattr(Executor, "waits_for_network", property(lambda self: True))
    q, values, _waited, paused = _submit_behind_a_gate("host:1", 4, 400)
    np.testing.assert_array_equal(values, np.full(4, 401))
    q.shutdown()
    assert paused == 0
