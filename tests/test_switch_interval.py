"""CELERITAS_SWITCH_INTERVAL_US: CPython's GIL switch interval while a runtime runs.

Off by default (measured: no gain over the interpreter's 5 ms on the ping-pong, tiny
tasks, the stencil or wave_sim on 2 ranks); when set, the first runtime of a process
sets it and restores the interpreter's value when it ends, as the GC thresholds.
"""
from __future__ import annotations

import sys

import pytest

import celeritas as cl
from celeritas.config import from_env
from celeritas.testing import run_cluster


@pytest.fixture(autouse=True)
def _keep_interval():
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_default_leaves_the_interpreter_alone(monkeypatch):
    monkeypatch.delenv("CELERITAS_SWITCH_INTERVAL_US", raising=False)
    before = sys.getswitchinterval()
    q = cl.Queue()
    assert sys.getswitchinterval() == before
    q.shutdown()
    assert sys.getswitchinterval() == before


def test_set_while_running_and_restored(monkeypatch):
    monkeypatch.setenv("CELERITAS_SWITCH_INTERVAL_US", "250")
    before = sys.getswitchinterval()
    q = cl.Queue()
    assert sys.getswitchinterval() == pytest.approx(250e-6, abs=1e-6)
    q.shutdown()
    assert sys.getswitchinterval() == before


def test_restored_once_under_a_simulated_cluster(monkeypatch):
    before = sys.getswitchinterval()

    def program(rank):
        q = cl.Queue()
        q.wait(barrier=True)          # every rank's runtime is up
        v = sys.getswitchinterval()
        q.wait(barrier=True)          # no rank shuts down before every rank looked
        return v

    seen = run_cluster(program, nodes=3, CELERITAS_SWITCH_INTERVAL_US="300")
    assert all(v == pytest.approx(300e-6, abs=1e-6) for v in seen)
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize("value,words", [("fast", "not a number of microseconds"), ("-3", "must be > 0")])
def test_bad_values_are_config_errors(value, words):
    with pytest.raises(cl.ConfigError, match=f"CELERITAS_SWITCH_INTERVAL_US=.*{words}"):
        from_env({"CELERITAS_SWITCH_INTERVAL_US": value})


def test_off_spellings():
    for v in ("off", "0", "none"):
        assert from_env({"CELERITAS_SWITCH_INTERVAL_US": v}).switch_interval_us is None
    assert from_env({}).switch_interval_us is None
