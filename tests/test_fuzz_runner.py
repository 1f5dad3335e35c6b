"""The fuzzer's parallel runner: a worker process that dies must neither hang the run nor
lose the seeds it held (``multiprocessing.Pool`` waited forever for such a worker's result).

The work functions here stand in for ``run_one``: they are module-level, so the spawned
workers import them from this module.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from fuzz import WORKER_DIED, Result, run_isolated, run_parallel


def _always_dies_on_3(w: tuple):
    if w[0] == 3:
        os._exit(7)
    return ("ran", w[0])


def _dies_once(w: tuple):
    """Seed 2 kills its worker the first time (a marker file remembers it), then runs."""
    marker = Path(w[3]) / f"died-{w[0]}"
    if w[0] == 2 and not marker.exists():
        marker.touch()
        os._exit(9)
    return ("ran", w[0])


def _split(results: list) -> tuple[list[int], list[Result]]:
    ran = sorted(r[1] for r in results if isinstance(r, tuple))
    return ran, [r for r in results if isinstance(r, Result)]


@pytest.mark.timeout(180)
def test_a_seed_that_always_kills_its_worker_fails_alone_and_the_others_run():
    work = [(seed, None, (), None, 5.0) for seed in range(6)]
    died: list[int] = []
    ran, failed = _split(list(run_parallel(work, 2, fn=_always_dies_on_3, died=died)))
    assert ran == [0, 1, 2, 4, 5]
    assert [(r.seed, r.tag) for r in failed] == [(3, WORKER_DIED)]
    assert "seed 3" in failed[0].message and "exited with code 7" in failed[0].message
    assert died.count(3) == 2       # (the first pool and the retry pool both broke on it)


@pytest.mark.timeout(180)
def test_a_seed_that_killed_its_worker_once_is_run_again_and_the_death_is_reported(tmp_path):
    work = [(seed, None, (), str(tmp_path), 5.0) for seed in range(5)]
    died: list[int] = []
    ran, failed = _split(list(run_parallel(work, 2, fn=_dies_once, died=died)))
    assert ran == [0, 1, 2, 3, 4] and failed == []
    assert 2 in died and (tmp_path / "died-2").exists()


@pytest.mark.timeout(120)
def test_run_isolated_names_the_signal_that_killed_the_process():
    r = run_isolated((4, None, (), None, 5.0), fn=_killed_by_sigkill)
    assert isinstance(r, Result) and r.tag == WORKER_DIED and r.seed == 4
    assert "killed by signal 9" in r.message


def _killed_by_sigkill(w: tuple):
    os.kill(os.getpid(), 9)
