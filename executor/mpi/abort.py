"""Ending the whole MPI job when one rank fails, so that no peer waits forever."""
from __future__ import annotations

import os
import sys
import threading
import time

_abort_lock = threading.Lock()
_hook_installed = False

ABORT_FORWARD_DELAY = 0.25   # seconds between the last words on stderr and MPI_Abort


def abort_world(message: str, code: int = 1) -> None:
    """Report ``message`` on stderr, then end every rank of the job (never returns)."""
    with _abort_lock:   # a second failing thread waits here until the process dies
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - stdout may be closed
            pass
        try:
            sys.stderr.write(message.rstrip() + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        # MPI_Abort makes the launcher tear the job down at once, and Hydra (MPICH)
        # then drops what it has not yet forwarded from this rank's stderr pipe:
        # about one abort in ten lost the traceback and this message.  A short pause
        # lets the launcher forward them; the job still ends within a second.
        time.sleep(ABORT_FORWARD_DELAY)
        try:
            from mpi4py import MPI
            MPI.COMM_WORLD.Abort(code)
        finally:
            os._exit(code)


def install_excepthook(rank: int) -> None:
    """An uncaught exception in the user's script must end the whole job.

    Without this, the failing rank would run its atexit shutdown and wait for
    peers that wait for it: report the traceback, then abort every rank.
    """
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    previous = sys.excepthook

    def hook(tp, value, tb):
        try:
            previous(tp, value, tb)
        finally:
            abort_world(f"celeritas rank {rank}: uncaught {tp.__name__}; aborting all ranks")

    sys.excepthook = hook
