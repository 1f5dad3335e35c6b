"""Running a subprocess job (a program, ``mpiexec`` with its ranks) from a test, with a timeout.

The job gets its own session, so that on timeout the whole process group (mpiexec and
every rank) is killed and the test fails with what the job printed, instead of hanging
the suite or leaving ranks behind.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest


def run_job(argv: list, env: dict, timeout: float, cwd: Path | str | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` (in ``cwd``); the result also carries ``seconds``, the wall time."""
    t0 = time.monotonic()
    proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(map(str, argv))} did not finish within {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    res = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    res.seconds = time.monotonic() - t0  # type: ignore[attr-defined]
    return res
