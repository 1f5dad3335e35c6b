"""A call that blocks longer than CELERITAS_WAIT_WARNING says once what the rank waits for."""
from __future__ import annotations

import logging
import re
import time

import numpy as np
import pytest

import celeritas as cl
from celeritas.config import from_env
from celeritas.testing import run_cluster

pytestmark = pytest.mark.timeout(120)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "celeritas.runtime" and r.levelno == logging.WARNING and "has waited" in r.getMessage()]


def test_fence_result_names_the_fence_and_the_running_host_task(monkeypatch, caplog):
    monkeypatch.setenv("CELERITAS_WAIT_WARNING", "0.5")
    caplog.set_level(logging.WARNING, logger="celeritas")
    q = cl.Queue(devices="host:1")
    b = cl.Buffer(np.zeros(4, np.float32), name="slow")

    def sleeper(cgh):
        b.access(cgh, cl.all(), cl.read_write)
        cgh.host_task(lambda part: time.sleep(2.0), on=cl.on_master_node, name="sleeper")

    q.submit(sleeper)
    assert q.fence(b).result(timeout=30).tolist() == [0, 0, 0, 0]
    q.shutdown()
    got = _warnings(caplog)
    assert len(got) == 1, got                         # once, not every poll
    text = got[0]
    assert re.match(r'celeritas rank 0: the fence\'s result\(\) has waited \d+\.\d s for T2 \(fence of B0 "slow"\); '
                    r'this rank still waits for:\n', text), text
    assert re.search(r"\n  - host_task of task T1 'sleeper' on host\.lane0, running for \d+\.\d s(\n|$)", text), text
    # (the fence's copy of B0 is not queued behind the host task: the executor runs such
    # a small copy itself once the host task completed)


def test_wait_on_a_simulated_cluster_names_the_missing_data(caplog):
    caplog.set_level(logging.WARNING, logger="celeritas")

    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(shape=(16,), dtype=np.float32, name="halo")
        if rank == 1:
            time.sleep(2.0)

        def produce(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((16,), lambda chunk: w.__setitem__(chunk, 1.0), name="produce")

        def consume(cgh):
            b.access(cgh, cl.all(), cl.read)
            cgh.parallel_for((16,), lambda chunk: None, name="consume")

        q.submit(produce)
        q.submit(consume)
        q.wait()

    run_cluster(program, nodes=2, CELERITAS_WAIT_WARNING="0.5")
    got = _warnings(caplog)
    assert len(got) == 1, got
    assert re.fullmatch(r'celeritas rank 0: q\.wait\(\) has waited \d+\.\d s for T3 \(epoch\); this rank still '
                        r'waits for:\n'
                        r'  - receive of B0 "halo" for task T2: \[8:16\] still missing, no rank has announced it yet\n'
                        r'  - send of B0 "halo" for task T2 to rank 1 \(until rank 1 receives it\)', got[0]), got


def test_no_warning_when_switched_off(monkeypatch, caplog):
    monkeypatch.setenv("CELERITAS_WAIT_WARNING", "off")
    caplog.set_level(logging.WARNING, logger="celeritas")
    q = cl.Queue(devices="host:1")
    b = cl.Buffer(np.zeros(4, np.float32))

    def sleeper(cgh):
        b.access(cgh, cl.all(), cl.read_write)
        cgh.host_task(lambda part: time.sleep(0.3), on=cl.on_master_node)

    q.submit(sleeper)
    q.wait()
    q.shutdown()
    assert _warnings(caplog) == []


def test_wait_warning_setting():
    assert from_env({}).wait_warning == 10.0
    assert from_env({"CELERITAS_WAIT_WARNING": "2.5"}).wait_warning == 2.5
    assert from_env({"CELERITAS_WAIT_WARNING": "off"}).wait_warning is None
    with pytest.raises(cl.ConfigError, match="CELERITAS_WAIT_WARNING='soon' is not a number of seconds"):
        from_env({"CELERITAS_WAIT_WARNING": "soon"})
    with pytest.raises(cl.ConfigError, match="CELERITAS_WAIT_WARNING='-1' must be > 0"):
        from_env({"CELERITAS_WAIT_WARNING": "-1"})


def test_a_throttled_submit_says_which_setting_lets_it_run_further_ahead(monkeypatch, caplog):
    """A host task that waits for an event the application sets only after more submits
    than CELERITAS_MAX_TASKS_AHEAD allows keeps submit waiting; the warning says so and
    names the setting (the event is set from a timer here, so the test ends)."""
    import threading
    monkeypatch.setenv("CELERITAS_WAIT_WARNING", "0.5")
    monkeypatch.setenv("CELERITAS_MAX_TASKS_AHEAD", "16")
    caplog.set_level(logging.WARNING, logger="celeritas")
    q = cl.Queue(devices="host:1")
    try:
        ev = threading.Event()
        b = cl.Buffer(np.zeros(4, np.float32), name="gated")

        def gate(cgh):
            b.access(cgh, cl.all(), cl.read_write)
            cgh.host_task(lambda part: ev.wait(30), on=cl.on_master_node, name="gate")

        def inc(cgh):
            a = b.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for((4,), lambda chunk: a.__setitem__(chunk, a[chunk] + 1), name="inc")

        q.submit(gate)
        timer = threading.Timer(2.0, ev.set)
        timer.start()
        for _ in range(40):
            q.submit(inc)
        timer.join()
        assert q.fence(b).result(timeout=30).tolist() == [40.0] * 4
        assert q.runtime.throttled_count >= 1
    finally:
        q.shutdown()
    got = _warnings(caplog)
    assert got, "no warning"
    assert re.match(r"celeritas rank 0: q\.submit \(more than 16 tasks ahead of the executor\) has waited "
                    r"\d+\.\d s for T\d+ \(horizon\)", got[0]), got[0]
    assert got[0].endswith("set CELERITAS_MAX_TASKS_AHEAD above the tasks submitted in between, now 16)"), got[0]
    assert "host_task of task T1 'gate'" in got[0], got[0]
